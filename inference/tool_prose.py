"""Tool facts that prompt formats can only say in words, shared by every renderer family.

Neither harmony nor Hermes-style chat templates have a slot for ``tool_choice`` or for freeform
(``custom``) tools, so both families write the same deterministic sentences into the prelude.
Deterministic matters: the prelude's tokens must be identical across turns for appends to be exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from inference.item_types import CALLABLE_TOOLS

TOOL_CHOICE_REQUIRED = "You must call at least one tool before giving a final answer."
TOOL_CHOICE_NONE = "Do not call any tools; answer directly."
TOOL_CHOICE_NAMED = "You must call the tool `{name}`."


def tool_choice_line(choice: Any, name_of: Callable[[Mapping[str, Any]], str] | None = None) -> str | None:
    """The prelude line for ``tool_choice`` (``auto`` has none); ``name_of`` maps a named choice to
    the tool name the format uses (e.g. a flattened ``namespace__tool``)."""
    if choice == "required":
        return TOOL_CHOICE_REQUIRED
    if choice == "none":
        return TOOL_CHOICE_NONE
    if isinstance(choice, Mapping) and choice.get("type") in CALLABLE_TOOLS and choice.get("name"):
        return TOOL_CHOICE_NAMED.format(name=name_of(choice) if name_of else choice["name"])
    return None


def freeform_description(tool: Mapping[str, Any], note: str) -> str:
    """Description of a ``custom`` (freeform) tool: its own text, how to pass raw input, its grammar."""
    parts = [str(tool.get("description") or "").strip(), note]
    fmt = tool.get("format") or {}
    if isinstance(fmt, Mapping) and fmt.get("type") == "grammar" and fmt.get("definition"):
        syntax = fmt.get("syntax") or "lark"
        parts.append(f"The input must match this {syntax} grammar:\n{fmt['definition']}")
    return "\n\n".join(p for p in parts if p)
