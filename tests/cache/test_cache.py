"""Append-only views, the item log, the connection cache and the memory store."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.connection_state import ConnectionCache
from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.response_store import MemoryStore, record_bytes
from cache.seq import AppendOnlyView, TokenSeq


def state(rid: str, nbytes: int = 100, delta: int = 100, tenant: str | None = None, status: str = "completed"):
    return ResponseState(
        id=rid,
        response={"id": rid, "status": status},
        input_items=(),
        context=ItemLog(),
        history_ids=TokenSeq(),
        model="m",
        prelude_key=b"k",
        store=True,
        tenant=tenant,
        nbytes=nbytes,
        delta_bytes=delta,
    )


# -- append-only views ---------------------------------------------------------------------------


def test_extend_at_tip_appends_in_place_without_copying():
    root = TokenSeq([1, 2, 3])
    copies = AppendOnlyView.copies
    child = root.extend([4, 5])
    grandchild = child.extend([6])
    assert AppendOnlyView.copies == copies
    assert root.tolist() == [1, 2, 3] and child.tolist() == [1, 2, 3, 4, 5]
    assert grandchild.tolist() == [1, 2, 3, 4, 5, 6]
    assert grandchild.shares_prefix_with(root)


def test_extend_of_a_non_tip_view_copies_and_leaves_siblings_intact():
    root = TokenSeq([1, 2])
    a = root.extend([3])
    copies = AppendOnlyView.copies
    b = root.extend([9])  # fork: root is no longer the tip
    assert AppendOnlyView.copies == copies + 1
    assert a.tolist() == [1, 2, 3] and b.tolist() == [1, 2, 9]
    assert not b.shares_prefix_with(a)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 99), max_size=4)), max_size=30))
def test_views_behave_like_immutable_lists(ops):
    """Random extends from random earlier versions: every version keeps its own contents."""
    versions = [(TokenSeq(), [])]
    for pick, new in ops:
        view, expected = versions[pick % len(versions)]
        versions.append((view.extend(new), expected + new))
    for view, expected in versions:
        assert list(view) == expected == view.tolist() == view[:]
        assert len(view) == len(expected)
        if expected:
            assert view[-1] == expected[-1]
            assert view.index(expected[-1]) == expected.index(expected[-1])


def test_index_is_bounded_by_the_view():
    root = TokenSeq([1, 2])
    root.extend([7])
    with pytest.raises(ValueError):
        root.index(7)
    with pytest.raises(IndexError):
        root[2]


def test_item_log_lookups_respect_view_length():
    log = ItemLog().extend([{"id": "m1", "type": "message"}])
    longer = log.extend([{"id": "fc1", "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}])
    assert longer.has_id("fc1") and longer.call("c1")["name"] == "f"
    assert not log.has_id("fc1") and log.call("c1") is None
    fork = log.extend([{"id": "m2", "type": "message"}])  # copies: fc1 must not be visible
    assert fork.has_id("m2") and not fork.has_id("fc1") and fork.call("c1") is None
    assert longer.get("m1") == {"id": "m1", "type": "message"}


# -- connection cache ----------------------------------------------------------------------------


def test_connection_cache_keeps_latest_per_lane_and_resolves_across_lanes():
    cache = ConnectionCache()
    cache.put("", state("r1"))
    cache.put("a", state("r2"))
    cache.put("", state("r3"))  # replaces r1 on the default lane
    assert cache.get("r1") is None
    assert cache.get("r2").id == "r2" and cache.lane_of("r2") == "a"
    assert cache.get("r3").id == "r3" and cache.lane_of("r3") == ""


def test_connection_cache_evict_and_clear():
    cache = ConnectionCache()
    cache.put("", state("r1"))
    assert cache.evict("r1") and not cache.evict("r1")
    assert cache.get("r1") is None
    cache.put("a", state("r2"))
    cache.clear()
    assert len(cache) == 0 and cache.get("r2") is None


def test_connection_cache_byte_bound_drops_least_recent_lanes_but_never_the_one_written():
    cache = ConnectionCache(max_bytes=250)
    cache.put("a", state("ra", nbytes=100))
    cache.put("b", state("rb", nbytes=100))
    cache.get("ra")  # a is now more recent than b
    cache.put("c", state("rc", nbytes=100))
    assert cache.get("rb") is None and cache.get("ra") and cache.get("rc")
    cache.put("d", state("rd", nbytes=1000))  # alone over budget: kept, everything else dropped
    assert cache.get("rd") and len(cache) == 1


# -- memory store --------------------------------------------------------------------------------


async def test_memory_store_roundtrip_delete_and_tenant_isolation():
    store = MemoryStore()
    await store.put(state("r1", tenant="t1"))
    assert (await store.get("r1", "t1")).id == "r1"
    assert await store.get("r1", "t2") is None
    assert await store.get("r1") is None
    assert not await store.delete("r1", "t2")
    assert await store.delete("r1", "t1")
    assert await store.get("r1", "t1") is None


async def test_memory_store_is_bounded_in_bytes_lru():
    size = record_bytes(state("r0"), 0)
    store = MemoryStore(max_bytes=4 * size + size // 2)  # four records fit, each within a quarter
    for i in range(4):
        await store.put(state(f"r{i}"))
    await store.get("r0")  # r0 becomes most recent
    await store.put(state("r4"))
    assert await store.get("r1") is None
    assert await store.get("r0") and await store.get("r4")
    assert store.nbytes <= store.max_bytes and store.evictions == 1


async def test_memory_store_charges_what_a_record_holds_and_counts_entries():
    """Item 10: a record is charged its Response (metadata and all), not only ``delta_bytes``; the
    store is bounded in entries too (before: 1,500 records with 9 KB of metadata each, charged 100
    bytes each, all stayed under a 16 MiB bound)."""
    meta = {f"k{i:02d}".ljust(64, "k"): "v" * 512 for i in range(16)}
    rich = ResponseState(
        id="rich",
        response={"id": "rich", "status": "completed", "metadata": meta},
        input_items=(),
        context=ItemLog(),
        history_ids=TokenSeq(),
        model="m",
        prelude_key=b"k",
        store=True,
        delta_bytes=100,
    )
    assert record_bytes(rich, 0) > 16 * (64 + 512)  # at least the characters, plus what holds them
    store = MemoryStore(max_bytes=10**9, max_entries=8)
    for i in range(20):
        await store.put(state(f"r{i}"))
    assert len(store) == 8 and await store.get("r19") and await store.get("r11") is None


async def test_memory_store_gives_each_tenant_its_share_and_keeps_the_item_index_consistent():
    """Item 9: tenant A's flood evicts A's own records once the store is full, never B's (before:
    1,500 records of A evicted all 100 of B's); the item-id index follows every eviction."""

    def with_item(rid: str, tenant: str) -> ResponseState:
        item = {"type": "message", "id": f"msg_{rid}", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
        return ResponseState(
            id=rid,
            response={"id": rid, "status": "completed", "output": []},
            input_items=(item,),
            context=ItemLog(),
            history_ids=TokenSeq(),
            model="m",
            prelude_key=b"k",
            store=True,
            tenant=tenant,
            delta_bytes=100,
        )

    size = record_bytes(with_item("b0", "B"), 1)
    store = MemoryStore(max_bytes=400 * size)
    for i in range(100):
        await store.put(with_item(f"b{i}", "B"))
    for i in range(1_500):
        await store.put(with_item(f"a{i}", "A"))
    kept_b = [i for i in range(100) if await store.get(f"b{i}", "B") is not None]
    assert len(kept_b) == 100
    assert len(await store.items([f"msg_b{i}" for i in range(100)], "B")) == 100
    assert store.nbytes <= store.max_bytes and store.evictions > 0
    a_kept = store.tenant_usage("A")[0]
    assert a_kept == len([i for i in range(1_500) if await store.get(f"a{i}", "A") is not None])
    # the index holds exactly the kept records' items: evicted ones left no entry behind
    assert len(store._items) == 100 + a_kept and len(store._owned) == 100 + a_kept
    assert await store.items(["msg_a0"], "A") == {}


async def test_memory_store_refuses_a_record_above_its_tenants_share():
    store = MemoryStore(max_bytes=4_000)
    big = ResponseState(
        id="big",
        response={"id": "big", "text": "x" * 2_000},
        input_items=(),
        context=ItemLog(),
        history_ids=TokenSeq(),
        model="m",
        prelude_key=b"k",
        store=True,
        delta_bytes=10,
    )
    await store.put(big)
    assert await store.get("big") is None and store.refused == 1 and store.nbytes == 0


async def test_memory_store_a_refused_re_store_keeps_the_record_stored_before():
    """Review of items 9-10: a re-store refused as too big for its tenant's share left no record at
    all (the old one was dropped first): a background response stored when queued, re-stored when
    done, answered 404. Now the record stored before stays, and so do its index entries; an accepted
    re-store moves them to where the new record keeps its items, and forgets those it no longer has."""

    def with_items(rid: str, output: list, text: str = "") -> ResponseState:
        msg = {"type": "message", "id": "msg_in", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
        return ResponseState(
            id=rid,
            response={"id": rid, "status": "completed", "output": output, "text": text},
            input_items=(msg,),
            context=ItemLog(),
            history_ids=TokenSeq(),
            model="m",
            prelude_key=b"k",
            store=True,
            tenant="A",
            delta_bytes=100,
        )

    out = {"type": "message", "id": "msg_out", "role": "assistant", "content": []}
    store = MemoryStore(max_bytes=40_000)
    await store.put(with_items("r", []))  # queued: the input only
    await store.put(with_items("r", [out], text="x" * 20_000))  # done, above a quarter: refused
    assert store.refused == 1 and (await store.get("r", "A")).response["output"] == []
    assert set(await store.items(["msg_in", "msg_out"], "A")) == {"msg_in"}
    await store.put(with_items("r", [out, {**out, "id": "msg_out2"}]))  # accepted: replaces it
    found = await store.items(["msg_in", "msg_out", "msg_out2"], "A")
    assert found["msg_out2"].item["id"] == "msg_out2" and found["msg_in"].response_id == "r"
    await store.put(with_items("r", [{**out, "id": "msg_out2"}]))  # msg_out gone, msg_out2 moved
    found = await store.items(["msg_in", "msg_out", "msg_out2"], "A")
    assert set(found) == {"msg_in", "msg_out2"} and found["msg_out2"].item["id"] == "msg_out2"
    assert len(store) == 1 and sorted(k for _, k in store._items) == ["msg_in", "msg_out2"]
    assert store._owned == {("A", "r"): list(store._items)}
    assert await store.delete("r", "A") and store._items == {} and store._owned == {}


async def test_memory_store_entries_expire_after_ttl():
    store = MemoryStore(ttl_s=0.05)
    await store.put(state("r1"))
    assert await store.get("r1")
    deadline = time.monotonic() + 5
    while await store.get("r1") is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert len(store) == 0 and store.nbytes == 0
