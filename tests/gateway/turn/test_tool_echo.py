"""The Response's echoed tools are built once per tool set and written as JSON built once
(``gateway.wire.response.EchoedTools``, ``gateway.turn.events.wire_event``).

What a client reads must not change: every frame that carries a Response carries exactly the tools
the plain serialization of that event would (WebSocket and SSE), a continuation that re-sends the
same tools reuses the first turn's echo, and tools that differ — even under a prelude digest that
collides — are echoed as sent.
"""

from __future__ import annotations

import json

import httpx
import orjson

from gateway.turn.events import wire_event
from gateway.wire.response import EchoedTools, echoed_tool
from tests.conftest import MODEL, LiveGateway
from tests.gateway.turn.test_custom_tool_grammar import codex_tools
from tests.ws_helpers import create, send, until_terminal, ws_open

RESPONSE_EVENTS = ("response.created", "response.in_progress", "response.completed")


def _tools_of(frames: list[dict]) -> list[list[dict]]:
    return [f["response"]["tools"] for f in frames if f["type"] in RESPONSE_EVENTS]


def test_wire_event_writes_the_same_json_as_the_event():
    tools = codex_tools()
    echo = EchoedTools(tools)
    response = {"id": "resp_1", "tools": echo.tools, "output": [], "status": "in_progress"}
    for ev in (
        {"type": "response.created", "sequence_number": 0, "response": response},
        {"type": "response.output_text.delta", "sequence_number": 3, "delta": "x"},
    ):
        assert orjson.dumps(wire_event(ev, echo.json)) == orjson.dumps(ev)
        assert wire_event(ev, None) is ev
    assert response["tools"] is echo.tools and echo.tools == [echoed_tool(t) for t in tools]
    assert echo.echoes(tuple(tools)) and not echo.echoes(tuple(tools[:-1]))


def test_ws_turns_echo_their_tools_and_reuse_the_echo(gateway: LiveGateway):
    tools = codex_tools()  # tool_choice none: the simulated model answers in text, the chain goes on
    echoes = gateway.gw.pipeline.tool_echoes
    with ws_open(gateway) as ws:
        send(ws, create(input="hi", tools=tools, tool_choice="none", store=False))
        first = until_terminal(ws)
        prev = first[-1]["response"]["id"]
        hits = echoes.hits
        send(ws, create(input="again", tools=tools, tool_choice="none", store=False, previous_response_id=prev))
        second = until_terminal(ws)
        assert echoes.hits == hits + 1  # the continuation took the first turn's echo
        changed = [dict(t, description="changed") if t["name"] == tools[0]["name"] else t for t in tools]
        send(
            ws,
            create(
                input="third",
                tools=changed,
                tool_choice="none",
                store=False,
                previous_response_id=second[-1]["response"]["id"],
            ),
        )
        third = until_terminal(ws)
    expected = [echoed_tool(t) for t in tools]
    for frames in (first, second):
        assert _tools_of(frames) == [expected] * 3
    assert _tools_of(third) == [[echoed_tool(t) for t in changed]] * 3


def test_an_echo_is_used_only_for_equal_tools_whatever_the_key(gateway: LiveGateway):
    """A cached echo found under a turn's key but built from other tools (a digest that would
    collide) is not used: the turn echoes its own tools."""
    tools = codex_tools()
    echoes = gateway.gw.pipeline.tool_echoes
    with ws_open(gateway) as ws:
        send(ws, create(input="hi", tools=tools, tool_choice="none", store=False))
        until_terminal(ws)
        stale = EchoedTools([{"type": "function", "name": "other", "parameters": {"type": "object"}}])
        for key in list(echoes._entries):
            echoes.put(key, stale, stale.nbytes)  # every key now names another tool set
        send(ws, create(input="again", tools=tools, tool_choice="none", store=False))
        frames = until_terminal(ws)
    assert _tools_of(frames) == [[echoed_tool(t) for t in tools]] * 3


def test_sse_frames_carry_the_echoed_tools(gateway: LiveGateway):
    tools = codex_tools()
    body = {"model": MODEL, "input": "hi", "tools": tools, "tool_choice": "none", "stream": True, "store": False}
    with httpx.stream(
        "POST", gateway.url + "/v1/responses", json=body, headers={"Authorization": "Bearer test-key"}, timeout=30
    ) as r:
        frames = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert _tools_of(frames) == [[echoed_tool(t) for t in tools]] * 3


def test_tools_that_are_equal_in_python_but_not_in_json_are_echoed_as_sent(gateway: LiveGateway):
    """``1``, ``1.0`` and ``true`` compare equal in Python; the echo is found by the prelude's
    digest, which is of the tools' JSON (every renderer's ``prelude_key`` hashes them verbatim), so
    each of these tool sets is echoed with its own values."""

    def tools(value):
        return [
            {
                "type": "function",
                "name": "f",
                "description": "d",
                "strict": False,
                "parameters": {"type": "object", "properties": {"n": {"type": "integer", "default": value}}},
            }
        ]

    with ws_open(gateway) as ws:
        seen = []
        for value in (1, True, 1.0):
            send(ws, create(input="hi", tools=tools(value), tool_choice="none", store=False))
            frames = until_terminal(ws)
            seen.append({json.dumps(t[0]["parameters"]["properties"]["n"]["default"]) for t in _tools_of(frames)})
    assert seen == [{"1"}, {"true"}, {"1.0"}]
