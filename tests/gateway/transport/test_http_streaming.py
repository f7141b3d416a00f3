"""``POST /v1/responses`` with ``stream: true``: SSE framing and event order.

One test per line of the "Streaming" section of spec/responses-http.md §8. Raw httpx reads the
exact bytes (framing, content type, no ``[DONE]``); the official SDK checks that its stream helpers
work end to end. Every stream also goes through :func:`check_invariants` (dense sequence numbers,
``response.created`` first, one terminal event last, dense ``output_index``, no top-level ``error``).
"""

from __future__ import annotations

from typing import Any

import httpx

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.conftest import MODEL
from tests.http_helpers import TERMINAL_EVENTS, create, parse_sse, stream, wait_for

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def scripted(*turns: Turn) -> SimulatedEngine:
    return SimulatedEngine(script=turns_in_order(turns), record_prompts=True)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def collapse(names: list[str]) -> list[str]:
    """Runs of the same delta event collapse to ``name+`` (to compare against a grammar)."""
    out: list[str] = []
    for n in names:
        if n.endswith(".delta") and out and out[-1] in (n, n + "+"):
            out[-1] = n + "+"
        elif n.endswith(".delta"):
            out.append(n + "+")
        else:
            out.append(n)
    return out


def check_invariants(events: list[dict[str, Any]]) -> None:
    assert events, "empty stream"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    terminal = [e for e in events if e["type"] in TERMINAL_EVENTS]
    assert len(terminal) == 1 and events[-1] is terminal[0], types(events)
    for e in events:
        if e["type"] != "error":
            assert "error" not in e, e  # the SDK raises on a truthy top-level error key
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == list(range(len(added)))
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert done == added
    # items are streamed one after another: every event of item k lies between its added and done
    open_index = None
    for e in events:
        if e["type"] == "response.output_item.added":
            assert open_index is None
            open_index = e["output_index"]
        elif e["type"] == "response.output_item.done":
            assert e["output_index"] == open_index
            open_index = None
        elif "output_index" in e:
            assert e["output_index"] == open_index, e
    final = terminal[0]["response"]
    assert len(final["output"]) == len(added)


# ---------------------------------------------------------------------------------------------


def test_sse_framing_and_content_type(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="Hello there, friend.")))
    r, raw, events = stream(live, input="hi")
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    # exact bytes of the first frame: event line, data line, blank line
    first = raw.split(b"\n\n", 1)[0] + b"\n\n"
    assert first.startswith(b'event: response.created\ndata: {"type":"response.created","sequence_number":0,')
    assert first.count(b"\n") == 3
    assert b"id:" not in b"".join(line for line in raw.split(b"\n") if not line.startswith(b"data: "))
    check_invariants(events)  # parse_sse already asserted event == data.type for every frame


def test_sequence_numbers_start_at_zero_and_are_dense(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="a b c d", text="one two three four five")))
    _, _, events = stream(live, input="hi")
    assert len(events) > 10
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_no_done_sentinel_and_stream_closes_after_terminal(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="bye")))
    with httpx.stream(
        "POST", live.base_url + "/responses", json={"model": MODEL, "input": "hi", "stream": True}, timeout=30
    ) as r:
        chunks = list(r.iter_raw())  # returns only when the server closes the stream
    raw = b"".join(chunks)
    assert b"[DONE]" not in raw
    events = parse_sse(raw)
    assert events[-1]["type"] == "response.completed"
    assert raw.endswith(b"\n\n") and raw.rsplit(b"\n\n", 2)[-2].startswith(b"event: response.completed\n")


def test_text_answer_event_sequence_is_exact(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="The quick brown fox jumps.")))
    _, _, events = stream(live, input="hi")
    check_invariants(events)
    assert collapse(types(events)) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta+",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["item"]
    assert added["type"] == "message" and added["status"] == "in_progress" and added["content"] == []
    assert added["role"] == "assistant" and added["id"].startswith("msg_")
    assert events[3]["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "The quick brown fox jumps."
    text_done = next(e for e in events if e["type"] == "response.output_text.done")
    assert text_done["text"] == deltas and text_done["logprobs"] == []
    part_done = next(e for e in events if e["type"] == "response.content_part.done")
    assert part_done["part"]["text"] == deltas
    item_done = events[-2]["item"]
    assert item_done["status"] == "completed" and item_done["content"][0]["text"] == deltas


def test_created_and_in_progress_are_empty_completed_is_full(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="hm", text="Done.")))
    _, _, events = stream(live, input="hi")
    for e in events[:2]:
        assert e["type"] in ("response.created", "response.in_progress")
        assert e["response"]["status"] == "in_progress"
        assert e["response"]["output"] == [] and e["response"]["usage"] is None
        assert e["response"]["completed_at"] is None
    assert events[0]["response"]["id"] == events[-1]["response"]["id"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and isinstance(final["completed_at"], int)
    assert [o["type"] for o in final["output"]] == ["reasoning", "message"]
    assert final["output"] == [e["item"] for e in events if e["type"] == "response.output_item.done"]
    u = final["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] and u["output_tokens"] > 0
    # the streamed response is stored exactly as completed
    stored = httpx.get(f"{live.base_url}/responses/{final['id']}").json()
    assert stored == final


def test_text_delta_carries_logprobs_and_matching_ids(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="think", text="alpha beta gamma delta")))
    _, _, events = stream(live, input="hi")
    part_added = next(
        e for e in events if e["type"] == "response.content_part.added" and e["part"]["type"] == "output_text"
    )
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) > 1
    assert events.index(part_added) < events.index(deltas[0])
    for d in deltas:
        assert d["logprobs"] == []
        assert (d["item_id"], d["output_index"], d["content_index"]) == (
            part_added["item_id"],
            part_added["output_index"],
            part_added["content_index"],
        )
    assert part_added["output_index"] == 1


def test_function_call_stream(make_gateway):
    live = make_gateway(engine=scripted(Turn(tool_calls=(ToolCall("get_weather", {"city": "San Francisco"}),))))
    _, _, events = stream(live, input="Weather?", tools=[WEATHER_TOOL])
    check_invariants(events)
    assert collapse(types(events)) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta+",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["item"]
    assert added["type"] == "function_call" and added["arguments"] == "" and added["status"] == "in_progress"
    assert added["id"].startswith("fc_") and added["call_id"].startswith("call_") and added["name"] == "get_weather"
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert all(d["item_id"] == added["id"] and d["output_index"] == 0 for d in deltas)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["name"] == "get_weather"
    assert "".join(d["delta"] for d in deltas) == done["arguments"] == '{"city":"San Francisco"}'
    item = events[-2]["item"]
    assert item["status"] == "completed" and item["arguments"] == done["arguments"]
    assert item["call_id"] == added["call_id"]
    assert events[-1]["response"]["status"] == "completed"


def test_several_items_use_dense_output_indexes_and_do_not_interleave(make_gateway):
    # gpt-oss (harmony) stops sampling at the first <|call|>, so a response holds at most one call;
    # reasoning + preamble + call gives three items to check the numbering on.
    live = make_gateway(
        engine=scripted(
            Turn(
                reasoning="I should look it up.",
                commentary="Let me check.",
                tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),),
            )
        )
    )
    _, _, events = stream(live, input="Weather?", tools=[WEATHER_TOOL])
    check_invariants(events)
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert items[1].get("phase") == "commentary"


def test_reasoning_hidden_mode_has_no_reasoning_events(make_gateway):
    live = make_gateway(
        Settings(reasoning_text="hidden"), engine=scripted(Turn(reasoning="secret chain of thought", text="Answer."))
    )
    _, _, events = stream(live, input="hi")
    check_invariants(events)
    assert not [t for t in types(events) if t.startswith("response.reasoning")]
    assert types(events)[2:4] == ["response.output_item.added", "response.output_item.done"]
    assert events[2]["item"]["type"] == "reasoning" and events[2]["item"]["summary"] == []
    assert events[3]["item"]["type"] == "reasoning" and events[3]["item"]["summary"] == []
    msg_added = next(e for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "message")
    assert msg_added["output_index"] == 1


def test_reasoning_raw_mode_streams_reasoning_text(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="step one then step two", text="Answer.")))
    _, _, events = stream(live, input="hi")
    check_invariants(events)
    reasoning_part = [e for e in events if e.get("output_index") == 0]
    assert collapse(types(reasoning_part)) == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta+",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert reasoning_part[1]["part"] == {"type": "reasoning_text", "text": ""}
    text = "".join(e["delta"] for e in reasoning_part if e["type"] == "response.reasoning_text.delta")
    assert text == "step one then step two"
    assert reasoning_part[-1]["item"]["content"] == [{"type": "reasoning_text", "text": text}]
    assert not [t for t in types(events) if "summary" in t]


def test_reasoning_summary_events(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="Consider the sky; it is blue.", text="Blue.")))
    _, _, events = stream(live, input="Sky colour?", reasoning={"summary": "auto"})
    check_invariants(events)
    reasoning_part = [e for e in events if e.get("output_index") == 0]
    assert collapse(types(reasoning_part)) == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta+",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ]
    # the simulated model produces one reasoning message, hence one summary part (summary_index 0)
    assert {e["summary_index"] for e in reasoning_part if "summary_index" in e} == {0}
    assert reasoning_part[1]["part"] == {"type": "summary_text", "text": ""}
    text = "".join(e["delta"] for e in reasoning_part if e["type"] == "response.reasoning_summary_text.delta")
    assert text == "Consider the sky; it is blue."
    assert reasoning_part[-2]["part"] == {"type": "summary_text", "text": text}
    assert reasoning_part[-1]["item"]["summary"] == [{"type": "summary_text", "text": text}]
    assert events[-1]["response"]["reasoning"]["summary"] == "auto"


def test_token_cap_ends_with_incomplete(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="lorem " * 300)))
    _, _, events = stream(live, input="Write a lot.", max_output_tokens=16)
    check_invariants(events)
    assert "response.completed" not in types(events)
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["completed_at"] is None and last["response"]["usage"]["output_tokens"] == 16
    item_done = [e for e in events if e["type"] == "response.output_item.done"][-1]
    assert item_done["item"]["status"] == "incomplete"


def test_backend_failure_mid_stream_ends_with_one_failed(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="This answer will break halfway through.", fail_after_tokens=7)))
    _, _, events = stream(live, input="hi")
    check_invariants(events)
    failed = [e for e in events if e["type"] == "response.failed"]
    assert len(failed) == 1 and events[-1] is failed[0]
    assert "response.completed" not in types(events)
    resp = failed[0]["response"]
    assert resp["status"] == "failed" and resp["error"]["code"] == "server_error" and resp["error"]["message"]
    assert resp["completed_at"] is None
    # the item that was being written is closed as incomplete before the terminal event
    dones = [e for e in events if e["type"] == "response.output_item.done"]
    assert dones and dones[-1]["item"]["status"] == "incomplete"
    # the server keeps serving
    assert create(live, input="again")["status"] == "completed"


def test_no_top_level_error_key_in_any_event(make_gateway):
    live = make_gateway(
        engine=scripted(
            Turn(reasoning="r", tool_calls=(ToolCall("get_weather", {"city": "x"}),)),
            Turn(text="ok", fail_after_tokens=3),
        )
    )
    for fields in ({"input": "hi", "tools": [WEATHER_TOOL]}, {"input": "hi"}):
        _, raw, events = stream(live, **fields)
        for e in events:
            if e["type"] != "error":
                assert "error" not in e
        # the failed response nests its error under "response"
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["code"]


def test_obfuscation_off_means_no_obfuscation_keys(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="some text to stream"), Turn(text="some text to stream")))
    _, _, events = stream(live, input="hi", stream_options={"include_obfuscation": False})
    assert not [e for e in events if "obfuscation" in e]
    _, _, events = stream(live, input="hi")  # default: obfuscation allowed (optional) — must be a string if sent
    assert all(isinstance(e["obfuscation"], str) for e in events if "obfuscation" in e)
    assert events[-1]["type"] == "response.completed"


def test_sdk_stream_helper_and_final_response(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="Think.", text="Streaming works end to end.")))
    client = live.openai()
    deltas: list[str] = []
    seen: list[str] = []
    with client.responses.stream(model=MODEL, input="hi") as s:
        for event in s:
            seen.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = s.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert final.status == "completed"
    assert final.output_text == "".join(deltas) == "Streaming works end to end."
    # and the plain create(stream=True) iterator
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_client_disconnect_mid_stream_cancels_generation(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="never", endless=True, delay_per_token_s=0.002)))
    assert live.engine.stats.aborts == 0
    with httpx.stream(
        "POST", live.base_url + "/responses", json={"model": MODEL, "input": "talk forever", "stream": True}, timeout=30
    ) as r:
        buf = b""
        for chunk in r.iter_raw():
            buf += chunk
            if buf.count(b"response.output_text.delta\n") >= 5:
                break  # leaving the block closes the connection mid-stream
    assert live.engine.stats.requests == 1
    wait_for(lambda: live.engine.stats.aborts == 1, what="engine abort after client disconnect")
    wait_for(lambda: live.engine.stats.running == 0, what="engine slot freed")
    wait_for(lambda: live.metric("respgate_generation_aborts_total", {"transport": "http"}) == 1, what="abort metric")
    generated = live.engine.stats.generated_tokens
    assert generated < 100_000  # it did not run to max_tokens
    # what was produced is recorded as a cancelled response (never chained from)
    rid = parse_sse(buf.split(b"\n\n", 1)[0] + b"\n\n")[0]["response"]["id"]
    wait_for(
        lambda: httpx.get(f"{live.base_url}/responses/{rid}").json().get("status") == "cancelled",
        what="cancelled snapshot stored",
    )
    assert (
        httpx.post(
            live.base_url + "/responses", json={"model": MODEL, "input": "x", "previous_response_id": rid}
        ).status_code
        == 400
    )
    # the server keeps serving
    live.engine.script = None
    assert create(live, input="hello")["status"] == "completed"


def test_client_disconnect_non_streaming_cancels_generation(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="never", endless=True, delay_per_token_s=0.002)))
    try:
        httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "talk forever"}, timeout=0.5)
    except httpx.ReadTimeout:
        pass
    else:  # pragma: no cover - an endless generation cannot answer
        raise AssertionError("an endless generation answered")
    wait_for(lambda: live.engine.stats.aborts == 1, what="engine abort after client went away")
    wait_for(lambda: live.engine.stats.running == 0, what="engine slot freed")
