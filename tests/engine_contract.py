"""What every real engine must show through the gateway, shared by the in-process vLLM tests and
the remote-vLLM tests: chained turns reuse the parent's KV, and forced tool calls are schema-valid.

Structure only, never exact model text (greedy text depends on the numeric path).
"""

from __future__ import annotations

import json
import time

import orjson
from websockets.sync.client import ClientConnection, connect

from tests.conftest import VLLM_MODEL, LiveGateway

BLOCK = 32  # the engines' KV block size in these tests: prefix-cache hits are whole blocks
TERMINAL = ("response.completed", "response.incomplete", "response.failed")

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def expected_cached(parent_usage) -> int:
    """KV the engine holds for the parent: its prompt + every sampled token but the last (never
    fed back), in whole blocks. The continuation's prompt starts with exactly those tokens."""
    held = parent_usage.input_tokens + parent_usage.output_tokens - 1
    return held // BLOCK * BLOCK


def terminal(conn):
    """Iterate an SDK WebSocket connection to the turn's terminal event; its Response."""
    for ev in conn:
        if ev.type == "error":
            raise AssertionError(ev)
        if ev.type in TERMINAL:
            assert ev.type != "response.failed", ev
            return ev.response
    raise AssertionError("socket ended before a terminal event")


def check_http_chain_reuses_the_parents_kv(live: LiveGateway) -> None:
    client = live.openai()
    first = client.responses.create(
        model=VLLM_MODEL, input="What is the capital of France? Answer briefly.", temperature=0, max_output_tokens=32
    )
    assert first.status in ("completed", "incomplete") and first.output_text
    second = client.responses.create(
        model=VLLM_MODEL, previous_response_id=first.id, input="And of Italy?", temperature=0, max_output_tokens=32
    )
    assert second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    cached = second.usage.input_tokens_details.cached_tokens
    if first.status == "completed":
        assert cached == expected_cached(first.usage)
    else:  # a cut-off parent is re-rendered in full; its prompt prefix is still cached
        assert cached >= first.usage.input_tokens // BLOCK * BLOCK > 0


def check_ws_chain_reuses_the_parents_kv(live: LiveGateway) -> None:
    with live.openai().responses.connect() as conn:
        conn.response.create(model=VLLM_MODEL, input="Name a colour.", store=False, temperature=0, max_output_tokens=24)
        first = terminal(conn)
        conn.response.create(
            model=VLLM_MODEL,
            input="Name another one.",
            store=False,
            temperature=0,
            max_output_tokens=24,
            previous_response_id=first.id,
        )
        second = terminal(conn)
    assert first.output and second.output
    assert second.usage.input_tokens > first.usage.input_tokens
    if first.status == "completed":
        assert second.usage.input_tokens_details.cached_tokens == expected_cached(first.usage)


def check_required_tool_call_is_schema_valid(live: LiveGateway):
    r = live.openai().responses.create(
        model=VLLM_MODEL,
        input="What's the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    assert r.status == "completed", r
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("c", "f")
    return r, calls[0]


def check_warm_up_prefill_is_hit(live: LiveGateway, session: str) -> None:
    """``generate: false`` -> ``engine.prefill`` in the background; the next turn hits those blocks.
    ``session`` makes the instructions unique per suite, so no earlier turn cached them."""
    engine = live.engine
    prefills = engine.stats.prefills
    instructions = f"You answer in one short sentence. Session {session}. " * 8
    with connect(live.ws_url, max_size=None) as ws:
        ws.send(
            orjson.dumps(
                {
                    "type": "response.create",
                    "model": VLLM_MODEL,
                    "generate": False,
                    "store": False,
                    "instructions": instructions,
                    "input": [],
                }
            ).decode()
        )
        while (warm := json.loads(ws.recv(timeout=60)))["type"] != "response.completed":
            assert warm["type"] not in ("error", "response.failed"), warm
        deadline = time.monotonic() + 60  # bounded polling, no timing assertion
        while engine.stats.prefills == prefills:
            assert time.monotonic() < deadline, "no background prefill"
            time.sleep(0.05)
        ws.send(
            orjson.dumps(
                {
                    "type": "response.create",
                    "model": VLLM_MODEL,
                    "store": False,
                    "temperature": 0,
                    "max_output_tokens": 16,
                    "input": "Say hi.",
                    "instructions": instructions,
                    "previous_response_id": warm["response"]["id"],
                }
            ).decode()
        )
        while (done := json.loads(ws.recv(timeout=120)))["type"] not in ("response.completed", "response.incomplete"):
            assert done["type"] not in ("error", "response.failed"), done
    warm_tokens = warm["response"]["usage"]["input_tokens"]
    cached = done["response"]["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= (warm_tokens - 1) // BLOCK * BLOCK > 0


def start_long_story(live: LiveGateway, deltas: int = 3) -> ClientConnection:
    """Open a socket, start a long generation and return once ``deltas`` text deltas arrived."""
    ws = connect(live.ws_url, max_size=None)
    ws.send(
        orjson.dumps(
            {
                "type": "response.create",
                "model": VLLM_MODEL,
                "temperature": 1.0,
                "seed": 7,
                "max_output_tokens": 2000,
                "input": "Write a very long story about a dragon, with many chapters.",
            }
        ).decode()
    )
    seen = 0
    while seen < deltas:
        ev = json.loads(ws.recv(timeout=120))
        assert ev["type"] not in ("error", "response.failed", "response.completed"), ev
        seen += ev["type"] == "response.output_text.delta"
    return ws
