"""Ledger exactness under faults (issue 14): the ledger bills exactly what the client was told.

* A fault while a turn runs (an engine exception, including one that derives from BaseException
  like pyo3's ``PanicException``) ends the turn as a Response with status ``failed``: never a 5xx,
  never billed ``completed``, and never a traceback on the wire.
* A turn still running at ``shutdown_grace_s`` is cut by the gateway itself, answered (HTTP JSON:
  503 ``server_shutting_down``; SSE: an ``error`` event, then ``response.failed``; WebSocket: error
  + 1001) and billed exactly once as ``cancelled`` with the tokens it generated.
* A ``store=true`` response is reported ``completed`` only once it is stored: a failed write ends
  it as ``response.failed`` ("could not be stored", billed ``failed``), so every completed one
  can be retrieved and chained — over HTTP (JSON and SSE) and WebSocket alike.

Real parts throughout: uvicorn on loopback, the simulated engine, a real Redis-protocol server that
refuses writes (``maxmemory`` reached) or is stopped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from billing.usage import MemorySink, UsageRecord
from cache.redis_response_store import RedisStore
from gateway.base.settings import Settings
from inference.harmony_render import HarmonyRenderer
from inference.parse import ItemDelta, ParseEvent
from inference.registry import ModelRegistry, ModelRoute
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL, LiveGateway, stop_gateway
from tests.http_helpers import TERMINAL_EVENTS, assert_error, parse_sse, wait_for
from tests.schema_check import sdk_check_event, sdk_check_response
from tests.ws_helpers import create, fixed, recv, send, until_terminal, ws_open

TRANSPORTS = ("json", "sse", "ws")
SHUTTING_DOWN = {
    "message": "The server is shutting down. Reconnect to continue.",
    "type": "server_error",
    "param": None,
    "code": "server_shutting_down",
}
#: a final answer the harmony encoder cannot render: one run of a million "x" overflows the stack of
#: the tokenizer's regex engine, and openai_harmony panics (``pyo3_runtime.PanicException``, which
#: derives from BaseException, not Exception) inside the engine's generate
PANIC_TEXT = "x" * 1_000_000


class CountingSink(MemorySink):
    """A memory ledger that also keeps every record it was handed, duplicates included."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[UsageRecord] = []

    async def write_batch(self, records: Sequence[UsageRecord]) -> None:
        self.writes.extend(records)
        await super().write_batch(records)


def billed(live: LiveGateway, sink: CountingSink, n: int) -> list[UsageRecord]:
    """The ledger once ``n`` records reached it (the queue's worker writes them off the turn's path)."""
    wait_for(lambda: len(sink.writes) >= n and live.gw.usage.pending == 0, what=f"{n} usage record(s)")
    return list(sink.writes)


def turn_over(live: LiveGateway, transport: str, **fields: Any) -> dict[str, Any]:
    """One create over ``transport``; returns the final Response as the client saw it."""
    fields.setdefault("model", MODEL)
    if transport == "json":
        r = httpx.post(live.base_url + "/responses", json=fields, timeout=60)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        assert r.headers["content-type"].startswith("application/json"), r.headers
        return r.json()
    if transport == "sse":
        with httpx.stream("POST", live.base_url + "/responses", json={**fields, "stream": True}, timeout=60) as r:
            raw = r.read()
        assert r.status_code == 200, raw[:300]
        events = parse_sse(raw)
        terminals = [e for e in events if e["type"] in TERMINAL_EVENTS]
        assert len(terminals) == 1 and events[-1] is terminals[0], [e["type"] for e in events][-5:]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))  # a withdrawn terminal left no gap
        return terminals[0]["response"]
    with ws_open(live) as ws:
        send(ws, create(**fields))
        frames = until_terminal(ws, timeout=60)
    assert frames[-1]["type"] in TERMINAL_EVENTS, frames[-1]
    return frames[-1]["response"]


# -- a fault while the turn runs: a failed Response, billed failed --------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_engine_panic_is_a_failed_response_never_a_5xx_and_never_billed_completed(make_gateway, transport):
    sink = CountingSink()
    live = make_gateway(engine=SimulatedEngine(script=fixed(Turn(text=PANIC_TEXT))), usage_sink=sink)
    if transport == "json":
        r = httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "hi"}, timeout=60)
        assert r.status_code == 200, (r.status_code, r.headers.get("content-type"), r.text[:200])
        assert "panicked" not in r.text and "Traceback" not in r.text
        response = r.json()
    elif transport == "sse":
        try:
            with httpx.stream(
                "POST", live.base_url + "/responses", timeout=60, json={"model": MODEL, "input": "hi", "stream": True}
            ) as r:
                raw = r.read()
        except httpx.RemoteProtocolError as exc:  # the stream was cut: no terminal event
            pytest.fail(f"SSE stream cut without a terminal event: {exc}")
        assert b"panicked" not in raw and b"Traceback" not in raw
        events = parse_sse(raw)
        assert events[-1]["type"] == "response.failed", [e["type"] for e in events]
        assert [e["type"] for e in events].count("response.failed") == 1
        response = events[-1]["response"]
    else:
        with ws_open(live) as ws:
            send(ws, create(input="hi"))
            try:
                frames = until_terminal(ws, timeout=20)
            except TimeoutError:
                pytest.fail("no terminal event and no error frame on the socket")
        assert frames[-1]["type"] == "response.failed", [f["type"] for f in frames]
        assert "panicked" not in json.dumps(frames)
        response = frames[-1]["response"]
    assert response["status"] == "failed" and not sdk_check_response(response)
    assert response["error"]["code"] == "server_error" and "panicked" not in response["error"]["message"]
    [record] = billed(live, sink, 1)
    assert record.response_id == response["id"] and record.status == "failed"
    assert record.input_tokens == response["usage"]["input_tokens"] > 0


class NativePanic(BaseException):
    """What pyo3 raises for a Rust panic: ``pyo3_runtime.PanicException`` derives from
    BaseException, so ``except Exception`` does not see it (openai_harmony's tokenizer raised one
    for a 1 MB run of one character in the instructions before the prelude was rendered in chunks)."""


class PanickingRenderer(HarmonyRenderer):
    """A renderer whose native tokenizer panics on the prompt."""

    def render_prelude(self, prelude: Any) -> Any:
        raise NativePanic("called `Result::unwrap()` on an `Err` value: RuntimeError(StackOverflow)")


def test_a_fault_before_the_response_exists_is_an_openai_shaped_500_and_bills_nothing(make_gateway):
    sink = CountingSink()
    engine = SimulatedEngine()
    registry = ModelRegistry(
        [ModelRoute(name=MODEL, engine=engine, renderer=PanickingRenderer(), max_context=Settings().max_context)]
    )
    live = make_gateway(engine=engine, registry=registry, usage_sink=sink)
    for path in ("/responses", "/responses/input_tokens"):
        r = httpx.post(live.base_url + path, json={"model": MODEL, "input": "hi"}, timeout=60)
        assert_error(r, 500, code="server_error", type_="server_error")
        assert "StackOverflow" not in r.text and "Traceback" not in r.text
    assert engine.stats.requests == 0
    assert live.gw.usage.pending == 0 and sink.writes == []  # nothing was generated, nothing is billed


class SurrogateParser:
    """A parser with a decoding bug: message text comes out with a lone surrogate, which no JSON
    encoder writes (orjson: "str is not valid UTF-8: surrogates not allowed")."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def reasoning_tokens(self) -> int:
        return self.inner.reasoning_tokens

    def feed(self, token_ids: Sequence[int]) -> list[ParseEvent]:
        return [ItemDelta(e.text + "\ud800") if isinstance(e, ItemDelta) else e for e in self.inner.feed(token_ids)]

    def finish(self) -> list[ParseEvent]:
        return self.inner.finish()


class SurrogateRenderer(HarmonyRenderer):
    def parser(self, prelude: Any) -> Any:
        return SurrogateParser(super().parser(prelude))


@pytest.mark.parametrize("transport", ("json", "sse"))
def test_a_response_the_gateway_cannot_encode_is_a_5xx_or_an_error_event_and_never_billed_completed(
    make_gateway, transport
):
    sink = CountingSink()
    engine = SimulatedEngine(script=fixed(Turn(text="an answer")))
    registry = ModelRegistry(
        [ModelRoute(name=MODEL, engine=engine, renderer=SurrogateRenderer(), max_context=Settings().max_context)]
    )
    live = make_gateway(engine=engine, registry=registry, usage_sink=sink)
    if transport == "json":
        r = httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "hi"}, timeout=60)
        assert_error(r, 500, code="server_error", type_="server_error")
        assert "Traceback" not in r.text
    else:
        try:
            with httpx.stream(
                "POST", live.base_url + "/responses", timeout=60, json={"model": MODEL, "input": "hi", "stream": True}
            ) as r:
                raw = r.read()
        except httpx.RemoteProtocolError as exc:
            pytest.fail(f"SSE stream cut without an error event: {exc}")
        events = parse_sse(raw)
        assert events[-1]["type"] == "error" and events[-1]["code"] == "server_error", events[-1]
        assert not {e["type"] for e in events} & set(TERMINAL_EVENTS)
    [record] = billed(live, sink, 1)
    assert record.status == ("failed" if transport == "json" else "cancelled")


# -- the shutdown deadline: the gateway cuts HTTP turns itself, before uvicorn would -----------------


def test_turns_cut_by_the_shutdown_deadline_are_answered_and_billed_once_as_cancelled(make_gateway):
    """One HTTP JSON, one SSE and one WebSocket turn outlive a short grace period together."""
    sink = CountingSink()
    engine = SimulatedEngine(script=fixed(Turn(text="slow " * 5000, delay_per_token_s=0.01)))
    live = make_gateway(Settings(shutdown_grace_s=0.5), engine=engine, usage_sink=sink)
    box: dict[str, Any] = {}
    sse_started = threading.Event()

    def json_client() -> None:
        box["json"] = httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "a"}, timeout=30)

    def sse_client() -> None:
        chunks: list[bytes] = []
        try:
            with httpx.stream(
                "POST", live.base_url + "/responses", timeout=30, json={"model": MODEL, "input": "b", "stream": True}
            ) as r:
                box["sse_status"] = r.status_code
                for chunk in r.iter_raw():
                    chunks.append(chunk)
                    sse_started.set()
        except httpx.HTTPError as exc:
            box["sse_error"] = repr(exc)
        box["sse"] = b"".join(chunks)

    ws = ws_open(live)
    send(ws, create(input="c"))
    created = recv(ws)
    assert created["type"] == "response.created"
    clients = [threading.Thread(target=json_client), threading.Thread(target=sse_client)]
    for t in clients:
        t.start()
    wait_for(lambda: engine.stats.running == 3 and sse_started.is_set(), what="three turns running")
    stopper = threading.Thread(target=stop_gateway, args=(live,))
    stopper.start()
    ws_frames: list[dict[str, Any]] = []
    try:
        while True:
            ws_frames.append(recv(ws, timeout=30))
    except ConnectionClosed as closed:
        ws_code = closed.rcvd.code if closed.rcvd is not None else None
    for t in (*clients, stopper):
        t.join(30)
        assert not t.is_alive()

    r = box["json"]
    assert r.status_code == 503 and r.headers["content-type"].startswith("application/json"), (r.status_code, r.text)
    assert r.json() == {"error": SHUTTING_DOWN}

    assert "sse_error" not in box, box["sse_error"]  # the stream ends with a complete frame, not a cut
    events = parse_sse(box["sse"])
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"], [e["type"] for e in events][-3:]
    error, failed = events[-2], events[-1]
    assert {k: error[k] for k in ("code", "message", "param")} == {
        k: SHUTTING_DOWN[k] for k in ("code", "message", "param")
    }
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert not sdk_check_event(error) and not sdk_check_event(failed)  # the SDK's ResponseErrorEvent / FailedEvent
    sse_response = failed["response"]
    assert sse_response["id"] == events[0]["response"]["id"] and sse_response["status"] == "cancelled"

    assert ws_frames[-1]["type"] == "error" and ws_frames[-1]["error"]["code"] == "server_shutting_down"
    assert ws_code == 1001

    records = list(sink.writes)  # stop_gateway returned: the lifespan drained the queue
    assert len(records) == 3 and len({x.response_id for x in records}) == 3, records
    assert all(x.status == "cancelled" and x.output_tokens > 0 for x in records), records
    by_id = {x.response_id: x for x in records}
    assert by_id[sse_response["id"]].output_tokens == sse_response["usage"]["output_tokens"]
    assert created["response"]["id"] in by_id
    assert engine.stats.aborts == 3 and engine.stats.running == 0
    assert live.metric("respgate_shutdown_cut_turns_total") == 3


def test_a_create_sent_while_draining_is_refused_with_503_and_never_reaches_the_engine(make_gateway):
    engine = SimulatedEngine(script=fixed(Turn(text="slow " * 300, delay_per_token_s=0.01)))
    sink = CountingSink()
    live = make_gateway(Settings(shutdown_grace_s=20), engine=engine, usage_sink=sink)
    with httpx.Client(base_url=live.base_url, timeout=30) as client:  # one keep-alive connection
        assert client.get("/models").status_code == 200
        box: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: box.update(
                first=httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "a"}, timeout=30)
            )
        )
        worker.start()
        wait_for(lambda: engine.stats.running == 1, what="the first turn running")
        stopper = threading.Thread(target=stop_gateway, args=(live,))
        stopper.start()
        wait_for(lambda: not live.gw.accepting, what="shutdown begun")
        late = client.post("/responses", json={"model": MODEL, "input": "late"})
    worker.join(30)
    stopper.join(30)
    assert late.status_code == 503 and late.json() == {"error": SHUTTING_DOWN}
    assert box["first"].status_code == 200 and box["first"].json()["status"] == "completed"
    assert engine.stats.requests == 1
    assert [x.status for x in sink.writes] == ["completed"]


@pytest.mark.parametrize("transport", ("json", "ws"))
def test_a_turn_cut_while_its_store_write_hangs_is_billed_once_as_cancelled_never_completed(
    make_gateway, redis_url, transport
):
    """Generation is done, the store write blocks (Redis pauses writes), the shutdown deadline
    passes: the terminal that waited for the write is withdrawn, never sent, and billed cancelled."""
    import redis

    sink = CountingSink()
    engine = SimulatedEngine(script=fixed(Turn(text="a short answer")))
    live = make_gateway(
        Settings(shutdown_grace_s=0.5), engine=engine, store=RedisStore.from_url(redis_url), usage_sink=sink
    )
    admin = redis.Redis.from_url(redis_url)
    box: dict[str, Any] = {}

    def json_client() -> None:
        box["r"] = httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "hi"}, timeout=30)

    def ws_client() -> None:
        frames: list[dict[str, Any]] = []
        with ws_open(live) as ws:
            send(ws, create(input="hi"))
            try:
                while True:
                    frames.append(recv(ws, timeout=30))
            except ConnectionClosed as closed:
                box["code"] = closed.rcvd.code if closed.rcvd is not None else None
        box["frames"] = frames

    admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        client = threading.Thread(target=json_client if transport == "json" else ws_client)
        client.start()
        wait_for(lambda: engine.stats.requests == 1 and engine.stats.running == 0, what="generation done")
        stopper = threading.Thread(target=stop_gateway, args=(live,))
        stopper.start()
        client.join(30)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    stopper.join(30)
    assert not client.is_alive() and not stopper.is_alive()
    if transport == "json":
        assert box["r"].status_code == 503 and box["r"].json() == {"error": SHUTTING_DOWN}, box["r"].text
    else:
        types = [f["type"] for f in box["frames"]]
        assert not set(types) & set(TERMINAL_EVENTS), types
        assert types[-1] == "error" and box["frames"][-1]["error"]["code"] == "server_shutting_down"
        assert box["code"] == 1001
    [record] = sink.writes
    assert record.status == "cancelled" and record.output_tokens > 0
    assert live.metric("respgate_shutdown_cut_turns_total") == 1


# -- stored, or not: completed means retrievable and chainable -------------------------------------


@contextmanager
def redis_refuses_writes(url: str) -> Iterator[None]:
    """The server's memory limit is reached: every write command fails with OOM, reads still work."""
    import redis

    client = redis.Redis.from_url(url)
    old = client.config_get("maxmemory")["maxmemory"]
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        yield
    finally:
        client.config_set("maxmemory", old)
        client.close()


def stored_failure(response: dict[str, Any]) -> bool:
    """The documented answer to a failed store write: ``failed``, ``server_error`` (the code the
    SDKs' types allow), a message that says so."""
    error = response.get("error") or {}
    return (
        response["status"] == "failed"
        and error.get("code") == "server_error"
        and error.get("type") == "server_error"
        and "could not be stored" in error.get("message", "")
    )


def assert_chainable(reader: LiveGateway, response: dict[str, Any]) -> None:
    """A completed store=true response, as another replica sees it: retrievable and continued from."""
    got = httpx.get(reader.base_url + f"/responses/{response['id']}", timeout=30)
    assert got.status_code == 200 and got.json()["status"] == response["status"], got.text[:300]
    r = httpx.post(
        reader.base_url + "/responses",
        timeout=30,
        json={"model": MODEL, "input": "and then?", "previous_response_id": response["id"]},
    )
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text[:300]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failed_store_write_is_never_reported_completed_and_every_completed_response_chains(
    make_gateway, redis_url, transport
):
    sink = CountingSink()
    writer = make_gateway(store=RedisStore.from_url(redis_url), usage_sink=sink)
    reader = make_gateway(store=RedisStore.from_url(redis_url))
    told: list[dict[str, Any]] = [turn_over(writer, transport, input="before the fault")]
    with redis_refuses_writes(redis_url):
        during = turn_over(writer, transport, input="while Redis refuses writes", previous_response_id=told[0]["id"])
    told.append(during)
    told.append(turn_over(writer, transport, input="after the fault", previous_response_id=told[0]["id"]))

    assert during["status"] == "failed", during["status"]
    assert stored_failure(during) and not sdk_check_response(during)
    assert during["usage"]["output_tokens"] > 0
    completed = [x for x in told if x["status"] == "completed"]
    assert [x["id"] for x in completed] == [told[0]["id"], told[2]["id"]]
    for response in completed:
        assert_chainable(reader, response)
    records = {x.response_id: x for x in billed(writer, sink, 3)}
    assert len(sink.writes) == 3
    assert records[during["id"]].status == "failed"
    assert records[during["id"]].output_tokens == during["usage"]["output_tokens"]
    assert [records[x["id"]].status for x in completed] == ["completed", "completed"]


@pytest.mark.parametrize("transport", ("json", "ws"))
def test_a_store_outage_mid_turn_fails_the_turn_and_the_client_can_retry_it(
    make_gateway, redis_server, redis_url, transport
):
    """Redis goes away while the model generates: the write at the end fails, the client is told so
    (not ``completed`` and later ``previous_response_not_found``), and its retry once Redis is back
    completes and chains."""
    sink = CountingSink()
    engine = SimulatedEngine(script=fixed(Turn(text="a longer answer " * 100, delay_per_token_s=0.005)))
    live = make_gateway(store=RedisStore.from_url(redis_url), engine=engine, usage_sink=sink)
    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(r=turn_over(live, transport, input="hello")))
    try:
        worker.start()
        wait_for(lambda: engine.stats.running == 1, what="the turn running")
        redis_server.stop()
        worker.join(60)
        assert stored_failure(box["r"]), box["r"]["status"]
    finally:
        if redis_server.proc is None:
            redis_server.start()
    retry = turn_over(live, transport, input="hello")
    assert retry["status"] == "completed"
    assert_chainable(live, retry)
    records = {x.response_id: x.status for x in billed(live, sink, 3)}
    assert records[box["r"]["id"]] == "failed" and records[retry["id"]] == "completed"
