"""The web search backends (issue 32 items 2 and 5): SearXNG end to end against a loopback
stand-in speaking its JSON API; Brave and Tavily against recorded answers in their published
formats, served on loopback so the real HTTP client code runs; every failure kind; domain
filtering; keys kept out of messages and reprs."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.tools.search import (
    BraveBackend,
    BraveConfig,
    DomainFilter,
    SearchBackend,
    SearchFailed,
    SearchFailure,
    SearxngBackend,
    SearxngConfig,
    TavilyBackend,
    TavilyConfig,
    UserLocation,
)
from gateway.tools.search.client import retry_after_seconds
from gateway.tools.search.domains import normalize_domain
from gateway.tools.search.hits import MAX_ITEMS_EXAMINED, collect_hits
from gateway.tools.search.query import prepare
from gateway.tools.search.text import clean_text
from tests.mcp_servers.running import running_app
from tests.search_servers.searxng import BRAVE_KEY, TAVILY_KEY, search_app

LOOPBACK = ("127.0.0.0/8",)
QUERY = "private-query-words"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Any]]:
    app = search_app()
    with running_app(app) as url:
        yield url, app


@pytest.fixture
def base(server: tuple[str, Any]) -> str:
    server[1].state.seen.clear()
    return server[0]


@pytest.fixture
def seen(server: tuple[str, Any]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = server[1].state.seen
    return seen


def searxng(url: str, **kw: Any) -> SearxngBackend:
    return SearxngBackend.from_config(SearxngConfig(base_url=url, **kw))


def brave(url: str, *, key: str = BRAVE_KEY, **kw: Any) -> BraveBackend:
    return BraveBackend.from_config(BraveConfig(api_key=key, base_url=url, allow_networks=LOOPBACK, **kw))


def tavily(url: str, *, key: str = TAVILY_KEY, **kw: Any) -> TavilyBackend:
    return TavilyBackend.from_config(TavilyConfig(api_key=key, base_url=url, allow_networks=LOOPBACK, **kw))


def make(kind: str, url: str, **kw: Any) -> SearchBackend:
    if kind == "searxng":
        return searxng(url, **kw)
    return brave(url, **kw) if kind == "brave" else tavily(url, **kw)


# -- SearXNG end to end ----------------------------------------------------------------------------


async def test_searxng_answers_plain_text_hits_of_http_urls_once_each(base: str, seen: list[dict[str, Any]]) -> None:
    backend = searxng(f"{base}/ok")
    assert isinstance(backend, SearchBackend)
    try:
        results = await backend.search("  python   asyncio timeout ", max_results=10)
    finally:
        await backend.aclose()
    assert results.backend == "searxng"
    assert results.query == "python asyncio timeout"
    assert [hit.url for hit in results.hits] == [
        "https://docs.python.org/3/library/asyncio-task.html",
        "https://evil-python.org/asyncio-timeout",
        "https://peps.python.org/pep-0789/",
        "https://docs.python.org.evil.net/asyncio",
        "https://stackoverflow.com/questions/28609534/python-asyncio-timeout",
    ]  # the duplicate, the javascript: URL, the string item and the item without a URL are gone
    first, _, pep = results.hits[:3]
    assert first.title == "Coroutines and Tasks \u2014 Python 3 documentation"
    assert first.snippet == "Use asyncio.timeout() to limit the time spent waiting & cancel on expiry."
    assert pep.snippet == "Structured concurrency and timeouts."  # <script> content dropped
    (request,) = seen
    assert request["method"] == "GET" and request["path"] == "search"
    assert request["params"] == {"q": "python asyncio timeout", "format": "json", "categories": "general"}


async def test_searxng_can_post_the_query_as_a_form(base: str, seen: list[dict[str, Any]]) -> None:
    backend = searxng(f"{base}/ok", method="POST", language="en")
    try:
        results = await backend.search("python asyncio", max_results=1, allowed_domains=["peps.python.org"])
    finally:
        await backend.aclose()
    assert [hit.url for hit in results.hits] == ["https://peps.python.org/pep-0789/"]
    (request,) = seen
    assert request["method"] == "POST" and request["params"] == {}  # nothing in the URL
    assert request["json"] == {
        "q": "python asyncio site:peps.python.org",
        "format": "json",
        "categories": "general",
        "language": "en",
    }


async def test_no_cookie_is_kept_between_searches(base: str, seen: list[dict[str, Any]]) -> None:
    backend = searxng(f"{base}/ok")
    try:
        await backend.search("first tenant", max_results=1)
        await backend.search("second tenant", max_results=1)
    finally:
        await backend.aclose()
    assert len(seen) == 2
    assert "cookie" not in seen[1]["headers"]


async def test_searxng_whose_engines_all_failed_is_unavailable_and_no_results_is_empty(base: str) -> None:
    failed, empty = searxng(f"{base}/unresponsive"), searxng(f"{base}/none")
    try:
        with pytest.raises(SearchFailed) as caught:
            await failed.search(QUERY, max_results=5)
        assert (await empty.search(QUERY, max_results=5)).hits == ()
    finally:
        await failed.aclose()
        await empty.aclose()
    assert caught.value.kind is SearchFailure.UNAVAILABLE
    assert_safe(caught.value)


def test_hits_examine_a_bounded_number_of_items() -> None:
    config = SearxngConfig(base_url="http://searxng:8080")
    request = prepare("searxng", config, "q", 5, ["example.com"])
    taken = 0

    def items() -> Iterator[tuple[object, object, object]]:
        nonlocal taken
        for i in range(100_000):
            taken += 1
            yield f"https://off-domain-{i}.example.net/", "t", "s"

    assert collect_hits(items(), request, config) == ()
    assert taken == MAX_ITEMS_EXAMINED + 1


async def test_searxng_caps_hits_at_the_request_and_at_the_config(base: str) -> None:
    backend = searxng(f"{base}/ok", max_results=3)
    try:
        assert len((await backend.search("q", max_results=2)).hits) == 2
        assert len((await backend.search("q", max_results=50)).hits) == 3
        assert len((await backend.search("q", max_results=0)).hits) == 1
    finally:
        await backend.aclose()


async def test_searxng_sends_site_terms_and_drops_hits_off_the_allowed_domains(
    base: str, seen: list[dict[str, Any]]
) -> None:
    backend = searxng(f"{base}/ok")
    try:
        one = await backend.search("asyncio", max_results=10, allowed_domains=["Python.ORG."])
        two = await backend.search(
            "asyncio", max_results=10, allowed_domains=["docs.python.org", "https://stackoverflow.com/q"]
        )
    finally:
        await backend.aclose()
    assert [hit.url for hit in one.hits] == [
        "https://docs.python.org/3/library/asyncio-task.html",
        "https://peps.python.org/pep-0789/",
    ]
    assert [hit.url for hit in two.hits] == [
        "https://docs.python.org/3/library/asyncio-task.html",
        "https://stackoverflow.com/questions/28609534/python-asyncio-timeout",
    ]
    assert [r["params"]["q"] for r in seen] == [
        "asyncio site:python.org",
        "asyncio (site:docs.python.org OR site:stackoverflow.com)",
    ]


async def test_searxng_cuts_long_texts_and_strips_their_tags(base: str) -> None:
    backend = searxng(f"{base}/markup", max_title_chars=50, max_snippet_chars=100)
    try:
        results = await backend.search("q", max_results=5)
    finally:
        await backend.aclose()
    long_hit, odd_hit = results.hits
    assert len(long_hit.title) == 50 and long_hit.title.startswith("Title ttt") and long_hit.title.endswith("\u2026")
    assert len(long_hit.snippet) <= 100 and long_hit.snippet.startswith("word & word & ")
    assert "<" not in long_hit.snippet and "&amp;" not in long_hit.snippet
    assert (odd_hit.title, odd_hit.snippet) == ("", "")  # null and a number are no text


# -- Brave and Tavily against recorded answers ----------------------------------------------------


async def test_brave_sends_its_key_in_the_header_and_reads_web_results(base: str, seen: list[dict[str, Any]]) -> None:
    backend = brave(f"{base}/ok")
    try:
        results = await backend.search("rust borrow checker", max_results=5, user_location=UserLocation(country="de"))
    finally:
        await backend.aclose()
    assert [hit.url for hit in results.hits] == [
        "https://doc.rust-lang.org/book/ch04-02-references-and-borrowing.html",
        "https://BÜCHER.example./rust",
        "https://blog.example.com/borrow-checker",
    ]
    assert results.hits[0].snippet == "The borrow checker makes sure references are always valid & never dangle."
    assert results.hits[1].title == "Bücher über Rust"
    (request,) = seen
    assert request["path"] == "res/v1/web/search"
    assert request["headers"]["x-subscription-token"] == BRAVE_KEY
    assert request["params"] == {"q": "rust borrow checker", "count": "5", "country": "DE"}


@pytest.mark.parametrize("domain", ["bücher.example", "BÜCHER.EXAMPLE.", "xn--bcher-kva.example"])
async def test_brave_matches_an_internationalized_domain_in_either_form(base: str, domain: str) -> None:
    backend = brave(f"{base}/ok")
    try:
        results = await backend.search("rust", max_results=5, allowed_domains=[domain])
    finally:
        await backend.aclose()
    assert [hit.url for hit in results.hits] == ["https://BÜCHER.example./rust"]


async def test_brave_puts_site_terms_in_the_query_only_while_it_fits_the_api(
    base: str, seen: list[dict[str, Any]]
) -> None:
    backend = brave(f"{base}/ok")
    domains = ["rust-lang.org", "example.com"]
    longer, longest = " ".join(["word"] * 49), " ".join(["word"] * 50)
    try:
        await backend.search("borrow", max_results=5, allowed_domains=domains)
        await backend.search(longer, max_results=5, allowed_domains=domains)
        results = await backend.search(longest, max_results=5, allowed_domains=domains)
    finally:
        await backend.aclose()
    assert seen[0]["params"]["q"] == "borrow (site:rust-lang.org OR site:example.com)"
    assert seen[0]["params"]["count"] == "20"  # a filter gets the most results to choose from
    assert seen[1]["params"]["q"] == longer + " site:rust-lang.org"  # both: 52 words, over Brave's 50
    assert seen[2]["params"]["q"] == longest
    assert [hit.url for hit in results.hits] == [  # the filter still applies
        "https://doc.rust-lang.org/book/ch04-02-references-and-borrowing.html",
        "https://blog.example.com/borrow-checker",
    ]


async def test_brave_without_web_results_is_an_empty_answer(base: str) -> None:
    backend = brave(f"{base}/empty")
    try:
        results = await backend.search("nothing", max_results=5)
    finally:
        await backend.aclose()
    assert results.hits == ()


async def test_tavily_sends_a_bearer_key_and_include_domains(base: str, seen: list[dict[str, Any]]) -> None:
    backend = tavily(f"{base}/ok")
    try:
        results = await backend.search("Who is Leo Messi?", max_results=30, allowed_domains=["wikipedia.org"])
        unfiltered = await backend.search("Who is Leo Messi?", max_results=2)
    finally:
        await backend.aclose()
    assert [hit.url for hit in results.hits] == ["https://en.wikipedia.org/wiki/Lionel_Messi"]
    assert [hit.title for hit in unfiltered.hits] == [
        "Lionel Messi - Wikipedia",
        "Lionel Messi | Biography, Trophies, & Facts | Britannica",
    ]
    assert seen[0]["method"] == "POST" and seen[0]["path"] == "search"
    assert seen[0]["headers"]["authorization"] == f"Bearer {TAVILY_KEY}"
    assert seen[0]["json"] == {
        "query": "Who is Leo Messi?",
        "max_results": 10,
        "search_depth": "basic",
        "include_domains": ["wikipedia.org"],
    }
    assert TAVILY_KEY not in str(seen[1]["json"])


# -- failures --------------------------------------------------------------------------------------

FAILURES = [
    ("slow", SearchFailure.TIMEOUT),
    ("trickle", SearchFailure.TIMEOUT),
    ("endless", SearchFailure.BAD_RESPONSE),
    ("huge", SearchFailure.BAD_RESPONSE),
    ("garbage", SearchFailure.BAD_RESPONSE),
    ("shape", SearchFailure.BAD_RESPONSE),
    ("deep", SearchFailure.BAD_RESPONSE),
    ("redirect", SearchFailure.BAD_RESPONSE),
    ("gzip", SearchFailure.BAD_RESPONSE),
    ("ratelimited", SearchFailure.RATE_LIMITED),
    ("error", SearchFailure.UNAVAILABLE),
    ("forbidden", SearchFailure.REFUSED),
]


def assert_safe(exc: SearchFailed, *secrets: str) -> None:
    for text in (str(exc), repr(exc)):
        for secret in (*secrets, QUERY, "127.0.0.1", "http://", "169.254"):
            assert secret not in text
    # raised from None: no httpx exception (whose text names the URL) is chained to it
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


@pytest.mark.parametrize("kind", ["searxng", "brave", "tavily"])
@pytest.mark.parametrize(("mode", "expected"), FAILURES, ids=[m for m, _ in FAILURES])
async def test_every_failure_is_a_search_failed_of_its_kind(
    base: str, kind: str, mode: str, expected: SearchFailure
) -> None:
    backend = make(kind, f"{base}/{mode}", timeout_s=0.5, max_response_bytes=256 * 1024)
    try:
        with pytest.raises(SearchFailed) as caught:
            await backend.search(QUERY, max_results=5)
    finally:
        await backend.aclose()
    assert caught.value.kind is expected
    assert caught.value.backend == kind
    assert_safe(caught.value, BRAVE_KEY, TAVILY_KEY)
    if expected is SearchFailure.RATE_LIMITED:
        assert caught.value.retry_after == 7.0
        assert "7 s" in str(caught.value)


@pytest.mark.parametrize("kind", ["brave", "tavily"])
async def test_a_wrong_key_is_refused_and_the_echoed_key_is_not_repeated(base: str, kind: str) -> None:
    wrong = "wrong-key-that-must-stay-secret"
    backend = make(kind, f"{base}/ok", key=wrong)
    try:
        with pytest.raises(SearchFailed) as caught:
            await backend.search(QUERY, max_results=5)
    finally:
        await backend.aclose()
    assert caught.value.kind is SearchFailure.REFUSED
    assert "HTTP 401" in str(caught.value)
    assert_safe(caught.value, wrong)


def closed_port_url() -> str:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("kind", ["searxng", "brave", "tavily"])
async def test_a_refused_connection_is_unavailable(kind: str) -> None:
    backend = make(kind, closed_port_url())
    try:
        with pytest.raises(SearchFailed) as caught:
            await backend.search(QUERY, max_results=5)
    finally:
        await backend.aclose()
    assert caught.value.kind is SearchFailure.UNAVAILABLE
    assert_safe(caught.value)


@pytest.mark.parametrize("config", [BraveConfig, TavilyConfig])
async def test_public_api_backends_keep_the_private_address_refusal(
    base: str, seen: list[dict[str, Any]], config: Any
) -> None:
    backend_class = BraveBackend if config is BraveConfig else TavilyBackend
    backend = backend_class(config(api_key="k", base_url=f"{base}/ok"))  # no allow_networks
    try:
        with pytest.raises(SearchFailed) as caught:
            await backend.search(QUERY, max_results=5)
    finally:
        await backend.aclose()
    assert caught.value.kind is SearchFailure.REFUSED
    assert "loopback" in str(caught.value)
    assert seen == []
    assert_safe(caught.value)


@pytest.mark.parametrize(
    ("query", "domains", "says"),
    [
        ("   ", None, "empty"),
        ("x" * 401, None, "longer than 400"),
        ("ok", ["exa mple.com"], "not a domain"),
        ("ok", ["example.com:8080"], "not a domain"),
        ("ok", ["a..b"], "not a domain"),
        ("ok", [""], "not a domain"),
        ("ok", [f"d{i}.example" for i in range(101)], "at most 100"),
    ],
)
async def test_a_bad_request_is_refused_before_anything_is_sent(
    base: str, seen: list[dict[str, Any]], query: str, domains: list[str] | None, says: str
) -> None:
    backend = searxng(f"{base}/ok")
    try:
        with pytest.raises(SearchFailed) as caught:
            await backend.search(query, max_results=5, allowed_domains=domains)
    finally:
        await backend.aclose()
    assert caught.value.kind is SearchFailure.REFUSED
    assert says in str(caught.value)
    assert seen == []


# -- domains, texts, headers, secrets --------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "url", "allows"),
    [
        ("example.com", "https://example.com/", True),
        ("example.com", "https://docs.example.com/x", True),
        ("example.com", "http://a.b.example.com:8443/x?y#z", True),
        ("example.com", "https://EXAMPLE.COM./", True),
        ("Example.Com.", "https://example.com/", True),
        ("example.com", "https://evil-example.com/", False),
        ("example.com", "https://example.com.evil.net/", False),
        ("example.com", "https://notexample.com/", False),
        ("example.com", "https://example.com@evil.net/", False),
        ("example.com", "https://evil.net/?u=https://example.com/", False),
        ("example.com", "javascript://example.com/%0aalert(1)", False),
        ("example.com", "ftp://example.com/", False),
        ("example.com", "https:///example.com", False),
        ("example.com", "https://exa mple.com/", False),
        ("docs.example.com", "https://example.com/", False),
        ("*.example.com", "https://www.example.com/", True),
        ("bücher.de", "https://xn--bcher-kva.de/", True),
        ("xn--bcher-kva.de", "https://www.bücher.de/", True),
        ("bücher.de", "https://bucher.de/", False),
        ("faß.de", "https://xn--fa-hia.de/", True),  # IDNA 2008 (IDNA 2003 maps ß to ss)
        ("192.0.2.1", "http://192.0.2.1/x", True),
        ("2001:db8::1", "http://[2001:db8::1]/x", True),
    ],
)
def test_domain_matching(allowed: str, url: str, allows: bool) -> None:
    assert DomainFilter([allowed]).allows(url) is allows


def test_no_domain_list_allows_every_http_url_and_nothing_else() -> None:
    anything = DomainFilter(None)
    assert anything.allows("https://any.example/")
    assert not anything.allows("data:text/html,hi")
    assert not anything.allows("https://example.com/" + "a" * 3000)


def test_normalize_domain_gives_one_canonical_form() -> None:
    assert normalize_domain(" HTTPS://Docs.Python.org./3/ ") == "docs.python.org"
    assert normalize_domain("Bücher.DE") == "xn--bcher-kva.de"
    with pytest.raises(ValueError, match="not a domain"):
        normalize_domain("exa\u200bmple..com")


def test_clean_text() -> None:
    assert clean_text("a <b>bold</b>\n\n move &amp; &lt;tag&gt;", 100) == "a bold move & <tag>"
    assert clean_text("<style>p{}</style>x<script>y</script>z", 100) == "xz"
    assert clean_text("abcdef", 4) == "abc\u2026"
    assert clean_text(None, 10) == "" and clean_text(["x"], 10) == ""


def test_retry_after_forms() -> None:
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412510.0) == 0.0
    assert retry_after_seconds("99999999") == 86400.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_keys_are_in_no_repr_and_no_config_error() -> None:
    key = "sk-very-secret-key"
    for built in (
        BraveConfig(api_key=key),
        TavilyConfig(api_key=key),
        BraveBackend(BraveConfig(api_key=key)),
        TavilyBackend(TavilyConfig(api_key=key)),
        SearxngConfig(base_url=f"http://user:{key}@searxng:8080"),
        SearxngBackend(SearxngConfig(base_url=f"http://user:{key}@searxng:8080")),
    ):
        assert key not in repr(built)
    for bad in ("", "has space", "line\nbreak", "ключ", "x" * 513):
        with pytest.raises(ValueError) as caught:
            BraveConfig(api_key=bad)
        assert bad not in str(caught.value) or bad == ""
    with pytest.raises(ValueError) as caught:
        SearxngConfig(base_url=f"ftp://user:{key}@searxng")
    assert key not in str(caught.value)
    with pytest.raises(ValueError):
        SearxngConfig(base_url="http://searxng:8080/?token=x")
    with pytest.raises(ValueError):
        SearxngConfig(base_url="http://searxng:8080", timeout_s=0)
