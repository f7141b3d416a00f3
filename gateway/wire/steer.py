"""``response.steer`` on the wire: the client event's input, checked, and the three server events.

The shapes are OpenAI's (openai-python's ``ResponseSteerEvent``, ``ResponseSteerAcceptedEvent``,
``ResponseSteerPendingEvent``, ``ResponseSteerFailedEvent``; spec/ws-mode.md §3.3): a steer names
the **active** response (``previous_response_id``) and carries ``input``, a string or a non-empty
list of **user** messages, each with only ``type`` (optional, ``message``), ``role`` and
``content`` (a string, or ``input_text`` / ``input_image`` / ``input_file`` parts). Nothing else
is accepted — no ``stream_id`` (the target response's lane is the steer's), no tool outputs
(the reference text; the SDK's type also lists ``function_call_output``, which a steer could
only misplace: a call's output belongs right after the call, not before the caller's next turn).

Why a model of its own and not the create's ``Message``: that one is lenient (clients replay
server items with extra keys); a steer is a new, narrow event, and the failed event must name
the field that is wrong (``input[0].role``), which strict models with ``extra="forbid"`` give.
"""

from __future__ import annotations

import enum
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from gateway.wire.items import ToolOutput
from gateway.wire.validation import json_type, to_api_error

#: the only keys a ``response.steer`` frame may carry
STEER_FIELDS = frozenset({"type", "previous_response_id", "input"})


class SteerCode(enum.StrEnum):
    """``response.steer.failed`` codes (``ResponseSteerErrorCode``; clients handle unknown ones)."""

    RESPONSE_NOT_FOUND = "response_not_found"
    INVALID_INPUT = "invalid_input"
    NOT_SUPPORTED = "steering_not_supported"
    TOO_MANY = "too_many_pending_steers"
    ALREADY_COMPLETED = "response_already_completed"
    NOT_ACTIVE = "response_not_active"
    SUCCESSOR_FAILED = "successor_creation_failed"


#: ``response.steer.pending``'s one known reason
WAITING_FOR_REQUIRED_INPUT = "waiting_for_required_input"


class SteerMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["message"] = "message"
    role: Literal["user"]
    #: the SDK's message type declares these two (an id a client made, a replayed status): ignored
    id: str | None = None
    status: str | None = None
    #: a string, or input_text / input_image / input_file parts: what a tool output may hold too
    content: ToolOutput


_MESSAGES: TypeAdapter[list[SteerMessage]] = TypeAdapter(list[SteerMessage])


class SteerRejected(Exception):
    """The frame is not a valid steer: ``message`` names the field (the failed event's text)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def steer_target(frame: dict[str, Any]) -> str:
    """The target of a steer frame whose shape holds, or :class:`SteerRejected` naming what is
    wrong: an unknown key, a missing target, input that is not a string or a non-empty list of
    user messages. One look at each item's ``type`` and ``role``, nothing deeper: the frame may
    be big, and this runs on the event loop before the target is looked up
    (``gateway.transport.ws``); its contents are :func:`steer_items`' (off the loop when big)."""
    extra = sorted(set(frame) - STEER_FIELDS)
    if extra:
        hint = " The target response decides the lane." if "stream_id" in extra else ""
        raise SteerRejected(f"Unknown parameter: '{extra[0]}'.{hint}", extra[0])
    target = frame.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise SteerRejected("Missing required parameter: 'previous_response_id'.", "previous_response_id")
    if "input" not in frame:
        raise SteerRejected("Missing required parameter: 'input'.", "input")
    items = frame["input"]
    if not isinstance(items, (str, list)):
        raise SteerRejected(
            f"Invalid type for 'input': expected a string or an array of user messages, but got "
            f"{json_type(items)} instead.",
            "input",
        )
    if isinstance(items, list):
        if not items:
            raise SteerRejected("Invalid 'input': expected a string or a non-empty array of user messages.", "input")
        for i, item in enumerate(items):
            kind = item.get("type", "message") if isinstance(item, dict) else json_type(item)
            if kind != "message":
                raise SteerRejected(
                    f"Invalid 'input[{i}]': response.steer input may contain only user messages, not {kind!r} "
                    "(send tool outputs with response.create).",
                    f"input[{i}]",
                )
            if item.get("role") != "user":
                role = item.get("role")
                raise SteerRejected(
                    f"Invalid 'input[{i}].role': response.steer input may contain only user messages, not {role!r}."
                    if "role" in item
                    else f"Missing required parameter: 'input[{i}].role'.",
                    f"input[{i}].role",
                )
    return target


def user_message(content: Any) -> dict[str, Any]:
    """A user message input item with ``content`` as given (a string or input parts)."""
    return {"type": "message", "role": "user", "content": content}


def steer_items(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """The input of a steer frame :func:`steer_target` passed, as create input items (user
    messages, content as sent), or :class:`SteerRejected` naming the field that is wrong."""
    items = frame["input"]
    if isinstance(items, str):
        return [user_message(items)]
    try:
        _MESSAGES.validate_python(items)
    except ValidationError as exc:
        err = to_api_error(exc)
        # the adapter's locations start at the list: the client's path starts at ``input``
        param = f"input{err.param or ''}"
        message = err.message.replace(f"'{err.param}'", f"'{param}'")
        if f"'{param}'" not in message:  # the failed event has no ``param``: its text names the field
            message = f"Invalid '{param}': {message}"
        raise SteerRejected(message, param) from None
    # the content as sent (validated above): the model's dump would add the parts' defaults
    return [user_message(m["content"]) for m in items]


def new_steer_id() -> str:
    """``steer_`` + 32 hex digits, as OpenAI's look."""
    return f"steer_{secrets.token_hex(16)}"


def accepted(seq: int, steer_id: str, target: str) -> dict[str, Any]:
    return {
        "type": "response.steer.accepted",
        "sequence_number": seq,
        "steer": {"id": steer_id, "previous_response_id": target},
    }


def pending(seq: int, steer_id: str, target: str, required_input: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "response.steer.pending",
        "sequence_number": seq,
        "steer": {"id": steer_id, "previous_response_id": target},
        "reason": WAITING_FOR_REQUIRED_INPUT,
        "required_input": required_input,
    }


def failed(
    seq: int, steer_id: str | None, target: Any, steer_input: Any, code: SteerCode, message: str
) -> dict[str, Any]:
    """The input is handed back (``steer.input``, as sent); ``steer.id`` only once one was assigned."""
    # the SDK declares both (a string; a string or a list): a frame that lacked them gets ""
    steer: dict[str, Any] = {
        "previous_response_id": target if isinstance(target, str) else "",
        "input": "" if steer_input is None else steer_input,
    }
    if steer_id is not None:
        steer["id"] = steer_id
    return {
        "type": "response.steer.failed",
        "sequence_number": seq,
        "steer": steer,
        "error": {"type": "invalid_request_error", "code": code.value, "message": message},
    }


def required_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stubs of what a completed response waits for from the client (``ResponseSteerRequiredInput``):
    one per client-run call and per approval request, identifying fields only."""
    stubs: list[dict[str, Any]] = []
    for item in output:
        kind = item.get("type")
        if kind == "function_call":
            stubs.append({"type": "function_call_output", "call_id": item["call_id"], "name": item["name"]})
        elif kind == "custom_tool_call":
            stubs.append({"type": "custom_tool_call_output", "call_id": item["call_id"]})
        elif kind == "mcp_approval_request":
            stubs.append({"type": "mcp_approval_response", "approval_request_id": item["id"]})
    return stubs
