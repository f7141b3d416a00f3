"""Validators for real wire objects against the two published schemas (used by ``test_schemas.py``).

(a) **The openai SDK's own pydantic types** (``openai.types.responses``): the object must parse
with the type its ``type`` names, and — stricter than parsing — *every field the type declares
must be present as a key*, recursively through nested models (an ``Optional`` field may be
``null``, but not missing). The only exceptions are :data:`SDK_ABSENT_OK`, each with its reason.

(b) **The OpenResponses OpenAPI document** shipped in ``tests/schemas/`` (see its README): each
object is validated with ``jsonschema`` (Draft 2020-12, ``#/components/schemas/...`` refs resolved
through a ``referencing`` registry) against ``ResponseResource`` or the streaming-event schema its
``type`` maps to. The type -> schema map is read from the document's own ``text/event-stream``
``oneOf`` list. Where the document has no schema for something we send, :class:`OpenResponses`
records it in ``gaps`` and the caller says so (the SDK check still applies there).

**Two dialects** (``gateway.wire.dialects``). Events in OpenAI's dialect (the default) are checked
against the document leniently: an event the document names differently is validated against the
document's schema for it, under the document's name, and recorded in ``gaps``. That name map is the
product's own table (``OPENRESPONSES_EVENT_TYPES``): one source of truth for *which* events are the
same. Events in OpenResponses' dialect are checked with ``strict=True``: the document itself is the
oracle — the event's own ``type`` must be one the document's streaming ``oneOf`` lists, with no map
in between — so a wrong or missing row in the product's table fails there, not silently here.
"""

from __future__ import annotations

import copy
import json
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import pydantic
from jsonschema import Draft202012Validator
from openai.types.responses import Response
from openai.types.responses.response_stream_event import ResponseStreamEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from gateway.wire.dialects import OPENRESPONSES_EVENT_TYPES

SCHEMA_FILE = Path(__file__).parent / "schemas" / "openresponses-openapi-2026-04-24.json"
_DOC_URI = "urn:openresponses:openapi"

#: (SDK model name, field) pairs that may be absent, and why. Everything else the SDK declares
#: must be present.
SDK_ABSENT_OK: dict[tuple[str, str], str] = {
    (
        "ResponseReasoningItem",
        "encrypted_content",
    ): "OpenResponses types ReasoningBody.encrypted_content as a (non-null) string: it is sent only "
    "when include=['reasoning.encrypted_content'] asks for it",
    (
        "ResponseCompactionItem",
        "created_by",
    ): "OpenResponses types CompactionBody.created_by as a (non-null) string and the gateway has no "
    "actor id to put there",
    # The WebSocket error envelope as the project's spec pins it (spec/ws-mode.md §4.3):
    (
        "ResponseWsError",
        "sequence_number",
    ): "present when the error comes out of a response stream, absent on a request or connection error",
    ("ResponseWsErrorError", "headers"): "present when the error carries headers (rate limits)",
    (
        "ResponseWsErrorError",
        "misalignment",
    ): "the envelope's error object is exactly type/code/message/param(/headers)",
}
#: WebSocket envelope fields the SDK's ``ResponsesServerEvent`` variants declare: ``stream_id`` is
#: sent only on multiplexed lanes (a create that named one).
WS_ENVELOPE_ABSENT_OK = frozenset({"stream_id"})


def _variants(union: Any) -> dict[str, type[pydantic.BaseModel]]:
    """``type`` literal -> model class, for an SDK discriminated union."""
    args = typing.get_args(union)
    if args and typing.get_origin(union) is typing.Annotated:
        args = typing.get_args(args[0])
    out: dict[str, type[pydantic.BaseModel]] = {}
    for model in args:
        for literal in typing.get_args(model.model_fields["type"].annotation):
            out[literal] = model
    return out


SDK_EVENTS = _variants(ResponseStreamEvent)
SDK_WS_EVENTS = _variants(ResponsesServerEvent)


def _missing(model: Any, raw: Any, path: str, absent_ok: frozenset[str] = frozenset()) -> list[str]:
    """Declared fields of ``model`` (a parsed SDK object) whose keys are not in ``raw``, recursively."""
    out: list[str] = []
    if isinstance(model, pydantic.BaseModel) and isinstance(raw, dict):
        cls = type(model)
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key not in raw:
                if (cls.__name__, key) not in SDK_ABSENT_OK and not (path == "$" and key in absent_ok):
                    out.append(f"{path}.{key} ({cls.__name__})")
                continue
            out += _missing(getattr(model, name), raw[key], f"{path}.{key}")
    elif isinstance(model, (list, tuple)) and isinstance(raw, list):
        for i, (m, r) in enumerate(zip(model, raw)):
            out += _missing(m, r, f"{path}[{i}]")
    return out


def sdk_check(
    obj: dict[str, Any], model: type[pydantic.BaseModel], absent_ok: frozenset[str] = frozenset()
) -> list[str]:
    """Parse ``obj`` as ``model``; return problems (a parse error, or every missing declared field)."""
    try:
        parsed = model.model_validate(obj)
    except pydantic.ValidationError as exc:
        return [f"{model.__name__} does not parse: {exc}"]
    return _missing(parsed, obj, "$", absent_ok)


def sdk_check_response(obj: dict[str, Any]) -> list[str]:
    return sdk_check(obj, Response)


def sdk_check_event(ev: dict[str, Any], *, ws: bool = False) -> list[str]:
    """An SSE/WS event against ``ResponseStreamEvent``; on WS also against ``ResponsesServerEvent``."""
    problems: list[str] = []
    if ev["type"] != "error":  # the stream union's error event is SSE's flat one; WS errors are frames
        model = SDK_EVENTS.get(ev["type"])
        if model is None:
            return [f"the SDK's ResponseStreamEvent has no event type {ev['type']!r}"]
        body = {k: v for k, v in ev.items() if k != "stream_id"} if ws else ev
        problems += sdk_check(body, model)
    if ws:
        model = SDK_WS_EVENTS.get(ev["type"])
        if model is None:
            return problems + [f"the SDK's ResponsesServerEvent has no event type {ev['type']!r}"]
        problems += [f"[ws] {p}" for p in sdk_check(ev, model, WS_ENVELOPE_ABSENT_OK)]
    return problems


#: OpenAI's (the SDK's) event type -> the document's type, for events the document names
#: differently (its raw-reasoning events are ``response.reasoning.delta`` / ``.done``): the product's table
RENAMED: dict[str, str] = dict(OPENRESPONSES_EVENT_TYPES)


class OpenResponses:
    """The OpenResponses document as validators, plus a record of what it has no schema for."""

    def __init__(self, path: Path = SCHEMA_FILE) -> None:
        self.doc = json.loads(path.read_text(encoding="utf-8"))
        self.version = self.doc["info"]["version"]
        self.schemas: dict[str, Any] = self.doc["components"]["schemas"]
        resource = Resource.from_contents(self.doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(_DOC_URI, resource)
        self._validators: dict[str, Draft202012Validator] = {}
        stream = self.doc["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]
        #: streamed event type -> component schema name, from the document's own oneOf list
        self.event_schemas: dict[str, str] = {}
        for ref in stream["schema"]["oneOf"]:
            name = ref["$ref"].rsplit("/", 1)[-1]
            (literal,) = self.schemas[name]["properties"]["type"]["enum"]
            self.event_schemas[literal] = name
        ws = self.doc["paths"]["/responses"]["x-openresponses-websocket"]
        self.ws_error_schema = ws["errorMessage"]["$ref"].rsplit("/", 1)[-1]
        #: item / tool types ``ItemField`` / ``Tool`` know (their discriminator values)
        self.item_types = self._enum_types("ItemField")
        self.tool_types = self._enum_types("Tool")
        self.gaps: Counter[str] = Counter()

    def _enum_types(self, name: str) -> set[str]:
        node = self.schemas[name]
        refs = node.get("oneOf") or [node]
        types: set[str] = set()
        for ref in refs:
            target = self.schemas[ref["$ref"].rsplit("/", 1)[-1]]
            types.update(target["properties"]["type"]["enum"])
        return types

    def validator(self, name: str) -> Draft202012Validator:
        if name not in self._validators:
            assert name in self.schemas, name
            self._validators[name] = Draft202012Validator(
                {"$ref": f"{_DOC_URI}#/components/schemas/{name}"}, registry=self.registry
            )
        return self._validators[name]

    def errors(self, obj: Any, name: str) -> list[str]:
        return [
            f"{name} at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
            for e in self.validator(name).iter_errors(obj)
        ]

    # -- what the document cannot describe --------------------------------------------------------

    def _known_items(self, items: list[Any], where: str) -> list[Any]:
        kept = []
        for it in items:
            if isinstance(it, dict) and it.get("type") not in self.item_types:
                self.gaps[f"item type {it.get('type')!r} ({where})"] += 1
            else:
                kept.append(it)
        return kept

    def _describable_response(self, resp: dict[str, Any]) -> dict[str, Any]:
        """The Response minus output items / tools / tool_choice kinds the document has no schema for
        (each one recorded in ``gaps``); everything else is validated as sent."""
        resp = copy.copy(resp)
        resp["output"] = self._known_items(resp.get("output") or [], "Response.output")
        tools = []
        for t in resp.get("tools") or []:
            if t.get("type") not in self.tool_types:
                self.gaps[f"tool type {t.get('type')!r} (Response.tools)"] += 1
            else:
                tools.append(t)
        resp["tools"] = tools
        fmt = (resp.get("text") or {}).get("format") or {}
        if fmt.get("type") == "json_schema":
            # the document types JsonSchemaResponseFormat.schema as {"type": "null"}, so no echoed
            # schema could ever match; the other required keys (name, description, strict) are checked
            self.gaps["text.format json_schema 'schema' (the document types it as null)"] += 1
            resp["text"] = dict(resp["text"], format=dict(fmt, schema=None))
        return resp

    # -- entry points -------------------------------------------------------------------------------

    def response_errors(self, resp: dict[str, Any]) -> list[str]:
        return self.errors(self._describable_response(resp), "ResponseResource")

    def event_errors(self, ev: dict[str, Any], *, ws: bool = False, strict: bool = False) -> list[str]:
        """Problems of ``ev`` against the document's schema for it. ``strict`` (OpenResponses'
        dialect): its ``type`` must be the document's own, no renamed fallback (module docstring)."""
        kind = ev["type"]
        if kind == "error" and ws:
            return self.errors(ev, self.ws_error_schema)
        name = self.event_schemas.get(kind)
        ev = dict(ev)
        if name is None and kind in RENAMED and not strict:
            # same fields under another name: validate the body against the document's event
            theirs = RENAMED[kind]
            self.gaps[f"event type {kind!r} (checked as {theirs!r})"] += 1
            name, ev["type"] = self.event_schemas[theirs], theirs
        elif name is None and kind in RENAMED:
            return [f"event type {kind!r} is OpenAI's name: the document's stream has no such event"]
        elif name is None:
            self.gaps[f"event type {kind!r}"] += 1
            return []
        if ws:
            ev.pop("stream_id", None)
        if "response" in ev:
            ev["response"] = self._describable_response(ev["response"])
        if isinstance(ev.get("item"), dict) and ev["item"].get("type") not in self.item_types:
            self.gaps[f"item type {ev['item']['type']!r} ({kind})"] += 1
            return []
        return self.errors(ev, name)

    def http_error_errors(self, body: dict[str, Any]) -> list[str]:
        """An HTTP error body ``{"error": {...}}``: the document gives no schema for non-200 answers;
        its ``ErrorPayload`` (the error object of ``ErrorStreamingEvent``) is the same object."""
        return self.errors(body.get("error"), "ErrorPayload")


def typed_exactly(event: Any) -> bool:
    """The openai SDK parsed ``event`` into the class its ``type`` names (an unknown type would land
    in a class whose ``type`` literal differs, or in a bare model)."""
    field = type(event).model_fields.get("type")
    return field is not None and typing.get_args(field.annotation) == (event.type,)
