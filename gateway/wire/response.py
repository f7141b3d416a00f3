"""The Response object, echoing the effective settings with OpenAI's defaults filled in.

Every field of the openai SDK's ``Response`` type and of the OpenResponses ``ResponseResource``
schema is present (``tests/test_schemas.py`` validates real responses against both): what the
gateway does not use is an explicit ``null`` (``conversation``, ``prompt``, ...), never a missing key,
and what OpenResponses types as a plain number or string (``presence_penalty``, ``service_tier``,
``top_logprobs``) always has a value.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import orjson

from gateway.wire.request import CreateRequest


class EchoedTools:
    """A tool set as Responses echo it, and that list's JSON, built once for every turn that offers it.

    Why: a coding agent re-sends the same ~40 KB of tools with every continuation, and its Response
    carries them in three events of every turn (``created``, ``in_progress``, the terminal): three
    serializations of the same list a turn. The transports write :attr:`json` in their place
    (``gateway.turn.events.wire_event``); the Response dict itself keeps the list (:attr:`tools`,
    shared by the turns of that tool set and never changed), so everything that reads or stores
    Responses sees what it always did."""

    __slots__ = ("source", "tools", "json", "nbytes")

    def __init__(self, tools: Sequence[dict[str, Any]]) -> None:
        #: the tools it was built from: a cached echo is used only for tools equal to these
        self.source = tuple(tools)
        self.tools = [echoed_tool(t) for t in tools]
        raw = orjson.dumps(self.tools)
        self.json = orjson.Fragment(raw)
        self.nbytes = 3 * len(raw) + 256  # the source, the list and its JSON, roughly

    def echoes(self, tools: Sequence[dict[str, Any]]) -> bool:
        """Whether these are the tools it echoes (a deep comparison in C, no serialization)."""
        return self.source == tuple(tools)


def response_skeleton(
    req: CreateRequest, *, response_id: str, model: str, tools: EchoedTools | None, store: bool
) -> dict[str, Any]:
    """A Response in status ``in_progress`` (``queued`` for a background one) with ``output: []`` and
    ``usage: null``; ``tools`` as :class:`EchoedTools` builds them (None: no tools)."""
    text: dict[str, Any] = {"format": {"type": "text"}, "verbosity": "medium"}
    if req.text is not None:
        if req.text.format is not None:
            fmt = req.text.format.model_dump(by_alias=True)  # json_schema: description and strict too
            if fmt["type"] == "json_schema" and fmt["strict"] is None:
                fmt["strict"] = False  # OpenAI's default; OpenResponses types it as a boolean
            text["format"] = fmt
        if req.text.verbosity is not None:
            text["verbosity"] = req.text.verbosity
    reasoning: dict[str, Any] = {"effort": None, "summary": None, "context": None, "generate_summary": None,
                                 "mode": None}
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
        "prompt": None,  # stored prompts are refused (gateway/turn/checks.py)
        "prompt_cache_diagnostics": None,
        "prompt_cache_key": req.prompt_cache_key,
        "prompt_cache_options": None,  # none are applied
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


#: the optional keys the SDK declares per tool type, echoed as null when the request left them out
_TOOL_KEYS: dict[str, tuple[str, ...]] = {
    "function": ("allowed_callers", "async", "defer_loading", "description", "output_schema", "parameters",
                 "strict"),
    "custom": ("allowed_callers", "async", "defer_loading", "description", "format"),
    "namespace": ("description",),
}


def echoed_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the Response echoes it: a copy with every declared key present."""
    out = dict(tool)
    for key in _TOOL_KEYS.get(out.get("type", ""), ()):
        out.setdefault(key, None)
    if out.get("type") == "namespace":
        out["tools"] = [echoed_tool(sub) for sub in out.get("tools") or []]
    return out


def usage_object(input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0,
                                 "cache_write_tokens_details": None},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }
