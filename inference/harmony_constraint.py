"""Structured-output constraints for harmony (gpt-oss): xgrammar structural tags over token ids.

gpt-oss answers in channels, so a constraint cannot cover the whole output with one JSON schema
the way a chat-template model's can: the model may first think (``analysis``), then must emit the
call header ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>``, arguments that
follow the tool's own JSON schema, and ``<|call|>``. Harmony's markers are special tokens, so they
are matched as token ids (``{"type": "token"}``) rather than as text; the free parts (the optional
reasoning, the recipient, ``json``) are text. The same shape serves ``text.format`` json_schema with
the ``final`` channel.

The grammar ends where the JSON ends: the terminator (``<|call|>`` / ``<|return|>``) is one of
gpt-oss's stop tokens, and a structured-output matcher only accepts stop tokens once its grammar
is complete — so the model ends the message there, and the parser reads the call as usual.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from inference.harmony_core import ToolCatalog, harmony_tokens, recipient_for


def _token(tid: int) -> dict[str, Any]:
    return {"type": "token", "token": tid}


def _text(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _optional_reasoning() -> dict[str, Any]:
    t = harmony_tokens()
    markers = [t.start, t.end, t.message, t.channel, t.constrain, t.return_, t.call]
    return {"type": "optional", "content": {"type": "sequence", "elements": [
        _token(t.channel), _text("analysis"), _token(t.message),
        {"type": "any_tokens", "exclude_tokens": markers},
        _token(t.end), _token(t.start), _text("assistant"),
    ]}}


def _call(recipient: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    t = harmony_tokens()
    return {"type": "sequence", "elements": [
        _token(t.channel), _text(f"commentary to={recipient} "), _token(t.constrain), _text("json"),
        _token(t.message), {"type": "json_schema", "json_schema": dict(schema)},
    ]}


def harmony_constraint(prelude_tools: tuple[dict[str, Any], ...], tool_choice: Any,
                       text_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """vLLM ``StructuredOutputsParams`` fields (a ``structural_tag``), or None when unconstrained."""
    t = harmony_tokens()
    catalog = ToolCatalog(prelude_tools)
    wanted: list[tuple[str | None, str]] = []
    if catalog and tool_choice == "required":
        wanted = [(ns, name) for ns, name in catalog.function_names()]
    elif catalog and isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        name, ns = str(tool_choice.get("name")), tool_choice.get("namespace")
        if (ns, name) in set(catalog.function_names()):
            wanted = [(ns, name)]
    if wanted:
        calls = [_call(recipient_for(name, ns), catalog.parameters(name, ns) or {"type": "object"})
                 for ns, name in wanted]
        body = calls[0] if len(calls) == 1 else {"type": "or", "elements": calls}
    elif text_format and text_format.get("type") in ("json_schema", "json_object"):
        schema = text_format.get("schema") if text_format.get("type") == "json_schema" else {"type": "object"}
        body = {"type": "sequence", "elements": [
            _token(t.channel), _text("final"), _token(t.message),
            {"type": "json_schema", "json_schema": dict(schema or {"type": "object"})},
        ]}
    else:
        return None
    tag = {"type": "structural_tag",
           "format": {"type": "sequence", "elements": [_optional_reasoning(), body]}}
    return {"structural_tag": json.dumps(tag)}
