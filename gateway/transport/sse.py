"""Server-sent events framing: ``event: <type>\\ndata: <json>\\n\\n``, LF only, one write per event.

Responses streams never end with ``[DONE]``: the stream closes after the terminal event. A stream
whose turn could not send its own terminal (cut by the shutdown deadline, or a fault of the
gateway) still ends with one: a flat ``error`` event (``ApiError.sse_event``), then the terminal of
the response as billed (``gateway.turn.events.late_terminal``; see
``gateway.transport.inflight.closing_events``).
"""

from __future__ import annotations

from typing import Any

import orjson


def sse_frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

