"""WebSocket backpressure against a live gateway (issue 14, cases 5 and 6, and the 1007 log line).

Raw-socket clients, because the point is what a client that does *not* behave like a library does:
one that floods pings and never reads (the pongs must not pile up in the gateway), one that starts a
long streamed turn and stops reading (the send deadline must close it, abort the engine request
and bill what was generated), one that sends a text frame that is not UTF-8 (close 1007, and no
ERROR line or traceback in the log an unauthenticated client could flood).

Bounds are memory, counts, close codes and ledger records; the loops are bounded and the waits are
safety nets (gateway/transport/corked.py has the mechanism; tests/gateway/transport/test_corked.py its unit tests).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from typing import Any

import orjson
from websockets.sync.client import connect

from billing.usage import MemorySink
from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.chaos import MiB, chaos_gateway
from tests.conftest import MODEL
from tests.http_helpers import wait_for

PING = 0x9
TEXT = 0x1
CLOSE = 0x8


def ws_handshake(port: int, *, rcvbuf: int | None = None) -> tuple[socket.socket, bytes]:
    """A raw socket past the WebSocket handshake; returns it and any bytes read past the 101."""
    sock = socket.socket()
    if rcvbuf is not None:  # before connect: the window the client advertises stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "closed during the handshake"
        head += chunk
    status, _, rest = head.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 101"), status
    return sock, rest


def client_frame(opcode: int, payload: bytes = b"", mask: bytes = b"\x5a\xa5\x3c\xc3") -> bytes:
    """One masked frame, as a client must send it."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def read_until_closed(sock: socket.socket, buf: bytes = b"") -> tuple[int, int | None, str]:
    """Read server frames until the connection ends. Returns (frames read, close code or None,
    how it ended: "close" frame, "eof", or "reset")."""
    frames = 0
    while True:
        while len(buf) >= 2:
            opcode, n = buf[0] & 0x0F, buf[1] & 0x7F
            at = 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, at = struct.unpack("!H", buf[2:4])[0], 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, at = struct.unpack("!Q", buf[2:10])[0], 10
            if len(buf) < at + n:
                break
            payload, buf = buf[at : at + n], buf[at + n :]
            frames += 1
            if opcode == CLOSE:
                return frames, struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None, "close"
        try:
            chunk = sock.recv(1 << 20)
        except ConnectionResetError:
            return frames, None, "reset"
        if not chunk:
            return frames, None, "eof"
        buf += chunk


def one_turn(ws_url: str) -> dict[str, Any]:
    with connect(ws_url, max_size=None) as ws:
        ws.send(
            orjson.dumps({"type": "response.create", "model": MODEL, "input": "still there?", "store": False}).decode()
        )
        while True:
            ev = orjson.loads(ws.recv(timeout=30))
            if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                return ev


# -- case 5: a ping flood from a client that never reads -------------------------------------------

PINGS = 1_000_000  # 125-byte payloads: 131 MB sent, as many pong bytes owed
PINGS_PER_CHUNK = 8192  # ~1 MiB per sendall


def test_a_ping_flood_that_never_reads_its_pongs_stays_bounded(tmp_path):
    """Before: every pong was written whatever the buffer held (2M pings: 191 -> 426 MiB, socket
    open). Now the gateway stops reading while its write buffer is full, so the flooder's own
    ``send()`` blocks, and the send deadline ends the connection; another client is served."""
    chunk = client_frame(PING, bytes(range(125))) * PINGS_PER_CHUNK
    with chaos_gateway(tmp_path, ws_send_deadline_s=1.0) as gw:
        sock, _ = ws_handshake(gw.port)
        sock.settimeout(15)  # a safety net: the gateway closes a flooder that does not read
        sent = 0
        ended = "sent everything"
        with gw.rss_peak() as peak:
            try:
                while sent < PINGS:
                    sock.sendall(chunk)
                    sent += PINGS_PER_CHUNK
            except (ConnectionResetError, BrokenPipeError):
                ended = "reset"
            except TimeoutError:
                ended = "send blocked"
        print(f"ping flood: {sent:,} pings sent ({ended}); {peak}")
        sock.close()
        assert peak.growth < 32 * MiB, f"{peak} after {sent:,} pings"
        assert sent < PINGS, "the gateway read every ping (no backpressure)"
        assert gw.alive()
        assert one_turn(gw.ws_url)["type"] == "response.completed"
        log = gw.log()
        assert "closing 1008 (send deadline exceeded)" in log, log[-3000:]
        assert "Traceback" not in log and '"level": "ERROR"' not in log, log[-3000:]


# -- case 6: a client that starts a long streamed turn and stops reading ------------------------------


def test_a_client_that_stops_reading_is_closed_1008_its_turn_aborted_and_billed(make_gateway):
    """Before: the turn waited on the paused socket for ever (2.8 MB queued, engine request
    running, no keepalive/idle/age close). Now, after ``ws_send_deadline_s`` without progress, the
    socket is closed with 1008, the engine request aborted and the cancelled snapshot billed with
    the tokens generated so far."""
    sink = MemorySink()
    engine = SimulatedEngine(script=lambda view: Turn(text="x", endless=True) if view.last.text == "talk" else None)
    live = make_gateway(Settings(ws_send_deadline_s=1.0), engine=engine, usage_sink=sink)
    sock, rest = ws_handshake(live.server.config.port, rcvbuf=4096)
    sock.sendall(
        client_frame(
            TEXT,
            orjson.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": "talk",
                    "max_output_tokens": 2_000_000,
                    "store": False,
                }
            ),
        )
    )
    # ... and read nothing: the gateway's buffers fill, its sends wait, the deadline passes
    wait_for(
        lambda: engine.stats.aborts == 1 and len(sink.records) == 1,
        timeout=60,
        what="the stalled turn aborted and billed",
    )
    (record,) = sink.records.values()
    assert record.status == "cancelled" and record.transport == "ws"
    assert 0 < record.output_tokens < 2_000_000
    assert engine.stats.running == 0
    assert live.metric("respgate_generation_aborts_total", {"transport": "ws"}) == 1
    assert live.metric("respgate_ws_send_stalls_total") == 1
    wait_for(lambda: not live.gw.connections, timeout=30, what="the connection forgotten")
    frames, code, how = read_until_closed(sock, rest)
    sock.close()
    print(
        f"stalled reader: {record.output_tokens:,} tokens billed as cancelled; then read {frames:,} frames, "
        f"ended by {how} {code or ''}"
    )
    # the close frame sits behind what the client did not read: it sees 1008 if it reads within
    # another deadline, else a reset; either way the connection is over
    assert (how, code) in (("close", 1008), ("reset", None), ("eof", None)), (how, code)
    assert frames > 0
    assert one_turn(live.ws_url)["type"] == "response.completed"


# -- logs: a text frame that is not UTF-8 -----------------------------------------------------------


def test_an_invalid_utf8_text_frame_closes_1007_without_an_error_line(tmp_path):
    """Before: uvicorn logged "Invalid UTF-8 sequence received from client." at ERROR with a
    traceback, per frame. Now: close 1007 and one rate-limited INFO line."""
    with chaos_gateway(tmp_path) as gw:
        for _ in range(3):
            sock, rest = ws_handshake(gw.port)
            sock.sendall(client_frame(TEXT, b'{"type": "response.create", "input": "\xff\xfe"}'))
            frames, code, how = read_until_closed(sock, rest)
            sock.close()
            assert (how, code) == ("close", 1007)
        assert one_turn(gw.ws_url)["type"] == "response.completed"
        lines = [json.loads(line) for line in gw.log().splitlines() if line.startswith("{")]
    # (each line is written before the close frame it explains is sent)
    assert not [line for line in lines if line["level"] in ("ERROR", "CRITICAL") or "exc_info" in line], lines
    refused = [line for line in lines if "closing 1007" in line["message"]]
    assert len(refused) == 3 and all(line["level"] == "INFO" for line in refused), refused
