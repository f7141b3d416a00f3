"""The corked transport under uvicorn's WebSocket protocol (gateway/transport/corked.py): frames of one loop
iteration leave in one write, in order; close flushes; big bursts are not held back."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest
from websockets.sync.client import connect

from gateway.app import uvicorn_config_kwargs
from gateway.transport.corked import FLUSH_BYTES, CorkedTransport, CorkedWebSocketProtocol
from gateway.base.settings import Settings


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
        await asyncio.sleep(0)  # the flush runs at the start of the next iteration
        assert writes == [len(b"one,two,three")]
        assert await _read(peer, 13) == b"one,two,three"
        corked.write(b"later")
        await asyncio.sleep(0)
        assert writes == [13, 5] and await _read(peer, 5) == b"later"
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
    assert uvicorn_config_kwargs(Settings())["ws"] is CorkedWebSocketProtocol
    live = make_gateway()
    with connect(live.ws_url, max_size=None, compression=None) as ws:
        ws.send(orjson.dumps({"type": "response.create", "model": "gpt-oss-sim", "input": "hello",
                              "store": False}).decode())
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
