"""One HTTP exchange with a search backend: bounded in time and bytes, every fault a SearchFailed.

**Which outbound guard.** Every backend's client is the SSRF guard's ``guarded_client``
(``security/outbound.py``), for what it bounds besides addresses: the body is cut at
``max_response_bytes`` as it arrives (a declared ``Content-Length`` over it is refused unread),
identity encoding is asked for and a compressed answer refused (no gzip bomb past the cap),
environment proxies are never used (``trust_env=False``) and names are resolved once and pinned.
Redirects are never followed: a search API does not redirect, and one that does is answered
``bad_response``, so no hop leaves the configured origin.

The address check itself differs by who chose the URL, as for MCP servers in
``gateway/tools/hosted.py``: the URL of a backend is the operator's (settings), never the
requester's, whose only input is the query string. An operator's SearXNG usually runs in-cluster
on a private address it cannot know in advance (a compose service name), so SearXNG's client
exempts every network (``private_ok``): refusing private addresses there would protect nothing
the operator did not choose. Brave and Tavily are public APIs: their clients keep the check
(exempting only the config's ``allow_networks``), so a DNS answer gone wrong cannot turn an API
key-bearing request toward the gateway's own network.

**No cookies.** The client's jar refuses every cookie: one backend client serves every tenant,
and a cookie kept from one search would let the backend tie the next tenant's queries to it.

**One deadline per call** (``asyncio.timeout``) covers connecting, sending and reading the whole
answer, because httpx's timeouts are per read: a backend that drips a byte a second would never
trip them. httpx's own timeouts are set to the same value as a second line.

**Messages.** What ``SearchFailed`` says is built from the backend's kind, the HTTP status and the
limits, never from the URL, the request's headers or the answer's body (a backend could echo the
key or the query back). Exceptions are raised ``from None``, so a traceback in a log does not carry
httpx's exception (whose text names the URL, with the query in it).
"""

from __future__ import annotations

import asyncio
import email.utils
import http.cookiejar
import time
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from gateway.tools.search.base import BackendConfig, SearchFailed, SearchFailure
from security.outbound import OutboundPolicy, OutboundRefused, ResponseTooLarge, guarded_client

__all__ = ["backend_client", "bad_shape", "check_base_url", "engines_failed", "exchange_json", "retry_after_seconds"]

_EVERY_NETWORK = ("0.0.0.0/0", "::/0")
#: a Retry-After past this is treated as this (a backend's typo must not park a client for a year)
_MAX_RETRY_AFTER_S = 86400.0


def backend_client(
    config: BackendConfig, *, private_ok: bool, headers: Mapping[str, str] | None = None
) -> httpx.AsyncClient:
    """The client one backend keeps (its connection pool) for its calls. ``private_ok``: the
    backend's address is the operator's choice and is not checked (SearXNG); otherwise only the
    config's ``allow_networks`` are exempt from the guard's refusal of private addresses."""
    policy = OutboundPolicy(
        allow_networks=_EVERY_NETWORK if private_ok else config.allow_networks,
        max_response_bytes=config.max_response_bytes,
        connect_timeout=config.timeout_s,
    )
    client = guarded_client(policy, headers=headers, timeout=httpx.Timeout(config.timeout_s), follow_redirects=False)
    client.cookies = http.cookiejar.CookieJar(policy=_NoCookies())
    return client


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """A cookie policy that keeps no cookie and sends none."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: urllib.request.Request) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: urllib.request.Request) -> bool:
        return False


def check_base_url(url: str, what: str) -> None:
    """ValueError (naming ``what``, not the URL, which may carry credentials) unless ``url`` is an
    http(s) URL with a host and no query or fragment."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{what}: an http(s) URL without query or fragment is required")


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """A Retry-After header as seconds (delta-seconds or an HTTP date), capped; None when absent
    or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), _MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    delta = when.timestamp() - (time.time() if now is None else now)
    return min(max(delta, 0.0), _MAX_RETRY_AFTER_S)


def _failed(kind: SearchFailure, backend: str, what: str, retry_after: float | None = None) -> SearchFailed:
    return SearchFailed(
        kind, f"Web search failed: the {backend} search backend {what}.", backend=backend, retry_after=retry_after
    )


def _status_failure(backend: str, response: httpx.Response) -> SearchFailed:
    code = response.status_code
    if code == 429:
        after = retry_after_seconds(response.headers.get("retry-after"))
        tail = "" if after is None else f"; it asks to wait {after:g} s"
        return _failed(SearchFailure.RATE_LIMITED, backend, f"is rate-limiting the gateway (HTTP 429{tail})", after)
    if code >= 500:
        return _failed(SearchFailure.UNAVAILABLE, backend, f"is unavailable (HTTP {code})")
    if 300 <= code < 400:
        return _failed(SearchFailure.BAD_RESPONSE, backend, f"answered with a redirect (HTTP {code}), not results")
    if 400 <= code < 500:
        return _failed(SearchFailure.REFUSED, backend, f"refused the request (HTTP {code})")
    return _failed(SearchFailure.BAD_RESPONSE, backend, f"answered HTTP {code}, not results")


async def exchange_json(
    client: httpx.AsyncClient,
    config: BackendConfig,
    backend: str,
    method: str,
    url: str,
    *,
    params: Mapping[str, str] | None = None,
    json: Mapping[str, Any] | None = None,
    form: Mapping[str, str] | None = None,
) -> object:
    """Send one request and return the answer's JSON (any shape: the backend checks it), or raise
    ``SearchFailed``: 429 ``rate_limited``, 5xx or no connection ``unavailable``, past the deadline
    ``timeout``, other 4xx or a refused address ``refused``, anything not a 2xx JSON answer within
    ``max_response_bytes`` ``bad_response``."""
    try:
        async with asyncio.timeout(config.timeout_s):
            async with client.stream(method, url, params=params, json=json, data=form) as response:
                if not 200 <= response.status_code < 300:
                    raise _status_failure(backend, response)
                body = await response.aread()
    except SearchFailed:
        raise
    except (TimeoutError, httpx.TimeoutException):
        raise _failed(SearchFailure.TIMEOUT, backend, f"did not answer within {config.timeout_s:g} s") from None
    except ResponseTooLarge:
        raise _failed(
            SearchFailure.BAD_RESPONSE, backend, f"sent an answer over the {config.max_response_bytes}-byte limit"
        ) from None
    except OutboundRefused as exc:
        if exc.kind is not None:  # the address: a misconfigured or mis-resolving backend host
            where = f"is at an address the gateway may not reach ({exc.kind.value})"
            raise _failed(SearchFailure.REFUSED, backend, where) from None
        raise _failed(
            SearchFailure.BAD_RESPONSE, backend, "sent a compressed answer the gateway did not ask for"
        ) from None
    except httpx.HTTPError:  # refused connection, reset, protocol error, a body cut short
        raise _failed(SearchFailure.UNAVAILABLE, backend, "could not be reached") from None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _failed(SearchFailure.BAD_RESPONSE, backend, "answered with something that is not JSON") from None


def engines_failed(backend: str) -> SearchFailed:
    """A metasearch backend answered, but none of the engines behind it did."""
    return _failed(SearchFailure.UNAVAILABLE, backend, "got no answer from the search engines behind it")


def bad_shape(backend: str, what: str) -> SearchFailed:
    """The JSON parsed but is not the backend's published format (``what``: which part)."""
    return _failed(SearchFailure.BAD_RESPONSE, backend, f"answered JSON without {what}")


def result_items(results: object, backend: str, where: str, snippet: str) -> Iterator[tuple[object, object, object]]:
    """``(url, title, snippet)`` of each object in a backend's result list (``where`` names the list
    in the refusal when it is not one): the three backends' answers differ only in where the list
    is and what the snippet's key is."""
    if not isinstance(results, list):
        raise bad_shape(backend, f"a {where} list")
    for item in results:
        if isinstance(item, dict):
            yield item.get("url"), item.get("title"), item.get(snippet)
