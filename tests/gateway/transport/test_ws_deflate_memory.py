"""Compressed WebSocket frames refused with 1009 give their memory back (issue 28 item 14).

Before: each 64 KB permessage-deflate frame that inflates past the frame limit was inflated to the
limit (~32 MiB) and refused with 1009, and the refused frame's exception kept its traceback — whose
frames held the inflated data — on the connection, which only the (rare, after ``gc.freeze``)
full collection freed: one burst of 30 took the server from 207 MiB to 1.2 GiB, three to 2.2 GiB,
and it stayed while the server idled. Fragments of a compressed message parsed in the same read as
the fragment that passed the limit stayed the same way (uvicorn never took them from the parser).
Now a refusal drops all of it (gateway/transport/corked.py) and inflation goes in steps that a
refusal discards (gateway/transport/ws_inflate.py).

The RSS tests run the gateway in its own process (tests/chaos.py) with a real ``websockets``
client that negotiates permessage-deflate; the bomb is compressed once and sent on the client's
socket as one compressed frame, so thirty of them do not compress 64 MiB thirty times. Memory is
read once every client has its close frame; the refusal frees it before the close is written.
"""

from __future__ import annotations

import functools
import gzip
import json
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, PayloadTooBig
from websockets.extensions.permessage_deflate import PerMessageDeflate, ServerPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.sync.client import connect

from gateway.transport.ws_inflate import INFLATE_STEP, SteppedDeflate, SteppedInflater, stepped_extensions
from tests.chaos import ChaosGateway, MiB, chaos_gateway
from tests.conftest import MODEL

LIMIT = 32 * MiB  # max_request_bytes (the default): frames up to LIMIT + 64 KiB are read
RSS_SLACK = 64 * MiB  # what the server may keep after the bursts (allocator, sockets, logs)
BURST, BURSTS = 30, 3  # the figures: 30 x ~64 KB frames each inflating to 64 MiB


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosGateway]:
    with chaos_gateway(tmp_path_factory.mktemp("deflate"), max_request_bytes=LIMIT, rate_limit_rpm=100_000) as gw:
        yield gw


@functools.cache
def deflated(wbits: int, pieces: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """``pieces`` as consecutive parts of one permessage-deflate message (RFC 7692: the last one
    without its trailing empty block), compressed with the negotiated window."""
    z = zlib.compressobj(wbits=-wbits)
    out = [z.compress(p) + z.flush(zlib.Z_SYNC_FLUSH) for p in pieces]
    out[-1] = out[-1][:-4]
    return tuple(out)


def send_compressed(url: str, pieces: tuple[bytes, ...]) -> Any:
    """Open a socket that negotiates permessage-deflate, send ``pieces`` as one compressed message
    (a frame each) and return the close code the gateway answers with ("answered" if it answers)."""
    try:
        with connect(url, compression="deflate", max_size=None, open_timeout=60, ping_interval=None) as ws:
            (ext,) = ws.protocol.extensions
            assert isinstance(ext, PerMessageDeflate), ws.protocol.extensions
            parts = deflated(ext.local_max_window_bits, pieces)
            frames = [
                bytearray(
                    Frame(Opcode.TEXT if i == 0 else Opcode.CONT, data, fin=i == len(parts) - 1).serialize(mask=True)
                )
                for i, data in enumerate(parts)
            ]
            frames[0][0] |= 0x40  # RSV1: the message is compressed (serialize() sets no RSV bit itself)
            ws.socket.sendall(b"".join(frames))
            ws.recv(timeout=60)
            return "answered"
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


def burst(n: int, send: Callable[[], Any]) -> list[Any]:
    codes: list[Any] = []
    threads = [threading.Thread(target=lambda: codes.append(send())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return codes


def still_serves(gw: ChaosGateway) -> None:
    assert gw.alive(), gw.log()[-3000:]
    with connect(gw.ws_url, compression="deflate", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "still there?", "store": False}))
        while (ev := json.loads(ws.recv(timeout=60)))["type"] not in ("response.completed", "error"):
            pass
        assert ev["type"] == "response.completed", ev


@pytest.mark.slow
def test_refused_deflate_frames_give_their_memory_back(gateway: ChaosGateway):
    """Before: 207 MiB -> 1208, 2184 MiB after the first two bursts. Now each refused frame's
    inflated data is gone when its 1009 is written: RSS within 64 MiB of the start."""
    bomb = (b'{"type":"response.create","model":"%s","input":"' % MODEL.encode() + b"a" * (64 * MiB) + b'"}',)
    start = gateway.rss()
    after = []
    for _ in range(BURSTS):
        codes = burst(BURST, lambda: send_compressed(gateway.ws_url, bomb))
        assert codes == [1009] * BURST, codes  # docs/api.md: 1009 beyond max_request_bytes + 64 KiB
        after.append(gateway.rss())
    print(f"RSS {start / MiB:.0f} MiB, after each burst of {BURST}: {', '.join(f'{a / MiB:.0f}' for a in after)} MiB")
    assert max(after) - start < RSS_SLACK, (start / MiB, [a / MiB for a in after])
    assert "closing 1009" in gateway.log()
    still_serves(gateway)


@pytest.mark.slow
def test_fragments_of_a_refused_compressed_message_are_dropped(gateway: ChaosGateway):
    """A compressed message in fragments of 8 MiB inflated, the fifth past the limit: before, the
    four parsed with it stayed with the connection (~32 MiB each) after the 1009."""
    eight = b"a" * (8 * MiB)
    pieces = (b'{"input":"' + eight, eight, eight, eight, eight)
    start = gateway.rss()
    after = []
    for _ in range(2):
        codes = burst(10, lambda: send_compressed(gateway.ws_url, pieces))
        assert codes == [1009] * 10, codes
        after.append(gateway.rss())
    print(f"RSS {start / MiB:.0f} MiB, after each burst of 10: {', '.join(f'{a / MiB:.0f}' for a in after)} MiB")
    assert max(after) - start < RSS_SLACK, (start / MiB, [a / MiB for a in after])
    still_serves(gateway)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_http_body_is_inflated_only_to_the_limit(gateway: ChaosGateway, encoding: str):
    """A ``Content-Encoding`` body is decoded as it arrives, bounded by its decoded size (issue 31;
    every coding's bomb: tests/gateway/transport/test_content_encoding.py): this 64 KB bomb of 64 MiB
    is a 413 once 32 MiB are decoded, and costs about that."""
    body = json.dumps({"model": MODEL, "input": "a" * (64 * MiB)}).encode()
    data = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    start = gateway.rss()
    r = httpx.post(
        gateway.url + "/v1/responses",
        content=data,
        timeout=60,
        headers={"content-encoding": encoding, "content-type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert gateway.rss() - start < RSS_SLACK


# -- the stepped inflater, in process ------------------------------------------------------------


def _extension(decoder_cls: type = SteppedDeflate, *, takeover: bool = True) -> PerMessageDeflate:
    return decoder_cls(not takeover, not takeover, 12, 12)


def _frame(data: bytes, wbits: int = 12) -> Frame:
    (payload,) = deflated(wbits, (data,))
    return Frame(Opcode.TEXT, payload, rsv1=True)


@pytest.mark.parametrize("takeover", [True, False])
def test_stepped_inflation_decodes_what_websockets_decodes(takeover: bool):
    """Messages within the bound, several steps long or not, in a row on one connection (the
    decoder's context carried over, or reset per message), decode to exactly what was sent."""
    ext = _extension(takeover=takeover)
    z = zlib.compressobj(wbits=-12)
    for text in (b"x" * 10, bytes(range(256)) * 12_000, b"y" * (3 * INFLATE_STEP + 17), b"{}"):
        payload = (z.compress(text) + z.flush(zlib.Z_SYNC_FLUSH))[:-4]
        if not takeover:
            z = zlib.compressobj(wbits=-12)
        assert ext.decode(Frame(Opcode.TEXT, payload, rsv1=True), max_size=4 * INFLATE_STEP).data == text


def test_stepped_inflation_refuses_past_the_bound_at_half_the_peak():
    """Past ``max_size`` the frame is refused (PayloadTooBig, websockets' 1009) as before, but the
    inflated pieces are dropped rather than copied into one buffer: the peak is the bound plus a
    step, where zlib's own growing buffer and its final copy took about twice the bound."""
    bound = 8 * MiB
    frame = _frame(b"a" * (2 * bound))
    peaks = {}
    for cls in (PerMessageDeflate, SteppedDeflate):
        ext = _extension(cls)
        tracemalloc.start()
        try:
            with pytest.raises(PayloadTooBig):
                ext.decode(frame, max_size=bound)
            peaks[cls.__name__] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks["SteppedDeflate"] < bound + 2 * INFLATE_STEP, peaks
    assert peaks["PerMessageDeflate"] > 1.5 * bound, peaks  # what websockets' own decoder costs


def test_stepped_inflater_leaves_a_small_bound_to_zlib():
    z = zlib.decompressobj(wbits=-12)
    inflater = SteppedInflater(z)
    (payload,) = deflated(12, (b"b" * 1000,))
    assert inflater.decompress(payload, 100) == b"b" * 100 and inflater.unconsumed_tail == z.unconsumed_tail != b""


def test_the_protocol_installs_the_stepped_factory():
    inner = ServerPerMessageDeflateFactory(server_max_window_bits=12, client_max_window_bits=12)
    (factory,) = stepped_extensions([inner])
    response, ext = factory.process_request_params([("client_max_window_bits", None)], [])
    assert factory.name == inner.name and isinstance(ext, SteppedDeflate)
    assert response == inner.process_request_params([("client_max_window_bits", None)], [])[0]
    assert stepped_extensions(None) is None
