"""The create request (``POST /v1/responses`` body == WebSocket ``response.create`` minus ``type``).

Top-level fields are strict (an unknown one is ``400 unknown_parameter``, as OpenAI does); items
and tools are lenient (clients add keys). WebSocket-only fields (``stream_id``, ``generate``) are
rejected on HTTP. ``parse_create`` is the single entry point both transports use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError, field_validator

from gateway.wire.errors import ApiError, bad_request, missing_parameter, unknown_parameter
from gateway.wire.items import InputItem
from gateway.wire.tools import HOSTED_TOOL_TYPES, Tool
from gateway.wire.validation import json_type, to_api_error

IncludeValue = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FormatText(_Strict):
    type: Literal["text"]


class FormatJsonObject(_Strict):
    type: Literal["json_object"]


class FormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


def _fmt_tag(v: Any) -> str | None:
    return v.get("type") if isinstance(v, dict) else None


TextFormat = Annotated[
    Annotated[FormatText, Tag("text")]
    | Annotated[FormatJsonObject, Tag("json_object")]
    | Annotated[FormatJsonSchema, Tag("json_schema")],
    Discriminator(_fmt_tag),
]


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: Literal["standard", "pro"] | None = None


class ConversationParam(_Strict):
    """``conversation: {"id": ...}`` (the other accepted form is the bare id string)."""

    id: str


def _conversation_tag(v: Any) -> str:
    return "<id>" if isinstance(v, str) else "<object>"


#: ``conversation``: an id, or ``{"id": ...}`` (tags in ``<>`` stay out of error paths)
ConversationField = Annotated[
    Annotated[str, Tag("<id>")] | Annotated[ConversationParam, Tag("<object>")],
    Discriminator(_conversation_tag),
]


def check_metadata(v: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's metadata bounds: at most 16 pairs, keys <= 64 and values <= 512 characters."""
    if v is None:
        return v
    if len(v) > 16:
        raise ValueError("Invalid 'metadata': too many properties. Expected at most 16.")
    for k, val in v.items():
        if len(k) > 64 or len(val) > 512:
            raise ValueError("Invalid 'metadata': keys must be <= 64 characters and values <= 512 characters.")
    return v


class BackgroundOptions(_Strict):
    #: every window is served as ``soonest``: a background response starts as soon as it is accepted,
    #: which meets any completion window (there is no discounted tier to wait for)
    completion_window: Literal["soonest", "2h", "8h"] | None = None


class CompactionConfig(_Strict):
    type: Literal["compaction"]
    compact_threshold: int | None = Field(default=None, ge=1000)


class CreateRequest(_Strict):
    # --- WebSocket envelope (rejected on HTTP) ---
    type: Literal["response.create"] | None = None
    stream_id: str | None = None
    generate: bool | None = None
    # --- the create body ---
    model: str
    input: Any = None
    instructions: str | None = None
    previous_response_id: str | None = None
    #: the conversation this turn reads and extends (``gateway.turn.conversation``)
    conversation: ConversationField | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    background: bool | None = None
    background_options: BackgroundOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_output_tokens: int | None = Field(default=None, ge=16)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    #: echoed on the Response (OpenResponses requires both); the engines' SamplingParams have no
    #: penalties yet, so they do not change sampling
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[IncludeValue] | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    #: vLLM's per-request prefix-cache salt (not in OpenAI's schema): separates this client's caches
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    user: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    context_management: list[CompactionConfig] | None = None
    prompt: Any = None
    moderation: Any = None
    client_metadata: dict[str, Any] | None = None
    access_programs: Any = None
    seed: int | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(v)

    @property
    def conversation_id(self) -> str | None:
        c = self.conversation
        return c.id if isinstance(c, ConversationParam) else c


_items = TypeAdapter(list[InputItem])


def parse_create(
    body: Any, *, transport: Literal["http", "ws"], known: Sequence[Any] | None = None
) -> tuple[CreateRequest, list[Any]]:
    """Validate a create body; returns the request and its validated input items (models).
    ``known[i]``, when not None, is ``input[i]`` validated before (``gateway.turn.checks.ItemChecks``):
    only the others are validated."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_type")
    if transport == "http":
        for ws_only in ("type", "stream_id", "generate"):
            if ws_only in body:
                raise unknown_parameter(ws_only)
    try:
        req = CreateRequest.model_validate(body)
    except ValidationError as exc:
        raise to_api_error(exc) from None
    if isinstance(req.tool_choice, dict):
        check_tool_choice_type(req.tool_choice)
    raw = req.input
    if raw is None:
        items: list[Any] = []
    elif isinstance(raw, str):
        if len(raw) > 10_485_760:
            raise bad_request("Invalid 'input': string too long.", code="string_above_max_length", param="input")
        items = [raw]
    elif isinstance(raw, list):
        items = parse_items(raw, "input") if known is None else _parse_unknown(raw, known)
    else:
        raise ApiError(
            400,
            "Invalid type for 'input': expected a string or an array of input items.",
            code="invalid_type",
            param="input",
        )
    return req, items


#: ``tool_choice.type`` values a request may name: the tools rendered for the model, ``allowed_tools``, and
#: the hosted tools (stripped like the tools themselves, ``gateway.wire.tools``)
TOOL_CHOICE_TYPES = frozenset({"function", "custom", "allowed_tools", "mcp", *HOSTED_TOOL_TYPES})


def check_tool_choice_type(choice: dict[str, Any]) -> None:
    """An object ``tool_choice`` names a known ``type`` (a string): checked here, before any stage
    looks it up in a set (a list or object there is unhashable: issue 28 item 13 was a 500)."""
    kind = choice.get("type")
    if kind is None:
        raise missing_parameter("tool_choice.type")
    if not isinstance(kind, str):
        raise ApiError(
            400,
            f"Invalid type for 'tool_choice.type': expected a string, but got {json_type(kind)} instead.",
            code="invalid_type",
            param="tool_choice.type",
        )
    if kind not in TOOL_CHOICE_TYPES:
        supported = ", ".join(f"'{t}'" for t in sorted(TOOL_CHOICE_TYPES))
        raise ApiError(
            400,
            f"Invalid value: '{kind[:64]}'. Supported values are: {supported}.",
            code="invalid_value",
            param="tool_choice.type",
        )


def _parse_unknown(raw: list[Any], known: Sequence[Any]) -> list[Any]:
    """``raw`` validated where ``known`` has no model; a refusal is the whole list's (the same
    error and ``param`` as without ``known``: the known items have none)."""
    todo = [i for i, model in enumerate(known) if model is None]
    if len(todo) == len(raw):
        return parse_items(raw, "input")
    try:
        fresh = _items.validate_python([raw[i] for i in todo])
    except ValidationError:
        return parse_items(raw, "input")  # raises, naming input[i] as a whole-list check does
    items = list(known)
    for i, model in zip(todo, fresh):
        items[i] = model
    return items


def parse_items(raw: list[Any], param: str) -> list[Any]:
    """Validate a list of input items (a create's ``input``, a conversation's ``items``); errors name
    ``param[i]...``."""
    try:
        return _items.validate_python(raw)
    except ValidationError as exc:
        err = to_api_error(exc)
        err.param = f"{param}{err.param}" if err.param and err.param.startswith("[") else (err.param or param)
        err.message = err.message.replace("'[", f"'{param}[")
        raise err from None
