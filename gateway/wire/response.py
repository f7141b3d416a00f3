"""The Response object, echoing the effective settings with OpenAI's defaults filled in.

Every field of the openai SDK's ``Response`` type and of the OpenResponses ``ResponseResource``
schema is present (``tests/gateway/wire/test_schemas.py`` validates real responses against both): what the
gateway does not use is an explicit ``null`` (``conversation``, ``prompt``, ...), never a missing key,
and what OpenResponses types as a plain number or string (``presence_penalty``, ``service_tier``,
``top_logprobs``) always has a value.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

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
    ``usage: null``; ``tools`` as :class:`EchoedTools` builds them (None: no tools).

    Built from :data:`_SKELETON` (every key in order, each setting at what the Response says when
    the create left it out), then the settings the create did give (``model_fields_set``: what the
    body held; a short continuation gives one, ``previous_response_id``) — so a turn pays for the
    fields it sets, not for all forty."""
    out = _SKELETON.copy()
    out["id"] = response_id
    out["created_at"] = int(time.time())
    out["model"] = model
    out["output"] = []
    out["reasoning"] = _NO_REASONING.copy()
    out["store"] = store
    out["text"] = {"format": {"type": "text"}, "verbosity": "medium"}
    out["tools"] = tools.tools if tools is not None else []
    out["metadata"] = {}
    given = req.model_fields_set & _ECHOED.keys()
    for name in given:
        _ECHOED[name](out, req)
    return out


#: the Response of a create that set nothing it echoes (``id``, ``created_at``, ``model``, ``output``,
#: ``reasoning``, ``store``, ``text``, ``tools`` and ``metadata`` are filled in per response)
_SKELETON: dict[str, Any] = {
    "id": None,
    "object": "response",
    "created_at": None,
    "status": "in_progress",
    "access_programs": None,
    "background": False,
    "completed_at": None,
    "conversation": None,
    "error": None,
    "frequency_penalty": 0.0,
    "image": None,
    "incomplete_details": None,
    "input_transformations": None,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "model": None,
    "moderation": None,
    "output": None,
    "parallel_tool_calls": True,
    "presence_penalty": 0.0,
    "previous_response_id": None,
    "prompt": None,  # stored prompts are refused (gateway/turn/checks.py)
    "prompt_cache_diagnostics": None,
    "prompt_cache_key": None,
    "prompt_cache_options": None,  # none are applied
    "prompt_cache_retention": None,
    "reasoning": None,
    "safety_identifier": None,
    "service_tier": "auto",
    "store": None,
    "temperature": 1.0,
    "text": None,
    "tool_choice": "auto",
    "tools": None,
    "tool_usage": None,
    "top_logprobs": 0,
    "top_p": 1.0,
    "truncation": "disabled",
    "usage": None,
    "user": None,
    "metadata": None,
}
_NO_REASONING: dict[str, Any] = {
    "effort": None,
    "summary": None,
    "context": None,
    "generate_summary": None,
    "mode": None,
}


def _background(out: dict[str, Any], req: CreateRequest) -> None:
    out["status"] = "queued" if req.background else "in_progress"
    out["background"] = bool(req.background)


def _conversation(out: dict[str, Any], req: CreateRequest) -> None:
    out["conversation"] = {"id": req.conversation_id} if req.conversation is not None else None


def _text(out: dict[str, Any], req: CreateRequest) -> None:
    if req.text is None:
        return
    text = out["text"]
    if req.text.format is not None:
        fmt = req.text.format.model_dump(by_alias=True)  # json_schema: description and strict too
        if fmt["type"] == "json_schema" and fmt["strict"] is None:
            fmt["strict"] = False  # OpenAI's default; OpenResponses types it as a boolean
        text["format"] = fmt
    if req.text.verbosity is not None:
        text["verbosity"] = req.text.verbosity


def _reasoning(out: dict[str, Any], req: CreateRequest) -> None:
    if req.reasoning is None:
        return
    reasoning = out["reasoning"]
    reasoning["effort"] = req.reasoning.effort
    reasoning["summary"] = req.reasoning.summary or req.reasoning.generate_summary
    reasoning["generate_summary"] = req.reasoning.generate_summary
    reasoning["context"] = req.reasoning.context
    reasoning["mode"] = req.reasoning.mode


def _default(key: str, default: Any, cast: Any = None) -> Any:
    """The create's value of ``key`` (``cast`` when given), or ``default`` where it is null."""

    def echo(out: dict[str, Any], req: CreateRequest) -> None:
        value = getattr(req, key)
        out[key] = default if value is None else value if cast is None else cast(value)

    return echo


def _same(key: str) -> Any:
    def echo(out: dict[str, Any], req: CreateRequest) -> None:
        out[key] = getattr(req, key)

    return echo


def _or(key: str, default: Any) -> Any:
    def echo(out: dict[str, Any], req: CreateRequest) -> None:
        value = getattr(req, key)
        out[key] = value or default

    return echo


def _metadata(out: dict[str, Any], req: CreateRequest) -> None:
    out["metadata"] = dict(req.metadata or {})


#: each create field the Response echoes, and how (run only for the fields a create set)
_ECHOED: dict[str, Any] = {
    "background": _background,
    "conversation": _conversation,
    "frequency_penalty": _default("frequency_penalty", 0.0, float),
    "instructions": _same("instructions"),
    "max_output_tokens": _same("max_output_tokens"),
    "max_tool_calls": _same("max_tool_calls"),
    "parallel_tool_calls": _default("parallel_tool_calls", True),
    "presence_penalty": _default("presence_penalty", 0.0, float),
    "previous_response_id": _same("previous_response_id"),
    "prompt_cache_key": _same("prompt_cache_key"),
    "prompt_cache_retention": _same("prompt_cache_retention"),
    "reasoning": _reasoning,
    "safety_identifier": _same("safety_identifier"),
    "service_tier": _or("service_tier", "auto"),
    "temperature": _default("temperature", 1.0, float),
    "text": _text,
    "tool_choice": _default("tool_choice", "auto"),
    "top_logprobs": _or("top_logprobs", 0),
    "top_p": _default("top_p", 1.0, float),
    "truncation": _or("truncation", "disabled"),
    "user": _same("user"),
    "metadata": _metadata,
}


#: the optional keys the SDK declares per tool type, echoed as null when the request left them out
_TOOL_KEYS: dict[str, tuple[str, ...]] = {
    "function": ("allowed_callers", "async", "defer_loading", "description", "output_schema", "parameters", "strict"),
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
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": 0,
            "cache_write_tokens_details": None,
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }
