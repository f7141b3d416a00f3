"""Browser origins (issue 14, case 10): a page the user opens must not drive a keyless loopback gateway.

Browsers send ``Origin`` on cross-origin WebSocket handshakes and POSTs (even "simple" text/plain
ones that need no preflight); SDKs, Codex and curl send none. Any ``Origin`` not in
``allowed_origins`` is refused with 403 before the upgrade or the body is read.
"""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gateway.base.settings import Settings
from tests.conftest import MODEL

EVIL = "http://evil.example"


def test_cross_origin_handshake_and_simple_post_are_refused(gateway):
    with pytest.raises(InvalidStatus) as refused:
        with connect(gateway.ws_url, origin=EVIL):
            pass
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body)["error"]["code"] == "origin_not_allowed"
    # a no-preflight POST a page can send: text/plain, JSON inside
    r = httpx.post(
        gateway.base_url + "/responses",
        content=json.dumps({"model": MODEL, "input": "hi"}),
        headers={"content-type": "text/plain", "origin": EVIL},
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert gateway.engine.stats.requests == 0
    # clients without a browser send no Origin and are served as before
    assert httpx.post(gateway.base_url + "/responses", json={"model": MODEL, "input": "hi"}).status_code == 200
    with connect(gateway.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
        while json.loads(ws.recv(timeout=10))["type"] != "response.completed":
            pass


def test_listed_origins_are_served(make_gateway):
    live = make_gateway(Settings(allowed_origins=["https://app.example"]))
    r = httpx.post(
        live.base_url + "/responses", json={"model": MODEL, "input": "hi"}, headers={"origin": "https://app.example"}
    )
    assert r.status_code == 200
    with connect(live.ws_url, origin="https://app.example") as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
        while json.loads(ws.recv(timeout=10))["type"] != "response.completed":
            pass
    assert (
        httpx.post(
            live.base_url + "/responses", json={"model": MODEL, "input": "hi"}, headers={"origin": EVIL}
        ).status_code
        == 403
    )
