"""gateway/tools/browser.py: one response's browser (search / open / find on a stack of cursors).

Outside in: a real ``SearxngBackend`` against the loopback SearXNG stand-in (its ``custom`` mode
answers the results a test sets, here pages of the loopback web site), and the real
``pages.open_page`` through the outbound guard against tests/web_pages/site.py. The guard's policy
allows only the site's own address (``127.0.0.1/32``), so a redirect to another loopback address or
to the metadata service is refused by the real guard. Public-looking names (``news.example``,
``docs.example``) resolve to the site through the policy's resolver hook; nothing leaves the
machine. A small fake backend stands in only where a failure kind cannot be provoked otherwise.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import pytest
from openai.types.responses.response_function_web_search import ResponseFunctionWebSearch

from gateway.tools import pages
from gateway.tools.browser import MAX_ARGUMENT_BYTES, MIN_VIEW_CHARS, Browser, BrowseResult, Source
from gateway.tools.pages import Page
from gateway.tools.search import (
    SearchFailed,
    SearchFailure,
    SearchHit,
    SearchResults,
    SearxngBackend,
    SearxngConfig,
    UserLocation,
)
from security.outbound import OutboundPolicy
from tests.mcp_servers.running import running_app
from tests.search_servers.searxng import search_app
from tests.web_pages.site import site_app

NAMES = {
    "news.example": "127.0.0.1",
    "docs.example": "127.0.0.1",
    "metadata.example": "169.254.169.254",
    "intranet.example": "127.0.0.2",
}
NEWS_TITLE = "Harbour bridge reopens after two-year restoration | The Coastal Ledger"
DOCS_TITLE = "Streaming responses — Tidepool 3.2 documentation"


async def _resolver(host: str, port: int) -> Sequence[str]:
    if host in NAMES:
        return [NAMES[host]]
    raise OSError(f"unknown test name {host}")


POLICY = OutboundPolicy(allow_networks=("127.0.0.1/32",), resolver=_resolver)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with running_app(site_app()) as url:
        yield url


@pytest.fixture(scope="module")
def search_server() -> Iterator[tuple[str, Any]]:
    app = search_app()
    with running_app(app) as url:
        yield url, app


@pytest.fixture
def news(site: str) -> str:
    """The site's origin under a public-looking name."""
    return site.replace("127.0.0.1", "news.example")


@pytest.fixture
def docs(site: str) -> str:
    return site.replace("127.0.0.1", "docs.example")


class Fetcher:
    """The real ``open_page`` with the test policy, counting the URLs it was asked to open."""

    def __init__(self, **kwargs: Any) -> None:
        self.urls: list[str] = []
        self._open = functools.partial(pages.open_page, policy=POLICY, **kwargs)

    async def __call__(self, url: str) -> Page:
        self.urls.append(url)
        return await self._open(url)


@pytest.fixture
async def searxng(search_server: tuple[str, Any], news: str, docs: str) -> Any:
    base, app = search_server
    app.state.seen.clear()
    app.state.results = [
        {
            "url": f"{news}/news",
            "title": "Harbour <b>bridge</b> reopens 【9†L1-L2】 after † restoration",
            "content": "The harbour bridge reopened on Saturday after two years of work. " * 3,
        },
        {"url": f"{docs}/docs", "title": "Streaming responses", "content": "Tidepool streams bodies."},
        {"url": f"{news}/plain", "title": "", "content": "Release notes."},
    ]
    backend = SearxngBackend.from_config(SearxngConfig(base_url=f"{base}/custom"))
    yield backend
    await backend.aclose()


def browser(backend: Any, fetcher: Callable[[str], Awaitable[Page]] | None = None, **kwargs: Any) -> Browser:
    return Browser(backend=backend, open_page=fetcher or Fetcher(), **kwargs)


def check_action(result: BrowseResult) -> None:
    """The action is one the openai SDK reads back unchanged."""
    item = ResponseFunctionWebSearch.model_validate(
        {"id": "ws_1", "type": "web_search_call", "status": "completed", "action": result.action}
    )
    assert item.action.model_dump(exclude_unset=True) == result.action


def screen_lines(result: BrowseResult) -> list[str]:
    header, bar, blank, *body = result.text.split("\n")
    assert bar.startswith("**viewing lines [") and blank == ""
    return body


async def ok(b: Browser, function: str, arguments: str) -> BrowseResult:
    result = await b.run(function, arguments)
    assert result.failure is None, result.text
    check_action(result)
    return result


async def failed(b: Browser, function: str, arguments: str, failure: str) -> BrowseResult:
    result = await b.run(function, arguments)
    assert result.failure == failure, result.text
    assert result.text.startswith("Error: ") and len(result.text) < 500
    check_action(result)
    return result


# --- search, open, find -----------------------------------------------------------------------


async def test_search_then_open_by_link_id(searxng: SearxngBackend, news: str, docs: str) -> None:
    fetcher = Fetcher()
    b = browser(searxng, fetcher)
    found = await ok(b, "search", '{"query": "harbour  bridge"}')
    assert found.function == "search" and found.backend == "searxng"
    assert found.action == {
        "type": "search",
        "query": "harbour bridge",
        "sources": [
            {"type": "url", "url": f"{news}/news"},
            {"type": "url", "url": f"{docs}/docs"},
            {"type": "url", "url": f"{news}/plain"},
        ],
    }
    lines = found.text.split("\n")
    assert lines[0] == "[0] harbour bridge"
    assert lines[3] == "L0: 【0†Harbour bridge reopens 〖9‡L1-L2〗 after ‡ restoration†news.example】"
    assert lines[4].startswith("L1: The harbour bridge reopened on Saturday")
    assert "L5: 【1†Streaming responses†docs.example】" in lines
    assert "L8: 【2†news.example†news.example】" in lines  # no title: the domain
    assert fetcher.urls == []

    opened = await ok(b, "open", '{"id": 1}')
    assert opened.action == {"type": "open_page", "url": f"{docs}/docs"} and opened.backend == "pages"
    assert opened.text.startswith(f"[1] {DOCS_TITLE} ({docs}/docs)\n**viewing lines [0 - ")
    assert fetcher.urls == [f"{docs}/docs"]
    again = await ok(b, "open", '{"id": "0", "cursor": 0}')  # a link number written as a string
    assert again.text.startswith(f"[2] {NEWS_TITLE} ({news}/news)")


async def test_open_by_url_reuses_a_page_already_opened(searxng: SearxngBackend, news: str) -> None:
    fetcher = Fetcher()
    b = browser(searxng, fetcher)
    first = await ok(b, "open", f'{{"id": "{news}/news"}}')
    assert first.text.startswith(f"[0] {NEWS_TITLE} ({news}/news)\n")
    assert first.action == {"type": "open_page", "url": f"{news}/news"}
    assert "Ilse Brandt" in first.text or "rivets" in first.text
    second = await ok(b, "open", f'{{"id": "{news}/news", "loc": 2}}')
    assert second.text.startswith(f"[1] {NEWS_TITLE}") and "**viewing lines [2 - " in second.text
    await ok(b, "search", '{"query": "bridge"}')
    await ok(b, "open", '{"id": 0}')  # the same page, by its link on the results page
    assert fetcher.urls == [f"{news}/news"]  # fetched once


async def test_scroll_with_loc_and_num_lines(searxng: SearxngBackend, news: str) -> None:
    b = browser(searxng)
    page = await pages.open_page(f"{news}/news", policy=POLICY)
    last = len(page.lines) - 1
    await ok(b, "open", f'{{"id": "{news}/news"}}')
    scrolled = await ok(b, "open", '{"loc": 5, "num_lines": 3}')
    assert scrolled.action == {"type": "open_page", "url": f"{news}/news"}
    assert scrolled.text.split("\n")[:2] == [f"[1] {NEWS_TITLE} ({news}/news)", f"**viewing lines [5 - 7] of {last}**"]
    assert screen_lines(scrolled) == [f"L{i}: {page.lines[i]}" for i in (5, 6, 7)]
    back = await ok(b, "open", '{"cursor": 0, "id": -1, "loc": 1}')
    assert back.text.startswith("[2] ") and screen_lines(back)[0] == f"L1: {page.lines[1]}"
    past = await failed(b, "open", f'{{"loc": {last + 1}}}', "invalid_call")
    assert past.text == f"Error: Line {last + 1} is not on this page; its lines are L0 to L{last}."
    assert (await ok(b, "open", "")).text.startswith("[3] ")  # no arguments: scroll the current page to the top


async def test_find_and_citing_a_find_screen(searxng: SearxngBackend, news: str) -> None:
    fetcher = Fetcher()
    b = browser(searxng, fetcher)
    await ok(b, "open", f'{{"id": "{news}/news"}}')
    page = await pages.open_page(f"{news}/news", policy=POLICY)
    (match,) = pages.find(page, "ilse brandt")
    found = await ok(b, "find", '{"pattern": "Ilse Brandt"}')
    assert found.action == {"type": "find_in_page", "url": f"{news}/news", "pattern": "Ilse Brandt"}
    assert found.text.split("\n")[0] == f"[1] Find results for text: `Ilse Brandt` in `{NEWS_TITLE}` ({news}/news)"
    body = screen_lines(found)
    assert body[0] == f"L0: # 【0†match at L{match.line}】"
    assert body[1] == f"L1: {page.lines[match.line]}"
    source = Source(f"{news}/news", NEWS_TITLE)
    assert b.source(1, 1, 2) == source  # the find page's own lines
    assert b.source(1, match.line, None) == source  # the original page's line, as the screen shows it
    assert b.source(1, len(page.lines), None) is None
    # a find link opens the page at the match (four lines above it), without fetching it again
    shown = await ok(b, "open", '{"id": 0}')
    start = max(match.line - 4, 0)
    assert shown.text.startswith(f"[2] {NEWS_TITLE}") and f"**viewing lines [{start} - " in shown.text
    assert fetcher.urls == [f"{news}/news"]


async def test_find_with_no_match_is_an_answer_and_find_on_results_is_an_error(
    searxng: SearxngBackend, news: str
) -> None:
    b = browser(searxng)
    await ok(b, "search", '{"query": "bridge"}')
    on_results = await failed(b, "find", '{"pattern": "bridge"}', "invalid_call")
    assert "the page at cursor 0 is search results" in on_results.text
    await ok(b, "open", '{"id": 0}')
    none = await ok(b, "find", '{"pattern": "zeppelin 【0†L1】"}')
    assert screen_lines(none) == ["L0: No `find` results for pattern: `zeppelin 〖0‡L1〗`"]
    on_find = await failed(b, "find", '{"pattern": "x"}', "invalid_call")
    assert "is find results" in on_find.text
    await failed(b, "find", '{"pattern": "  ", "cursor": 1}', "invalid_call")


async def test_source_for_each_kind_of_page(searxng: SearxngBackend, news: str, docs: str) -> None:
    b = browser(searxng)
    found = await ok(b, "search", '{"query": "bridge"}')
    body = screen_lines(found)
    second = body.index("L5: 【1†Streaming responses†docs.example】")
    assert body[second - 1] == "L4: "  # the blank line between hits cites nothing
    hit0 = Source(f"{news}/news", "Harbour bridge reopens 〖9‡L1-L2〗 after ‡ restoration")
    hit1 = Source(f"{docs}/docs", "Streaming responses")
    assert b.source(0, 0, 3) == hit0 and b.source(0, 1, None) == hit0
    assert b.source(0, 5, 6) == hit1 and b.source(0, 4, 6) == hit1  # a range starting on the blank line
    assert b.source(0, 4, None) is None
    assert b.source(0, 8, 9) == Source(f"{news}/plain", "news.example") and body[-1] == "L9: Release notes."
    assert b.source(0, 10, None) is None  # past the last line
    await ok(b, "open", '{"id": 1}')
    assert b.source(1, 0, 2) == Source(f"{docs}/docs", DOCS_TITLE)
    for cursor, first, last in [(2, 0, 0), (-1, 0, 0), (1, 3, 2), (1, -1, 0), (1, 0, 10**6)]:
        assert b.source(cursor, first, last) is None


# --- allowed_domains and the outbound guard ---------------------------------------------------


async def test_allowed_domains_filter_search_and_refuse_an_open(searxng: SearxngBackend, news: str, docs: str) -> None:
    fetcher = Fetcher()
    b = browser(searxng, fetcher, allowed_domains=["news.example"])
    found = await ok(b, "search", '{"query": "bridge"}')
    assert [s["url"] for s in found.action["sources"]] == [f"{news}/news", f"{news}/plain"]
    refused = await failed(b, "open", f'{{"id": "{docs}/docs"}}', "refused")
    assert refused.text == (
        "Error: Refused: the page is on 'docs.example', outside the domains this search may open (news.example)."
    )
    assert refused.action == {"type": "open_page", "url": f"{docs}/docs"}
    assert fetcher.urls == []  # refused before any fetch
    hop = f"{news}/redirect?to={quote(f'{docs}/docs')}"
    redirected = await failed(b, "open", f'{{"id": "{hop}"}}', "refused")
    assert "redirected to 'docs.example'" in redirected.text and DOCS_TITLE not in redirected.text
    # nothing was pushed by the refusals: the next page is cursor 1
    assert (await ok(b, "open", f'{{"id": "{news}/plain"}}')).text.startswith("[1] news.example")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("http://169.254.169.254/latest/meta-data/", "Refused to connect to '169.254.169.254': it is a cloud metadata"),
        ("http://metadata.example/latest/", "'metadata.example': it resolves to 169.254.169.254"),
        ("http://127.0.0.2/secret", "Refused to connect to '127.0.0.2': it is a loopback address."),
        ("http://intranet.example/secret", "it resolves to 127.0.0.2"),
    ],
)
async def test_a_redirect_into_the_private_network_is_refused(
    searxng: SearxngBackend, news: str, target: str, message: str
) -> None:
    b = browser(searxng)
    result = await failed(b, "open", f'{{"id": "{news}/redirect?to={quote(target)}"}}', "refused")
    assert message in result.text and "meta-data" not in result.text and "secret" not in result.text


# --- failures ---------------------------------------------------------------------------------


class FakeBackend:
    """A backend that raises what it is given, recording what it was asked."""

    name = "fake"

    def __init__(self, raises: BaseException | None = None) -> None:
        self.raises = raises
        self.calls: list[dict[str, Any]] = []

    async def search(
        self,
        query: str,
        *,
        max_results: int,
        allowed_domains: Sequence[str] | None = None,
        user_location: UserLocation | None = None,
    ) -> SearchResults:
        self.calls.append({"query": query, "max_results": max_results, "user_location": user_location})
        if self.raises is not None:
            raise self.raises
        hits = tuple(SearchHit(f"https://example.com/{i}", f"hit {i}", "") for i in range(max_results))
        return SearchResults(query=query, hits=hits, backend=self.name)

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("kind", list(SearchFailure))
async def test_every_search_failure_kind_is_a_readable_error(kind: SearchFailure) -> None:
    b = browser(FakeBackend(SearchFailed(kind, f"Web search failed: fake {kind.value}.", backend="fake")))
    result = await failed(b, "search", '{"query": "q"}', kind.value)
    assert result.text == f"Error: Web search failed: fake {kind.value}." and result.backend == "fake"
    assert result.action == {"type": "search", "query": "q"}


async def test_real_searxng_failures_and_a_backend_bug(search_server: tuple[str, Any], searxng: SearxngBackend) -> None:
    base = search_server[0]
    for mode, kind in [("unresponsive", "unavailable"), ("error", "unavailable"), ("ratelimited", "rate_limited")]:
        backend = SearxngBackend.from_config(SearxngConfig(base_url=f"{base}/{mode}"))
        try:
            result = await failed(browser(backend), "search", '{"query": "q"}', kind)
        finally:
            await backend.aclose()
        assert result.text.startswith("Error: Web search failed") and result.backend == "searxng"
    empty = await failed(browser(searxng), "search", '{"query": "   "}', "refused")  # the backend's rule
    assert empty.text == "Error: Web search failed: the query is empty." and empty.action == {
        "type": "search",
        "query": "   ",
    }
    bug = await failed(
        browser(FakeBackend(RuntimeError("secret query text"))), "search", '{"query": "q"}', "unavailable"
    )
    assert "secret" not in bug.text


@pytest.mark.parametrize(
    ("path", "kwargs", "kind", "message"),
    [
        ("/missing", {}, "http_error", "Error: The page at 'news.example' answered HTTP 404."),
        ("/image.png", {}, "unsupported_type", "'image/png', not HTML or plain text"),
        ("/gzip", {}, "unreadable", "'gzip'-encoded"),
        ("/big", {"max_bytes": 64 * 1024}, "too_large", "is larger than 65536 bytes"),
        ("/trickle", {"timeout_s": 0.5}, "timeout", "Error: Reading the page at 'news.example' timed out."),
    ],
)
async def test_every_page_failure_is_a_readable_error(
    searxng: SearxngBackend, news: str, path: str, kwargs: dict[str, Any], kind: str, message: str
) -> None:
    b = browser(searxng, Fetcher(**kwargs))
    result = await failed(b, "open", f'{{"id": "{news}{path}"}}', kind)
    assert message in result.text and result.backend == "pages"
    assert result.action == {"type": "open_page", "url": f"{news}{path}"}


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://u:p@news.example/", "ftp://news.example/"])
async def test_urls_that_are_never_opened(searxng: SearxngBackend, url: str) -> None:
    result = await failed(browser(searxng), "open", f'{{"id": "{url}"}}', "refused")
    assert "passwd" not in result.text and ":p@" not in result.text


async def test_a_fetcher_bug_is_an_http_error() -> None:
    async def broken(url: str) -> Page:
        raise KeyError(url)

    result = await failed(browser(FakeBackend(), broken), "open", '{"id": "https://example.com/x"}', "http_error")
    assert result.text == "Error: The page could not be read."


@pytest.mark.parametrize(
    ("function", "arguments", "message"),
    [
        ("search", "{not json", "not valid JSON"),
        ("search", "[1, 2]", "must be a JSON object"),
        ("search", '"query"', "must be a JSON object"),
        ("search", "[" * 100_000 + "]" * 100_000, "longer than"),
        ("search", "[" * 30_000 + "]" * 30_000, "not valid JSON"),  # past the parser's recursion limit
        ("search", '{"query": 3}', "needs a `query` string"),
        ("search", '{"query": "q", "topn": "5"}', "`topn` must be an integer, not a string"),
        ("open", '{"cursor": "0"}', "`cursor` must be an integer, not a string"),
        ("open", '{"id": true}', "link number or a URL string"),
        ("open", '{"loc": 1.5}', "`loc` must be an integer, not a fractional number"),
        ("open", '{"num_lines": [1]}', "not an array"),
        ("open", '{"id": 3}', "No page is open yet"),
        ("open", '{"cursor": ' + "9" * 4000 + "}", "`cursor` is out of range."),
        ("open", '{"id": -' + "9" * 4000 + "}", "`id` is out of range."),
        ("find", "{}", "needs a `pattern` string"),
        ("find", '{"pattern": "x"}', "No page is open yet"),
        ("browse", "{}", "Unknown function 'browse'"),
    ],
)
async def test_invalid_calls(function: str, arguments: str, message: str) -> None:
    result = await failed(browser(FakeBackend()), function, arguments, "invalid_call")
    assert message in result.text


async def test_cursors_and_links_that_are_not_there(searxng: SearxngBackend, news: str) -> None:
    b = browser(searxng)
    await ok(b, "search", '{"query": "bridge"}')
    assert (
        "Link 7 is not on the page at cursor 0; its links are 0 to 2."
        in (await failed(b, "open", '{"id": 7}', "invalid_call")).text
    )
    assert (
        "Cursor 4 is not open; the open cursors are 0 to 0."
        in (await failed(b, "open", '{"cursor": 4}', "invalid_call")).text
    )
    await ok(b, "open", f'{{"id": "{news}/plain"}}')
    no_links = await failed(b, "open", '{"id": 0}', "invalid_call")
    assert "The page at cursor 1 has no links; open a URL instead." in no_links.text


async def test_model_input_is_never_echoed_at_length() -> None:
    b = browser(FakeBackend())
    long_name = "x" * 10_000
    unknown = await failed(b, long_name, "{}", "invalid_call")
    assert len(unknown.text) < 250 and len(unknown.function) <= 100
    long_url = "https://" + "a" * 20_000 + ".example/"

    async def refuse(url: str) -> Page:
        return await pages.open_page(url, policy=POLICY)

    refused = await failed(
        browser(FakeBackend(), refuse, allowed_domains=["b.example"]), "open", f'{{"id": "{long_url}"}}', "refused"
    )
    assert len(refused.text) < 400


# --- bounds -----------------------------------------------------------------------------------


async def test_arguments_over_64_kib_are_refused_unparsed() -> None:
    backend = FakeBackend()
    b = browser(backend)
    big = '{"query": "' + "q" * MAX_ARGUMENT_BYTES + '"}'
    result = await failed(b, "search", big, "invalid_call")
    assert "longer than 65536 bytes" in result.text and backend.calls == []
    multibyte = '{"query": "' + "é" * (MAX_ARGUMENT_BYTES // 2) + '"}'  # few characters, many bytes
    assert (await failed(b, "search", multibyte, "invalid_call")).text.endswith("longer than 65536 bytes.")


async def test_topn_lowers_the_hit_count_and_never_raises_it() -> None:
    backend = FakeBackend()
    b = browser(backend, max_results=5, user_location=UserLocation(country="DE"))
    await ok(b, "search", '{"query": "q", "topn": 2}')
    await ok(b, "search", '{"query": "q", "topn": 50}')
    await ok(b, "search", '{"query": "q", "topn": 0}')
    assert [c["max_results"] for c in backend.calls] == [2, 5, 1]
    assert backend.calls[0]["user_location"] == UserLocation(country="DE")


async def test_max_pages_refuses_before_any_search_or_fetch() -> None:
    backend = FakeBackend()
    fetcher = Fetcher()
    b = browser(backend, fetcher, max_pages=2)
    await ok(b, "search", '{"query": "q"}')
    await ok(b, "open", '{"loc": 0}')
    for function, arguments in [
        ("search", '{"query": "q"}'),
        ("open", '{"id": "https://example.com/"}'),
        ("open", "{}"),
    ]:
        full = await failed(b, function, arguments, "refused")
        assert "used all 2 browser pages (cursors 0 to 1)" in full.text
    assert len(backend.calls) == 1 and fetcher.urls == []
    assert b.source(1, 0, 0) == Source("https://example.com/0", "hit 0")  # cursors stay valid


async def test_every_screen_fits_view_chars(searxng: SearxngBackend, news: str) -> None:
    b = browser(searxng, view_chars=MIN_VIEW_CHARS)
    results = [
        await ok(b, "search", '{"query": "' + "long query " * 30 + '"}'),
        await ok(b, "open", f'{{"id": "{news}/news"}}'),
        await ok(b, "open", '{"loc": 3}'),
        await ok(b, "find", '{"pattern": "the"}'),
    ]
    for result in results:
        assert len(result.text) <= MIN_VIEW_CHARS
        assert len(screen_lines(result)) >= 1
    assert "**viewing lines [0 - " in results[1].text
    with pytest.raises(ValueError, match="view_chars"):
        browser(searxng, view_chars=MIN_VIEW_CHARS - 1)
    with pytest.raises(ValueError, match="not a domain"):
        browser(searxng, allowed_domains=["not a domain"])


async def test_nothing_is_logged(searxng: SearxngBackend, news: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway")
    b = browser(searxng)
    await ok(b, "search", '{"query": "private-query-words"}')
    await ok(b, "open", f'{{"id": "{news}/news"}}')
    await ok(b, "find", '{"pattern": "private-pattern"}')
    await failed(browser(FakeBackend(RuntimeError("x"))), "search", '{"query": "private-query-words"}', "unavailable")
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("gateway"))
    assert "private" not in logged and "news.example" not in logged
