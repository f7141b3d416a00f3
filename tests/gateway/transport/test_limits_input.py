"""Input bounds that hold before the work (issue 14, cases 1 and 9): JSON nesting depth, frame size in bytes.

Deep nesting used to reach code that recurses (orjson writes at most 255 levels, the prelude key,
harmony's constraint builder) and answer a plain-text 500; now every body and frame is checked at
parse time against ``max_json_depth`` and refused with a 400 naming the parameter. WebSocket frames
were bounded in characters; now in UTF-8 bytes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gateway.base.settings import Settings
from tests.conftest import MODEL
from tests.http_helpers import assert_error, post


def nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"x": node}}
    return node


def deep_list(depth: int) -> list[Any]:
    node: list[Any] = []
    for _ in range(depth):
        node = [node]
    return node


def tool(depth: int) -> dict[str, Any]:
    return {"type": "function", "name": "deep", "parameters": nested(depth)}


@pytest.mark.parametrize(
    "field,body",
    [
        ("tools", {"tools": [tool(130)]}),
        ("text", {"text": {"format": {"type": "json_schema", "name": "s", "schema": nested(200)}}}),
        ("tool_choice", {"tool_choice": {"type": "function", "name": "f", "x": deep_list(270)}}),
        ("input", {"input": [{"role": "user", "content": "hi", "extra": nested(300)}]}),
    ],
)
def test_deep_nesting_is_a_400_naming_the_parameter(gateway, field, body):
    r = post(gateway, {"model": MODEL, **body})
    assert_error(r, 400, code="invalid_value", param=field)
    assert "nested deeper than 64 levels" in r.json()["error"]["message"]
    # the same over the other JSON endpoints
    assert post(gateway, {"model": MODEL, **body}, path="/responses/input_tokens").status_code == 400


def test_a_reasonably_nested_schema_is_served(gateway):
    r = post(gateway, {"model": MODEL, "input": "hi", "tools": [tool(25)]})  # 51 levels of JSON
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text


def test_deep_frames_get_an_error_frame_and_the_socket_lives(gateway):
    with connect(gateway.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "tools": [tool(100)]}))
        err = json.loads(ws.recv(timeout=10))
        assert err["type"] == "error" and err["status"] == 400 and err["error"]["param"] == "tools"
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
        while (ev := json.loads(ws.recv(timeout=10)))["type"] != "response.completed":
            assert ev["type"] != "error", ev


def test_frame_limit_counts_bytes_not_characters(make_gateway):
    live = make_gateway(Settings(max_request_bytes=30_000))
    text = "中" * 12_000  # 12,000 characters, 36,000 bytes
    with connect(live.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": text}, ensure_ascii=False))
        err = json.loads(ws.recv(timeout=10))
        assert err["type"] == "error" and err["status"] == 413, err
        assert err["error"]["code"] == "request_too_large"


def test_size_and_depth_refusals_are_counted(make_gateway):
    live = make_gateway(Settings(max_request_bytes=30_000))
    assert post(live, {"model": MODEL, "tools": [tool(130)]}).status_code == 400
    assert post(live, {"model": MODEL, "input": "x" * 40_000}).status_code == 413
    with connect(live.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "tools": [tool(100)]}))
        assert json.loads(ws.recv(timeout=10))["status"] == 400
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "中" * 12_000}, ensure_ascii=False))
        assert json.loads(ws.recv(timeout=10))["status"] == 413
    for transport in ("http", "ws"):
        for reason in ("size", "depth"):
            assert live.metric("respgate_input_rejections_total", {"transport": transport, "reason": reason}) == 1


def test_rate_connection_and_queue_refusals_are_counted(make_gateway):
    from inference.simulated import SimulatedEngine
    from inference.simulated_script import Turn, turns_in_order

    slow = SimulatedEngine(script=turns_in_order([], then=lambda v: Turn(text="slow " * 30, delay_per_token_s=0.02)))
    live = make_gateway(Settings(rate_limit_rpm=2, ws_max_connections_per_key=1, ws_max_queued=1), engine=slow)
    assert post(live, {"model": MODEL, "input": "one"}).status_code == 200
    assert post(live, {"model": MODEL, "input": "two"}).status_code == 200
    assert post(live, {"model": MODEL, "input": "three"}).status_code == 429
    assert live.metric("respgate_rate_limit_rejections_total", {"transport": "http", "limit": "requests"}) == 1
    live2 = make_gateway(Settings(ws_max_connections_per_key=1, ws_max_queued=1), engine=slow)
    with connect(live2.ws_url) as ws:
        with pytest.raises(InvalidStatus) as refused:
            with connect(live2.ws_url):
                pass
        assert refused.value.response.status_code == 429
        assert live2.metric("respgate_rate_limit_rejections_total", {"transport": "ws", "limit": "connections"}) == 1
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "a", "store": False}))
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "b", "store": False}))
        frames = []
        while True:
            frames.append(json.loads(ws.recv(timeout=10)))
            if frames[-1]["type"] == "response.completed":
                break
        assert any(f["type"] == "error" and f["status"] == 429 for f in frames)
    assert live2.metric("respgate_rate_limit_rejections_total", {"transport": "ws", "limit": "queue"}) == 1


def test_items_and_tools_per_request_are_capped_before_validation(make_gateway):
    live = make_gateway(Settings(max_input_items=50, max_tools=4))
    items = [{"role": "user", "content": "hi"}] * 51
    r = post(live, {"model": MODEL, "input": items})
    assert_error(r, 400, code="array_above_max_length", param="input")
    tools = [{"type": "function", "name": f"t{i}", "parameters": {"type": "object"}} for i in range(5)]
    assert_error(
        post(live, {"model": MODEL, "input": "hi", "tools": tools}), 400, code="array_above_max_length", param="tools"
    )
    with connect(live.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": items}))
        err = json.loads(ws.recv(timeout=10))
        assert err["status"] == 400 and err["error"]["param"] == "input"
    assert post(live, {"model": MODEL, "input": items[:50], "tools": tools[:4]}).status_code == 200
    assert live.metric("respgate_input_rejections_total", {"transport": "http", "reason": "count"}) == 2
    assert live.metric("respgate_input_rejections_total", {"transport": "ws", "reason": "count"}) == 1


def test_a_compression_bomb_is_closed_before_it_inflates(make_gateway):
    """permessage-deflate: a frame of one repeated byte compresses a thousandfold; the server inflates
    at most max_request_bytes + 64 KiB of it and closes 1009 (message too big). (It used to read up
    to twice max_request_bytes: with the default 32 MiB, one 64 KB frame became 63 MiB.)"""
    from websockets.exceptions import ConnectionClosed

    live = make_gateway(Settings(max_request_bytes=100_000))
    with connect(live.ws_url, compression="deflate", max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "a" * 180_000}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    # within the slack an oversized frame is still answered with a 413 frame and the socket lives
    with connect(live.ws_url, compression="deflate") as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "a" * 120_000}))
        assert json.loads(ws.recv(timeout=10))["status"] == 413
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
        while json.loads(ws.recv(timeout=10))["type"] != "response.completed":
            pass


def test_a_schema_over_max_schema_bytes_is_a_400_naming_it(make_gateway):
    live = make_gateway(Settings(max_schema_bytes=4096))
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 40} for i in range(100)}}
    small = {"type": "object", "properties": {"a": {"type": "string"}}}
    tools = [
        {"type": "function", "name": "ok", "parameters": small},
        {"type": "function", "name": "big", "parameters": big},
    ]
    r = post(live, {"model": MODEL, "input": "hi", "tools": tools})
    assert_error(r, 400, code="invalid_value", param="tools[1].parameters")
    assert "schema too large" in r.json()["error"]["message"]
    fmt = {"format": {"type": "json_schema", "name": "s", "schema": big}}
    assert_error(
        post(live, {"model": MODEL, "input": "hi", "text": fmt}), 400, code="invalid_value", param="text.format.schema"
    )
    ns = [{"type": "namespace", "name": "n", "description": "x", "tools": [tools[1]]}]
    assert (
        post(live, {"model": MODEL, "input": "hi", "tools": ns}).json()["error"]["param"]
        == "tools[0].tools[0].parameters"
    )
    with connect(live.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "tools": tools}))
        err = json.loads(ws.recv(timeout=10))
        assert err["type"] == "error" and err["status"] == 400 and err["error"]["param"] == "tools[1].parameters"
    assert live.metric("respgate_input_rejections_total", {"transport": "http", "reason": "schema"}) == 3
    assert live.metric("respgate_input_rejections_total", {"transport": "ws", "reason": "schema"}) == 1
    assert post(live, {"model": MODEL, "input": "hi", "tools": tools[:1]}).status_code == 200


def test_the_bracket_count_shortcut_refuses_exactly_what_the_walk_refuses():
    """``decode_json`` walks the document only when it has more opening brackets than the limit
    allows levels: a document is refused by it exactly when ``check_depth`` refuses it, whatever
    its brackets in strings, its shape, and whether it came as text or bytes."""
    import random

    import orjson
    import pytest

    from gateway.wire.validation import InputRejected, check_depth, decode_json

    rng = random.Random(5)

    def doc(depth: int) -> Any:
        if depth == 0:
            return rng.choice(["{[", "x", 1, None, "]]}"])
        kids = [doc(depth - 1) for _ in range(rng.randint(1, 2))]
        return kids if rng.random() < 0.5 else {str(i): k for i, k in enumerate(kids)}

    for _ in range(400):
        limit = rng.randint(1, 8)
        body = doc(rng.randint(0, 10))
        for raw in (orjson.dumps(body), orjson.dumps(body).decode()):
            try:
                check_depth(body, limit)
                walked = None
            except InputRejected as err:
                walked = err.message
            if walked is None:
                assert decode_json(raw, limit) == body
            else:
                with pytest.raises(InputRejected) as caught:
                    decode_json(raw, limit)
                assert caught.value.message == walked
