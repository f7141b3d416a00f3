"""Graceful shutdown (gateway/ops/server.py): stop accepting, finish in-flight turns up to
``shutdown_grace_s``, then an error event and close 1001 on every socket, and drain billing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from billing.usage import MemorySink
from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL, free_port, stop_gateway, wait_until_ready
from tests.http_helpers import wait_for
from tests.ws_helpers import create, fixed, recv, send, until_terminal, ws_open

REPO = str(Path(__file__).resolve().parents[3])


def _read_until_closed(ws: Any, timeout: float = 30) -> tuple[list[dict[str, Any]], int | None]:
    frames: list[dict[str, Any]] = []
    try:
        while True:
            frames.append(recv(ws, timeout=timeout))
    except ConnectionClosed as closed:
        return frames, closed.rcvd.code if closed.rcvd is not None else None


def _start_stop(live: Any) -> threading.Thread:
    stopper = threading.Thread(target=stop_gateway, args=(live,))
    stopper.start()
    wait_for(lambda: not live.gw.accepting, what="shutdown begun")
    return stopper


def test_in_flight_turn_completes_then_error_and_1001_and_every_usage_record_is_written(make_gateway):
    sink = MemorySink()
    engine = SimulatedEngine(script=fixed(Turn(text="slow " * 60, delay_per_token_s=0.01)))
    live = make_gateway(Settings(shutdown_grace_s=20), engine=engine, usage_sink=sink)
    busy, idle = ws_open(live), ws_open(live)
    send(idle, create(input="one quick turn first", max_output_tokens=16))
    earlier = until_terminal(idle)[-1]["response"]["id"]
    send(busy, create(input="go"))
    first = recv(busy)
    assert first["type"] == "response.created"
    in_flight = first["response"]["id"]
    while recv(busy)["type"] != "response.output_text.delta":
        pass

    stopper = _start_stop(live)
    requests_before = engine.stats.requests
    send(busy, create(input="sent while draining"))  # refused: never reaches the engine
    frames, code = _read_until_closed(busy)
    idle_frames, idle_code = _read_until_closed(idle)
    stopper.join(30)
    assert not stopper.is_alive()

    types = [f["type"] for f in frames]
    assert "response.completed" in types and types.index("response.completed") < len(types) - 1, types
    done = next(f for f in frames if f["type"] == "response.completed")["response"]
    assert done["id"] == in_flight and done["output"][-1]["content"][0]["text"] == "slow " * 60
    assert types[-1] == "error" and frames[-1]["status"] == 503 and frames[-1]["error"]["type"] == "server_error"
    assert frames[-1]["error"]["code"] == "server_shutting_down"
    assert code == 1001
    assert [f["type"] for f in idle_frames] == ["error"] and idle_code == 1001
    assert engine.stats.requests == requests_before and engine.stats.aborts == 0
    # billing drained: a record for every response, the in-flight one with its full output
    assert set(sink.records) == {earlier, in_flight}
    assert sink.records[in_flight].status == "completed"
    assert sink.records[in_flight].output_tokens == done["usage"]["output_tokens"] > 0
    assert live.metric("respgate_usage_pending") == 0
    assert live.metric("respgate_shutdown_cut_turns_total") == 0


def test_turn_past_the_deadline_is_aborted_recorded_and_the_socket_closed_1001(make_gateway):
    sink = MemorySink()
    engine = SimulatedEngine(script=fixed(Turn(text="x", endless=True, delay_per_token_s=0.005)))
    live = make_gateway(Settings(shutdown_grace_s=0.5), engine=engine, usage_sink=sink)
    ws = ws_open(live)
    send(ws, create(input="talk forever", max_output_tokens=100_000))
    created = recv(ws)
    assert created["type"] == "response.created"
    stopper = _start_stop(live)
    frames, code = _read_until_closed(ws)
    stopper.join(30)
    types = [f["type"] for f in frames]
    assert not {"response.completed", "response.incomplete"} & set(types)
    assert types[-1] == "error" and frames[-1]["status"] == 503 and code == 1001
    assert engine.stats.aborts == 1 and engine.stats.running == 0
    record = sink.records[created["response"]["id"]]
    assert record.status == "cancelled" and record.output_tokens > 0
    assert live.metric("respgate_shutdown_cut_turns_total") == 1


def test_http_request_in_flight_finishes_during_shutdown(make_gateway):
    sink = MemorySink()
    engine = SimulatedEngine(script=fixed(Turn(text="slow " * 40, delay_per_token_s=0.01)))
    live = make_gateway(Settings(shutdown_grace_s=20), engine=engine, usage_sink=sink)
    box: dict[str, Any] = {}

    def post() -> None:
        box["r"] = httpx.post(
            live.base_url + "/responses",
            json={"model": MODEL, "input": "hi"},
            headers={"Authorization": "Bearer k"},
            timeout=30,
        )

    client = threading.Thread(target=post)
    client.start()
    wait_for(lambda: engine.stats.running == 1, what="HTTP turn running")
    stopper = _start_stop(live)
    client.join(30)
    stopper.join(30)
    r = box["r"]
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert set(sink.records) == {r.json()["id"]}


@pytest.mark.slow
def test_sigterm_to_respgate_serve_drains_to_the_redis_ledger(tmp_path, redis_url):
    """The real command and signal: SIGTERM mid-turn, the turn completes, 1001, ledger has it all."""
    import redis

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")}
    env.update(
        RESPGATE_ENGINE="simulated",
        RESPGATE_SIM_DECODE_TPS="200",
        RESPGATE_REDIS_URL=redis_url,
        RESPGATE_USAGE_JOURNAL=str(tmp_path / "journal.jsonl"),
        RESPGATE_LOG_FORMAT="json",
        PYTHONPATH=REPO,
    )
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_until_ready(proc, port, tmp_path / "serve.log", 60, poll=0.2)
        from websockets.sync.client import connect

        with connect(
            f"ws://127.0.0.1:{port}/v1/responses", open_timeout=10, additional_headers={"Authorization": "Bearer k"}
        ) as ws:
            send(ws, create(model="gpt-oss-sim", input="a first turn"))
            first = until_terminal(ws)[-1]["response"]["id"]
            send(
                ws,
                create(
                    model="gpt-oss-sim", input="write a long answer", max_output_tokens=300, previous_response_id=first
                ),
            )
            created = recv(ws)
            assert created["type"] == "response.created"
            proc.send_signal(signal.SIGTERM)
            frames, code = _read_until_closed(ws)
        assert code == 1001, frames[-3:]
        assert frames[-1]["type"] == "error"
        terminal = [f for f in frames if f["type"] in ("response.completed", "response.incomplete")]
        assert terminal and terminal[0]["response"]["id"] == created["response"]["id"]
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    ids = {fields[b"response_id"].decode() for _, fields in redis.Redis.from_url(redis_url).xrange("respgate:usage")}
    assert ids == {first, created["response"]["id"]}
    lines = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines() if line.startswith("{")]
    assert any(x.get("message") == "turn finished" and x.get("response_id") == first for x in lines)
    assert any("Application shutdown complete" in x.get("message", "") for x in lines)
