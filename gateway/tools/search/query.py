"""A search request as every backend checks it before sending: the query, the hit cap, the domains.

The same checks for all backends, so a query too long for one is too long for all and the model
learns one rule: an empty or over-long query, or ``allowed_domains`` that are not domains, is
``SearchFailed(refused)`` with a message that says why (the gateway never sends it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.tools.search.base import BackendConfig, SearchFailed, SearchFailure
from gateway.tools.search.domains import DomainFilter

__all__ = ["SearchRequest", "prepare"]


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """``query`` whitespace-collapsed; ``limit`` within ``[1, config.max_results]``."""

    query: str
    limit: int
    domains: DomainFilter


def prepare(
    backend: str, config: BackendConfig, query: str, max_results: int, allowed_domains: Sequence[str] | None
) -> SearchRequest:
    text = " ".join(query.split()) if isinstance(query, str) else ""
    if not text:
        raise SearchFailed(SearchFailure.REFUSED, "Web search failed: the query is empty.", backend=backend)
    if len(text) > config.max_query_chars:
        raise SearchFailed(
            SearchFailure.REFUSED,
            f"Web search failed: the query is longer than {config.max_query_chars} characters.",
            backend=backend,
        )
    try:
        domains = DomainFilter(allowed_domains)
    except ValueError as exc:
        raise SearchFailed(SearchFailure.REFUSED, f"Web search failed: {exc}.", backend=backend) from None
    limit = max(1, min(int(max_results), config.max_results))
    return SearchRequest(query=text, limit=limit, domains=domains)
