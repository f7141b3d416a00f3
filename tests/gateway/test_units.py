"""Small pieces with rules of their own: sealing, the response status machine, usage queue, auth."""

from __future__ import annotations

import asyncio
import time

import pytest

from billing.usage import MemorySink, UsageQueue, UsageRecord
from gateway.access.auth import KeyAuth
from gateway.turn.events import IllegalTransition, ResponseEvents
from gateway.turn.sealing import Sealer, SealError
from gateway.wire.errors import ApiError
from inference.parse import ItemDelta, ItemEnd, ItemStart


def test_sealed_reasoning_roundtrips_and_is_opaque():
    sealer = Sealer(b"secret")
    blob = sealer.seal("I should call get_weather for Paris.")
    assert "Paris" not in blob
    assert sealer.open(blob) == "I should call get_weather for Paris."
    assert sealer.seal("x") != sealer.seal("x")  # random nonce


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-4] + ("AAAA" if not b.endswith("AAAA") else "BBBB"),
        lambda b: "rg1" + b,
        lambda b: "not base64 at all!",
        lambda b: "",
    ],
)
def test_tampered_or_foreign_blobs_are_rejected(mangle):
    sealer = Sealer(b"secret")
    with pytest.raises(SealError):
        sealer.open(mangle(sealer.seal("hidden thoughts")))


def test_blob_from_another_secret_is_rejected():
    with pytest.raises(SealError):
        Sealer(b"b").open(Sealer(b"a").seal("x"))


def _events() -> ResponseEvents:
    return ResponseEvents({"id": "resp_1", "status": "in_progress", "output": [], "usage": None})


def test_status_machine_allows_exactly_one_terminal_transition():
    ev = _events()
    ev.created()
    ev.complete({"input_tokens": 1})
    for again in (
        lambda: ev.complete({}),
        lambda: ev.fail(None, "server_error", "x"),
        lambda: ev.incomplete({}, "max_output_tokens"),
        lambda: ev.cancel(None),
    ):
        with pytest.raises(IllegalTransition):
            again()


def test_event_numbering_is_dense_and_items_close_before_the_next_opens():
    ev = _events()
    out = ev.created()
    out += ev.feed([ItemStart("reasoning"), ItemDelta("think"), ItemStart("message"), ItemDelta("hi"), ItemEnd()])
    out += ev.complete({"input_tokens": 1})
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    types = [e["type"] for e in out]
    assert types.index("response.output_item.done") < types.index("response.output_text.delta")
    added = [e["output_index"] for e in out if e["type"] == "response.output_item.added"]
    assert added == [0, 1]
    assert out[-1]["response"]["output"][1]["content"][0]["text"] == "hi"


def test_cut_off_item_is_closed_incomplete_on_termination():
    ev = _events()
    ev.created()
    ev.feed([ItemStart("function_call", name="f"), ItemDelta('{"a":')])
    out = ev.incomplete({"input_tokens": 1}, "max_output_tokens")
    done = [e for e in out if e["type"] == "response.output_item.done"][0]
    assert done["item"]["status"] == "incomplete" and done["item"]["arguments"] == '{"a":'
    assert out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def _record(i: int) -> UsageRecord:
    return UsageRecord(
        response_id=f"r{i}",
        model="m",
        tenant=None,
        status="completed",
        input_tokens=1,
        cached_tokens=0,
        output_tokens=1,
        reasoning_tokens=0,
        transport="ws",
    )


async def test_usage_queue_never_blocks_and_drains_everything_at_shutdown():
    sink = MemorySink()
    queue = UsageQueue(sink, maxsize=4)
    queue.start()
    for i in range(50):  # more than the queue holds: overflow keeps them
        queue.submit(_record(i))
    await queue.drain()
    assert set(sink.records) == {f"r{i}" for i in range(50)}


async def test_usage_queue_keeps_records_when_the_sink_fails():
    class Flaky(MemorySink):
        fails = 2

        async def write_batch(self, records):
            if self.fails:
                self.fails -= 1
                raise ConnectionError("ledger down")
            await super().write_batch(records)

    sink = Flaky()
    queue = UsageQueue(sink)
    queue.start()
    queue.submit(_record(1))
    for _ in range(500):
        if "r1" in sink.records:
            break
        await asyncio.sleep(0.01)
    await queue.drain()
    assert "r1" in sink.records


def test_key_auth():
    assert KeyAuth([]).tenant({}) is None
    auth = KeyAuth(["k1", "k2"])
    t1 = auth.tenant({"authorization": "Bearer k1"})
    assert t1 and t1 != auth.tenant({"authorization": "Bearer k2"}) and "k1" not in t1
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic k1"}, {"authorization": "Bearer "}):
        with pytest.raises(ApiError) as exc:
            auth.tenant(headers)
        assert exc.value.status == 401 and exc.value.code == "invalid_api_key"


def test_component_counters_are_exported_at_scrape_time(make_gateway):
    import httpx

    live = make_gateway()
    live.openai().responses.create(model="gpt-oss-sim", input="hi")
    deadline = time.monotonic() + 10
    while live.metric("respgate_usage_records_total", {"sink": "ledger"}) < 1:
        assert time.monotonic() < deadline, "usage record never written"
        time.sleep(0.02)
    text = httpx.get(live.url + "/metrics").text
    for name in (
        "respgate_usage_records_total",
        "respgate_usage_pending",
        "respgate_store_token_cache_total",
        "respgate_store_chain_cache_total",
        "respgate_store_rerooted_total",
        "respgate_sequence_copies_total",
    ):
        assert name in text, name


def test_rate_limited_log_keeps_a_flood_to_a_few_lines_and_counts_the_rest(caplog):
    import logging

    from gateway.base.log_limit import RateLimitedLog

    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("t.flood"), period=10, burst=2, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t.flood"):
        logged = [limited.warning("size", "frame too large (%d bytes)", i) for i in range(100)]
        assert logged[:2] == [True, True] and not any(logged[2:])
        assert limited.info("depth", "too deep")  # another kind has its own budget
        now[0] = 10.0
        assert limited.warning("size", "frame too large (%d bytes)", 100)
    lines = [r.getMessage() for r in caplog.records if r.name == "t.flood"]
    assert lines == [
        "frame too large (0 bytes)",
        "frame too large (1 bytes)",
        "too deep",
        "frame too large (100 bytes) (98 similar line(s) suppressed)",
    ]
    assert all(r.exc_info is None for r in caplog.records)


def test_the_served_process_freezes_its_start_up_heap_and_collects_the_young_less_often():
    """``respgate serve``'s server settles the heap once it is up (gateway/ops/server.py)."""
    import subprocess
    import sys

    code = (
        "import gc; from gateway.ops.server import GC_YOUNG_THRESHOLD, settle_heap; junk = [[] for _ in range(1000)]; "
        "settle_heap(); print(gc.get_freeze_count() >= 1000, gc.get_threshold()[0] == GC_YOUNG_THRESHOLD, "
        "gc.get_count()[0] < 100)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "True", "True"], out
