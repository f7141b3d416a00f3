"""Server-Timing: what a turn cost, stage by stage, told to the client.

A JSON create always carries the header; a stream (SSE comment line before the terminal event)
and a WebSocket connection (a ``server_timing`` field on terminal events) carry it only when the
client opts in (``Respgate-Server-Timing: 1``) — and the real openai SDK parses either stream
the same way, opted in or not.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from websockets.sync.client import connect

from tests.conftest import MODEL

#: W3C Server Timing: ``metric *( OWS ";" OWS param )``, metrics separated by commas
METRIC = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+);dur=(\d+(?:\.\d+)?)$")
RUN = {"engine_submit", "engine_ttft", "streaming", "finalize", "billing"}
PREPARE = {"validate", "resolve", "classify", "render"}
OPT_IN = {"Respgate-Server-Timing": "1"}


def parse(value: str) -> dict[str, float]:
    """The header value as stage -> milliseconds; asserts the syntax and the arithmetic."""
    out: dict[str, float] = {}
    for part in value.split(","):
        m = METRIC.fullmatch(part.strip())
        assert m, part
        assert m.group(1) not in out, value  # each stage once
        out[m.group(1)] = float(m.group(2))
    assert list(out)[-1] == "total"
    total = out["total"]
    stages = {k: v for k, v in out.items() if k != "total"}
    assert all(v <= total for v in stages.values()), value
    assert sum(stages.values()) <= total + 0.001 * len(stages), value  # contiguous laps of one clock (rounding)
    return out


def test_json_create_carries_server_timing_with_every_stage(gateway):
    r = httpx.post(f"{gateway.base_url}/responses", json={"model": MODEL, "input": "hi"}, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "completed"
    timing = parse(r.headers["server-timing"])
    assert PREPARE | RUN | {"store", "total"} <= set(timing), timing  # store=true: the write is awaited
    # a refused create has no turn to time
    bad = httpx.post(
        f"{gateway.base_url}/responses",
        json={"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"},
        timeout=30,
    )
    assert bad.status_code == 400 and "server-timing" not in bad.headers  # previous_response_not_found


def _raw_stream(gateway: Any, headers: dict[str, str]) -> str:
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/responses",
        headers=headers,
        timeout=30,
        json={"model": MODEL, "input": "hi", "stream": True, "store": False},
    ) as r:
        assert r.status_code == 200 and "server-timing" not in r.headers
        return r.read().decode()


def test_sse_timing_is_a_comment_before_the_terminal_event_only_when_asked(gateway):
    assert ": server-timing" not in _raw_stream(gateway, {})
    text = _raw_stream(gateway, OPT_IN)
    comments = [line for line in text.split("\n") if line.startswith(":")]
    assert len(comments) == 1, comments
    block = next(b for b in text.split("\n\n") if b.startswith(": server-timing "))
    lines = block.split("\n")
    assert lines[1] == "event: response.completed" and lines[2].startswith("data: ")  # the terminal's own frame
    timing = parse(lines[0].removeprefix(": server-timing "))
    assert PREPARE | RUN <= set(timing) and "store" not in timing  # store=false


def test_the_openai_sdk_reads_an_opted_in_stream_as_it_reads_any(gateway):
    client = gateway.openai()
    plain = [ev.type for ev in client.responses.create(model=MODEL, input="hi", stream=True)]
    opted = list(client.responses.create(model=MODEL, input="hi", stream=True, extra_headers=OPT_IN))
    assert [ev.type for ev in opted] == plain and plain[-1] == "response.completed"
    assert opted[-1].response.status == "completed"
    # the non-streaming SDK call sees the header on its raw response
    raw = client.responses.with_raw_response.create(model=MODEL, input="hi")
    assert parse(raw.headers["server-timing"])["total"] > 0 and raw.parse().status == "completed"


def _ws_turn(url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    with connect(url, additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
        events = []
        while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
            events.append(json.loads(ws.recv(timeout=30)))
    return events


def test_websocket_timing_rides_the_terminal_event_only_when_asked(gateway):
    plain = _ws_turn(gateway.ws_url, {})
    assert not any("server_timing" in ev for ev in plain)
    for url, headers in ((gateway.ws_url, OPT_IN), (gateway.ws_url + "?server_timing=1", {})):
        events = _ws_turn(url, headers)
        assert [ev["type"] for ev in events] == [ev["type"] for ev in plain]  # no event added
        assert [ev["sequence_number"] for ev in events] == list(range(len(events)))
        assert ["server_timing" in ev for ev in events] == [False] * (len(events) - 1) + [True]
        assert PREPARE | RUN <= set(parse(events[-1]["server_timing"]))


def test_the_openai_sdk_over_websocket_sees_nothing_unless_asked(gateway):
    client = gateway.openai()
    for extra, expect in (({}, False), ({"extra_headers": OPT_IN}, True)):
        with client.responses.connect(**extra) as conn:
            conn.response.create(model=MODEL, input="hi", store=False)
            types = []
            for ev in conn:
                types.append(ev.type)
                if ev.type == "response.completed":
                    break
        assert types[0] == "response.created" and types[-1] == "response.completed"
        extras = ev.model_extra or {}
        assert ("server_timing" in extras) is expect, extras
        if expect:
            parse(extras["server_timing"])
