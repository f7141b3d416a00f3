"""Remote MCP through the gateway, driven by UNMODIFIED real clients (issue 30, "Clients unmodified").

What ``tests/gateway/tools/test_mcp_turns.py`` proves with raw HTTP/WebSocket frames, proved here
with the clients users run, as they ship:

* **openai-agents 0.24**: an ``Agent`` holding a ``HostedMCPTool`` run by ``Runner.run`` over the
  Responses model. The agent parses the gateway's ``mcp_list_tools`` / ``mcp_call`` items into its
  own run items, and on ``require_approval: "always"`` its ``on_approval_request`` hook answers the
  ``mcp_approval_request`` and the agent sends the ``mcp_approval_response`` itself (with the whole
  history as input: no ``previous_response_id``), so the gateway must find the request in the input.
* **openai SDK 3.57**: ``responses.create`` (typed output items), ``stream=True`` (every event parsed
  into its own typed class, none left unknown), and ``responses.connect()`` (WebSocket mode) with an
  approval round trip on one socket under ``store=False``.
* **a published MCP server** (``mcp-server-time`` behind ``fastmcp run``, ``tests/mcp_servers/published``).
* **the real CPU vLLM engine**: one forced MCP call (``tool_choice`` naming the server's tool), the
  constrained decoding making the call; slow.

The MCP server is the SDK-built ``ToolsServer`` on loopback; the engine is the simulated one (whose
default script calls the first tool offered after a user message, then reports its output) except
in the real-engine test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseOutputMessage
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools

from gateway.tools.hosted import HostedTools
from inference.simulated_prompt import PromptView
from tests.clients.test_real_clients import record_wire
from tests.conftest import MODEL, VLLM_MODEL, LiveGateway
from tests.gateway.tools.test_mcp_turns import loopback_settings, mcp_tool, tools_server  # noqa: F401 (fixture)
from tests.http_helpers import create, post
from tests.mcp_servers import published
from tests.mcp_servers.tools_server import ToolsServer
from tests.schema_check import typed_exactly

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------------------------------------
# openai-agents: HostedMCPTool
# ---------------------------------------------------------------------------------------------


def _run_agent(live: LiveGateway, tool_config: dict[str, Any], on_approval: Any = None) -> Any:
    from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, set_tracing_disabled

    async def main() -> Any:
        set_tracing_disabled(True)  # otherwise traces go to the public API
        client = AsyncOpenAI(base_url=live.base_url, api_key="test-key", max_retries=0)
        agent = Agent(
            name="mcp",
            instructions="Use the tools, then answer.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            tools=[HostedMCPTool(tool_config=tool_config, on_approval_request=on_approval)],  # type: ignore[arg-type]
        )
        try:
            return await Runner.run(agent, "please echo something", max_turns=4)
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_agents_hosted_mcp_tool_runs_on_the_gateway(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    from agents import MCPListToolsItem, MessageOutputItem, ToolCallItem, __version__

    server, url = tools_server
    live = make_gateway(loopback_settings())
    result = _run_agent(live, mcp_tool(url, allowed_tools=["echo"]))
    assert __version__ == "0.24.0"
    listings = [i for i in result.new_items if isinstance(i, MCPListToolsItem)]
    assert [t.name for t in listings[0].raw_item.tools] == ["echo"]
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    assert len(calls) == 1 and isinstance(calls[0], McpCall)
    call = calls[0]
    assert call.name == "echo" and call.server_label == "tools" and call.error is None and call.output
    assert json.loads(call.arguments) == {"text": call.output}
    assert server.calls["echo"] == 1 and live.engine.stats.requests == 2  # one model call: both passes inside
    assert isinstance(result.new_items[-1], MessageOutputItem) and call.output in result.final_output


@pytest.mark.parametrize("approve", [True, False])
def test_agents_answers_an_approval_request_itself(
    make_gateway: Any, tools_server: tuple[ToolsServer, str], approve: bool
) -> None:
    """The agent's hook approves (or refuses); the agent sends the ``mcp_approval_response`` in its
    next model call, the whole history as input; the server's tool runs only when approved."""
    from agents import MCPApprovalRequestItem, MCPApprovalResponseItem, ToolCallItem

    server, url = tools_server
    live = make_gateway(loopback_settings())
    wire = record_wire(live)
    asked: list[Any] = []

    def hook(request: Any) -> dict[str, Any]:
        asked.append(request.data)
        assert server.calls["echo"] == 0  # nothing ran before the answer
        return {"approve": approve} if approve else {"approve": False, "reason": "not today"}

    result = _run_agent(live, mcp_tool(url, allowed_tools=["echo"], require_approval="always"), hook)
    assert len(asked) == 1 and asked[0].name == "echo" and asked[0].server_label == "tools"
    kinds = [type(i) for i in result.new_items]
    assert MCPApprovalRequestItem in kinds and MCPApprovalResponseItem in kinds
    # the agent's second model call: the history re-sent, the request and its answer at the end
    second = wire.http_bodies[1]
    assert "previous_response_id" not in second
    assert [i.get("type") for i in second["input"][-2:]] == ["mcp_approval_request", "mcp_approval_response"]
    assert second["input"][-1]["approve"] is approve and second["input"][-1]["approval_request_id"] == asked[0].id
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem) and isinstance(i.raw_item, McpCall)]
    if approve:
        assert server.calls["echo"] == 1 and len(calls) == 1
        assert calls[0].approval_request_id == asked[0].id and calls[0].output in result.final_output
    else:
        assert server.calls["echo"] == 0 and calls == []
        assert "did not approve" in result.final_output  # the model read the refusal (and its reason)
        tool_said = [m.text for m in PromptView(live.engine.stats.prompts[-1]).messages() if m.role == "tool"]
        assert tool_said and "did not approve" in tool_said[-1] and "not today" in tool_said[-1]


def test_a_refusal_with_the_request_resent_is_rendered(
    make_gateway: Any, tools_server: tuple[ToolsServer, str]
) -> None:
    """The agents refusal above, in raw HTTP: the first response's items re-sent as input (what a
    client without ``previous_response_id`` does) and a refusal after them. It was a 400 once the
    tenant's prefix cache covered the request (the refusal's output rendered alone, its call not
    indexed among the new items): found by the agents test, fixed in ``gateway/turn/resolve.py``."""
    server, url = tools_server
    live = make_gateway(loopback_settings())
    tools = [mcp_tool(url, allowed_tools=["echo"], require_approval="always")]
    user = {"role": "user", "content": "please echo"}
    asked = create(live, input=[user], tools=tools)
    request = asked["output"][-1]
    assert request["type"] == "mcp_approval_request"
    refusal = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False}
    r = post(live, {"model": MODEL, "input": [user, *asked["output"], refusal], "tools": tools})
    assert r.status_code == 200, r.text
    assert server.calls["echo"] == 0 and "did not approve" in r.json()["output"][-1]["content"][0]["text"]


# ---------------------------------------------------------------------------------------------
# openai SDK: create, stream, WebSocket mode
# ---------------------------------------------------------------------------------------------


def test_sdk_create_returns_typed_mcp_items(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    live = make_gateway(loopback_settings())
    r = live.openai().responses.create(
        model=MODEL,
        input="hello there",
        tools=[mcp_tool(url, allowed_tools=["echo"])],
    )
    assert isinstance(r, Response) and r.status == "completed"
    listing, message = r.output[0], r.output[-1]
    (call,) = [o for o in r.output if isinstance(o, McpCall)]
    assert isinstance(listing, McpListTools) and [t.name for t in listing.tools] == ["echo"]
    schema: Any = listing.tools[0].input_schema
    assert schema["properties"]["text"]["type"] == "string"
    assert isinstance(call, McpCall) and call.status == "completed" and call.output
    assert isinstance(message, ResponseOutputMessage) and call.output in r.output_text
    assert server.calls["echo"] == 1


def test_sdk_stream_parses_every_mcp_event(make_gateway: Any, tools_server: tuple[ToolsServer, str]) -> None:
    server, url = tools_server
    live = make_gateway(loopback_settings())
    stream = live.openai().responses.create(
        model=MODEL,
        input="hi",
        tools=[mcp_tool(url, allowed_tools=["echo"])],
        stream=True,
    )
    events = list(stream)
    untyped = [(type(ev).__name__, ev.type) for ev in events if not typed_exactly(ev)]
    assert untyped == []
    names = [ev.type for ev in events]
    for kind in (
        "response.mcp_list_tools.completed",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.completed",
    ):
        assert kind in names, names
    final = events[-1].response
    assert [type(o) for o in final.output][:1] == [McpListTools]
    assert sum(isinstance(o, McpCall) for o in final.output) == 1 and server.calls["echo"] == 1


def test_sdk_websocket_approval_round_trip_store_false(
    make_gateway: Any, tools_server: tuple[ToolsServer, str]
) -> None:
    """One socket, ``store=False``: turn 1 ends on an ``mcp_approval_request``; turn 2 answers it
    with ``previous_response_id`` (the connection's cache holds the parent) and gets the call and
    the model's answer."""
    server, url = tools_server
    live = make_gateway(loopback_settings())
    tools = [mcp_tool(url, allowed_tools=["echo"], require_approval="always")]
    finals: list[Response] = []
    with live.openai().responses.connect() as conn:
        inputs: list[Any] = [[{"role": "user", "content": "please echo"}]]
        for turn in range(2):
            extra = {"previous_response_id": finals[-1].id} if finals else {}
            conn.response.create(model=MODEL, input=inputs[turn], tools=tools, store=False, **extra)
            for ev in conn:
                assert ev.type != "error", ev
                assert typed_exactly(ev), (type(ev).__name__, ev.type)
                if ev.type in ("response.completed", "response.failed", "response.incomplete"):
                    finals.append(ev.response)
                    break
            if turn == 0:
                request = finals[0].output[-1]
                assert isinstance(request, McpApprovalRequest) and server.calls["echo"] == 0
                inputs.append([{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])
    first, second = finals
    assert first.to_dict()["store"] is False and second.to_dict()["store"] is False
    assert second.previous_response_id == first.id
    calls = [o for o in second.output if isinstance(o, McpCall)]
    assert len(calls) == 1 and calls[0].approval_request_id == request.id and calls[0].output
    assert isinstance(second.output[-1], ResponseOutputMessage) and second.status == "completed"
    assert server.calls["echo"] == 1


# ---------------------------------------------------------------------------------------------
# A published MCP server
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def time_server() -> Iterator[str]:
    if not published.available():
        pytest.fail("fastmcp / mcp-server-time are not installed: pip install the test extra")
    with published.running_time_server() as url:
        yield url


def test_sdk_reaches_the_published_time_server(make_gateway: Any, time_server: str) -> None:
    live = make_gateway(loopback_settings())
    r = live.openai().responses.create(
        model=MODEL,
        input="UTC",  # the default script passes the user's words as the tool's argument
        tools=[mcp_tool(time_server, server_label="time", allowed_tools=["get_current_time"])],
    )
    assert r.status == "completed"
    (listing,) = [o for o in r.output if isinstance(o, McpListTools)]
    assert [t.name for t in listing.tools] == ["get_current_time"] and listing.error is None
    (call,) = [o for o in r.output if isinstance(o, McpCall)]
    assert call.error is None and call.status == "completed" and call.output, call
    # the real server's answer: its JSON names the zone and an ISO datetime
    answer = json.loads(call.output)
    assert answer["timezone"] == json.loads(call.arguments)["timezone"]
    assert "T" in answer["datetime"] and answer["datetime"][:2] == "20"


# ---------------------------------------------------------------------------------------------
# The real CPU engine
# ---------------------------------------------------------------------------------------------


def test_a_forced_mcp_choice_binds_the_first_pass_only(
    make_gateway: Any, tools_server: tuple[ToolsServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated engine answers after a tool output whatever it is told, so the constraint each
    pass was sampled under is what the test reads."""
    server, url = tools_server
    live = make_gateway(loopback_settings())
    constraints: list[Any] = []
    real = live.engine.generate

    def recording(request_id: str, prompt_ids: Any, params: Any, *a: Any, **kw: Any) -> Any:
        constraints.append(params.structured)
        return real(request_id, prompt_ids, params, *a, **kw)

    monkeypatch.setattr(live.engine, "generate", recording)
    r = live.openai().responses.create(
        model=MODEL,
        input="hi",
        tools=[mcp_tool(url, allowed_tools=["echo"])],
        tool_choice={"type": "mcp", "server_label": "tools", "name": "echo"},
    )
    assert r.status == "completed" and server.calls["echo"] == 1 and len(constraints) == 2
    assert constraints[0] is not None  # the first pass must call echo
    assert constraints[1] is None  # the second may answer


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first CPU-engine test of a session loads vLLM
def test_cpu_engine_forced_mcp_call(
    vllm_gateway: LiveGateway, tools_server: tuple[ToolsServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's real engine, its gateway let reach this test's loopback server for this test
    only: the MCP side (built from settings at start) is swapped for one built from
    ``loopback_settings`` wherever the pipeline holds it, and put back after."""
    server, url = tools_server
    pipeline = vllm_gateway.gw.pipeline
    old = pipeline.hosted
    new = HostedTools(loopback_settings(models=[VLLM_MODEL]), old.metrics)
    for holder in [pipeline, *vars(pipeline).values()]:
        if getattr(holder, "hosted", None) is old:
            monkeypatch.setattr(holder, "hosted", new)
    r = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL,
        input="Add 2 and 3 with the tool.",
        tools=[mcp_tool(url, allowed_tools=["add"])],
        tool_choice={"type": "mcp", "server_label": "tools", "name": "add"},
        # the forced choice binds the first pass only; should the small model call again, that
        # call is refused and ends the response rather than spending the budget on repeats
        max_tool_calls=1,
        temperature=0,
        max_output_tokens=128,
    )
    calls = [o for o in r.output if isinstance(o, McpCall)]
    assert calls and calls[0].name == "add", [o.model_dump() for o in r.output]
    arguments = json.loads(calls[0].arguments)  # constrained decoding: valid JSON for the schema
    assert set(arguments) == {"a", "b"} and all(isinstance(v, int) for v in arguments.values())
    assert calls[0].status == "completed" and calls[0].error is None
    assert calls[0].output == str(arguments["a"] + arguments["b"])  # the server's answer
    assert server.calls["add"] == 1
    # the model generated on after the call's output (its text is the 135M model's: not asserted),
    # within the output budget
    assert r.output[-1] is not calls[0], [o.model_dump() for o in r.output]
    assert r.status == "completed" or r.incomplete_details.reason == "max_output_tokens", r.incomplete_details
