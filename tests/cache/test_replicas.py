"""Two real gateway processes sharing one Redis: what two replicas behind a load balancer see.

``test_redis_store.py`` runs two apps in one process; here each replica is its own
``python -m gateway.ops.cli serve --engine simulated`` with only the environment in common
(``RESPGATE_REDIS_URL``), so nothing can be shared by accident — no module state, no token cache,
no usage queue. A chain created on A continues on B over HTTP and over WebSocket; B re-renders
the chain once (it has the items from Redis but not A's token ids) and says so in its /metrics;
reads, pagination and deletes agree across replicas; the usage ledger holds exactly one record per
response whichever process served it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from billing.report import iter_ledger
from tests.billing.test_billing import REPO, TERMINAL, _listening
from tests.conftest import MODEL, free_port
from tests.http_helpers import wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@dataclass
class Replica:
    name: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """One sample from the process's own /metrics page (0 when absent)."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                    return sample.value
        return 0.0

    def misses(self) -> float:
        """Store reads that found the response but not this process's token ids."""
        return self.metric("respgate_store_token_cache_total", {"outcome": "miss"})

    def full_renders(self) -> float:
        return self.metric("respgate_render_full_fallbacks_total", {"reason": "tokens_missing"})


@pytest.fixture
def replicas(redis_url: str, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    started: list[Replica] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_") and k != "REDIS_URL"}
    try:
        for name in ("a", "b"):
            port = free_port()
            env = {
                **base,
                "RESPGATE_REDIS_URL": redis_url,
                "RESPGATE_LOG_LEVEL": "warning",
                # each replica its own journal (and WAL), as on two hosts
                "RESPGATE_USAGE_JOURNAL": str(tmp_path / f"journal-{name}.jsonl"),
            }
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--engine", "simulated", "--port", str(port)],
                env=env,
                cwd=REPO,
            )
            started.append(Replica(name, port, proc))
        for r in started:
            wait_for(lambda r=r: r.proc.poll() is not None or _listening(r.port), 60, f"replica {r.name} to listen")
            assert r.proc.poll() is None, f"replica {r.name} exited"
        yield started[0], started[1]
    finally:
        for r in started:
            r.proc.terminate()  # graceful: each drains its usage queue into the ledger
        for r in started:
            r.proc.wait(30)


def create(replica: Replica, **fields: Any) -> dict[str, Any]:
    fields.setdefault("model", MODEL)
    r = httpx.post(replica.url + "/responses", json=fields, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "completed", body
    return body


def ws_turn(ws: Any, **fields: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": MODEL, **fields}))
    while True:
        ev = json.loads(ws.recv(timeout=30))
        assert ev["type"] != "error", ev
        if ev["type"] in TERMINAL:
            assert ev["type"] == "response.completed", ev
            return ev["response"]


def assert_one_ledger_record_each(redis_url: str, ids: set[str]) -> None:
    """Both processes bill into the one ledger: every response once, nothing else."""
    wait_for(lambda: {r.response_id for r in iter_ledger(redis_url)} >= ids, 30, "every usage record")
    ledger = [r.response_id for r in iter_ledger(redis_url)]
    assert sorted(ledger) == sorted(ids)


def test_http_chain_created_on_one_process_continues_on_the_other(
    replicas: tuple[Replica, Replica], redis_url: str
) -> None:
    a, b = replicas
    inputs = [{"type": "message", "role": "user", "content": f"m{i}"} for i in range(5)]
    r1 = create(a, input=inputs, store=True)  # a shared store: the write lands before the body returns
    r2 = create(a, input="second", previous_response_id=r1["id"])  # A holds r1's tokens

    assert (b.misses(), b.full_renders()) == (0, 0)
    r3 = create(b, input="third", previous_response_id=r2["id"])  # B has the items, not the tokens
    assert (b.misses(), b.full_renders()) == (1, 1)  # one re-render, reported by B itself
    assert r3["previous_response_id"] == r2["id"]
    assert r3["usage"]["input_tokens"] > r2["usage"]["input_tokens"] > r1["usage"]["input_tokens"]
    r4 = create(b, input="fourth", previous_response_id=r3["id"])  # B now holds the chain's tokens
    assert b.full_renders() == 1 and a.full_renders() == 0

    got = httpx.get(f"{b.url}/responses/{r1['id']}", timeout=10)
    assert got.status_code == 200 and got.json() == r1
    page = httpx.get(
        f"{b.url}/responses/{r1['id']}/input_items", params={"limit": 2, "order": "asc"}, timeout=10
    ).json()
    assert [i["content"][0]["text"] for i in page["data"]] == ["m0", "m1"] and page["has_more"]
    rest = httpx.get(
        f"{b.url}/responses/{r1['id']}/input_items", params={"order": "asc", "after": page["last_id"]}, timeout=10
    ).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["m2", "m3", "m4"] and not rest["has_more"]

    deleted = httpx.delete(f"{b.url}/responses/{r1['id']}", timeout=10)
    assert deleted.status_code == 200 and deleted.json() == {"id": r1["id"], "object": "response", "deleted": True}
    assert httpx.get(f"{a.url}/responses/{r1['id']}", timeout=10).status_code == 404  # A sees B's delete
    gone = httpx.post(
        a.url + "/responses", json={"model": MODEL, "input": "x", "previous_response_id": r1["id"]}, timeout=30
    )
    assert gone.status_code == 400 and gone.json()["error"]["code"] == "previous_response_not_found"
    r5 = create(a, input="fifth", previous_response_id=r4["id"])  # descendants keep the whole context
    assert r5["usage"]["input_tokens"] > r4["usage"]["input_tokens"]

    assert_one_ledger_record_each(redis_url, {r["id"] for r in (r1, r2, r3, r4, r5)})


def test_ws_turns_on_one_process_continue_on_a_socket_to_the_other(
    replicas: tuple[Replica, Replica], redis_url: str
) -> None:
    from websockets.sync.client import connect

    a, b = replicas
    with connect(a.ws_url, max_size=None) as ws:
        t1 = ws_turn(ws, input="the code word is PELICAN", store=True)
        t2 = ws_turn(ws, input="and again", previous_response_id=t1["id"], store=True)
        t3 = ws_turn(ws, input="kept local", previous_response_id=t2["id"], store=False)
    # A WebSocket turn's store write is not awaited before its terminal event (its continuations
    # come from the connection cache): wait until B can read it
    wait_for(
        lambda: httpx.get(f"{b.url}/responses/{t2['id']}", timeout=10).status_code == 200, 30, "t2 in the shared store"
    )
    assert httpx.get(f"{b.url}/responses/{t3['id']}", timeout=10).status_code == 404  # store=false stays on A

    misses, renders = b.misses(), b.full_renders()
    with connect(b.ws_url, max_size=None) as ws:
        t4 = ws_turn(ws, input="continued on B", previous_response_id=t2["id"], store=False)
        assert (b.misses(), b.full_renders()) == (misses + 1, renders + 1)  # hydrated from Redis, re-rendered
        t5 = ws_turn(ws, input="and on", previous_response_id=t4["id"], store=False)  # the connection cache
        assert (b.misses(), b.full_renders()) == (misses + 1, renders + 1)
    assert t4["previous_response_id"] == t2["id"] and t5["previous_response_id"] == t4["id"]
    assert t4["usage"]["input_tokens"] > t2["usage"]["input_tokens"]
    assert t5["usage"]["input_tokens"] > t4["usage"]["input_tokens"]
    assert a.full_renders() == 0

    assert_one_ledger_record_each(redis_url, {t["id"] for t in (t1, t2, t3, t4, t5)})
