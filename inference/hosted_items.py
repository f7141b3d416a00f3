"""Remote MCP items as the model saw them: one expansion into canonical calls and outputs.

Why one expansion: the Responses API keeps a remote MCP server's traffic in the conversation as
items of its own (``mcp_list_tools``, ``mcp_call``, ``mcp_approval_request``,
``mcp_approval_response``), while the model saw something else: the server's tools as a
``namespace`` tool in the prelude (namespace = ``server_label``), its own call to one of them
(harmony recipient ``<label>.<tool>``, chat-template function ``<label>__<tool>``) and a tool
output answering it. :func:`tool_view` rewrites the MCP items into exactly those canonical
``function_call`` / ``function_call_output`` items at the top of each renderer's item paths, so
nothing downstream (headers, assistant-message grouping, Hermes names, joins, the parsers) knows
MCP exists, and an MCP tool renders token for token as the equivalent namespace function tool.

======================================  ======================================================
item                                    renders as
======================================  ======================================================
``mcp_list_tools``                      nothing (the tools are in the prelude)
``mcp_call``                            ``function_call{call_id: id, name, namespace: label,
                                        arguments}`` then ``function_call_output{call_id: id,
                                        output, name, namespace}``
``mcp_call`` with                       only that output, ``call_id: approval_request_id``
``approval_request_id``                 (its approval request already rendered the call)
``mcp_approval_request``                ``function_call{call_id: id, name, namespace: label,
                                        arguments}`` (it ended the model's turn)
``mcp_approval_response`` approve true  nothing (the ``mcp_call`` after it carries the output)
``mcp_approval_response`` approve       ``function_call_output{call_id: approval_request_id,
false                                   output: DENIED[ + " Reason: " + reason]}``
======================================  ======================================================

The texts the model reads (fixed: the rendering is a pure function of the item, as the
incremental contract needs):

* an ``mcp_call``'s output is its ``output`` when that is not None; otherwise
  ``"Error: " + <the error>`` (:func:`error_text`): a string error as is; an error object
  (the SDK's ``McpToolCallError``) by its ``message`` (``http_error``, ``mcp_protocol_error``) or
  its ``content``'s text parts (``mcp_tool_execution_error``), else its JSON; no error at all
  (a call that never finished): :data:`NO_RESULT`. The ``Error: `` prefix is how the model tells
  a failed call from a tool that printed something.
* a refused approval: :data:`DENIED`, then ``" Reason: <reason>"`` when the client gave one.

:func:`call_of` and :func:`output_of` give the two halves on their own (an item's expansion is
their concatenation). The tool name of a refusal's output is not on the response item: the
renderers find it as for any output, among the earlier items (the approval request's expanded
call) or in the ``calls`` lookup, where the gateway must index each approval request by its
``id`` as the call :func:`call_of` returns. Every other expanded output carries its own ``name``
and ``namespace``, so it needs no lookup.

Cost: :func:`tool_view` is O(len(items)); a list without MCP items is returned as the same
object (one scan of the types, no copy: the hot path of a conversation without MCP).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from inference.item_types import MCP_ITEM_TYPES, ItemType

__all__ = ["DENIED", "ERROR_PREFIX", "NO_RESULT", "call_of", "error_text", "output_of", "tool_view"]

#: what the model reads for a call the client refused in its ``mcp_approval_response``
DENIED = "Error: the user did not approve this tool call, so it was not run."
#: the start of every output that stands for a failed call
ERROR_PREFIX = "Error: "
#: an ``mcp_call`` with neither output nor error (it never finished)
NO_RESULT = ERROR_PREFIX + "the tool call did not return a result."

Item = Mapping[str, Any]


def tool_view(items: Sequence[Item]) -> Sequence[Item]:
    """``items`` with every MCP item replaced by the canonical items it renders as (the module's
    table), in order; ``items`` itself (the same object) when it holds no MCP item."""
    if MCP_ITEM_TYPES.isdisjoint(item.get("type") for item in items):
        return items
    out: list[Item] = []
    for item in items:
        if item.get("type") in MCP_ITEM_TYPES:
            out += _expand(item)
        else:
            out.append(item)
    return out


def call_of(item: Item) -> dict[str, Any] | None:
    """The ``function_call`` an MCP item stands for (its ``call_id`` is the item's ``id``), or
    None: an ``mcp_approval_request``, or an ``mcp_call`` that needed no approval. The gateway's
    call lookup must find approval requests this way, for the output of a refusal in a later turn."""
    kind = item.get("type")
    if kind == ItemType.MCP_APPROVAL_REQUEST or (kind == ItemType.MCP_CALL and not item.get("approval_request_id")):
        return _call(item)
    return None


def _call(item: Item) -> dict[str, Any]:
    call: dict[str, Any] = {
        "type": ItemType.FUNCTION_CALL.value,
        "call_id": str(item.get("id")),
        "name": str(item.get("name")),
        "arguments": item.get("arguments") or "",
    }
    if item.get("server_label"):
        call["namespace"] = str(item["server_label"])
    return call


def output_of(item: Item) -> dict[str, Any] | None:
    """The ``function_call_output`` an MCP item stands for, or None: an ``mcp_call``'s result (what
    a tool loop appends after the model's call: the call's tokens are the model's own) or a
    refused ``mcp_approval_response``'s :data:`DENIED` text."""
    kind = item.get("type")
    if kind == ItemType.MCP_CALL:
        output = item.get("output")
        result: dict[str, Any] = {
            "type": ItemType.FUNCTION_CALL_OUTPUT.value,
            "call_id": str(item.get("approval_request_id") or item.get("id")),
            "output": str(output) if output is not None else error_text(item.get("error")),
            "name": str(item.get("name")),
        }
        if item.get("server_label"):
            result["namespace"] = str(item["server_label"])
        return result
    if kind == ItemType.MCP_APPROVAL_RESPONSE and not item.get("approve"):
        reason = item.get("reason")
        return {
            "type": ItemType.FUNCTION_CALL_OUTPUT.value,
            "call_id": str(item.get("approval_request_id")),
            "output": f"{DENIED} Reason: {reason}" if reason else DENIED,
        }
    return None


def error_text(error: Any) -> str:
    """What the model reads for a failed ``mcp_call`` (see the module docstring)."""
    if error is None:
        return NO_RESULT
    if isinstance(error, str):
        return ERROR_PREFIX + error
    if isinstance(error, Mapping):
        if error.get("message"):
            return ERROR_PREFIX + str(error["message"])
        content = error.get("content")
        if isinstance(content, str):
            return ERROR_PREFIX + content
        if isinstance(content, list) and content and all(isinstance(p, Mapping) and "text" in p for p in content):
            return ERROR_PREFIX + "\n".join(str(p["text"]) for p in content)
    return ERROR_PREFIX + orjson.dumps(error, option=orjson.OPT_SORT_KEYS, default=str).decode()


def _expand(item: Item) -> list[Item]:
    """The call and/or the output an MCP item stands for (none: ``mcp_list_tools``, an approval)."""
    return [part for part in (call_of(item), output_of(item)) if part is not None]
