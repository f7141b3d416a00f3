"""The vocabulary of canonical items and tools: one enum each, shared by renderers, parsers and the gateway.

Items reach inference as plain dicts in canonical Responses shape (``inference/renderer.py``); their
``type`` and the tools' ``type`` are compared against these members (a ``StrEnum`` equals its
string, so dicts straight from JSON compare as they are). The sets below are the only definition
of which item types are tool calls and which answer them.

Where each tool kind is handled (a new tool type touches these files, and ``gateway/wire/kinds.py``
says which of its pieces goes where): this module and ``gateway/wire/kinds.py`` (the map), the
wire models (``gateway/wire/items.py``, ``gateway/wire/tools.py``), and per model family the
renderer and parser (harmony: ``inference/harmony_render.py``, ``inference/harmony_parse.py``;
chat templates: ``inference/chat_template_render.py``, ``inference/hermes_parse.py``).

Remote MCP items (:data:`MCP_ITEM_TYPES`: ``mcp_list_tools``, ``mcp_call``, ``mcp_approval_request``,
``mcp_approval_response``) are not tool kinds of their own to the model: the gateway offers an MCP
server's tools as a ``namespace`` tool (namespace = ``server_label``), and both renderers see the
MCP items only through :func:`inference.hosted_items.tool_view`, which rewrites them into the
``function_call`` / ``function_call_output`` items the model saw (that module's table says which
item becomes what). So they touch: this module, ``inference/hosted_items.py`` (the expansion, and
the call an approval request stands for), its hook at the top of each renderer's item paths, and
the gateway's wire models and call index. They are not in :data:`CALL_TYPES` / :data:`OUTPUT_TYPES`:
those are the kinds a *client* answers, and an MCP call is answered by the gateway.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class ItemType(StrEnum):
    MESSAGE = "message"
    REASONING = "reasoning"
    FUNCTION_CALL = "function_call"
    FUNCTION_CALL_OUTPUT = "function_call_output"
    CUSTOM_TOOL_CALL = "custom_tool_call"
    CUSTOM_TOOL_CALL_OUTPUT = "custom_tool_call_output"
    ITEM_REFERENCE = "item_reference"
    COMPACTION = "compaction"
    COMPACTION_TRIGGER = "compaction_trigger"
    MCP_LIST_TOOLS = "mcp_list_tools"
    MCP_CALL = "mcp_call"
    MCP_APPROVAL_REQUEST = "mcp_approval_request"
    MCP_APPROVAL_RESPONSE = "mcp_approval_response"
    #: the gateway's run of the model's browser (``web_search``; ``gateway.tools.web``)
    WEB_SEARCH_CALL = "web_search_call"
    #: the gateway's search of the request's vector stores (``file_search``; ``gateway.tools.file_search``)
    FILE_SEARCH_CALL = "file_search_call"
    #: the gateway's run of the model's python in a container (``code_interpreter``;
    #: ``gateway.tools.code_interpreter``)
    CODE_INTERPRETER_CALL = "code_interpreter_call"


class ToolType(StrEnum):
    FUNCTION = "function"
    CUSTOM = "custom"
    NAMESPACE = "namespace"


#: items the model writes to call a tool, and the items a client answers them with
CALL_TYPES: frozenset[str] = frozenset({ItemType.FUNCTION_CALL, ItemType.CUSTOM_TOOL_CALL})
OUTPUT_TYPES: frozenset[str] = frozenset({ItemType.FUNCTION_CALL_OUTPUT, ItemType.CUSTOM_TOOL_CALL_OUTPUT})
#: remote MCP items: rendered as the calls and outputs they stand for (``inference.hosted_items``)
MCP_ITEM_TYPES: frozenset[str] = frozenset(
    {ItemType.MCP_LIST_TOOLS, ItemType.MCP_CALL, ItemType.MCP_APPROVAL_REQUEST, ItemType.MCP_APPROVAL_RESPONSE}
)
#: tool definitions a model can call (a namespace groups them)
CALLABLE_TOOLS: frozenset[str] = frozenset({ToolType.FUNCTION, ToolType.CUSTOM})
#: the call item a model writes for each callable tool type
CALL_OF_TOOL: dict[str, ItemType] = {
    ToolType.FUNCTION: ItemType.FUNCTION_CALL,
    ToolType.CUSTOM: ItemType.CUSTOM_TOOL_CALL,
}
#: the field holding a call's text (JSON arguments, or freeform input)
CALL_PAYLOAD: dict[str, str] = {ItemType.FUNCTION_CALL: "arguments", ItemType.CUSTOM_TOOL_CALL: "input"}

#: what a streaming parser can open (``inference.parse.ItemStart.kind``)
OutputKind = Literal["message", "reasoning", "function_call", "custom_tool_call"]
