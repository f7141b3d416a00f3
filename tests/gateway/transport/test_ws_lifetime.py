"""WebSocket mode, connection lifetime and disconnects (ws-mode.md §2.4 keepalive, §7, §9, checklist §14).

The 60-minute limit runs with ``ws_max_age_s`` of a fraction of a second. Nothing here asserts on
elapsed time: waits are bounded polls on observable state (engine stats, metrics, the store, the
gateway's connection objects), and slow generations are just long enough to outlive the limit.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from openai import NotFoundError
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.sync.client import ClientConnection

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import wait_for
from tests.ws_helpers import TERMINAL, create, fixed, recv, send, until_terminal, ws_open

LIMIT_MESSAGE = (
    "Responses websocket connection limit reached (60 minutes). Create a new websocket connection to continue."
)
LONG_TEXT = " ".join(f"word{i}" for i in range(150))  # ~300 tokens


def wait_past_age(opened: float, limit: float) -> None:
    """Let the connection's age pass ``limit`` (setup, not an assertion)."""
    remaining = opened + limit - time.monotonic()
    if remaining > 0:
        time.sleep(remaining + 0.05)


def assert_limit_error(ev: dict[str, Any]) -> None:
    assert ev["type"] == "error", ev
    assert ev["status"] == 400
    assert ev["error"]["type"] == "invalid_request_error"
    assert ev["error"]["code"] == "websocket_connection_limit_reached"
    assert ev["error"]["message"] == LIMIT_MESSAGE
    assert ev["error"].get("param") is None
    assert "stream_id" not in ev


def assert_closed_1000(ws: ClientConnection) -> None:
    with pytest.raises(ConnectionClosedOK) as exc_info:
        ws.recv(timeout=10)
    assert exc_info.value.rcvd is not None and exc_info.value.rcvd.code == 1000


def connections(live: LiveGateway) -> list[Any]:
    return list(live.gw.connections)


# -- 60-minute limit ---------------------------------------------------------------------------------


def test_create_after_age_limit_gets_limit_error_then_close_1000(make_gateway):
    live = make_gateway(Settings(ws_max_age_s=0.5, ws_close_idle_at_limit=False))
    with ws_open(live) as ws:
        opened = time.monotonic()
        send(ws, create(input="before the limit"))
        assert until_terminal(ws)[-1]["type"] == "response.completed"
        wait_past_age(opened, 0.5)
        send(ws, create(input="after the limit", stream_id="late"))
        assert_limit_error(recv(ws))
        assert_closed_1000(ws)
    assert live.engine.stats.requests == 1


def test_sdk_iteration_ends_cleanly_after_limit_error(make_gateway):
    """openai-python ends iteration on a 1000 close (any other code would raise or reconnect)."""
    live = make_gateway(Settings(ws_max_age_s=0.5, ws_close_idle_at_limit=False))
    client = live.openai()
    with client.responses.connect() as conn:
        opened = time.monotonic()
        wait_past_age(opened, 0.5)
        conn.response.create(model=MODEL, input="too late")
        received = [ev.type for ev in conn]  # ends by itself: close code 1000
    assert received == ["error"]
    assert live.engine.stats.requests == 0


def test_idle_socket_at_limit_gets_error_and_close_1000(make_gateway):
    live = make_gateway(Settings(ws_max_age_s=0.3))
    with ws_open(live) as ws:
        assert_limit_error(recv(ws, timeout=10))  # no request needed: the idle socket is retired
        assert_closed_1000(ws)
    wait_for(lambda: live.metric("respgate_ws_connections") == 0, what="connection gauge back to 0")


def test_response_in_flight_at_limit_finishes_before_close(make_gateway):
    turn = Turn(text=LONG_TEXT, delay_per_token_s=0.005)  # ~1.5 s of streaming, limit at 0.3 s
    live = make_gateway(Settings(ws_max_age_s=0.3), engine=SimulatedEngine(script=fixed(turn)))
    with ws_open(live) as ws:
        send(ws, create(input="long answer please"))
        events: list[dict[str, Any]] = []
        deltas_after_expiry = 0
        while True:
            ev = recv(ws)
            assert ev["type"] != "error", "limit error sent before the in-flight response finished"
            events.append(ev)
            if ev["type"] == "response.output_text.delta" and any(c.expired for c in connections(live)):
                deltas_after_expiry += 1
            if ev["type"] in TERMINAL:
                break
        assert deltas_after_expiry > 0, "the limit was not reached while the response streamed"
        final = events[-1]["response"]
        assert events[-1]["type"] == "response.completed"
        assert final["output"][-1]["content"][0]["text"] == LONG_TEXT
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert_limit_error(recv(ws))  # then the limit error ...
        assert_closed_1000(ws)  # ... and the close
    assert live.engine.stats.aborts == 0


def test_create_after_limit_while_response_in_flight_waits_for_its_terminal(make_gateway):
    turn = Turn(text=LONG_TEXT, delay_per_token_s=0.005)
    live = make_gateway(
        Settings(ws_max_age_s=0.3, ws_close_idle_at_limit=False), engine=SimulatedEngine(script=fixed(turn))
    )
    with ws_open(live) as ws:
        opened = time.monotonic()
        send(ws, create(input="first"))
        assert recv(ws)["type"] == "response.created"
        wait_past_age(opened, 0.3)
        assert live.engine.stats.running == 1, "first response must still be streaming at the limit"
        send(ws, create(input="second, too late"))
        events = until_terminal(ws)
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["output"][-1]["content"][0]["text"] == LONG_TEXT
        assert_limit_error(recv(ws))
        assert_closed_1000(ws)
    assert live.engine.stats.requests == 1 and live.engine.stats.aborts == 0


# -- disconnect --------------------------------------------------------------------------------------


def _drop(ws: ClientConnection, how: str) -> None:
    if how == "close_frame":
        ws.close()
    else:  # abrupt: TCP gone without a close frame (Codex just drops the socket)
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.socket.close()
        try:
            ws.close()
        except Exception:
            pass


def _start_endless(ws: ClientConnection, deltas: int = 3, **fields: Any) -> str:
    send(ws, create(input="talk forever", **fields))
    created = recv(ws)
    assert created["type"] == "response.created"
    seen = 0
    while seen < deltas:
        ev = recv(ws)
        assert ev["type"] not in TERMINAL and ev["type"] != "error", ev
        seen += ev["type"] == "response.output_text.delta"
    return created["response"]["id"]


@pytest.mark.parametrize("how", ["close_frame", "tcp_drop"])
def test_close_mid_generation_aborts_the_engine_and_frees_the_slot(make_gateway, how):
    engine = SimulatedEngine(script=fixed(Turn(text="x", endless=True, delay_per_token_s=0.002)))
    live = make_gateway(engine=engine)
    ws = ws_open(live)
    _start_endless(ws)
    assert engine.stats.running == 1
    assert live.metric("respgate_ws_inflight") == 1
    _drop(ws, how)
    wait_for(lambda: engine.stats.aborts == 1 and engine.stats.running == 0, what="engine abort")
    wait_for(lambda: live.metric("respgate_generation_aborts_total", {"transport": "ws"}) == 1, what="abort metric")
    wait_for(
        lambda: live.metric("respgate_ws_inflight") == 0 and live.metric("respgate_ws_connections") == 0,
        what="slot and connection released",
    )
    assert live.metric("respgate_abort_seconds_count") == 1
    assert live.metric("respgate_abort_seconds_bucket", {"le": "5.0"}) == 1  # disconnect -> abort within 5 s
    assert engine.stats.requests == 1
    # the capacity is really free: a new connection generates normally
    with ws_open(live) as ws2:
        send(ws2, create(input="next client", max_output_tokens=20))
        assert until_terminal(ws2)[-1]["type"] == "response.incomplete"  # endless script stops at the cap
    assert engine.stats.aborts == 1


def test_close_drops_queued_requests_without_running_them(make_gateway):
    engine = SimulatedEngine(script=fixed(Turn(text="x", endless=True, delay_per_token_s=0.002)))
    live = make_gateway(engine=engine)
    ws = ws_open(live)
    _start_endless(ws)
    send(ws, create(input="queued behind"))
    send(ws, create(input="queued too"))
    ws.close()
    wait_for(lambda: engine.stats.running == 0 and live.metric("respgate_ws_connections") == 0, what="socket torn down")
    assert engine.stats.requests == 1 and engine.stats.aborts == 1


def test_store_true_response_is_retrievable_with_terminal_status_after_close(make_gateway):
    engine = SimulatedEngine(script=fixed(Turn(text="x", endless=True, delay_per_token_s=0.002)))
    live = make_gateway(engine=engine)
    ws = ws_open(live)
    rid = _start_endless(ws, deltas=5, store=True)
    ws.close()
    client = live.openai()
    found: dict[str, Any] = {}

    def retrievable() -> bool:
        try:
            found["r"] = client.responses.retrieve(rid)
        except NotFoundError:
            return False
        return True

    wait_for(retrievable, what="stored snapshot")
    resp = found["r"]
    assert resp.id == rid
    assert resp.status in ("incomplete", "cancelled")
    assert resp.usage is not None and resp.usage.output_tokens >= 5
    # it stays terminal (no later overwrite back to in_progress)
    assert client.responses.retrieve(rid).status == resp.status


def test_abandoned_response_on_open_socket_streams_to_terminal(make_gateway):
    engine = SimulatedEngine(script=fixed(Turn(text=LONG_TEXT, delay_per_token_s=0.001)))
    live = make_gateway(engine=engine)
    with ws_open(live) as ws:
        send(ws, create(input="first"))
        first = recv(ws)
        assert first["type"] == "response.created"
        # the client stops reading (abandons the response) and sends its next turn
        send(ws, create(input="second"))
        wait_for(lambda: engine.stats.requests == 2 and engine.stats.running == 0, what="both generations done")
        events = [first] + until_terminal(ws)
        second = until_terminal(ws)
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == LONG_TEXT
    assert second[0]["type"] == "response.created" and second[-1]["type"] == "response.completed"
    assert engine.stats.aborts == 0


# -- keepalive ---------------------------------------------------------------------------------------


def test_client_pings_get_pongs_while_a_slow_generation_streams(make_gateway):
    engine = SimulatedEngine(script=fixed(Turn(text=LONG_TEXT, delay_per_token_s=0.005)))
    live = make_gateway(engine=engine)
    with ws_open(live, ping_interval=None) as ws:
        send(ws, create(input="slow please"))
        events = [recv(ws)]
        assert events[0]["type"] == "response.created"
        for i in range(3):
            pong = ws.ping(f"p{i}".encode())
            assert pong.wait(timeout=5), f"no pong for ping {i}"
            assert engine.stats.running == 1  # answered while the generation was streaming
        events += until_terminal(ws)
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == LONG_TEXT
    assert engine.stats.aborts == 0


def test_server_shutdown_finishes_in_flight_responses_and_closes_1001(make_gateway):
    import threading

    from tests.conftest import stop_gateway

    live = make_gateway(engine=SimulatedEngine(script=fixed(Turn(text="slow " * 40, delay_per_token_s=0.01))))
    ws = ws_open(live)
    send(ws, create(input="go"))
    while recv(ws)["type"] != "response.output_text.delta":
        pass
    stopper = threading.Thread(target=stop_gateway, args=(live,))
    stopper.start()
    frames = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            frames.append(recv(ws, timeout=20))
    stopper.join(30)
    types = [f["type"] for f in frames]
    assert "response.completed" in types, types
    assert types[-1] == "error" and frames[-1]["status"] == 503 and frames[-1]["error"]["type"] == "server_error"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001  # going away (gateway/ops/server.py)
