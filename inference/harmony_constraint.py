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

Custom (freeform) tools with a grammar (``inference.tool_grammar``): a forced call's content — the
raw input after ``<|channel|>commentary to=functions.NAME<|message|>`` up to ``<|call|>`` — follows
the grammar. Under ``tool_choice: auto`` the whole turn is spelled out as harmony messages whose
content is free, except a message to a grammar tool's recipient (see :func:`_auto`); with no
grammar tool offered, ``auto`` stays unconstrained.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inference.harmony_core import ToolCatalog, harmony_tokens, recipient_for
from inference.item_types import CALLABLE_TOOLS
from inference.renderer import Constraint
from inference.tool_grammar import (
    GrammarUnavailable,
    ToolGrammar,
    check_structural_tag,
    iter_custom_tools,
    tool_grammar,
)


def _token(tid: int) -> dict[str, Any]:
    return {"type": "token", "token": tid}


def _text(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _optional_reasoning() -> dict[str, Any]:
    t = harmony_tokens()
    markers = [t.start, t.end, t.message, t.channel, t.constrain, t.return_, t.call]
    return {
        "type": "optional",
        "content": {
            "type": "sequence",
            "elements": [
                _token(t.channel),
                _text("analysis"),
                _token(t.message),
                {"type": "any_tokens", "exclude_tokens": markers},
                _token(t.end),
                _token(t.start),
                _text("assistant"),
            ],
        },
    }


def _call(recipient: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    t = harmony_tokens()
    return {
        "type": "sequence",
        "elements": [
            _token(t.channel),
            _text(f"commentary to={recipient} "),
            _token(t.constrain),
            _text("json"),
            _token(t.message),
            {"type": "json_schema", "json_schema": dict(schema)},
        ],
    }


def _free_content() -> dict[str, Any]:
    t = harmony_tokens()
    return {
        "type": "any_tokens",
        "exclude_tokens": [t.start, t.end, t.message, t.channel, t.constrain, t.return_, t.call],
    }


def _custom_call(recipient: str, grammar: ToolGrammar | None) -> dict[str, Any]:
    """A freeform call as the renderer writes it: ``<|channel|>commentary to=R<|message|>RAW``, the
    raw input following the tool's grammar (free text when it has none or it fell back)."""
    t = harmony_tokens()
    content = {"type": "grammar", "grammar": grammar.ebnf} if grammar else _free_content()
    return {
        "type": "sequence",
        "elements": [_token(t.channel), _text(f"commentary to={recipient}"), _token(t.message), content],
    }


def _content_type() -> dict[str, Any]:
    """What the parser accepts between a recipient and ``<|message|>``: nothing, `` json``,
    ``<|constrain|>json`` with or without a space before it."""
    t = harmony_tokens()
    return {
        "type": "optional",
        "content": {
            "type": "or",
            "elements": [
                _text(" json"),
                {"type": "sequence", "elements": [_token(t.constrain), _text("json")]},
                {"type": "sequence", "elements": [_text(" "), _token(t.constrain), _text("json")]},
            ],
        },
    }


def _auto(catalog: ToolCatalog, grammars: Mapping[tuple[str | None, str], ToolGrammar]) -> dict[str, Any]:
    """``tool_choice: auto`` with grammar tools: any sequence of messages, except that a message to
    a grammar tool's recipient must follow its grammar.

    Harmony's structure is spelled out (channel names, the offered recipients) rather than left
    to ``any_text`` with the grammar recipients excluded: xgrammar 0.2.8 loses the grammar branch
    after an ``any_text`` header in an earlier message. Messages go to offered tools only (a call
    to a tool never offered could not be answered anyway); their content is free.
    """
    t = harmony_tokens()
    plain = [recipient_for(name, ns) for ns, name in catalog.callable_names() if (ns, name) not in grammars]
    recipients = {"type": "or", "elements": [_text(r) for r in plain]} if plain else None
    headers: list[dict[str, Any]] = [_text("analysis"), _text("final"), _text("commentary")]
    lead: list[dict[str, Any]] = []
    if recipients:
        headers.append({"type": "sequence", "elements": [_text("commentary to="), recipients, _content_type()]})
        lead = [{"type": "optional", "content": {"type": "sequence", "elements": [_text(" to="), recipients]}}]
    generic = {
        "type": "sequence",
        "elements": [*lead, _token(t.channel), {"type": "or", "elements": headers}, _token(t.message), _free_content()],
    }
    calls = []
    for (ns, name), grammar in grammars.items():
        recipient, content = recipient_for(name, ns), {"type": "grammar", "grammar": grammar.ebnf}
        calls += [
            {
                "type": "sequence",
                "elements": [
                    _token(t.channel),
                    _text(f"commentary to={recipient}"),
                    _content_type(),
                    _token(t.message),
                    content,
                ],
            },
            {
                "type": "sequence",
                "elements": [
                    _text(f" to={recipient}"),
                    _token(t.channel),
                    _text("commentary"),
                    _content_type(),
                    _token(t.message),
                    content,
                ],
            },
        ]
    earlier = {
        "type": "star",
        "content": {"type": "sequence", "elements": [generic, _token(t.end), _token(t.start), _text("assistant")]},
    }
    return {"type": "sequence", "elements": [earlier, {"type": "or", "elements": [generic, *calls]}]}


def _grammars(tools: tuple[dict[str, Any], ...]) -> tuple[dict[tuple[str | None, str], ToolGrammar], list[str]]:
    """Grammars of the offered custom tools by ``(namespace, name)``, and the syntaxes that fell back."""
    found: dict[tuple[str | None, str], ToolGrammar] = {}
    fallbacks: list[str] = []
    for ns, tool in iter_custom_tools(tools):
        try:
            grammar = tool_grammar(tool)
        except GrammarUnavailable as exc:
            fallbacks.append(exc.syntax)
            continue
        if grammar is not None:
            found[(ns, str(tool["name"]))] = grammar
    return found, fallbacks


def harmony_constraint(
    prelude_tools: tuple[dict[str, Any], ...], tool_choice: Any, text_format: Mapping[str, Any] | None
) -> Constraint | None:
    """vLLM ``StructuredOutputsParams`` fields (a ``structural_tag``), or None when unconstrained.

    Custom tools' grammars that cannot be enforced are left out and named in ``fallbacks``; so is
    every grammar when the whole tag does not pass xgrammar's check (then the tag is rebuilt
    without grammars, as before grammars were enforced)."""
    if not prelude_tools and not text_format:
        return None  # nothing to constrain (what the steps below conclude, without building them)
    catalog = ToolCatalog(prelude_tools)
    grammars, fallbacks = _grammars(prelude_tools) if catalog and tool_choice != "none" else ({}, [])
    fields = _fields(catalog, tool_choice, text_format, grammars)
    if grammars and fields:
        try:
            check_structural_tag(fields["structural_tag"])
        except GrammarUnavailable:
            fallbacks += [g.syntax for g in grammars.values()]
            fields = _fields(catalog, tool_choice, text_format, {})
    if fields is None and not fallbacks:
        return None
    return Constraint(fields or {}, fallbacks)


def _fields(
    catalog: ToolCatalog,
    tool_choice: Any,
    text_format: Mapping[str, Any] | None,
    grammars: Mapping[tuple[str | None, str], ToolGrammar],
) -> dict[str, Any] | None:
    t = harmony_tokens()
    wanted: list[tuple[str | None, str]] = []
    if catalog and tool_choice == "required":
        wanted = catalog.callable_names()
    elif catalog and isinstance(tool_choice, Mapping) and tool_choice.get("type") in CALLABLE_TOOLS:
        name, ns = str(tool_choice.get("name")), tool_choice.get("namespace")
        if (ns, name) in set(catalog.callable_names()):
            wanted = [(ns, name)]
    if wanted:
        calls = [
            _custom_call(recipient_for(name, ns), grammars.get((ns, name)))
            if catalog.is_custom(name, ns)
            else _call(recipient_for(name, ns), catalog.parameters(name, ns) or {"type": "object"})
            for ns, name in wanted
        ]
        body = calls[0] if len(calls) == 1 else {"type": "or", "elements": calls}
    elif text_format and text_format.get("type") in ("json_schema", "json_object"):
        schema = text_format.get("schema") if text_format.get("type") == "json_schema" else {"type": "object"}
        body = {
            "type": "sequence",
            "elements": [
                _token(t.channel),
                _text("final"),
                _token(t.message),
                {"type": "json_schema", "json_schema": dict(schema or {"type": "object"})},
            ],
        }
    elif grammars and tool_choice in ("auto", None):
        return {"structural_tag": json.dumps({"type": "structural_tag", "format": _auto(catalog, grammars)})}
    else:
        return None
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [_optional_reasoning(), body]}}
    return {"structural_tag": json.dumps(tag)}
