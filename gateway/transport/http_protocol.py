"""uvicorn's HTTP protocol with a bounded request head, whichever parser runs (httptools or h11).

Why: uvicorn bounds a request's header block only through ``h11_max_incomplete_event_size``, which
the h11 parser honours and httptools — the parser uvicorn picks when it is installed — ignores: a
64 MiB header was read in full (httptools concatenates a growing value chunk by chunk) and answered
200. Nor does uvicorn time out a request head: a socket that dribbles a header byte every few
seconds (slowloris), or never sends anything, holds its connection for ever. Both are enforced
here, in front of the parser, the same way for both parsers:

* **Head size** (``max_header_bytes``): bytes are fed to the parser at most up to the limit while
  the head is incomplete; still incomplete there is a 431 and the connection is closed. (A head
  that begins in the same read as the end of a previous pipelined request is counted from the
  next read on: it is bounded by the limit plus one read.)
* **Head time** (``header_timeout_s``): from the connection, or from the first byte of a kept-alive
  connection's next request, to the end of the head; beyond, 408 (nothing received: just closed).
  The keep-alive timeout still governs idle time between requests.

The body's pace is checked where the body is read (``http_routes._json_body``, ``body_timeout_s``).
A refusal is counted (``respgate_input_rejections_total{transport="http",reason}``: header_size,
header_timeout) and logged rate-limited, without a traceback. The answer is written, the write side
shut, and the rest of what the client sends read and dropped for a moment (at most
``LINGER_BYTES`` and ``LINGER_S``) before closing: closing with unread data would reset the
connection and a client still sending would never see the status.

A WebSocket handshake is a request head like any other: it is bounded the same way before uvicorn
hands the socket to the WebSocket protocol (``CorkedWebSocketProtocol``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.base.log_limit import RateLimitedLog
from gateway.base.settings import Settings

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is optional for uvicorn
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

#: after a refusal, what is still read (and dropped) so that the client sees the answer
LINGER_BYTES = 1024 * 1024
LINGER_S = 1.0

_log = RateLimitedLog(logging.getLogger("respgate"))

_PHRASES = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def log_rejection(reason: str, status: int, client: Any, detail: str, transport: str = "http") -> None:
    """One line per kind of refusal (HTTP request or WebSocket frame), a few per 10 s (the counters
    count every one)."""
    host = client[0] if isinstance(client, (tuple, list)) and client else "-"
    what = "HTTP request" if transport == "http" else "WebSocket frame"
    _log.info(f"{transport}:{reason}", "%s refused with %d (%s) from %s: %s", what, status, reason, host, detail)


class _HeadLimits:
    """Mixed into a uvicorn HTTP protocol class. The parser's side: ``_head_pending()`` says
    whether it waits for (the rest of) a request head, ``_heads`` counts the heads it completed."""

    max_header_bytes: ClassVar[int] = 64 * 1024
    header_timeout_s: ClassVar[float] = 10.0
    _heads: int = 0

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    config: Any
    client: Any
    cycle: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # bytes of the pending head fed to the parser so far
        self._head_timer: asyncio.TimerHandle | None = None
        self._received = False  # any byte on this connection yet
        #: after a refusal: bytes still dropped before closing, plus one (0: not refused; -1: all dropped)
        self._lingering = 0

    def _head_pending(self) -> bool:
        raise NotImplementedError

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            if self._lingering > 0:  # -1: dropped until the response in flight closes the connection
                self._lingering = max(1, self._lingering - len(data))
                if self._lingering == 1:
                    self.transport.close()
            return
        self._received = True
        limit = self.max_header_bytes
        while data:
            if not self._head_pending():
                # a body, or the bytes after a complete head: the parser's, whole (a head that
                # begins in them is counted from the next read on)
                self._head_bytes = 0
                super().data_received(data)  # type: ignore[misc]
                if self._head_pending() and self._head_timer is None and self._open():
                    self._arm_head_timer()
                return
            if self._head_timer is None:
                self._arm_head_timer()  # the first byte of a kept-alive connection's next request
            room = limit + 1 - self._head_bytes
            piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            heads = self._heads
            super().data_received(piece)  # type: ignore[misc]
            if not self._open():
                self._cancel_head_timer()  # refused by the parser, or handed to the WebSocket protocol
                return
            if self._heads != heads or not self._head_pending():  # the head completed in this piece
                self._head_bytes = 0
                self._cancel_head_timer()
                if self._head_pending() and not data:
                    self._arm_head_timer()  # and a pipelined one began after it
                continue
            self._head_bytes += len(piece)
            if self._head_bytes > limit:
                self._refuse(
                    431,
                    "header_size",
                    "request_header_fields_too_large",
                    f"Request header fields too large (limit {limit} bytes).",
                )
                return

    def _open(self) -> bool:
        """Still this protocol's, still open (not refused by the parser, not upgraded to WebSocket)."""
        protocol: object = self.transport.get_protocol()  # ``self``, as the transport sees it
        return not self.transport.is_closing() and protocol is self

    # -- the head's deadline ------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._on_head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _on_head_timeout(self) -> None:
        self._head_timer = None
        if not self._open() or not self._head_pending():
            return
        self._refuse(
            408,
            "header_timeout",
            "request_timeout",
            f"The request headers were not received in time (limit {self.header_timeout_s:g} s).",
        )

    # -- refusing -----------------------------------------------------------------------------------

    def _refuse(self, status: int, reason: str, code: str, message: str) -> None:
        self._cancel_head_timer()
        self._count(reason)
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined head while the previous response is still being written: that response
            # finishes, then the connection closes (an answer now would land inside it)
            self.cycle.keep_alive = False
            self._lingering = -1
            return
        if not self._received:
            log_rejection(reason, status, self.client, "connected, sent nothing")
            self.transport.close()  # nobody to answer
            return
        log_rejection(reason, status, self.client, message)
        body = orjson.dumps(
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
        )
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, _PHRASES[status], len(body), body)
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self._lingering = LINGER_BYTES + 1
        self.loop.call_later(LINGER_S, self.transport.close)

    def _count(self, reason: str) -> None:
        """``respgate_input_rejections_total``: uvicorn builds the protocol from its Config, so the
        gateway's metrics are reached through the app it serves (under uvicorn's middleware)."""
        app = self.config.loaded_app
        while app is not None and not hasattr(app, "state"):
            app = getattr(app, "app", None)
        gw = getattr(getattr(app, "state", None), "gateway", None)
        if gw is not None:
            gw.metrics.input_rejections.labels("http", reason).inc()


class LimitedH11Protocol(_HeadLimits, H11Protocol):
    def _head_pending(self) -> bool:
        # h11 reads one request per cycle (it pauses on a pipelined one until the response is
        # done), so a head still pending after a piece is the same head: ``_heads`` need not move
        return self.conn.their_state is h11.IDLE


if HttpToolsProtocol is not None:

    class LimitedHttpToolsProtocol(_HeadLimits, HttpToolsProtocol):
        #: from a message's first byte (and the connection's start) to the end of its head
        _pending = True

        def _head_pending(self) -> bool:
            return self._pending

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._pending = True

        def on_headers_complete(self) -> None:
            self._pending = False
            self._heads += 1
            super().on_headers_complete()
else:  # pragma: no cover
    LimitedHttpToolsProtocol = None  # type: ignore[assignment,misc]


def http_protocol(settings: Settings) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's ``http=`` option, bound to the settings' limits."""
    parser = settings.http_parser
    if parser == "auto":
        parser = "httptools" if LimitedHttpToolsProtocol is not None else "h11"
    if parser == "httptools":
        if LimitedHttpToolsProtocol is None:
            raise ValueError("http_parser=httptools but httptools is not installed")
        base: type = LimitedHttpToolsProtocol
    else:
        base = LimitedH11Protocol
    return type(
        base.__name__,
        (base,),
        {"max_header_bytes": settings.max_header_bytes, "header_timeout_s": settings.header_timeout_s},
    )
