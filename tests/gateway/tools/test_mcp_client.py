"""The MCP client against real servers: the SDK-built test server (Streamable HTTP and SSE), a
hostile raw server in each of its modes, and a published server package from PyPI.

Timeouts here are short (0.5 s) so the hostile cases stay fast; each such case checks the answer
names the fault, and that it came well inside what the server would have taken on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from openai.types.responses.response_output_item import McpListToolsTool

from gateway.tools.mcp_client import McpClient, McpEndpoint, McpError, ToolResult, cut_utf8
from tests.mcp_servers import (
    Mode,
    ToolsServer,
    loopback_socket,
    published,
    running_app,
    running_hostile,
    running_tools_server,
)

TOKEN = "test-token-0123456789"
TIMEOUT = 0.5


@pytest.fixture(scope="module")
def tools() -> Iterator[tuple[str, ToolsServer]]:
    with running_tools_server() as served:
        yield served


@pytest.fixture(scope="module")
def sse_tools() -> Iterator[tuple[str, ToolsServer]]:
    with running_tools_server(transport="sse") as served:
        yield served


@pytest.fixture(scope="module")
def locked() -> Iterator[tuple[str, ToolsServer]]:
    with running_tools_server(ToolsServer(token=TOKEN)) as served:
        yield served


def client(**kw: float) -> McpClient:
    kw.setdefault("list_timeout", 10.0)
    kw.setdefault("call_timeout", 10.0)
    return McpClient(**kw)  # type: ignore[arg-type]


# --- listing and calling --------------------------------------------------------------------------


async def test_lists_the_tools_as_openai_shows_them(tools: tuple[str, ToolsServer]) -> None:
    url, _ = tools
    listed = await client().list_tools(McpEndpoint("tools", url))
    by_name = {tool.name: tool for tool in listed}
    assert set(by_name) == {"add", "echo", "slow", "fail", "huge", "whoami", "regional"}
    add = by_name["add"]
    assert add.description == "Add two integers."
    assert set(add.input_schema["properties"]) == {"a", "b"}
    assert add.input_schema["required"] == ["a", "b"]
    for tool in listed:  # each entry is what the SDK's McpListToolsTool accepts
        assert McpListToolsTool.model_validate(tool.wire()).name == tool.name


async def test_call_passes_arguments_and_returns_the_text(tools: tuple[str, ToolsServer]) -> None:
    url, server = tools
    endpoint = McpEndpoint("tools", url)
    before = server.calls["add"]
    result = await client().call_tool(endpoint, "add", {"a": 2, "b": 40})
    assert result == ToolResult("42", None, 2, result.elapsed)
    assert server.calls["add"] == before + 1
    echoed = await client().call_tool(endpoint, "echo", {"text": "héllo ✓"})
    assert echoed.output == "héllo ✓" and echoed.output_bytes == len("héllo ✓".encode())


async def test_a_call_lists_nothing(tools: tuple[str, ToolsServer]) -> None:
    """The SDK's own call_tool lists the tools again to check the output schema; ours does not."""
    url, server = tools
    lists = server.lists
    await client().call_tool(McpEndpoint("tools", url), "add", {"a": 1, "b": 1})
    assert server.lists == lists


async def test_a_tool_with_header_mirrored_arguments_is_listed_then_called(tools: tuple[str, ToolsServer]) -> None:
    """A 2026-07-28 server refuses such a call (HEADER_MISMATCH) from a session that did not list
    the tool; the client lists in the same session and sends the call again, once."""
    url, server = tools
    lists = server.lists
    result = await client().call_tool(McpEndpoint("tools", url), "regional", {"region": "eu-west"})
    assert result.output == "in eu-west" and result.error is None
    assert server.lists == lists + 1


async def test_a_slow_tool_past_the_call_timeout_is_an_error(tools: tuple[str, ToolsServer]) -> None:
    url, _ = tools
    result = await client(call_timeout=TIMEOUT).call_tool(McpEndpoint("tools", url), "slow", {"seconds": 30})
    assert result.output is None
    assert result.error == f"MCP server 'tools': no answer within {TIMEOUT:g} s"
    assert result.error_kind == "http"
    assert result.elapsed < 30


async def test_a_failing_tool_is_the_tools_error(tools: tuple[str, ToolsServer]) -> None:
    url, _ = tools
    result = await client().call_tool(McpEndpoint("tools", url), "fail", {"message": "disk on fire"})
    assert result.output is None
    assert result.error is not None and "disk on fire" in result.error
    assert result.error_kind == "tool"


async def test_a_huge_output_is_cut_at_a_character_with_a_marker(tools: tuple[str, ToolsServer]) -> None:
    url, _ = tools
    limit = 1000
    bounded = client(max_output_bytes=limit)
    result = await bounded.call_tool(McpEndpoint("tools", url), "huge", {"n": 90_000, "char": "€"})
    assert result.output is not None and result.error is None
    assert result.output_bytes == 90_000  # what the tool sent
    assert len(result.output.encode()) <= limit
    kept, marker = result.output.split("\n")
    assert set(kept) == {"€"}  # whole characters only
    assert marker == f"[... {90_000 - len(kept.encode())} bytes cut]"


@pytest.mark.parametrize("char", ["x", "é", "€", "😀"])
def test_cut_utf8_keeps_whole_characters_within_the_limit(char: str) -> None:
    for limit in range(40, 48):  # every offset of the cut within a character
        exact = char * (limit // len(char.encode()))
        assert cut_utf8(exact, limit) == (exact, len(exact.encode()))  # fits: untouched
        text = char * 100
        size = len(text.encode())
        cut, reported = cut_utf8(text, limit)
        kept, marker = cut.split("\n")
        assert reported == size and len(cut.encode()) <= limit
        assert kept == char * len(kept) and marker == f"[... {size - len(kept.encode())} bytes cut]"


async def test_headers_reach_the_server_and_their_values_are_never_shown(tools: tuple[str, ToolsServer]) -> None:
    url, server = tools
    endpoint = McpEndpoint("tools", url, {"Authorization": f"Bearer {TOKEN}", "X-Extra": "1"})
    result = await client().call_tool(endpoint, "whoami", {})
    assert server.seen_authorization[-1] == f"Bearer {TOKEN}"
    assert result.output == "[redacted]"  # the server echoed the credential; the gateway keeps it out
    assert TOKEN not in repr(endpoint) and "Authorization" in repr(endpoint)


async def test_401_names_the_status(locked: tuple[str, ToolsServer]) -> None:
    url, _ = locked
    with pytest.raises(McpError, match="HTTP 401") as caught:
        await client().list_tools(McpEndpoint("locked", url, {"Authorization": "Bearer wrong-token-xyz"}))
    assert "wrong-token-xyz" not in str(caught.value) and url not in str(caught.value)
    result = await client().call_tool(McpEndpoint("locked", url), "add", {"a": 1, "b": 2})
    assert (result.error_kind, result.http_status) == ("http", 401)
    good = McpEndpoint("locked", url, {"Authorization": f"Bearer {TOKEN}"})
    assert (await client().call_tool(good, "add", {"a": 1, "b": 2})).output == "3"


async def test_an_unreachable_server() -> None:
    sock = loopback_socket()  # bound, never listening: connections are refused
    try:
        endpoint = McpEndpoint("gone", f"http://127.0.0.1:{sock.getsockname()[1]}/mcp")
        with pytest.raises(McpError, match="could not be reached"):
            await client().list_tools(endpoint)
        assert (await client().call_tool(endpoint, "add", {})).error_kind == "http"
    finally:
        sock.close()


# --- hostile servers ------------------------------------------------------------------------------

EXPECTED = {
    Mode.SILENT: f"no answer within {TIMEOUT:g} s",
    Mode.DRIP: f"no answer within {TIMEOUT:g} s",
    Mode.ENDLESS: "sent more than 1048576 bytes",
    Mode.MALFORMED: "the server's answer is not valid JSON-RPC",
    Mode.HTTP_500: "the server answered HTTP 500",
    Mode.WRONG_TYPE: "the server answered with a content type that is neither JSON nor SSE",
    Mode.COMPRESSED: "sent a gzip-coded body though none was asked for",
}


@pytest.mark.parametrize("mode", list(Mode), ids=lambda mode: mode.value)
async def test_a_hostile_server_gets_a_bounded_error(mode: Mode) -> None:
    bounded = client(list_timeout=TIMEOUT, call_timeout=TIMEOUT, max_response_bytes=1024 * 1024)
    with running_hostile(mode) as (url, server):
        endpoint = McpEndpoint("hostile", url)
        with pytest.raises(McpError) as caught:
            await bounded.list_tools(endpoint)
        assert str(caught.value) == f"Could not list the tools of MCP server 'hostile': {EXPECTED[mode]}"
        result = await bounded.call_tool(endpoint, "add", {"a": 1, "b": 2})
        assert result.output is None and result.error == f"MCP server 'hostile': {EXPECTED[mode]}"
        assert result.elapsed < 10 * TIMEOUT
        assert server.requests >= 2


async def test_cancelling_a_call_closes_its_connection() -> None:
    with running_hostile(Mode.SILENT) as (url, server):
        call = asyncio.ensure_future(client(call_timeout=60).call_tool(McpEndpoint("silent", url), "add", {}))
        while server.requests == 0:  # the request is in; the server will never answer it
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        for _ in range(500):  # the server sees the hang-up long before the 60 s timeout
            if server.closed:
                break
            await asyncio.sleep(0.01)
        assert server.closed == server.connections >= 1


async def test_cancelling_a_slow_tool_call(tools: tuple[str, ToolsServer]) -> None:
    url, server = tools
    before = server.calls["slow"]
    call = asyncio.ensure_future(client(call_timeout=60).call_tool(McpEndpoint("tools", url), "slow", {"seconds": 60}))
    while server.calls["slow"] == before:
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


# --- SSE --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["auto", "sse"])
async def test_an_sse_server(sse_tools: tuple[str, ToolsServer], transport: str) -> None:
    url, server = sse_tools
    endpoint = McpEndpoint("old", url, {"Authorization": f"Bearer {TOKEN}"}, transport=transport)  # type: ignore[arg-type]
    assert url.endswith("/sse")
    assert {tool.name for tool in await client().list_tools(endpoint)} >= {"add", "whoami"}
    assert (await client().call_tool(endpoint, "add", {"a": 20, "b": 22})).output == "42"
    await client().call_tool(endpoint, "whoami", {})
    assert server.seen_authorization[-1] == f"Bearer {TOKEN}"


async def test_auto_falls_back_to_sse_when_the_streamable_post_is_refused() -> None:
    """An SSE-only server at a path that does not say so answers the streamable POST with 405."""
    server = ToolsServer()
    with running_app(server.app("sse", sse_path="/events")) as base:
        endpoint = McpEndpoint("old", base + "/events")
        assert {tool.name for tool in await client().list_tools(endpoint)} >= {"add"}
        assert (await client().call_tool(endpoint, "add", {"a": 1, "b": 1})).output == "2"
        with pytest.raises(McpError, match="HTTP 405"):  # no fallback when the transport is named
            await client().list_tools(McpEndpoint("old", base + "/events", transport="streamable_http"))


# --- a published server -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not published.available(), reason="the test extra's fastmcp and mcp-server-time")
async def test_a_published_server_over_http() -> None:
    """``mcp-server-time`` from PyPI behind ``fastmcp run --transport http`` (see
    tests/mcp_servers/published.py), listed and called through the gateway's client."""
    with published.running_time_server() as url:
        endpoint = McpEndpoint("time", url)
        names = {tool.name for tool in await client(list_timeout=30).list_tools(endpoint)}
        assert {"get_current_time", "convert_time"} <= names
        result = await client(call_timeout=30).call_tool(endpoint, "get_current_time", {"timezone": "Europe/Paris"})
        assert result.error is None and result.output is not None
        assert '"timezone": "Europe/Paris"' in result.output or "Europe/Paris" in result.output


# --- behind the outbound guard ----------------------------------------------------------------------


async def test_the_outbound_guards_factory_plugs_in(
    tools: tuple[str, ToolsServer], sse_tools: tuple[str, ToolsServer]
) -> None:
    """``security.outbound.mcp_client_factory`` as ``http_factory``: its refusal is the error (its
    message is written to be shown), and an exempted network is reached over both transports."""
    from security.outbound import OutboundPolicy, mcp_client_factory

    strict = McpClient(mcp_client_factory(OutboundPolicy()), list_timeout=10, call_timeout=10)
    exempt = McpClient(mcp_client_factory(OutboundPolicy(allow_networks=("127.0.0.0/8",))), list_timeout=10)
    for url in (tools[0], sse_tools[0]):
        with pytest.raises(McpError, match="loopback"):
            await strict.list_tools(McpEndpoint("guarded", url))
        refused = await strict.call_tool(McpEndpoint("guarded", url), "add", {"a": 1, "b": 2})
        assert refused.error_kind == "http" and "Refused to connect" in (refused.error or "")
        assert (await exempt.call_tool(McpEndpoint("guarded", url), "add", {"a": 1, "b": 2})).output == "3"


async def test_an_endless_body_costs_bounded_memory() -> None:
    """Counted, not timed: the bytes held while an endless answer is read stay near the byte budget
    (without the counter the client reads until the deadline: hundreds of MB on loopback)."""
    import tracemalloc

    budget = 1024 * 1024
    bounded = client(list_timeout=5.0, max_response_bytes=budget)
    with running_hostile(Mode.ENDLESS) as (url, _):
        tracemalloc.start()
        try:
            with pytest.raises(McpError) as caught:
                await bounded.list_tools(McpEndpoint("endless", url))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 16 * budget, f"{peak} bytes held at the peak"
    assert "sent more than 1048576 bytes" in str(caught.value)


@pytest.mark.parametrize(
    "headers",
    [{"X-A": "caf€"}, {"X A": "v"}, {"X-A": "v\r\nX-Injected: 1"}, {"": "v"}, {"X-A": "v\x00"}],
    ids=["not-latin1", "space-in-name", "crlf-injection", "empty-name", "nul"],
)
async def test_a_header_http_cannot_carry_is_refused_before_sending(
    tools: tuple[str, ToolsServer], headers: dict[str, str]
) -> None:
    url, server = tools
    before = server.calls["add"]
    result = await client().call_tool(McpEndpoint("tools", url, headers), "add", {"a": 1, "b": 2})
    assert result.error == "MCP server 'tools': a header name or value is not valid in HTTP"
    assert server.calls["add"] == before


@pytest.mark.parametrize("url", ["ftp://host/mcp", "not a url", "http://", "http://127.0.0.1:99999/mcp"])
async def test_a_url_that_is_not_http_is_an_error(url: str) -> None:
    with pytest.raises(McpError, match="not a valid http\\(s\\) URL"):
        await client().list_tools(McpEndpoint("bad", url))


# --- learned protocols ------------------------------------------------------------------------------


async def test_a_learned_protocol_skips_the_probe() -> None:
    with running_tools_server() as (url, server):
        learner = client()
        await learner.call_tool(McpEndpoint("tools", url), "add", {"a": 1, "b": 2})
        first = server.requests[("POST", "/mcp")]
        assert first == 2  # server/discover, then the call
        assert learner.learned.get(url) == "2026-07-28"
        assert (await learner.call_tool(McpEndpoint("tools", url), "add", {"a": 1, "b": 2})).output == "3"
        assert server.requests[("POST", "/mcp")] == first + 1  # the call alone


async def test_a_learned_sse_server_gets_no_streamable_post() -> None:
    server = ToolsServer()
    with running_app(server.app("sse", sse_path="/events")) as base:
        learner = client()
        url = base + "/events"
        await learner.list_tools(McpEndpoint("old", url))
        refused = server.requests[("POST", "/events")]  # the probe and the handshake, both 405
        assert refused == 2 and learner.learned.get(url) == "sse"
        assert (await learner.call_tool(McpEndpoint("old", url), "add", {"a": 2, "b": 2})).output == "4"
        assert server.requests[("POST", "/events")] == refused


@pytest.mark.parametrize("stale", ["2026-07-28", "legacy"])
async def test_a_stale_protocol_is_forgotten_and_the_call_still_runs_once(stale: str) -> None:
    """The URL is now an SSE-only server: the learned try is refused (405) before anything runs, so
    the call is sent again the full way, and runs exactly once."""
    server = ToolsServer()
    with running_app(server.app("sse", sse_path="/events")) as base:
        learner = client()
        url = base + "/events"
        learner.learned.put(url, stale)
        result = await learner.call_tool(McpEndpoint("old", url), "add", {"a": 3, "b": 4})
        assert result.output == "7" and server.calls["add"] == 1
        assert learner.learned.get(url) == "sse"


async def test_a_learned_protocol_does_not_rerun_a_call_that_may_have_run(tools: tuple[str, ToolsServer]) -> None:
    """A call that failed after it was sent (here: the deadline) is not sent again."""
    url, server = tools
    learner = client(call_timeout=TIMEOUT)
    await learner.call_tool(McpEndpoint("tools", url), "add", {"a": 1, "b": 1})
    before = server.calls["slow"]
    result = await learner.call_tool(McpEndpoint("tools", url), "slow", {"seconds": 30})
    assert result.error is not None and "no answer" in result.error
    assert server.calls["slow"] == before + 1  # sent once
    assert learner.learned.get(url) == "2026-07-28"  # a slow tool says nothing against the protocol
