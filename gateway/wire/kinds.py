"""Kinds in one place: response statuses, and the map of what each tool kind needs where.

Item and tool types are ``inference/item_types.py`` (renderers and parsers compare against them too);
this module adds what only the gateway knows: the response lifecycle's statuses, and for each
callable tool kind the wire type, the call/answer items, the streamed events and where its
renderer, parser and classifier text live. The event builder, the pairing check, the classifier
texts and the finalizer read this map, so a new tool kind of the usual shape (a call with one
text payload, answered by an output) needs a row here plus the files the row names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from inference.item_types import CALL_PAYLOAD, CALL_TYPES, OUTPUT_TYPES, ItemType, ToolType

__all__ = [
    "CALL_TYPES",
    "CHAINABLE",
    "OUTPUT_TYPES",
    "TERMINAL_EVENT",
    "TOOL_KINDS",
    "ItemType",
    "ResponseStatus",
    "ToolKind",
    "ToolType",
    "call_kind",
]


class ResponseStatus(StrEnum):
    #: a background response accepted and not yet started (``gateway.sessions.background``)
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: a response another may continue from (``previous_response_id``)
CHAINABLE: frozenset[str] = frozenset({ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE})
#: the streamed event that ends a response in each terminal status (a cancelled one is never sent)
TERMINAL_EVENT: dict[str, str] = {
    ResponseStatus.COMPLETED: "response.completed",
    ResponseStatus.INCOMPLETE: "response.incomplete",
    ResponseStatus.FAILED: "response.failed",
    ResponseStatus.CANCELLED: "response.failed",
}


@dataclass(frozen=True, slots=True)
class ToolKind:
    """Everything a callable tool kind needs, and where it lives."""

    tool: ToolType  # ``tools[].type``; wire model in gateway/wire/tools.py
    call: ItemType  # the model's call item; wire model in gateway/wire/items.py
    output: ItemType  # the client's answer item (pairs by ``call_id``)
    payload: str  # the call's text field: streamed, classified, rendered
    id_prefix: str  # output item id prefix
    delta_event: str  # streamed while the payload grows
    done_event: str  # once the payload is complete
    #: renderer and parser per model family (harmony; chat templates)
    render: tuple[str, ...] = ("inference/harmony_render.py", "inference/chat_template_render.py")
    parse: tuple[str, ...] = ("inference/harmony_parse.py", "inference/hermes_parse.py")


TOOL_KINDS: dict[str, ToolKind] = {
    ItemType.FUNCTION_CALL: ToolKind(
        ToolType.FUNCTION,
        ItemType.FUNCTION_CALL,
        ItemType.FUNCTION_CALL_OUTPUT,
        CALL_PAYLOAD[ItemType.FUNCTION_CALL],
        "fc",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ),
    ItemType.CUSTOM_TOOL_CALL: ToolKind(
        ToolType.CUSTOM,
        ItemType.CUSTOM_TOOL_CALL,
        ItemType.CUSTOM_TOOL_CALL_OUTPUT,
        CALL_PAYLOAD[ItemType.CUSTOM_TOOL_CALL],
        "ctc",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
    ),
}
assert set(TOOL_KINDS) == CALL_TYPES and {k.output for k in TOOL_KINDS.values()} == OUTPUT_TYPES


def call_kind(item_type: str) -> ToolKind | None:
    """The tool kind of a call item type, or None for any other item."""
    return TOOL_KINDS.get(item_type)
