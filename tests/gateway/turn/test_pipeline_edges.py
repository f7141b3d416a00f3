"""Edges found in review: shared buffers untouched by rejected or counted requests, store write
failures, expiry while turns wait for a slot, engine aborts that await, truncation."""

from __future__ import annotations

import asyncio
import json

import httpx
import orjson
from websockets.sync.client import connect

from cache.response_store import MemoryStore
from cache.seq import AppendOnlyView
from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL
from tests.http_helpers import create, post, wait_for


def _answer(view):
    return Turn(text="ok")


def test_counting_input_tokens_does_not_make_the_next_continuation_copy_history(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=_answer))
    first = create(live, input="hello " * 200)
    copies = AppendOnlyView.copies
    r = post(
        live, {"model": MODEL, "previous_response_id": first["id"], "input": "more"}, path="/responses/input_tokens"
    )
    assert r.status_code == 200, r.text
    second = create(live, previous_response_id=first["id"], input="more")
    assert second["status"] == "completed"
    assert AppendOnlyView.copies == copies, "the parent's buffer was left past its tip"
    assert r.json()["input_tokens"] == second["usage"]["input_tokens"]


def test_rejected_continuation_does_not_make_the_next_one_copy_history(make_gateway):
    live = make_gateway(Settings(max_context=400), engine=SimulatedEngine(script=_answer))
    first = create(live, input="short question")
    copies = AppendOnlyView.copies
    r = post(live, {"model": MODEL, "previous_response_id": first["id"], "input": "word " * 600})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    second = create(live, previous_response_id=first["id"], input="fine")
    assert second["status"] == "completed"
    assert AppendOnlyView.copies == copies


def test_truncation_auto_drops_oldest_items_until_the_prompt_fits(make_gateway):
    live = make_gateway(Settings(max_context=300), engine=SimulatedEngine(script=_answer, record_prompts=True))
    long_history = [{"role": "user", "content": f"old message {i} " + "filler " * 30} for i in range(8)]
    long_history.append({"role": "user", "content": "the newest question"})
    r = post(live, {"model": MODEL, "input": long_history})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    body = create(live, input=long_history, truncation="auto")
    assert body["status"] == "completed" and body["truncation"] == "auto"
    prompt = live.engine.stats.prompts[-1]
    assert len(prompt) <= 300 - 16
    from inference.harmony_core import harmony_encoding

    text = harmony_encoding().decode(prompt)
    assert "the newest question" in text and "old message 0 " not in text


class FailingStore(MemoryStore):
    async def put(self, state):
        raise ConnectionError("store is down")


def test_failed_store_write_gives_previous_response_not_found_not_a_500(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=_answer), store=FailingStore())
    first = create(live, input="hi")
    r = post(live, {"model": MODEL, "previous_response_id": first["id"], "input": "again"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
    assert httpx.get(f"{live.base_url}/responses/{first['id']}").status_code == 404


def test_turns_waiting_for_a_slot_do_not_start_after_the_age_limit(make_gateway):
    engine = SimulatedEngine(script=lambda v: Turn(text="slow " * 30, delay_per_token_s=0.02))
    live = make_gateway(Settings(ws_max_age_s=0.6, ws_max_inflight=1), engine=engine)
    with connect(live.ws_url, max_size=None) as ws:
        for lane in ("a", "b", "c"):
            ws.send(
                orjson.dumps({"type": "response.create", "model": MODEL, "input": "go", "stream_id": lane}).decode()
            )
        frames = []
        while True:
            try:
                frames.append(json.loads(ws.recv(timeout=20)))
            except Exception:
                break
    created = [f for f in frames if f["type"] == "response.created"]
    assert len(created) == 1, [f["type"] for f in frames]
    assert frames[-1]["type"] == "error"
    assert frames[-1]["error"]["code"] == "websocket_connection_limit_reached"
    assert engine.stats.requests == 1


class SlowAbortEngine(SimulatedEngine):
    """An engine whose abort path awaits, as vLLM's does (``await self.abort(...)``)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.abort_completed = 0

    async def generate(self, request_id, prompt_ids, params, routing=None):
        gen = super().generate(request_id, prompt_ids, params, routing)
        try:
            async for delta in gen:
                yield delta
        finally:
            await gen.aclose()
            await asyncio.sleep(0.05)  # the abort round-trip to the engine core
            self.abort_completed += 1


def test_sse_disconnect_lets_an_awaiting_engine_abort_complete(make_gateway):
    engine = SlowAbortEngine(script=lambda v: Turn(text="x", endless=True, delay_per_token_s=0.01))
    live = make_gateway(engine=engine)
    with httpx.stream(
        "POST", live.base_url + "/responses", json={"model": MODEL, "input": "go", "stream": True}, timeout=30
    ) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("event: response.output_text.delta"):
                seen += 1
                if seen >= 3:
                    break
    wait_for(lambda: engine.abort_completed == 1 and engine.stats.running == 0, what="engine abort completed")
    assert live.metric("respgate_generation_aborts_total", {"transport": "http"}) == 1


def test_warm_up_prefills_the_engine_prefix_cache_for_the_next_turn(make_gateway):
    engine = SimulatedEngine(script=_answer, cache_block_size=1)
    live = make_gateway(engine=engine)
    with connect(live.ws_url, max_size=None) as ws:
        instructions = "You are a careful assistant. " * 20  # not inherited: every turn sends them
        ws.send(
            orjson.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "generate": False,
                    "store": False,
                    "instructions": instructions,
                    "input": [],
                }
            ).decode()
        )
        while (warm := json.loads(ws.recv(timeout=10)))["type"] != "response.completed":
            pass
        wait_for(lambda: engine.stats.prefills == 1, what="background prefill")
        ws.send(
            orjson.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "store": False,
                    "input": "hi",
                    "instructions": instructions,
                    "previous_response_id": warm["response"]["id"],
                }
            ).decode()
        )
        while (done := json.loads(ws.recv(timeout=10)))["type"] != "response.completed":
            pass
    assert engine.stats.requests == 1  # the warm-up itself never generated
    cached = done["response"]["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached == warm["response"]["usage"]["input_tokens"]


def test_tool_names_that_collide_in_the_prompt_format_are_a_400(make_gateway):
    """Hermes-style formats flatten namespaced tools to ``ns__tool``: a function literally named
    so collides. That is a request problem (400), not a server crash."""
    from inference.chat_template_render import ChatTemplateRenderer
    from inference.model_assets import prepare_model
    from inference.registry import ModelRegistry, ModelRoute

    engine = SimulatedEngine()
    registry = ModelRegistry(
        [ModelRoute(name="ct", engine=engine, renderer=ChatTemplateRenderer(prepare_model("smollm2")))]
    )
    live = make_gateway(engine=engine, registry=registry)
    tools = [
        {"type": "function", "name": "fs__read", "parameters": {"type": "object", "properties": {}}},
        {
            "type": "namespace",
            "name": "fs",
            "description": "files",
            "tools": [{"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}],
        },
    ]
    r = post(live, {"model": "ct", "input": "hi", "tools": tools})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert create(live, model="ct", input="hi")["status"] in ("completed", "failed")


def test_a_turns_event_groups_are_never_empty_and_flatten_to_its_events(make_gateway):
    """``Pipeline.batches`` (what the WebSocket transport writes a group at a time) gives the same
    events as ``Pipeline.run``, in groups as produced: created with in_progress first, the
    terminal group last, no empty group; a warm-up too."""
    from gateway.turn.types import TurnContext

    live = make_gateway(engine=SimulatedEngine(script=lambda view: Turn(reasoning="think", text="two words")))
    pipeline = live.gw.pipeline

    async def both(body):
        groups = []
        async for g in pipeline.batches(await pipeline.prepare(dict(body), TurnContext(transport="ws"))):
            groups.append(g)
        flat = [ev async for ev in pipeline.run(await pipeline.prepare(dict(body), TurnContext(transport="ws")))]
        return groups, flat

    for body in (
        {"model": MODEL, "input": "hi", "store": False},
        {"model": MODEL, "input": "hi", "store": False, "generate": False},
    ):
        groups, flat = live.call(both(body))
        assert all(groups), groups
        assert [e["type"] for e in groups[0]] == ["response.created", "response.in_progress"]
        assert groups[-1][-1]["type"] == "response.completed"
        strip = lambda evs: [(e["type"], e["sequence_number"]) for e in evs]  # noqa: E731 (ids differ)
        assert strip([e for g in groups for e in g]) == strip(flat)
        assert len(groups) < len(flat) or body.get("generate") is False


def test_a_turn_is_billed_before_its_terminal_and_kept_after_it_is_handed_over(make_gateway, caplog):
    """``Finalizer.settle`` bills before the terminal group is yielded; ``Finalizer.keep`` (the
    connection cache, the turn's metrics) runs only once the consumer took it — when it asks for
    more, and when it closes the generator right there (a socket gone), a warm-up's too, before
    the close returns. A fault while keeping the state is logged: the turn stays billed once,
    answered ``completed`` and counted."""
    from cache.connection_state import ConnectionCache
    from gateway.turn.types import TurnContext

    live = make_gateway(engine=SimulatedEngine(script=_answer))
    pipeline, gw = live.gw.pipeline, live.gw
    billed: list[str] = []
    submit = gw.usage.submit
    gw.usage.submit = lambda record: (billed.append(record.response_id), submit(record))[1]

    def counted(name: str, **labels: str) -> float:
        return gw.metrics.registry.get_sample_value(name, labels) or 0.0

    def completed() -> float:
        return counted("respgate_turns_total", transport="ws", status="completed")

    async def turn(*, close_at_terminal: bool, cache: ConnectionCache, generate: bool = True):
        prepared = await pipeline.prepare(
            {"model": MODEL, "input": "hi", "store": False, "generate": generate},
            TurnContext(transport="ws", conn_cache=cache, lane=""),
        )
        gen = pipeline.batches(prepared)
        at_terminal = None
        async for group in gen:
            if group[-1]["type"] == "response.completed":
                at_terminal = (prepared.id in billed, cache.get(prepared.id) is not None, completed())
                if close_at_terminal:
                    await gen.aclose()
                    break
        return prepared.id, at_terminal, cache.get(prepared.id) is not None

    for close, generate in ((False, True), (True, True), (False, False), (True, False)):  # a warm-up too
        before = completed()
        rid, at_terminal, kept = live.call(turn(close_at_terminal=close, cache=ConnectionCache(), generate=generate))
        assert at_terminal == (True, False, before)  # billed, not yet kept nor counted
        assert kept and completed() == before + 1 and billed.count(rid) == 1

    class Broken(ConnectionCache):
        def put(self, lane, state):
            raise RuntimeError("boom")

    before = completed()
    rid, at_terminal, kept = live.call(turn(close_at_terminal=False, cache=Broken()))
    assert at_terminal[0] and not kept and billed.count(rid) == 1 and completed() == before + 1
    assert f"keeping response {rid}: Finalizer._keep_state crashed" in caplog.text
    assert counted("respgate_generation_aborts_total", transport="ws") == 0  # not billed cancelled
