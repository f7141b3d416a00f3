"""Client frames read without ``websockets``' parser (``CorkedWebSocketProtocol._one_text_frame``)
are answered exactly as the parser answers them.

Each case sends raw bytes over a raw socket — whole frames, several frames or part of one in a
send, fragments, control frames, binary, bad masks, RSV bits, invalid UTF-8, a frame over the size
limit — to a gateway with the fast path on and to one with it off, and compares everything the
server writes back (frames and close codes). A case meant for the fast path also checks that it
was taken, so a fast path that never runs cannot pass for one that agrees.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from typing import Any

import pytest

from gateway.base.settings import Settings
from gateway.transport.corked import CorkedWebSocketProtocol

LIMIT = 70_000  # max_request_bytes: a frame's payload limit is this plus uvicorn's slack


def frame(payload: bytes, *, opcode: int = 1, fin: bool = True, masked: bool = True, rsv: int = 0) -> bytes:
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    n = len(payload)
    mbit = 0x80 if masked else 0
    if n < 126:
        head += bytes([mbit | n])
    elif n < 65536:
        head += bytes([mbit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mbit | 127]) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def bogus(size: int = 0) -> bytes:
    """A JSON frame the gateway answers at once, without the engine (an unknown event type)."""
    body = b'{"type":"bogus.event"}'
    return body + b" " * max(0, size - len(body))


def _open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Authorization: Bearer test-key\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    assert head.endswith(b"\r\n\r\n"), "the server spoke before the client"
    return sock


def _replies(sock: socket.socket, wait_s: float = 1.5) -> list[Any]:
    """Everything the server writes in ``wait_s`` (or until it closes): frames as (opcode, JSON
    type / close code)."""
    sock.settimeout(0.1)
    buf, deadline = b"", time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    out: list[Any] = []
    while len(buf) >= 2:
        op, n, head = buf[0] & 0x0F, buf[1] & 0x7F, 2
        if n == 126:
            n, head = struct.unpack("!H", buf[2:4])[0], 4
        elif n == 127:
            n, head = struct.unpack("!Q", buf[2:10])[0], 10
        payload, buf = buf[head : head + n], buf[head + n :]
        if op == 1:
            ev = json.loads(payload)
            out.append(("text", ev["type"], (ev.get("error") or {}).get("code")))
        elif op == 8:
            out.append(("close", struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None))
        else:
            out.append((op, payload))
    return out


CASES: dict[str, list[bytes]] = {
    "one small frame": [frame(bogus())],
    "125 bytes": [frame(bogus(125))],
    "126 bytes": [frame(bogus(126))],
    "65535 bytes": [frame(bogus(65535))],
    "65536 bytes": [frame(bogus(65536))],
    "empty text frame": [frame(b"")],
    "two frames in one send": [frame(bogus()) + frame(bogus(300))],
    "a frame in two sends": [frame(bogus(200))[:9], frame(bogus(200))[9:]],
    "fragments": [frame(bogus()[:8], fin=False), frame(bogus()[8:], opcode=0)],
    "a ping then a frame": [frame(b"hi", opcode=9), frame(bogus())],
    "binary JSON": [frame(bogus(), opcode=2)],
    "unmasked": [frame(bogus(), masked=False)],
    "rsv bit": [frame(bogus(), rsv=4)],
    "invalid utf-8": [frame(b'{"type":"\xff\xfe"}')],
    "over the size limit": [frame(bogus(LIMIT + 40_000))],
    "frames after a close": [frame(struct.pack("!H", 1000), opcode=8), frame(bogus())],
}
#: cases the fast path must read: one send of one frame that arrives in one read (a frame of 64 KiB
#: and more comes in several reads: websockets reads it)
FAST = {"one small frame", "125 bytes", "126 bytes", "empty text frame", "invalid utf-8"}
#: cases whose reads depend on how the kernel hands over the sends (two sends may arrive as one
#: read): only their answers are compared
EITHER = {"a frame in two sends", "a ping then a frame", "frames after a close", "fragments"}


@pytest.fixture(scope="module")
def gateways(request):
    from tests.conftest import start_gateway, stop_gateway

    live = start_gateway(Settings(api_keys=["test-key"], max_request_bytes=LIMIT))
    yield live
    stop_gateway(live)


@pytest.mark.parametrize("case", list(CASES))
def test_one_text_frame_fast_path_answers_as_websockets_does(gateways, monkeypatch, case):
    taken: list[bool] = []
    original = CorkedWebSocketProtocol._one_text_frame

    def spy(self, data):
        ok = original(self, data)
        taken.append(ok)
        return ok

    monkeypatch.setattr(CorkedWebSocketProtocol, "_one_text_frame", spy)
    answers = {}
    for fast in (True, False):
        monkeypatch.setattr(CorkedWebSocketProtocol, "fast_text_frames", fast)
        taken.clear()
        sock = _open(int(gateways.url.rsplit(":", 1)[1]))
        try:
            for chunk in CASES[case]:
                sock.sendall(chunk)
                time.sleep(0.05)  # one read per send
            answers[fast] = _replies(sock)
        finally:
            sock.close()
        if not fast:
            assert not taken
        elif case not in EITHER:
            assert any(taken) == (case in FAST), taken
    assert answers[True] == answers[False]
    assert answers[True], "the server answered nothing"
