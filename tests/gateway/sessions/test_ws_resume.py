"""Resumable ``store=false`` chains across WebSocket reconnects (issue 17 item 4).

A chain runs on one socket, the socket goes (the client closes it, the TCP connection is cut, the
server shuts down with 1001), and a new socket's ``response.create`` names the last response: with
``ws_resume_window_s`` it continues — on the same replica from the state in memory, with no full
render (the render counters say so); on another replica from the sealed Redis record, rendered in
full once and token for token the prompt an unbroken chain gets. After the window, for another
tenant, or once claimed, it is ``previous_response_not_found`` exactly as without the setting.

Clients: the official ``openai`` SDK (``client.responses.connect()``, as in
tests/gateway/transport/test_ws_continuation.py) where a clean close is enough, the ``websockets`` client where the
test needs what the SDK hides (a cut TCP connection, the close code 1001), and a replay of real
Codex CLI frames (tests/clients/test_codex_replay.py's captures) across a dropped socket.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
from typing import Any

import pytest
import redis
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.seq import TokenSeq
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.sessions.resumable import ResumableStates
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.clients.test_codex_replay import GEN_PROMPT, HOP_HEADERS, load, tool_result_reporter
from tests.conftest import LiveGateway, stop_gateway
from tests.gateway.transport.test_ws_continuation import (
    MODEL,
    completed,
    echo_on_recall,
    not_found_frame,
    output_text,
    turn_events,
)
from tests.http_helpers import wait_for

pytestmark = pytest.mark.timeout(90)

SECRET = "resume-test-secret"
PELICAN = "the code word is PELICAN"
RECALL = [{"type": "message", "role": "user", "content": "RECALL"}]
TRANSCRIPT = [
    f"user/-: {PELICAN}",
    f"assistant/final: ack<{PELICAN}>",
    "user/-: and the colour is TEAL",
    "assistant/final: ack<and the colour is TEAL>",
    "user/-: RECALL",
]


# -- helpers -------------------------------------------------------------------------------------


def resumable(live: LiveGateway, outcome: str, where: str = "memory") -> float:
    return live.metric("respgate_ws_resumable_states_total", {"outcome": outcome, "where": where})


def full_renders(live: LiveGateway) -> float:
    """Every continuation that had to render in full, whatever the reason."""
    return sum(
        s.value
        for m in live.gw.metrics.registry.collect()
        if m.name == "respgate_render_full_fallbacks"
        for s in m.samples
        if s.name.endswith("_total")
    )


def render_tokens(live: LiveGateway, mode: str) -> float:
    return live.metric("respgate_render_tokens_total", {"mode": mode})


def two_turns(conn: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chain's first two turns on an SDK connection."""
    conn.response.create(model=MODEL, input=PELICAN, store=False)
    r1 = completed(conn)
    conn.response.create(model=MODEL, input="and the colour is TEAL", previous_response_id=r1["id"], store=False)
    return r1, completed(conn)


def recall(conn: Any, prev: str) -> list[dict[str, Any]]:
    conn.response.create(model=MODEL, previous_response_id=prev, store=False, input=RECALL)
    return turn_events(conn)


def ws_send(ws: Any, frame: dict[str, Any]) -> None:
    ws.send(json.dumps(frame))


def ws_turn(ws: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        ev = json.loads(ws.recv(timeout=30))
        out.append(ev)
        if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return out


def ws_create(ws: Any, text: Any, prev: str | None = None, store: bool = False) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": text, "store": store}
    if prev is not None:
        frame["previous_response_id"] = prev
    ws_send(ws, frame)
    evs = ws_turn(ws)
    assert evs[-1]["type"] == "response.completed", evs[-1]
    return evs[-1]["response"]


def records(redis_url: str, response_id: str | None = None) -> list[bytes]:
    """The resumable-state keys in Redis (of one response)."""
    keys = redis.Redis.from_url(redis_url).keys("respgate:wsr:*")
    return [k for k in keys if response_id is None or k.endswith(response_id.encode())]


def echo_engine() -> SimulatedEngine:
    return SimulatedEngine(script=echo_on_recall, record_prompts=True)


@pytest.fixture
def resume_gw(make_gateway) -> LiveGateway:
    return make_gateway(Settings(ws_resume_window_s=60), engine=echo_engine())


def replica_settings(redis_url: str, **kw: Any) -> Settings:
    return Settings(redis_url=redis_url, ws_resume_window_s=60, ws_resume_redis=True, seal_secret=SECRET, **kw)


# -- the same replica: the state in memory, appended to ------------------------------------------


def test_reconnect_continues_on_the_same_replica_without_a_full_render(resume_gw):
    client = resume_gw.openai()
    with client.responses.connect() as conn:
        r1, r2 = two_turns(conn)
    wait_for(lambda: len(resume_gw.gw.resumable) == 1, what="the closed connection's lane to be parked")
    assert resumable(resume_gw, "kept") == 1
    p2 = resume_gw.engine.stats.prompts[-1]
    full0, append0 = render_tokens(resume_gw, "full"), render_tokens(resume_gw, "append")
    assert full_renders(resume_gw) == 0

    with client.responses.connect() as conn:
        evs = recall(conn, r2["id"])
    r3 = evs[-1]["response"]
    assert evs[-1]["type"] == "response.completed", evs[-1]
    assert r3["previous_response_id"] == r2["id"]
    assert output_text(r3).splitlines() == TRANSCRIPT
    # the history was not rendered again: only the new items were encoded (an append) ...
    assert full_renders(resume_gw) == 0
    assert render_tokens(resume_gw, "full") == full0
    p3 = resume_gw.engine.stats.prompts[-1]
    assert render_tokens(resume_gw, "append") - append0 == len(p3) - len(p2) - r2["usage"]["output_tokens"] - GEN_PROMPT
    # ... onto the very tokens of the unbroken chain: turn 2's prompt + its sampled output
    assert p3[: len(p2)] == p2 and len(p3) == r3["usage"]["input_tokens"]
    assert resumable(resume_gw, "claimed") == 1 and r2["id"] not in resume_gw.gw.resumable
    # the second socket's close parked its own lane (turn 3) in place of the claimed one
    wait_for(lambda: r3["id"] in resume_gw.gw.resumable, what="the second connection's lane to be parked")
    assert len(resume_gw.gw.resumable) == 1 and resumable(resume_gw, "kept") == 2


def test_a_cut_tcp_connection_is_resumable_too(resume_gw):
    """No close frame at all (the network went): the server sees the socket fail and parks it."""
    ws = connect(resume_gw.ws_url, max_size=None)
    r1 = ws_create(ws, PELICAN)
    ws.socket.shutdown(socket.SHUT_RDWR)  # the transport dies under the client; no close handshake
    ws.socket.close()
    wait_for(lambda: len(resume_gw.gw.resumable) == 1, what="the cut connection's lane to be parked")
    with connect(resume_gw.ws_url, max_size=None) as ws2:
        r2 = ws_create(ws2, RECALL, prev=r1["id"])
    assert output_text(r2).splitlines() == [f"user/-: {PELICAN}", f"assistant/final: ack<{PELICAN}>", "user/-: RECALL"]
    assert full_renders(resume_gw) == 0


def test_the_connection_age_limit_close_is_resumable(make_gateway):
    """The 60-minute limit (a fraction of a second here) retires the socket with 1000: the chain goes on."""
    live = make_gateway(Settings(ws_resume_window_s=60, ws_max_age_s=1.5), engine=echo_engine())
    with connect(live.ws_url, max_size=None) as ws:
        r1 = ws_create(ws, PELICAN)
        farewell = json.loads(ws.recv(timeout=30))  # the idle socket is retired at the limit
        assert farewell["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
        assert ws.close_code == 1000
    wait_for(lambda: r1["id"] in live.gw.resumable, what="the retired connection's lane to be parked")
    with connect(live.ws_url, max_size=None) as ws:
        r2 = ws_create(ws, RECALL, prev=r1["id"])
    assert output_text(r2).splitlines()[0] == f"user/-: {PELICAN}" and full_renders(live) == 0


def test_every_lane_is_resumable_and_each_is_claimed_once(resume_gw):
    """Two lanes park two states; two reconnects racing for one state: exactly one continues."""
    with connect(resume_gw.ws_url, max_size=None) as ws:
        ws_send(ws, {"type": "response.create", "model": MODEL, "input": "lane a", "store": False, "stream_id": "a"})
        ws_send(ws, {"type": "response.create", "model": MODEL, "input": "lane b", "store": False, "stream_id": "b"})
        done = {}
        while len(done) < 2:
            ev = json.loads(ws.recv(timeout=30))
            if ev["type"] == "response.completed":
                done[ev["stream_id"]] = ev["response"]
    wait_for(lambda: len(resume_gw.gw.resumable) == 2, what="both lanes to be parked")
    a_id, b_id = done["a"]["id"], done["b"]["id"]

    frame = {"type": "response.create", "model": MODEL, "input": RECALL, "store": False, "previous_response_id": a_id}
    with connect(resume_gw.ws_url, max_size=None) as one, connect(resume_gw.ws_url, max_size=None) as two:
        ws_send(one, frame)
        ws_send(two, frame)
        ends = sorted((ws_turn(one)[-1], ws_turn(two)[-1]), key=lambda e: e["type"])
    assert [e["type"] for e in ends] == ["error", "response.completed"]
    assert ends[0] == not_found_frame(a_id)
    assert resumable(resume_gw, "claimed") == 1
    # the other lane's state is untouched by the race
    with connect(resume_gw.ws_url, max_size=None) as ws:
        assert output_text(ws_create(ws, RECALL, prev=b_id)).splitlines()[0] == "user/-: lane b"


def test_refused_for_another_tenant_and_left_for_its_own(make_gateway):
    live = make_gateway(
        Settings(ws_resume_window_s=60, api_keys=["alice:key-alice", "bob:key-bob"]), engine=echo_engine()
    )
    alice, bob = {"Authorization": "Bearer key-alice"}, {"Authorization": "Bearer key-bob"}
    with connect(live.ws_url, additional_headers=alice, max_size=None) as ws:
        r1 = ws_create(ws, PELICAN)
    wait_for(lambda: len(live.gw.resumable) == 1, what="alice's lane to be parked")
    with connect(live.ws_url, additional_headers=bob, max_size=None) as ws:
        ws_send(
            ws,
            {
                "type": "response.create",
                "model": MODEL,
                "input": RECALL,
                "store": False,
                "previous_response_id": r1["id"],
            },
        )
        assert ws_turn(ws) == [not_found_frame(r1["id"])]
    assert len(live.gw.resumable) == 1 and resumable(live, "claimed") == 0  # bob took nothing
    with connect(live.ws_url, additional_headers=alice, max_size=None) as ws:
        assert output_text(ws_create(ws, RECALL, prev=r1["id"])).splitlines()[0] == f"user/-: {PELICAN}"


def test_refused_after_the_window(make_gateway):
    live = make_gateway(Settings(ws_resume_window_s=0.2), engine=echo_engine())
    with connect(live.ws_url, max_size=None) as ws:
        r1 = ws_create(ws, PELICAN)
    wait_for(lambda: resumable(live, "kept") == 1, what="the lane to be parked")
    # the window's timer drops it: no claim needed for the memory to be given back
    wait_for(lambda: resumable(live, "expired") == 1, what="the window to pass")
    assert len(live.gw.resumable) == 0 and live.gw.resumable.nbytes == 0
    with connect(live.ws_url, max_size=None) as ws:
        ws_send(
            ws,
            {
                "type": "response.create",
                "model": MODEL,
                "input": RECALL,
                "store": False,
                "previous_response_id": r1["id"],
            },
        )
        assert ws_turn(ws) == [not_found_frame(r1["id"])]
    assert resumable(live, "claimed") == 0


def test_off_by_default_nothing_is_kept(gateway):
    assert Settings().ws_resume_window_s == 0 and gateway.gw.resumable is None
    with connect(gateway.ws_url, max_size=None) as ws:
        r1 = ws_create(ws, PELICAN)
    with connect(gateway.ws_url, max_size=None) as ws:
        ws_send(
            ws,
            {
                "type": "response.create",
                "model": MODEL,
                "input": RECALL,
                "store": False,
                "previous_response_id": r1["id"],
            },
        )
        assert ws_turn(ws) == [not_found_frame(r1["id"])]


def test_a_stored_response_is_not_parked(resume_gw):
    """store=true resolves from the response store after a reconnect anyway: nothing to keep."""
    with connect(resume_gw.ws_url, max_size=None) as ws:
        r1 = ws_create(ws, PELICAN, store=True)
    wait_for(lambda: resume_gw.metric("respgate_ws_connections") == 0, what="the connection to be closed")
    assert resumable(resume_gw, "kept") == 0 and len(resume_gw.gw.resumable) == 0
    with connect(resume_gw.ws_url, max_size=None) as ws:
        r2 = ws_create(ws, RECALL, prev=r1["id"], store=True)
    assert output_text(r2).splitlines()[0] == f"user/-: {PELICAN}"


# -- another replica: the sealed Redis record ------------------------------------------------------


def test_reconnect_to_another_replica_continues_from_the_sealed_record(make_gateway, redis_url):
    a = make_gateway(replica_settings(redis_url), engine=echo_engine())
    b = make_gateway(replica_settings(redis_url), engine=echo_engine())
    with a.openai().responses.connect() as conn:
        r1, r2 = two_turns(conn)
    wait_for(lambda: resumable(a, "kept", "redis") == 1, what="the record to be written")
    r = redis.Redis.from_url(redis_url)
    keys = records(redis_url)
    assert len(keys) == 1 and keys == records(redis_url, r2["id"])
    blob = r.get(keys[0])
    assert b"PELICAN" not in blob and b"TEAL" not in blob  # sealed: not readable in Redis
    assert 0 < r.pttl(keys[0]) <= 60_000  # expires with the window, whoever takes it

    with b.openai().responses.connect() as conn:
        evs = recall(conn, r2["id"])
    r3 = evs[-1]["response"]
    assert evs[-1]["type"] == "response.completed", evs[-1]
    assert output_text(r3).splitlines() == TRANSCRIPT
    assert resumable(b, "claimed", "redis") == 1 and records(redis_url, r2["id"]) == []
    # B had the items, not A's token ids: one full render, counted as the store hand-over is
    assert b.metric("respgate_render_full_fallbacks_total", {"reason": "tokens_missing"}) == 1

    # token-exact: the prompt B rendered is the one an unbroken chain on one socket gets
    with a.openai().responses.connect() as conn:
        u1, u2 = two_turns(conn)
        assert recall(conn, u2["id"])[-1]["type"] == "response.completed"
    assert b.engine.stats.prompts[-1] == a.engine.stats.prompts[-1]
    assert full_renders(a) == 0

    # claimed once across replicas: A still holds its copy in memory, but B took the record first
    with a.openai().responses.connect() as conn:
        assert recall(conn, r2["id"]) == [not_found_frame(r2["id"])]
    assert resumable(a, "lost") == 1 and resumable(a, "claimed") == 0


def test_reconnect_to_the_same_replica_with_redis_still_appends(make_gateway, redis_url):
    a = make_gateway(replica_settings(redis_url), engine=echo_engine())
    with a.openai().responses.connect() as conn:
        _, r2 = two_turns(conn)
    wait_for(lambda: resumable(a, "kept", "redis") == 1, what="the record to be written")
    with a.openai().responses.connect() as conn:
        assert output_text(recall(conn, r2["id"])[-1]["response"]).splitlines() == TRANSCRIPT
    assert full_renders(a) == 0 and resumable(a, "claimed") == 1
    assert records(redis_url, r2["id"]) == []  # the record went with the claim


def test_a_record_sealed_with_another_secret_does_not_open(make_gateway, redis_url):
    a = make_gateway(replica_settings(redis_url), engine=echo_engine())
    b = make_gateway(
        Settings(redis_url=redis_url, ws_resume_window_s=60, ws_resume_redis=True, seal_secret="another-secret"),
        engine=echo_engine(),
    )
    with connect(a.ws_url, max_size=None) as ws:
        r1 = ws_create(ws, PELICAN)
    wait_for(lambda: resumable(a, "kept", "redis") == 1, what="the record to be written")
    with connect(b.ws_url, max_size=None) as ws:
        ws_send(
            ws,
            {
                "type": "response.create",
                "model": MODEL,
                "input": RECALL,
                "store": False,
                "previous_response_id": r1["id"],
            },
        )
        assert ws_turn(ws) == [not_found_frame(r1["id"])]
    assert resumable(b, "failed", "redis") == 1


def test_redis_down_at_close_keeps_the_state_in_memory(make_gateway, redis_server, redis_url):
    """The record cannot be written: the replica that held the socket still resumes it (appending),
    and the claim does not wait on Redis to decide (nobody else can have taken it)."""
    a = make_gateway(replica_settings(redis_url), engine=echo_engine())
    try:
        with a.openai().responses.connect() as conn:
            _, r2 = two_turns(conn)
            redis_server.stop()  # Redis goes before the socket does
        wait_for(lambda: resumable(a, "failed", "redis") == 1, what="the record write to fail")
        assert resumable(a, "kept", "memory") == 1 and resumable(a, "kept", "redis") == 0
        with a.openai().responses.connect() as conn:
            assert output_text(recall(conn, r2["id"])[-1]["response"]).splitlines() == TRANSCRIPT
    finally:
        redis_server.start()
    assert full_renders(a) == 0 and resumable(a, "claimed") == 1


def test_shutdown_1001_then_the_second_replica_continues(make_gateway, redis_url):
    a = make_gateway(replica_settings(redis_url), engine=echo_engine())
    b = make_gateway(replica_settings(redis_url), engine=echo_engine())
    ws = connect(a.ws_url, max_size=None)
    r1 = ws_create(ws, PELICAN)
    r2 = ws_create(ws, "and the colour is TEAL", prev=r1["id"])
    stop_gateway(a)  # a rolling update: A drains, says goodbye, closes 1001, exits
    farewell = json.loads(ws.recv(timeout=30))
    assert farewell["type"] == "error" and farewell["status"] == 503
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=30)
    assert ws.close_code == 1001
    assert resumable(a, "kept", "redis") == 1  # written before the drain finished

    with connect(b.ws_url, max_size=None) as ws2:
        r3 = ws_create(ws2, RECALL, prev=r2["id"])
    assert output_text(r3).splitlines() == TRANSCRIPT
    assert resumable(b, "claimed", "redis") == 1


def test_resume_redis_needs_a_shared_secret_and_redis():
    with pytest.raises(ValueError, match="seal_secret"):
        Settings(ws_resume_window_s=10, ws_resume_redis=True, redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="redis_url"):
        Settings(ws_resume_window_s=10, ws_resume_redis=True, seal_secret="s")


# -- Codex: a replay of its frames across a dropped socket -------------------------------------------


def test_codex_frames_continue_across_a_dropped_socket(make_gateway):
    """Codex CLI 0.171.0's recorded frames (warm-up, turn, tool output chained to the turn), with
    the socket dropped before the tool output: the new socket's first frame names the response the
    old socket produced, and it appends (no full render) exactly as on one socket."""
    script = turns_in_order(
        [Turn(reasoning="I will run it.", tool_calls=(ToolCall("exec_command", {"cmd": "echo hi"}),))],
        then=tool_result_reporter,
    )
    live = make_gateway(
        Settings(models=["gpt-5.5"], ws_resume_window_s=60), engine=SimulatedEngine(script=script, record_prompts=True)
    )
    handshake, frames = load("ws-gpt-5.5")
    headers = {k: v for k, v in handshake["headers"].items() if k not in HOP_HEADERS}
    headers["Authorization"] = "Bearer test-key"
    url = live.url.replace("http://", "ws://") + handshake["path"]

    def open_socket() -> Any:
        return connect(
            url, additional_headers=headers, user_agent_header=handshake["headers"]["user-agent"], max_size=None
        )

    with open_socket() as ws:
        warm = copy.deepcopy(frames[0])
        ws_send(ws, warm)
        w = ws_turn(ws)[-1]["response"]
        turn = copy.deepcopy(frames[1])
        turn["previous_response_id"] = w["id"]
        ws_send(ws, turn)
        t1 = ws_turn(ws)[-1]["response"]
        assert t1["status"] == "completed"
        call = next(o for o in t1["output"] if o["type"] == "function_call")
    wait_for(lambda: len(live.gw.resumable) == 1, what="Codex's lane to be parked")
    p1 = live.engine.stats.prompts[-1]
    full0 = render_tokens(live, "full")

    tool = copy.deepcopy(frames[2])
    tool["previous_response_id"] = t1["id"]
    for item in tool["input"]:
        if item.get("type") == "function_call_output":
            item["call_id"] = call["call_id"]
    with open_socket() as ws:
        ws_send(ws, tool)
        evs = ws_turn(ws)
    final = evs[-1]["response"]
    assert evs[-1]["type"] == "response.completed", evs[-1]
    assert final["previous_response_id"] == t1["id"]
    assert final["output"][-1]["content"][0]["text"] == "[functions.exec_command] hi"
    assert full_renders(live) == 0 and render_tokens(live, "full") == full0
    p2 = live.engine.stats.prompts[-1]
    assert p2[: len(p1)] == p1


# -- the registry's bounds -------------------------------------------------------------------------


def _state(rid: str, nbytes: int, *, store: bool = False) -> ResponseState:
    return ResponseState(
        id=rid,
        response={"id": rid, "status": "completed"},
        input_items=(),
        context=ItemLog(),
        history_ids=TokenSeq(),
        model=MODEL,
        prelude_key=b"k",
        store=store,
        nbytes=nbytes,
    )


def test_registry_caps_bytes_per_tenant_and_in_all():
    async def run() -> None:
        metrics = Metrics()
        reg = ResumableStates(window_s=60, max_bytes=1000, tenant_bytes=400, metrics=metrics)
        assert await reg.park("t1", [_state("a", 300), _state("b", 300)]) == 2
        # t1's share holds 400: "a" went to make room for "b"
        assert reg.tenant_nbytes("t1") == 300 and await reg.claim("a", "t1") is None
        await reg.park("t2", [_state("c", 400)])
        await reg.park("t3", [_state("d", 400)])
        # 300 + 400 + 400 > 1000: the oldest overall ("b") made room
        assert reg.nbytes == 800 and await reg.claim("b", "t1") is None
        assert await reg.park("t4", [_state("huge", 401)]) == 0  # beyond a tenant's share: not kept
        assert await reg.park("t4", [_state("stored", 10, store=True)]) == 0
        assert (await reg.claim("c", "t2")).id == "c" and reg.nbytes == 400
        assert (
            metrics.registry.get_sample_value(
                "respgate_ws_resumable_states_total", {"outcome": "evicted", "where": "memory"}
            )
            == 3
        )
        assert metrics.registry.get_sample_value("respgate_ws_resumable_bytes") == 400
        await reg.close()
        assert reg.nbytes == 0 and len(reg) == 0

    asyncio.run(run())


class _Reference:
    """The registry's bounds, written plainly (as the per-tenant OrderedDicts before the move were):
    the tenant's cap drops its own oldest, then the total drops the oldest of all, then the state is
    added; a state above either bound is not kept; expired ones go first."""

    def __init__(self, window_s: float, max_bytes: int, tenant_bytes: int) -> None:
        self.window_s, self.max_bytes, self.tenant_bytes = window_s, max_bytes, tenant_bytes
        self.held: list[tuple[str, str | None, int, float]] = []  # (id, tenant, bytes, expires), oldest first

    def _sweep(self, now: float) -> None:
        self.held = [h for h in self.held if h[3] > now]

    def park(self, tenant: str | None, sizes: list[tuple[str, int]], now: float) -> int:
        kept = 0
        for rid, nbytes in sizes:
            if any(h[0] == rid for h in self.held):
                continue
            self._sweep(now)
            if nbytes > self.tenant_bytes or nbytes > self.max_bytes:
                continue
            while sum(h[2] for h in self.held if h[1] == tenant) + nbytes > self.tenant_bytes:
                self.held.remove(next(h for h in self.held if h[1] == tenant))
            while self.held and sum(h[2] for h in self.held) + nbytes > self.max_bytes:
                self.held.pop(0)
            self.held.append((rid, tenant, nbytes, now + self.window_s))
            kept += 1
        return kept

    def claim(self, rid: str, tenant: str | None, now: float) -> bool:
        self._sweep(now)
        for h in self.held:
            if h[0] == rid and h[1] == tenant:
                self.held.remove(h)
                return True
        return False


@pytest.mark.parametrize("seed", range(12))
def test_registry_agrees_with_a_plain_reference_on_random_sequences(seed):
    """Differential: the registry (the house's BoundedLRU with tenant parts) keeps and drops exactly
    what the plain rules do, for tenant caps below, at and above the total."""
    import random

    rnd = random.Random(seed)
    max_bytes = rnd.choice([3000, 10_000])
    tenant_bytes = [1000, 2999, 4000, 20_000][seed % 4]
    now = [0.0]

    async def run() -> None:
        reg = ResumableStates(
            window_s=50, max_bytes=max_bytes, tenant_bytes=tenant_bytes, metrics=Metrics(), clock=lambda: now[0]
        )
        ref = _Reference(50, max_bytes, tenant_bytes)
        ids = 0
        for _ in range(200):
            now[0] += rnd.random() * 2
            tenant = rnd.choice(["a", "b", "c", None])
            if rnd.random() < 0.6:
                sizes = []
                for _ in range(rnd.randrange(1, 4)):
                    ids += 1
                    sizes.append((f"r{ids}", rnd.randrange(1, 1500)))
                kept = await reg.park(tenant, [_state(rid, n) for rid, n in sizes])
                assert kept == ref.park(tenant, sizes, now[0])
            else:
                rid = f"r{rnd.randrange(1, ids + 1)}" if ids else "r0"
                assert (await reg.claim(rid, tenant) is not None) == ref.claim(rid, tenant, now[0])
            assert sorted(rid for rid in (h[0] for h in ref.held) if rid in reg) == sorted(h[0] for h in ref.held)
            assert len(reg) == len(ref.held) and reg.nbytes == sum(h[2] for h in ref.held)
        await reg.close()

    asyncio.run(run())


def test_registry_with_a_tenant_cap_above_the_total_drops_the_oldest_of_all():
    """``ws_resume_tenant_bytes`` >= ``ws_resume_max_bytes``: room beyond the total is made oldest
    first, another tenant's oldest state included, even when the writing tenant holds most of the map."""

    async def run() -> None:
        reg = ResumableStates(window_s=60, max_bytes=1000, tenant_bytes=2000, metrics=Metrics())
        await reg.park("t2", [_state("old", 50)])
        await reg.park("t1", [_state("a", 500), _state("b", 450)])
        assert await reg.park("t1", [_state("c", 60)]) == 1
        # 50 + 500 + 450 + 60 > 1000: "old" goes first, then "a"
        assert [rid for rid in ("old", "a", "b", "c") if rid in reg] == ["b", "c"] and reg.nbytes == 510
        await reg.close()

    asyncio.run(run())


def test_registry_beyond_the_total_drops_the_oldest_of_all_even_a_tenant_at_its_cap():
    """The registry is the house's BoundedLRU with tenant parts; a tenant held at exactly its cap is
    within its share, so the total's eviction stays oldest-first (as the hand-rolled map did)."""

    async def run() -> None:
        metrics = Metrics()
        reg = ResumableStates(window_s=60, max_bytes=1000, tenant_bytes=333, metrics=metrics)
        for tenant in ("t1", "t2", "t3"):
            await reg.park(tenant, [_state(f"s{tenant}", 333)])
        assert await reg.park("t4", [_state("late", 10)]) == 1
        assert "st1" not in reg and all(rid in reg for rid in ("st2", "st3", "late"))
        assert reg.nbytes == 676 and reg.tenant_nbytes("t2") == 333 and reg.tenant_nbytes("t1") == 0
        assert await reg.claim("st2", "t3") is None and "st2" in reg  # another tenant's: nothing taken
        assert (await reg.claim("st2", "t2")).id == "st2" and "st2" not in reg
        await reg.close()

    asyncio.run(run())
