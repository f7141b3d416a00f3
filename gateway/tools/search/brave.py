"""Brave Search: ``GET {base}/res/v1/web/search?q=...`` with the key in ``X-Subscription-Token``.

The answer's ``web.results[]`` carry ``url``, ``title`` and ``description`` (the snippet, with
``<strong>`` around matched words); ``web`` is absent when there are no web results, which is an
empty answer, not a bad one. The API takes at most 20 results per call (``count``) and a query of
at most 400 characters and 50 words.

``allowed_domains`` go into the query as ``site:`` terms when they fit in those limits (and are
applied to the results again in any case); with a domain filter the call asks for 20 results, so
the filter has some to choose from. ``user_location.country`` is sent as ``country`` when it is a
two-letter code; the other location fields are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gateway.tools.search.base import BackendConfig, SearchResults, UserLocation
from gateway.tools.search.client import backend_client, bad_shape, check_base_url, exchange_json, result_items
from gateway.tools.search.hits import collect_hits
from gateway.tools.search.keys import check_api_key
from gateway.tools.search.query import prepare

__all__ = ["BraveBackend", "BraveConfig"]

_API_MAX_COUNT = 20
_API_MAX_QUERY_CHARS = 400
_API_MAX_QUERY_WORDS = 50


@dataclass(frozen=True, kw_only=True, slots=True)
class BraveConfig(BackendConfig):
    """``api_key``: the subscription token (from settings; never in ``repr``). ``base_url``: the
    API's origin, overridable for tests and for an operator's egress proxy. ``safesearch``:
    Brave's ``off``/``moderate``/``strict`` when set."""

    api_key: str = field(repr=False)
    base_url: str = "https://api.search.brave.com"
    safesearch: str | None = None

    def __post_init__(self) -> None:
        BackendConfig.__post_init__(self)
        check_api_key(self.api_key, "brave api_key")
        check_base_url(self.base_url, "brave base_url")
        if self.safesearch not in (None, "off", "moderate", "strict"):
            raise ValueError("brave safesearch must be off, moderate or strict")


def _items(data: object) -> Iterator[tuple[object, object, object]]:
    if not isinstance(data, dict):
        raise bad_shape("brave", "an object at the top")
    web = data.get("web")
    if web is None:
        return
    yield from result_items(
        web.get("results") if isinstance(web, dict) else None, "brave", "web.results", "description"
    )


def _fits(query: str) -> bool:
    return len(query) <= _API_MAX_QUERY_CHARS and len(query.split()) <= _API_MAX_QUERY_WORDS


class BraveBackend:
    """The Brave Search backend (see the module docstring)."""

    name = "brave"

    def __init__(self, config: BraveConfig) -> None:
        self.config = config
        self._endpoint = config.base_url.rstrip("/") + "/res/v1/web/search"
        self._client = backend_client(
            config, private_ok=False, headers={"Accept": "application/json", "X-Subscription-Token": config.api_key}
        )

    @classmethod
    def from_config(cls, config: BraveConfig) -> BraveBackend:
        return cls(config)

    def __repr__(self) -> str:
        return "BraveBackend()"

    async def search(
        self,
        query: str,
        *,
        max_results: int,
        allowed_domains: Sequence[str] | None = None,
        user_location: UserLocation | None = None,
    ) -> SearchResults:
        request = prepare(self.name, self.config, query, max_results, allowed_domains)
        q = request.query
        for terms in range(min(self.config.max_site_terms, len(request.domains.domains)), 0, -1):
            with_sites = request.query + request.domains.site_terms(terms)
            if _fits(with_sites):
                q = with_sites
                break
        count = _API_MAX_COUNT if request.domains.domains else min(request.limit, _API_MAX_COUNT)
        params = {"q": q, "count": str(count)}
        if self.config.safesearch:
            params["safesearch"] = self.config.safesearch
        country = user_location.country if user_location is not None else None
        if country and len(country) == 2 and country.isascii() and country.isalpha():
            params["country"] = country.upper()
        data = await exchange_json(self._client, self.config, self.name, "GET", self._endpoint, params=params)
        hits = collect_hits(_items(data), request, self.config)
        return SearchResults(query=request.query, hits=hits, backend=self.name)

    async def aclose(self) -> None:
        await self._client.aclose()
