"""One response's web browser: the ``search`` / ``open`` / ``find`` calls of ``web_search`` run on
a stack of pages the model's cursors index (issue 32).

gpt-oss was trained on a built-in harmony ``browser`` tool, so ``web_search`` is rendered to it as
that tool and the screens here are the ones it learnt to read (openai/gpt-oss's
``simple_browser``): every screen starts ``[cursor] title (url)``, then a
``**viewing lines [a - b] of last**`` bar, a blank line, and numbered lines ``L12: ...``, which the
model cites as ``【cursor†La-Lb】``. Other model families get the same three functions as a
function-shaped tool and read the same screens. The tool loop (the lead's) calls :meth:`Browser.run`
once per call and turns the :class:`BrowseResult` into the ``web_search_call`` item, its events
and its metrics; :meth:`Browser.source` resolves a citation mark to the URL it points at.

**The stack.** Every call that shows a screen pushes one cursor, numbered from 0, never renumbered:
a search pushes its results page, an open pushes the page opened (or, for a scroll, the same page
again at a new cursor, as gpt-oss does), a find pushes its find-results page. A cursor names a
*document* (a results page, an opened page, a find-results page); scrolls share one. A call that
fails pushes nothing.

**What each call does, and the decisions the issue left open (and why):**

* ``search(query, topn=10, source=None)``: the backend is asked for ``min(topn, max_results)``
  hits (at least one). The results page is gpt-oss's: per hit a link line
  ``【i†title†domain】`` and the snippet wrapped at 80 columns, a blank line between hits; its
  title is the query and it has no URL (so its header is ``[cursor] query``, as gpt-oss shows
  it). ``【``/``】`` in backend text become ``〖``/``〗`` and ``†`` becomes ``‡``, so a hit cannot
  forge a citation mark or a link's fields; a link line's title and domain are cut (a link line is
  never wrapped, so its mark stays whole). No hits is a normal answer (a page that says so).
* ``open(id=-1, cursor=-1, loc=-1, num_lines=-1, view_source=False, source=None)``: ``id`` a string
  is a URL (one without ``://`` gets ``https://``, as a browser's address bar would; a string of
  digits is a link number, since no URL is digits only); ``id`` >= 0 is the link of that number on
  the page at ``cursor`` (results pages link their hits, find pages link the matches; opened pages
  carry no links, ``pages`` extracts text only); a negative ``id`` scrolls the page at ``cursor``.
  ``loc`` < 0 shows from line 0, except for a find link, which shows from four lines above the
  match (gpt-oss's choice). ``num_lines`` > 0 shows at most that many lines. ``view_source`` and
  ``source`` are accepted and ignored: the page is always its extracted text.
* ``find(pattern, cursor=-1)``: ``pages.find`` on the opened page at ``cursor``; the find page is
  gpt-oss's: per match a link line ``# 【i†match at Ln】`` (``n``: the line on the original page)
  and the lines shown, under the title ``Find results for text: `pattern` in `page title```. Its
  header shows the original page's URL. No match is a normal answer. ``find`` on a results page or
  a find page is a clear error (there is nothing to search in but titles the model has read).
* **Citations** (:meth:`Browser.source`): a results page's lines map to the hit they belong to (a
  range maps to the first hit in it); an opened page's lines to the page; a find page's lines to
  the page the find ran on. For a find page, line numbers up to the original page's last line are
  accepted as well as the find page's own: the screen shows both (``match at L120``), a model may
  cite either, and both mean the same page.
* **Reuse.** A page opened in this response is kept under the URL asked for and its final URL and
  is not fetched again (gpt-oss refetches a URL typed again; the issue asks for no second fetch,
  and a page does not change in the seconds of one response). Only pages that got a cursor are kept
  (so ``max_pages`` bounds them); failures, and a page fetched for a ``loc`` it does not have, are
  not: the next try may work. Calls are meant to run one at a time (the model waits for each answer); two concurrent
  opens of one URL may fetch it twice, nothing worse.
* **allowed_domains**: a URL whose host is not within them is refused before any fetch
  (``refused``, the model told which domains it may open), and the page's final URL is checked
  again after redirects. The second check stops the model from *reading* a page off the list; the
  request that followed the redirect was already made by then (the injected ``open_page`` decides
  what it follows; the outbound guard still refuses private addresses at every hop). A filter
  that is not a list of domains is a ValueError at construction: the request is at fault, and its
  validator answers 400 before any model runs.
* **Credentials in a redirect**: a page reached through a redirect to ``http://user:pw@host/`` is
  refused (``refused``) after the fetch: nothing was sent with them (httpx does not turn a hop's
  userinfo into a header), and refusing keeps them out of the model's screen and the action's URL,
  as ``pages`` refuses a first URL that carries them.
* **Errors** read ``Error: <message>``. Messages from ``SearchFailed`` / ``PageFailed`` are safe to
  show as they are; this module's own messages quote model input cut to ``MAX_QUOTED`` characters.
  Bad JSON, a non-object, a wrong type (``cursor`` a string, ``True`` for a number), an unknown
  function, a cursor / link / line that is not there: ``invalid_call``. Anything else a backend or
  the injected ``open_page`` raises (a bug, not a failure kind) is ``unavailable`` / ``http_error``
  with a generic message: :meth:`Browser.run` never raises (cancellation aside), so one bad call
  cannot end the response.

**Bounds** (think attacker: the model's input may be a prompt injection's):

* arguments over ``MAX_ARGUMENT_BYTES`` (64 KiB) are refused unparsed (``invalid_call``); JSON
  nested past the parser's recursion limit is ``invalid_call`` too;
* at most ``max_pages`` cursors per response. When they are used up, every call that would push
  one is refused (``refused``) *before* any search or fetch, with a message saying so. Why refuse
  rather than drop old pages: cursors and citations then stay valid for the whole response (the
  lead resolves marks after the answer is written), the memory bound is plain (``max_pages``
  pages, each bounded by ``pages``' ``max_chars``), and 64 screens are more text than most
  deployments' context holds anyway;
* every screen is at most ``view_chars`` characters, header included (``view_chars`` >=
  ``MIN_VIEW_CHARS``, so a header and one line always fit; a line longer than the room left is cut);
* ``find`` shows at most ``pages.page.FIND_MAX_MATCHES`` matches of ``FIND_SHOW_LINES`` lines.

Nothing here logs queries, URLs or page text: they are user data. An unexpected exception is logged
by its type name only.
"""

from __future__ import annotations

import json
import logging
import textwrap
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from gateway.tools.citations import Source
from gateway.tools.pages.page import MAX_SHOWN_URL, Page, PageFailed, PageFailure, find
from gateway.tools.search.base import SearchBackend, SearchFailed, SearchFailure, UserLocation
from gateway.tools.search.domains import DomainFilter

__all__ = [
    "FUNCTIONS",
    "MAX_ARGUMENT_BYTES",
    "MAX_QUOTED",
    "MIN_VIEW_CHARS",
    "BrowseFailure",
    "BrowseResult",
    "Browser",
    "Source",
]

log = logging.getLogger(__name__)

#: the browser's functions, as gpt-oss's harmony ``browser`` namespace names them
FUNCTIONS = ("search", "open", "find")
#: the longest ``arguments`` string parsed; a longer one is refused unread
MAX_ARGUMENT_BYTES = 64 * 1024
#: the most characters of model input (a URL, a pattern, a function name) quoted in a message
MAX_QUOTED = 100
#: the smallest ``view_chars``: room for the longest header and one line
MIN_VIEW_CHARS = 1024
#: an integer argument past this (either sign) is refused: JSON numbers have no size limit, and a
#: 4,000-digit cursor would be echoed back in "Cursor N is not open"
MAX_INT_ARG = 10**9
#: the most characters of a title shown in a screen's header
MAX_SHOWN_TITLE = 200
#: a results page's link line: its title and domain are cut to these
LINK_TITLE_CHARS = 120
LINK_DOMAIN_CHARS = 80
#: the lines shown after each ``find`` match (gpt-oss: 4), and above a match opened from a find page
FIND_SHOW_LINES = 4
#: results-page text is wrapped at this width, as pages are
LINE_WIDTH = 80
#: a results or find page's action ``query`` / ``pattern`` is cut to this
MAX_ACTION_TEXT = 1000
#: the name of the page fetcher in ``BrowseResult.backend`` (metrics)
PAGES = "pages"

_MARKS = str.maketrans({"【": "〖", "】": "〗", "†": "‡", "\u200b": None})


class BrowseFailure(StrEnum):
    """The browser's own failure kind; the others are ``SearchFailure`` / ``PageFailure`` values."""

    #: bad JSON, not an object, a wrong type, an unknown function, a cursor/link/line not there
    INVALID_CALL = "invalid_call"


INVALID_CALL = BrowseFailure.INVALID_CALL.value


@dataclass(frozen=True, slots=True)
class BrowseResult:
    """One browser call's outcome. ``text``: what the model reads (a screen, or ``Error: ...``).
    ``action``: the ``web_search_call`` item's action as the openai SDK types it. ``failure``: None
    when it worked, else a ``SearchFailure`` / ``PageFailure`` value or ``invalid_call``.
    ``backend``: the search backend's name for ``search``, ``pages`` otherwise (metrics)."""

    function: str
    text: str
    action: dict[str, Any]
    failure: str | None
    backend: str


class _Kind(StrEnum):
    RESULTS = "search results"
    PAGE = "page"
    FIND = "find results"


@dataclass(frozen=True, slots=True)
class _Doc:
    """What a cursor shows. ``links``: link number -> (URL, line to show it from). ``line_source``:
    per line, an index into ``sources`` (-1: a line that cites nothing); empty for a page or a
    find page, whose every line cites ``sources[0]``. ``cite_lines``: how many line numbers a
    citation may name (a find page: its own or its original page's, whichever is more)."""

    kind: _Kind
    title: str
    url: str
    lines: tuple[str, ...]
    sources: tuple[Source, ...]
    links: Mapping[int, tuple[str, int]] = field(default_factory=dict)
    line_source: tuple[int, ...] = ()
    page: Page | None = None
    cite_lines: int = 0


class _CallError(Exception):
    """A call that gives the model an error screen: ``failure`` is the kind word; ``action``, when
    set, the action the call had got as far as (else its function's fallback)."""

    def __init__(self, failure: str, message: str, action: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.failure = failure
        self.message = message
        self.action = action


def _quote(value: object) -> str:
    """Model input as it may appear in a message: cut to ``MAX_QUOTED`` characters, repr-quoted."""
    text = value if isinstance(value, str) else type(value).__name__
    shown = text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "..."
    return repr(shown)


def _plain(text: str) -> str:
    return " ".join(text.translate(_MARKS).split())


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, width=LINE_WIDTH) if text else []


def _domain(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def _has_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.username is not None or parts.password is not None
    except ValueError:
        return True


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Browser:
    """One response's browser: the stack of pages the model's cursors index.

    ``backend``: the deployment's search backend. ``open_page``: fetches and extracts one URL or
    raises ``PageFailed`` (the lead builds it over ``gateway.tools.pages.open_page`` with the
    deployment's outbound policy). ``max_results``: the most hits a search asks for.
    ``view_chars``: the most characters of one screen. ``allowed_domains`` / ``user_location``: the
    request's ``web_search`` filters. ``max_pages``: the most cursors in this response."""

    def __init__(
        self,
        *,
        backend: SearchBackend,
        open_page: Callable[[str], Awaitable[Page]],
        max_results: int = 10,
        view_chars: int = 4096,
        allowed_domains: Sequence[str] | None = None,
        user_location: UserLocation | None = None,
        max_pages: int = 64,
    ) -> None:
        if max_results <= 0 or max_pages <= 0:
            raise ValueError("max_results and max_pages must be positive")
        if view_chars < MIN_VIEW_CHARS:
            raise ValueError(f"view_chars must be at least {MIN_VIEW_CHARS}")
        self._backend = backend
        self._open_page = open_page
        self._max_results = max_results
        self._view_chars = view_chars
        self._allowed = list(allowed_domains) if allowed_domains is not None else None
        self._filter = DomainFilter(allowed_domains)  # ValueError for an entry that is not a domain
        self._user_location = user_location
        self._max_pages = max_pages
        self._stack: list[_Doc] = []
        self._opened: dict[str, _Doc] = {}

    def __repr__(self) -> str:
        return f"Browser(cursors={len(self._stack)}, max_pages={self._max_pages})"

    # -- the call ------------------------------------------------------------------------------

    async def run(self, function: str, arguments: str) -> BrowseResult:
        """Run one call. Never raises (cancellation aside): every fault is a failed result the
        model can read."""
        name = function if isinstance(function, str) else ""
        backend = self._backend_name() if name == "search" else PAGES
        action = _fallback_action(name)
        try:
            args = _parse(arguments)
            if name == "search":
                action = {"type": "search", "query": _action_text(args.get("query"))}
                return await self._search(args)
            if name == "open":
                return await self._open(args)
            if name == "find":
                action = _find_action("", args.get("pattern"))
                return self._find(args)
            raise _CallError(
                INVALID_CALL, f"Unknown function {_quote(name)}: the browser's functions are search, open and find."
            )
        except _CallError as exc:
            return BrowseResult(name[:MAX_QUOTED], f"Error: {exc.message}", exc.action or action, exc.failure, backend)

    async def _search(self, args: Mapping[str, Any]) -> BrowseResult:
        query = args.get("query")
        if not isinstance(query, str):
            raise _CallError(INVALID_CALL, "search needs a `query` string.")
        topn = _int_arg(args, "topn", self._max_results)
        if "topn" not in args and "top_n" in args:
            topn = _int_arg(args, "top_n", self._max_results)
        self._check_room()
        try:
            results = await self._backend.search(
                query,
                max_results=max(1, min(topn, self._max_results)),
                allowed_domains=self._allowed,
                user_location=self._user_location,
            )
        except SearchFailed as exc:
            raise _CallError(exc.kind.value, exc.message) from None
        except Exception as exc:  # a backend bug: the model still gets an answer
            log.warning("web search backend raised %s", type(exc).__name__)
            raise _CallError(
                SearchFailure.UNAVAILABLE.value, "Web search failed: the search backend broke down."
            ) from None
        doc = _results_doc(results.query, [(h.url, h.title, h.snippet) for h in results.hits])
        cursor = self._push(doc)
        action = {
            "type": "search",
            "query": _action_text(results.query),
            "sources": [{"type": "url", "url": hit.url} for hit in results.hits],
        }
        return BrowseResult("search", self._screen(doc, cursor, 0, -1), action, None, self._backend_name())

    async def _open(self, args: Mapping[str, Any]) -> BrowseResult:
        target = args.get("id", -1)
        cursor = _int_arg(args, "cursor", -1)
        loc = _int_arg(args, "loc", -1)
        num_lines = _int_arg(args, "num_lines", -1)
        if isinstance(target, str) and target.strip().isdigit() and len(target.strip()) <= 9:
            target = int(target.strip())
        if isinstance(target, str):
            url = target.strip()
            if "://" not in url:
                url = "https://" + url
            return await self._open_url(url, loc, num_lines, context=0)
        if not _is_int(target):
            raise _CallError(INVALID_CALL, "open's `id` is a link number or a URL string.")
        if abs(target) > MAX_INT_ARG:
            raise _CallError(INVALID_CALL, "`id` is out of range.")
        base = self._doc_at(cursor)
        if target >= 0:
            link = base.links.get(target)
            if link is None:
                where = f"at cursor {self._cursor_of(cursor)}"
                if not base.links:
                    raise _CallError(INVALID_CALL, f"The page {where} has no links; open a URL instead.")
                raise _CallError(
                    INVALID_CALL,
                    f"Link {target} is not on the page {where}; its links are 0 to {max(base.links)}.",
                )
            url, line = link
            return await self._open_url(url, loc, num_lines, context=line)
        # a scroll: the same document at a new cursor
        action = {"type": "open_page", "url": base.url} if base.url else {"type": "open_page"}
        self._check_room(action)
        self._check_loc(base, loc, action)
        new = self._push(base)
        return BrowseResult("open", self._screen(base, new, max(loc, 0), num_lines), action, None, PAGES)

    async def _open_url(self, url: str, loc: int, num_lines: int, *, context: int) -> BrowseResult:
        action: dict[str, Any] = {"type": "open_page", "url": url}
        self._check_room(action)
        if not self._filter.allows(url):
            raise _refusal(url, self._filter, action)
        doc = self._opened.get(url)
        if doc is None:
            page = await self._fetch(url, action)
            if page.url != url and _has_credentials(page.url):
                # a redirect hop with ``user:password@`` (sent nowhere: httpx does not turn a hop's
                # userinfo into a header) must not put them in the model's screen or the action
                raise _CallError(
                    PageFailure.REFUSED.value,
                    f"Refused: the page redirected to a URL with credentials for {_quote(_domain(page.url))}.",
                    action,
                )
            if page.url != url and not self._filter.allows(page.url):
                raise _refusal(page.url, self._filter, action, redirected=True)
            doc = _page_doc(page)
        action = {"type": "open_page", "url": doc.url}
        start = loc if loc >= 0 else max(context - FIND_SHOW_LINES, 0)
        self._check_loc(doc, start, action)
        self._check_room(action)  # again: another call may have taken the last cursor meanwhile
        self._opened.setdefault(url, doc)
        self._opened.setdefault(doc.url, doc)
        cursor = self._push(doc)
        return BrowseResult("open", self._screen(doc, cursor, start, num_lines), action, None, PAGES)

    async def _fetch(self, url: str, action: dict[str, Any]) -> Page:
        try:
            return await self._open_page(url)
        except PageFailed as exc:
            raise _CallError(exc.kind.value, str(exc), action) from None
        except Exception as exc:  # a fetcher bug: the model still gets an answer
            log.warning("page fetch raised %s", type(exc).__name__)
            raise _CallError(PageFailure.HTTP_ERROR.value, "The page could not be read.", action) from None

    def _find(self, args: Mapping[str, Any]) -> BrowseResult:
        pattern = args.get("pattern")
        cursor = _int_arg(args, "cursor", -1)
        if not isinstance(pattern, str):
            raise _CallError(INVALID_CALL, "find needs a `pattern` string.")
        doc = self._doc_at(cursor)
        action = _find_action(doc.url, pattern)
        if doc.page is None:
            raise _CallError(
                INVALID_CALL,
                f"find searches an opened page; the page at cursor {self._cursor_of(cursor)} is {doc.kind.value}."
                " Open one of its links first.",
                action,
            )
        if not pattern.strip():
            raise _CallError(INVALID_CALL, "find needs a pattern that is not empty.", action)
        self._check_room(action)
        found = _find_doc(doc, pattern)
        new = self._push(found)
        return BrowseResult("find", self._screen(found, new, 0, -1), action, None, PAGES)

    # -- citations -----------------------------------------------------------------------------

    def source(self, cursor: int, first_line: int, last_line: int | None) -> Source | None:
        """What a citation mark 【cursor†Lfirst-Llast】 points at (None: no such cursor/lines)."""
        last = first_line if last_line is None else last_line
        if not (_is_int(cursor) and _is_int(first_line) and _is_int(last)):
            return None
        if not 0 <= cursor < len(self._stack) or not 0 <= first_line <= last:
            return None
        doc = self._stack[cursor]
        if doc.kind is not _Kind.RESULTS:
            return doc.sources[0] if last < max(len(doc.lines), doc.cite_lines) else None
        if last >= len(doc.lines):
            return None
        for index in doc.line_source[first_line : last + 1]:
            if index >= 0:
                return doc.sources[index]
        return None

    # -- the stack -----------------------------------------------------------------------------

    def _backend_name(self) -> str:
        name = getattr(self._backend, "name", "search")
        return name if isinstance(name, str) else "search"

    def _check_room(self, action: dict[str, Any] | None = None) -> None:
        if len(self._stack) >= self._max_pages:
            raise _CallError(
                SearchFailure.REFUSED.value,
                f"This response has used all {self._max_pages} browser pages (cursors 0 to {self._max_pages - 1}):"
                " answer from the pages already read.",
                action,
            )

    def _push(self, doc: _Doc) -> int:
        self._check_room()
        self._stack.append(doc)
        return len(self._stack) - 1

    def _cursor_of(self, cursor: int) -> int:
        return len(self._stack) - 1 if cursor < 0 else cursor

    def _doc_at(self, cursor: int) -> _Doc:
        if not self._stack:
            raise _CallError(INVALID_CALL, "No page is open yet: search first, or open a URL.")
        if cursor < 0:
            return self._stack[-1]
        if cursor >= len(self._stack):
            raise _CallError(
                INVALID_CALL, f"Cursor {cursor} is not open; the open cursors are 0 to {len(self._stack) - 1}."
            )
        return self._stack[cursor]

    def _check_loc(self, doc: _Doc, loc: int, action: dict[str, Any]) -> None:
        last = max(len(doc.lines) - 1, 0)
        if loc > last:
            raise _CallError(INVALID_CALL, f"Line {loc} is not on this page; its lines are L0 to L{last}.", action)

    def _screen(self, doc: _Doc, cursor: int, loc: int, num_lines: int) -> str:
        """gpt-oss's screen of ``doc`` from line ``loc``: at most ``view_chars`` characters in all,
        at most ``num_lines`` lines when that is positive, one line at least."""
        lines = doc.lines or ("",)
        last = len(lines) - 1
        header = f"[{cursor}] {doc.title[:MAX_SHOWN_TITLE]}"
        if doc.url:
            header += f" ({doc.url[:MAX_SHOWN_URL]})"
        longest_bar = len(f"**viewing lines [{loc} - {last}] of {last}**")
        room = self._view_chars - len(header) - longest_bar - 3  # the three newlines
        stop = last + 1 if num_lines <= 0 else min(last + 1, loc + num_lines)
        shown: list[str] = []
        used = 0
        for i in range(loc, stop):
            line = f"L{i}: {lines[i]}"
            if shown and used + len(line) + 1 > room:
                break
            shown.append(line[:room])
            used += len(line) + 1
        bar = f"**viewing lines [{loc} - {loc + len(shown) - 1}] of {last}**"
        return f"{header}\n{bar}\n\n" + "\n".join(shown)


def _parse(arguments: str) -> dict[str, Any]:
    if not isinstance(arguments, str):
        raise _CallError(INVALID_CALL, "The call's arguments must be a JSON object.")
    if len(arguments) > MAX_ARGUMENT_BYTES or len(arguments.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
        raise _CallError(INVALID_CALL, f"The call's arguments are longer than {MAX_ARGUMENT_BYTES} bytes.")
    if not arguments.strip():
        return {}  # gpt-oss sends no arguments for a call whose every parameter has its default
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        raise _CallError(INVALID_CALL, "The call's arguments are not valid JSON.") from None
    if not isinstance(value, dict):
        raise _CallError(INVALID_CALL, "The call's arguments must be a JSON object.")
    return value


def _int_arg(args: Mapping[str, Any], name: str, default: int) -> int:
    value = args.get(name, default)
    if value is None:
        return default
    if not _is_int(value):
        raise _CallError(INVALID_CALL, f"`{name}` must be an integer, not {_json_type(value)}.")
    if abs(value) > MAX_INT_ARG:
        raise _CallError(INVALID_CALL, f"`{name}` is out of range.")
    return int(value)


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a fractional number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _action_text(value: object) -> str:
    return value[:MAX_ACTION_TEXT] if isinstance(value, str) else ""


def _find_action(url: str, pattern: object) -> dict[str, Any]:
    return {"type": "find_in_page", "url": url, "pattern": _action_text(pattern)}


def _fallback_action(function: str) -> dict[str, Any]:
    """The action of a call that failed before it got one: its function's type, fields empty (an
    unknown function reads as a search with no query)."""
    if function == "open":
        return {"type": "open_page"}
    if function == "find":
        return _find_action("", "")
    return {"type": "search"}


def _refusal(url: str, domains: DomainFilter, action: dict[str, Any], *, redirected: bool = False) -> _CallError:
    shown = ", ".join(domains.domains[:10]) + (", ..." if len(domains.domains) > 10 else "")
    host = _domain(url) or "that URL"
    how = "redirected to" if redirected else "is on"
    return _CallError(
        PageFailure.REFUSED.value,
        f"Refused: the page {how} {_quote(host)}, outside the domains this search may open ({shown}).",
        action,
    )


def _results_doc(query: str, hits: Sequence[tuple[str, str, str]]) -> _Doc:
    lines: list[str] = []
    line_source: list[int] = []
    sources: list[Source] = []
    links: dict[int, tuple[str, int]] = {}
    for i, (url, title, snippet) in enumerate(hits):
        domain = _domain(url)
        shown_title = _plain(title) or domain
        sources.append(Source(url, shown_title))
        links[i] = (url, 0)
        link = f"【{i}†{shown_title[:LINK_TITLE_CHARS]}†{_plain(domain)[:LINK_DOMAIN_CHARS]}】"
        block = [link, *_wrap(_plain(snippet))]
        lines.extend(block)
        line_source.extend([i] * len(block))
        lines.append("")
        line_source.append(-1)
    if not hits:
        lines.append(f"No results found for {_quote(query)}.")
        line_source.append(-1)
    elif lines:
        lines.pop()  # no blank line after the last hit
        line_source.pop()
    return _Doc(
        kind=_Kind.RESULTS,
        title=_plain(query)[:MAX_SHOWN_TITLE],
        url="",
        lines=tuple(lines),
        sources=tuple(sources),
        links=links,
        line_source=tuple(line_source),
    )


def _page_doc(page: Page) -> _Doc:
    title = _plain(page.title) or _domain(page.url)
    return _Doc(
        kind=_Kind.PAGE,
        title=title,
        url=page.url,
        lines=page.lines,
        sources=(Source(page.url, title),),
        page=page,
        cite_lines=len(page.lines),
    )


def _find_doc(doc: _Doc, pattern: str) -> _Doc:
    assert doc.page is not None
    matches = find(doc.page, pattern, show_lines=FIND_SHOW_LINES)
    lines: list[str] = []
    links: dict[int, tuple[str, int]] = {}
    for i, match in enumerate(matches):
        if lines:
            lines.append("")
        lines.append(f"# 【{i}†match at L{match.line}】")
        lines.extend(match.lines)
        links[i] = (doc.url, match.line)
    shown = _plain(pattern)
    shown = shown if len(shown) <= MAX_QUOTED else shown[:MAX_QUOTED] + "..."
    if not matches:
        lines.append(f"No `find` results for pattern: `{shown}`")
    return _Doc(
        kind=_Kind.FIND,
        title=f"Find results for text: `{shown}` in `{doc.title[:MAX_QUOTED]}`",
        url=doc.url,
        lines=tuple(lines),
        sources=doc.sources,
        links=links,
        cite_lines=max(len(lines), len(doc.lines)),
    )
