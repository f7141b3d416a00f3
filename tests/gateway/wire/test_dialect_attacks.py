"""Event dialects attacked from the outside (issue 31 item 2, second review).

The tests named for a defect each caught one in the first version (a WebSocket error frame that
ignored the model's dialect; repeated header lines read as their first) and now assert the fix;
the rest are attacks that held. Every OpenResponses event is validated *strictly* against the
shipped document (``tests/schema_check.py``: the event's own ``type`` must be the document's, no
renamed fallback).
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.base.settings import Settings
from gateway.wire.dialects import EventDialect
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL, LiveGateway, stop_gateway
from tests.gateway.wire.test_dialects import DONE, OR, OR_HEADER, check, parse_stream, types, ws_connect, ws_turn

pytestmark = pytest.mark.timeout(120)

#: a create refused before its response exists whose error has no code (OpenAI sends ``null``)
CODELESS = {"input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}]}
REASON = {"input": "Why is the sky blue?", "reasoning": {"effort": "low"}}
HI = {"model": MODEL, "input": "hi", "stream": True}


def post_stream(live: LiveGateway, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(live.base_url + "/responses", json=body, headers=headers, timeout=30)


def _strict_ws(frames: list[dict[str, Any]]) -> list[str]:
    return [p for f in frames for p in OR.event_errors(f, ws=True, strict=True)]


def test_a_websocket_error_frame_follows_the_models_dialect(make_gateway):
    """The operator set OpenResponses' dialect for the model; the client asked for nothing. Its turns
    come in OpenResponses' dialect, and so must the error frames of its creates for that model."""
    live = make_gateway(Settings(model_event_dialects={MODEL: "openresponses"}))
    with ws_connect(live) as ws:
        turn = ws_turn(ws, REASON)
        assert "response.reasoning.delta" in types(turn)  # the model's dialect applies to the turn
        check(turn, EventDialect.OPENRESPONSES, ws=True)
        refused = ws_turn(ws, CODELESS)
    assert types(refused) == ["error"], refused
    assert not _strict_ws(refused), refused


@pytest.mark.parametrize(
    "lines",
    [
        [("Respgate-Event-Dialect", "openai"), ("Respgate-Event-Dialect", "openresponses")],
        [("OpenResponses-Version", "latest"), ("OpenResponses-Version", "not-a-version")],
    ],
    ids=["contradicting", "second-invalid"],
)
def test_repeated_dialect_header_lines_mean_what_the_merged_line_means(make_gateway, lines):
    live = make_gateway()
    body = {"model": MODEL, "input": "hi", "stream": True}
    merged = [(lines[0][0], ", ".join(v for _, v in lines))]
    answers = []
    for hs in (merged, lines):
        r = httpx.post(live.base_url + "/responses", json=body, headers=httpx.Headers(hs), timeout=30)
        answers.append(r.status_code)
    assert answers == [400, 400], answers


# -- attacks that held ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"Respgate-Event-Dialect": "x" * 10_000}, ""),
        ({"OpenResponses-Version": "y" * 10_000}, ""),
        ({}, "?event_dialect=" + "z" * 2_000),  # a 10 KB URL is refused by the WebSocket layer itself
    ],
    ids=["dialect-header", "version-header", "ws-query"],
)
def test_an_overlong_value_is_a_400_that_echoes_a_bounded_part_of_it(make_gateway, headers, query):
    live = make_gateway()
    if query:
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(live, query=query)
        resp = refused.value.response
        assert resp.status_code == 400
        message = json.loads(resp.body)["error"]["message"]
    else:
        r = httpx.post(
            live.base_url + "/responses",
            json={"model": MODEL, "input": "hi", "stream": True},
            headers=headers,
            timeout=30,
        )
        assert r.status_code == 400, r.text[:300]
        message = r.json()["error"]["message"]
    assert len(message) < 300, len(message)


@pytest.mark.parametrize(
    "headers",
    [
        {"Respgate-Event-Dialect": "OpenResponses"},
        {"Respgate-Event-Dialect": "OPENRESPONSES"},
        {"OpenResponses-Version": "LATEST"},
    ],
)
def test_dialect_values_are_case_insensitive(make_gateway, headers):
    live = make_gateway()
    with httpx.stream(
        "POST",
        live.base_url + "/responses",
        json={"model": MODEL, **REASON, "stream": True},
        headers=headers,
        timeout=30,
    ) as r:
        raw = r.read()
    assert r.status_code == 200, raw[:300]
    check(parse_stream(raw, EventDialect.OPENRESPONSES), EventDialect.OPENRESPONSES, ws=False)


def test_done_follows_the_terminal_after_a_server_timing_comment(make_gateway):
    """Server-Timing's comment line goes before the terminal's data line, in the same write; ``[DONE]``
    is after both, once; OpenAI's dialect with the same opt-in has none."""
    live = make_gateway()
    timing = {"Respgate-Server-Timing": "1"}
    body = {"model": MODEL, **REASON, "stream": True}
    raw = httpx.post(live.base_url + "/responses", json=body, headers={**OR_HEADER, **timing}, timeout=30).content
    head, comment, tail = raw.rpartition(b": server-timing ")
    assert comment and b"[DONE]" not in head, raw[-300:]
    line, rest = tail.split(b"\n", 1)
    assert rest.startswith(b"event: response.completed\n") and rest.endswith(b"\n\n" + DONE), rest[-200:]
    events = parse_stream(head + rest, EventDialect.OPENRESPONSES)  # the comment line taken out
    assert events[-1]["type"] == "response.completed"
    check(events, EventDialect.OPENRESPONSES, ws=False)
    plain = httpx.post(live.base_url + "/responses", json=body, headers=timing, timeout=30).content
    assert b"[DONE]" not in plain and b": server-timing " in plain


def test_a_failure_mid_stream_is_valid_in_openresponses_dialect_on_both_transports(make_gateway):
    """A reasoning turn whose engine breaks halfway: every event (the failed terminal's error among
    them) validates strictly, and the SSE stream still ends with ``[DONE]`` after its terminal."""
    engine = SimulatedEngine(
        script=lambda *_: Turn(reasoning="Thinking it over.", text="This breaks.", fail_after_tokens=6)
    )
    live = make_gateway(engine=engine)
    raw = httpx.post(
        live.base_url + "/responses",
        json={"model": MODEL, "input": "hi", "stream": True},
        headers=OR_HEADER,
        timeout=30,
    ).content
    events = parse_stream(raw, EventDialect.OPENRESPONSES)
    assert events[-1]["type"] == "response.failed", types(events)
    check(events, EventDialect.OPENRESPONSES, ws=False)
    with ws_connect(live, OR_HEADER) as ws:
        frames = ws_turn(ws, {"input": "hi"})
    assert frames[-1]["type"] == "response.failed", types(frames)
    check(frames, EventDialect.OPENRESPONSES, ws=True)


def test_a_websocket_never_sends_done(make_gateway):
    """``[DONE]`` is SSE's: on a WebSocket in OpenResponses' dialect the frame after a terminal is the
    next response's ``response.created``."""
    live = make_gateway()
    with ws_connect(live, OR_HEADER) as ws:
        first = ws_turn(ws, REASON)
        second = ws_turn(ws, {"input": "again", "previous_response_id": first[-1]["response"]["id"]})
    assert second[0]["type"] == "response.created", second[0]
    assert all(isinstance(f, dict) for f in first + second)


def test_a_background_replay_past_its_end_is_only_done(make_gateway):
    """``starting_after`` at the last event: nothing to replay, and the stream is still ended the
    OpenResponses way; OpenAI's reader gets an empty stream."""
    live = make_gateway()
    body = {"model": MODEL, "input": "hi", "background": True, "stream": True}
    created = parse_stream(
        httpx.post(live.base_url + "/responses", json=body, headers=OR_HEADER, timeout=30).content,
        EventDialect.OPENRESPONSES,
    )
    rid, last = created[0]["response"]["id"], created[-1]["sequence_number"]
    url = f"{live.base_url}/responses/{rid}?stream=true&starting_after={last}"
    assert httpx.get(url, headers=OR_HEADER, timeout=30).content == DONE
    assert httpx.get(url, timeout=30).content == b""


def test_a_background_stream_follows_the_models_dialect_on_create_and_on_replay(make_gateway):
    """The operator's per-model dialect, nothing asked: the create's stream and a replay agree."""
    live = make_gateway(Settings(model_event_dialects={MODEL: "openresponses"}))
    body = {"model": MODEL, **REASON, "background": True, "stream": True}
    created = parse_stream(
        httpx.post(live.base_url + "/responses", json=body, timeout=30).content, EventDialect.OPENRESPONSES
    )
    check(created, EventDialect.OPENRESPONSES, ws=False)
    rid = created[0]["response"]["id"]
    replay = httpx.get(f"{live.base_url}/responses/{rid}?stream=true&starting_after=1", timeout=30).content
    replayed = parse_stream(replay, EventDialect.OPENRESPONSES)
    assert types(replayed) == types(created)[2:]


def test_a_stream_cut_by_the_shutdown_deadline_ends_the_openresponses_way(make_gateway):
    """The shutdown's deadline cuts an endless turn: the stream's closing events (an error, then the
    terminal of the response as billed: ``closing_events`` / ``late_terminal``) are translated like
    the rest, every event validates strictly, and ``[DONE]`` comes last, once. On a WebSocket in the
    same dialect the farewell error frame validates too."""
    engine = SimulatedEngine(script=lambda *_: Turn(text="x", endless=True, delay_per_token_s=0.005))
    live = make_gateway(Settings(shutdown_grace_s=0.5), engine=engine)
    body = {"model": MODEL, "input": "talk forever", "max_output_tokens": 100_000, "stream": True}
    with (
        ws_connect(live, OR_HEADER) as ws,
        httpx.stream("POST", live.base_url + "/responses", json=body, headers=OR_HEADER, timeout=30) as r,
    ):
        chunks = r.iter_raw()
        first = next(chunks)
        assert b"response.created" in first
        ws.send(json.dumps({"type": "response.create", **{k: v for k, v in body.items() if k != "stream"}}))
        assert json.loads(ws.recv(timeout=20))["type"] == "response.created"
        stopper = threading.Thread(target=stop_gateway, args=(live,))
        stopper.start()
        raw = first + b"".join(chunks)
        frames = []
        with contextlib.suppress(ConnectionClosed):
            while True:
                frames.append(json.loads(ws.recv(timeout=20)))
    stopper.join(30)
    events = parse_stream(raw, EventDialect.OPENRESPONSES)
    check(events, EventDialect.OPENRESPONSES, ws=False)
    assert types(events)[-2:] == ["error", "response.failed"], types(events)[-3:]
    assert events[-2]["error"]["code"] == "server_shutting_down" and events[-2]["error"]["type"] == "server_error"
    assert frames and frames[-1]["type"] == "error", frames[-1:]
    check(frames, EventDialect.OPENRESPONSES, ws=True)


def test_a_background_stream_cancelled_while_read_ends_the_openresponses_way(make_gateway):
    """A reader follows a background response in OpenResponses' dialect from the middle
    (``starting_after``); the response is cancelled meanwhile: the reader's stream ends with the
    terminal of the cancelled response, every event valid, then ``[DONE]`` once."""
    engine = SimulatedEngine(script=lambda *_: Turn(text="x", endless=True, delay_per_token_s=0.005))
    live = make_gateway(engine=engine)
    body = {"model": MODEL, "input": "talk forever", "max_output_tokens": 100_000, "background": True, "stream": True}
    with httpx.stream("POST", live.base_url + "/responses", json=body, headers=OR_HEADER, timeout=30) as r:
        lines = r.iter_lines()
        data = next(
            line for line in lines if line.startswith("data: ")
        )  # its first event; leaving stops the reading only
    rid = json.loads(data.removeprefix("data: "))["response"]["id"]
    url = f"{live.base_url}/responses/{rid}?stream=true&starting_after=3"
    with httpx.stream("GET", url, headers=OR_HEADER, timeout=30) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        cancel = httpx.post(f"{live.base_url}/responses/{rid}/cancel", timeout=30)
        assert cancel.status_code == 200, cancel.text
        raw = first + b"".join(chunks)
    events = parse_stream(raw, EventDialect.OPENRESPONSES)
    check(events, EventDialect.OPENRESPONSES, ws=False)
    # neither SDK nor document has a cancelled event: the terminal is ``response.failed``, status cancelled
    assert events[0]["sequence_number"] == 4 and events[-1]["type"] == "response.failed", types(events)[-3:]
    assert events[-1]["response"]["status"] == "cancelled", events[-1]["response"]["status"]
