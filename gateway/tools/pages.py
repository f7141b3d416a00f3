"""Page reading for ``web_search``: open a URL the model chose, extract its main text, find in it.

Why it is shaped this way:

* **The URL is the model's choice, and so the requester's.** A search result, or a URL a prompt
  injection planted, may point at ``http://169.254.169.254/`` or at a redirect that lands there. So
  every fetch goes through the same outbound guard as MCP (``security.outbound.guarded_client``):
  each resolved address of each connection — the first and one per redirect hop — is checked at
  connect time and pinned, proxies from the environment are never used, ``Accept-Encoding:
  identity`` is asked for and a compressed answer refused (a gzip bomb would multiply the byte cap),
  and the body is cut at ``max_bytes`` on the wire. Redirects are followed at most
  ``max_redirects`` times; only ``http`` and ``https`` are opened, and a URL carrying credentials
  is not (the model must not be able to make the gateway log in anywhere).
* **No cookies, ever.** Each fetch has a client of its own whose cookie jar accepts nothing, so a
  cookie set by one page (or one redirect hop) is sent nowhere — not to the next hop, not to the
  next fetch, not to another tenant's.
* **One deadline for the whole fetch** (``timeout_s``): connecting, every redirect, and reading the
  body. A server that sends its headers and then a byte a second forever never trips a per-read
  timeout; the deadline ends it.
* **Extraction off the event loop, bounded.** Parsing HTML is CPU work linear in its size (about
  1 s per MB with trafilatura, measured). It runs in a worker thread (``cpu``: the gateway's prepare
  pool, ``gateway.turn.offload.Cpu``, or ``asyncio.to_thread`` by default) on at most ``max_bytes``
  of input, and its output is cut at ``max_chars`` with a marker that says so.
* **A well-kept library for the solved problem**: trafilatura (Apache-2.0) finds the main text and
  drops navigation, ads and footers, keeping headings and code blocks as Markdown.
* **Shown as gpt-oss's browser shows pages**, since gpt-oss was trained on its ``browser`` tool:
  the text is wrapped at 80 columns into lines numbered ``L0: ...``, which the model cites as
  ``【{cursor}†L{start}-L{end}】``; ``find`` is a case-insensitive substring search that returns
  each match with the lines that follow it. The page's own ``【`` and ``】`` become ``〖`` and ``〗``,
  so a page cannot forge a citation mark.
* **One error type** (``PageFailed``) with a kind (``PageFailure``) and a message that names the
  host and the reason only (never the path, the query or a header), so it can be shown to the model.

What the lead still wires (not here, on purpose): the ``open_page``/``find`` actions in the tool
loop and their ``web_search_call`` items and events; the settings (``max_bytes``, ``timeout_s``,
``max_chars``, ``max_redirects``, the allowed networks) and the metrics (page opens, failures by
kind, latency); the cursor/page stack per response and the harmony rendering of a view
(:meth:`Page.view` gives gpt-oss's screen, sized in characters, not tokens) and of ``find``'s
results; running the classifiers on the page text as new input.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import http.cookiejar
import re
import ssl
import textwrap
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx

from security.outbound import OutboundPolicy, OutboundRefused, ResponseTooLarge, guarded_client

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_REDIRECTS",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_USER_AGENT",
    "CUT_MARKER",
    "VIEW_CHARS",
    "FindMatch",
    "Page",
    "PageFailed",
    "PageFailure",
    "find",
    "open_page",
]

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
#: gpt-oss's browser wraps page text at this width before numbering the lines
LINE_WIDTH = 80
#: one screen of a page (``Page.view``): about the 1,024 tokens gpt-oss's browser shows at a time
VIEW_CHARS = 4096
#: the most characters of a URL shown in a view's header
MAX_SHOWN_URL = 200
#: ends a text cut at ``max_chars`` (``{n}``: the limit)
CUT_MARKER = "[... page text cut at {n} characters ...]"
#: ``find``'s defaults, as gpt-oss's browser: at most 50 matches, each shown with 4 lines
FIND_MAX_MATCHES = 50
FIND_SHOW_LINES = 4
#: the longest pattern ``find`` takes (a pattern longer than any line can match nothing anyway)
FIND_MAX_PATTERN = 1000

_SCHEMES = frozenset({"http", "https"})
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset({"text/plain"})
#: a ``<meta charset>`` or ``http-equiv`` content-type declaration in the first bytes of a page
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_META_SNIFF_BYTES = 4096
#: the page's own citation brackets, which would let it forge a ``【3†L1-L2】`` mark
_BRACKETS = str.maketrans({"【": "〖", "】": "〗", "\u200b": None})
_BLANK_RUNS = re.compile(r"\n{3,}")
#: a tag longer than this is cut to its name before parsing (see ``_defuse``)
MAX_TAG_CHARS = 2048
_TAG_NAME = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]{0,30}")
#: a page with more tags than this is read by the cheap path, all its text (see ``_extract_html``)
MAX_TAGS = 60_000


class PageFailure(StrEnum):
    """Why a page could not be read (the value is the word used in messages and metrics)."""

    REFUSED = "refused"  # the outbound policy: a blocked address, a scheme, credentials in the URL
    TOO_LARGE = "too_large"  # the body went (or said it would go) past max_bytes
    TIMEOUT = "timeout"  # the fetch's deadline passed (connect, redirects and body together)
    UNSUPPORTED_TYPE = "unsupported_type"  # not HTML, XHTML or plain text
    HTTP_ERROR = "http_error"  # an error status, too many redirects, no connection, a broken exchange
    UNREADABLE = "unreadable"  # a compressed answer, or nothing could be made of the body


class PageFailed(Exception):
    """A page could not be read. ``str(exc)`` names the host and the reason only, so it can be
    shown to the model and the API client; ``kind`` says which failure it was."""

    def __init__(self, kind: PageFailure, message: str, *, host: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.host = host


@dataclass(frozen=True, slots=True)
class Page:
    """An opened page: ``url`` is the final URL (after redirects), ``text`` the extracted main text
    (Markdown-ish: headings, code fences), ``lines`` that text wrapped at 80 columns — the lines the
    model cites by number. ``cut``: the text was cut at ``max_chars`` (its last line says so)."""

    url: str
    title: str
    text: str
    lines: tuple[str, ...]
    content_type: str
    cut: bool = False

    def numbered(self, start: int = 0, stop: int | None = None) -> str:
        """Lines ``start`` to ``stop`` (exclusive) as gpt-oss's browser shows them: ``L12: text``."""
        end = len(self.lines) if stop is None else min(stop, len(self.lines))
        return "\n".join(f"L{i}: {self.lines[i]}" for i in range(max(start, 0), end))

    def view(self, cursor: int, loc: int = 0, max_chars: int = VIEW_CHARS) -> str:
        """One screen of the page as gpt-oss's browser shows it: ``[cursor] title (url)``, a
        ``**viewing lines [a - b] of last**`` bar, a blank line, then the numbered lines from ``loc``
        while they fit in ``max_chars`` (one line at least). ValueError for a ``loc`` past the end
        (its message can be shown to the model)."""
        last = len(self.lines) - 1
        if not 0 <= loc <= last:
            raise ValueError(f"Line {loc} is not on this page; its lines are L0 to L{last}.")
        shown: list[str] = []
        used = 0
        for i in range(loc, last + 1):
            line = f"L{i}: {self.lines[i]}"
            if shown and used + len(line) + 1 > max_chars:
                break
            shown.append(line)
            used += len(line) + 1
        bar = f"**viewing lines [{loc} - {loc + len(shown) - 1}] of {last}**"
        return f"[{cursor}] {self.title} ({self.url[:MAX_SHOWN_URL]})\n{bar}\n\n" + "\n".join(shown)


@dataclass(frozen=True, slots=True)
class FindMatch:
    """One ``find`` hit: the number of the matching line and the lines shown from it on."""

    line: int
    lines: tuple[str, ...]

    def numbered(self) -> str:
        return "\n".join(f"L{self.line + i}: {text}" for i, text in enumerate(self.lines))


class CpuRunner(Protocol):
    """How CPU work is run off the event loop: ``await cpu(fn, *args)`` (``gateway.turn.offload.Cpu``
    has this shape; the default is ``asyncio.to_thread``)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


def _host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


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


@dataclass(frozen=True, slots=True)
class _Fetched:
    url: str
    media_type: str
    charset: str | None
    body: bytes


async def _fetch(
    url: str,
    host: str,
    policy: OutboundPolicy,
    *,
    max_redirects: int,
    timeout_s: float,
    user_agent: str,
    ssl_context: ssl.SSLContext | None,
) -> _Fetched:
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
        if media_type and media_type not in _HTML_TYPES and media_type not in _TEXT_TYPES:
            raise PageFailed(
                PageFailure.UNSUPPORTED_TYPE,
                f"The page at {final_host!r} is {media_type[:80]!r}, not HTML or plain text.",
                host=final_host,
            )
        body = bytearray()
        async for chunk in response.aiter_raw():  # the guard cuts it at max_bytes
            body += chunk
        return _Fetched(str(response.url), media_type, charset, bytes(body))


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
    return await run(_read, fetched, max_chars)


def _read(fetched: _Fetched, max_chars: int) -> Page:
    """Decode and extract (CPU: runs in a worker thread)."""
    host = _host(fetched.url)
    body = fetched.body
    media_type = fetched.media_type or _sniff(body)
    if media_type not in _HTML_TYPES and media_type not in _TEXT_TYPES:
        raise PageFailed(
            PageFailure.UNSUPPORTED_TYPE, f"The page at {host!r} has no type that reads as text.", host=host
        )
    text_in = _decode(body, fetched.charset, html=media_type in _HTML_TYPES)
    if media_type in _HTML_TYPES:
        title, text = _extract_html(text_in, fetched.url)
    else:
        title, text = "", text_in
    text = _BLANK_RUNS.sub("\n\n", text.translate(_BRACKETS).replace("\r\n", "\n").replace("\r", "\n")).strip()
    if not text and not title:
        raise PageFailed(PageFailure.UNREADABLE, f"No text could be read from the page at {host!r}.", host=host)
    cut = len(text) > max_chars
    if cut:
        text = text[:max_chars].rstrip() + "\n\n" + CUT_MARKER.format(n=max_chars)
    title = " ".join(title.translate(_BRACKETS).split())[:300] or host
    return Page(url=fetched.url, title=title, text=text, lines=_wrap(text), content_type=media_type, cut=cut)


def _sniff(body: bytes) -> str:
    """A type for a body its server did not type: HTML if it starts like HTML, else none."""
    head = body[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return "text/html" if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) else ""


def _decode(body: bytes, declared: str | None, *, html: bool) -> str:
    """The body as text: a byte-order mark first, then the declared charset (header, then an HTML
    ``<meta>``), then UTF-8 if it is valid, then charset_normalizer's best guess."""
    for bom, name in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if body.startswith(bom):
            return body.decode(name, errors="replace").lstrip("\ufeff")
    candidates = [declared] if declared else []
    if html:
        found = _META_CHARSET.search(body[:_META_SNIFF_BYTES])
        if found:
            candidates.append(found.group(1).decode("ascii", "ignore"))
    for name in candidates:
        try:
            codec = codecs.lookup(name)
        except LookupError:
            continue
        if codec.name == "iso8859-1" or codec.name == "ascii":
            codec = codecs.lookup("cp1252")  # as browsers do (WHATWG Encoding: latin1 means windows-1252)
        return body.decode(codec.name, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    import charset_normalizer

    best = charset_normalizer.from_bytes(body).best()
    return str(best) if best is not None else body.decode("cp1252", errors="replace")


def _defuse(html: str) -> str:
    """``html`` with every tag longer than ``MAX_TAG_CHARS`` replaced by its bare name (``<p>``).

    Why: libxml2 checks an element's attributes against each other, so a tag's cost grows with the
    square of its attribute count — a 2 MB page of one ``<p>`` with 150,000 attributes parsed for
    over two minutes (measured), in a thread nothing can stop. Real tags that long are SVG paths,
    ``data:`` image URLs and tracking links, whose attributes carry no text to read. One pass, linear:
    each ``<`` is matched with the next ``>`` and the scan goes on after it."""
    out: list[str] = []
    pos = 0
    while True:
        start = html.find("<", pos)
        if start < 0:
            out.append(html[pos:])
            break
        end = html.find(">", start)
        if end < 0:  # an unclosed tag at the end: the parser would treat it as text anyway
            out.append(html[pos : start + MAX_TAG_CHARS])
            break
        if end - start <= MAX_TAG_CHARS:
            out.append(html[pos : end + 1])
        else:
            name = _TAG_NAME.match(html, start)
            out.append(html[pos:start])
            if name is not None:
                out.append(name.group(0) + ">")
        pos = end + 1
    return "".join(out)


def _extract_html(html: str, url: str) -> tuple[str, str]:
    """(title, main text). trafilatura first; a page it finds no main text in (a short page, a
    listing) falls back to all the text of its body, so the model still sees what is there.

    A page with more than ``MAX_TAGS`` tags skips trafilatura and gives all its text: trafilatura's
    work is Python code per element (about 25 us each, measured: 2 MB of table cells took 9 s, a page
    of 60,000 tags takes about 1.5 s), while lxml's parse and text walk are C (0.6 s for the table)."""
    import trafilatura  # imported on first use, in the worker thread: ~0.3 s, off the event loop

    html = _defuse(html)
    tree = trafilatura.load_html(html)
    if tree is None:
        return "", ""
    title = _title(tree)
    if html.count("<") > MAX_TAGS:
        return title, _all_text(tree)
    text = trafilatura.extract(
        tree,
        url=url,
        output_format="markdown",
        include_formatting=True,
        include_tables=True,
        include_comments=False,
        include_images=False,
        include_links=False,
        deduplicate=False,
    )
    if not text:  # extract may have pruned the tree it was given: read the page afresh
        fresh = trafilatura.load_html(html)
        text = _all_text(fresh) if fresh is not None else ""
    return title, text


def _all_text(tree: Any) -> str:
    """Every text of the page's body, one piece a line; no scripts, styles or comments."""
    import lxml.etree

    lxml.etree.strip_elements(tree, lxml.etree.Comment, "script", "style", "noscript", "template", with_tail=False)
    body = tree.find(".//body")
    return "\n".join(t.strip() for t in (body if body is not None else tree).itertext() if t.strip())


def _title(tree: Any) -> str:
    for path in (".//head/title", ".//title", ".//h1"):
        node = tree.find(path)
        if node is not None:
            text = " ".join(node.itertext()).strip()
            if text:
                return str(text)
    return ""


def _wrap(text: str) -> tuple[str, ...]:
    """Lines of at most ``LINE_WIDTH`` columns, blank lines kept: the lines the model cites."""
    lines: list[str] = []
    for line in text.split("\n"):
        if not line:
            lines.append("")
            continue
        lines.extend(textwrap.wrap(line, width=LINE_WIDTH, replace_whitespace=False, drop_whitespace=False) or [""])
    return tuple(lines)


def find(
    page: Page, pattern: str, *, max_matches: int = FIND_MAX_MATCHES, show_lines: int = FIND_SHOW_LINES
) -> list[FindMatch]:
    """The lines of ``page`` that contain ``pattern`` (case-insensitive), each with the
    ``show_lines`` lines from it on, at most ``max_matches``; as gpt-oss's browser, the search goes
    on after the lines a match showed, so matches do not overlap. An empty pattern finds nothing."""
    needle = pattern.casefold()[:FIND_MAX_PATTERN]
    if not needle.strip() or max_matches <= 0:
        return []
    show = max(show_lines, 1)
    matches: list[FindMatch] = []
    i = 0
    while i < len(page.lines) and len(matches) < max_matches:
        if needle in page.lines[i].casefold():
            matches.append(FindMatch(line=i, lines=page.lines[i : i + show]))
            i += show
        else:
            i += 1
    return matches
