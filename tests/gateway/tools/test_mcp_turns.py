"""Remote MCP through the gateway, from the outside: a real MCP server (the SDK's server side, on
loopback), the simulated engine calling its tools, raw HTTP/SSE and WebSocket clients, the
openai SDK's types as the judge of every item and event.

The simulated model's default script calls the first tool offered after a user message and
reports a tool's output after it (``inference.simulated_script.default_script``), so one request
makes one round trip; scripted models make N.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn
from tests.billing.test_ledger_faults import CountingSink, billed
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import assert_error, create, post, stream
from tests.mcp_servers.running import running_app
from tests.mcp_servers.tools_server import ToolsServer
from tests.schema_check import sdk_check_event, sdk_check_response
from tests.turn_helpers import full_render_fallbacks
from tests.ws_helpers import create as ws_create
from tests.ws_helpers import send, until_terminal, ws_open


@pytest.fixture
def tools_server() -> Iterator[tuple[ToolsServer, str]]:
    server = ToolsServer()
    with running_app(server.app()) as url:
        yield server, url + ToolsServer.path()


def loopback_settings(**kw: Any) -> Settings:
    """The operator lets requests reach this test's loopback MCP server."""
    return Settings(mcp_allowed_urls={"*": ["http://127.0.0.1:"]}, outbound_allow_networks=["127.0.0.1/32"], **kw)


def mcp_tool(url: str, **kw: Any) -> dict[str, Any]:
    tool = {"type": "mcp", "server_label": "tools", "server_url": url, "require_approval": "never"}
    tool.update(kw)
    return tool


def types(response: dict[str, Any]) -> list[str]:
    return [it["type"] for it in response["output"]]


def by_type(response: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [it for it in response["output"] if it["type"] == kind]


def test_one_round_trip_in_one_response(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    live: LiveGateway = make_gateway(loopback_settings())
    r = create(live, input="hello there", tools=[mcp_tool(url, allowed_tools=["echo"])])
    assert sdk_check_response(r) == []
    assert r["status"] == "completed"
    listing = by_type(r, "mcp_list_tools")
    assert [t["name"] for t in listing[0]["tools"]] == ["echo"] and listing[0]["error"] is None
    (call,) = by_type(r, "mcp_call")
    assert call["name"] == "echo" and call["server_label"] == "tools" and call["status"] == "completed"
    assert call["error"] is None and json.loads(call["arguments"]) == {"text": call["output"]}
    assert server.calls["echo"] == 1
    # the model answered after the tool, in the same response
    assert types(r)[-1] == "message"
    assert call["output"] in r["output"][-1]["content"][0]["text"]
    # usage counts both engine passes: the second prompt holds the first, its output and the tool's
    prompts = live.engine.stats.prompts
    assert len(prompts) == 2
    first, second = prompts
    assert second[: len(first)] == first  # appended at the token tip, never re-rendered
    assert r["usage"]["input_tokens"] == len(first) + len(second)
    # the echo: the mcp tool as sent, without credentials
    (echoed,) = r["tools"]
    assert echoed["type"] == "mcp" and echoed["server_label"] == "tools" and echoed["headers"] is None


def test_stream_events_are_openais(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    _, url = tools_server
    live = make_gateway(loopback_settings())
    _, _, events = stream(live, input="hi", tools=[mcp_tool(url, allowed_tools=["echo"])])
    for ev in events:
        assert sdk_check_event(ev) == [], ev
    assert [ev["sequence_number"] for ev in events] == list(range(len(events)))
    names = [ev["type"] for ev in events]
    expected = [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.completed",
    ]
    positions = [names.index(n) for n in expected]
    assert positions == sorted(positions), names
    call_done = [ev for ev in events if ev["type"] == "response.output_item.done" and ev["item"]["type"] == "mcp_call"]
    assert call_done and call_done[0]["item"]["output"] is not None
    assert names.index("response.mcp_call.completed") < names.index(
        "response.output_item.done", names.index("response.mcp_call.completed")
    )


def test_continuation_reuses_the_listing(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    live = make_gateway(loopback_settings())
    tools = [mcp_tool(url, allowed_tools=["echo"])]
    first = create(live, input="one", tools=tools)
    lists = server.lists
    second = create(live, input="two", tools=tools, previous_response_id=first["id"])
    assert "mcp_list_tools" in types(first) and "mcp_list_tools" not in types(second)
    assert server.lists == lists  # the catalog's copy, no re-listing
    assert by_type(second, "mcp_call")[0]["status"] == "completed"
    assert full_render_fallbacks(live) == 0  # the continuation appended to the tool loop's history


def test_approval_round_trip_is_an_append(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    live = make_gateway(loopback_settings())
    tools = [mcp_tool(url, allowed_tools=["echo"], require_approval="always")]
    asked = create(live, input="please echo", tools=tools)
    assert sdk_check_response(asked) == []
    (request,) = by_type(asked, "mcp_approval_request")
    assert types(asked)[-1] == "mcp_approval_request" and server.calls["echo"] == 0
    answer = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    done = create(live, input=[answer], tools=tools, previous_response_id=asked["id"])
    assert sdk_check_response(done) == []
    (call,) = by_type(done, "mcp_call")
    assert call["approval_request_id"] == request["id"] and call["arguments"] == request["arguments"]
    assert server.calls["echo"] == 1 and call["output"] is not None
    assert types(done)[-1] == "message"
    prompts = live.engine.stats.prompts
    assert prompts[-1][: len(prompts[-2])] == prompts[-2]  # the approval's turn appended to the parent's


def test_refused_approval_runs_nothing(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    live = make_gateway(loopback_settings())
    tools = [mcp_tool(url, allowed_tools=["echo"], require_approval="always")]
    asked = create(live, input="please echo", tools=tools)
    (request,) = by_type(asked, "mcp_approval_request")
    answer = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False}
    done = create(live, input=[answer], tools=tools, previous_response_id=asked["id"])
    assert server.calls["echo"] == 0 and not by_type(done, "mcp_call")
    assert "did not approve" in done["output"][-1]["content"][0]["text"]


def test_tool_errors_are_mcp_call_errors(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    _, url = tools_server
    script = _calls([ToolCall("fail", {"message": "boom"}, "tools")])
    live = make_gateway(loopback_settings(), engine=SimulatedEngine(script=script, record_prompts=True))
    r = create(live, input="x", tools=[mcp_tool(url)])
    assert sdk_check_response(r) == []
    (call,) = by_type(r, "mcp_call")
    assert call["status"] == "failed" and call["output"] is None
    assert call["error"]["type"] == "mcp_tool_execution_error" and "boom" in json.dumps(call["error"])
    assert r["status"] == "completed"


def test_max_tool_calls_stops_the_loop(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    script = _calls([ToolCall("echo", {"text": f"n{i}"}, "tools") for i in range(5)])
    live = make_gateway(loopback_settings(), engine=SimulatedEngine(script=script, record_prompts=True))
    r = create(live, input="x", tools=[mcp_tool(url)], max_tool_calls=2)
    calls = by_type(r, "mcp_call")
    assert [c["status"] for c in calls] == ["completed", "completed", "failed"]
    assert "max_tool_calls" in calls[-1]["error"]["message"]
    assert server.calls["echo"] == 2 and r["status"] == "completed"


@pytest.mark.parametrize("n", [1, 5, 20])
def test_round_trips_render_each_output_once(
    make_gateway: Any, tools_server: tuple[ToolsServer, str], n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: a response with N tool round trips renders each tool output once and
    never the history again (the engine's N+1 prompts are each an append to the one before)."""
    server, url = tools_server
    script = _calls([ToolCall("echo", {"text": f"output number {i}"}, "tools") for i in range(n)])
    live = make_gateway(loopback_settings(), engine=SimulatedEngine(script=script, record_prompts=True))
    renderer = live.gw.registry.get(MODEL).renderer
    rendered: list[int] = []
    real = renderer.render_items

    def counting(items: Any, calls: Any = None) -> list[int]:
        tokens = real(items, calls)
        rendered.append(len(tokens))
        return tokens

    monkeypatch.setattr(renderer, "render_items", counting)
    r = create(live, input="go", tools=[mcp_tool(url)])
    calls = by_type(r, "mcp_call")
    assert len(calls) == n and server.calls["echo"] == n
    prompts = live.engine.stats.prompts
    assert len(prompts) == n + 1
    for before, after in zip(prompts, prompts[1:]):
        assert after[: len(before)] == before
    # the prepare stage rendered the input once; then one render per round trip, of that output only
    loop_renders = rendered[-n:]
    outputs = [
        real(
            [
                {
                    "type": "function_call_output",
                    "call_id": c["id"],
                    "name": "echo",
                    "namespace": "tools",
                    "output": c["output"],
                }
            ]
        )
        for c in calls
    ]
    assert loop_renders == [len(o) for o in outputs]


def test_websocket_round_trip(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    live = make_gateway(loopback_settings())
    with ws_open(live) as ws:
        send(ws, ws_create(model=MODEL, input="hi", tools=[mcp_tool(url, allowed_tools=["echo"])]))
        events = until_terminal(ws)
    for ev in events:
        assert sdk_check_event(ev, ws=True) == [], ev
    final = events[-1]["response"]
    assert final["status"] == "completed" and server.calls["echo"] == 1
    assert [it["type"] for it in final["output"]].count("mcp_call") == 1


# -- bad input: a 400 naming the parameter ------------------------------------------------------


_LOCAL = "http://127.0.0.1:1/"


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"server_label": "nope"}, "tools[0].server_url"),
        ({"server_label": "x", "server_url": "https://example.com/mcp"}, "tools[0].server_url"),
        ({"server_label": "x", "server_url": "ftp://127.0.0.1/"}, "tools[0].server_url"),
        ({"server_label": "bad label", "server_url": _LOCAL}, "tools[0].server_label"),
        ({"server_label": "functions", "server_url": _LOCAL}, "tools[0].server_label"),
        ({"server_label": "x", "server_url": _LOCAL, "require_approval": "sometimes"}, "tools[0].require_approval"),
        (
            {"server_label": "x", "server_url": _LOCAL, "require_approval": {"maybe": {}}},
            "tools[0].require_approval.maybe",
        ),
        ({"server_label": "x", "server_url": _LOCAL, "allowed_tools": "echo"}, "tools[0].allowed_tools"),
        ({"server_label": "x", "connector_id": "connector_gmail"}, "tools[0].connector_id"),
        ({"server_label": "x", "server_url": "http://user:pw@127.0.0.1:1/"}, "tools[0].server_url"),
    ],
)
def test_bad_mcp_tools_are_400s(make_gateway: Any, tool: dict[str, Any], param: str) -> None:
    live = make_gateway(Settings(mcp_allowed_urls={"*": ["http://127.0.0.1:", "ftp://"]}))
    r = post(live, {"model": MODEL, "input": "x", "tools": [{"type": "mcp", **tool}]})
    assert_error(r, 400, param=param)


def test_a_label_may_not_clash_with_a_clients_tool(make_gateway: Any) -> None:
    live = make_gateway(loopback_settings())
    tools = [{"type": "function", "name": "x"}, {"type": "mcp", "server_label": "x", "server_url": _LOCAL}]
    body = {"model": MODEL, "input": "x", "tools": tools}
    assert_error(post(live, body), 400, param="tools[1].server_label")


def test_duplicate_labels_and_unknown_approvals_are_400s(make_gateway: Any) -> None:
    live = make_gateway(loopback_settings())
    tool = {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1/mcp"}
    assert_error(post(live, {"model": MODEL, "input": "x", "tools": [tool, tool]}), 400, param="tools[1].server_label")
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}
    assert_error(
        post(live, {"model": MODEL, "input": [answer], "tools": [tool]}), 400, param="input[0].approval_request_id"
    )
    bad = {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": "yes"}
    assert_error(post(live, {"model": MODEL, "input": [bad], "tools": [tool]}), 400, param="input[0].approve")


def test_loopback_is_refused_by_default(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    """SSRF: an allowed URL prefix is not enough; the resolved address must be public (or exempt)."""
    server, url = tools_server
    live = make_gateway(Settings(mcp_allowed_urls={"*": ["http://"]}))
    r = create(live, input="hi", tools=[mcp_tool(url)])
    (listing,) = by_type(r, "mcp_list_tools")
    assert listing["error"] and "loopback" in listing["error"] and listing["tools"] == []
    assert r["status"] == "completed" and server.lists == 0 and not by_type(r, "mcp_call")


def test_credentials_are_never_echoed_or_stored(make_gateway: Any) -> None:
    token = "sekrit-token-4242"
    server = ToolsServer(token=token)
    sink = CountingSink()
    with running_app(server.app()) as base:
        live = make_gateway(loopback_settings(), usage_sink=sink)
        tool = mcp_tool(base + "/mcp", allowed_tools=["whoami"], authorization=token, headers={"X-Key": "hdr-9999"})
        r = create(live, input="who", tools=[tool])
        assert server.seen_authorization == [f"Bearer {token}"]  # it reached the server
        # and a server that echoes a credential back does not show it to the model or the client
        assert by_type(r, "mcp_call")[0]["output"] == "[redacted]"
        stored = live.openai().responses.retrieve(r["id"]).model_dump()
        for response in (r, stored):
            # the tool's own output holds what it was sent; nothing else does
            rest = [it for it in response["output"] if it["type"] != "mcp_call"]
            text = json.dumps([rest, response["tools"], response.get("usage")])
            assert token not in text and "hdr-9999" not in text
            assert response["tools"][0]["headers"] is None and response["tools"][0]["authorization"] is None
        # the ledger: the response's calls and their time, and no credential
        (record,) = billed(live, sink, 1)
        assert record.tool_calls == 1 and record.tool_s > 0
        assert token not in repr(record) and "hdr-9999" not in repr(record)


def _calls(calls: list[ToolCall], answer: str | None = None) -> Any:
    """A script: after the user speaks and after each tool output, the next call; then ``answer``
    (default: how many calls it made)."""
    state = {"i": 0}

    def script(view: Any) -> Turn:
        last = view.last
        if last is not None and last.role == "user":
            state["i"] = 0
        i = state["i"]
        if i < len(calls):
            state["i"] = i + 1
            return Turn(reasoning=f"call {i}", tool_calls=(calls[i],))
        return Turn(text=answer if answer is not None else f"done after {i} calls")

    return script


def test_metrics_count_calls_errors_time_and_bytes(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    """Per tool type and server label (``request`` for a URL a request named: its label is the
    client's); the ledger gets the response's calls and their seconds."""
    _, url = tools_server
    script = _calls([ToolCall("echo", {"text": "abc"}, "tools"), ToolCall("fail", {"message": "no"}, "tools")])
    live = make_gateway(loopback_settings(), engine=SimulatedEngine(script=script, record_prompts=True))
    r = create(live, input="x", tools=[mcp_tool(url)])
    assert [c["status"] for c in by_type(r, "mcp_call")] == ["completed", "failed"]
    labels = {"tool": "mcp", "server": "request"}
    assert live.metric("respgate_hosted_tool_calls_total", {**labels, "outcome": "ok"}) == 1
    assert live.metric("respgate_hosted_tool_calls_total", {**labels, "outcome": "error"}) == 1
    assert live.metric("respgate_hosted_tool_seconds_count", labels) == 2
    assert live.metric("respgate_hosted_tool_output_bytes_total", labels) >= 3
    assert live.metric("respgate_hosted_tool_listings_total", {**labels, "outcome": "ok"}) == 1


def test_a_response_mixes_gateway_and_client_calls(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    """The gateway runs the MCP call and generates on; the model's next call is the client's: the
    response ends there, as any function call ends one, and the client's output continues it."""
    server, url = tools_server
    script = _calls([ToolCall("echo", {"text": "a"}, "tools"), ToolCall("lookup", {"q": "b"})])
    live = make_gateway(loopback_settings(), engine=SimulatedEngine(script=script, record_prompts=True))
    function = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    tools = [mcp_tool(url), function]
    r = create(live, input="x", tools=tools)
    assert sdk_check_response(r) == []
    assert [t for t in types(r) if t != "reasoning"] == ["mcp_list_tools", "mcp_call", "function_call"]
    assert server.calls["echo"] == 1 and r["status"] == "completed"
    (call,) = by_type(r, "function_call")
    out = {"type": "function_call_output", "call_id": call["call_id"], "output": "found"}
    done = create(live, input=[out], tools=tools, previous_response_id=r["id"])
    assert types(done)[-1] == "message" and server.calls["echo"] == 1
    prompts = live.engine.stats.prompts
    assert prompts[-1][: len(prompts[-2])] == prompts[-2]


def test_an_operators_server_is_named_by_label_for_its_tenants_only(
    make_gateway: Any, tools_server: tuple[ToolsServer, str]
) -> None:
    """``mcp_servers``: the URL and credentials stay on the gateway (a private address is the
    operator's to allow); a tenant it is not for is told the server does not exist."""
    server, url = tools_server
    keys = ["acme:sk-" + "a" * 40, "other:sk-" + "b" * 40]
    live = make_gateway(
        Settings(
            api_keys=keys, mcp_servers={"ops": {"url": url, "headers": {"X-Op": "op-secret-77"}, "tenants": ["acme"]}}
        )
    )
    tool = {"type": "mcp", "server_label": "ops", "require_approval": "never", "allowed_tools": ["echo"]}
    body = {"model": MODEL, "input": "hi", "tools": [tool]}
    r = post(live, body, headers={"authorization": "Bearer sk-" + "a" * 40})
    assert r.status_code == 200, r.text
    response = r.json()
    assert by_type(response, "mcp_call")[0]["status"] == "completed" and server.calls["echo"] == 1
    assert "op-secret-77" not in r.text and response["tools"][0]["server_url"] is None
    denied = post(live, body, headers={"authorization": "Bearer sk-" + "b" * 40})
    assert_error(denied, 400, param="tools[0].server_url")
