"""Responses tools as Hermes-style function tools (the chat-template family's tool catalogue).

Why a catalogue: Responses tools come in three shapes (``function``, ``namespace`` with nested
tools, ``custom`` with freeform input) while a Hermes chat template only knows flat JSON-schema
functions called as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Rendering (the
tool list in the prelude, past calls in the history) and parsing (the model's calls) must agree on
the mapping, so it is computed in one place from the prelude's tools:

* ``function`` -> itself.
* ``namespace`` member ``t`` of namespace ``ns`` -> a function named ``ns`` + :data:`NAMESPACE_SEP`
  + ``t`` (e.g. ``mcp_fs__read_file``); the parser restores ``(name="read_file", namespace="mcp_fs")``.
* ``custom`` (freeform, e.g. Codex ``apply_patch``) -> a function with one string parameter
  :data:`CUSTOM_ARG` whose description carries the tool's grammar; a call's arguments are
  ``{"input": "<raw>"}`` and the parser restores a ``custom_tool_call`` with the raw input. When
  the tool has a grammar, the engine enforces it on that JSON string (:func:`tool_call_structural_tag`,
  :func:`triggered_tool_calls_tag`, over the grammar of its escaped spelling).

Two tools that flatten to the same name are rejected with :class:`ToolNameCollision` (a request
error): the parser could not tell them apart. Hosted tools (``web_search``...) are not exposed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inference.item_types import CALLABLE_TOOLS, ToolType
from inference.tool_grammar import ToolGrammar
from inference.tool_prose import TOOL_CHOICE_NAMED, TOOL_CHOICE_NONE, TOOL_CHOICE_REQUIRED, freeform_description
from inference.tool_prose import tool_choice_line as _tool_choice_line

__all__ = [
    "CUSTOM_ARG",
    "FREEFORM_NOTE",
    "NAMESPACE_SEP",
    "TOOL_CHOICE_NAMED",
    "TOOL_CHOICE_NONE",
    "TOOL_CHOICE_REQUIRED",
    "HermesTool",
    "HermesToolCatalog",
    "ToolNameCollision",
    "flat_name",
    "tool_call_structural_tag",
    "triggered_tool_calls_tag",
    "tool_choice_line",
]

#: separator between a namespace and its tool in a flattened function name
NAMESPACE_SEP = "__"
#: the single string parameter a freeform (``custom``) tool is exposed with
CUSTOM_ARG = "input"
#: sentence every freeform tool description contains (the simulated engine may key on it)
FREEFORM_NOTE = "This tool takes freeform text: pass the raw text as the `input` argument."
#: how a Hermes call is framed (the model writes the call JSON between them)
CALL_BEGIN, CALL_END = "<tool_call>\n", "\n</tool_call>"


class ToolNameCollision(ValueError):
    """Two tools map to one Hermes function name (e.g. ``a__b`` and namespace ``a`` tool ``b``)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"tool name {name!r} is ambiguous for this model: namespace tools are exposed as "
            f"'<namespace>{NAMESPACE_SEP}<tool>' and another tool already has that name"
        )
        self.name = name


def flat_name(name: str, namespace: str | None) -> str:
    """The function name a (namespaced) tool has in the template: ``ns__tool`` or ``tool``."""
    return f"{namespace}{NAMESPACE_SEP}{name}" if namespace else name


def tool_choice_line(choice: Any) -> str | None:
    """The deterministic system-prompt line for ``tool_choice``, naming tools by their flat name."""
    return _tool_choice_line(choice, lambda c: flat_name(str(c["name"]), c.get("namespace")))


def _freeform_description(tool: Mapping[str, Any]) -> str:
    return freeform_description(tool, FREEFORM_NOTE)


@dataclass(frozen=True, slots=True)
class HermesTool:
    name: str
    namespace: str | None
    custom: bool
    #: the HF ``tools`` entry: ``{"type": "function", "function": {name, description, parameters}}``
    schema: dict[str, Any]
    #: the Responses tool as offered (a custom tool's ``format`` carries its grammar)
    tool: Mapping[str, Any]


class HermesToolCatalog:
    """The prelude's tools as flat Hermes functions, plus the reverse map the parser needs."""

    __slots__ = ("_by_flat",)

    def __init__(self, tools: Iterable[Mapping[str, Any]] = ()) -> None:
        self._by_flat: dict[str, HermesTool] = {}
        for tool in tools:
            kind = tool.get("type")
            if kind in CALLABLE_TOOLS and tool.get("name"):
                self._add(tool, None)
            elif kind == "namespace" and tool.get("name"):
                for sub in tool.get("tools") or ():
                    if sub.get("type") in CALLABLE_TOOLS and sub.get("name"):
                        self._add(sub, str(tool["name"]), tool.get("description"))

    def _add(self, tool: Mapping[str, Any], namespace: str | None, ns_desc: Any = None) -> None:
        name = str(tool["name"])
        flat = flat_name(name, namespace)
        if flat in self._by_flat:
            raise ToolNameCollision(flat)
        custom = tool.get("type") == ToolType.CUSTOM
        if custom:
            desc = _freeform_description(tool)
            params: Any = {
                "type": "object",
                "properties": {CUSTOM_ARG: {"type": "string", "description": "The raw freeform input."}},
                "required": [CUSTOM_ARG],
            }
        else:
            desc = str(tool.get("description") or "")
            params = tool.get("parameters")
            params = dict(params) if isinstance(params, Mapping) else {"type": "object", "properties": {}}
        if namespace and ns_desc:
            desc = f"{ns_desc} {desc}".strip() if desc else str(ns_desc)
        schema = {"type": "function", "function": {"name": flat, "description": desc, "parameters": params}}
        self._by_flat[flat] = HermesTool(name, namespace, custom, schema, tool)

    def __bool__(self) -> bool:
        return bool(self._by_flat)

    def names(self) -> list[str]:
        """Flattened function names, in request order."""
        return list(self._by_flat)

    def schemas(self) -> list[dict[str, Any]]:
        """The template's ``tools`` argument, in request order (deterministic)."""
        return [t.schema for t in self._by_flat.values()]

    def schema_of(self, flat: str) -> dict[str, Any]:
        return self._by_flat[flat].schema

    def tool_of(self, flat: str) -> HermesTool:
        return self._by_flat[flat]

    def resolve(self, flat: str) -> tuple[str, str | None, bool]:
        """``"mcp_fs__read_file"`` -> ``("read_file", "mcp_fs", custom?)``.

        A name that is not in the catalogue (a model may call a tool never offered) is split at
        the first :data:`NAMESPACE_SEP` when it has one (``"a__b"`` -> ``("b", "a", False)``).
        """
        tool = self._by_flat.get(flat)
        if tool is not None:
            return tool.name, tool.namespace, tool.custom
        ns, sep, name = flat.partition(NAMESPACE_SEP)
        if sep and ns and name:
            return name, ns, False
        return flat, None, False


def _call_prefix(flat: str) -> str:
    """The canonical call text up to the arguments (``json.dumps`` spacing, as the renderer writes it)."""
    return '{"name": ' + json.dumps(flat, ensure_ascii=False) + ', "arguments": '


def _grammar_body(flat: str, grammar: ToolGrammar) -> dict[str, Any]:
    """``{"name": F, "arguments": {"input": "<escaped>"}}`` whose unescaped input follows the grammar."""
    return {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": _call_prefix(flat) + '{"' + CUSTOM_ARG + '": "'},
            {"type": "grammar", "grammar": grammar.ebnf},
            {"type": "const_string", "value": '"}}'},
        ],
    }


def tool_call_structural_tag(
    catalog: HermesToolCatalog, names: Iterable[str], grammars: Mapping[str, ToolGrammar] | None = None
) -> str:
    """A vLLM/xgrammar ``structural_tag`` for exactly one Hermes call to one of ``names`` whose
    ``arguments`` follow that tool's own JSON schema (so even a 135M model returns valid calls):
    ``<tool_call>\n{"name": <name>, "arguments": <schema-valid object>}\n</tool_call>``; a custom
    tool with a grammar (``grammars``, by flat name, each over the *JSON-escaped* input:
    :func:`inference.tool_grammar.json_string_ebnf`): its ``input`` string follows it."""
    grammars = grammars or {}
    alternatives = []
    for flat in names:
        if flat in grammars:
            continue
        fn = catalog.schema_of(flat)["function"]
        params = fn.get("parameters") or {"type": "object"}
        alternatives.append(
            {
                "type": "object",
                "properties": {"name": {"const": flat}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    bodies: list[dict[str, Any]] = [_grammar_body(flat, grammars[flat]) for flat in names if flat in grammars]
    if alternatives:
        schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
        bodies.insert(0, {"type": "json_schema", "json_schema": schema})
    content = bodies[0] if len(bodies) == 1 else {"type": "or", "elements": bodies}
    return json.dumps(
        {
            "type": "structural_tag",
            "format": {"type": "tag", "begin": CALL_BEGIN, "content": content, "end": CALL_END},
        }
    )


def triggered_tool_calls_tag(catalog: HermesToolCatalog, grammars: Mapping[str, ToolGrammar]) -> str:
    """``tool_choice: auto`` with grammar tools: free text, but once the model opens ``<tool_call>``
    the call is one of the offered tools — a grammar tool's input follows its grammar, a function's
    arguments its schema (canonical header spacing, which is how the renderer writes calls)."""
    tags = []
    for flat in catalog.names():
        prefix = CALL_BEGIN + _call_prefix(flat)
        if flat in grammars:
            tags.append(
                {
                    "type": "tag",
                    "begin": prefix + '{"' + CUSTOM_ARG + '": "',
                    "content": {"type": "grammar", "grammar": grammars[flat].ebnf},
                    "end": '"}}' + CALL_END,
                }
            )
        else:
            params = catalog.schema_of(flat)["function"].get("parameters") or {"type": "object"}
            tags.append(
                {
                    "type": "tag",
                    "begin": prefix,
                    "content": {"type": "json_schema", "json_schema": params},
                    "end": "}" + CALL_END,
                }
            )
    return json.dumps(
        {
            "type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": [CALL_BEGIN.rstrip("\n")], "tags": tags},
        }
    )
