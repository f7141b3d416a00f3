"""The prepare pool's choice by a frame's text length (gateway/turn/offload.py ``weight_bound``).

A body parsed from a small text is kept inline without walking it, which is only right if no body
weighs more than ``weight_bound`` of its text's length: checked here against the walk, on random
JSON documents and on the shapes that weigh most per character (empty items, empty parts, numbers
written short and serialized long), and end to end through ``for_body`` with the text's length (what
``TurnContext.body_bytes`` carries from the transport), and through a WebSocket continuation.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.turn.offload import INLINE, PrepareOffload, weight, weight_bound, written_bound
from gateway.wire.validation import decode_json

UNLIMITED = 1 << 60

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_json = st.recursive(
    _scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=5), st.dictionaries(st.text(max_size=4), kids, max_size=5)),
    max_leaves=40,
)


def _texts(body: Any) -> list[str]:
    """The body as a client may write it: compact, spaced, ASCII-escaped (integers past 64 bits too,
    which orjson parses as floats)."""
    return [
        json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        json.dumps(body, separators=(",", ":")),
        json.dumps(body, indent=1),
    ]


def _assert_bounded(text: str) -> None:
    body = orjson.loads(text)
    assert weight(body, UNLIMITED) <= weight_bound(len(text)), text
    assert weight(body, UNLIMITED) <= weight_bound(len(text.encode())), text


@settings(max_examples=300, deadline=None)
@given(
    input_=_json,
    rest=st.dictionaries(st.sampled_from(["instructions", "tools", "text", "metadata"]), _json, max_size=3),
)
def test_no_body_weighs_more_than_its_text_bound(input_: Any, rest: dict[str, Any]) -> None:
    body = {**rest, "input": input_}
    for text in _texts(body):
        _assert_bounded(text)
    assert weight(body, UNLIMITED) <= written_bound(body)


def test_the_heaviest_shapes_per_character_are_bounded() -> None:
    for text in [
        '{"input":' + "[" + ",".join(["{}"] * 500) + "]}",  # empty items
        '{"input":[{"content":[' + ",".join(["{}"] * 500) + "]}]}",  # empty parts
        '{"input":[{"":{"":{}}}]}',
        '{"input":{"":{}}}',
        '{"input":[[[[{}]]]]}',
        '{"input":[' + ",".join(["0"] * 500) + "]}",  # short scalars
        '{"input":"","text":[' + ",".join(["1e15"] * 500) + "]}",  # floats written long
        '{"input":"","metadata":{"a":[' + ",".join(["-9e15"] * 200) + "]}}",
        '{"input":"","tools":["' + "\U0001f600" * 300 + '"]}',  # 4 UTF-8 bytes a character
        '{"input":[],"x":' + "[" * 40 + "]" * 40 + "}",
        "{}",
        "[]",
        '"x"',
    ]:
        _assert_bounded(text)


def test_the_heaviest_shapes_are_bounded_by_their_json_too() -> None:
    for body in [
        {"input": [{}] * 500},
        {"input": [{"content": [{}] * 500}]},
        {"input": [0] * 500},
        {"input": "", "text": [1e15] * 500},
        {"input": [{"": {"": {}}}]},
        {"tools": ["\U0001f600" * 50]},
    ]:
        assert weight(body, UNLIMITED) <= written_bound(body)


def test_a_coding_agents_frame_is_inline_by_its_json() -> None:
    offload = PrepareOffload(inline_bytes=32 * 1024, threads=1)
    try:
        tools = [
            {
                "type": "function",
                "name": f"tool_{i}",
                "description": "d" * 800,
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            }
            for i in range(10)
        ]
        frame = json.dumps(
            {
                "type": "response.create",
                "model": "m",
                "previous_response_id": "resp_1",
                "tools": tools,
                "input": [{"role": "user", "content": "step 1: continue"}],
            }
        )
        body = decode_json(frame, 64)
        assert weight_bound(len(frame)) > offload.inline_bytes
        assert written_bound(body) <= offload.inline_bytes
        assert offload.for_body(body, len(frame)) is INLINE and offload.offloaded == 0
        assert weight(body, offload.inline_bytes) <= offload.inline_bytes  # the walk says the same
    finally:
        offload.close()


def test_a_small_frame_is_inline_by_its_length_and_agrees_with_the_walk() -> None:
    offload = PrepareOffload(inline_bytes=32 * 1024, threads=1)
    try:
        frame = (
            '{"type":"response.create","model":"m","previous_response_id":"resp_1",'
            '"input":[{"role":"user","content":"step 1: continue"}]}'
        )
        body = decode_json(frame, 64)
        assert weight_bound(len(frame)) <= offload.inline_bytes
        assert offload.for_body(body, len(frame)) is INLINE
        assert weight(body, offload.inline_bytes) <= offload.inline_bytes  # the walk says the same
        assert offload.offloaded == 0
    finally:
        offload.close()


def test_what_the_length_cannot_clear_is_walked() -> None:
    offload = PrepareOffload(inline_bytes=1024, threads=1)
    try:
        # 300 characters: the bound (20,700) is over the limit, so the walk decides — and finds it heavy
        frame = '{"input":[' + ",".join(["{}"] * 99) + "]}"
        assert weight_bound(len(frame)) > offload.inline_bytes
        body = decode_json(frame, 64)
        assert offload.for_body(body, len(frame)) is not INLINE and offload.offloaded == 1
        light = '{"input":"' + "x" * 100 + '"}'
        # the bound is over the limit too: the walk clears it
        assert offload.for_body(decode_json(light, 64), len(light)) is INLINE
        # a text over the limit is never cleared by its length: the walk decides
        assert offload.for_body(body, offload.inline_bytes + 1) is not INLINE and offload.offloaded == 2
    finally:
        offload.close()


def test_a_websocket_continuation_carries_its_frames_length_to_prepare(gateway, monkeypatch) -> None:
    """The frame's length reaches the offload choice (``TurnContext.body_bytes``), so a short
    continuation is not walked; an HTTP create carries its body's bytes the same way."""
    from gateway.turn import offload as offload_module
    from tests.ws_helpers import create, send, until_terminal, ws_open

    walks: list[int] = []
    real = offload_module.weight
    monkeypatch.setattr(offload_module, "weight", lambda body, limit: walks.append(1) or real(body, limit))
    seen: list[Any] = []
    pipeline = gateway.gw.pipeline
    real_for_body = pipeline.offload.for_body
    monkeypatch.setattr(pipeline.offload, "for_body", lambda body, n=None: seen.append(n) or real_for_body(body, n))
    with ws_open(gateway) as ws:
        send(ws, create(input="hello", store=False))
        first = until_terminal(ws)[-1]["response"]
        frame = orjson.dumps(create(input="step 1: continue", store=False, previous_response_id=first["id"])).decode()
        send(ws, frame)
        assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert seen[-1] == len(frame) and not walks
    body = orjson.dumps({"model": first["model"], "input": "over HTTP", "store": False})
    r = httpx.post(
        f"{gateway.base_url}/responses", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert seen[-1] == len(body) and not walks
