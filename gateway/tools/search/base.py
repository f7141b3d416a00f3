"""What every search backend is: one async call, typed results, one error with a kind.

The tool loop needs an answer it can put in a ``web_search_call`` item whatever the backend does,
so a backend either returns :class:`SearchResults` or raises :class:`SearchFailed`; nothing else
escapes (cancellation aside). The failure kinds are the :class:`SearchFailure` enum, here and only
here, so metrics, the ``web_search_call`` error and tests all speak the same words.

Configs are frozen dataclasses: a backend is built once from its config (settings wiring is the
lead's, later) and its config says every bound it runs under. Secrets (API keys) live in configs
with ``repr=False`` and in request headers, nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

__all__ = [
    "BackendConfig",
    "SearchBackend",
    "SearchFailed",
    "SearchFailure",
    "SearchHit",
    "SearchResults",
    "UserLocation",
]


class SearchFailure(StrEnum):
    """Why a search gave no results (the value is the word used in metrics and messages)."""

    #: the backend could not be reached, or answered 5xx (down, restarting, overloaded)
    UNAVAILABLE = "unavailable"
    #: no complete answer within the call's deadline (a backend that stalls or drips)
    TIMEOUT = "timeout"
    #: the backend answered 429 (``SearchFailed.retry_after`` holds its Retry-After, if sent)
    RATE_LIMITED = "rate_limited"
    #: an answer that is not the backend's published format: not JSON, the wrong shape, too large,
    #: compressed when identity was asked for, a redirect
    BAD_RESPONSE = "bad_response"
    #: the request was not sent or not accepted: an empty or too long query, a domain filter that
    #: is not a domain, a 4xx other than 429 (bad key, format not enabled), an address the
    #: outbound policy refuses
    REFUSED = "refused"


class SearchFailed(Exception):
    """A search that gave no results. ``str(exc)`` is safe to show the model and the API client:
    it names the backend by its kind (``searxng``, ``brave``, ``tavily``) and says what went
    wrong, never a URL (an in-cluster address, a query string), a header or a key, and never text
    the backend sent (which could echo any of those)."""

    def __init__(self, kind: SearchFailure, message: str, *, backend: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.backend = backend
        #: seconds the backend asked to wait (429's Retry-After), when it said
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"SearchFailed({self.kind.value!r}, {self.message!r}, backend={self.backend!r})"


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One result: an http(s) URL whose host passed the domain filter, its title and snippet as
    plain text (tags stripped, entities decoded, whitespace collapsed, lengths capped)."""

    url: str
    title: str
    snippet: str


@dataclass(frozen=True, slots=True)
class SearchResults:
    """A search's answer: at most the asked-for number of hits, best first, no URL twice."""

    query: str
    hits: tuple[SearchHit, ...]
    backend: str


@dataclass(frozen=True, slots=True)
class UserLocation:
    """The request's ``tools[].user_location`` (type ``approximate``): each field optional.
    ``country`` is an ISO 3166-1 alpha-2 code. Backends use what their API takes and ignore the
    rest (each backend's docstring says which)."""

    country: str | None = None
    region: str | None = None
    city: str | None = None
    timezone: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendConfig:
    """Bounds every backend runs under; each backend's config adds where it is and how to sign in.

    ``timeout_s``: the whole call (connect, send, the full answer); past it, ``timeout``.
    ``max_response_bytes``: the most one answer may be on the wire; past it, ``bad_response``.
    ``max_results``: the cap on hits per search, whatever the caller asks for.
    ``max_query_chars``: a longer query is ``refused`` (the model can send a shorter one).
    ``max_title_chars`` / ``max_snippet_chars``: the cuts applied to each hit's text.
    ``max_site_terms``: at most this many ``allowed_domains`` are put into the backend's query; the
    filter on the results applies all of them regardless.
    ``allow_networks``: CIDRs the backend's address may be in although private (the outbound
    guard's ``OutboundPolicy.allow_networks``; ``127.0.0.0/8`` in tests). SearXNG ignores it: its
    address is the operator's choice and is never checked (see ``searxng.py``).
    """

    timeout_s: float = 10.0
    max_response_bytes: int = 2 * 1024 * 1024
    max_results: int = 10
    max_query_chars: int = 400
    max_title_chars: int = 300
    max_snippet_chars: int = 1000
    max_site_terms: int = 10
    allow_networks: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("timeout_s", "max_response_bytes", "max_results", "max_query_chars"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("max_title_chars", "max_snippet_chars", "max_site_terms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


@runtime_checkable
class SearchBackend(Protocol):
    """A web search service. ``name`` is the backend's kind (``searxng``...), for metrics and
    messages. ``search`` returns :class:`SearchResults` or raises :class:`SearchFailed`; it never
    takes longer than its config's ``timeout_s`` and never holds more than ``max_response_bytes``
    of the answer. ``aclose`` releases its connection pool (at shutdown)."""

    @property
    def name(self) -> str: ...

    async def search(
        self,
        query: str,
        *,
        max_results: int,
        allowed_domains: Sequence[str] | None = None,
        user_location: UserLocation | None = None,
    ) -> SearchResults: ...

    async def aclose(self) -> None: ...
