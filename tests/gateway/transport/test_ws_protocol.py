"""WebSocket mode, protocol level (ws-mode.md §2-§4, §10, checklist §14).

Covers the checklist groups "Handshake and framing", "`response.create`", "Warm-up",
"Errors and stray frames" and the steer/inject lines of "Compaction and steering". Lifetime and
disconnect are in ``test_ws_lifetime.py``; continuation/cache and lanes have their own files.

Every test talks to a real uvicorn server on loopback: through the official SDK
(``client.responses.connect()``) where it can express the case, and through a raw ``websockets``
client for what the SDK cannot send (invalid JSON, unknown event types, huge frames, compression
settings, steer with extra fields).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.sync.client import connect

from gateway.base.settings import Settings
from inference.harmony_core import harmony_encoding
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn, turns_in_order
from tests.conftest import MODEL, SHARED, LiveGateway
from tests.ws_helpers import TERMINAL, recv, send, until_terminal, ws_open

CODEX_FIXTURES = SHARED / "fixtures/codex/ws-gpt-5.5"
LONG_TEXT = " ".join(f"word{i}" for i in range(150))  # ~300 tokens: streams for seconds at 100 tok/s


# -- helpers -----------------------------------------------------------------------------------------


def sdk_until_terminal(conn: Any, timeout: float = 20) -> list[dict[str, Any]]:
    """Same as :func:`until_terminal` over an SDK connection, as raw JSON dicts."""
    deadline = time.monotonic() + timeout
    out: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        ev = json.loads(conn.recv_bytes())
        out.append(ev)
        if ev["type"] in TERMINAL or ev["type"] == "error":
            return out
    raise AssertionError(f"no terminal event within {timeout}s: {[e['type'] for e in out]}")


def create(**fields: Any) -> dict[str, Any]:
    fields.setdefault("model", MODEL)
    fields.setdefault("input", "hello")
    return {"type": "response.create", **fields}


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def fixed(turn: Turn):
    return lambda view: turn


def assert_error_frame(ev: dict[str, Any], status: int, code: str | None = None, param: str | None = None) -> None:
    assert ev["type"] == "error", ev
    assert ev["status"] == status and type(ev["status"]) is int, ev
    err = ev["error"]
    assert err["type"] == "invalid_request_error" if status < 500 else err["type"]
    assert isinstance(err["message"], str) and err["message"]
    assert "code" in err and "param" in err, ev
    if code is not None:
        assert err["code"] == code, ev
    if param is not None:
        assert err["param"] == param, ev


def assert_one_full_response(events: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    """created first, terminal last, dense sequence numbers, no error frame; returns the final response."""
    assert events[0]["type"] == "response.created", types(events)
    assert events[-1]["type"] == f"response.{status}", types(events)
    assert "error" not in types(events)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["id"] == events[-1]["response"]["id"]
    return events[-1]["response"]


_ID = re.compile(r"^(resp|msg|rs|fc|ctc|call)_[0-9A-Za-z]+$")


def normalize(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace generated ids by stable placeholders and drop wall-clock timestamps."""
    names: dict[str, str] = {}

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k not in ("created_at", "completed_at")}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str) and _ID.match(v):
            return names.setdefault(v, f"<{v.split('_')[0]}#{len(names)}>")
        return v

    return [walk(e) for e in events]


# -- Handshake and framing -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/responses", "/responses"])
def test_upgrade_returns_101_on_v1_and_bare_paths(make_gateway, path):
    live = make_gateway(Settings(api_keys=["k1"]))
    with ws_open(live, path, additional_headers={"Authorization": "Bearer k1"}) as ws:
        assert ws.response.status_code == 101
        send(ws, create(input="ping"))
        assert_one_full_response(until_terminal(ws))


def test_handshake_without_valid_key_is_http_401_json(make_gateway):
    live = make_gateway(Settings(api_keys=["k1"]))
    for auth in (None, "Bearer wrong-key", "Basic azE6", "Bearer ", "k1"):
        headers = {"Authorization": auth} if auth is not None else {}
        with pytest.raises(InvalidStatus) as exc_info:
            ws_open(live, additional_headers=headers)
        resp = exc_info.value.response
        assert resp.status_code == 401, auth  # an HTTP error, never a 101 followed by a close
        assert resp.headers["content-type"].startswith("application/json")
        body = json.loads(bytes(resp.body))
        assert set(body) == {"error"}
        assert body["error"]["code"] == "invalid_api_key"
        assert body["error"]["type"] == "invalid_request_error"
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        assert "param" in body["error"]
    assert live.engine.stats.requests == 0


def test_handshake_without_subprotocol_and_with_codex_headers(make_gateway):
    live = make_gateway()
    # no subprotocol offered: none selected, connection usable
    with ws_open(live) as ws:
        assert ws.subprotocol is None
        assert "Sec-WebSocket-Protocol" not in ws.response.headers
        send(ws, create())
        assert_one_full_response(until_terminal(ws))
    # Codex-style headers (alpha beta header, x-codex-* extras) are tolerated
    codex_headers = {
        "Authorization": "Bearer test-key",
        "OpenAI-Beta": "responses_websockets=2026-02-06",
        "originator": "codex_exec",
        "session_id": "01a226b7-d268-7400-917e-01c7458b6ce3",
        "x-client-request-id": "01a226b7-d268-7400-917e-01c7458b6ce3",
        "x-codex-turn-state": "opaque-state",
        "x-codex-turn-metadata": json.dumps({"turn_id": "", "request_kind": "prewarm"}),
        "x-codex-beta-features": "remote_compaction_v2",
        "x-codex-anything-else": "whatever",
    }
    with ws_open(live, additional_headers=codex_headers) as ws:
        assert ws.response.status_code == 101
        send(ws, create(input="hi from codex"))
        assert_one_full_response(until_terminal(ws))
    # a client offering a subprotocol we do not implement is not given one
    with ws_open(live, subprotocols=["openai-insecure-api-key.abc"]) as ws:
        assert ws.subprotocol is None
        send(ws, create())
        assert_one_full_response(until_terminal(ws))


def test_codex_handshake_and_warmup_replay(make_gateway):
    handshake = json.loads((CODEX_FIXTURES / "001-ws_handshake.json").read_text())
    warmup = json.loads((CODEX_FIXTURES / "002-ws_message.json").read_text())["body"]
    engine = SimulatedEngine(record_prompts=True)
    live = make_gateway(Settings(models=[warmup["model"]]), engine=engine)
    hop_by_hop = {
        "host",
        "connection",
        "upgrade",
        "sec-websocket-version",
        "sec-websocket-key",
        "sec-websocket-extensions",
    }
    headers = {k: v for k, v in handshake["headers"].items() if k not in hop_by_hop}
    headers["authorization"] = "Bearer test-key"  # the fixture's key is redacted
    assert handshake["headers"]["sec-websocket-extensions"].startswith("permessage-deflate")
    with connect(live.ws_url, additional_headers=headers, compression="deflate", open_timeout=10) as ws:
        assert ws.response.status_code == 101
        assert warmup["generate"] is False and warmup["stream"] is True
        send(ws, warmup)
        events = until_terminal(ws)
        assert types(events) == ["response.created", "response.in_progress", "response.completed"]
        assert events[0]["response"]["status"] == "in_progress"
        final = events[-1]["response"]
        assert final["status"] == "completed"
        assert final["output"] == []
        assert final["usage"]["output_tokens"] == 0
        assert final["usage"]["input_tokens"] > 0
        assert final["id"].startswith("resp_") and final["id"] == events[0]["response"]["id"]
        assert final["object"] == "response" and final["model"] == warmup["model"]
        assert final["store"] is False
        for key in (
            "created_at",
            "completed_at",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "reasoning",
            "text",
            "error",
            "incomplete_details",
        ):
            assert key in final, key
        assert final["error"] is None
        assert engine.stats.requests == 0 and engine.stats.prompts == []


@pytest.mark.parametrize("compression", ["deflate", None])
def test_permessage_deflate_negotiated_and_frames_round_trip(make_gateway, compression):
    live = make_gateway(engine=SimulatedEngine(script=fixed(Turn(text="short answer")), record_prompts=True))
    big = "compress me please " * 20_000  # ~380 KB, highly compressible, in both directions
    with ws_open(live, compression=compression) as ws:
        ext = ws.response.headers.get("Sec-WebSocket-Extensions", "")
        negotiated = [e for e in ws.protocol.extensions if isinstance(e, PerMessageDeflate)]
        if compression == "deflate":
            assert ext.startswith("permessage-deflate")
            assert len(negotiated) == 1
        else:
            assert ext == "" and negotiated == []
        send(ws, create(instructions=big, input="x"))
        events = until_terminal(ws, timeout=30)
        final = assert_one_full_response(events)
        assert events[0]["response"]["instructions"] == big
        assert final["instructions"] == big
        assert final["output"][-1]["content"][0]["text"] == "short answer"
    prompt_text = harmony_encoding().decode(live.engine.stats.prompts[-1])
    assert big.strip() in prompt_text


def test_20mib_frame_is_accepted(make_gateway):
    live = make_gateway()
    pad = "x" * (20 * 1024 * 1024 + 1024)
    frame = json.dumps(create(input="big frame", client_metadata={"pad": pad}))
    assert len(frame.encode()) > 20 * 1024 * 1024 > 16 * 1024 * 1024
    with ws_open(live, max_size=None) as ws:
        ws.send(frame)
        final = assert_one_full_response(until_terminal(ws, timeout=60))
        assert final["status"] == "completed"
        # the socket is still healthy afterwards
        send(ws, create(input="after"))
        assert_one_full_response(until_terminal(ws))


def test_every_server_frame_is_one_json_object_in_a_text_frame(make_gateway):
    script = fixed(Turn(reasoning="Let me think.", commentary="Calling the tool.", tool_calls=(), text="All done."))
    live = make_gateway(engine=SimulatedEngine(script=script, record_prompts=True))
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]
    frames: list[str | bytes] = []
    with ws_open(live) as ws:

        def take_until_terminal() -> None:
            while True:
                raw = ws.recv(timeout=15)
                frames.append(raw)
                ev = json.loads(raw)
                if ev["type"] in TERMINAL or ev["type"] == "error":
                    return

        send(ws, create(input="hi", tools=tools))  # reasoning + commentary + text
        take_until_terminal()
        send(ws, create(input=[], generate=False))  # warm-up
        take_until_terminal()
        send(ws, create(foo=1))  # error frame
        take_until_terminal()
        send(ws, {"type": "response.steer", "previous_response_id": "resp_x", "input": "go"})
        raw = ws.recv(timeout=15)  # steer.failed
        frames.append(raw)
        # the next frame after each terminal is the next response's first event: nothing in between
        send(ws, create(input="last"))
        take_until_terminal()
    seen = set()
    for raw in frames:
        assert isinstance(raw, str), f"binary frame: {raw[:60]!r}"
        assert raw.strip() != "[DONE]"
        ev = json.loads(raw)  # exactly one JSON value per frame
        assert isinstance(ev, dict) and isinstance(ev.get("type"), str)
        assert ev["type"] != "response.done"
        seen.add(ev["type"])
    assert {
        "response.created",
        "response.output_text.delta",
        "response.completed",
        "error",
        "response.steer.failed",
    } <= seen
    created = [json.loads(f) for f in frames if json.loads(f)["type"] == "response.created"]
    assert len(created) == 3


# -- response.create -------------------------------------------------------------------------------


def test_flat_create_matches_sse_stream_of_same_request(make_gateway):
    turn = Turn(reasoning="Thinking it over.", text="The answer is forty-two.")
    live = make_gateway(engine=SimulatedEngine(script=fixed(turn), prefix_cache=False, record_prompts=True))
    body = {"model": MODEL, "input": "What is the answer?", "instructions": "Be brief.", "metadata": {"k": "v"}}

    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(**body)
        ws_events = sdk_until_terminal(conn)

    sse_events: list[dict[str, Any]] = []
    with httpx.Client(timeout=30) as http:
        with http.stream(
            "POST",
            live.base_url + "/responses",
            json={**body, "stream": True},
            headers={"Authorization": "Bearer test-key"},
        ) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    sse_events.append(json.loads(line[len("data: ") :]))

    assert types(ws_events)[0] == "response.created" and types(ws_events)[-1] == "response.completed"
    assert "response.output_text.delta" in types(ws_events)
    assert types(ws_events) == types(sse_events)
    assert normalize(ws_events) == normalize(sse_events)
    assert all("stream_id" not in e for e in ws_events)  # default lane: no stream_id


def _stream_flag_case(live: LiveGateway, flag: bool) -> None:
    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="hello")
        baseline = sdk_until_terminal(conn)
        conn.response.create(model=MODEL, input="hello", stream=flag)
        flagged = sdk_until_terminal(conn)
    assert_one_full_response(baseline)
    assert_one_full_response(flagged)
    assert types(flagged) == types(baseline)
    assert "response.output_text.delta" in types(flagged)
    assert normalize(flagged) == normalize(baseline)  # same events, same payloads
    assert live.engine.stats.requests == 2


def test_stream_true_in_create_is_accepted_and_ignored(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=fixed(Turn(text="streamed")), prefix_cache=False))
    _stream_flag_case(live, True)


def test_stream_false_in_create_still_streams(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=fixed(Turn(text="still streamed")), prefix_cache=False))
    _stream_flag_case(live, False)


def test_background_true_is_an_error_frame_without_response_created(make_gateway):
    live = make_gateway()
    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="hi", background=True)
        err = json.loads(conn.recv_bytes())
        assert_error_frame(err, 400, param="background")
        assert "stream_id" not in err
        # the next frame is the next request's response.created: none was sent for the rejected one
        conn.response.create(model=MODEL, input="hi", background=False)
        events = sdk_until_terminal(conn)
        final = assert_one_full_response(events)
        assert final["background"] is False
    assert live.engine.stats.requests == 1


def test_client_metadata_and_access_programs_are_accepted(make_gateway):
    live = make_gateway()
    client = live.openai()
    with client.responses.connect() as conn:
        conn.send(
            create(
                input="hi",
                stream=True,
                store=False,
                client_metadata={
                    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                    "x-codex-installation-id": "5e4a4512",
                },
                access_programs=["codex"],
            )
        )
        final = assert_one_full_response(sdk_until_terminal(conn))
        assert final["status"] == "completed"


def test_unknown_top_level_field_is_unknown_parameter_and_socket_stays_open(make_gateway):
    live = make_gateway()
    client = live.openai()
    with client.responses.connect() as conn:
        conn.send(create(foo="bar"))
        err = json.loads(conn.recv_bytes())
        assert_error_frame(err, 400, code="unknown_parameter", param="foo")
        conn.response.create(model=MODEL, input="still here?")
        assert_one_full_response(sdk_until_terminal(conn))
    assert live.engine.stats.requests == 1


def test_missing_model_is_missing_required_parameter(make_gateway):
    live = make_gateway()
    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(input="no model")
        err = json.loads(conn.recv_bytes())
        assert_error_frame(err, 400, code="missing_required_parameter", param="model")
        conn.response.create(model=MODEL, input="with model")
        assert_one_full_response(sdk_until_terminal(conn))
    assert live.engine.stats.requests == 1


def test_event_id_is_not_echoed_but_rejected_as_unknown_parameter(make_gateway):
    live = make_gateway()
    client = live.openai()
    with client.responses.connect() as conn:
        conn.send(create(event_id="evt_123"))
        err = json.loads(conn.recv_bytes())
        assert_error_frame(err, 400, code="unknown_parameter", param="event_id")
        assert "event_id" not in err
        conn.response.create(model=MODEL, input="ok")
        events = sdk_until_terminal(conn)
        assert_one_full_response(events)
        assert all("event_id" not in e for e in events)
    assert live.engine.stats.requests == 1


# -- Warm-up ---------------------------------------------------------------------------------------


def test_warmup_generate_false_with_empty_input(make_gateway):
    live = make_gateway()
    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=[], generate=False)
        events = sdk_until_terminal(conn)
    assert types(events) == ["response.created", "response.in_progress", "response.completed"]
    assert [e["sequence_number"] for e in events] == [0, 1, 2]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["usage"] is None
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"] == []
    assert final["usage"]["output_tokens"] == 0
    assert final["usage"]["total_tokens"] == final["usage"]["input_tokens"]
    assert final["id"] == events[0]["response"]["id"]
    assert live.engine.stats.requests == 0  # no model call


def test_warmup_prefix_is_used_by_the_next_turn(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=fixed(Turn(text="Bonjour.")), record_prompts=True))
    tools = [
        {
            "type": "function",
            "name": "lookup_zebra",
            "description": "Looks up zebras.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    instructions = "Always answer in French. The codeword is PAPAYA."
    prefix = [
        {
            "type": "message",
            "role": "developer",
            "id": "msg_dev1",
            "content": [{"type": "input_text", "text": "Project ORCHID context lives here."}],
        },
        {"type": "message", "role": "user", "content": "Say hello to QUOKKA."},
    ]
    client = live.openai()
    with client.responses.connect() as conn:
        conn.response.create(
            model=MODEL, instructions=instructions, tools=tools, input=prefix, generate=False, store=False
        )
        warm = sdk_until_terminal(conn)
        warm_final = assert_one_full_response(warm)
        assert warm_final["output"] == [] and warm_final["usage"]["output_tokens"] == 0
        assert live.engine.stats.requests == 0
        warm_id = warm_final["id"]
        full_after_warmup = live.metric("respgate_render_tokens_total", {"mode": "full"})
        assert full_after_warmup > 0

        conn.response.create(
            model=MODEL, instructions=instructions, tools=tools, input=[], previous_response_id=warm_id, store=False
        )
        events = sdk_until_terminal(conn)
    final = assert_one_full_response(events)
    assert final["previous_response_id"] == warm_id
    assert final["output"][-1]["content"][0]["text"] == "Bonjour."
    assert final["usage"]["input_tokens"] > warm_final["usage"]["input_tokens"]
    assert live.engine.stats.requests == 1
    prompt = harmony_encoding().decode(live.engine.stats.prompts[0])
    for needle in ("PAPAYA", "lookup_zebra", "Project ORCHID", "QUOKKA"):
        assert needle in prompt, needle
    # the warmed, rendered prefix was reused as-is (an append, not a re-render)
    assert live.metric("respgate_render_tokens_total", {"mode": "full"}) == full_after_warmup
    for reason in ("prelude_changed", "not_canonical"):
        assert live.metric("respgate_render_full_fallbacks_total", {"reason": reason}) == 0


def test_generate_null_behaves_like_generate_true(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=fixed(Turn(text="generated")), record_prompts=True))
    client = live.openai()
    with client.responses.connect() as conn:
        conn.send(create(input="hi", generate=None))
        with_null = sdk_until_terminal(conn)
        conn.send(create(input="hi", generate=True))
        with_true = sdk_until_terminal(conn)
    for events in (with_null, with_true):
        final = assert_one_full_response(events)
        assert final["output"][-1]["content"][0]["text"] == "generated"
        assert final["usage"]["output_tokens"] > 0
    assert types(with_null) == types(with_true)
    assert live.engine.stats.requests == 2


# -- Errors and stray frames -----------------------------------------------------------------------


def test_request_scoped_error_frames_have_the_full_envelope(make_gateway):
    live = make_gateway()
    triggers: list[tuple[Any, int, str | None]] = [
        ("{not json", 400, None),
        ("[1, 2, 3]", 400, None),
        (json.dumps({"no": "type"}), 400, None),
        ({"type": "response.cancel"}, 400, None),
        (create(foo=1), 400, "unknown_parameter"),
        ({"type": "response.create", "input": "x"}, 400, "missing_required_parameter"),
        (create(background=True), 400, None),
        (create(temperature=5), 400, None),
        (create(previous_response_id="resp_doesnotexist", store=False), 400, "previous_response_not_found"),
        (create(stream_id=""), 400, "invalid_stream_id"),
        (create(model="no-such-model"), 404, "model_not_found"),
        ({"type": "response.inject", "response_id": "resp_x", "input": []}, 400, None),
    ]
    with ws_open(live) as ws:
        for frame, status, code in triggers:
            send(ws, frame)
            ev = recv(ws)
            assert_error_frame(ev, status, code)
            assert set(ev) <= {"type", "status", "error", "stream_id", "sequence_number"}
            assert set(ev["error"]) <= {"type", "code", "message", "param", "headers"}
        # named lane: the request-scoped error carries its stream_id
        send(ws, create(stream_id="a", foo=1))
        ev = recv(ws)
        assert_error_frame(ev, 400, "unknown_parameter", "foo")
        assert ev["stream_id"] == "a"
    assert live.engine.stats.requests == 0


def test_error_on_lane_a_does_not_disturb_response_on_lane_b(make_gateway):
    turn = Turn(text=LONG_TEXT, delay_per_token_s=0.004)
    live = make_gateway(engine=SimulatedEngine(script=fixed(turn), record_prompts=True))
    with ws_open(live) as ws:
        send(ws, create(stream_id="b", input="long one"))
        b_events: list[dict[str, Any]] = []
        while True:  # wait until b is streaming text
            ev = recv(ws)
            b_events.append(ev)
            if ev["type"] == "response.output_text.delta":
                break
        send(ws, create(stream_id="a", foo=1))
        error_seen_while_b_running = None
        while True:
            ev = recv(ws)
            if ev["type"] == "error":
                assert_error_frame(ev, 400, "unknown_parameter")
                assert ev["stream_id"] == "a"
                error_seen_while_b_running = live.engine.stats.running == 1
                continue
            b_events.append(ev)
            if ev["type"] in TERMINAL:
                break
    assert error_seen_while_b_running is True
    final = assert_one_full_response(b_events)
    assert all(e.get("stream_id") == "b" for e in b_events)
    assert final["output"][-1]["content"][0]["text"] == LONG_TEXT
    assert live.engine.stats.requests == 1 and live.engine.stats.aborts == 0


def test_response_processed_produces_no_frame(make_gateway):
    live = make_gateway()
    client = live.openai()
    with client.responses.connect() as conn:
        conn.send({"type": "response.processed", "response_id": "resp_x"})  # before any response
        conn.response.create(model=MODEL, input="one")
        first = sdk_until_terminal(conn)
        assert_one_full_response(first)
        conn.send({"type": "response.processed", "response_id": first[-1]["response"]["id"]})
        conn.response.create(model=MODEL, input="two")
        second = sdk_until_terminal(conn)
        assert_one_full_response(second)  # its first frame is response.created: nothing in between


def test_unknown_event_type_gets_one_error_and_socket_stays_open(make_gateway):
    live = make_gateway()
    stray = [
        "response.cancel",
        "session.update",
        "conversation.item.create",
        "input_audio_buffer.append",
        "response.done",
    ]
    with ws_open(live) as ws:
        for event_type in stray:
            send(ws, {"type": event_type, "response_id": "resp_x"})
            err = recv(ws)
            assert_error_frame(err, 400)
            assert err["error"]["code"] == "unknown_event_type"
            send(ws, create(input="after stray"))
            assert_one_full_response(until_terminal(ws))  # the frame after the one error is response.created
    assert live.engine.stats.requests == len(stray)


def test_invalid_json_or_non_event_gets_one_error_and_socket_stays_open(make_gateway):
    live = make_gateway()
    garbage = ["{not json", '{"type": "response.create", ', "", "null", '"text"', "[]", '{"type": 5}', '{"model": "x"}']
    with ws_open(live) as ws:
        for raw in garbage:
            send(ws, raw)
            err = recv(ws)
            assert_error_frame(err, 400)
            send(ws, create(input="after garbage"))
            assert_one_full_response(until_terminal(ws))  # exactly one error, then the socket works
    assert live.engine.stats.requests == len(garbage)


def test_binary_json_frame_is_decoded_like_text(make_gateway):
    live = make_gateway()
    with ws_open(live) as ws:
        ws.send(json.dumps(create(input="binary")).encode())
        assert_one_full_response(until_terminal(ws))
        ws.send(b"\xff\xfe not utf-8")
        assert_error_frame(recv(ws), 400)
        send(ws, create(input="text again"))
        assert_one_full_response(until_terminal(ws))


def test_failure_after_created_is_exactly_one_response_failed(make_gateway):
    turn = Turn(reasoning="Starting.", text="This will break midway.", fail_after_tokens=8)
    live = make_gateway(engine=SimulatedEngine(script=turns_in_order([turn]), record_prompts=True))
    with ws_open(live) as ws:
        send(ws, create(input="please fail"))
        events = until_terminal(ws)
        final = assert_one_full_response(events, status="failed")
        assert [t for t in types(events) if t in TERMINAL] == ["response.failed"]
        assert final["error"]["code"] == "server_error" and final["error"]["message"]
        # no trailing error frame: the next frame is the next response's response.created
        send(ws, create(input="works again"))
        assert_one_full_response(until_terminal(ws))
    assert live.engine.stats.requests == 2


# -- steer / inject ----------------------------------------------------------------------------------


def _start_slow_response(conn: Any, **fields: Any) -> tuple[str, list[dict[str, Any]]]:
    conn.send(create(input="stream slowly", **fields))
    events = [json.loads(conn.recv_bytes())]
    assert events[0]["type"] == "response.created", events
    return events[0]["response"]["id"], events


def test_steer_when_disabled_is_not_supported_and_echoes_input(make_gateway):
    """``ws_steering: false`` (steering itself: test_ws_steer.py): every steer is handed back."""
    live = make_gateway(
        Settings(ws_steering=False),
        engine=SimulatedEngine(script=fixed(Turn(text=LONG_TEXT, delay_per_token_s=0.002)), record_prompts=True),
    )
    steer_inputs = [
        "Keep the scope small.",
        [
            {"type": "message", "role": "user", "content": "Keep the scope small."},
            {"role": "user", "content": [{"type": "input_text", "text": "And be quick."}]},
        ],
    ]
    client = live.openai()
    with client.responses.connect() as conn:
        for steer_input in steer_inputs:
            rid, events = _start_slow_response(conn)
            conn.response.steer(input=steer_input, previous_response_id=rid)
            steers = []
            while True:
                ev = json.loads(conn.recv_bytes())
                if ev["type"].startswith("response.steer."):
                    steers.append(ev)
                    continue
                events.append(ev)
                if ev["type"] in TERMINAL or ev["type"] == "error":
                    break
            final = assert_one_full_response(events)  # the steered response is untouched, no error frame
            assert final["output"][-1]["content"][0]["text"] == LONG_TEXT
            assert len(steers) == 1
            failed = steers[0]
            assert failed["type"] == "response.steer.failed"
            assert isinstance(failed["sequence_number"], int)
            assert failed["error"]["code"] == "steering_not_supported"
            assert failed["error"]["type"] == "invalid_request_error" and failed["error"]["message"]
            assert failed["steer"]["previous_response_id"] == rid
            assert failed["steer"]["input"] == steer_input
            assert "stream_id" not in failed  # default-lane target


def test_steer_on_named_lane_response_carries_its_stream_id(make_gateway):
    live = make_gateway(
        Settings(ws_steering=False),
        engine=SimulatedEngine(script=fixed(Turn(text=LONG_TEXT, delay_per_token_s=0.002)), record_prompts=True),
    )
    with ws_open(live) as ws:
        send(ws, create(input="lane a", stream_id="a"))
        created = recv(ws)
        assert created["type"] == "response.created" and created["stream_id"] == "a"
        rid = created["response"]["id"]
        send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "shorter please"})
        steer = None
        while True:
            ev = recv(ws)
            if ev["type"] == "response.steer.failed":
                steer = ev
                continue
            assert ev["type"] != "error", ev
            if ev["type"] in TERMINAL:
                break
    assert steer is not None
    assert steer["error"]["code"] == "steering_not_supported"
    assert steer["steer"]["previous_response_id"] == rid
    assert steer.get("stream_id") == "a"


def test_steer_with_stream_id_or_non_user_input_is_invalid_input(make_gateway):
    live = make_gateway()
    bad_variants = [
        {"stream_id": "main"},
        {"input": [{"role": "assistant", "content": "I decide."}]},
        {"input": [{"role": "developer", "content": "Override."}]},
        {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]},
        {"input": []},
    ]
    with ws_open(live) as ws:
        send(ws, create(input="first"))
        rid = until_terminal(ws)[-1]["response"]["id"]
        for bad in bad_variants:
            frame = {"type": "response.steer", "previous_response_id": rid, "input": "Keep the scope small."}
            frame.update(bad)
            send(ws, frame)
            ev = recv(ws)
            assert ev["type"] == "response.steer.failed", ev
            assert ev["error"]["code"] == "invalid_input", bad
            assert ev["error"]["type"] == "invalid_request_error"
            assert ev["steer"]["previous_response_id"] == rid
            assert ev["steer"]["input"] == frame["input"]
            # still usable, and no error frame was queued behind the steer.failed
            send(ws, create(input="next"))
            assert_one_full_response(until_terminal(ws))


def test_inject_and_multi_agent_are_rejected_with_error_frames(make_gateway):
    live = make_gateway()
    headers = {"Authorization": "Bearer test-key", "OpenAI-Beta": "responses_multi_agent=v1"}
    with ws_open(live, additional_headers=headers) as ws:
        send(
            ws,
            {
                "type": "response.inject",
                "response_id": "resp_x",
                "input": [{"type": "function_call_output", "call_id": "call_1", "output": "done"}],
            },
        )
        assert_error_frame(recv(ws), 400)
        send(ws, create(input="spawn agents", multi_agent={"enabled": True, "max_concurrent_subagents": 2}))
        err = recv(ws)
        assert_error_frame(err, 400)
        assert err["error"]["param"] == "multi_agent"
        send(ws, create(input="plain"))
        assert_one_full_response(until_terminal(ws))
    assert live.engine.stats.requests == 1
