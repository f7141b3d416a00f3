"""The Response object, echoing the effective settings with OpenAI's defaults filled in."""

from __future__ import annotations

import time
from typing import Any

from gateway.wire.request import CreateRequest


def response_skeleton(
    req: CreateRequest, *, response_id: str, model: str, tools: list[dict[str, Any]], store: bool
) -> dict[str, Any]:
    """A Response in status ``in_progress`` with ``output: []`` and ``usage: null``."""
    text: dict[str, Any] = {"format": {"type": "text"}, "verbosity": "medium"}
    if req.text is not None:
        if req.text.format is not None:
            text["format"] = req.text.format.model_dump(by_alias=True, exclude_none=True)
        if req.text.verbosity is not None:
            text["verbosity"] = req.text.verbosity
    reasoning: dict[str, Any] = {"effort": None, "summary": None}
    if req.reasoning is not None:
        reasoning["effort"] = req.reasoning.effort
        reasoning["summary"] = req.reasoning.summary or req.reasoning.generate_summary
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "model": model,
        "output": [],
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": req.prompt_cache_key,
        "prompt_cache_retention": req.prompt_cache_retention,
        "reasoning": reasoning,
        "safety_identifier": req.safety_identifier,
        "service_tier": req.service_tier or "auto",
        "store": store,
        "temperature": 1.0 if req.temperature is None else float(req.temperature),
        "text": text,
        "tool_choice": "auto" if req.tool_choice is None else req.tool_choice,
        "tools": tools,
        "top_logprobs": req.top_logprobs or 0,
        "top_p": 1.0 if req.top_p is None else float(req.top_p),
        "truncation": req.truncation or "disabled",
        "usage": None,
        "user": req.user,
        "metadata": dict(req.metadata or {}),
    }


def usage_object(input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }
