"""Request checks: what a create may ask for before anything is resolved or rendered.

Parameters the gateway does not serve (background mode over WebSocket, stored prompts) and what
background mode needs (``store``), tool definitions (hosted tools stripped or refused, asynchronous
tools refused) and ``tool_choice`` against the tools. Each refusal is OpenAI's error for it, naming the parameter. Pure functions of
the request: no I/O, nothing recorded.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Mapping

from gateway.turn.types import Transport
from gateway.wire.errors import ApiError, bad_request, model_not_found, unknown_parameter
from gateway.wire.request import CreateRequest
from gateway.wire.tools import HostedTool, canonical_tool, tool_names
from inference.kinds import ToolType
from inference.registry import ModelRegistry, ModelRoute
from inference.render import Prelude

HostedToolPolicy = Literal["strip", "reject"]


def check_params(body: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """A body limited to ``allowed`` top-level keys (endpoints narrower than a create)."""
    allowed = frozenset(allowed)
    for key in body:
        if key not in allowed:
            raise unknown_parameter(key)


def check_supported(req: CreateRequest, transport: Transport) -> None:
    if req.background:
        if transport == "ws":  # the WebSocket-mode spec: background stays an HTTP feature
            raise ApiError(400, "background mode is not supported over WebSocket.", code="unsupported_parameter",
                           param="background")
        if req.store is False:  # polling, cancel and resume all read the stored response
            raise bad_request("Background mode requires 'store' to be true.", code="invalid_value", param="store")
    window = req.background_options.completion_window if req.background_options is not None else None
    if window in ("2h", "8h") and (not req.background or req.stream):
        raise bad_request(f"The '{window}' completion window requires 'background' to be true and 'stream' to be "
                          "false.", code="invalid_value", param="background_options.completion_window")
    if req.conversation is not None:
        if req.previous_response_id is not None:
            raise bad_request("'previous_response_id' and 'conversation' cannot be used together.",
                              code="invalid_request", param="conversation")
        _check_conversation_input(req.input)
    if req.prompt is not None:
        raise ApiError(400, "Stored prompts are not supported by this gateway.", code="unsupported_parameter",
                       param="prompt")


def _check_conversation_input(raw: Any) -> None:
    """A client's ``compaction`` item replaces everything before it, which in a conversation would be
    the conversation itself; compaction in a conversation is ``context_management``'s (its output
    item is appended and windows the conversation's later turns, ``gateway.turn.conversation``)."""
    if not isinstance(raw, list):
        return
    for i, item in enumerate(raw):
        if isinstance(item, dict) and item.get("type") == "compaction":
            raise ApiError(400, "A compaction input item cannot be used with 'conversation': the conversation "
                           "keeps its own items. Use context_management to compact a conversation.",
                           code="unsupported_parameter", param=f"input[{i}]")


def route_and_tools(req: CreateRequest, registry: ModelRegistry,
                    hosted: HostedToolPolicy) -> tuple[ModelRoute, tuple[dict[str, Any], ...]]:
    """The served model and the tools as the Response echoes them (``tool_choice`` checked against them)."""
    route = registry.get(req.model)
    if route is None:
        raise model_not_found(req.model)
    tools = _tools(req, hosted)
    _check_tool_choice(req, tools)
    return route, tools


def prelude_of(req: CreateRequest, tools: tuple[dict[str, Any], ...]) -> Prelude:
    return Prelude(
        instructions=req.instructions,
        tools=tools,
        tool_choice="auto" if req.tool_choice is None else req.tool_choice,
        reasoning_effort=req.reasoning.effort if req.reasoning else None,
    )


def _tools(req: CreateRequest, hosted: HostedToolPolicy) -> tuple[dict[str, Any], ...]:
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(req.tools or []):
        if isinstance(tool, HostedTool):
            if hosted == "reject":
                raise ApiError(400, f"Tool type '{tool.type}' is not supported by this gateway.",
                               code="unsupported_value", param=f"tools[{i}].type")
            continue
        d = canonical_tool(tool)
        if d.get("async"):
            raise ApiError(400, "Asynchronous tools are not supported by this gateway.",
                           code="unsupported_value", param=f"tools[{i}].async")
        out.append(d)
    return tuple(out)


def _check_tool_choice(req: CreateRequest, tools: tuple[dict[str, Any], ...]) -> None:
    tc = req.tool_choice
    if not isinstance(tc, dict):
        return
    kind = tc.get("type")
    if kind in (ToolType.FUNCTION, ToolType.CUSTOM):
        name = tc.get("name")
        if not isinstance(name, str) or not any(n == name for (_, n) in tool_names(tools)):
            raise bad_request(f"Tool choice '{name}' not found in 'tools' parameter.", code="invalid_value",
                              param="tool_choice")
    elif kind == "allowed_tools":
        if tc.get("mode") not in ("auto", "required") or not isinstance(tc.get("tools"), list):
            raise bad_request("Invalid 'tool_choice': allowed_tools needs a mode and a tools list.",
                              code="invalid_value", param="tool_choice")
    elif kind is None:
        raise bad_request("Invalid 'tool_choice': missing 'type'.", code="invalid_value", param="tool_choice")
