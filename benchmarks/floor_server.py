"""The no-work floor of a WebSocket continuation turn: respgate's own frames, replayed by a server
that does nothing else.

Why it exists: benchmark (a) times a turn from the client's first byte to the terminal event, so
every figure includes what no server can take away — the benchmark client's Python (sending the
create, reading and parsing every frame), two processes waking each other on loopback, and the
bytes of the frames themselves. This server answers every ``response.create`` with frames of
exactly the sizes and order respgate sent for the same kind of turn (recorded from respgate at the
start of the run, its response ids replaced by fresh ones), written in one socket write: the least
any server speaking the protocol with those events could cost. The peer report reads a ratio
target against it — a target below the floor cannot be met by any server, measured this way.

It is a measurement instrument, not a gateway: no validation, no state, no engine.

    python -m benchmarks.floor_server --port P --frames FRAMES.json

``FRAMES.json``: ``{"short": [frame, ...], "cap16": [frame, ...]}`` (text frames; the last one is
the terminal event). A create that sets ``max_output_tokens`` gets the ``cap16`` frames.
"""

from __future__ import annotations

import argparse
import asyncio
import http
import itertools
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.server import ServerConnection, serve

__all__ = ["FloorServer", "load_frames", "main", "recorded_turn"]


def load_frames(path: Path) -> dict[str, list[bytes]]:
    """Each kind's frames, encoded; the terminal frame last (its response id is replaced per turn)."""
    raw = orjson.loads(path.read_bytes())
    return {kind: [f.encode() for f in frames] for kind, frames in raw.items()}


def recorded_turn(ws: Any, body: dict[str, Any]) -> list[str]:
    """One turn's frames, as a server sent them (``ws``: a websockets sync client connection)."""
    ws.send(orjson.dumps(body).decode())
    frames: list[str] = []
    while True:
        msg = ws.recv(timeout=120)
        frames.append(msg)
        kind = orjson.loads(msg)["type"]
        if kind in ("response.completed", "response.incomplete"):
            return frames
        if kind in ("error", "response.failed"):
            raise RuntimeError(f"recording a turn failed: {msg[:300]}")


def _terminal(frame: bytes, response_id: str) -> bytes:
    ev = orjson.loads(frame)
    ev["response"]["id"] = response_id
    return orjson.dumps(ev)


async def _serve(port: int, frames: dict[str, list[bytes]]) -> None:
    ids = itertools.count(1)

    async def handler(ws: ServerConnection) -> None:
        protocol, transport = ws.protocol, ws.transport
        async for message in ws:
            kind = (
                "cap16"
                if b'"max_output_tokens"' in (message if isinstance(message, bytes) else message.encode())
                else "short"
            )
            out = frames[kind]
            for frame in out[:-1]:
                protocol.send_text(frame)
            protocol.send_text(_terminal(out[-1], f"resp_floor{next(ids):024d}"))
            transport.write(b"".join(protocol.data_to_send()))  # the turn in one write

    def health(connection: ServerConnection, request: Any) -> Any:
        return connection.respond(http.HTTPStatus.OK, "ok\n") if request.path == "/health" else None

    async with serve(
        handler, "127.0.0.1", port, compression=None, max_size=None, ping_interval=None, process_request=health
    ):
        await asyncio.Future()


class FloorServer:
    """This server on a free loopback port, in its own process, replaying ``frames``."""

    def __init__(self, frames: dict[str, list[str]]) -> None:
        from benchmarks.common import ROOT, wait_healthy
        from tests.conftest import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/responses"
        self._frames = tempfile.NamedTemporaryFile("wb", prefix="floor-frames-", suffix=".json")
        self._frames.write(orjson.dumps(frames))
        self._frames.flush()
        cmd = [sys.executable, "-m", "benchmarks.floor_server", "--port", str(self.port), "--frames", self._frames.name]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
        wait_healthy(self.proc, self.url, what="floor_server", timeout_s=60, poll_s=0.1)

    def close(self) -> None:
        from benchmarks.agentic_peer import _stop

        _stop(self.proc)
        self._frames.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--frames", type=Path, required=True)
    args = ap.parse_args(argv)
    frames = load_frames(args.frames)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        asyncio.run(_serve(args.port, frames))
    else:
        uvloop.run(_serve(args.port, frames))


if __name__ == "__main__":
    main()
