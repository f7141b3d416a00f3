"""Tool definitions as clients send them, and how the Response echoes them.

Function, custom (Codex's freeform ``apply_patch`` with a lark grammar) and namespace tools are
rendered for the model. Hosted tools (``web_search``, ``tool_search``, ...) are run by OpenAI, not by
us: Codex sends ``web_search`` and ``tool_search`` in every frame, so by default they are stripped
(accepted, not shown to the model, not echoed); ``hosted_tools="reject"`` answers them with
``400 unsupported_value`` instead.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class FunctionTool(_Lenient):
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(_Lenient):
    type: Literal["custom"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    format: dict[str, Any] | None = None


def _nested_tag(v: Any) -> str | None:
    # dicts when validating, model instances when serializing (canonical_tool's model_dump)
    return v.get("type") if isinstance(v, dict) else getattr(v, "type", None)


class NamespaceTool(_Lenient):
    type: Literal["namespace"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    tools: list[
        Annotated[
            Annotated[FunctionTool, Tag("function")] | Annotated[CustomTool, Tag("custom")],
            Discriminator(_nested_tag),
        ]
    ]


class HostedTool(_Lenient):
    type: str


HOSTED_TOOL_TYPES = frozenset(
    {
        "file_search",
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "computer",
        "computer_use_preview",
        "mcp",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    }
)


class _UnknownTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function", "custom", "namespace"]


def _tool_tag(v: Any) -> str:
    # dicts when validating, model instances when a request is serialized (as _nested_tag)
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    if not isinstance(t, str):  # a list or object is unhashable: the set lookup below would raise, not refuse
        return "<unknown>"
    if t in ("function", "custom", "namespace"):
        return t
    if t in HOSTED_TOOL_TYPES:
        return "<hosted>"
    return "<unknown>"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("<hosted>")]
    | Annotated[_UnknownTool, Tag("<unknown>")],
    Discriminator(_tool_tag),
]


def canonical_tool(tool: BaseModel) -> dict[str, Any]:
    """The tool as echoed in the Response: functions are strict unless told otherwise."""
    d = tool.model_dump(exclude_none=True)
    if d["type"] == "function":
        d.setdefault("strict", True)
        d.setdefault("parameters", None)
        d.setdefault("description", None)
    elif d["type"] == "namespace":
        for sub in d["tools"]:
            if sub["type"] == "function":
                sub.setdefault("strict", True)
    return d


def tool_names(tools: tuple[dict[str, Any], ...]) -> dict[tuple[str | None, str], str]:
    """(namespace, name) -> tool type, for validating tool_choice and parsed calls."""
    out: dict[tuple[str | None, str], str] = {}
    for t in tools:
        if t["type"] == "namespace":
            for sub in t["tools"]:
                out[(t["name"], sub["name"])] = sub["type"]
        else:
            out[(None, t["name"])] = t["type"]
    return out
