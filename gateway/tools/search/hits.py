"""A backend's result items as ``SearchHit`` s: filtered by domain, deduplicated, cut, capped.

Every backend maps its own format to ``(url, title, snippet)`` triples of whatever types the JSON
held, and this does the rest the same way for all: an item whose URL is not an http(s) URL on an
allowed host is dropped, a URL seen before is dropped, texts are made plain and cut, and the
collection stops at the request's limit. At most ``MAX_ITEMS_EXAMINED`` items are looked at: a
backend that sends a hundred thousand tiny off-domain items within the byte cap must not hold the
event loop while each URL is parsed (real services send 20-50 per page).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.tools.search.base import BackendConfig, SearchHit
from gateway.tools.search.query import SearchRequest
from gateway.tools.search.text import clean_text

__all__ = ["MAX_ITEMS_EXAMINED", "collect_hits"]

MAX_ITEMS_EXAMINED = 200


def collect_hits(
    items: Iterable[tuple[object, object, object]], request: SearchRequest, config: BackendConfig
) -> tuple[SearchHit, ...]:
    hits: list[SearchHit] = []
    seen: set[str] = set()
    for examined, (url, title, snippet) in enumerate(items):
        if len(hits) >= request.limit or examined >= MAX_ITEMS_EXAMINED:
            break
        if not isinstance(url, str):
            continue
        url = url.strip()
        if url in seen or not request.domains.allows(url):
            continue
        seen.add(url)
        hits.append(
            SearchHit(
                url=url,
                title=clean_text(title, config.max_title_chars),
                snippet=clean_text(snippet, config.max_snippet_chars),
            )
        )
    return tuple(hits)
