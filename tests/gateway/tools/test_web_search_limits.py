"""``web_search`` under attack from the outside, through the running gateway: redirect chains and
names that lead into private space, a search backend that hangs, pages that never end or are huge,
a tenant whose web search is off, hostile ``allowed_domains``, two web search tools, what reaches
the logs, and a WebSocket client that leaves or steers while a search is running.

Real parts throughout: the gateway on loopback with the simulated engine calling its ``browser``,
the loopback SearXNG stand-in (``custom`` answers ``app.state.results``), the loopback web site
(``tests/web_pages/site.py``) on 127.0.0.1 and its ``/secret`` on 127.0.0.2 (an intranet service
the operator's ``outbound_allow_networks`` does not name). Public-looking names resolve through the
outbound guard's resolver (the system resolver swapped for a table, as DNS would answer); every TCP
connection the process opens is recorded at httpcore's network backend, under the guard, so a test
sees the connections that were really attempted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlsplit

import httpcore
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import security.outbound
from billing.usage import MemorySink
from gateway.base.settings import Settings
from gateway.ops.logging_setup import make_formatter
from inference.harmony_core import harmony_encoding
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn
from tests.billing.test_ledger_faults import CountingSink, billed
from tests.conftest import MODEL, LiveGateway
from tests.gateway.tools.test_web_search_turns import browse, by_type
from tests.http_helpers import assert_error, create, post, wait_for
from tests.mcp_servers.running import running_app
from tests.schema_check import sdk_check_event, sdk_check_response
from tests.search_servers.searxng import search_app
from tests.web_pages.site import SECRET, site_app
from tests.ws_helpers import create as ws_create
from tests.ws_helpers import recv, send, ws_open

pytestmark = pytest.mark.timeout(120)

WEB = [{"type": "web_search"}]
SECRET_WORD = "hunter2"
assert SECRET_WORD in SECRET


# -- the loopback world -----------------------------------------------------------------------------


class Counting:
    """An ASGI app that records the path of every HTTP request before handing it on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with running_app(site_app()) as url:
        yield url


@pytest.fixture(scope="module")
def intranet() -> Iterator[tuple[Counting, str]]:
    """The same site on 127.0.0.2: its ``/secret`` stands for an intranet service."""
    app = Counting(site_app())
    with running_app(app, host="127.0.0.2") as url:
        yield app, url


@pytest.fixture(scope="module")
def searxng() -> Iterator[tuple[Any, str]]:
    app = search_app()
    with running_app(app) as url:
        yield app, url


class Connections:
    """Every TCP connection httpcore opens in this process (the guard's inner backend included):
    the address it was asked to connect to."""

    def __init__(self) -> None:
        self.hosts: list[str] = []


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> Connections:
    seen = Connections()
    inner = httpcore.AnyIOBackend.connect_tcp

    async def recording(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        seen.hosts.append(host)
        return await inner(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", recording)
    return seen


NAMES: dict[str, list[str]] = {
    "news.example": ["127.0.0.1"],
    "docs.other": ["127.0.0.1"],
    "intranet.example": ["127.0.0.2"],
    "metadata.example": ["169.254.169.254"],
    # one public-looking (allowed) answer and one private: which one a connection uses is not the
    # requester's choice, so the name is refused
    "both.example": ["127.0.0.1", "127.0.0.2"],
}


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The system resolver answers from ``NAMES`` (nothing leaves the machine)."""
    asked: dict[str, list[str]] = {}

    async def resolver(host: str, port: int) -> list[str]:
        asked.setdefault(host, []).append(str(port))
        if host in NAMES:
            return list(NAMES[host])
        raise OSError(f"unknown test name {host}")

    monkeypatch.setattr(security.outbound, "system_resolver", resolver)
    return asked


def web_settings(searxng_url: str, **kw: Any) -> Settings:
    kw.setdefault("outbound_allow_networks", ["127.0.0.1/32"])
    return Settings(web_search={"backend": "searxng", "url": f"{searxng_url}/custom"}, **kw)


def prompts_text(live: LiveGateway) -> str:
    enc = harmony_encoding()
    return "\n".join(enc.decode(list(p)) for p in live.engine.stats.prompts)


def outcome(live: LiveGateway, backend: str, action: str, kind: str) -> float:
    labels = {"backend": backend, "action": action, "outcome": kind}
    return live.metric("respgate_web_search_actions_total", labels)


def hop(origin: str, to: str) -> str:
    """A URL on ``origin``'s open redirect that answers 302 to ``to``."""
    return f"{origin}/redirect?to={quote(to, safe='')}"


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


# -- 1. redirect chains and names into private space ------------------------------------------------


def _targets(site: str, secret: str) -> dict[str, str]:
    news = f"http://news.example:{port_of(site)}"
    secret_port = port_of(secret)
    return {
        # public-looking first hop, a second hop, then the intranet
        "chain_to_127.0.0.2": hop(news, hop(news, f"{secret}/secret")),
        "chain_to_metadata": hop(news, hop(site, "http://169.254.169.254/latest/meta-data/")),
        "chain_to_a_name_on_loopback": hop(news, hop(news, f"http://intranet.example:{secret_port}/secret")),
        "chain_to_mapped_v6": hop(news, f"http://[::ffff:127.0.0.2]:{secret_port}/secret"),
        "chain_to_a_name_on_metadata": hop(site, "http://metadata.example/latest/meta-data/"),
        # 0.0.0.0 and :: connect to this machine itself on Linux
        "chain_to_unspecified": hop(news, f"http://0.0.0.0:{port_of(site)}/news"),
        "chain_to_v6_unspecified": hop(news, f"http://[::]:{port_of(site)}/news"),
        "chain_to_decimal_127.0.0.2": hop(news, f"http://2130706434:{secret_port}/secret"),
        "name_on_loopback": f"http://intranet.example:{secret_port}/secret",
        "name_with_a_private_answer": f"http://both.example:{secret_port}/secret",
    }


@pytest.mark.parametrize(
    "target",
    [
        "chain_to_127.0.0.2",
        "chain_to_metadata",
        "chain_to_a_name_on_loopback",
        "chain_to_mapped_v6",
        "chain_to_a_name_on_metadata",
        "chain_to_unspecified",
        "chain_to_v6_unspecified",
        "chain_to_decimal_127.0.0.2",
        "name_on_loopback",
        "name_with_a_private_answer",
    ],
)
@pytest.mark.parametrize("how", ["search_result", "typed_url"])
def test_no_path_into_private_space(
    make_gateway: Any,
    searxng: tuple[Any, str],
    site: str,
    intranet: tuple[Counting, str],
    connections: Connections,
    dns: dict[str, list[str]],
    target: str,
    how: str,
) -> None:
    """A poisoned search result (or a URL the model types) that leads, hop by hop or by its name,
    to 127.0.0.2 or the metadata address: no connection reaches it, the open fails ``refused``, the
    turn completes, and the intranet's text is nowhere: not in the response, not in any prompt."""
    app, url = searxng
    secret_app, secret = intranet
    secret_app.paths.clear()
    start = _targets(site, secret)[target]
    app.state.results = [{"url": start, "title": "Harbour news", "content": "The harbour reopened."}]
    if how == "search_result":
        calls = [ToolCall("search", {"query": "harbour"}, "browser"), ToolCall("open", {"id": 0}, "browser")]
    else:
        calls = [ToolCall("open", {"id": start}, "browser")]
    live = make_gateway(web_settings(url), engine=SimulatedEngine(script=browse(calls, "Done."), record_prompts=True))
    r = create(live, input="what happened at the harbour?", tools=WEB)

    assert sdk_check_response(r) == []
    assert r["status"] == "completed"
    opened = [c for c in by_type(r, "web_search_call") if c["action"]["type"] == "open_page"]
    assert len(opened) == 1 and opened[0]["status"] == "failed"
    assert outcome(live, "pages", "open_page", "refused") == 1
    # no connection to anything but the loopback site and the search stand-in (127.0.0.1); a search
    # or a first hop shows the recorder sees connections at all
    assert set(connections.hosts) <= {"127.0.0.1"}, connections.hosts
    assert connections.hosts or (how == "typed_url" and target.startswith("name_"))
    assert secret_app.paths == []
    assert SECRET_WORD not in json.dumps(r)
    seen = prompts_text(live)
    assert SECRET_WORD not in seen and "Error: " in seen.rsplit("browser.open", 1)[1]


# -- 2. a search backend that hangs ----------------------------------------------------------------


class Held:
    """A SearXNG stand-in whose answers wait until the test releases them (or the client leaves)."""

    def __init__(self, results: Sequence[dict[str, Any]] = ()) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.queries: list[str] = []
        self.disconnected = 0
        self.answered = 0
        self.results = list(results)

    async def handle(self, request: Request) -> Response:
        self.queries.append(request.query_params.get("q", ""))
        self.arrived.set()
        while not self.release.is_set():
            if await _gone(request):
                self.disconnected += 1
                return Response(status_code=499)
            await asyncio.sleep(0.01)
        self.answered += 1
        return JSONResponse({"query": request.query_params.get("q", ""), "results": self.results})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/held/search", self.handle, methods=["GET", "POST"])])


async def _gone(request: Request) -> bool:
    try:
        async with asyncio.timeout(0.01):
            return await request.is_disconnected()
    except TimeoutError:
        return False


@pytest.fixture
def held() -> Iterator[tuple[Held, str]]:
    server = Held([{"url": "http://example.invalid/a", "title": "A", "content": "Snippet A."}])
    try:
        with running_app(server.app()) as url:
            yield server, url
    finally:
        server.release.set()


def searching_or_plain(view: PromptView) -> Turn:
    """``search ...`` -> a browser search for it; a tool's output -> an answer; anything else -> a
    plain answer (the other client's turn)."""
    last = view.last
    assert last is not None
    if last.role == "tool":
        return Turn(text="Found it.")
    if last.text.startswith("search "):
        return Turn(tool_calls=(ToolCall("search", {"query": last.text.removeprefix("search ")}, "browser"),))
    return Turn(text="plain answer")


def test_a_hanging_search_stalls_no_other_client(make_gateway: Any, held: tuple[Held, str]) -> None:
    """Client A's search hangs (the backend answers only when released); client B's plain turn on
    the same gateway completes meanwhile; A completes once the backend answers."""
    server, url = held
    settings = Settings(web_search={"backend": "searxng", "url": f"{url}/held", "timeout_s": 120})
    live = make_gateway(settings, engine=SimulatedEngine(script=searching_or_plain))
    with ThreadPoolExecutor(1) as pool:
        a = pool.submit(create, live, input="search tides", tools=WEB)
        assert server.arrived.wait(30), "the search never reached the backend"
        b = create(live, input="hello")
        assert b["status"] == "completed" and b["output"][-1]["content"][0]["text"] == "plain answer"
        # B finished while A's search was still held by the backend
        assert not a.done() and server.answered == 0
        server.release.set()
        ra = a.result(60)
    assert ra["status"] == "completed"
    (call,) = by_type(ra, "web_search_call")
    assert call["status"] == "completed" and server.queries == ["tides"]


@pytest.mark.parametrize("mode", ["slow", "trickle"])
def test_a_search_that_never_answers_fails_after_timeout_s(
    make_gateway: Any, searxng: tuple[Any, str], mode: str
) -> None:
    """No answer at all (``slow``), or a 200 whose body drips a byte at a time forever
    (``trickle``, which no per-read timeout catches): the call ends ``failed`` after the backend's
    ``timeout_s``, the model reads the error, the turn completes."""
    _, url = searxng
    settings = Settings(web_search={"backend": "searxng", "url": f"{url}/{mode}", "timeout_s": 1})
    live = make_gateway(settings, engine=SimulatedEngine(script=searching_or_plain, record_prompts=True))
    t0 = time.monotonic()
    r = create(live, input="search tides", tools=WEB)
    elapsed = time.monotonic() - t0
    assert sdk_check_response(r) == []
    assert r["status"] == "completed" and r["output"][-1]["type"] == "message"
    (call,) = by_type(r, "web_search_call")
    assert call["status"] == "failed"
    assert outcome(live, "searxng", "search", "timeout") == 1
    assert "Error: " in prompts_text(live).rsplit("browser.search", 1)[1]
    print(f"{mode}: the turn took {elapsed:.2f} s with timeout_s=1")


# -- 3. the never-ending page and the 50 MB page ---------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_huge_and_endless_pages_fail_with_bounded_memory(
    make_gateway: Any, searxng: tuple[Any, str], site: str
) -> None:
    """Three opens of the 50 MB page (chunked, no length), one of the same with its length
    declared, and one of the page that never ends: each fails (``too_large``, ``timeout``), the
    turn completes, and the process (the gateway runs in it) grows by far less than one page."""
    _, url = searxng
    opens = ["/big", "/big", "/big", "/big-declared", "/trickle"]
    calls = [ToolCall("open", {"id": site + path}, "browser") for path in opens]
    live = make_gateway(
        web_settings(url, web_page_timeout_s=2),
        engine=SimulatedEngine(script=browse(calls, "Done."), record_prompts=True),
    )
    warm = create(live, input="warm up", tools=WEB)  # imports, pools, first connections
    assert warm["status"] == "completed"
    before = rss_bytes()
    r = create(live, input="read them", tools=WEB)
    grown = rss_bytes() - before
    print(f"RSS before {before / 2**20:.1f} MiB, growth over 5 hostile opens {grown / 2**20:.1f} MiB")
    assert sdk_check_response(r) == []
    assert r["status"] == "completed"
    assert [c["status"] for c in by_type(r, "web_search_call")] == ["failed"] * len(opens)
    assert outcome(live, "pages", "open_page", "too_large") == 2 * 4  # the warm-up turn ran the same
    assert outcome(live, "pages", "open_page", "timeout") == 2
    assert grown < 100 * 2**20
    assert "All work and no play" not in json.dumps(r)


# -- 4. a tenant whose web search is off -----------------------------------------------------------


def tenant_script(view: PromptView) -> Turn:
    """The model calls its browser whatever tools it was given (a prompt injection, a confused
    model): the query is the user's message."""
    last = view.last
    assert last is not None
    if last.role == "tool":
        return Turn(text="Answered from the web.")
    if last.role == "user":
        return Turn(tool_calls=(ToolCall("search", {"query": last.text}, "browser"),))
    return Turn(text="?")


def test_a_tenant_mapped_to_null_is_stripped_and_others_run(make_gateway: Any, searxng: tuple[Any, str]) -> None:
    """``web_search_tenants: {"a": null, "c": {its own backend}}``: tenant a's ``web_search`` is
    stripped and counted, and a browser call its model makes anyway runs nowhere; tenant b uses the
    deployment's backend, tenant c its own. The same request body, interleaved (the checked-tools
    cache is per tenant)."""
    app, url = searxng
    app.state.seen.clear()
    app.state.results = [{"url": "http://example.invalid/x", "title": "X", "content": "Snippet."}]
    settings = Settings(
        api_keys=["a:ka", "b:kb", "c:kc"],
        web_search={"backend": "searxng", "url": f"{url}/custom"},
        web_search_tenants={"a": None, "c": {"backend": "searxng", "url": f"{url}/none"}},
    )
    live = make_gateway(settings, engine=SimulatedEngine(script=tenant_script))
    seen: dict[str, list[dict[str, Any]]] = {}
    for tenant in ("b", "a", "c", "a", "b"):
        got = post(
            live,
            {"model": MODEL, "input": f"query-from-{tenant}", "tools": WEB},
            headers={"authorization": f"Bearer k{tenant}"},
        )
        assert got.status_code == 200, got.text
        body = got.json()
        assert sdk_check_response(body) == []
        seen.setdefault(tenant, []).append(body)
    for body in seen["a"]:
        assert body["tools"] == [] and not by_type(body, "web_search_call")
    for body in seen["b"] + seen["c"]:
        assert body["tools"][0]["type"] == "web_search" and body["status"] == "completed"
        (call,) = by_type(body, "web_search_call")
        assert call["status"] == "completed"
    assert live.metric("respgate_hosted_tools_stripped_total", {"type": "web_search"}) == 2
    searched = [(s["mode"], s["params"].get("q", "")) for s in app.state.seen]
    assert sorted(searched) == sorted(
        [("custom", "query-from-b"), ("custom", "query-from-b"), ("none", "query-from-c")]
    ), searched


# -- 5. hostile allowed_domains --------------------------------------------------------------------

PARAM = "tools[0].filters.allowed_domains"
LONG_LABEL = "a" * 300 + ".com"


@pytest.mark.parametrize(
    ("domains", "kept"),
    [
        (["news.example"], ["news"]),
        (["*.news.example"], ["news"]),
        (["http://news.example"], ["news"]),
        (["HTTPS://NEWS.Example./some/path"], ["news"]),
        (["*.example.com"], []),
        (["news.example", "docs.other"], ["news", "docs"]),
        ([f"d{i}.example.com" for i in range(99)] + ["docs.other"], ["docs"]),
        (["*"], None),
        ([""], None),
        (["   "], None),
        (["http://"], None),
        (["*.*.news.example"], None),
        (["news.*.example"], None),
        ([LONG_LABEL], None),
        (["x." * 130 + "com"], None),
        (["news.example:8080"], None),
        (["news .example"], None),
        (["news.example\x00"], None),
        (["a" * 100_000], None),
        ([f"d{i}.example.com" for i in range(101)], None),
        ([f"d{i}.example.com" for i in range(10_000)], None),
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, list) else str(v),
)
def test_allowed_domains_odd_values_are_a_400_or_honoured(
    make_gateway: Any,
    searxng: tuple[Any, str],
    site: str,
    domains: list[str],
    kept: list[str] | None,
) -> None:
    """Each value is either refused (a 400 naming the parameter, quoting at most a bit of it) or
    honoured (the search returns only hits within it). Never a 500."""
    app, url = searxng
    port = port_of(site)
    hits = {"news": f"http://news.example:{port}/news", "docs": f"http://docs.other:{port}/docs"}
    app.state.results = [{"url": u, "title": k, "content": f"{k} snippet"} for k, u in hits.items()]
    calls = [ToolCall("search", {"query": "anything"}, "browser")]
    live = make_gateway(web_settings(url), engine=SimulatedEngine(script=browse(calls, "Done.")))
    body = {
        "model": MODEL,
        "input": "x",
        "tools": [{"type": "web_search", "filters": {"allowed_domains": domains}}],
        "include": ["web_search_call.action.sources"],
    }
    t0 = time.monotonic()
    got = post(live, body, timeout=60)
    elapsed = time.monotonic() - t0
    print(f"{len(domains)} entries: HTTP {got.status_code} in {elapsed * 1000:.0f} ms")
    if kept is None:
        err = assert_error(got, 400)
        assert err["param"].startswith(PARAM), err
        assert len(err["message"]) < 300, err["message"][:400]
        return
    assert got.status_code == 200, got.text[:500]
    r = got.json()
    assert sdk_check_response(r) == []
    (call,) = by_type(r, "web_search_call")
    assert call["status"] == "completed"
    assert [s["url"] for s in call["action"]["sources"]] == [hits[k] for k in kept]


# -- 6. two web search tools -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "web_search"}, {"type": "web_search"}],
        [{"type": "web_search"}, {"type": "web_search_preview"}],
        [{"type": "web_search_2025_08_26"}, {"type": "web_search_preview_2025_03_11"}],
        [{"type": "function", "name": "f"}, {"type": "web_search"}, {"type": "web_search_preview"}],
    ],
)
def test_two_web_search_tools_are_a_400(make_gateway: Any, searxng: tuple[Any, str], tools: list[Any]) -> None:
    app, url = searxng
    app.state.seen.clear()
    live = make_gateway(web_settings(url))
    got = post(live, {"model": MODEL, "input": "x", "tools": tools})
    assert_error(got, 400, param=f"tools[{len(tools) - 1}].type")
    assert app.state.seen == []
    # without a backend both are stripped, as any hosted tool the gateway does not run
    plain = make_gateway(Settings())
    r = create(plain, input="x", tools=tools)
    assert r["status"] == "completed" and all(t["type"] == "function" for t in r["tools"])


# -- 7. queries, URLs and page text are kept out of the logs ---------------------------------------

QUERY = "zebracorn-query-7781"
URL_MARK = "marmalade-url-4412"
PATTERN = "quokka-pattern-5523"


@pytest.fixture
def every_logger_at_debug(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger at DEBUG (httpx and httpcore included), as ``log_level: debug`` sets them."""
    caplog.set_level(logging.DEBUG)
    saved = {}
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            saved[name] = logger.level
            logger.setLevel(logging.DEBUG)
    try:
        yield caplog
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def test_queries_urls_and_pages_are_not_logged(
    make_gateway: Any, searxng: tuple[Any, str], site: str, every_logger_at_debug: pytest.LogCaptureFixture
) -> None:
    """A search, an open (through a redirect), a find and a failed open, every logger at DEBUG: no
    record of the gateway's (its threads, the prepare pool; not the loopback stand-ins' own
    servers) holds the query, the URL, the pattern or the page's text, formatted as the gateway's
    JSON log lines would be."""
    app, url = searxng
    page = f"{site}/redirect?to=%2Fnews&tag={URL_MARK}"
    app.state.results = [{"url": page, "title": "Harbour", "content": "A snippet."}]
    calls = [
        ToolCall("search", {"query": QUERY}, "browser"),
        ToolCall("open", {"id": 0}, "browser"),
        ToolCall("find", {"pattern": PATTERN}, "browser"),
        ToolCall("open", {"id": f"http://10.0.0.1/{URL_MARK}"}, "browser"),
    ]
    live = make_gateway(web_settings(url), engine=SimulatedEngine(script=browse(calls, "Done."), record_prompts=True))
    caplog = every_logger_at_debug
    caplog.clear()
    r = create(live, input="tell me", tools=WEB)
    assert [c["status"] for c in by_type(r, "web_search_call")] == ["completed", "completed", "completed", "failed"]
    seen = prompts_text(live)
    phrase = "Harbour bridge reopens"
    assert phrase in seen  # the page was read
    assert QUERY in seen and URL_MARK in seen  # and the model saw all of it
    formatter = make_formatter("json")
    ours = [rec for rec in caplog.records if not rec.threadName.startswith("mcp-server-")]
    # the capture covers httpx's own request lines (the page and the search were fetched with it)
    assert any(rec.name == "httpx" for rec in ours), "no httpx record: the capture is not working"
    leaks = []
    for rec in ours:
        line = formatter.format(rec) + rec.getMessage() + repr(rec.args)
        for secret in (QUERY, URL_MARK, PATTERN, phrase, "/redirect?to"):
            if secret in line:
                leaks.append((rec.name, rec.threadName, secret, rec.getMessage()[:200]))
    assert leaks == [], "\n".join(map(repr, leaks))


# -- 8. a WebSocket client that leaves, or steers, while a search runs ------------------------------


def _browse_tasks(live: LiveGateway) -> list[str]:
    async def names() -> list[str]:
        coros = [t.get_coro() for t in asyncio.all_tasks()]
        return [repr(c) for c in coros if getattr(c, "__qualname__", "").endswith("._browse")]

    found: list[str] = live.call(names())
    return found


@pytest.mark.parametrize("how", ["close_frame", "tcp_drop"])
def test_a_client_that_leaves_mid_search(make_gateway: Any, held: tuple[Held, str], how: str) -> None:
    """The socket goes while the backend holds the search: the search's request is dropped (the
    backend sees the gateway leave), no browser task outlives the turn, the turn is billed exactly
    once as cancelled with what the engine generated, and the gateway serves on (no 5xx)."""
    import socket

    server, url = held
    sink = CountingSink()
    settings = Settings(web_search={"backend": "searxng", "url": f"{url}/held", "timeout_s": 120})
    live = make_gateway(settings, engine=SimulatedEngine(script=searching_or_plain), usage_sink=sink)
    ws = ws_open(live)
    send(ws, ws_create(input="search tides", tools=WEB, store=False))
    first = recv(ws)
    assert first["type"] == "response.created"
    rid = first["response"]["id"]
    while True:
        ev = recv(ws)
        assert sdk_check_event(ev, ws=True) == [], ev
        if ev["type"] == "response.web_search_call.searching":
            break
    assert server.arrived.wait(30)
    if how == "close_frame":
        ws.close()
    else:
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.socket.close()
    (record,) = billed(live, sink, 1)
    assert record.response_id == rid and record.status == "cancelled" and record.transport == "ws"
    assert record.output_tokens == live.engine.stats.generated_tokens > 0
    wait_for(lambda: server.disconnected == 1, timeout=30, what="the held search dropped by the gateway")
    wait_for(lambda: not _browse_tasks(live), timeout=30, what="no browser task left")
    wait_for(lambda: live.metric("respgate_ws_connections") == 0, timeout=30, what="the socket forgotten")
    server.release.set()
    after = create(live, input="hello")
    assert after["status"] == "completed"
    records = billed(live, sink, 2)
    assert len(records) == 2 and records[1].response_id == after["id"]
    assert server.answered == 0


def steered_search(view: PromptView) -> Turn:
    """A search first; after a tool's output, endless text (the steer must cut it); STOP -> done."""
    last = view.last
    assert last is not None
    if last.role == "tool":
        return Turn(text="x", endless=True, delay_per_token_s=0.01)
    if "STOP" in last.text:
        return Turn(text=f"ok:{last.text}")
    return Turn(tool_calls=(ToolCall("search", {"query": "tides"}, "browser"),))


def test_a_steer_mid_search_applies_when_the_search_returns(make_gateway: Any, held: tuple[Held, str]) -> None:
    """``response.steer`` while the backend holds the search: accepted, the search runs to its
    end, the response ends ``incomplete`` (steered) with no pass after the search, the successor
    answers the steer; each response billed once, the tokens summing to what the engine made."""
    server, url = held
    sink = MemorySink()
    settings = Settings(web_search={"backend": "searxng", "url": f"{url}/held", "timeout_s": 120})
    engine = SimulatedEngine(script=steered_search, record_prompts=True)
    live = make_gateway(settings, engine=engine, usage_sink=sink)
    with ws_open(live) as ws:
        send(ws, ws_create(input="look it up", tools=WEB, store=False))
        events = [recv(ws)]
        rid = events[0]["response"]["id"]
        while events[-1]["type"] != "response.web_search_call.searching":
            events.append(recv(ws))
        assert server.arrived.wait(30)
        send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "STOP and sum up"})
        accepted = recv(ws)
        assert accepted["type"] == "response.steer.accepted", accepted
        server.release.set()
        finals: list[dict[str, Any]] = []
        while len(finals) < 2:
            ev = recv(ws, timeout=30)
            assert ev["type"] != "error", ev
            if ev["type"] in ("response.completed", "response.incomplete", "response.failed"):
                finals.append(ev["response"])
    steered, successor = finals
    assert steered["id"] == rid and steered["incomplete_details"] == {"reason": "steered"}
    (call,) = by_type(steered, "web_search_call")
    assert call["status"] == "completed" and steered["output"][-1]["type"] == "web_search_call"
    assert successor["status"] == "completed"
    assert successor["output"][-1]["content"][0]["text"] == "ok:STOP and sum up"
    wait_for(lambda: len(sink.records) == 2, timeout=30, what="both responses billed")
    assert set(sink.records) == {rid, successor["id"]}
    assert sum(rec.output_tokens for rec in sink.records.values()) == engine.stats.generated_tokens
    assert sink.records[rid].tool_calls == 1


def test_a_background_response_cancelled_mid_search(make_gateway: Any, held: tuple[Held, str]) -> None:
    """``POST /v1/responses/{id}/cancel`` while the backend holds the search of a background
    response: it ends ``cancelled``, the search's request is dropped, no browser task is left, it
    is billed once as cancelled, and a later release of the backend changes nothing."""
    import httpx

    server, url = held
    sink = CountingSink()
    settings = Settings(web_search={"backend": "searxng", "url": f"{url}/held", "timeout_s": 120})
    live = make_gateway(settings, engine=SimulatedEngine(script=searching_or_plain), usage_sink=sink)
    started = post(live, {"model": MODEL, "input": "search tides", "tools": WEB, "background": True, "store": True})
    assert started.status_code == 200, started.text
    rid = started.json()["id"]
    assert server.arrived.wait(30)
    cancelled = httpx.post(f"{live.base_url}/responses/{rid}/cancel", timeout=30)
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert sdk_check_response(body) == []
    assert body["status"] == "cancelled"
    wait_for(lambda: server.disconnected == 1, timeout=30, what="the held search dropped by the gateway")
    wait_for(lambda: not _browse_tasks(live), timeout=30, what="no browser task left")
    (record,) = billed(live, sink, 1)
    assert record.response_id == rid and record.status == "cancelled"
    assert record.output_tokens == live.engine.stats.generated_tokens > 0
    server.release.set()
    stored = httpx.get(f"{live.base_url}/responses/{rid}", timeout=30).json()
    assert stored["status"] == "cancelled"
    for call in by_type(stored, "web_search_call"):
        assert call["status"] != "completed"
    after = create(live, input="hello")
    assert after["status"] == "completed"
    assert [r.response_id for r in billed(live, sink, 2)] == [rid, after["id"]]
    assert server.answered == 0


# -- more hostile answers: from the search backend, and redirects that are not private ----------------


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("endless", "bad_response"),
        ("huge", "bad_response"),
        ("deep", "bad_response"),
        ("gzip", "bad_response"),
        ("redirect", "bad_response"),
        ("garbage", "bad_response"),
        ("ratelimited", "rate_limited"),
        ("error", "unavailable"),
    ],
)
def test_a_hostile_search_backend_fails_the_call_not_the_turn(
    make_gateway: Any, searxng: tuple[Any, str], mode: str, kind: str
) -> None:
    """A backend answering forever, 64 MiB, JSON nested 100,000 deep, gzip nobody asked for, a
    redirect to the metadata address, HTML, 429, 500: the call fails with its kind, the model reads
    the error, the turn completes."""
    _, url = searxng
    settings = Settings(web_search={"backend": "searxng", "url": f"{url}/{mode}", "timeout_s": 5})
    live = make_gateway(settings, engine=SimulatedEngine(script=searching_or_plain, record_prompts=True))
    r = create(live, input="search tides", tools=WEB)
    assert sdk_check_response(r) == []
    assert r["status"] == "completed" and r["output"][-1]["type"] == "message"
    (call,) = by_type(r, "web_search_call")
    assert call["status"] == "failed"
    assert outcome(live, "searxng", "search", kind) == 1
    assert "Error: " in prompts_text(live).rsplit("browser.search", 1)[1]


def test_redirect_loops_and_other_schemes(
    make_gateway: Any, searxng: tuple[Any, str], site: str, connections: Connections
) -> None:
    """A redirect loop (more than 5 hops), a redirect to ``file://`` and to ``gopher://``: each open
    fails, the turn completes, no connection leaves the loopback site."""
    _, url = searxng
    calls = [
        ToolCall("open", {"id": f"{site}/loop"}, "browser"),
        ToolCall("open", {"id": hop(site, "file:///etc/passwd")}, "browser"),
        ToolCall("open", {"id": hop(site, "gopher://127.0.0.1:70/")}, "browser"),
    ]
    live = make_gateway(web_settings(url), engine=SimulatedEngine(script=browse(calls, "Done."), record_prompts=True))
    r = create(live, input="open them", tools=WEB)
    assert sdk_check_response(r) == []
    assert r["status"] == "completed"
    assert [c["status"] for c in by_type(r, "web_search_call")] == ["failed"] * 3
    assert outcome(live, "pages", "open_page", "http_error") == 1
    assert outcome(live, "pages", "open_page", "refused") == 2
    assert "root:" not in prompts_text(live)
    assert connections.hosts and set(connections.hosts) == {"127.0.0.1"}


def test_credentials_in_a_redirect_hop_are_not_shown(make_gateway: Any, searxng: tuple[Any, str], site: str) -> None:
    """A redirect to ``http://user:password@host/``: nothing is sent with them, and the open is
    refused, so the page's URL (the credentials in it) reaches neither the model nor the client
    (the first URL's own credentials are refused before any fetch)."""
    _, url = searxng
    with_creds = site.replace("http://", "http://admin:s3cret-pw@") + "/headers"
    calls = [ToolCall("open", {"id": hop(site, with_creds)}, "browser")]
    live = make_gateway(web_settings(url), engine=SimulatedEngine(script=browse(calls, "Done."), record_prompts=True))
    r = create(live, input="open it", tools=WEB)
    assert sdk_check_response(r) == []
    assert r["status"] == "completed"
    (call,) = by_type(r, "web_search_call")
    assert call["status"] == "failed"
    assert outcome(live, "pages", "open_page", "refused") == 1
    # (the URL asked for carries them percent-encoded in its query: the model's own input)
    assert "admin:s3cret-pw@" not in json.dumps(r) and "admin:s3cret-pw@" not in prompts_text(live)


@pytest.mark.parametrize("mode", ["forbidden", "error", "garbage", "shape", "ratelimited", "slow"])
def test_a_failing_search_logs_no_query(
    make_gateway: Any, searxng: tuple[Any, str], every_logger_at_debug: pytest.LogCaptureFixture, mode: str
) -> None:
    """A backend that fails (one that echoes the query it was sent in its 403 body, a 500, HTML, the
    wrong JSON, 429, no answer): every logger at DEBUG, no record of the gateway's holds the query."""
    _, url = searxng
    settings = Settings(web_search={"backend": "searxng", "url": f"{url}/{mode}", "timeout_s": 1})
    calls = [ToolCall("search", {"query": QUERY}, "browser")]
    live = make_gateway(settings, engine=SimulatedEngine(script=browse(calls, "Done."), record_prompts=True))
    caplog = every_logger_at_debug
    caplog.clear()
    r = create(live, input="tell me", tools=WEB)
    assert r["status"] == "completed"
    (call,) = by_type(r, "web_search_call")
    assert call["status"] == "failed"
    formatter = make_formatter("json")
    ours = [rec for rec in caplog.records if not rec.threadName.startswith("mcp-server-")]
    leaks = [
        (rec.name, rec.getMessage()[:200])
        for rec in ours
        if QUERY in formatter.format(rec) + rec.getMessage() + repr(rec.args)
    ]
    assert leaks == [], leaks


def test_tenants_without_a_default_backend(make_gateway: Any, searxng: tuple[Any, str]) -> None:
    """No deployment backend, one tenant with its own: only that tenant's ``web_search`` runs; the
    others' is stripped and counted."""
    app, url = searxng
    app.state.seen.clear()
    app.state.results = [{"url": "http://example.invalid/x", "title": "X", "content": "Snippet."}]
    settings = Settings(
        api_keys=["a:ka", "c:kc"], web_search_tenants={"c": {"backend": "searxng", "url": f"{url}/custom"}}
    )
    live = make_gateway(settings, engine=SimulatedEngine(script=tenant_script))
    bodies = {}
    for tenant in ("a", "c"):
        got = post(
            live,
            {"model": MODEL, "input": f"query-from-{tenant}", "tools": WEB},
            headers={"authorization": f"Bearer k{tenant}"},
        )
        assert got.status_code == 200, got.text
        bodies[tenant] = got.json()
    assert bodies["a"]["tools"] == [] and not by_type(bodies["a"], "web_search_call")
    assert [c["status"] for c in by_type(bodies["c"], "web_search_call")] == ["completed"]
    assert live.metric("respgate_hosted_tools_stripped_total", {"type": "web_search"}) == 1
    assert [s["params"].get("q") for s in app.state.seen] == ["query-from-c"]
