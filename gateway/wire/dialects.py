"""Event dialects: OpenAI's streamed events, or the same stream as the OpenResponses spec names it.

The OpenResponses specification (2026-04-24; ``tests/schemas/``) is OpenAI's Responses API with a
few streamed events spelled differently. A client that validates every event against that document
rejects OpenAI's spelling, and the openai SDK does not know the other one, so the gateway speaks
both: **OpenAI's by default** (every existing client unchanged, byte for byte), **OpenResponses'**
when the operator sets it for every model or for some (``event_dialect``,
``model_event_dialects``) or the client asks — per request on a create's headers, per connection on
the WebSocket upgrade:

* ``OpenResponses-Version: latest`` (or a release date the gateway implements): the header the
  OpenResponses site's own examples send (its curl snippets always carry ``OpenResponses-Version:
  latest``) and the clients built on them; a client that already sends it needs no change;
* ``Respgate-Event-Dialect: openai|openresponses``: either way, explicitly (it wins over the other
  header and over the operator's setting: an OpenAI client on a model set to OpenResponses);
* ``?event_dialect=...`` on the WebSocket URL, for browsers, whose WebSocket API sets no headers.

A value the gateway does not know is a 400 naming the header (a WebSocket upgrade is refused before
the 101), never silently the other dialect: a client that asked for a dialect validates against it.

**What differs** (every streaming-event schema of the document compared with what the gateway sends;
the document has no ``additionalProperties: false``, so fields it lacks, such as ``stream_id``, pass):

=============================================  ================================================
OpenAI (the openai SDK's types)                OpenResponses 2026-04-24
=============================================  ================================================
``response.reasoning_text.delta`` / ``.done``  ``response.reasoning.delta`` / ``.done`` (same fields)
SSE ``error``: flat ``code``/``message``/      ``ErrorStreamingEvent``: those under ``error``, with
``param`` (the SDK raises on an ``error`` key)  the error's ``type`` (``ErrorPayload``)
WebSocket ``error`` frame: ``error.code`` may  ``WebSocketErrorEvent``: ``error.code`` is a string
be ``null``                                    (the error's ``type`` stands in for a missing code)
an SSE stream ends after its terminal event    "The terminal event MUST be the literal string
                                               ``[DONE]``" (``gateway.transport.sse.SSE_DONE``)
=============================================  ================================================

Everything else — the lifecycle events, items, content parts (``reasoning_text`` parts in
``content_part.*`` are in both), deltas, the Response — is the same in both. Events the document has
no schema for at all (``response.custom_tool_call_input.*``, ``response.mcp_*``, ``response.steer.*``)
keep OpenAI's names in both dialects: they only follow a request that used an OpenAI-only tool or
event (custom and MCP tools, steering), whose client knows them; the spec's rule for extensions (an
implementor prefix, ``openai:...``) would have to rename their item types too, which a client sends
back as input.

**Where it happens.** A turn's events are built in OpenAI's dialect (``gateway.turn.events``), and
are translated once, on their way out (``gateway.turn.pipeline``: :func:`translate` per event, a
dict lookup; an event that needs no change is passed on as it is, not copied). Logs of stored
events (background streams, ``gateway.sessions``) keep OpenAI's dialect, and a reader gets them in
*its* dialect (:func:`translate_encoded`): a stream created in one dialect may be resumed in the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Final

import orjson

from gateway.base.settings import Settings
from gateway.wire.errors import ApiError, bad_request

Event = dict[str, Any]


class EventDialect(StrEnum):
    #: OpenAI's names and shapes, as the openai SDKs' types declare them (the default)
    OPENAI = "openai"
    #: the OpenResponses specification's (``tests/schemas/openresponses-openapi-2026-04-24.json``)
    OPENRESPONSES = "openresponses"


#: a setting's value -> its dialect (a dict lookup: cheaper than calling the enum, once a turn)
_BY_NAME: Final[Mapping[str, EventDialect]] = {d.value: d for d in EventDialect}

#: the explicit request header (any dialect), on a create or on the WebSocket upgrade
DIALECT_HEADER: Final = "respgate-event-dialect"
#: the OpenResponses convention: its presence asks for OpenResponses' dialect
OPENRESPONSES_VERSION_HEADER: Final = "openresponses-version"
#: the WebSocket URL's query parameter (browsers), as :data:`DIALECT_HEADER`
DIALECT_QUERY: Final = "event_dialect"
#: ``OpenResponses-Version`` values served: the releases whose streaming events this module
#: implements (January's are April's without the WebSocket schemas), and ``latest``
OPENRESPONSES_VERSIONS: Final = ("latest", "2026-04-24", "2026-01-15")

#: OpenAI's event type -> OpenResponses' name for the same event (same fields): the dialect's table
OPENRESPONSES_EVENT_TYPES: Final[Mapping[str, str]] = {
    "response.reasoning_text.delta": "response.reasoning.delta",
    "response.reasoning_text.done": "response.reasoning.done",
}

#: the flat SSE error event carries no error ``type``; OpenResponses' ``ErrorPayload`` needs one.
#: The codes the gateway's stream errors can carry that are server errors (every other is a request's)
_SERVER_ERROR_CODES: Final = frozenset({"server_error", "server_shutting_down", "server_is_overloaded"})


def _renamed(name: str) -> Callable[[Event], Event]:
    def rename(ev: Event) -> Event:
        return dict(ev, type=name)  # ``type`` keeps its place (first)

    return rename


def _error(ev: Event) -> Event:
    """An ``error`` event or frame as ``ErrorStreamingEvent`` / ``WebSocketErrorEvent`` want it."""
    err = ev.get("error")
    if isinstance(err, dict):  # a WebSocket frame: nested already; its code must be a string
        if err.get("code") is not None:
            return ev
        return dict(ev, error=dict(err, code=err.get("type") or "error"))
    code = ev.get("code")
    kind = "server_error" if code in _SERVER_ERROR_CODES else "invalid_request_error"
    out: Event = {"type": "error", "sequence_number": ev.get("sequence_number", 0)}
    out["error"] = {"type": kind, "code": code, "message": ev.get("message", ""), "param": ev.get("param")}
    for k, v in ev.items():  # what a transport added (``stream_id``, ``server_timing``) stays
        if k not in out and k not in ("code", "message", "param"):
            out[k] = v
    return out


#: event type -> how OpenResponses' dialect writes it; a type not here is written as it is
_OPENRESPONSES: Final[Mapping[str, Callable[[Event], Event]]] = {
    **{ours: _renamed(theirs) for ours, theirs in OPENRESPONSES_EVENT_TYPES.items()},
    "error": _error,
}


def translate(ev: Event) -> Event:
    """``ev`` (OpenAI's dialect) in OpenResponses': a new dict where the two differ, else ``ev``
    itself. The hot path: one dict lookup per event."""
    fix = _OPENRESPONSES.get(ev["type"])
    return ev if fix is None else fix(ev)


def translate_encoded(kind: str, data: bytes, dialect: EventDialect) -> tuple[str, bytes]:
    """An event as a log keeps it (its ``type`` and JSON, OpenAI's dialect) in ``dialect``: decoded
    and encoded again only when the dialects differ for it."""
    if dialect is EventDialect.OPENAI or kind not in _OPENRESPONSES:
        return kind, data
    ev = translate(orjson.loads(data))
    return ev["type"], orjson.dumps(ev)


def ws_error_frame(err: ApiError, stream_id: str | None, dialect: EventDialect) -> Event:
    """The WebSocket ``error`` frame of ``err`` in ``dialect``."""
    frame = err.ws_frame(stream_id)
    return frame if dialect is EventDialect.OPENAI else _error(frame)


def _joined(headers: Mapping[str, str], name: str) -> str | None:
    """A header's lines as the one line they mean (RFC 9110 §5.3: a repeated field is its values
    joined by commas), so two contradicting lines are refused as one line holding both is."""
    getlist = getattr(headers, "getlist", None)
    if getlist is None:
        return headers.get(name)
    values = getlist(name)
    return ", ".join(values) if values else None


def asked_dialect(headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> EventDialect | None:
    """The dialect a request (or a WebSocket upgrade, with its ``query``) asks for; None: it asks for
    none (the operator's setting decides). Raises a 400 ``ApiError`` naming a header (or the query
    parameter) whose value is not one the gateway serves."""
    version = _joined(headers, OPENRESPONSES_VERSION_HEADER)
    if version is not None and version.strip().lower() not in OPENRESPONSES_VERSIONS:
        raise bad_request(
            f"Unsupported OpenResponses-Version header: {version[:64]!r}. This server implements "
            f"{', '.join(repr(v) for v in OPENRESPONSES_VERSIONS)}.",
            code="invalid_value",
            param="OpenResponses-Version",
        )
    explicit = _joined(headers, DIALECT_HEADER)
    where = "Respgate-Event-Dialect header"
    if explicit is None and query is not None:
        explicit, where = query.get(DIALECT_QUERY), f"'{DIALECT_QUERY}' query parameter"
    if explicit is not None:
        try:
            return EventDialect(explicit.strip().lower())
        except ValueError:
            raise bad_request(
                f"Invalid {where}: {explicit[:64]!r}. Expected one of "
                f"{', '.join(repr(d.value) for d in EventDialect)}.",
                code="invalid_value",
                param="Respgate-Event-Dialect" if where.endswith("header") else DIALECT_QUERY,
            ) from None
    return EventDialect.OPENRESPONSES if version is not None else None


def served_dialect(settings: Settings, asked: EventDialect | None, model: str | None) -> EventDialect:
    """The dialect a response's events are sent in: the client's ask, else the operator's setting
    for the model, else the operator's default."""
    if asked is not None:
        return asked
    by_model = settings.model_event_dialects
    if by_model and model in by_model:
        return _BY_NAME[by_model[model]]
    return _BY_NAME[settings.event_dialect]
