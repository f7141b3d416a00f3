"""Tavily: ``POST {base}/search`` with a JSON body and the key as ``Authorization: Bearer``.

Tavily's current API reference authenticates with the bearer header (older clients put
``api_key`` in the body; the key stays out of the body here, so it is in no body a proxy or a
debug dump might keep). The body carries ``query``, ``max_results`` (the API takes 0-20),
``search_depth`` and, for ``allowed_domains``, ``include_domains``; the answer's ``results[]``
carry ``url``, ``title`` and ``content``. Its other fields (``answer``, ``images``,
``response_time``) are ignored, and ``include_answer`` / ``include_raw_content`` are not asked for:
the gateway reads pages itself.

``allowed_domains`` are sent as ``include_domains`` and applied to the results again.
``user_location`` is ignored: Tavily's ``country`` takes a country's English name, not the ISO code
the Responses API sends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.tools.search.base import BackendConfig, SearchResults, UserLocation
from gateway.tools.search.client import backend_client, check_base_url, exchange_json, result_items
from gateway.tools.search.hits import collect_hits
from gateway.tools.search.keys import check_api_key
from gateway.tools.search.query import prepare

__all__ = ["TavilyBackend", "TavilyConfig"]

_API_MAX_RESULTS = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class TavilyConfig(BackendConfig):
    """``api_key``: the ``tvly-...`` key (from settings; never in ``repr``). ``base_url``: the
    API's origin, overridable for tests and for an operator's egress proxy. ``search_depth``:
    ``basic`` (one credit) or ``advanced`` (two)."""

    api_key: str = field(repr=False)
    base_url: str = "https://api.tavily.com"
    search_depth: str = "basic"

    def __post_init__(self) -> None:
        BackendConfig.__post_init__(self)
        check_api_key(self.api_key, "tavily api_key")
        check_base_url(self.base_url, "tavily base_url")
        if self.search_depth not in ("basic", "advanced"):
            raise ValueError("tavily search_depth must be basic or advanced")


def _items(data: object) -> Iterator[tuple[object, object, object]]:
    return result_items(data.get("results") if isinstance(data, dict) else None, "tavily", "results", "content")


class TavilyBackend:
    """The Tavily backend (see the module docstring)."""

    name = "tavily"

    def __init__(self, config: TavilyConfig) -> None:
        self.config = config
        self._endpoint = config.base_url.rstrip("/") + "/search"
        headers = {"Accept": "application/json", "Authorization": f"Bearer {config.api_key}"}
        self._client = backend_client(config, private_ok=False, headers=headers)

    @classmethod
    def from_config(cls, config: TavilyConfig) -> TavilyBackend:
        return cls(config)

    def __repr__(self) -> str:
        return "TavilyBackend()"

    async def search(
        self,
        query: str,
        *,
        max_results: int,
        allowed_domains: Sequence[str] | None = None,
        user_location: UserLocation | None = None,
    ) -> SearchResults:
        request = prepare(self.name, self.config, query, max_results, allowed_domains)
        body: dict[str, Any] = {
            "query": request.query,
            "max_results": min(request.limit, _API_MAX_RESULTS),
            "search_depth": self.config.search_depth,
        }
        if request.domains.domains:
            body["include_domains"] = list(request.domains.domains)
        data = await exchange_json(self._client, self.config, self.name, "POST", self._endpoint, json=body)
        hits = collect_hits(_items(data), request, self.config)
        return SearchResults(query=request.query, hits=hits, backend=self.name)

    async def aclose(self) -> None:
        await self._client.aclose()
