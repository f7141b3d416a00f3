"""``response.steer`` attacked from the outside: races, bounds, billing, token history, limits.

A reviewer's file (issue 31). The tests under "defects" each named a defect the first version had
(a revoked key steering on, a big steer validated on the event loop before its target was looked
up, a steer answered by an error frame, a successor past max_input_items, the age limit bypassed,
orphaned pending steers holding the budget, the budget in characters, a failed event the SDK's
types refuse, a warm-up's lane lost) and assert the behaviour that fixed it; the rest are attacks
the code withstood. Engines here are slow on purpose (a token every 10 ms) so a
steer sent after a few deltas always lands mid-generation; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from billing.usage import MemorySink
from gateway.base.settings import Settings
from inference.engine import SamplingParams, TokenDelta
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn
from tests.conftest import LiveGateway
from tests.gateway.access.test_security_access import issue, revoke, settings_for
from tests.gateway.tools.test_mcp_turns import loopback_settings, mcp_tool, tools_server  # noqa: F401 (fixture)
from tests.gateway.transport.test_ws_steer import (
    TERMINAL,
    WEATHER_TOOL,
    _failed,
    deltas,
    engine,
    read,
    steer_frame,
    terminal_of,
    text_of,
    until,
)
from tests.mcp_servers.tools_server import ToolsServer
from tests.turn_helpers import TokenScriptEngine, full_render_fallbacks, render_tokens
from tests.ws_helpers import create, send, ws_open

pytestmark = pytest.mark.timeout(60)


def _conn(live: LiveGateway) -> Any:
    """The gateway's one open WebSocket connection (its SteerBook is what the bounds are about)."""
    (conn,) = list(live.gw.connections)
    return conn


def _wait(pred: Any, what: str, limit: float = 20) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _client_tool_script(view: PromptView) -> Turn:
    """A tool output -> a short answer; STOP -> ok; anything else -> a slow client function call."""
    last = view.last
    said = last.text if last is not None else ""
    if last is not None and last.role == "tool":
        return Turn(text=f"after tool: {said}")
    if last is not None and last.role == "user" and "STOP" in said:
        return Turn(text=f"ok:{said}")
    if last is not None and last.role == "user" and "LONG" in said:
        return Turn(text="x", endless=True, delay_per_token_s=0.01)
    return Turn(tool_calls=(ToolCall("get_weather", {"city": "Paris " * 40}),), delay_per_token_s=0.01)


# -- defects ---------------------------------------------------------------------------------------


def test_a_revoked_key_starts_no_successor(make_gateway: Any, tmp_path: Path) -> None:
    settings = settings_for("file", tmp_path)
    key = issue(settings, "acme")
    issue(settings, "beta")  # not the last key: keys stay required
    live = make_gateway(settings, engine=engine())
    with ws_open(live, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=2000))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        revoke(settings, key)
        send(ws, steer_frame(rid))
        until(ws, terminal_of(rid))
        after = read(ws)
    # the key is revoked: no new response may start on it — the steer is handed back (or the
    # connection ends with the 401 a create gets), never a successor
    assert after["type"] != "response.created", after
    assert live.engine.stats.requests == 1


def test_a_successor_never_carries_more_input_items_than_a_create_may(make_gateway: Any) -> None:
    def script(view: PromptView) -> Turn:  # a token every 200 ms: the four frames land before the cut
        said = view.last.text if view.last is not None else ""
        return Turn(text="x", endless=True, delay_per_token_s=0.2) if said == "write forever" else Turn(text="ok")

    live = make_gateway(Settings(max_input_items=3), engine=engine(script))

    def burst(tag: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"{tag} {i}"} for i in range(3)]  # at the limit: a valid frame

    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=2000))
        rid = until(ws, deltas(1))[0]["response"]["id"]
        for tag in ("a", "b", "c", "d"):
            send(ws, steer_frame(rid, burst(tag)))
        until(ws, terminal_of(rid))
        more = until(ws, lambda e: e["type"] in (*TERMINAL, "error") or e["type"] == "response.steer.failed")
    prompts = live.engine.stats.prompts
    if len(prompts) > 1:  # a successor ran: it may carry no more than a create's input items
        steered_users = [m for m in PromptView(prompts[0]).messages() if m.role == "user"]
        successor_users = [m for m in PromptView(prompts[-1]).messages() if m.role == "user"]
        assert len(successor_users) - len(steered_users) <= 3, [m.text for m in successor_users]
    assert more


def test_orphaned_pending_steers_do_not_starve_the_connection(make_gateway: Any) -> None:
    limit = 64 * 1024
    live = make_gateway(Settings(max_request_bytes=limit), engine=engine(_client_tool_script))
    big = "STOP " + "y" * (limit // 2)
    with ws_open(live) as ws:
        send(ws, create(input="weather?", store=False, tools=[WEATHER_TOOL]))
        rid = until(ws, lambda e: e["type"] == "response.function_call_arguments.delta")[0]["response"]["id"]
        send(ws, steer_frame(rid, big))
        until(ws, lambda e: e["type"] == "response.steer.pending")
        # the client does not answer the call: it starts over on the same lane
        send(ws, create(input="LONG fresh start", store=False, max_output_tokens=2000))
        frames = until(ws, deltas(2))
        rid2 = next(e["response"]["id"] for e in frames if e["type"] == "response.created")
        send(ws, steer_frame(rid2, big))
        frames += until(ws, lambda e: e["type"] == "response.steer.accepted")
    # the lane went on without answering the call: the waiting steer is handed back (its id)
    # when the new create starts, and its bytes no longer count
    (orphan,) = [e for e in frames if e["type"] == "response.steer.failed"]
    _failed(orphan, "successor_creation_failed", rid, big)
    assert orphan["steer"]["id"].startswith("steer_")


def test_a_steer_on_a_finished_warm_up_is_already_completed(make_gateway: Any) -> None:
    """A warm-up is never steerable (it is over as it starts), but it is a response this
    connection ran: ``response_already_completed``, not ``not found``."""
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="prefix", store=False, generate=False))
        rid = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]["id"]
        send(ws, steer_frame(rid))
        ev = read(ws)
    _failed(ev, "response_already_completed", rid, "STOP and sum up")


def test_a_failed_steer_without_a_target_still_parses_as_the_sdk_declares(make_gateway: Any) -> None:
    from openai.types.responses.response_steer_failed_event import ResponseSteerFailedEvent

    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, {"type": "response.steer", "input": "STOP"})
        ev = json.loads(ws.recv(timeout=20))
    assert ev["type"] == "response.steer.failed" and ev["error"]["code"] == "invalid_input"
    ResponseSteerFailedEvent.model_validate(ev)  # strict: the SDK's declared types


def test_a_steer_with_too_many_items_is_a_failed_steer_not_an_error(make_gateway: Any) -> None:
    live = make_gateway(Settings(max_input_items=3), engine=engine())
    steer_input = [{"role": "user", "content": f"point {i}"} for i in range(4)]
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=60))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid, steer_input))
        frames = until(ws, lambda e: e["type"] in (*TERMINAL, "error") or e["type"].startswith("response.steer."))
    assert frames[-1]["type"] == "response.steer.failed", frames[-1]
    assert frames[-1]["steer"]["input"] == steer_input


def test_the_steer_budget_is_in_bytes(make_gateway: Any) -> None:
    def slow(view: PromptView) -> Turn:  # a token every 200 ms: the frames land before the cut
        said = view.last.text if view.last is not None else ""
        return Turn(text="ok") if "\N{GRINNING FACE}" in said else Turn(text="x", endless=True, delay_per_token_s=0.2)

    limit = 64 * 1024
    live = make_gateway(Settings(max_request_bytes=limit), engine=engine(slow))
    wide = "\N{GRINNING FACE}" * 15_000  # 60,000 bytes: a frame under the limit
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=16))
        rid = until(ws, deltas(1))[0]["response"]["id"]
        for _ in range(4):  # as UTF-8 text (json.dumps would escape each to twelve ASCII bytes)
            ws.send(json.dumps(steer_frame(rid, wide), ensure_ascii=False))
        steer_events: list[dict[str, Any]] = []
        while len(steer_events) < 4:
            ev = read(ws)
            if ev["type"].startswith("response.steer."):
                steer_events.append(ev)
    n = len([e for e in steer_events if e["type"] == "response.steer.accepted"])
    size = len(wide.encode())
    assert n * size <= limit, f"{n} steers of {size} bytes queued on a {limit}-byte budget"


def test_a_big_steer_is_validated_off_the_event_loop(make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.transport.ws as ws_module

    real = ws_module.steer_items
    on_loop: list[bool] = []

    def spy(frame: dict[str, Any]) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real(frame)

    monkeypatch.setattr(ws_module, "steer_items", spy)
    live = make_gateway(engine=engine())
    many = [{"role": "user", "content": [{"type": "input_text", "text": "x" * 10}] * 5} for _ in range(200)]
    many[-1] = {"role": "user", "content": "STOP"}
    with ws_open(live, max_size=None) as ws:
        send(ws, steer_frame("resp_nobody", many))  # ~56 kB, above inline_prepare_bytes
        ev = read(ws)
        # an unknown target: refused on a lookup, its input never walked
        assert ev["type"] == "response.steer.failed" and ev["error"]["code"] == "response_not_found"
        assert on_loop == []
        send(ws, create(input="LONG go", store=False, max_output_tokens=2000))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid, many))
        frames = until(ws, lambda e: e["type"].startswith("response.steer."))
    assert frames[-1]["type"] == "response.steer.accepted", frames[-1]
    assert on_loop == [False]  # validated in the prepare pool, as a create of that size is


def test_a_failed_steer_on_a_named_lanes_warm_up_carries_its_stream_id(make_gateway: Any) -> None:
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="prefix", store=False, generate=False, stream_id="a"))
        rid = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]["id"]
        send(ws, steer_frame(rid))
        ev = read(ws)
    _failed(ev, "response_already_completed", rid, "STOP and sum up")
    assert ev.get("stream_id") == "a", ev


def test_no_successor_starts_past_the_age_limit(make_gateway: Any) -> None:
    live = make_gateway(Settings(ws_max_age_s=1.0, ws_close_idle_at_limit=False), engine=engine())
    with ws_open(live) as ws:
        opened = time.monotonic()
        send(ws, create(input="write forever", store=False, max_output_tokens=3000))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        until(ws, lambda e: time.monotonic() - opened > 1.5)  # read on until the connection is past its age
        send(ws, steer_frame(rid))
        until(ws, terminal_of(rid))
        after = read(ws)
    # a create now would get websocket_connection_limit_reached; the successor is a create too
    assert after["type"] != "response.created", after
    assert live.engine.stats.requests == 1


# -- attacks that held -----------------------------------------------------------------------------


def test_a_steer_flood_is_bounded_and_the_book_empties(make_gateway: Any) -> None:
    """Hundreds of steers on unknown ids and on one active response: one answer each, at most
    ``ws_max_pending_steers`` accepted, and the book holds nothing once the chain ended."""
    live = make_gateway(Settings(ws_max_pending_steers=4), engine=engine())
    with ws_open(live) as ws:
        for i in range(300):
            send(ws, steer_frame(f"resp_unknown{i}", "x"))
        answers = [read(ws) for _ in range(300)]
        assert {a["error"]["code"] for a in answers} == {"response_not_found"}
        send(ws, create(input="write forever", store=False, max_output_tokens=400))
        rid = until(ws, deltas(1))[0]["response"]["id"]
        for _ in range(40):
            send(ws, steer_frame(rid, "more"))
        send(ws, steer_frame(rid, "STOP"))
        frames = until(ws, terminal_of(rid))
        frames += until(ws, lambda e: e["type"] in TERMINAL)
        steer_events = [e for e in frames if e["type"].startswith("response.steer.")]
        while len(steer_events) < 41:  # steers answered after the cut: already completed
            steer_events.append(read(ws))
        book = _conn(live).steers
        assert book.queued == 0 and book.nbytes == 0 and not book._active and not book._waiting
    accepted = [e for e in steer_events if e["type"] == "response.steer.accepted"]
    assert len(accepted) <= 4 and len(steer_events) == 41
    assert live.engine.stats.requests == 2  # one successor, whatever the flood


def test_a_steer_cannot_reach_another_connections_response(make_gateway: Any) -> None:
    live = make_gateway(engine=engine())
    with ws_open(live) as a, ws_open(live) as b:
        send(a, create(input="write forever", store=False, max_output_tokens=60))
        rid = until(a, deltas(2))[0]["response"]["id"]
        send(b, steer_frame(rid))
        _failed(read(b), "response_not_found", rid, "STOP and sum up")
        frames = until(a, terminal_of(rid))
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert not any(e["type"].startswith("response.steer.") for e in frames)


def test_steering_the_successor_chains_appends_and_bills_each_token_once(make_gateway: Any) -> None:
    """Steer, then steer the successor (still generating), then continue from the last: three
    appends, no full render, and the billed output tokens are exactly what the engine sampled."""

    def script(view: PromptView) -> Turn:
        said = view.last.text if view.last is not None else ""
        if "STOP" in said:
            return Turn(text=f"ok:{said}")
        return Turn(text="x", endless=True, delay_per_token_s=0.01)

    sink = MemorySink()
    live = make_gateway(engine=engine(script), usage_sink=sink)
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=3000))
        first = until(ws, deltas(3))[0]["response"]["id"]
        send(ws, steer_frame(first, "keep going"))
        until(ws, terminal_of(first))
        second = until(ws, lambda e: e["type"] == "response.created")[-1]["response"]
        assert second["previous_response_id"] == first
        until(ws, deltas(3))
        send(ws, steer_frame(second["id"], "STOP now"))
        until(ws, terminal_of(second["id"]))
        third = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]
        assert third["previous_response_id"] == second["id"] and text_of(third) == "ok:STOP now"
        send(ws, create(input="STOP after", store=False, previous_response_id=third["id"]))
        assert until(ws, lambda e: e["type"] in TERMINAL)[-1]["type"] == "response.completed"
    prompts = live.engine.stats.prompts
    assert len(prompts) == 4 and all(b[: len(a)] == a for a, b in zip(prompts, prompts[1:], strict=False))
    assert full_render_fallbacks(live) == 0
    _wait(lambda: len(sink.records) == 4, "four records")
    assert sum(r.output_tokens for r in sink.records.values()) == live.engine.stats.generated_tokens


def test_the_socket_closing_mid_successor_bills_both_exactly(make_gateway: Any) -> None:
    sink = MemorySink()
    live = make_gateway(engine=engine(lambda v: Turn(text="x", endless=True, delay_per_token_s=0.01)), usage_sink=sink)
    ws = ws_open(live)
    send(ws, create(input="write forever", store=False, max_output_tokens=3000))
    rid = until(ws, deltas(3))[0]["response"]["id"]
    send(ws, steer_frame(rid, "go on"))
    until(ws, terminal_of(rid))
    successor = until(ws, deltas(3))[0]["response"]["id"]
    ws.close()
    _wait(lambda: len(sink.records) == 2, "both billed")
    assert sink.records[rid].status == "incomplete" and sink.records[successor].status == "cancelled"
    assert sum(r.output_tokens for r in sink.records.values()) == live.engine.stats.generated_tokens
    _wait(lambda: live.engine.stats.running == 0, "the successor's engine request aborted")


def test_two_lanes_steered_at_once(make_gateway: Any) -> None:
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", stream_id="a", store=False, max_output_tokens=3000))
        send(ws, create(input="write forever", stream_id="b", store=False, max_output_tokens=3000))
        seen: dict[str, str] = {}
        while len(seen) < 2:
            ev = read(ws)
            if ev["type"] == "response.created":
                seen[ev["stream_id"]] = ev["response"]["id"]
        send(ws, steer_frame(seen["a"], "STOP a"))
        send(ws, steer_frame(seen["b"], "STOP b"))
        done: dict[str, dict[str, Any]] = {}
        steer_lanes = []
        while len(done) < 2:
            ev = read(ws)
            if ev["type"].startswith("response.steer."):
                steer_lanes.append((ev["type"], ev.get("stream_id")))
            if ev["type"] == "response.completed":
                done[ev["stream_id"]] = ev["response"]
    assert sorted(steer_lanes) == [("response.steer.accepted", "a"), ("response.steer.accepted", "b")]
    assert text_of(done["a"]) == "ok:STOP a" and text_of(done["b"]) == "ok:STOP b"
    assert done["a"]["previous_response_id"] == seen["a"] and done["b"]["previous_response_id"] == seen["b"]
    assert full_render_fallbacks(live) == 0


def test_forking_from_the_steered_response_with_store(make_gateway: Any) -> None:
    """store=true: after the successor, a create continuing the *steered* response (a fork) sees its
    cut output and not the steer; it is an append of the stored history."""
    live = make_gateway(engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=True, max_output_tokens=3000))
        rid = until(ws, deltas(3))[0]["response"]["id"]
        send(ws, steer_frame(rid, "STOP steer"))
        until(ws, terminal_of(rid))
        until(ws, lambda e: e["type"] in TERMINAL)
        fallbacks = full_render_fallbacks(live)
        send(ws, create(input="STOP fork", store=True, previous_response_id=rid))
        fork = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]
    assert fork["status"] == "completed" and text_of(fork) == "ok:STOP fork"
    steered_prompt, _, fork_prompt = live.engine.stats.prompts
    assert fork_prompt[: len(steered_prompt)] == steered_prompt
    users = [m.text for m in PromptView(fork_prompt).messages() if m.role == "user"]
    assert users == ["write forever", "STOP fork"]  # the steer belongs to the other branch
    assert full_render_fallbacks(live) == fallbacks


def test_a_pending_steer_then_the_clients_create_bills_and_claims_once(make_gateway: Any) -> None:
    """The pending path: the client's create claims the steer once; a second create continuing the
    same response (a fork) carries no steer."""
    live = make_gateway(engine=engine(_client_tool_script))
    with ws_open(live) as ws:
        send(ws, create(input="weather?", store=True, tools=[WEATHER_TOOL]))
        rid = until(ws, lambda e: e["type"] == "response.function_call_arguments.delta")[0]["response"]["id"]
        send(ws, steer_frame(rid, "in Celsius"))
        rest = until(ws, lambda e: e["type"] == "response.steer.pending")
        call = next(
            it
            for e in rest
            if e["type"] == "response.completed"
            for it in e["response"]["output"]
            if it["type"] == "function_call"
        )
        output = [{"type": "function_call_output", "call_id": call["call_id"], "output": "18"}]
        for _ in range(2):
            send(ws, create(previous_response_id=rid, store=True, tools=[WEATHER_TOOL], input=output))
            assert until(ws, lambda e: e["type"] in TERMINAL)[-1]["type"] == "response.completed"
    first, second = (PromptView(p) for p in live.engine.stats.prompts[1:])
    assert [m.text for m in first.messages() if m.role == "user"][-1] == "in Celsius"
    assert [m.text for m in second.messages() if m.role == "user"] == ["weather?"]
    assert _conn_steer_metric(live, "committed") == 1


def test_a_rate_limited_successor_hands_the_steer_back(make_gateway: Any, tmp_path: Path) -> None:
    """rpm=1: the create used the minute's request; the successor is a request too, refused, and
    the steer is handed back (the steered response stays a parent)."""
    settings = settings_for("file", tmp_path)
    key = issue(settings, "acme", rpm=1)
    live = make_gateway(settings, engine=engine())
    with ws_open(live, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=2000))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid))
        frames = until(ws, terminal_of(rid))
        failed = read(ws)
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "steered"}
    _failed(failed, "successor_creation_failed", rid, "STOP and sum up")
    assert live.engine.stats.requests == 1


def test_a_harmony_reasoning_cut_is_an_append(make_gateway: Any) -> None:
    """Steered mid-reasoning: the reasoning item ends incomplete and the successor appends the
    steer after the cut analysis message."""

    def script(view: PromptView) -> Turn:
        said = view.last.text if view.last is not None else ""
        if "STOP" in said:
            return Turn(text=f"ok:{said}")
        return Turn(reasoning="thinking " * 400, text="never", delay_per_token_s=0.01)

    live = make_gateway(engine=engine(script))
    with ws_open(live) as ws:
        send(ws, create(input="think", store=False, max_output_tokens=3000))
        head = until(ws, lambda e: e["type"] == "response.reasoning_text.delta")
        rid = head[0]["response"]["id"]
        until(ws, lambda e: e["type"] == "response.reasoning_text.delta")
        send(ws, steer_frame(rid, "STOP thinking"))
        steered = until(ws, terminal_of(rid))[-1]["response"]
        after = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]
    assert steered["incomplete_details"] == {"reason": "steered"}
    assert steered["output"][-1]["type"] == "reasoning"
    assert text_of(after) == "ok:STOP thinking"
    first, second = live.engine.stats.prompts
    assert second[: len(first)] == first
    assert full_render_fallbacks(live) == 0


def test_a_drain_mid_successor_lets_it_finish_and_bills_both(make_gateway: Any) -> None:
    """Shutdown begins while the successor generates: it is in-flight work like any response — it
    reaches its terminal, then the farewell (1001); both responses billed, each token once."""
    from tests.gateway.ops.test_shutdown import _read_until_closed, _start_stop

    def script(view: PromptView) -> Turn:
        said = view.last.text if view.last is not None else ""
        if "STOP" in said:
            return Turn(text="done " * 30, delay_per_token_s=0.01)
        return Turn(text="x", endless=True, delay_per_token_s=0.01)

    sink = MemorySink()
    live = make_gateway(Settings(shutdown_grace_s=20), engine=engine(script), usage_sink=sink)
    ws = ws_open(live)
    send(ws, create(input="write forever", store=False, max_output_tokens=2000))
    rid = until(ws, deltas(2))[0]["response"]["id"]
    send(ws, steer_frame(rid, "STOP and finish"))
    until(ws, terminal_of(rid))
    successor = until(ws, deltas(2))[0]["response"]["id"]
    stopper = _start_stop(live)
    frames, code = _read_until_closed(ws)
    stopper.join(30)
    terminals = [f for f in frames if f["type"] in TERMINAL]
    assert [t["response"]["id"] for t in terminals] == [successor] and terminals[0]["type"] == "response.completed"
    assert frames[-1]["type"] == "error" and code == 1001
    assert set(sink.records) == {rid, successor}
    assert sum(r.output_tokens for r in sink.records.values()) == live.engine.stats.generated_tokens


def test_a_steered_chain_resumes_on_a_new_socket_from_the_successor(make_gateway: Any) -> None:
    """ws_resume_window_s: the chain's latest response is the successor; a new socket continues
    from it with no full render, and the model sees the steer in the history."""
    live = make_gateway(Settings(ws_resume_window_s=60), engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=3000))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid, "STOP first"))
        until(ws, terminal_of(rid))
        successor = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]["id"]
    fallbacks = full_render_fallbacks(live)
    with ws_open(live) as ws:
        send(ws, create(input="STOP again", store=False, previous_response_id=successor))
        after = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]
    assert after["status"] == "completed" and text_of(after) == "ok:STOP again"
    users = [m.text for m in PromptView(live.engine.stats.prompts[-1]).messages() if m.role == "user"]
    assert users == ["write forever", "STOP first", "STOP again"]
    assert full_render_fallbacks(live) == fallbacks


def test_a_steer_before_the_first_token_cuts_inside_the_header(make_gateway: Any) -> None:
    """Steered right at response.created (a token every 200 ms: the cut lands in the assistant
    header): the steered response has no output and no trace in the history; the successor is
    still an append."""

    def script(view: PromptView) -> Turn:
        said = view.last.text if view.last is not None else ""
        if "STOP" in said:
            return Turn(text=f"ok:{said}")
        return Turn(text="x", endless=True, delay_per_token_s=0.2)

    live = make_gateway(engine=engine(script))
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=3000))
        rid = until(ws, lambda e: e["type"] == "response.created")[0]["response"]["id"]
        send(ws, steer_frame(rid, "STOP early"))
        steered = until(ws, terminal_of(rid))[-1]["response"]
        after = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]
    assert steered["incomplete_details"] == {"reason": "steered"}
    assert text_of(after) == "ok:STOP early"
    assert steered["output"] == [] and steered["usage"]["output_tokens"] > 0  # header tokens: billed
    from inference.harmony import HarmonyRenderer

    r = HarmonyRenderer()
    gen = r.generation_prompt()
    first, second = live.engine.stats.prompts
    steer = r.render_items([{"type": "message", "role": "user", "content": "STOP early"}])
    assert second == first[: len(first) - len(gen)] + steer + gen  # the history ends before the header
    assert full_render_fallbacks(live) == 0


def test_a_steer_on_an_approval_request_waits_and_the_approval_claims_it(
    make_gateway: Any,
    tools_server: tuple[ToolsServer, str],
) -> None:
    """A hosted MCP call that needs approval: the steer is pending with an mcp_approval_response
    stub; the client's approval create claims it (the steer before the approval, as OpenAI
    prepends), the approved call runs once, and the turn appends to the parent's history."""
    server, url = tools_server

    def script(view: PromptView) -> Turn:
        last = view.last
        if last is not None and last.role == "tool":
            return Turn(text=f"tool said {last.text}")
        return Turn(tool_calls=(ToolCall("echo", {"text": "hi " * 40}, "tools"),), delay_per_token_s=0.01)

    live = make_gateway(loopback_settings(), engine=engine(script))
    tools = [mcp_tool(url, allowed_tools=["echo"], require_approval="always")]
    with ws_open(live) as ws:
        send(ws, create(input="please echo", store=False, tools=tools))
        head = until(ws, lambda e: e["type"] == "response.output_item.added" and e["item"]["type"] != "mcp_list_tools")
        rid = head[0]["response"]["id"]
        send(ws, steer_frame(rid, "also shout"))  # the call has begun: the steer waits for the pass
        rest = until(ws, lambda e: e["type"] == "response.steer.pending" or e["type"] == "response.created")
        assert rest[-1]["type"] == "response.steer.pending"
        (request,) = [
            it
            for e in rest
            if e["type"] == "response.completed"
            for it in e["response"]["output"]
            if it["type"] == "mcp_approval_request"
        ]
        assert rest[-1]["required_input"] == [{"type": "mcp_approval_response", "approval_request_id": request["id"]}]
        answer = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
        send(ws, create(input=[answer], tools=tools, store=False, previous_response_id=rid))
        after = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]
    assert after["status"] == "completed" and server.calls["echo"] == 1
    first, second = live.engine.stats.prompts
    assert second[: len(first)] == first and full_render_fallbacks(live) == 0
    tail = [m.role for m in PromptView(second).messages()][-3:]
    assert tail == ["assistant", "user", "tool"]  # the call, the steer, the call's output


def test_a_steer_during_a_gateway_tool_call_bills_every_token_once(
    make_gateway: Any,
    tools_server: tuple[ToolsServer, str],
) -> None:
    server, url = tools_server

    def script(view: PromptView) -> Turn:
        last = view.last
        if last is not None and "STOP" in last.text:
            return Turn(text=f"ok:{last.text}")
        if last is not None and last.role == "tool":
            return Turn(text="x", endless=True, delay_per_token_s=0.01)
        return Turn(reasoning="let me call it", tool_calls=(ToolCall("slow", {"seconds": 0.5}, "tools"),))

    sink = MemorySink()
    live = make_gateway(loopback_settings(), engine=engine(script), usage_sink=sink)
    with ws_open(live) as ws:
        send(ws, create(input="call the tool", store=False, tools=[mcp_tool(url, allowed_tools=["slow"])]))
        rid = until(ws, lambda ev: ev["type"] == "response.mcp_call.in_progress")[0]["response"]["id"]
        send(ws, steer_frame(rid))
        until(ws, terminal_of(rid))
        after = until(ws, lambda ev: ev["type"] in TERMINAL)[-1]["response"]
    assert text_of(after) == "ok:STOP and sum up"
    _wait(lambda: len(sink.records) == 2, "both billed")
    assert sum(r.output_tokens for r in sink.records.values()) == live.engine.stats.generated_tokens
    assert sink.records[rid].input_tokens == len(live.engine.stats.prompts[0])


def test_a_steer_landing_during_the_store_write_lets_the_response_complete_then_succeeds_it(
    make_gateway: Any,
) -> None:
    """The race at the end: the steer lands while a store=true response is being written (its
    generation over, its terminal not yet out). OpenAI's 'or lets it complete': the response
    completes, then the successor continues from it — an append, each token billed once."""
    sink = MemorySink()
    live = make_gateway(engine=engine(), usage_sink=sink)
    finalizer = live.gw.pipeline.finalizer
    real_write = finalizer.write
    held = [0]

    async def write(turn: Any, outcome: Any) -> Any:
        if held[0] == 0:  # the first response's write waits for the steer to be queued
            held[0] += 1
            for _ in range(1000):
                if any(c.steers.queued for c in live.gw.connections):
                    break
                await asyncio.sleep(0.005)
        return await real_write(turn, outcome)

    finalizer.write = write  # type: ignore[method-assign]
    with ws_open(live) as ws:
        send(ws, create(input="STOP now", store=True))
        # the answer is whole (its done events precede the store write): the steer lands in the write
        rid = until(ws, lambda e: e["type"] == "response.output_item.done")[0]["response"]["id"]
        send(ws, steer_frame(rid, "STOP and more"))
        frames = until(ws, terminal_of(rid))
        after = until(ws, lambda e: e["type"] in TERMINAL)
    assert frames[-1]["type"] == "response.completed" and text_of(frames[-1]["response"]) == "ok:STOP now"
    assert [e["type"] for e in frames if e["type"].startswith("response.steer.")] == ["response.steer.accepted"]
    assert after[0]["type"] == "response.created" and after[0]["response"]["previous_response_id"] == rid
    assert text_of(after[-1]["response"]) == "ok:STOP and more"
    first, second = live.engine.stats.prompts
    assert second[: len(first)] == first and full_render_fallbacks(live) == 0
    _wait(lambda: len(sink.records) == 2, "both billed")
    assert sum(r.output_tokens for r in sink.records.values()) == live.engine.stats.generated_tokens


def _conn_steer_metric(live: LiveGateway, outcome: str) -> float:
    return live.metric("respgate_ws_steers_total", {"outcome": outcome})


# -- a chat-template model -------------------------------------------------------------------------


class _SlowChatEngine(TokenScriptEngine):
    """A chat-template model that writes a long answer slowly (steerable: it stops where the
    stream is closed), and anything after a steer quickly."""

    name = "slow-chat-fake"
    steerable = True

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams, routing: object = None
    ) -> AsyncIterator[TokenDelta]:
        slow = len(self.stats.prompts) == 0
        async for delta in super().generate(request_id, prompt_ids, params, routing):
            if slow:
                await asyncio.sleep(0.01)
            yield delta


@pytest.fixture(scope="module")
def smollm2() -> Any:
    from inference.chat_template_render import ChatTemplateRenderer
    from inference.model_assets import prepare_model

    return ChatTemplateRenderer(prepare_model("smollm2"))


def _any_deltas(n: int) -> Any:
    seen = [0]

    def pred(ev: dict[str, Any]) -> bool:
        seen[0] += ev["type"].endswith(".delta")
        return seen[0] >= n

    return pred


@pytest.mark.parametrize("cut_in", ["message", "reasoning"])
def test_a_chat_template_model_is_steered_by_an_append(make_gateway: Any, smollm2: Any, cut_in: str) -> None:
    """The successor's prompt is the steered prompt, what was sampled, the closing of the cut
    message (an answer, or reasoning in ``<think>``), the steer's user message and the generation
    prompt — rendered: the steer only."""
    from inference.registry import ModelRegistry, ModelRoute

    ct = smollm2
    text = "Let me explain at length. " * 60
    if cut_in == "reasoning":
        text = f"<think>\n{text}\n</think>\n\nOk."
    long = ct._encode(text) + [ct.profile.end_token]
    engine_ = _SlowChatEngine([long, ct._encode("Done.") + [ct.profile.end_token]])
    registry = ModelRegistry([ModelRoute(name="ct", engine=engine_, renderer=ct, max_context=8192)])  # type: ignore[arg-type]
    live = make_gateway(Settings(models=["ct"]), engine=SimulatedEngine(), registry=registry)
    with ws_open(live) as ws:
        send(ws, create(model="ct", input="Explain.", store=False, max_output_tokens=1000))
        head = until(ws, _any_deltas(5))
        rid = head[0]["response"]["id"]
        appended = render_tokens(live)[0]
        send(ws, steer_frame(rid, "Be brief."))
        steered = until(ws, terminal_of(rid))[-1]["response"]
        after = until(ws, lambda e: e["type"] in TERMINAL)[-1]["response"]
    assert steered["incomplete_details"] == {"reason": "steered"}
    assert steered["output"][-1]["type"] == cut_in and steered["output"][-1]["status"] == "incomplete"
    assert after["status"] == "completed" and text_of(after) == "Done."
    first, second = engine_.stats.prompts
    sampled = steered["usage"]["output_tokens"]
    assert second[: len(first)] == first and second[len(first) : len(first) + sampled] == long[:sampled]
    steer_ids = ct.render_items([{"type": "message", "role": "user", "content": "Be brief."}])
    closing = [ct.profile.end_token, *ct.profile.post_tokens]
    assert second[len(first) + sampled :] == closing + steer_ids + ct.generation_prompt()
    assert render_tokens(live)[0] - appended == len(steer_ids)
    assert full_render_fallbacks(live) == 0


# -- the lane machine -------------------------------------------------------------------------------


def test_a_steered_chain_keeps_its_create_slot_and_the_lane_order(make_gateway: Any) -> None:
    """ws_max_inflight=1: a create queued behind a steered response runs after its successor, never
    beside it; the successor takes no second slot."""
    live = make_gateway(Settings(ws_max_inflight=1), engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=3000))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, create(input="STOP queued", stream_id="other", store=False))
        send(ws, steer_frame(rid, "STOP steer"))
        frames = until(ws, lambda e: e["type"] == "response.completed" and e.get("stream_id") == "other")
    order = [(e["type"], e.get("stream_id")) for e in frames if e["type"] in ("response.created", *TERMINAL)]
    assert order == [
        ("response.incomplete", None),
        ("response.created", None),
        ("response.completed", None),
        ("response.created", "other"),
        ("response.completed", "other"),
    ]


def test_the_idle_watchdog_does_not_close_a_steered_chain(make_gateway: Any) -> None:
    live = make_gateway(Settings(ws_idle_timeout_s=0.3), engine=engine())
    with ws_open(live) as ws:
        send(ws, create(input="write forever", store=False, max_output_tokens=80))
        rid = until(ws, deltas(2))[0]["response"]["id"]
        send(ws, steer_frame(rid, "go on, longer"))
        until(ws, terminal_of(rid))
        after = until(ws, lambda e: e["type"] in (*TERMINAL, "error"))
        assert after[-1]["type"] == "response.incomplete"  # the successor's own cap, not an idle close
        with pytest.raises(ConnectionClosed):  # then idle: closed
            while True:
                ws.recv(timeout=20)
