"""The Response skeleton built from the fields a create set (gateway/wire/response.py) equals the one
built by reading every field, key order included, for any create the parser accepts."""

from __future__ import annotations

import time
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.request import CreateRequest
from gateway.wire.response import EchoedTools, response_skeleton


def reference_skeleton(
    req: CreateRequest, *, response_id: str, model: str, tools: EchoedTools | None, store: bool
) -> dict[str, Any]:
    """Every field read, whether the create set it or not (the shape the skeleton must keep)."""
    text: dict[str, Any] = {"format": {"type": "text"}, "verbosity": "medium"}
    if req.text is not None:
        if req.text.format is not None:
            fmt = req.text.format.model_dump(by_alias=True)
            if fmt["type"] == "json_schema" and fmt["strict"] is None:
                fmt["strict"] = False
            text["format"] = fmt
        if req.text.verbosity is not None:
            text["verbosity"] = req.text.verbosity
    reasoning: dict[str, Any] = {
        "effort": None,
        "summary": None,
        "context": None,
        "generate_summary": None,
        "mode": None,
    }
    if req.reasoning is not None:
        reasoning["effort"] = req.reasoning.effort
        reasoning["summary"] = req.reasoning.summary or req.reasoning.generate_summary
        reasoning["generate_summary"] = req.reasoning.generate_summary
        reasoning["context"] = req.reasoning.context
        reasoning["mode"] = req.reasoning.mode
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "queued" if req.background else "in_progress",
        "access_programs": None,
        "background": bool(req.background),
        "completed_at": None,
        "conversation": {"id": req.conversation_id} if req.conversation is not None else None,
        "error": None,
        "frequency_penalty": 0.0 if req.frequency_penalty is None else float(req.frequency_penalty),
        "image": None,
        "incomplete_details": None,
        "input_transformations": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "model": model,
        "moderation": None,
        "output": [],
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "presence_penalty": 0.0 if req.presence_penalty is None else float(req.presence_penalty),
        "previous_response_id": req.previous_response_id,
        "prompt": None,
        "prompt_cache_diagnostics": None,
        "prompt_cache_key": req.prompt_cache_key,
        "prompt_cache_options": None,
        "prompt_cache_retention": req.prompt_cache_retention,
        "reasoning": reasoning,
        "safety_identifier": req.safety_identifier,
        "service_tier": req.service_tier or "auto",
        "store": store,
        "temperature": 1.0 if req.temperature is None else float(req.temperature),
        "text": text,
        "tool_choice": "auto" if req.tool_choice is None else req.tool_choice,
        "tools": tools.tools if tools is not None else [],
        "tool_usage": None,
        "top_logprobs": req.top_logprobs or 0,
        "top_p": 1.0 if req.top_p is None else float(req.top_p),
        "truncation": req.truncation or "disabled",
        "usage": None,
        "user": req.user,
        "metadata": dict(req.metadata or {}),
    }


_opt = lambda s: st.one_of(st.none(), s)  # noqa: E731
_fields = st.fixed_dictionaries(
    {},
    optional={
        "background": _opt(st.booleans()),
        "conversation": _opt(st.one_of(st.just("conv_1"), st.just({"id": "conv_2"}))),
        "frequency_penalty": _opt(st.floats(-2, 2)),
        "presence_penalty": _opt(st.floats(-2, 2)),
        "temperature": _opt(st.one_of(st.floats(0, 2), st.integers(0, 2))),
        "top_p": _opt(st.floats(0, 1)),
        "instructions": _opt(st.text(max_size=5)),
        "max_output_tokens": _opt(st.integers(16, 100)),
        "max_tool_calls": _opt(st.integers(0, 5)),
        "parallel_tool_calls": _opt(st.booleans()),
        "previous_response_id": _opt(st.just("resp_1")),
        "prompt_cache_key": _opt(st.text(max_size=5)),
        "prompt_cache_retention": _opt(st.sampled_from(["in_memory", "24h"])),
        "safety_identifier": _opt(st.text(max_size=5)),
        "service_tier": _opt(st.sampled_from(["auto", "default", "flex"])),
        "tool_choice": _opt(st.sampled_from(["none", "auto", "required", {"type": "function", "name": "f"}])),
        "top_logprobs": _opt(st.integers(0, 20)),
        "truncation": _opt(st.sampled_from(["auto", "disabled"])),
        "user": _opt(st.text(max_size=5)),
        "metadata": _opt(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3)),
        "reasoning": _opt(
            st.fixed_dictionaries(
                {},
                optional={
                    "effort": _opt(st.sampled_from(["low", "high"])),
                    "summary": _opt(st.sampled_from(["auto", "concise"])),
                    "generate_summary": _opt(st.sampled_from(["auto", "detailed"])),
                    "context": _opt(st.sampled_from(["auto", "all_turns"])),
                    "mode": _opt(st.sampled_from(["standard", "pro"])),
                },
            )
        ),
        "text": _opt(
            st.fixed_dictionaries(
                {},
                optional={
                    "verbosity": _opt(st.sampled_from(["low", "high"])),
                    "format": _opt(
                        st.sampled_from(
                            [
                                {"type": "text"},
                                {"type": "json_object"},
                                {"type": "json_schema", "name": "n", "schema": {"type": "object"}},
                                {"type": "json_schema", "name": "n", "schema": {}, "strict": True, "description": "d"},
                            ]
                        )
                    ),
                },
            )
        ),
        "store": _opt(st.booleans()),
    },
)


@settings(max_examples=400, deadline=None)
@given(fields=_fields, with_tools=st.booleans())
def test_skeleton_equals_reading_every_field(fields: dict[str, Any], with_tools: bool) -> None:
    req = CreateRequest.model_validate({"model": "m", "input": "hi", **fields})
    tools = EchoedTools([{"type": "function", "name": "f"}]) if with_tools else None
    got = response_skeleton(req, response_id="resp_x", model="m", tools=tools, store=True)
    want = reference_skeleton(req, response_id="resp_x", model="m", tools=tools, store=True)
    got["created_at"] = want["created_at"] = 0
    assert orjson.dumps(got) == orjson.dumps(want)  # values and key order


def test_each_response_has_its_own_mutable_parts() -> None:
    req = CreateRequest.model_validate({"model": "m", "input": "hi"})
    a = response_skeleton(req, response_id="a", model="m", tools=None, store=True)
    b = response_skeleton(req, response_id="b", model="m", tools=None, store=True)
    for key in ("output", "text", "reasoning", "metadata", "tools"):
        assert a[key] == b[key] and a[key] is not b[key]
    assert a["text"]["format"] is not b["text"]["format"]
