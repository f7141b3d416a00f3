"""Server-sent events framing: ``event: <type>\\ndata: <json>\\n\\n``, LF only, one write per event.

Responses streams never end with ``[DONE]``: the stream closes after the terminal event.
"""

from __future__ import annotations

from typing import Any

import orjson


def sse_frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

