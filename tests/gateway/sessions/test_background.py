"""Background responses (gateway/sessions/background.py), driven with the openai SDK.

Every state transition (queued -> in_progress -> completed / failed / cancelled / incomplete), with
one usage record per response in the right status; cancel during generation, idempotent, and of a
finished response (unchanged); a dropped background stream resumed at several ``starting_after``
values equals the original events; the per-tenant limit and the gauges; two in-process replicas
sharing a real Redis (poll, cancel and resume from the one that does not run the turn); and a
replica SIGKILLed mid-turn, whose response another replica marks failed and bills once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from billing.usage import MemorySink, UsageRecord
from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL, free_port
from tests.http_helpers import assert_error, parse_sse, wait_for

REPO = Path(__file__).resolve().parents[3]
LONG = " ".join(f"word{i}" for i in range(120))


class CountingSink(MemorySink):
    """A memory sink that also keeps every record it was handed, duplicates included."""

    def __init__(self) -> None:
        super().__init__()
        self.all: list[UsageRecord] = []

    async def write_batch(self, records: Sequence[UsageRecord]) -> None:
        self.all.extend(records)
        await super().write_batch(records)

    def of(self, response_id: str) -> list[UsageRecord]:
        return [r for r in self.all if r.response_id == response_id]


def engine(delay: float = 0.0, **turn: Any) -> SimulatedEngine:
    """Every turn: the same scripted answer, ``delay`` seconds per token."""
    script = Turn(**{"text": LONG, "delay_per_token_s": delay, **turn})
    return SimulatedEngine(script=lambda view: script)


def poll_until_done(client: openai.OpenAI, response_id: str) -> tuple[Any, list[str]]:
    """Poll like the background guide: while queued or in_progress. Returns the last and every status seen."""
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while True:
        got = client.responses.retrieve(response_id)
        seen.append(got.status)
        if got.status not in ("queued", "in_progress"):
            return got, seen
        assert time.monotonic() < deadline, seen[-5:]
        time.sleep(0.02)


def one_record(sink: CountingSink, response_id: str, status: str) -> UsageRecord:
    records = wait_for(lambda: sink.of(response_id), 30, f"the usage record of {response_id}")
    time.sleep(0.1)  # a second record, if one were coming, is submitted in the same breath
    records = sink.of(response_id)
    assert [r.status for r in records] == [status], records
    return records[0]


def events_of(stream: Any) -> list[dict[str, Any]]:
    return [ev.model_dump(mode="json") for ev in stream]


def metric(live: Any, name: str, labels: dict[str, str] | None = None) -> float:
    return live.metric(name, labels)


# -- one replica ----------------------------------------------------------------------------------


def test_create_answers_queued_then_polls_to_completed_and_bills_once(make_gateway):
    sink = CountingSink()
    live = make_gateway(engine=engine(0.005), usage_sink=sink)
    client = live.openai()
    created = client.responses.create(model=MODEL, input="write it", background=True)
    assert created.status == "queued" and created.background is True
    assert created.output == [] and created.usage is None
    final, seen = poll_until_done(client, created.id)
    assert "in_progress" in seen and set(seen[:-1]) <= {"queued", "in_progress"}
    assert final.status == "completed" and final.background is True
    assert final.output_text == LONG
    record = one_record(sink, created.id, "completed")
    assert record.output_tokens == final.usage.output_tokens and record.transport == "http"
    assert client.responses.input_items.list(created.id).data[0].content[0].text == "write it"
    wait_for(lambda: metric(live, "respgate_background_turns", {"state": "running"}) == 0, what="gauge")


def test_background_needs_store_and_cancel_needs_background(make_gateway):
    live = make_gateway()
    client = live.openai()
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL, input="x", background=True, store=False)
    assert exc.value.param == "store"
    foreground = client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.cancel(foreground.id)
    assert exc.value.body["message"] == "Cannot cancel a synchronous response." and exc.value.param == "response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_missing")
    # a completion window is accepted; 2h/8h need background and no stream
    ok = client.responses.create(
        model=MODEL, input="x", background=True, background_options={"completion_window": "8h"}
    )
    assert poll_until_done(client, ok.id)[0].status == "completed"
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL, input="x", background_options={"completion_window": "2h"})
    assert exc.value.param == "background_options.completion_window"


def test_cancel_during_generation_aborts_the_engine_is_idempotent_and_bills_once(make_gateway):
    sink = CountingSink()
    live = make_gateway(engine=engine(0.05, endless=True), usage_sink=sink)
    client = live.openai()
    created = client.responses.create(model=MODEL, input="go on", background=True)
    wait_for(lambda: client.responses.retrieve(created.id).status == "in_progress", what="in_progress")
    wait_for(lambda: live.engine.stats.running == 1, what="the engine to run it")
    assert metric(live, "respgate_background_turns", {"state": "running"}) == 1
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.background is True
    assert live.engine.stats.aborts == 1 and live.engine.stats.running == 0
    again = client.responses.cancel(created.id)
    assert again.model_dump() == cancelled.model_dump()
    assert client.responses.retrieve(created.id).model_dump() == cancelled.model_dump()
    record = one_record(sink, created.id, "cancelled")
    assert record.output_tokens == cancelled.usage.output_tokens
    assert metric(live, "respgate_background_cancels_total", {"where": "local"}) == 1
    assert metric(live, "respgate_background_turns", {"state": "running"}) == 0
    # cancelled while still running is not deletable-then-resurrected; once ended it deletes
    client.responses.delete(created.id)


def test_cancel_of_a_finished_response_returns_it_unchanged(make_gateway):
    sink = CountingSink()
    live = make_gateway(engine=engine(), usage_sink=sink)
    client = live.openai()
    created = client.responses.create(model=MODEL, input="quick", background=True)
    final, _ = poll_until_done(client, created.id)
    assert final.status == "completed"
    assert client.responses.cancel(created.id).model_dump() == final.model_dump()
    assert client.responses.retrieve(created.id).model_dump() == final.model_dump()
    one_record(sink, created.id, "completed")


def test_failed_and_incomplete_end_like_foreground_turns(make_gateway):
    sink = CountingSink()
    failing = make_gateway(engine=engine(fail_after_tokens=5), usage_sink=sink)
    client = failing.openai()
    created = client.responses.create(model=MODEL, input="fail", background=True)
    final, _ = poll_until_done(client, created.id)
    assert final.status == "failed" and final.error.code == "server_error"
    one_record(sink, created.id, "failed")

    sink2 = CountingSink()
    capped = make_gateway(engine=engine(), usage_sink=sink2)
    client = capped.openai()
    created = client.responses.create(model=MODEL, input="long", background=True, max_output_tokens=16)
    final, _ = poll_until_done(client, created.id)
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert one_record(sink2, created.id, "incomplete").output_tokens == 16


def test_dropped_stream_resumes_at_any_event_and_the_turn_runs_on(make_gateway):
    sink = CountingSink()
    live = make_gateway(engine=engine(0.01), usage_sink=sink)
    client = live.openai()
    stream = client.responses.create(model=MODEL, input="stream it", background=True, stream=True)
    first: list[dict[str, Any]] = []
    for ev in stream:
        first.append(ev.model_dump(mode="json"))
        if len(first) == 6:
            break
    stream.close()  # the client goes away: the turn does not
    assert [e["type"] for e in first[:3]] == ["response.created", "response.queued", "response.in_progress"]
    assert first[0]["response"]["status"] == "queued" and first[2]["response"]["status"] == "in_progress"
    rid = first[0]["response"]["id"]
    # resumed while it still runs: the kept events, then the live ones, to the terminal
    live_tail = events_of(client.responses.retrieve(rid, stream=True, starting_after=5))
    assert live_tail[-1]["type"] == "response.completed"
    full = events_of(client.responses.retrieve(rid, stream=True))
    assert [e["sequence_number"] for e in full] == list(range(len(full)))
    assert full[:6] == first and full[6:] == live_tail
    for after in (0, len(full) // 2, len(full) - 2, len(full) - 1):
        assert events_of(client.responses.retrieve(rid, stream=True, starting_after=after)) == full[after + 1 :]
    assert full[-1]["response"]["output"][0]["content"][0]["text"] == LONG
    one_record(sink, rid, "completed")
    # the SDK's stream helper resumes too, and rebuilds the final response from the events
    with client.responses.stream(response_id=rid) as resumed:
        assert resumed.get_final_response().output_text == LONG


def test_background_objects_match_both_schemas(make_gateway):
    """The queued create, every streamed event (response.queued included), a resumed stream and a
    cancelled Response validate against the SDK's types and the OpenResponses document."""
    from tests.schema_check import OpenResponses, sdk_check_event, sdk_check_response

    doc = OpenResponses()
    live = make_gateway(engine=engine(0.02, endless=True))
    queued = post_json(live, {"model": MODEL, "input": "x", "background": True})
    with httpx.stream(
        "POST",
        f"{live.base_url}/responses",
        timeout=30,
        json={"model": MODEL, "input": "y", "background": True, "stream": True},
    ) as r:
        lines = r.iter_lines()
        head = [next(lines) for _ in range(9)]  # three events: created, queued, in_progress
    events = parse_sse(("\n".join(head) + "\n").encode())
    with httpx.stream(
        "GET",
        f"{live.base_url}/responses/{events[0]['response']['id']}",
        timeout=30,
        params={"stream": "true", "starting_after": 1},
    ) as r:
        lines = r.iter_lines()
        resumed = parse_sse(("\n".join(next(lines) for _ in range(3)) + "\n").encode())
    assert resumed[0]["type"] == "response.in_progress" and resumed[0]["sequence_number"] == 2
    cancelled = post_json(live, {}, path=f"/responses/{queued['id']}/cancel")
    post_json(live, {}, path=f"/responses/{events[0]['response']['id']}/cancel")
    assert (queued["status"], cancelled["status"]) == ("queued", "cancelled")
    assert [e["type"] for e in events] == ["response.created", "response.queued", "response.in_progress"]
    for resp in (queued, cancelled):
        assert not sdk_check_response(resp) and not doc.response_errors(resp)
    for ev in events + resumed:
        assert not sdk_check_event(ev) and not doc.event_errors(ev), ev["type"]


def post_json(live: Any, body: dict[str, Any], path: str = "/responses") -> dict[str, Any]:
    r = httpx.post(live.base_url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_stream_retrieval_refusals(make_gateway):
    live = make_gateway(engine=engine())
    client = live.openai()
    foreground = client.responses.create(model=MODEL, input="hi")
    assert_error(httpx.get(f"{live.base_url}/responses/{foreground.id}?stream=true"), 400, param="stream")
    quiet = client.responses.create(model=MODEL, input="hi", background=True)  # not streamed: no events kept
    poll_until_done(client, quiet.id)
    assert_error(httpx.get(f"{live.base_url}/responses/{quiet.id}?stream=true"), 400, param="stream")
    assert_error(
        httpx.get(f"{live.base_url}/responses/{quiet.id}?stream=true&starting_after=-1"), 400, param="starting_after"
    )
    assert_error(
        httpx.get(f"{live.base_url}/responses/{quiet.id}?stream=true&starting_after=x"), 400, param="starting_after"
    )
    assert_error(httpx.get(f"{live.base_url}/responses/resp_missing?stream=true"), 404)


def test_events_kept_in_a_byte_window(make_gateway):
    live = make_gateway(Settings(background_events_bytes=64 * 1024), engine=engine(text=" ".join(["tok"] * 600)))
    client = live.openai()
    with httpx.stream(
        "POST",
        f"{live.base_url}/responses",
        timeout=30,
        json={"model": MODEL, "input": "x", "background": True, "stream": True},
    ) as r:
        events = parse_sse(r.read())
    rid = events[0]["response"]["id"]
    assert sum(len(str(e)) for e in events) > 64 * 1024  # more than the window was sent
    assert_error(
        httpx.get(f"{live.base_url}/responses/{rid}?stream=true&starting_after=0"), 400, param="starting_after"
    )
    tail = events_of(client.responses.retrieve(rid, stream=True, starting_after=len(events) - 4))
    assert [e["sequence_number"] for e in tail] == [len(events) - 3, len(events) - 2, len(events) - 1]
    assert metric(live, "respgate_background_event_log_bytes") <= 64 * 1024


def test_per_tenant_limit_is_a_429_counted_and_other_tenants_go_on(make_gateway):
    live = make_gateway(
        Settings(api_keys=["acme:key-acme", "beta:key-beta"], background_max_per_tenant=2),
        engine=engine(0.05, endless=True),
    )
    acme, beta = live.openai(api_key="key-acme"), live.openai(api_key="key-beta")
    a1 = acme.responses.create(model=MODEL, input="1", background=True)
    a2 = acme.responses.create(model=MODEL, input="2", background=True)
    with pytest.raises(openai.RateLimitError):
        acme.responses.create(model=MODEL, input="3", background=True)
    assert metric(live, "respgate_rate_limit_rejections_total", {"transport": "http", "limit": "background"}) == 1
    acme.responses.create(model=MODEL, input="foreground is not limited", max_output_tokens=16)
    b1 = beta.responses.create(model=MODEL, input="b", background=True)
    wait_for(lambda: metric(live, "respgate_background_turns", {"state": "running"}) == 3, what="3 running")
    with pytest.raises(openai.NotFoundError):  # another tenant's id is a missing one
        beta.responses.cancel(a1.id)
    assert acme.responses.cancel(a1.id).status == "cancelled"
    a3 = acme.responses.create(model=MODEL, input="3 again", background=True)
    for client, rid in ((acme, a2.id), (acme, a3.id), (beta, b1.id)):
        assert client.responses.cancel(rid).status == "cancelled"
    assert metric(live, "respgate_background_turns", {"state": "running"}) == 0


def test_over_websocket_background_stays_refused(make_gateway):
    live = make_gateway()
    with live.openai().responses.connect() as conn:
        conn.response.create(model=MODEL, input="hi", background=True)
        for ev in conn:
            assert ev.type == "error" and ev.status == 400 and ev.error.param == "background"
            break


# -- two replicas sharing Redis ----------------------------------------------------------------------


def test_second_replica_polls_cancels_and_resumes(make_gateway, redis_url):
    settings = Settings(redis_url=redis_url, background_lease_s=3)
    sink_a, sink_b = CountingSink(), CountingSink()
    a = make_gateway(settings, engine=engine(0.01), usage_sink=sink_a)
    b = make_gateway(settings, engine=engine(0.01), usage_sink=sink_b)
    on_a, on_b = a.openai(), b.openai()

    stream = on_a.responses.create(model=MODEL, input="stream it", background=True, stream=True)
    first = []
    for ev in stream:
        first.append(ev.model_dump(mode="json"))
        if len(first) == 4:
            break
    stream.close()
    rid = first[0]["response"]["id"]
    assert on_b.responses.retrieve(rid).status in ("in_progress", "completed")
    tail = events_of(on_b.responses.retrieve(rid, stream=True, starting_after=3))  # live, from Redis
    assert tail[-1]["type"] == "response.completed"
    final, _ = poll_until_done(on_b, rid)
    assert final.status == "completed"
    full = events_of(on_b.responses.retrieve(rid, stream=True))
    assert full[:4] == first and full[4:] == tail
    assert full == events_of(on_a.responses.retrieve(rid, stream=True))  # B reads Redis, A its own log
    for after in (0, len(full) // 2, len(full) - 1):
        assert events_of(on_b.responses.retrieve(rid, stream=True, starting_after=after)) == full[after + 1 :]
    one_record(sink_a, rid, "completed")
    assert not sink_b.of(rid)

    a.engine.script = lambda view: Turn(text=LONG, delay_per_token_s=0.05, endless=True)
    running = on_a.responses.create(model=MODEL, input="long", background=True, stream=True)
    rid2 = next(iter(running)).response.id
    # the engine request is under way (a token came out) before the cancel: ``in_progress`` goes out
    # before the turn has started it, and a cancel then stops the turn with no engine request to abort
    next(ev for ev in running if ev.type == "response.output_text.delta")
    wait_for(lambda: on_b.responses.retrieve(rid2).status == "in_progress", what="in_progress on B")
    with pytest.raises(openai.BadRequestError):
        on_b.responses.delete(rid2)  # still running: cancel first
    cancelled = on_b.responses.cancel(rid2)
    assert cancelled.status == "cancelled"
    assert a.engine.stats.aborts == 1
    assert metric(b, "respgate_background_cancels_total", {"where": "remote"}) == 1
    rest = [ev.model_dump(mode="json") for ev in running]  # A's own stream ends with the cancelled terminal
    assert rest[-1]["type"] == "response.failed" and rest[-1]["response"]["status"] == "cancelled"
    assert on_b.responses.cancel(rid2).model_dump() == cancelled.model_dump()
    one_record(sink_a, rid2, "cancelled")
    assert not sink_b.of(rid2)


def test_a_replica_killed_mid_turn_is_marked_failed_and_billed_once(make_gateway, redis_url, tmp_path):
    """A subprocess replica runs a background stream, slow to its first token, and is SIGKILLed.
    A replica started afterwards (a restart) finds the lapsed lease, marks the response failed,
    ends its event log, and bills it once — zero tokens, status failed."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")},
        "RESPGATE_REDIS_URL": redis_url,
        "RESPGATE_BACKGROUND_LEASE_S": "1.5",
        "RESPGATE_SIM_TTFT_S": "120",
        "RESPGATE_USAGE_JOURNAL": str(tmp_path / "journal.jsonl"),
        "RESPGATE_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--engine", "simulated", "--port", str(port)], env=env, cwd=REPO
    )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: _ready(base), 60, "the subprocess gateway")
        client = openai.OpenAI(base_url=base, api_key="k", max_retries=0)
        stream = client.responses.create(model="gpt-oss-sim", input="hi", background=True, stream=True)
        seen = []
        for ev in stream:
            seen.append(ev.model_dump(mode="json"))
            if ev.type == "response.in_progress":
                break
        rid = seen[0]["response"]["id"]
        assert client.responses.retrieve(rid).status == "in_progress"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    sink = CountingSink()
    b = make_gateway(Settings(redis_url=redis_url, background_lease_s=1.5, models=["gpt-oss-sim"]), usage_sink=sink)
    on_b = b.openai()
    final, _ = poll_until_done(on_b, rid)
    assert final.status == "failed" and final.error.code == "server_error"
    record = one_record(sink, rid, "failed")
    assert (record.input_tokens, record.output_tokens) == (0, 0)
    assert metric(b, "respgate_background_reaped_total") == 1
    resumed = events_of(on_b.responses.retrieve(rid, stream=True, starting_after=len(seen) - 1))
    assert [e["type"] for e in resumed] == ["error", "response.failed"]
    assert resumed[-1]["response"]["status"] == "failed"
    assert on_b.responses.cancel(rid).status == "failed"  # ended: returned unchanged


def _ready(base: str) -> bool:
    try:
        return httpx.get(base.removesuffix("/v1") + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# -- the pieces ----------------------------------------------------------------------------------------


async def test_memory_event_logs_are_bounded_per_log_in_all_and_in_time():
    from cache.event_log import LoggedEvent as E
    from cache.event_log import MemoryEventLogs, Truncated

    logs = MemoryEventLogs(max_bytes=1_000, max_total_bytes=25_000, ttl_s=0.05)
    a = logs.open("a")
    for i in range(10):
        a.append(E(i, "t", b"x" * 300, i == 9))
    assert (a.first_seq, a.next_seq, a.nbytes, a.terminal_seq) == (7, 10, 900, 9)
    with pytest.raises(Truncated) as exc:
        [f async for f in a.follow(0)]
    assert exc.value.first_kept == 7
    assert len([f async for f in a.follow(6)]) == 3 and [f async for f in a.follow(9)] == []
    a.finish()
    b, c = logs.open("b"), logs.open("c")
    running = [logs.open(f"r{i}") for i in range(24)]
    for r in running:
        r.append(E(0, "t", b"r" * 1_000, False))
    b.append(E(0, "t", b"y" * 900, False))
    c.append(E(0, "t", b"z" * 900, False))  # 26,700 bytes in all: the finished log goes, the running ones stay
    assert logs.get("a") is None and logs.evictions == 1 and logs.nbytes == 25_800
    reader = c.follow(-1)
    assert (await anext(reader)).data == b"z" * 900
    c.append(E(1, "t", b"z" * 600, False))
    c.append(E(2, "t", b"z" * 600, False))  # the window moved past the reader's next frame
    with pytest.raises(Truncated):
        await anext(reader)
    c.finish()
    time.sleep(0.06)
    assert logs.get("c") is None and logs.get("b") is b  # finished and past its ttl: gone


def test_shutdown_cuts_a_background_turn_billed_once_cancelled_and_its_stream_ends(make_gateway):
    from tests.conftest import stop_gateway

    sink = CountingSink()
    live = make_gateway(Settings(shutdown_grace_s=0.3), engine=engine(0.05, endless=True), usage_sink=sink)
    client = live.openai()
    stream = client.responses.create(model=MODEL, input="long", background=True, stream=True)
    first = next(iter(stream))
    import threading

    stopper = threading.Thread(target=stop_gateway, args=(live,))
    stopper.start()
    rest = [ev.model_dump(mode="json") for ev in stream]
    stopper.join(30)
    assert [e["type"] for e in rest[-2:]] == ["error", "response.failed"]
    assert rest[-2]["code"] == "server_shutting_down" and rest[-1]["response"]["status"] == "cancelled"
    one_record(sink, first.response.id, "cancelled")


async def test_redis_event_log_keeps_the_same_window_and_readers_see_gaps(redis_url):
    import redis.asyncio as aioredis

    from cache.event_log import LoggedEvent, RedisEventLog, Truncated

    client = aioredis.Redis.from_url(redis_url)
    try:
        # each record stores its type and JSON, and (for one release) the SSE frame beside them:
        # 2 * (26 + 30) + 17 = 129 bytes; a window of 400 keeps the last three
        shared = RedisEventLog(client, max_bytes=400, ttl_s=60)
        writer = shared.writer("resp_w")
        for i in range(10):
            writer.append(LoggedEvent(i, "response.output_text.delta", b"x" * 30, i == 9))
        await writer.close()
        assert await shared.bounds("resp_w") == (7, 9, True)
        assert 0 < await client.pttl(shared.key("resp_w")) <= 60_000
        never = lambda: _false()  # noqa: E731
        with pytest.raises(Truncated) as exc:
            [f async for f in shared.follow("resp_w", 0, never)]
        assert exc.value.first_kept == 7
        tail = [e async for e in shared.follow("resp_w", 6, never)]
        assert tail == [LoggedEvent(i, "response.output_text.delta", b"x" * 30, i == 9) for i in (7, 8, 9)]
        assert await shared.bounds("resp_missing") is None
    finally:
        await client.aclose()


async def _false() -> bool:
    return False


async def test_a_lapsed_lease_is_claimed_by_exactly_one_replica(redis_url):
    import asyncio

    import redis.asyncio as aioredis

    from cache.leases import RedisLeases

    clients = [aioredis.Redis.from_url(redis_url) for _ in range(3)]
    try:
        owner, *others = [RedisLeases(c, lease_s=0.2) for c in clients]
        await owner.acquire("resp_l", {"tenant": "t", "model": "m", "stream": False, "created_at": 1.0})
        assert await others[0].alive("resp_l") is True
        assert await owner.renew(["resp_l", "resp_gone"]) == ["resp_gone"]
        await asyncio.sleep(0.3)  # the owner stopped renewing
        assert await others[0].alive("resp_l") is False and await others[0].expired() == ["resp_l"]
        claims = await asyncio.gather(*(r.claim("resp_l") for r in (*others, *others)))
        assert sorted(claims) == [False, False, False, True]
        assert await others[1].alive("resp_l") is None
        assert (await others[1].info("resp_l"))["owner"] == owner.owner  # kept for the one that finishes it
        assert await owner.renew(["resp_l"]) == ["resp_l"]  # the owner learns it lost the lease
        await others[0].request_cancel("resp_l")
        assert await owner.next_cancel(0.5) == "resp_l" and await owner.next_cancel(0.1) is None
    finally:
        for c in clients:
            await c.aclose()


async def test_redis_event_log_reads_a_frame_an_older_replica_wrote(redis_url):
    """Mid rolling update a resume may read a stream an older replica wrote (SSE frames, field "f"):
    it gets the same events as from a new replica's entries (type and JSON, fields "y" and "d")."""
    import redis.asyncio as aioredis

    from cache.event_log import LoggedEvent, RedisEventLog

    client = aioredis.Redis.from_url(redis_url)
    try:
        shared = RedisEventLog(client, max_bytes=10_000, ttl_s=60)
        data = b'{"type":"response.completed","sequence_number":0}'
        await client.xadd(
            shared.key("resp_old"), {"f": b"event: response.completed\ndata: " + data + b"\n\n", "t": b"1"}, id="0-1"
        )
        await shared.append("resp_new", [LoggedEvent(0, "response.completed", data, True)])
        old = [e async for e in shared.follow("resp_old", -1, _false)]
        new = [e async for e in shared.follow("resp_new", -1, _false)]
        assert old == new == [LoggedEvent(0, "response.completed", data, True)]
    finally:
        await client.aclose()


async def test_a_new_replicas_records_read_as_an_older_replica_reads_them(redis_url):
    """Mid rolling update an older replica may serve the resume of a stream a new one writes: it reads
    ``fields[b"f"]`` (the SSE frame) of each record, so the owner's writer and the reaper's append write
    that frame too, byte for byte what the older writer wrote, for one release."""
    import orjson
    import redis.asyncio as aioredis

    from cache.event_log import RedisEventLog
    from gateway.sessions.background_turn import logged
    from gateway.transport.sse import sse_encoded

    events = [
        {"type": "response.output_text.delta", "sequence_number": 0, "delta": "h\u00e9\n"},
        {"type": "response.completed", "sequence_number": 1, "response": {"id": "resp_r"}},
    ]
    # what the older writer stored: ``sse_frame(event)``
    frames = [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events]
    client = aioredis.Redis.from_url(redis_url)
    try:
        shared = RedisEventLog(client, max_bytes=10_000, ttl_s=60)
        writer = shared.writer("resp_r")
        for e in events:
            writer.append(logged(e))
        await writer.close()
        await shared.append("resp_reaped", [logged(e) for e in events])
        for rid in ("resp_r", "resp_reaped"):
            got = await client.xread({shared.key(rid): "0-0"}, count=256)
            records = got[0][1]
            assert [fields[b"f"] for _, fields in records] == frames  # the older reader's ``yield fields[b"f"]``
            assert [bool(fields.get(b"t")) for _, fields in records] == [False, True]
            assert [sse_encoded(fields[b"y"].decode(), fields[b"d"]) for _, fields in records] == frames
    finally:
        await client.aclose()
