"""WebSocket frames written in one event-loop iteration leave the process in one ``send()``.

Why: a turn is a burst of small frames (``response.created``, ``in_progress``, ``output_item.added``,
the first delta …; at the end ``*.done`` and ``response.completed``), and uvicorn writes each one to
the socket as it is sent. On loopback or a virtualised NIC one ``send()`` system call costs tens of
microseconds and wakes the reader each time: profiled, the writes were ~30% of the gateway's CPU
for a short WebSocket turn and the largest single cost of a token stream. Frames that become ready
in the same loop iteration are now joined and written once, at the start of the next iteration
(``loop.call_soon``): no timer, no added wait beyond the rest of the current iteration, frame order
kept, and a frame produced on its own (a delta every few milliseconds) is written as before.

The cork sits under uvicorn's own WebSocket protocol (a subclass that wraps the transport it is
given), so framing, deflate, pings and close handshakes are uvicorn's and ``websockets``' code,
unchanged. ``close()`` flushes first; a buffer past :data:`FLUSH_BYTES` is written at once, so a
burst never holds more than that; ``get_write_buffer_size`` counts the corked bytes too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = ["CorkedTransport", "CorkedWebSocketProtocol", "FLUSH_BYTES"]

log = logging.getLogger(__name__)

#: corked bytes beyond which a write goes out at once (asyncio's default high-water mark)
FLUSH_BYTES = 64 * 1024


class CorkedTransport:
    """A transport wrapper whose ``write`` is deferred to the end of the loop iteration.

    Everything but writing, EOF and closing is delegated to the real transport. A deferred write
    that fails (its caller has already returned) aborts the connection and is logged.
    """

    __slots__ = ("_transport", "_loop", "_chunks", "_size", "_scheduled")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._chunks: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._chunks.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_soon)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush_soon(self) -> None:
        self._scheduled = False
        try:
            self.flush()
        except Exception:  # nobody awaits this write any more: end the connection, not the loop
            log.exception("deferred WebSocket write failed; aborting the connection")
            self._transport.abort()

    def flush(self) -> None:
        """Write what is corked, as one buffer (one ``send()`` when the socket takes it all)."""
        if not self._chunks:
            return
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._chunks.clear()
        self._size = 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


class CorkedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O ``websockets`` protocol, writing through a :class:`CorkedTransport`.

    Pass the class as uvicorn's ``ws`` option. uvicorn's HTTP protocol hands the upgraded
    connection's transport to ``connection_made``; flow control (``pause_writing``) still comes
    from the real transport, which calls this protocol.
    """

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(CorkedTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]

    async def send(self, message: Any) -> None:
        await super().send(message)
        if (message["type"] == "websocket.http.response.body" and not message.get("more_body", False)
                and self.initial_response is not None):
            # The handshake was answered with an HTTP response (a refusal: 401, 403, 429): as far as
            # the app is concerned it is complete. uvicorn would log "ASGI callable returned without
            # completing handshake" at ERROR for every refused handshake otherwise — an error line an
            # unauthenticated client could flood the logs with.
            self.handshake_complete = True
