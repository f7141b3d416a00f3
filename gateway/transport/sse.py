"""Server-sent events framing: ``event: <type>\\ndata: <json>\\n\\n``, LF only, one write per event.

OpenAI's Responses streams never end with ``[DONE]``: the stream closes after the terminal event
(in the OpenResponses dialect, ``gateway.wire.dialects``, that spec's ``data: [DONE]`` follows it:
:data:`SSE_DONE`). A stream
whose turn could not send its own terminal (cut by the shutdown deadline, or a fault of the
gateway) still ends with one: a flat ``error`` event (``ApiError.sse_event``), then the terminal of
the response as billed (``gateway.turn.events.late_terminal``; see
``gateway.transport.inflight.closing_events``).

**Server-Timing, for clients that ask.** A JSON create answers with a ``Server-Timing`` header
(the turn's stages, ``gateway.base.metrics.StageTimer.server_timing``). A stream's headers leave
before any stage after ``render`` ran, and HTTP trailers are dropped by most clients and proxies, so
a stream carries it only when the request opts in with ``Respgate-Server-Timing: 1``: then the
terminal event's frame starts with an SSE *comment* line, ``: server-timing <value>``. Every SSE
parser ignores comment lines (the WHATWG event-stream rules; the openai SDKs' decoders, the AI SDK's
``eventsource-parser``), so no event is added, none changes, and a schema-validating client sees the
same stream; the line rides in the terminal's own write, after every stage but the last send. Off
by default all the same: a proxy that rewrites streams is not obliged to keep comments, and nobody
should pay for bytes they did not ask for. (The WebSocket form: ``gateway.transport.ws``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

#: the opt-in request header (on a create, or on the WebSocket upgrade)
SERVER_TIMING_OPT_IN = "respgate-server-timing"
_YES = frozenset({"1", "true", "on", "yes"})
#: the OpenResponses spec's end of a stream ("The terminal event MUST be the literal string [DONE]")
SSE_DONE = b"data: [DONE]\n\n"


def sse_frame(event: dict[str, Any]) -> bytes:
    return sse_encoded(event["type"], orjson.dumps(event))


def sse_encoded(kind: str, data: bytes) -> bytes:
    """The frame of an event already encoded (its ``type`` and JSON: how an event log keeps it)."""
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def wants_server_timing(headers: Mapping[str, str]) -> bool:
    """Whether a request opted in to Server-Timing on its stream."""
    value = headers.get(SERVER_TIMING_OPT_IN)
    return value is not None and value.strip().lower() in _YES


def timing_comment(value: str) -> bytes:
    """The SSE comment line carrying a Server-Timing value (no CR or LF can be in it: it is ours)."""
    return b": server-timing " + value.encode() + b"\n"
