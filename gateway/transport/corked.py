"""uvicorn's WebSocket protocol with corked writes, write backpressure and a send deadline.

**Cork.** A turn is a burst of small frames (``response.created``, ``in_progress``,
``output_item.added``, the first delta …; at the end ``*.done`` and ``response.completed``), and
uvicorn writes each one to the socket as it is sent. On loopback or a virtualised NIC one ``send()``
system call costs tens of microseconds and wakes the reader each time: profiled, the writes were ~30%
of the gateway's CPU for a short WebSocket turn and the largest single cost of a token stream.
Frames are joined and written once the connection's producer pauses: the flush is a ``call_soon``
callback, and when it finds that a frame was added during the iteration before it (the turn is
still producing: a zero-latency engine hands over a token per loop iteration, and a turn's opening
and closing events come in runs of iterations) it waits one more iteration, up to
:data:`LINGER_S` after the oldest corked frame. So a burst spread over consecutive iterations is one
``send()`` (a short WebSocket turn went from 7 writes to 1–2), while a frame produced on its own (a
real engine's delta, which arrives from the engine's thread into an otherwise idle loop) is written
one idle iteration later — microseconds — and never later than :data:`LINGER_S` however busy the
loop is. No timer, frame order kept. ``close()`` flushes first; a buffer past :data:`FLUSH_BYTES`
is written at once, so a burst never holds more than that; ``get_write_buffer_size`` counts the
corked bytes too.

**Backpressure.** Every frame we write is either one the app sent — uvicorn makes ``send()`` wait
while the transport is paused for writing — or one the protocol writes by itself in reply to what
it reads: a pong per ping, a close reply. Those used to be written whatever the buffer held, so a
client that sent millions of pings and never read made the gateway queue every pong (191 → 426 MiB,
issue 14 case 5). Now the protocol stops *reading* while the write buffer (corked bytes included) is
above :data:`HIGH_WATER` and reads again once it drained to :data:`LOW_WATER`: a client that does not
read cannot make us write, and its further frames wait in the kernel's socket buffers and then in
its own ``send()``. What one read can add is bounded by the read size (one read's pings answered).

**Send deadline.** A client that stops reading used to pin its connection and turn forever: the
app's ``send()`` waited on the paused transport, the keepalive's close waited for the buffer to
flush, the engine request kept running (case 6). While writing is paused the protocol now checks,
every ``send_deadline_s`` (``ws_send_deadline_s``), that at least :data:`HIGH_WATER` bytes left the
buffer in that window; when not, the connection is failed with close code :data:`SEND_STALLED_CODE`
(1008): the app gets ``websocket.disconnect`` (1008) and its blocked ``send()`` calls raise, so the
turns end — the engine requests are aborted and billed as cancelled (gateway/transport/ws.py) — and
the close frame is queued behind what the client has not read. A socket being closed whose client
still does not take its bytes within another ``send_deadline_s`` is reset: no close (ours, the
keepalive's, the app's) waits on an unread buffer forever.

**Rejection logs.** A text frame that is not UTF-8 (1007), a frame too big (1009) or a protocol error
(1002) is the client's fault: logged at INFO through :class:`~gateway.base.log_limit.RateLimitedLog`,
not at ERROR with a traceback an unauthenticated client could flood the logs with.

**Text frames without the ASGI stack.** A streamed token is one small text frame; sent as an ASGI
message it passes Starlette's ``WebSocket.send``, its exception-handler wrapper, uvicorn's
``send`` (str encoded again) and ``websockets``' frame object and serializer: profiled, that stack
was ~40% of the gateway's CPU per streamed token. The protocol offers :class:`TextFrames` through
the ASGI scope (``scope["extensions"][TEXT_FRAMES]``): the app hands it JSON bytes and it writes an
unmasked text frame header and the payload to the corked transport, when the connection is open,
writing is not paused and no extension (permessage-deflate) was negotiated; with deflate the frame
goes through ``websockets`` (which compresses) and the transport, still without the ASGI stack. In
every other state (paused, closing, stalled) it is uvicorn's ``send``, which waits or raises as it
always did.

**Refused messages leave nothing behind.** A refusal (or a lost connection) drops the message's
fragments and the refused frame's traceback at once (:meth:`CorkedWebSocketProtocol._forget_message`),
and a compressed frame is inflated in steps that a refusal discards
(gateway/transport/ws_inflate.py): before, each 64 KB deflated frame refused with 1009 kept its
~32 MiB of inflated data until a rare full collection.

The protocol is uvicorn's sans-I/O ``websockets`` protocol (a subclass; the transport wrapper is
installed in ``connection_made``), so framing, deflate, pings and close handshakes are uvicorn's and
``websockets``' code, unchanged but for the deflate decoder's stepped inflation.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import apply_mask
from websockets.protocol import OPEN

from gateway.base.log_limit import RateLimitedLog
from gateway.transport.ws_inflate import stepped_extensions

__all__ = [
    "CorkedTransport",
    "CorkedWebSocketProtocol",
    "FLUSH_BYTES",
    "HIGH_WATER",
    "LINGER_S",
    "LOW_WATER",
    "READ_AHEAD",
    "READ_AHEAD_BYTES",
    "SEND_STALLED_CODE",
    "SEND_STALLED_REASON",
    "SendStalled",
    "TEXT_FRAMES",
    "TextFrames",
]

log = logging.getLogger(__name__)
rejections = RateLimitedLog(log)

#: corked bytes beyond which a write goes out at once (asyncio's default high-water mark)
FLUSH_BYTES = 64 * 1024
#: the longest a corked frame waits for its producer to pause (seconds; see the module docstring)
LINGER_S = 0.0005
#: write buffer (corked + transport) above which the protocol stops reading and the app's sends wait
HIGH_WATER = 64 * 1024
#: ... and at or below which both go on
LOW_WATER = 16 * 1024
#: close code of a connection whose writes made no progress for the send deadline: 1008 (policy
#: violation: the client broke the rule "read what you asked for"). Not 1011, which says the *server*
#: failed and is one of the codes openai-python's auto-reconnect replays queued frames on (1001, 1005,
#: 1006, 1011-1013, 1015): those frames may chain on the response this close cancelled.
SEND_STALLED_CODE = 1008
SEND_STALLED_REASON = "send deadline exceeded"
#: client messages waiting for the app at which reading pauses (until fewer wait), and the bytes
#: past which it pauses whatever their number. uvicorn pauses at one message: after every message,
#: so each turn's create cost a pause and a resume (two ``epoll_ctl`` calls, and a loop iteration
#: to apply them), while the app is already waiting for the next message almost all the time. A
#: small message now waits without pausing; a big one pauses reading as before, so what waits is
#: at most one message of ``max_size`` plus ``READ_AHEAD_BYTES`` (characters, for text), besides
#: what one read parses.
READ_AHEAD = 2
READ_AHEAD_BYTES = 64 * 1024
#: the ASGI scope extension under which the protocol offers its :class:`TextFrames`
TEXT_FRAMES = "respgate.text_frames"
_MEDIUM, _LONG = struct.Struct("!BBH"), struct.Struct("!BBQ")
#: the header of an unmasked, final text frame of n < 126 bytes, by n
_SHORT_HEADS = tuple(bytes((0x81, n)) for n in range(126))


class SendStalled(RuntimeError):
    """The app's ``send()`` after (or blocked when) the send deadline failed the connection.

    Not an ``OSError``: Starlette turns those into a plain ``WebSocketDisconnect(1006)``, and the app
    should know that its client stopped reading rather than left."""


class CorkedTransport:
    """A transport wrapper whose ``write`` is deferred to the end of the loop iteration.

    Everything but writing, reading flow control, EOF and closing is delegated to the real
    transport. A deferred write that fails (its caller has already returned) aborts the connection
    and is logged. Reading is paused while any of two holders wants it paused: uvicorn (a message
    waits for the app: ``pause_reading``/``resume_reading``) and the protocol's write flow control
    (:meth:`hold_reading`). A ``close()`` that leaves bytes unsent aborts the connection if they are
    still unsent ``close_grace_s`` later.
    """

    __slots__ = (
        "_transport",
        "_loop",
        "_chunks",
        "_size",
        "_scheduled",
        "_fresh",
        "_since",
        "_close_grace_s",
        "_abort_timer",
        "_closed",
        "_app_hold",
        "_write_hold",
        "written",
        "flushes",
    )

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, *, close_grace_s: float = 10.0
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._chunks: list[bytes] = []
        self._size = 0
        self._scheduled = False
        self._fresh = False  # a frame was corked since the last flush callback ran
        self._since = 0.0  # loop time of the oldest corked frame
        self._close_grace_s = close_grace_s
        self._abort_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._app_hold = False
        self._write_hold = False
        #: bytes handed to the real transport so far (with its buffer size: how much the client took)
        self.written = 0
        #: writes handed to the real transport (tests and benchmarks read it)
        self.flushes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self.cork([data if type(data) is bytes else bytes(data)])

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def cork(self, frames: list[bytes]) -> None:
        """:meth:`write` for non-empty ``bytes`` at once (one, or a group of frames)."""
        self._chunks += frames
        self._size += sum(map(len, frames))
        self._fresh = True
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._since = self._loop.time()
            self._loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        if self._fresh and self._chunks and self._loop.time() - self._since < LINGER_S:
            self._fresh = False  # the producer is still going: one more iteration
            self._loop.call_soon(self._flush_soon)
            return
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
        self._fresh = False
        if not self._transport.is_closing():
            self.written += len(data)
            self.flushes += 1
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        if self._closed:
            return
        self._closed = True
        self._transport.close()
        if self._transport.get_write_buffer_size():
            # the close waits for the client to take what is buffered: not for ever
            self._abort_timer = self._loop.call_later(self._close_grace_s, self._transport.abort)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._chunks.clear()
        self._size = 0
        self._transport.abort()

    def lost(self) -> None:
        """The connection is gone: drop what is corked, cancel the pending abort (and arm no other)."""
        self._chunks.clear()
        self._size = 0
        self._closed = True
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def buffered(self) -> int:
        """Bytes the real transport holds (written to it, not yet taken by the socket)."""
        return self._transport.get_write_buffer_size()

    # -- reading flow control ----------------------------------------------------------------------

    def pause_reading(self) -> None:
        self._app_hold = True
        self._update_reading()

    def resume_reading(self) -> None:
        self._app_hold = False
        self._update_reading()

    def hold_reading(self, hold: bool) -> None:
        """Write flow control: keep reading paused (``True``) until released (``False``)."""
        self._write_hold = hold
        self._update_reading()

    def _update_reading(self) -> None:
        if self._transport.is_closing():
            return
        if self._app_hold or self._write_hold:
            self._transport.pause_reading()  # both idempotent in asyncio and uvloop
        else:
            self._transport.resume_reading()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, is_reading, ...
        return getattr(self._transport, name)


class TextFrames:
    """Writes text frames of already-encoded UTF-8 (the app's JSON) for one connection.

    ``try_send`` writes now and returns True, or returns False without writing when the frame must
    take uvicorn's way (``send``): writing paused, the connection not open, closing or failed.
    Frames are written in call order; a caller that may have a frame waiting in ``send`` must not
    ``try_send`` past it (``gateway.transport.ws`` holds its send lock around ``send``)."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: CorkedWebSocketProtocol) -> None:
        self._protocol = protocol

    def try_send(self, payload: bytes) -> bool:
        return self.try_send_many([payload])

    def try_send_many(self, payloads: list[bytes]) -> bool:
        """:meth:`try_send` for a group of frames, all or none: the connection's state is checked
        once, and the frames are corked with one call (a turn's events come in groups:
        ``gateway.turn.run.TurnRunner.batches``)."""
        p = self._protocol
        # ``_write_paused`` is ``writable`` cleared (pause_writing); set again by a resume, or by a
        # loss or a stall, which set ``disconnected`` too
        if p.close_sent or p.disconnected or not p.handshake_complete or p._write_paused:
            return False
        conn = p.conn
        if conn.state is not OPEN:
            return False
        if conn.extensions or conn.expect_continuation_frame:  # deflate: websockets compresses
            for payload in payloads:
                conn.send_text(payload)
            p.transport.write(b"".join(conn.data_to_send()))
            return True
        heads, medium = _SHORT_HEADS, _MEDIUM.pack  # each frame's header inline: no call a frame
        cork = p.transport.cork  # type: ignore[attr-defined]  # a CorkedTransport (connection_made)
        cork(
            [
                (heads[n] if (n := len(x)) < 126 else medium(0x81, 126, n) if n < 65536 else _LONG.pack(0x81, 127, n))
                + x
                for x in payloads
            ]
        )
        return True

    async def send(self, payload: bytes) -> None:
        """The frame, waiting while writing is paused; raises as uvicorn's ``send`` does
        (``SendStalled``, ``ClientDisconnected``, ``RuntimeError`` after a close)."""
        p = self._protocol
        await p.writable.wait()
        if not self.try_send(payload):
            await p.send({"type": "websocket.send", "text": payload.decode()})


class CorkedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O ``websockets`` protocol, writing through a :class:`CorkedTransport`.

    Pass :meth:`configured` (or the class, for the default deadline) as uvicorn's ``ws`` option.
    uvicorn's HTTP protocol hands the upgraded connection's transport to ``connection_made``; flow
    control (``pause_writing``/``resume_writing``) comes from the real transport, whose limits are
    set to :data:`HIGH_WATER`/:data:`LOW_WATER`.
    """

    #: seconds writes may stay paused with less than HIGH_WATER bytes taken by the client
    send_deadline_s: float = 10.0

    @classmethod
    def configured(cls, *, send_deadline_s: float) -> type[CorkedWebSocketProtocol]:
        """This protocol with the given send deadline (uvicorn instantiates the class it is given)."""
        return type(cls.__name__, (cls,), {"send_deadline_s": send_deadline_s})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a compressed message past max_size is inflated in steps and refused without a copy
        self.conn.available_extensions = stepped_extensions(self.conn.available_extensions)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)  # type: ignore[attr-defined]
        self._write_paused = False
        self._deadline: asyncio.TimerHandle | None = None
        self._window = (0, 0)  # (written, buffered) when the current deadline window began
        self.stalled = False
        loop = asyncio.get_running_loop()
        corked = CorkedTransport(transport, loop, close_grace_s=self.send_deadline_s)  # type: ignore[arg-type]
        super().connection_made(corked)  # type: ignore[arg-type]  # duck-typed: what websockets calls

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # set only when the handshake is accepted (101)
        if scope is not None:
            scope["extensions"][TEXT_FRAMES] = {"frames": TextFrames(self)}

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.transport.lost()  # type: ignore[attr-defined]
        self._forget_message()
        super().connection_lost(exc)

    def _forget_message(self) -> None:
        """Drop what a refused or cut-off client message left (issue 28 item 14).

        A refused frame's exception (``conn.parser_exc``, kept by ``websockets``) carried its
        traceback, whose frames held the frame's payload and its inflated data (up to ``max_size``:
        ~32 MiB from a 64 KB deflated frame); the fragments of a message not yet complete wait in
        ``frames``, and those parsed in the same read as the refused one in ``conn``'s events,
        which uvicorn never takes once the parser failed. The protocol is part of reference cycles
        (the scope's :class:`TextFrames`, the parser generator), and the cyclic collector runs
        rarely once ``gateway.ops.server`` froze the start-up heap and raised its threshold, so all
        of it stayed long after the socket closed: 30 such frames took the server from 201 MiB to
        1.2 GiB, three bursts to 2.2 GiB. Nothing here is needed once the message is refused or the
        connection gone."""
        self.frames = []
        self.conn.events_received()  # frames parsed in the read that was refused: never handled
        exc: BaseException | None = self.conn.parser_exc
        for _ in range(8):  # the exception, its cause or context, ...: each one's traceback
            if exc is None:
                break
            exc.__traceback__ = None
            exc = exc.__cause__ or exc.__context__

    # -- write flow control -----------------------------------------------------------------------

    def pause_writing(self) -> None:
        """The transport's buffer passed HIGH_WATER: the app's sends wait, reading stops."""
        super().pause_writing()
        self._write_paused = True
        self.transport.hold_reading(True)  # type: ignore[attr-defined]
        if self._deadline is None and not self.stalled:
            self._arm()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_paused = False
        self._disarm()
        self.transport.hold_reading(False)  # type: ignore[attr-defined]

    #: read a read that is exactly one masked, unfragmented text frame without ``websockets``' parser
    #: (:meth:`_one_text_frame`); tests switch it off to compare with the parser's answers
    fast_text_frames: bool = True

    def data_received(self, data: bytes) -> None:
        if not (self.fast_text_frames and self._one_text_frame(data)):
            super().data_received(data)
        # What this read made us write (pongs, a close reply) may still be corked: past the mark,
        # hand it to the transport now so that its flow control sees it and pauses reading.
        if not self._write_paused and self.transport.get_write_buffer_size() > HIGH_WATER:
            self.transport.flush()  # type: ignore[attr-defined]

    def _one_text_frame(self, data: bytes) -> bool:
        """Hand ``data`` to the app as uvicorn would when it is one whole client text frame, and
        return True; else return False (and ``websockets`` parses it).

        Why: a client's ``response.create`` is one small text frame per read, and ``websockets``
        parses every frame through generator coroutines (its reader, ``Frame.parse``,
        ``recv_frame``, then uvicorn's event loop over the results): ~450 Python bytecodes, 2% of a
        short WebSocket turn. Only the plainest case is read here — the connection open, no
        extension, no fragmented message in progress, the parser's buffer empty (so it waits for a
        frame header and stays in step), and ``data`` exactly one frame: FIN, no RSV bits, opcode
        text, masked (a client must mask), its length within ``max_size`` — and the payload goes the
        way uvicorn's ``handle_text`` sends it (``send_receive_event_to_app``: UTF-8 checked, 1007
        otherwise; reading paused until the app takes it). Anything else — several frames or part
        of one in a read, control frames, binary, continuation, an oversized or unmasked frame — is
        ``websockets``' to read and answer, exactly as before."""
        n = len(data)
        if n < 6 or data[0] != 0x81 or self.frames or self.close_sent:
            return False
        conn = self.conn
        if (
            conn.state is not OPEN
            or conn.extensions
            or conn.cur_size is not None
            or conn.reader.buffer
            or conn.parser_exc is not None
        ):
            return False
        length = data[1] ^ 0x80  # the mask bit set: the length below 128
        if length < 126:
            head = 6
        elif length == 126:
            head, length = 8, int.from_bytes(data[2:4], "big")
        elif length == 127:
            head, length = 14, int.from_bytes(data[2:10], "big")
        else:  # not masked
            return False
        if n != head + length or (conn.max_size is not None and length > conn.max_size):
            return False
        self.curr_msg_data_type = "text"
        self.frames = [apply_mask(data[head:], data[head - 4 : head])]
        self.send_receive_event_to_app()
        return True

    def _arm(self) -> None:
        t: CorkedTransport = self.transport  # type: ignore[assignment]
        self._window = (t.written, t.buffered())
        self._deadline = self.loop.call_later(self.send_deadline_s, self._deadline_passed)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if not self._write_paused:
            return
        t: CorkedTransport = self.transport  # type: ignore[assignment]
        written, buffered = self._window
        taken = (t.written - written) - (t.buffered() - buffered)
        if taken >= HIGH_WATER:  # a slow reader, but a reader: another window
            self._arm()
            return
        self._send_stalled(taken)

    def _send_stalled(self, taken: int) -> None:
        """Fail the connection (1008): the app hears it first, then its blocked sends raise."""
        if self.close_sent or self.disconnected:  # already closing (keepalive, app), and that is stuck too
            self.transport.abort()
            return
        rejections.warning(
            "ws_send_stalled",
            "WebSocket client %s took %d bytes in %gs with %d buffered: closing %d (%s)",
            _peer(self.client),
            taken,
            self.send_deadline_s,
            self.transport.get_write_buffer_size(),
            SEND_STALLED_CODE,
            SEND_STALLED_REASON,
        )
        self.queue.put_nowait(
            {"type": "websocket.disconnect", "code": SEND_STALLED_CODE, "reason": SEND_STALLED_REASON}
        )
        self.stop_keepalive()
        self.conn.fail(SEND_STALLED_CODE, SEND_STALLED_REASON)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.stalled = True
        self.disconnected = True  # the app's next (and blocked) sends raise SendStalled
        self.writable.set()
        self.transport.close()  # reset if the client still does not read (CorkedTransport.close)

    # -- client faults ----------------------------------------------------------------------------

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type != "text" or self.close_sent:
            super().send_receive_event_to_app()
            return
        # uvicorn's text branch, with a rejection log instead of ERROR + traceback for invalid UTF-8
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            self.conn.fail(1007, f"invalid UTF-8 at position {exc.start}")
            self.handle_parser_exception()
            return
        self.queue.put_nowait({"type": "websocket.receive", "text": text})
        if not self.read_paused and not self._may_read_ahead():
            self.read_paused = True
            self.transport.pause_reading()

    async def receive(self) -> Any:
        """uvicorn's ``receive``, resuming reading once the messages still waiting may
        (:data:`READ_AHEAD`; uvicorn resumes only once none waits: it pauses at one)."""
        message = await self.queue.get()
        if self.read_paused and self._may_read_ahead():
            self.read_paused = False
            self.transport.resume_reading()
        return message

    def _may_read_ahead(self) -> bool:
        """Whether reading may go on with the messages now waiting for the app: fewer than
        :data:`READ_AHEAD`, of :data:`READ_AHEAD_BYTES` at most (a look at one or two messages)."""
        waiting = self.queue._queue  # type: ignore[attr-defined]  # asyncio.Queue's deque
        if len(waiting) >= READ_AHEAD:
            return False
        size = 0
        for message in waiting:
            data = message.get("text") or message.get("bytes") or ""
            size += len(data)
        return size <= READ_AHEAD_BYTES

    def handle_parser_exception(self) -> None:
        """A frame the protocol refused (1002 protocol error, 1007 invalid data, 1009 too big)."""
        sent = self.conn.close_sent
        if sent is not None:
            rejections.info(
                f"ws_refused_{sent.code}",
                "WebSocket frame from %s refused: closing %d (%s)",
                _peer(self.client),
                sent.code,
                sent.reason,
            )
        self._forget_message()
        super().handle_parser_exception()

    async def send(self, message: Any) -> None:
        if self.stalled:
            raise SendStalled(SEND_STALLED_REASON)
        try:
            await super().send(message)
        except ClientDisconnected:
            if self.stalled:  # it waited on the paused transport when the deadline passed
                raise SendStalled(SEND_STALLED_REASON) from None
            raise
        if (
            message["type"] == "websocket.http.response.body"
            and not message.get("more_body", False)
            and self.initial_response is not None
        ):
            # The handshake was answered with an HTTP response (a refusal: 401, 403, 429): as far as
            # the app is concerned it is complete. uvicorn would log "ASGI callable returned without
            # completing handshake" at ERROR for every refused handshake otherwise — an error line an
            # unauthenticated client could flood the logs with.
            self.handshake_complete = True


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"
