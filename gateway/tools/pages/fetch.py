"""Open a URL through the outbound guard: the network half of page reading (see the package
docstring for why it is shaped so)."""

from __future__ import annotations

import asyncio
import dataclasses
import http.cookiejar
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx

from gateway.tools.pages.extract import HTML_TYPES, TEXT_TYPES, Fetched, read
from gateway.tools.pages.page import Page, PageFailed, PageFailure
from security.outbound import OutboundPolicy, OutboundRefused, ResponseTooLarge, guarded_client

T = TypeVar("T")

#: the most bytes of one page read off the wire (and so parsed): about 2 s of extraction at most
DEFAULT_MAX_BYTES = 2 * 1024 * 1024
#: the most characters of extracted text kept (about 25,000 tokens); the rest is cut with a marker
DEFAULT_MAX_CHARS = 100_000
DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MAX_REDIRECTS = 5
#: some sites refuse httpx's own ``python-httpx/x.y``; this one says what is asking
DEFAULT_USER_AGENT = "Mozilla/5.0 (compatible; respgate web_search)"
#: the longest URL opened (browsers and servers commonly stop at 8 KB)
MAX_URL_CHARS = 8192
_SCHEMES = frozenset({"http", "https"})


class CpuRunner(Protocol):
    """How CPU work is run off the event loop: ``await cpu(fn, *args)`` (``gateway.turn.offload.Cpu``
    has this shape; the default is ``asyncio.to_thread``)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


def _check_url(url: str) -> str:
    """The URL's host, or PageFailed(REFUSED) for a URL that is not opened at all."""
    if len(url) > MAX_URL_CHARS:
        raise PageFailed(PageFailure.REFUSED, f"Refused to open a URL longer than {MAX_URL_CHARS} characters.", host="")
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        # both raise for what the client could not open: a port out of range; a host that the
        # client's own parse (IDNA included) refuses. Checked here, so the failure is named.
        _ = (parts.port, httpx.URL(url).host)
    except (ValueError, UnicodeError, httpx.InvalidURL):
        raise PageFailed(PageFailure.REFUSED, "Refused to open a malformed URL.", host="") from None
    if parts.scheme.lower() not in _SCHEMES:
        raise PageFailed(PageFailure.REFUSED, "Refused to open a URL that is not http or https.", host=host)
    if not host:
        raise PageFailed(PageFailure.REFUSED, "Refused to open a URL without a host.", host="")
    if parts.username is not None or parts.password is not None:
        raise PageFailed(PageFailure.REFUSED, f"Refused to open a URL with credentials for {host!r}.", host=host)
    return host


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """A cookie policy that accepts no cookie and returns none."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False


async def _fetch(
    url: str,
    host: str,
    policy: OutboundPolicy,
    *,
    max_redirects: int,
    timeout_s: float,
    user_agent: str,
    ssl_context: ssl.SSLContext | None,
) -> Fetched:
    headers = {"Accept": "text/html, application/xhtml+xml, text/plain;q=0.9, */*;q=0.1", "User-Agent": user_agent}
    client = guarded_client(
        policy, headers=headers, timeout=timeout_s, max_redirects=max_redirects, ssl_context=ssl_context
    )
    client.cookies.jar.set_policy(_NoCookies())
    async with client, client.stream("GET", url) as response:
        final_host = response.url.host or host
        if response.status_code >= 300:
            # a 3xx here is one httpx did not follow (no Location): an answer without a page
            raise PageFailed(
                PageFailure.HTTP_ERROR,
                f"The page at {final_host!r} answered HTTP {response.status_code}.",
                host=final_host,
            )
        media_type, charset = _content_type(response.headers.get("content-type", ""))
        if media_type and media_type not in HTML_TYPES and media_type not in TEXT_TYPES:
            raise PageFailed(
                PageFailure.UNSUPPORTED_TYPE,
                f"The page at {final_host!r} is {media_type[:80]!r}, not HTML or plain text.",
                host=final_host,
            )
        body = bytearray()
        async for chunk in response.aiter_raw():  # the guard cuts it at max_bytes
            body += chunk
        return Fetched(str(response.url), media_type, charset, bytes(body))


def _content_type(value: str) -> tuple[str, str | None]:
    media_type, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "charset":
            charset = val.strip().strip("\"'") or None
    return media_type.strip().lower(), charset


async def open_page(
    url: str,
    *,
    policy: OutboundPolicy,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_redirects: int = DEFAULT_MAX_REDIRECTS,
    user_agent: str = DEFAULT_USER_AGENT,
    ssl_context: ssl.SSLContext | None = None,
    cpu: CpuRunner | None = None,
) -> Page:
    """Fetch ``url`` through the outbound guard and extract its main text; ``PageFailed`` if not.

    ``policy``: the deployment's outbound policy (its allowed networks, its resolver); its byte cap
    is replaced by ``max_bytes``. ``timeout_s`` bounds the whole fetch; extraction, bounded by
    ``max_bytes`` of input, runs after it on ``cpu`` (default: a worker thread). ``ssl_context``: an
    operator's CA bundle (certificates are always verified, against the URL's host)."""
    if max_bytes <= 0 or max_chars <= 0 or timeout_s <= 0 or max_redirects < 0:
        raise ValueError("max_bytes, max_chars and timeout_s must be positive, max_redirects not negative")
    host = _check_url(url)
    bounded = dataclasses.replace(policy, max_response_bytes=max_bytes)
    try:
        async with asyncio.timeout(timeout_s):
            fetched = await _fetch(
                url,
                host,
                bounded,
                max_redirects=max_redirects,
                timeout_s=timeout_s,
                user_agent=user_agent,
                ssl_context=ssl_context,
            )
    except PageFailed:
        raise
    except ResponseTooLarge as exc:
        raise PageFailed(
            PageFailure.TOO_LARGE, f"The page at {exc.host!r} is larger than {max_bytes} bytes.", host=exc.host
        ) from None
    except OutboundRefused as exc:
        # an address refusal names the address's kind; the other refusal is a compressed answer
        kind = PageFailure.REFUSED if exc.address is not None or not exc.host else PageFailure.UNREADABLE
        raise PageFailed(kind, str(exc), host=exc.host or host) from None
    except (TimeoutError, httpx.TimeoutException):
        raise PageFailed(PageFailure.TIMEOUT, f"Reading the page at {host!r} timed out.", host=host) from None
    except httpx.TooManyRedirects:
        raise PageFailed(
            PageFailure.HTTP_ERROR, f"The page at {host!r} redirected more than {max_redirects} times.", host=host
        ) from None
    except httpx.UnsupportedProtocol:
        raise PageFailed(
            PageFailure.REFUSED, f"The page at {host!r} redirected to a URL that is not http or https.", host=host
        ) from None
    except httpx.ConnectError:
        raise PageFailed(PageFailure.HTTP_ERROR, f"Could not connect to {host!r}.", host=host) from None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError, UnicodeError):
        # a broken exchange, or a redirect to a URL the client cannot parse (a bad IDNA label)
        raise PageFailed(PageFailure.HTTP_ERROR, f"The exchange with {host!r} failed.", host=host) from None
    run = cpu or asyncio.to_thread
    return await run(read, fetched, max_chars)
