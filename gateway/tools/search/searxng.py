"""SearXNG, the self-hosted default: its JSON API, ``GET {base}/search?q=...&format=json``.

The answer's ``results[]`` carry ``url``, ``title`` and ``content`` (the snippet, sometimes with
markup); other keys (``answers``, ``infoboxes``, ``suggestions``, per-engine fields) are ignored.
An instance serves JSON only when its ``settings.yml`` lists ``json`` under ``search.formats``;
one that does not answers 403, which is ``SearchFailed(refused)``.

``allowed_domains`` go into the query as ``site:`` terms (SearXNG hands them to its engines, most
of which honour them) and are applied to the results again. ``user_location`` is ignored: the API
takes no location (``language`` is the operator's setting). SearXNG returns about 20 results per
page whatever is asked; the hit cap is applied here. An answer with no results that lists
``unresponsive_engines`` (every engine it asked timed out, was blocked or rate-limited upstream)
is ``SearchFailed(unavailable)``, not an empty answer: the model should not conclude that nothing
on the web matches.

The instance usually runs in-cluster at a private address the operator chose, so its client does
not refuse private addresses; it is bounded like every backend (``client.py`` says why).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gateway.tools.search.base import BackendConfig, SearchResults, UserLocation
from gateway.tools.search.client import (
    backend_client,
    check_base_url,
    engines_failed,
    exchange_json,
    result_items,
)
from gateway.tools.search.hits import collect_hits
from gateway.tools.search.query import prepare

__all__ = ["SearxngBackend", "SearxngConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SearxngConfig(BackendConfig):
    """``base_url``: where the instance is (``http://searxng:8080``, a path prefix allowed; not in
    ``repr``, since it may carry basic-auth credentials). ``categories``, ``language`` and
    ``safesearch`` (0, 1, 2) are sent as SearXNG's parameters of those names when set.
    ``method``: ``GET`` (the query in the URL, as SearXNG's API page shows it) or ``POST`` (the
    same parameters as a form, which SearXNG accepts alike): POST keeps queries, which are user
    data, out of URL-shaped logs on the way (httpx's debug line, a proxy's access log)."""

    base_url: str = field(repr=False)
    categories: str | None = "general"
    language: str | None = None
    safesearch: int | None = None
    method: str = "GET"

    def __post_init__(self) -> None:
        BackendConfig.__post_init__(self)
        check_base_url(self.base_url, "searxng base_url")
        if self.safesearch not in (None, 0, 1, 2):
            raise ValueError("searxng safesearch must be 0, 1 or 2")
        if self.method not in ("GET", "POST"):
            raise ValueError("searxng method must be GET or POST")


def _items(data: object) -> Iterator[tuple[object, object, object]]:
    return result_items(data.get("results") if isinstance(data, dict) else None, "searxng", "results", "content")


class SearxngBackend:
    """The SearXNG backend (see the module docstring)."""

    name = "searxng"

    def __init__(self, config: SearxngConfig) -> None:
        self.config = config
        self._endpoint = config.base_url.rstrip("/") + "/search"
        self._client = backend_client(config, private_ok=True, headers={"Accept": "application/json"})

    @classmethod
    def from_config(cls, config: SearxngConfig) -> SearxngBackend:
        return cls(config)

    def __repr__(self) -> str:
        return "SearxngBackend()"

    async def search(
        self,
        query: str,
        *,
        max_results: int,
        allowed_domains: Sequence[str] | None = None,
        user_location: UserLocation | None = None,
    ) -> SearchResults:
        request = prepare(self.name, self.config, query, max_results, allowed_domains)
        params = {"q": request.query + request.domains.site_terms(self.config.max_site_terms), "format": "json"}
        if self.config.categories:
            params["categories"] = self.config.categories
        if self.config.language:
            params["language"] = self.config.language
        if self.config.safesearch is not None:
            params["safesearch"] = str(self.config.safesearch)
        if self.config.method == "POST":
            data = await exchange_json(self._client, self.config, self.name, "POST", self._endpoint, form=params)
        else:
            data = await exchange_json(self._client, self.config, self.name, "GET", self._endpoint, params=params)
        hits = collect_hits(_items(data), request, self.config)
        if not hits and isinstance(data, dict) and not data.get("results") and data.get("unresponsive_engines"):
            raise engines_failed(self.name)
        return SearchResults(query=request.query, hits=hits, backend=self.name)

    async def aclose(self) -> None:
        await self._client.aclose()
