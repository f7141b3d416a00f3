"""Property test over the request and item schemas: JSON types x placements, over real uvicorn.

Where ``test_fuzz.py`` throws random documents, this one is systematic: it takes a *valid* create
body that uses every structured field (tools, tool_choice, text, reasoning, metadata, context
management, and an ``input`` holding every item kind: messages with parts, function and custom
tool calls with their outputs, reasoning) and a valid conversation, and replaces each value in
it — every field of the create body and of each item kind, at every depth the schemas have, and
the body itself — by a value of each JSON type: strings (short and long), numbers, booleans,
null, arrays (short and long), objects and nested values; a seeded generator draws the concrete
values (the same run every time; every placement gets every type). Not hypothesis: one run is
~2,000 values, far past what one hypothesis example may draw, and an example per placement would
sample the placements instead of covering them.

Each mutant goes to ``POST /v1/responses``, as a WebSocket ``response.create`` frame, into a
conversation (``POST /v1/conversations`` with ``items``, and ``POST .../items``) — and, when a
conversation accepted the items, a turn is run on it (an item stored must never make a turn fail)
— and as the whole body of every JSON endpoint. The properties:

* never a 5xx (HTTP status, WebSocket error ``status``, or a ``response.failed`` whose error is a
  server error);
* every refusal has the documented error shape (``{"error": {message, type, param, code}}``, on
  WebSocket ``error`` with ``status``), and a 400 names the ``param`` it is about;
* the server keeps serving (a valid request after each family succeeds).

It finds what issue 28's items 11-13 were (a long non-object body, an orphan conversation item, an
object as ``tool_choice.type``): the lead checked that it fails on the code before them.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection

from gateway.base.settings import Settings
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import assert_still_serving, parse_sse
from tests.ws_helpers import recv, send, ws_open

pytestmark = pytest.mark.timeout(600)

Path = tuple[Any, ...]
SEED = 28

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": False,
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
]

#: every item kind a create's input or a conversation holds, valid, calls followed by their outputs
ITEMS = [
    {"type": "message", "role": "developer", "content": "Be brief."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the weather?"}]},
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "id": "fc_1",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "done"}]},
    {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "thinking"}],
        "content": [{"type": "reasoning_text", "text": "hmm"}],
    },
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
    {"role": "user", "content": "thanks"},
]

CREATE = {
    "model": MODEL,
    "input": ITEMS,
    "instructions": "You are terse.",
    "tools": TOOLS,
    "tool_choice": {"type": "function", "name": "get_weather"},
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}, "verbosity": "low"},
    "reasoning": {"effort": "low", "summary": "auto"},
    "metadata": {"k": "v"},
    "temperature": 0.5,
    "top_p": 0.9,
    "max_output_tokens": 16,
    "store": True,
    "truncation": "disabled",
    "include": ["reasoning.encrypted_content"],
    "user": "u1",
    "prompt_cache_key": "k",
    "service_tier": "auto",
    "seed": 7,
    "max_tool_calls": 4,
    "top_logprobs": 0,
    "stream": False,
    "context_management": [{"type": "compaction", "compact_threshold": 100_000}],
    "previous_response_id": None,
    "conversation": None,
    "safety_identifier": "s1",
}

CONVERSATION = {"items": ITEMS[1:], "metadata": {"topic": "weather"}}
JSON_ENDPOINTS = [
    "/responses",
    "/responses/input_tokens",
    "/responses/compact",
    "/conversations",
    "/conversations/{conv}",
    "/conversations/{conv}/items",
]

#: the JSON types a value is replaced by (the long ones pass 475 bytes: the prepare weighing's threshold),
#: each drawn from a seeded generator: the same values every run
_CHARS = 'ab \\"\u00e9\u4e2d\U0001f600\x00\n{}[]:,0-_.'


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(n))


def _scalar(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            False,
            rng.randint(-(2**53), 2**53),
            _text(rng, rng.randint(0, 8)),
            "function",
            "message",
            "user",
            "call_1",
            MODEL,
        ]
    )


def _nested(rng: random.Random, depth: int = 0) -> Any:
    if depth >= 3 or rng.random() < 0.25:
        return _scalar(rng)
    if rng.random() < 0.5:
        return [_nested(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    return {_text(rng, rng.randint(0, 5)): _nested(rng, depth + 1) for _ in range(rng.randint(0, 2))}


KINDS: dict[str, Callable[[random.Random], Any]] = {
    "string": lambda rng: _text(rng, rng.randint(0, 8)),
    "long string": lambda rng: _text(rng, rng.randint(600, 700)),
    "integer": lambda rng: rng.choice([0, -1, 2**53, rng.randint(-(2**31), 2**31)]),
    "decimal": lambda rng: rng.choice([0.5, -1e300, 1e-9, rng.uniform(-1e6, 1e6)]),
    "bool": lambda rng: rng.random() < 0.5,
    "null": lambda rng: None,
    "array": lambda rng: [_scalar(rng) for _ in range(rng.randint(0, 3))],
    "long array": lambda rng: [rng.randint(0, 9) for _ in range(rng.randint(250, 260))],
    "object": lambda rng: {_text(rng, rng.randint(1, 5)): _scalar(rng) for _ in range(rng.randint(0, 3))},
    "nested": lambda rng: [_nested(rng)] if rng.random() < 0.5 else {"k": _nested(rng), "type": _nested(rng)},
}


def placements(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path to a value inside ``value`` (object keys and array indexes, at every depth)."""
    if isinstance(value, dict):
        children: Any = value.items()
    elif isinstance(value, list):
        children = enumerate(value)
    else:
        return
    for key, child in children:
        yield (*prefix, key)
        yield from placements(child, (*prefix, key))


def replaced(base: Any, path: Path, value: Any) -> Any:
    out = copy.deepcopy(base)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def shown(path: Path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "<body>"


class Seen:
    """What the run saw (asserted on, and printed for the note)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


def check_http(r: httpx.Response, where: str) -> None:
    assert r.status_code < 500, f"{where}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), where
        body = r.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, (where, body)
        if r.status_code == 400:
            assert isinstance(body["error"]["param"], str) and body["error"]["param"], (where, body)
    elif r.headers["content-type"].startswith("text/event-stream"):  # ``stream`` became true
        events = parse_sse(r.content)
        assert events and events[-1]["type"] in (
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
        ), (where, events[-1:])
        for ev in events:
            if ev["type"] == "error":
                assert ev.get("code") != "server_error", (where, ev)
            elif "response" in ev:
                check_response(ev["response"], where)
    else:
        body = r.json()
        if body.get("object") == "response":
            check_response(body, where)


def check_response(response: dict[str, Any], where: str) -> None:
    err = response.get("error")
    assert response["status"] != "failed" or (err and err.get("code") != "server_error"), (where, err)


def ws_answer(ws: ClientConnection, where: str) -> str:
    """Read one create's frames up to its final one; check it; return its type."""
    while True:
        ev = recv(ws, timeout=30)
        kind = ev["type"]
        if kind == "error":
            assert ev["status"] < 500, (where, ev)
            assert set(ev["error"]) >= {"type", "code", "message", "param"}, (where, ev)
            if ev["status"] == 400:
                assert isinstance(ev["error"]["param"], str) and ev["error"]["param"], (where, ev)
            return kind
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            check_response(ev["response"], where)
            return kind


@pytest.fixture(scope="module")
def live(request) -> Iterator[LiveGateway]:
    from tests.conftest import start_gateway, stop_gateway

    gw = start_gateway(Settings(usage_journal=None, keys_file=None))
    yield gw
    stop_gateway(gw)


def each_mutant(rng: random.Random, base: Any) -> Iterator[tuple[str, Any]]:
    """``(where, mutant)`` for every placement in ``base`` (and ``base`` itself) x every JSON type."""
    for path in [(), *placements(base)]:
        for kind, make in KINDS.items():
            value = make(rng)
            yield f"{shown(path)} <- {kind}", value if path == () else replaced(base, path, value)


def test_create_bodies_over_http_and_websocket(live: LiveGateway) -> None:
    seen = Seen()

    def run(rng: random.Random) -> None:
        with httpx.Client(base_url=live.base_url, timeout=30) as client, ws_open(live) as ws:
            for where, body in each_mutant(rng, CREATE):
                r = client.post(
                    "/responses", content=json.dumps(body).encode(), headers={"content-type": "application/json"}
                )
                check_http(r, f"HTTP {where}")
                seen.add(f"http {r.status_code}")
                frame = {"type": "response.create", **body} if isinstance(body, dict) else body
                send(ws, json.dumps(frame))
                seen.add(f"ws {ws_answer(ws, f'WS {where}')}")

    run(random.Random(SEED))
    assert seen.counts.get("http 200", 0) > 50 and seen.counts.get("http 400", 0) > 300, seen.counts
    ran = seen.counts.get("ws response.completed", 0) + seen.counts.get("ws response.incomplete", 0)
    assert ran > 50 and seen.counts.get("ws error", 0) > 300, seen.counts
    assert_still_serving(live)


def test_conversation_items_and_a_turn_on_what_was_accepted(live: LiveGateway) -> None:
    seen = Seen()

    def run(rng: random.Random) -> None:
        with httpx.Client(base_url=live.base_url, timeout=30) as client:

            def post(path: str, body: Any) -> httpx.Response:
                return client.post(
                    path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
                )

            def turn_on(conv: str, where: str) -> None:
                r = post(
                    "/responses", {"model": MODEL, "input": "and now?", "conversation": conv, "max_output_tokens": 16}
                )
                check_http(r, f"turn after {where}")
                seen.add(f"turn {r.status_code}")

            for where, body in each_mutant(rng, CONVERSATION):
                r = post("/conversations", body)
                check_http(r, f"create {where}")
                seen.add(f"create {r.status_code}")
                if r.status_code == 200:
                    turn_on(r.json()["id"], f"create {where}")
            # each item kind alone, as it is and with each of its fields replaced, appended to a
            # conversation holding a user message (alone, a tool output has no call before it)
            mutants = [(f"{item['type'] if 'type' in item else 'message'} alone", {"items": [item]}) for item in ITEMS]
            for item in ITEMS:
                mutants += [
                    (f"alone: {where}", body)
                    for where, body in each_mutant(rng, {"items": [item]})
                    if where != "<body>"
                ]
            for where, body in mutants:
                conv = post("/conversations", {"items": [{"role": "user", "content": "hi"}]}).json()["id"]
                r = post(f"/conversations/{conv}/items", body)
                check_http(r, f"append {where}")
                seen.add(f"append {r.status_code}")
                if r.status_code == 200:
                    turn_on(conv, f"append {where}")

    run(random.Random(SEED))
    assert seen.counts.get("create 400", 0) > 100 and seen.counts.get("append 400", 0) > 100, seen.counts
    assert seen.counts.get("turn 200", 0) > 50, seen.counts
    assert_still_serving(live)


def test_every_json_endpoint_with_any_json_as_its_body(live: LiveGateway) -> None:
    conv = httpx.post(live.base_url + "/conversations", json={}, timeout=30).json()["id"]

    def run(rng: random.Random) -> None:
        with httpx.Client(base_url=live.base_url, timeout=30) as client:
            for path in JSON_ENDPOINTS:
                for kind, make in KINDS.items():
                    if kind == "object":
                        continue  # an object is a body: its fields are the other tests' business
                    value = make(rng)
                    r = client.post(
                        path.format(conv=conv),
                        content=json.dumps(value).encode(),
                        headers={"content-type": "application/json"},
                    )
                    check_http(r, f"{path} <- {kind}")
                    assert r.status_code == 400, (path, kind, r.text)

    run(random.Random(SEED))
    assert_still_serving(live)
