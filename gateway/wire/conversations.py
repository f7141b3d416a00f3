"""The Conversations API on the wire: request bodies, the objects returned, and its errors.

Shapes follow the openai SDK's types (``openai.types.conversations``): ``conversation``,
``conversation.deleted``, conversation items (the Responses item shapes, each with every key its
SDK type declares: what an item lacks is an explicit ``null``), and item lists with ``first_id`` /
``last_id`` / ``has_more``. A missing conversation — and another tenant's, which must look the same —
is a 404 naming only the id the client sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.wire.errors import ApiError, bad_request
from gateway.wire.listing import list_object
from gateway.wire.request import IncludeValue, check_metadata
from gateway.wire.validation import to_api_error

#: items one create (of a conversation, or of its items) may add: OpenAI's limit
MAX_ITEMS_PER_REQUEST = 20

#: a finished turn whose items could not be appended to its conversation fails with this
CONVERSATION_FAILED_MESSAGE = (
    "The response's items could not be added to its conversation (it was deleted, or "
    "the conversation store is unavailable), so the conversation does not include this "
    "turn. Please retry your request."
)

#: optional keys the SDK declares per item type, echoed as null when the item has none
_ITEM_KEYS: dict[str, tuple[str, ...]] = {
    "message": ("phase",),
    "function_call": ("async", "caller", "namespace", "created_by"),
    "function_call_output": ("call_id", "caller", "created_by", "name", "namespace"),
    "custom_tool_call": ("async", "caller", "namespace"),
    "custom_tool_call_output": ("caller",),
    "reasoning": ("content", "status"),
}

#: the same for content parts (of a message's ``content``, a tool output's ``output`` list)
_PART_KEYS: dict[str, tuple[str, ...]] = {
    "input_text": ("prompt_cache_breakpoint",),
    "input_image": ("file_id", "image_url", "prompt_cache_breakpoint"),
    "input_file": ("detail", "file_data", "file_id", "file_url", "filename", "prompt_cache_breakpoint"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Metadata(_Strict):
    metadata: dict[str, str] | None = None

    @field_validator("metadata")
    @classmethod
    def _limits(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(v)


class CreateBody(_Metadata):
    """``POST /v1/conversations``."""

    items: list[Any] | None = Field(default=None, max_length=MAX_ITEMS_PER_REQUEST)


class UpdateBody(_Metadata):
    """``POST /v1/conversations/{id}``: ``metadata`` is required (null clears it)."""

    metadata: dict[str, str] | None = Field(...)


class ItemsBody(_Strict):
    """``POST /v1/conversations/{id}/items``."""

    items: list[Any] = Field(max_length=MAX_ITEMS_PER_REQUEST)
    include: list[IncludeValue] | None = None


def parse_body(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_type")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise to_api_error(exc) from None


def conversation_object(conversation_id: str, created_at: int, metadata: Mapping[str, str]) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation", "created_at": created_at, "metadata": dict(metadata)}


def deleted_object(conversation_id: str) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def item_object(item: Mapping[str, Any]) -> dict[str, Any]:
    """A stored item as the API returns it: a tool output's parts as its ``output`` (the canonical
    item keeps their text joined for renderers, ``gateway.wire.items.canonical_item``), and every
    key the SDK declares for its type."""
    out = dict(item)
    parts = out.pop("output_parts", None)
    if parts is not None:
        out["output"] = parts
    for key in _ITEM_KEYS.get(str(out.get("type")), ()):
        out.setdefault(key, None)
    for field in ("content", "output"):
        if isinstance(out.get(field), list):
            out[field] = [_part(p) for p in out[field]]
    return out


def _part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    keys = _PART_KEYS.get(str(kind), ())
    if not keys and kind != "output_text":
        return part
    out = dict(part)
    for key in keys:
        out.setdefault(key, None)
    if kind == "output_text":
        out.setdefault("logprobs", [])  # as the gateway's own output text parts carry them
    return out


def item_list(items: Sequence[Mapping[str, Any]], has_more: bool) -> dict[str, Any]:
    return list_object([item_object(i) for i in items], has_more)


def conversation_not_found(conversation_id: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"Conversation with id '{conversation_id}' not found.", param=param)


def item_not_found(item_id: str) -> ApiError:
    return ApiError(404, f"Item with id '{item_id}' not found.")


def conversation_full(conversation_id: str, max_items: int, max_bytes: int) -> ApiError:
    return bad_request(
        f"Conversation '{conversation_id}' cannot hold these items: a conversation holds at most "
        f"{max_items} items and {max_bytes} bytes of items. Delete items or start a new "
        "conversation.",
        code="conversation_too_large",
        param="items",
    )


def duplicate_item(item_id: str) -> ApiError:
    return bad_request(
        f"Duplicate item found with id {item_id}. Remove duplicate items from your input and try again.",
        code="invalid_value",
        param="items",
    )
