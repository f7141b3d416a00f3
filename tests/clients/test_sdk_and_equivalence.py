"""The official SDK's WebSocket mode, SSE/WS event equivalence, and the O(new input) guarantee.

(a) ``client.responses.connect()`` runs real-clients.md §2's three-turn function-tool loop, chained
    by ``previous_response_id`` with only the new items and ``store=false``.
(b) The same request over SSE and over WebSocket yields the same event payloads once generated ids
    and timestamps are normalized.
(c) A 64-turn chained WebSocket conversation renders only each turn's new items: the ``append``
    render counter grows by exactly their token count, nothing is re-rendered in full after turn 1,
    and each engine prompt extends the previous one by the sampled tokens plus the new items.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from inference.harmony import HarmonyRenderer
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn, turn_tokens, turns_in_order
from tests.conftest import MODEL
from tests.http_helpers import TERMINAL_EVENTS, stream

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def ws_turn(conn) -> list[Any]:
    """Events of one response on an SDK connection, up to and including the terminal event."""
    events = []
    for ev in conn:
        if ev.type == "error":
            raise AssertionError(f"error frame: {ev}")
        events.append(ev)
        if ev.type in TERMINAL_EVENTS:
            return events
    raise AssertionError("socket closed before a terminal event")


def ws_turn_raw(conn) -> list[dict[str, Any]]:
    """Like :func:`ws_turn` but returns the raw JSON payloads of the frames."""
    events = []
    while True:
        ev = json.loads(conn.recv_bytes())
        assert ev.get("type") != "error", ev
        events.append(ev)
        if ev["type"] in TERMINAL_EVENTS:
            return events


# ---------------------------------------------------------------------------------------------
# (a) SDK WebSocket tool loop
# ---------------------------------------------------------------------------------------------


def test_sdk_websocket_three_turn_tool_loop_store_false(make_gateway):
    engine = SimulatedEngine(
        record_prompts=True,
        script=turns_in_order(
            [
                Turn(reasoning="I need the weather tool.", tool_calls=(ToolCall("get_weather", {"city": "Paris"}),)),
                Turn(text="It is 21C in Paris."),
                Turn(text="You're welcome."),
            ]
        ),
    )
    live = make_gateway(engine=engine)
    client = live.openai()
    responses = []
    with client.responses.connect() as conn:
        prev, new_input = None, [{"role": "user", "content": "Weather in Paris?"}]
        for _ in range(3):
            conn.response.create(
                model=MODEL,
                input=new_input,
                tools=TOOLS,
                store=False,
                **({"previous_response_id": prev.id} if prev else {}),
            )
            events = ws_turn(conn)
            assert events[0].type == "response.created"
            assert events[-1].type == "response.completed"
            prev = events[-1].response
            responses.append(prev)
            calls = [o for o in prev.output if o.type == "function_call"]
            new_input = [{"type": "function_call_output", "call_id": c.call_id, "output": "21C"} for c in calls] or [
                {"role": "user", "content": "thanks"}
            ]
    r1, r2, r3 = responses
    # turn 1: reasoning then exactly one call, status completed
    assert [o.type for o in r1.output] == ["reasoning", "function_call"]
    call = r1.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and r1.status == "completed"
    # turn 2 answers from the tool output; turn 3 answers the thanks
    assert [o.type for o in r2.output] == ["message"] and r2.output_text == "It is 21C in Paris."
    assert [o.type for o in r3.output] == ["message"] and r3.output_text == "You're welcome."
    assert (r2.previous_response_id, r3.previous_response_id) == (r1.id, r2.id)
    assert all(r.store is False for r in responses)
    # what the model saw: the whole conversation, though each frame carried only the new items
    seen = [(m.role, m.text) for m in PromptView(engine.stats.prompts[2]).messages() if m.role != "system"]
    assert seen[-6:] == [
        ("user", "Weather in Paris?"),
        ("assistant", "I need the weather tool."),
        ("assistant", '{"city":"Paris"}'),
        ("tool", "21C"),
        ("assistant", "It is 21C in Paris."),
        ("user", "thanks"),
    ]
    # store=false: nothing was persisted; the chain lived in the connection cache
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r1.id)


# ---------------------------------------------------------------------------------------------
# (b) SSE == WebSocket
# ---------------------------------------------------------------------------------------------

_ID = re.compile(r"\b(resp|msg|rs|fc|call|ctc)_[0-9a-f]{8,}\b")


def normalize(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Generated ids -> ``<kind#n>`` by first appearance; timestamps -> 0."""
    mapping: dict[str, str] = {}

    def sub(m: re.Match) -> str:
        return mapping.setdefault(m.group(0), f"<{m.group(1)}#{len(mapping)}>")

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: (0 if k in ("created_at", "completed_at") and v[k] is not None else walk(x)) for k, x in v.items()
            }
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            return _ID.sub(sub, v)
        return v

    return [walk(e) for e in events]


def check_numbering(events: list[dict[str, Any]]) -> None:
    assert events[0]["type"] == "response.created"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == list(range(len(added))) and added


def test_sse_and_websocket_yield_equal_events(make_gateway):
    turn_text = Turn(reasoning="Compare both transports.", text="Same bytes either way.")
    turn_call = Turn(
        reasoning="Look it up.",
        commentary="Checking the weather.",
        tool_calls=(ToolCall("get_weather", {"city": "Bern"}),),
    )
    # no prefix cache: the second run of a request must not report different cached_tokens
    engine = SimulatedEngine(
        prefix_cache=False, script=lambda v: turn_call if v.tools and v.last.role == "user" else turn_text
    )
    live = make_gateway(engine=engine)
    bodies = [
        {"model": MODEL, "input": "Tell me something.", "instructions": "Be brief.", "metadata": {"a": "b"}},
        {
            "model": MODEL,
            "input": "Weather in Bern?",
            "tools": TOOLS,
            "reasoning": {"summary": "auto"},
            "temperature": 0.5,
        },
    ]
    for body in bodies:
        _, _, sse_events = stream(live, **body)
        with live.openai().responses.connect() as conn:
            conn.response.create(**body)
            ws_events = ws_turn_raw(conn)
        check_numbering(sse_events)
        check_numbering(ws_events)
        assert len(sse_events) > 8
        a, b = normalize(sse_events), normalize(ws_events)
        assert [e["type"] for e in a] == [e["type"] for e in b]
        assert a == b
        assert a[-1]["type"] == "response.completed"


# ---------------------------------------------------------------------------------------------
# (c) O(new input) over 64 chained turns
# ---------------------------------------------------------------------------------------------


def _plan(n: int) -> list[Turn]:
    """Model turns: after a user message call the tool (2 of 3 times) or answer; after a tool output answer."""
    turns: list[Turn] = []
    last_was_call = False
    for i in range(n):
        if last_was_call:
            turns.append(Turn(text=f"Result {i} noted."))
            last_was_call = False
        elif i % 3 != 2:
            turns.append(
                Turn(
                    reasoning=f"Turn {i}: I should check.", tool_calls=(ToolCall("get_weather", {"city": f"City{i}"}),)
                )
            )
            last_was_call = True
        else:
            turns.append(Turn(reasoning=f"Turn {i}: easy.", text=f"Answer {i}."))
    return turns


def test_o_new_input_over_64_chained_websocket_turns(make_gateway):
    n = 64
    turns = _plan(n)
    engine = SimulatedEngine(record_prompts=True, script=turns_in_order(turns))
    live = make_gateway(engine=engine)
    renderer = HarmonyRenderer()
    append = lambda: live.metric("respgate_render_tokens_total", {"mode": "append"})  # noqa: E731
    full = lambda: live.metric("respgate_render_tokens_total", {"mode": "full"})  # noqa: E731
    calls: dict[str, dict[str, Any]] = {}
    prev = None
    new_items: list[dict[str, Any]] = [{"role": "user", "content": "Question 0"}]
    full_after_first = None
    with live.openai().responses.connect() as conn:
        for i in range(n):
            before = append()
            conn.response.create(
                model=MODEL,
                input=new_items,
                tools=TOOLS,
                store=False,
                instructions="Be terse.",
                **({"previous_response_id": prev.id} if prev else {}),
            )
            events = ws_turn(conn)
            assert events[-1].type == "response.completed", events[-1]
            resp = events[-1].response

            # the new items, canonicalized and rendered independently of the gateway
            canonical = []
            for it in new_items:
                if it.get("type") == "function_call_output":
                    canonical.append({"type": "function_call_output", "call_id": it["call_id"], "output": it["output"]})
                else:
                    canonical.append(
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": it["content"]}]}
                    )
            new_ids = renderer.render_items(canonical, calls=calls)
            prompt = engine.stats.prompts[i]
            if i == 0:
                full_after_first = full()
                assert full_after_first == len(prompt) - len(renderer.generation_prompt())
                assert append() == before == 0
            else:
                assert append() - before == len(new_ids), f"turn {i}"
                # parent's prompt + its sampled tokens (as kept in history) + the new items
                parent_prompt = engine.stats.prompts[i - 1]
                sampled = renderer.history_tokens(list(turn_tokens(turns[i - 1])))
                assert prompt == parent_prompt + sampled + new_ids + renderer.generation_prompt(), f"turn {i}"
                assert resp.usage.input_tokens_details.cached_tokens > 0
            assert resp.usage.input_tokens == len(prompt)
            assert full() == full_after_first, f"full render at turn {i}"

            for o in resp.output:
                if o.type == "function_call":
                    calls[o.call_id] = {"type": "function_call", "call_id": o.call_id, "name": o.name}
            out_calls = [o for o in resp.output if o.type == "function_call"]
            new_items = [
                {"type": "function_call_output", "call_id": c.call_id, "output": f"{i} degrees"} for c in out_calls
            ] or [{"role": "user", "content": f"Question {i + 1}"}]
            prev = resp
    assert engine.stats.requests == n
    fallbacks = live.gw.metrics.registry.get_sample_value
    for reason in ("not_canonical", "prelude_changed"):
        assert (fallbacks("respgate_render_full_fallbacks_total", {"reason": reason}) or 0) == 0
    # the last prompt holds the whole conversation
    texts = [m.text for m in PromptView(engine.stats.prompts[-1]).messages()]
    assert texts.count("Question 0") == 1 and "Turn 0: I should check." in texts
    assert "Result 1 noted." in texts and '{"city":"City0"}' in texts
