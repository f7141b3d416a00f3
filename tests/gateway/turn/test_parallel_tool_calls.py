"""``parallel_tool_calls: false`` yields at most one call per response (issue 13.4), per model family.

Harmony (gpt-oss, the simulated engine): ``<|call|>`` is a stop token, so a turn ends at its first
call by itself. Chat templates (Hermes ``<tool_call>`` blocks): a model may write several calls in
one turn; with the flag off the gateway stops the engine after the first and keeps the canonical
rendering of that call as the history, so the next turn still appends.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.base.settings import Settings
from inference.registry import ModelRegistry, ModelRoute
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.conftest import MODEL
from tests.http_helpers import post
from tests.turn_helpers import TokenScriptEngine

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in response["output"] if o["type"] == "function_call"]


def test_harmony_turn_ends_at_its_first_call(make_gateway):
    two = (ToolCall("get_weather", {"city": "Oslo"}), ToolCall("get_weather", {"city": "Bergen"}))
    engine = SimulatedEngine(
        script=turns_in_order([Turn(tool_calls=two)] * 2, then=lambda v: Turn(text="ok")), eos_token_ids=()
    )  # the engine itself would sample both calls
    live = make_gateway(Settings(), engine=engine)
    for parallel in (False, True):
        r = post(live, {"model": MODEL, "input": "weather?", "tools": TOOLS, "parallel_tool_calls": parallel})
        assert r.status_code == 200 and len(calls(r.json())) == 1, r.text  # <|call|> stops the turn
        assert r.json()["parallel_tool_calls"] is parallel


class ChatMLEngine(TokenScriptEngine):
    """Emits a fixed completion (token by token) whatever the prompt: a chat-template model that
    writes two tool calls in one turn. Counts aborts (the consumer closing the stream early)."""

    name = "chatml-fake"


@pytest.fixture
def chat_template_gateway(make_gateway, smollm2_dir_root):
    from inference.chat_template_render import ChatTemplateRenderer

    renderer = ChatTemplateRenderer(smollm2_dir_root)
    tok = renderer.tokenizer

    def body(city: str) -> str:
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>' % city

    two_calls = tok.encode(body("Oslo") + "\n" + body("Bergen"), add_special_tokens=False) + [
        renderer.stop_token_ids[0]
    ]
    answer = tok.encode("It is sunny.", add_special_tokens=False) + [renderer.stop_token_ids[0]]
    engine = ChatMLEngine([two_calls, answer])
    registry = ModelRegistry([ModelRoute(name="ct", engine=engine, renderer=renderer, max_context=4096)])  # type: ignore[arg-type]
    return make_gateway(Settings(models=["ct"]), engine=SimulatedEngine(), registry=registry), engine


@pytest.fixture(scope="session")
def smollm2_dir_root():
    from inference.model_assets import prepare_model

    return prepare_model("smollm2")


def test_chat_template_model_is_stopped_after_its_first_call(chat_template_gateway):
    live, engine = chat_template_gateway
    both = post(live, {"model": "ct", "input": "weather?", "tools": TOOLS, "store": True})
    assert both.status_code == 200 and [json.loads(c["arguments"])["city"] for c in calls(both.json())] == [
        "Oslo",
        "Bergen",
    ]
    assert engine.stats.aborts == 0

    engine.stats.prompts.clear()
    r = post(live, {"model": "ct", "input": "weather?", "tools": TOOLS, "parallel_tool_calls": False, "store": True})
    first = r.json()
    assert r.status_code == 200 and first["status"] == "completed", r.text
    assert [json.loads(c["arguments"])["city"] for c in calls(first)] == ["Oslo"]
    assert engine.stats.aborts == 1, "the engine must be stopped once the first call closed"

    # the next turn appends to the canonical rendering of the kept call (no full-render fallback)
    fallbacks = live.metric("respgate_render_full_fallbacks_total", {"reason": "not_canonical"})
    full = live.metric("respgate_render_tokens_total", {"mode": "full"})
    call = calls(first)[0]
    nxt = post(
        live,
        {
            "model": "ct",
            "previous_response_id": first["id"],
            "tools": TOOLS,
            "parallel_tool_calls": False,
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}],
        },
    )
    assert nxt.status_code == 200 and nxt.json()["output"][-1]["content"][0]["text"] == "It is sunny."
    assert live.metric("respgate_render_full_fallbacks_total", {"reason": "not_canonical"}) == fallbacks
    assert live.metric("respgate_render_tokens_total", {"mode": "full"}) == full
    p1, p2 = engine.stats.prompts[-2:]
    assert p2[: len(p1)] == p1  # the first turn's prompt is the second's prefix
