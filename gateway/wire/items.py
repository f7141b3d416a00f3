"""Input items as clients send them, validated and canonicalized into plain dicts.

Real clients send many shapes (spec/real-clients.md): messages with or without ``type``, string or
part-list content, client-made ids (``msg_<uuid>``, ``fco_<uuid>``), ``phase`` on assistant
messages, replayed server items with ``status``. Models here accept all of them (extra keys are
kept) and ``canonical_item`` turns each into the one dict shape renderers and stores rely on:
messages always carry a ``content`` list, and every item carries an ``id``.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from inference.item_types import CALL_TYPES, OUTPUT_TYPES, ItemType


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class InputText(_Lenient):
    type: Literal["input_text"]
    text: str


class InputImage(_Lenient):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str = "auto"


class InputFile(_Lenient):
    type: Literal["input_file"]
    file_id: str | None = None
    file_url: str | None = None
    file_data: str | None = None
    filename: str | None = None


class OutputText(_Lenient):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)


class Refusal(_Lenient):
    type: Literal["refusal"]
    refusal: str


class ReasoningText(_Lenient):
    type: Literal["reasoning_text"]
    text: str


class SummaryText(_Lenient):
    type: Literal["summary_text"]
    text: str


def _part_tag(v: Any) -> str | None:
    return v.get("type") if isinstance(v, dict) else None


ContentPart = Annotated[
    Annotated[InputText, Tag("input_text")]
    | Annotated[InputImage, Tag("input_image")]
    | Annotated[InputFile, Tag("input_file")]
    | Annotated[OutputText, Tag("output_text")]
    | Annotated[Refusal, Tag("refusal")],
    Discriminator(_part_tag),
]

ToolOutputPart = Annotated[
    Annotated[InputText, Tag("input_text")]
    | Annotated[InputImage, Tag("input_image")]
    | Annotated[InputFile, Tag("input_file")],
    Discriminator(_part_tag),
]


def _str_or_list(v: Any) -> str:
    return "<text>" if isinstance(v, str) else "<parts>"


MessageContent = Annotated[
    Annotated[str, Tag("<text>")] | Annotated[list[ContentPart], Tag("<parts>")],
    Discriminator(_str_or_list),
]
ToolOutput = Annotated[
    Annotated[str, Tag("<text>")] | Annotated[list[ToolOutputPart], Tag("<parts>")],
    Discriminator(_str_or_list),
]


class Message(_Lenient):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: MessageContent
    status: str | None = None
    phase: str | None = None

    @field_validator("content")
    @classmethod
    def _parts_match_role(cls, content: Any, info: Any) -> Any:
        role = info.data.get("role")
        if isinstance(content, list) and role is not None:
            for part in content:
                if role == "assistant" and part.type not in ("output_text", "refusal"):
                    raise ValueError(
                        f"Invalid value: '{part.type}'. Supported values are: 'output_text' and 'refusal'."
                    )
                if role != "assistant" and part.type in ("output_text", "refusal"):
                    raise ValueError(
                        f"Invalid value: '{part.type}'. "
                        "Supported values are: 'input_text', 'input_image', and 'input_file'."
                    )
        return content


class _Call(_Lenient):
    """What a function call and a custom tool call share: the fields that pair a call with its
    output. Each subclass narrows ``type`` in place (pydantic keeps an overridden field where the
    base put it), so the fields — and the order their errors are found in — stay as declared."""

    type: str
    id: str | None = None
    call_id: str
    name: str


class _CallOutput(_Lenient):
    """What a function call's output and a custom tool call's share (see :class:`_Call`)."""

    type: str
    id: str | None = None
    call_id: str
    output: ToolOutput


class FunctionCall(_Call):
    type: Literal["function_call"]
    arguments: str
    status: str | None = None
    namespace: str | None = None


class FunctionCallOutput(_CallOutput):
    type: Literal["function_call_output"]
    status: str | None = None


class CustomToolCall(_Call):
    type: Literal["custom_tool_call"]
    input: str
    namespace: str | None = None


class CustomToolCallOutput(_CallOutput):
    type: Literal["custom_tool_call_output"]


class Reasoning(_Lenient):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class Compaction(_Lenient):
    """The opaque summary of everything before it (``/responses/compact`` or ``context_management``)."""

    type: Literal["compaction"]
    id: str | None = None
    encrypted_content: str


class CompactionTrigger(_Lenient):
    """Forces compaction during this response."""

    type: Literal["compaction_trigger"]


class ItemReference(_Lenient):
    type: Literal["item_reference"] = "item_reference"
    id: str


class HostedItem(_Lenient):
    """Items of hosted tools we do not run (e.g. a ``web_search_call`` Codex replays from history).

    Accepted so that replayed histories do not fail; they are kept in the context but not rendered.
    """

    type: str
    id: str | None = None


class McpCall(_Lenient):
    """A call the gateway ran on an MCP server (``gateway.tools``), re-sent in a history."""

    type: Literal["mcp_call"]
    id: str = Field(max_length=256)
    server_label: str = Field(max_length=256)
    name: str = Field(max_length=256)
    arguments: str
    output: str | None = None
    #: the SDK's ``McpToolCallError`` (an object); a string from older clients
    error: str | dict[str, Any] | None = None
    approval_request_id: str | None = Field(default=None, max_length=256)
    status: str | None = None


class McpApprovalRequest(_Lenient):
    """The model's call that waits for the user's approval (it ended its response)."""

    type: Literal["mcp_approval_request"]
    id: str = Field(max_length=256)
    server_label: str = Field(max_length=256)
    name: str = Field(max_length=256)
    arguments: str


class McpApprovalResponse(_Lenient):
    """The user's answer to an ``mcp_approval_request``: the call runs (or is refused) next turn."""

    type: Literal["mcp_approval_response"]
    approval_request_id: str = Field(max_length=256)
    approve: bool
    reason: str | None = Field(default=None, max_length=8192)
    id: str | None = Field(default=None, max_length=256)


class McpListTools(_Lenient):
    type: Literal["mcp_list_tools"]
    id: str | None = Field(default=None, max_length=256)
    server_label: str = Field(max_length=256)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None


#: the MCP items, validated by their own models (the other hosted items are only kept)
MCP_ITEMS = {
    "mcp_call": McpCall,
    "mcp_approval_request": McpApprovalRequest,
    "mcp_approval_response": McpApprovalResponse,
    "mcp_list_tools": McpListTools,
}

HOSTED_ITEM_TYPES = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
    }
)
KNOWN_ITEM_TYPES: frozenset[str] = frozenset(ItemType)


def _item_tag(v: Any) -> str:
    if not isinstance(v, dict):
        return "<invalid>"
    t = v.get("type")
    if t is None and "role" in v:
        return "message"
    if t is None and "id" in v:
        return "item_reference"
    if not isinstance(t, str):  # a list or object is unhashable: looked up below it would raise, not refuse
        return "<invalid>"
    if t in KNOWN_ITEM_TYPES or t in MCP_ITEMS:
        return t
    if t in HOSTED_ITEM_TYPES:
        return "<hosted>"
    return "<invalid>"


class _Invalid(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "item_reference",
        "compaction",
        "compaction_trigger",
    ]


InputItem = Annotated[
    Annotated[Message, Tag("message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[CustomToolCall, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutput, Tag("custom_tool_call_output")]
    | Annotated[Reasoning, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")]
    | Annotated[Compaction, Tag("compaction")]
    | Annotated[CompactionTrigger, Tag("compaction_trigger")]
    | Annotated[McpCall, Tag("mcp_call")]
    | Annotated[McpApprovalRequest, Tag("mcp_approval_request")]
    | Annotated[McpApprovalResponse, Tag("mcp_approval_response")]
    | Annotated[McpListTools, Tag("mcp_list_tools")]
    | Annotated[HostedItem, Tag("<hosted>")]
    | Annotated[_Invalid, Tag("<invalid>")],
    Discriminator(_item_tag),
]

_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
    "mcp_approval_response": "mcpa",
    "mcp_list_tools": "mcpl",
}


#: random bytes per id (48 hex digits, as ``secrets.token_hex(24)`` gave)
ID_BYTES = 24
#: ids drawn from one ``os.urandom`` call
_ID_BATCH = 256
#: unused random suffixes (hex); ``list.pop`` and ``list.extend`` are atomic under the GIL, so the
#: prepare threads and the event loop share it without a lock
_suffixes: list[str] = []
# a forked child must not hand out the ids its parent holds (uvicorn's reloader, a test's fork)
os.register_at_fork(after_in_child=_suffixes.clear)


def new_id(prefix: str) -> str:
    """``prefix_`` + 24 random bytes in hex, from the OS's CSPRNG like ``secrets.token_hex``.

    Why batched: a turn names several objects (the response, each output item, each call), and
    one ``getrandom`` system call per id was ~2.5% of a short WebSocket turn's CPU. The bytes are
    drawn 256 ids at a time and handed out once each; the randomness is the same."""
    try:
        return f"{prefix}_{_suffixes.pop()}"
    except IndexError:
        raw = os.urandom(ID_BYTES * _ID_BATCH).hex()
        step = 2 * ID_BYTES
        _suffixes.extend([raw[i : i + step] for i in range(0, len(raw), step)])
        return new_id(prefix)


def canonical_item(item: BaseModel) -> dict[str, Any]:
    """One dict shape per item type; assigns an id when the client sent none."""
    d = item.model_dump(exclude_none=True)
    t = d.get("type")
    if isinstance(item, Message):
        content = d["content"]
        if isinstance(content, str):
            part_type = "output_text" if item.role == "assistant" else "input_text"
            part: dict[str, Any] = {"type": part_type, "text": content}
            if part_type == "output_text":
                part["annotations"] = []
            d["content"] = [part]
        d["type"] = "message"
        d.setdefault("status", "completed")
    elif t in OUTPUT_TYPES and isinstance(d.get("output"), list):
        d["output_parts"] = d["output"]
        d["output"] = "\n".join(p.get("text", "") for p in d["output"] if p.get("type") == "input_text")
    if "id" not in d and t in _PREFIX:
        d["id"] = new_id(_PREFIX[t])
    if t in CALL_TYPES or t in OUTPUT_TYPES:
        d.setdefault("status", "completed")
    return d
