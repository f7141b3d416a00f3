"""``POST /v1/responses`` (non-streaming): create, validation, echo, usage, tools, reasoning, chaining.

One test (or a small group) per line of the "Create", "Tools", "Structured output & reasoning" and
"Chaining & storage" sections of spec/responses-http.md §8. The official openai SDK is used where it
can express the case; raw httpx where the wire bytes or an invalid body matter. The simulated engine
(scripted via ``turns_in_order``) is the only fake; ``record_prompts=True`` lets recall tests read
exactly what the model was shown.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.conftest import MODEL
from tests.http_helpers import assert_error, assert_still_serving, create, message_text, post

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def scripted(*turns: Turn, then=None) -> SimulatedEngine:
    return SimulatedEngine(script=turns_in_order(turns, then=then), record_prompts=True)


def prompt_messages(live, index: int = -1):
    return PromptView(live.engine.stats.prompts[index]).messages()


def prompt_texts(live, index: int = -1) -> list[str]:
    return [m.text for m in prompt_messages(live, index)]


# ---------------------------------------------------------------------------------------------
# Create (non-streaming)
# ---------------------------------------------------------------------------------------------


def test_create_minimal_returns_completed_message_with_consistent_usage(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="Hello there!")))
    resp = live.openai().responses.create(model=MODEL, input="hi")
    assert resp.object == "response"
    assert re.fullmatch(r"resp_[0-9a-f]{32,}", resp.id)
    assert resp.status == "completed"
    messages = [o for o in resp.output if o.type == "message"]
    assert len(messages) == 1
    assert messages[0].role == "assistant" and messages[0].id.startswith("msg_")
    assert [p.type for p in messages[0].content] == ["output_text"]
    assert resp.output_text == "Hello there!"
    u = resp.usage
    assert u.input_tokens > 0 and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    # the engine really received a prompt of that many tokens
    assert u.input_tokens == len(live.engine.stats.prompts[-1])


def test_create_echoes_defaults(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="ok")))
    r = post(live, {"model": MODEL, "input": "hi"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["store"] is True
    assert body["temperature"] == 1.0 and body["top_p"] == 1.0
    assert body["tool_choice"] == "auto"
    assert body["parallel_tool_calls"] is True
    assert body["truncation"] == "disabled"
    assert body["text"]["format"] == {"type": "text"}
    assert body["metadata"] == {}
    assert body["background"] is False
    assert isinstance(body["completed_at"], int) and body["completed_at"] >= body["created_at"]
    for key in (
        "id",
        "object",
        "created_at",
        "error",
        "incomplete_details",
        "instructions",
        "model",
        "tools",
        "output",
        "parallel_tool_calls",
        "metadata",
        "tool_choice",
        "temperature",
        "top_p",
    ):
        assert key in body, key
    assert body["error"] is None and body["incomplete_details"] is None and body["instructions"] is None


def test_create_echoes_request_settings(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="ok")))
    body = create(
        live,
        input="hi",
        temperature=0.25,
        top_p=0.5,
        metadata={"k": "v"},
        store=False,
        text={"verbosity": "low"},
        max_output_tokens=64,
        parallel_tool_calls=False,
    )
    assert body["temperature"] == 0.25 and body["top_p"] == 0.5
    assert body["metadata"] == {"k": "v"} and body["store"] is False
    assert body["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert body["max_output_tokens"] == 64 and body["parallel_tool_calls"] is False


def test_usage_has_all_detail_fields(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="thinking it over", text="done")))
    body = create(live, input="hi")
    u = body["usage"]
    assert set(u["input_tokens_details"]) >= {"cached_tokens", "cache_write_tokens"}
    assert "reasoning_tokens" in u["output_tokens_details"]
    assert 0 < u["output_tokens_details"]["reasoning_tokens"] <= u["output_tokens"]
    assert 0 <= u["input_tokens_details"]["cached_tokens"] <= u["input_tokens"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]


def test_missing_model_is_400_missing_required_parameter(make_gateway):
    live = make_gateway()
    r = post(live, {"input": "hi"})
    assert_error(
        r, 400, code="missing_required_parameter", param="model", message="Missing required parameter: 'model'."
    )
    assert_still_serving(live)


def test_unknown_model_is_404_model_not_found(make_gateway):
    live = make_gateway()
    with pytest.raises(openai.NotFoundError) as exc:
        live.openai().responses.create(model="no-such-model", input="hi")
    assert exc.value.status_code == 404
    assert exc.value.code == "model_not_found"
    r = post(live, {"model": "no-such-model", "input": "hi"})
    assert_error(
        r,
        404,
        code="model_not_found",
        param=None,
        message="The model `no-such-model` does not exist or you do not have access to it.",
    )
    assert live.engine.stats.requests == 0
    assert_still_serving(live)


def test_max_output_tokens_below_minimum_is_400(make_gateway):
    live = make_gateway()
    with pytest.raises(openai.BadRequestError) as exc:
        live.openai().responses.create(model=MODEL, input="hi", max_output_tokens=8)
    assert exc.value.code == "integer_below_min_value"
    assert exc.value.param == "max_output_tokens"
    r = post(live, {"model": MODEL, "input": "hi", "max_output_tokens": 8})
    assert_error(
        r,
        400,
        code="integer_below_min_value",
        param="max_output_tokens",
        message="Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 8 instead.",
    )


def test_max_output_tokens_wrong_type_is_400_invalid_type(make_gateway):
    live = make_gateway()
    r = post(live, {"model": MODEL, "input": "hi", "max_output_tokens": "lots"})
    assert_error(
        r,
        400,
        code="invalid_type",
        param="max_output_tokens",
        message="Invalid type for 'max_output_tokens': expected an integer, but got a string instead.",
    )
    assert live.engine.stats.requests == 0


def test_unknown_top_level_field_is_400_unknown_parameter(make_gateway):
    live = make_gateway()
    with pytest.raises(openai.BadRequestError) as exc:
        live.openai().responses.create(model=MODEL, input="hi", extra_body={"frobnicate": True})
    assert exc.value.code == "unknown_parameter"
    assert exc.value.param == "frobnicate"
    assert_error(
        post(live, {"model": MODEL, "input": "hi", "frobnicate": 1}),
        400,
        code="unknown_parameter",
        param="frobnicate",
        message="Unknown parameter: 'frobnicate'.",
    )


def test_ws_only_fields_are_unknown_over_http(make_gateway):
    live = make_gateway()
    for field, value in (("type", "response.create"), ("generate", False), ("stream_id", "a")):
        assert_error(
            post(live, {"model": MODEL, "input": "hi", field: value}), 400, code="unknown_parameter", param=field
        )


def test_max_output_tokens_cap_makes_response_incomplete(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="word " * 200)))
    body = create(live, input="Write a long essay.", max_output_tokens=16)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["completed_at"] is None
    assert body["output"] and body["output"][-1]["status"] == "incomplete"
    assert body["usage"] is not None and body["usage"]["output_tokens"] == 16
    assert body["max_output_tokens"] == 16


def test_backend_failure_non_streaming_is_a_failed_response_not_retried(make_gateway):
    """A failure after the response exists is a 200 Response with status failed: an HTTP 5xx
    would make the SDK retry (generate and bill again)."""
    live = make_gateway(engine=scripted(Turn(text="This answer will break halfway through.", fail_after_tokens=5)))
    resp = live.openai(max_retries=2).responses.create(model=MODEL, input="hi")
    assert resp.status == "failed"
    assert resp.error is not None and resp.error.code == "server_error"
    assert live.engine.stats.requests == 1  # not retried by the SDK: one generation
    assert_still_serving(live)


def test_array_input_with_all_message_roles_is_accepted(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="ok")))
    body = create(
        live,
        input=[
            {"role": "system", "content": "SYS-RULE"},
            {"role": "developer", "content": "DEV-RULE"},
            {"role": "user", "content": "USER-QUESTION"},
            {"role": "assistant", "content": "ASSISTANT-ANSWER"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "USER-PARTS"}]},
        ],
    )
    assert body["status"] == "completed"
    seen = [(m.role, m.text) for m in prompt_messages(live)]
    for pair in (
        ("system", "SYS-RULE"),
        ("developer", "DEV-RULE"),
        ("user", "USER-QUESTION"),
        ("assistant", "ASSISTANT-ANSWER"),
        ("user", "USER-PARTS"),
    ):
        assert pair in seen, (pair, seen)


def test_assistant_message_with_input_text_part_is_400(make_gateway):
    live = make_gateway()
    r = post(live, {"model": MODEL, "input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]})
    err = assert_error(r, 400, code="invalid_value")
    assert err["param"].startswith("input[0]")
    assert "'input_text'" in err["message"] and "'output_text' and 'refusal'" in err["message"]
    assert live.engine.stats.requests == 0


def test_instructions_applied_echoed_and_not_inherited(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="Bonjour"), Turn(text="Hello")))
    client = live.openai()
    first = client.responses.create(model=MODEL, input="hi", instructions="Always answer in Klingon-7.")
    assert first.instructions == "Always answer in Klingon-7."
    assert any("Always answer in Klingon-7." in t for t in prompt_texts(live, 0))
    second = client.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    assert second.instructions is None
    texts = prompt_texts(live, 1)
    assert not any("Klingon-7" in t for t in texts)
    assert "hi" in texts and "Bonjour" in texts  # the chain itself is inherited


# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------


def test_function_tool_without_strict_is_echoed_strict_true(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="ok")))
    body = create(live, input="hi", tools=[WEATHER_TOOL])
    assert len(body["tools"]) == 1
    tool = body["tools"][0]
    assert tool["type"] == "function" and tool["name"] == "get_weather"
    assert tool["strict"] is True
    body = create(live, input="hi", tools=[dict(WEATHER_TOOL, strict=False)])
    assert body["tools"][0]["strict"] is False


def test_model_chosen_function_call_output_item(make_gateway):
    live = make_gateway(
        engine=scripted(Turn(reasoning="need weather", tool_calls=(ToolCall("get_weather", {"city": "Paris"}),)))
    )
    resp = live.openai().responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL])
    assert resp.status == "completed"
    calls = [o for o in resp.output if o.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.id != call.call_id
    assert call.name == "get_weather"
    assert isinstance(call.arguments, str) and json.loads(call.arguments) == {"city": "Paris"}
    assert call.status == "completed"
    assert resp.output[-1].type == "function_call"


def test_function_call_output_follow_up_produces_final_answer(make_gateway):
    # turn 1 calls the tool; turn 2 uses the default script, which reports the tool's output
    live = make_gateway(engine=scripted(Turn(tool_calls=(ToolCall("get_weather", {"city": "Paris"}),))))
    client = live.openai()
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL])
    call = next(o for o in first.output if o.type == "function_call")
    second = client.responses.create(
        model=MODEL,
        tools=[WEATHER_TOOL],
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21C and sunny"}],
    )
    assert second.status == "completed"
    assert second.previous_response_id == first.id
    assert second.output_text == "Tool get_weather returned: 21C and sunny"
    last = prompt_messages(live)[-1]
    assert last.role == "tool" and last.author == "functions.get_weather" and last.text == "21C and sunny"


def test_function_call_output_with_unknown_call_id_is_400(make_gateway):
    live = make_gateway()
    r = post(
        live,
        {
            "model": MODEL,
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "call_nope", "output": "x"},
            ],
        },
    )
    assert_error(r, 400, param="input", message="No tool call found for function call output with call_id call_nope.")
    assert live.engine.stats.requests == 0


def test_function_call_without_output_in_full_history_is_400(make_gateway):
    live = make_gateway()
    r = post(
        live,
        {
            "model": MODEL,
            "tools": [WEATHER_TOOL],
            "input": [
                {"role": "user", "content": "Weather?"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            ],
        },
    )
    assert_error(r, 400, param="input", message="No tool output found for function call call_1.")
    # the same history with the output is fine
    body = create(
        live,
        tools=[WEATHER_TOOL],
        input=[
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
        ],
    )
    assert body["status"] == "completed"


def test_function_call_chain_without_output_is_400(make_gateway):
    live = make_gateway(engine=scripted(Turn(tool_calls=(ToolCall("get_weather", {"city": "Rome"}),))))
    first = create(live, input="Weather in Rome?", tools=[WEATHER_TOOL])
    r = post(
        live, {"model": MODEL, "tools": [WEATHER_TOOL], "previous_response_id": first["id"], "input": "never mind"}
    )
    call_id = first["output"][-1]["call_id"]
    assert_error(r, 400, param="input", message=f"No tool output found for function call {call_id}.")


def test_custom_tool_call_item_and_output_next_turn(make_gateway):
    # grammar-constrained sampling is out of scope here; this checks the item shapes and pairing
    tool = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /[\\s\\S]+/"},
    }
    live = make_gateway(
        engine=scripted(Turn(tool_calls=(ToolCall("apply_patch", "*** Begin Patch\n*** End Patch", custom=True),)))
    )
    first = create(live, input="fix it", tools=[tool])
    call = first["output"][-1]
    assert call["type"] == "custom_tool_call" and call["id"].startswith("ctc_")
    assert call["call_id"].startswith("call_") and call["name"] == "apply_patch"
    assert call["input"] == "*** Begin Patch\n*** End Patch"
    second = create(
        live,
        tools=[tool],
        previous_response_id=first["id"],
        input=[{"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "patched"}],
    )
    assert message_text(second) == "Tool apply_patch returned: patched"


def test_namespace_tool_calls_carry_namespace(make_gateway):
    ns_tool = {
        "type": "namespace",
        "name": "weather",
        "description": "Weather tools.",
        "tools": [
            {
                "type": "function",
                "name": "current",
                "description": "Current weather.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }
        ],
    }
    live = make_gateway(engine=scripted(Turn(tool_calls=(ToolCall("current", {"city": "Lima"}, namespace="weather"),))))
    client = live.openai()
    first = client.responses.create(model=MODEL, input="Weather in Lima?", tools=[ns_tool])
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "current"
    assert call.namespace == "weather"
    second = client.responses.create(
        model=MODEL,
        tools=[ns_tool],
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "warm"}],
    )
    assert second.output_text == "Tool current returned: warm"
    assert prompt_messages(live)[-1].author == "weather.current"
    # the echoed tools keep the namespace structure
    assert first.tools[0].type == "namespace"


def test_hosted_tool_is_stripped_by_default(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="ok")))
    body = create(live, input="hi", tools=[{"type": "web_search"}, WEATHER_TOOL])
    assert body["status"] == "completed"
    assert [t["type"] for t in body["tools"]] == ["function"]
    dev = [m for m in prompt_messages(live) if m.role == "developer"]
    assert dev and "get_weather" in dev[0].text and "web_search" not in dev[0].text
    # counted, per request (the second sends the same list: a cache hit of the checked tools)
    stripped = {"type": "web_search"}
    assert live.metric("respgate_hosted_tools_stripped_total", stripped) == 1
    create(live, input="again", tools=[{"type": "web_search"}, WEATHER_TOOL])
    create(live, input="preview", tools=[{"type": "web_search_preview"}])
    assert live.metric("respgate_hosted_tools_stripped_total", stripped) == 2
    assert live.metric("respgate_hosted_tools_stripped_total", {"type": "web_search_preview"}) == 1


def test_hosted_tool_rejected_when_configured(make_gateway):
    live = make_gateway(Settings(hosted_tools="reject"))
    with pytest.raises(openai.BadRequestError) as exc:
        live.openai().responses.create(model=MODEL, input="hi", tools=[WEATHER_TOOL, {"type": "web_search"}])
    assert exc.value.code == "unsupported_value"
    assert exc.value.param == "tools[1].type"
    assert_error(
        post(live, {"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]}),
        400,
        code="unsupported_value",
        param="tools[0].type",
    )
    assert live.engine.stats.requests == 0
    assert_still_serving(live)


# ---------------------------------------------------------------------------------------------
# Reasoning
# ---------------------------------------------------------------------------------------------

SECRET_REASONING = "The capital question needs care; answer Zanzibar-42."


def test_encrypted_reasoning_round_trip_stateless(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning=SECRET_REASONING, text="Zanzibar-42"), Turn(text="ok")))
    first = create(live, input="What is the code?", store=False, include=["reasoning.encrypted_content"])
    reasoning = first["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    blob = reasoning["encrypted_content"]
    assert isinstance(blob, str) and blob and "Zanzibar" not in blob
    # the response was not stored: a stateless follow-up replays everything, reasoning as the blob only
    assert post(live, {"model": MODEL, "input": "x", "previous_response_id": first["id"]}).status_code == 400
    replay = [
        {"role": "user", "content": "What is the code?"},
        {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": blob},
        first["output"][1],
        {"role": "user", "content": "Why?"},
    ]
    second = create(live, input=replay, store=False, include=["reasoning.encrypted_content"])
    assert second["status"] == "completed"
    analysis = [m for m in prompt_messages(live, 1) if m.role == "assistant" and m.channel == "analysis"]
    assert [m.text for m in analysis] == [SECRET_REASONING]


def test_encrypted_content_absent_unless_included(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="hmm", text="ok")))
    body = create(live, input="hi")
    assert body["output"][0]["type"] == "reasoning"
    assert not body["output"][0].get("encrypted_content")


def test_tampered_encrypted_content_is_400(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning=SECRET_REASONING, text="Zanzibar-42")))
    first = create(live, input="q", store=False, include=["reasoning.encrypted_content"])
    blob = first["output"][0]["encrypted_content"]
    flipped = blob[:-6] + ("A" if blob[-6] != "A" else "B") + blob[-5:]
    for bad in (flipped, "not-a-blob", blob[:20]):
        r = post(
            live,
            {
                "model": MODEL,
                "store": False,
                "input": [
                    {"role": "user", "content": "q"},
                    {"type": "reasoning", "id": "rs_x1", "summary": [], "encrypted_content": bad},
                    {"role": "user", "content": "more"},
                ],
            },
        )
        assert_error(r, 400, param="input[1].encrypted_content")
    assert live.engine.stats.requests == 1
    assert_still_serving(live)


def test_reasoning_summary_auto_produces_summary_text(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="Let me think about the weather.", text="Sunny")))
    resp = live.openai().responses.create(model=MODEL, input="hi", reasoning={"summary": "auto"})
    assert resp.reasoning.summary == "auto"
    item = resp.output[0]
    assert item.type == "reasoning"
    assert [s.type for s in item.summary] == ["summary_text"]
    assert item.summary[0].text == "Let me think about the weather."
    assert resp.output_text == "Sunny"


def test_reasoning_without_summary_has_empty_summary(make_gateway):
    live = make_gateway(engine=scripted(Turn(reasoning="private thoughts", text="Sunny")))
    body = create(live, input="hi")
    assert body["reasoning"] == {
        "effort": None,
        "summary": None,
        "context": None,
        "generate_summary": None,
        "mode": None,
    }
    item = body["output"][0]
    assert item["type"] == "reasoning" and item["summary"] == []
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


# ---------------------------------------------------------------------------------------------
# Chaining & storage
# ---------------------------------------------------------------------------------------------


def test_previous_response_id_recalls_input_and_output(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="Nice to meet you, Quintus."), Turn(text="Quintus")))
    client = live.openai()
    first = client.responses.create(model=MODEL, input="My name is Quintus.")
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert first.previous_response_id is None
    msgs = [(m.role, m.text) for m in prompt_messages(live, 1)]
    assert msgs[-3:] == [
        ("user", "My name is Quintus."),
        ("assistant", "Nice to meet you, Quintus."),
        ("user", "What is my name?"),
    ]


def test_previous_response_id_of_unstored_response_is_400(make_gateway):
    live = make_gateway()
    first = create(live, input="hi", store=False)
    r = post(live, {"model": MODEL, "input": "again", "previous_response_id": first["id"]})
    assert_error(
        r,
        400,
        code="previous_response_not_found",
        param="previous_response_id",
        message=f"Previous response with id '{first['id']}' not found.",
    )


def test_unknown_previous_response_id_is_400_with_exact_message(make_gateway):
    live = make_gateway()
    with pytest.raises(openai.BadRequestError) as exc:
        live.openai().responses.create(model=MODEL, input="hi", previous_response_id="resp_doesnotexist")
    assert exc.value.code == "previous_response_not_found"
    assert exc.value.param == "previous_response_id"
    assert_error(
        post(live, {"model": MODEL, "input": "hi", "previous_response_id": "resp_doesnotexist"}),
        400,
        code="previous_response_not_found",
        param="previous_response_id",
        message="Previous response with id 'resp_doesnotexist' not found.",
    )
    assert live.engine.stats.requests == 0


def test_previous_response_id_with_conversation_is_400(make_gateway):
    live = make_gateway()
    first = create(live, input="hi")
    r = post(live, {"model": MODEL, "input": "x", "previous_response_id": first["id"], "conversation": "conv_1"})
    err = assert_error(r, 400)
    assert err["param"] in ("conversation", "previous_response_id")


def test_duplicate_item_id_in_chain_is_400(make_gateway):
    live = make_gateway()
    item = {"type": "message", "id": "msg_client_dup_1", "role": "user", "content": "hello"}
    first = create(live, input=[item])
    r = post(live, {"model": MODEL, "input": [item], "previous_response_id": first["id"]})
    err = assert_error(r, 400, param="input")
    assert err["message"].startswith("Duplicate item found with id msg_client_dup_1")
    # replaying a server-made output item of the parent is a duplicate too
    out = first["output"][-1]
    r = post(
        live, {"model": MODEL, "input": [out, {"role": "user", "content": "x"}], "previous_response_id": first["id"]}
    )
    assert_error(r, 400, param="input")
    # and so is the same id twice in one request
    r = post(live, {"model": MODEL, "input": [item, dict(item, content="again")]})
    assert_error(r, 400, param="input")


def test_item_reference_resolves_and_unknown_is_400(make_gateway):
    live = make_gateway(engine=scripted(Turn(text="noted"), Turn(text="pineapple")))
    first = create(
        live,
        input=[{"type": "message", "id": "msg_ref_1", "role": "user", "content": "The secret fruit is pineapple."}],
    )
    second = create(
        live,
        previous_response_id=first["id"],
        input=[{"type": "item_reference", "id": "msg_ref_1"}, {"role": "user", "content": "Which fruit?"}],
    )
    assert second["status"] == "completed"
    texts = prompt_texts(live, 1)
    assert texts.count("The secret fruit is pineapple.") == 2  # inherited + referenced
    assert texts[-1] == "Which fruit?"
    r = post(
        live,
        {
            "model": MODEL,
            "previous_response_id": first["id"],
            "input": [{"type": "item_reference", "id": "msg_unknown"}],
        },
    )
    err = assert_error(r, 400)
    assert "msg_unknown" in err["message"] and err["param"].startswith("input[0]")


def test_store_false_response_is_not_retrievable(make_gateway):
    live = make_gateway()
    client = live.openai()
    resp = client.responses.create(model=MODEL, input="hi", store=False)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
