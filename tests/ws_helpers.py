"""Helpers shared by the WebSocket-mode test files: open a socket, send and receive strict JSON
frames, read up to a turn's terminal event.

The receiving side is strict on purpose (it is part of what the tests check): every server frame
must be a text frame holding one JSON object.
"""

from __future__ import annotations

import json
import time
from typing import Any

from websockets.sync.client import ClientConnection, connect

from inference.simulated_script import Turn
from tests.conftest import MODEL, LiveGateway

TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def ws_open(live: LiveGateway, path: str = "/v1/responses", **kw: Any) -> ClientConnection:
    kw.setdefault("open_timeout", 10)
    kw.setdefault("additional_headers", {"Authorization": "Bearer test-key"})
    return connect(live.url.replace("http://", "ws://") + path, **kw)


def send(ws: ClientConnection, frame: dict[str, Any] | str) -> None:
    ws.send(frame if isinstance(frame, str) else json.dumps(frame))


def recv(ws: ClientConnection, timeout: float = 15) -> dict[str, Any]:
    raw = ws.recv(timeout=timeout)
    assert isinstance(raw, str), f"server sent a binary frame: {raw[:80]!r}"
    ev = json.loads(raw)
    assert isinstance(ev, dict)
    return ev


def create(**fields: Any) -> dict[str, Any]:
    """A ``response.create`` frame (model and input defaulted)."""
    fields.setdefault("model", MODEL)
    fields.setdefault("input", "hello")
    return {"type": "response.create", **fields}


def until_terminal(ws: ClientConnection, timeout: float = 20) -> list[dict[str, Any]]:
    """Frames up to and including the first terminal event or ``error`` frame."""
    deadline = time.monotonic() + timeout
    out: list[dict[str, Any]] = []
    while True:
        ev = recv(ws, timeout=max(0.1, deadline - time.monotonic()))
        out.append(ev)
        if ev["type"] in TERMINAL or ev["type"] == "error":
            return out


def fixed(turn: Turn):
    """A simulated-engine script that answers every prompt with ``turn``."""
    return lambda view: turn
