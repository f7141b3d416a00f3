"""The corked transport under uvicorn's WebSocket protocol (gateway/transport/corked.py): frames of one loop
iteration, and of consecutive iterations while the producer keeps producing (up to LINGER_S), leave in one
write, in order; close flushes; big bursts are not held back."""

from __future__ import annotations

import asyncio
import socket
from functools import partial
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from websockets.sync.client import connect

from gateway.app import uvicorn_config_kwargs
from gateway.base.settings import Settings
from gateway.transport.corked import (
    FLUSH_BYTES,
    HIGH_WATER,
    LINGER_S,
    READ_AHEAD,
    READ_AHEAD_BYTES,
    SEND_STALLED_CODE,
    CorkedTransport,
    CorkedWebSocketProtocol,
    SendStalled,
    TextFrames,
)
from gateway.transport.lanes import Farewell


async def _pair() -> tuple[asyncio.Transport, list[int], socket.socket]:
    """A real asyncio socket transport (one end of a socketpair) whose writes are counted."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    writes: list[int] = []
    real_write = transport.write

    def counting_write(data: bytes) -> None:
        writes.append(len(data))
        real_write(data)

    transport.write = counting_write  # type: ignore[method-assign]
    theirs.setblocking(False)
    return transport, writes, theirs


async def _read(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    out = b""
    while len(out) < n:
        out += await loop.sock_recv(sock, n - len(out))
    return out


def test_one_iteration_one_write_in_order():
    async def main() -> None:
        transport, writes, peer = await _pair()
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        for chunk in (b"one,", b"two,", b"three"):
            corked.write(chunk)
        assert writes == [] and corked.get_write_buffer_size() == len(b"one,two,three")
        await asyncio.sleep(0)  # the producer wrote in the iteration before: one more iteration
        assert writes == []
        await asyncio.sleep(0)  # an iteration without a new frame: the producer paused, written
        assert writes == [len(b"one,two,three")] and corked.flushes == 1
        assert await _read(peer, 13) == b"one,two,three"
        corked.write(b"later")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert writes == [13, 5] and await _read(peer, 5) == b"later"
        corked.close()
        peer.close()

    asyncio.run(main())


def test_frames_of_consecutive_iterations_leave_in_one_write():
    """A zero-latency engine hands over a delta per loop iteration: the run is one write."""

    async def main() -> None:
        transport, writes, peer = await _pair()
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        sent = b""
        for i in range(8):
            frame = f"delta {i};".encode()
            corked.write(frame)
            sent += frame
            await asyncio.sleep(0)
        assert writes == []
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert writes == [len(sent)] and await _read(peer, len(sent)) == sent
        corked.close()
        peer.close()

    asyncio.run(main())


def test_a_producer_that_never_pauses_is_written_within_the_linger_bound():
    """Frames every iteration, for ever: each write goes out once its oldest frame is LINGER_S old
    (the transport's clock is a fake one here, so the bound is checked without timing anything)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, writes, peer = await _pair()
        corked = CorkedTransport(transport, loop)
        now = [0.0]
        corked._loop = SimpleNamespace(time=lambda: now[0], call_soon=loop.call_soon)  # type: ignore[assignment]
        for _ in range(30):
            corked.write(b"x")
            await asyncio.sleep(0)
        assert writes == []  # the clock stood still: still lingering
        now[0] += LINGER_S
        corked.write(b"x")
        await asyncio.sleep(0)
        assert writes == [31]  # due: written although the producer did not pause
        for _ in range(3):
            corked.write(b"y")
            await asyncio.sleep(0)
        assert writes == [31]  # a new linger began with the next frame
        now[0] += LINGER_S
        await asyncio.sleep(0)
        assert writes == [31, 3]
        assert await _read(peer, 34) == b"x" * 31 + b"yyy"
        corked.close()
        peer.close()

    asyncio.run(main())


def test_close_flushes_and_big_bursts_go_out_at_once():
    async def main() -> None:
        transport, writes, peer = await _pair()
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        big = b"x" * FLUSH_BYTES
        corked.write(b"head")
        corked.write(big)  # past the limit: written now, with what was corked before it
        assert writes == [4 + FLUSH_BYTES]
        corked.write(b"tail")
        corked.close()  # no iteration in between: close must not drop the corked bytes
        assert writes == [4 + FLUSH_BYTES, 4]
        assert await _read(peer, 8 + FLUSH_BYTES) == b"head" + big + b"tail"
        assert corked.is_closing()  # delegated to the real transport
        peer.close()

    asyncio.run(main())


def test_gateway_websocket_frames_arrive_whole_and_in_order(make_gateway):
    """Through the real server (uvicorn + CorkedWebSocketProtocol): every event of a turn arrives
    as its own frame, in sequence order, and errors and pings still work on the same socket."""
    ws = uvicorn_config_kwargs(Settings(ws_send_deadline_s=7.5))["ws"]
    assert issubclass(ws, CorkedWebSocketProtocol) and ws.send_deadline_s == 7.5
    live = make_gateway()
    with connect(live.ws_url, max_size=None, compression=None) as ws:
        ws.send(
            orjson.dumps({"type": "response.create", "model": "gpt-oss-sim", "input": "hello", "store": False}).decode()
        )
        seqs, types = [], []
        while True:
            ev = orjson.loads(ws.recv(timeout=30))
            seqs.append(ev["sequence_number"])
            types.append(ev["type"])
            if ev["type"] in ("response.completed", "response.failed", "response.incomplete"):
                break
        assert types[0] == "response.created" and types[-1] == "response.completed"
        assert seqs == list(range(len(seqs)))
        ws.send("{not json")
        err = orjson.loads(ws.recv(timeout=30))
        assert err["type"] == "error" and err["error"]["code"] == "invalid_json"
        ws.ping().wait(timeout=30)


def _frame_writer() -> tuple[TextFrames, Any, list[bytes]]:
    """A TextFrames over a stand-in protocol: an open server-side ``websockets`` connection whose
    transport keeps what is written."""
    from websockets.protocol import OPEN
    from websockets.server import ServerProtocol

    written: list[bytes] = []
    protocol = SimpleNamespace(
        _write_paused=False,
        close_sent=False,
        disconnected=False,
        handshake_complete=True,
        conn=ServerProtocol(),
        transport=SimpleNamespace(write=written.append, cork=written.extend),
    )
    protocol.conn.state = OPEN
    return TextFrames(protocol), protocol, written  # type: ignore[arg-type]


@pytest.mark.parametrize("grouped", [False, True])
def test_text_frames_parse_as_rfc6455_text_frames_at_every_length_boundary(grouped):
    """The direct writer's frames (7-bit, 16-bit and 64-bit lengths; joined or not with their
    header; one by one or as a group) are what a client's parser reads back: unmasked, FIN, text,
    the payload unchanged."""
    from websockets.frames import Frame, Opcode
    from websockets.streams import StreamReader

    frames, _, written = _frame_writer()
    sizes = (0, 1, 125, 126, 127, 4096, 4097, 65535, 65536, 200_000)
    payloads = [("é" * (n // 2) + "a" * (n % 2)).encode() for n in sizes]  # n bytes of UTF-8 each
    assert [len(p) for p in payloads] == list(sizes)
    if grouped:
        assert frames.try_send_many(payloads[:3]) and frames.try_send_many(payloads[3:])
    for payload in payloads if not grouped else ():
        assert frames.try_send(payload)
    reader = StreamReader()  # what a client reads, parsed by websockets' own frame parser
    reader.feed_data(b"".join(written))
    reader.feed_eof()
    got = []
    for _ in payloads:
        parse = Frame.parse(reader.read_exact, mask=False, max_size=None)
        with pytest.raises(StopIteration) as done:
            next(parse)
        got.append(done.value.value)
    assert reader.at_eof()
    assert [(f.opcode, f.fin, f.data) for f in got] == [(Opcode.TEXT, True, p) for p in payloads]


def test_text_frames_leave_paused_or_closing_connections_to_uvicorn():
    """Writing paused, a close sent, the client gone, the connection not open: nothing is written
    and the caller is told to take uvicorn's way (which waits or raises)."""
    from websockets.protocol import CLOSING

    for spoil in ("paused", "close_sent", "disconnected", "closing", "handshake"):
        frames, protocol, written = _frame_writer()
        if spoil == "paused":
            protocol._write_paused = True  # what CorkedWebSocketProtocol.pause_writing sets
        elif spoil == "closing":
            protocol.conn.state = CLOSING
        elif spoil == "handshake":
            protocol.handshake_complete = False
        else:
            setattr(protocol, spoil, True)
        assert frames.try_send(b'{"type":"x"}') is False and written == [], spoil
        assert frames.try_send_many([b'{"type":"x"}', b'{"type":"y"}']) is False and written == [], spoil


def test_socket_wrapper_delegates():
    n = 3

    async def main() -> None:
        transport, _, peer = await _pair()
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        assert corked.get_extra_info("socket") is transport.get_extra_info("socket")
        corked.writelines([b"a"] * n)
        await asyncio.sleep(0)
        assert await _read(peer, n) == b"a" * n
        corked.abort()
        peer.close()

    asyncio.run(main())


def test_a_failed_deferred_write_aborts_the_connection():
    async def main() -> None:
        transport, _, peer = await _pair()

        def broken(data: bytes) -> None:
            raise RuntimeError("write after write_eof")

        transport.write = broken  # type: ignore[method-assign]
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        corked.write(b"frame")
        await asyncio.sleep(0)  # the deferred flush fails: logged, connection aborted, loop fine
        await asyncio.sleep(0)
        assert transport.is_closing()
        peer.close()

    asyncio.run(main())


def test_uvicorn_protocol_still_has_what_the_cork_relies_on():
    """The subclass wraps the transport in ``connection_made`` and uvicorn writes through
    ``self.transport``: if a uvicorn release renames either, this fails before production does."""
    import inspect

    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    assert "transport" in inspect.signature(WebSocketsSansIOProtocol.connection_made).parameters
    assert "self.transport.write" in inspect.getsource(WebSocketsSansIOProtocol.send)


def test_a_refused_handshake_logs_no_error(make_gateway):
    """A 401 before the upgrade is an answer, not a server error (issue 14, case 10)."""
    import logging

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from gateway.base.settings import Settings

    class Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.ERROR)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    live = make_gateway(Settings(api_keys=["only-key"], keys_file=None))
    collect = Collect()
    logger = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not propagate to the root
    logger.addHandler(collect)
    try:
        for _ in range(3):
            with pytest.raises(InvalidStatus) as refused:
                with connect(live.ws_url):
                    pass
            assert refused.value.response.status_code == 401
        with connect(live.ws_url, additional_headers={"authorization": "Bearer only-key"}):
            pass
    finally:
        logger.removeHandler(collect)
    assert not collect.records, [r.getMessage() for r in collect.records]


def test_reading_stays_paused_while_either_holder_wants_it():
    """uvicorn pauses reading while a message waits for the app; write flow control holds it while
    the write buffer is full. Neither may resume what the other paused."""

    async def main() -> None:
        transport, _, peer = await _pair()
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        corked.pause_reading()
        corked.hold_reading(True)
        corked.resume_reading()  # the app took its message; the buffer is still full
        assert not transport.is_reading()
        corked.pause_reading()
        corked.hold_reading(False)  # drained; a message still waits for the app
        assert not transport.is_reading()
        corked.resume_reading()
        assert transport.is_reading()
        corked.close()
        peer.close()

    asyncio.run(main())


class _Lost(asyncio.Protocol):
    def __init__(self) -> None:
        self.lost = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


def test_a_close_whose_bytes_the_client_never_takes_is_reset_after_the_grace():
    """asyncio's close() waits for the buffer to drain: with a client that does not read, for ever
    (the keepalive's close, the app's close). The cork aborts it once the grace has passed."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ours, peer = socket.socketpair()
        transport, proto = await loop.connect_accepted_socket(_Lost, ours)
        corked = CorkedTransport(transport, loop, close_grace_s=0.05)
        corked.write(b"x" * (8 * 1024 * 1024))  # far more than the socket pair buffers
        corked.close()
        assert transport.is_closing() and transport.get_write_buffer_size() > 0
        await asyncio.wait_for(proto.lost, 30)  # a safety net: the grace is 50 ms
        peer.close()

    asyncio.run(main())


def _protocol(deadline: float) -> CorkedWebSocketProtocol:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    async def app(scope, receive, send) -> None:  # never called: no handshake in these tests
        raise AssertionError

    config = Config(app=app, lifespan="off")
    config.load()
    return CorkedWebSocketProtocol.configured(send_deadline_s=deadline)(
        config=config, server_state=ServerState(), app_state={}
    )


def test_send_deadline_spares_a_slow_reader_and_fails_a_stalled_one_with_1008():
    """While writing is paused, each deadline window must see at least HIGH_WATER bytes taken by
    the client; a window without is a stall: the app hears 1008 and its blocked send raises. (The
    windows are ended by hand here; the live cases are in tests/gateway/transport/test_ws_backpressure.py.)"""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        proto = _protocol(deadline=3600)
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        transport, _ = await loop.connect_accepted_socket(lambda: proto, ours)
        proto.transport.write(b"x" * (4 * 1024 * 1024))
        assert not proto.writable.is_set() and not transport.is_reading()  # paused: no sends, no reads
        blocked = asyncio.create_task(proto.send({"type": "websocket.send", "text": "next event"}))
        await asyncio.sleep(0)
        assert not blocked.done()

        await _read(peer, 4 * HIGH_WATER)  # a slow reader, but a reader
        for _ in range(5):
            await asyncio.sleep(0)  # the transport refills the socket
        proto._disarm()
        proto._deadline_passed()
        assert not proto.stalled and proto._deadline is not None  # another window

        proto._disarm()
        proto._deadline_passed()  # a window in which the client took nothing
        assert proto.stalled and transport.is_closing()
        assert proto.queue.get_nowait() == {
            "type": "websocket.disconnect",
            "code": 1008,
            "reason": "send deadline exceeded",
        }
        with pytest.raises(SendStalled):
            await asyncio.wait_for(blocked, 30)
        with pytest.raises(SendStalled):
            await proto.send({"type": "websocket.send", "text": "later"})
        transport.abort()
        peer.close()

    asyncio.run(main())


async def _connected() -> tuple[CorkedWebSocketProtocol, Any, socket.socket]:
    """A protocol on one end of a socket pair (no handshake): it, its transport, the other end."""
    proto = _protocol(deadline=3600)
    ours, peer = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: proto, ours)
    return proto, transport, peer


def _arrive(proto: CorkedWebSocketProtocol, text: str) -> None:
    """A whole client text message, as the frame reader hands it to the protocol."""
    proto.curr_msg_data_type = "text"
    proto.frames = [text.encode()]
    proto.send_receive_event_to_app()


def test_reading_pauses_once_read_ahead_messages_wait_for_the_app():
    """uvicorn paused reading after every client message and resumed once the app took it: two
    epoll_ctl calls a turn while the app was already waiting. Reading now pauses once READ_AHEAD
    messages wait, and resumes once fewer do: what waits stays bounded."""

    async def main() -> None:
        proto, transport, peer = await _connected()
        arrive = partial(_arrive, proto)
        for i in range(READ_AHEAD - 1):
            arrive(f"m{i}")
            assert transport.is_reading()
        arrive("last")
        assert not transport.is_reading() and proto.queue.qsize() == READ_AHEAD
        assert (await proto.receive())["text"] == "m0"
        assert transport.is_reading()
        arrive("again")  # READ_AHEAD wait again: paused again
        assert not transport.is_reading()
        while not proto.queue.empty():
            await proto.receive()
        assert transport.is_reading()
        transport.abort()
        peer.close()

    assert READ_AHEAD >= 2  # 1 is uvicorn's pause after every message
    asyncio.run(main())


def test_a_big_message_pauses_reading_at_once_and_until_it_is_taken():
    """Only small messages are read ahead: what waits is at most one message of max_size plus
    READ_AHEAD_BYTES, as uvicorn's pause-at-one allowed one message."""

    async def main() -> None:
        proto, transport, peer = await _connected()
        arrive = partial(_arrive, proto)
        big = "x" * (READ_AHEAD_BYTES + 1)
        arrive(big)
        assert not transport.is_reading()  # alone, and paused
        assert (await proto.receive())["text"] == big
        assert transport.is_reading()
        arrive("small")
        assert transport.is_reading()
        arrive(big)  # behind a small one: paused
        assert not transport.is_reading()
        assert (await proto.receive())["text"] == "small"
        assert not transport.is_reading()  # the big one still waits
        assert (await proto.receive())["text"] == big
        assert transport.is_reading()
        transport.abort()
        peer.close()

    asyncio.run(main())


def test_the_stall_close_code_is_the_lane_machines():
    assert Farewell.SEND_STALLED.code == SEND_STALLED_CODE == 1008
