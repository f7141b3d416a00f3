"""Append-only views, the item log, the connection cache and the memory store."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.connection import ConnectionCache
from cache.items import ItemLog
from cache.seq import AppendOnlyView, TokenSeq
from cache.state import ResponseState
from cache.store import MemoryStore


def state(rid: str, nbytes: int = 100, delta: int = 100, tenant: str | None = None, status: str = "completed"):
    return ResponseState(id=rid, response={"id": rid, "status": status}, input_items=(), context=ItemLog(),
                         history_ids=TokenSeq(), model="m", prelude_key=b"k", store=True, tenant=tenant,
                         nbytes=nbytes, delta_bytes=delta)


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
    store = MemoryStore(max_bytes=300)
    for i in range(3):
        await store.put(state(f"r{i}", delta=100))
    await store.get("r0")  # r0 becomes most recent
    await store.put(state("r3", delta=100))
    assert await store.get("r1") is None
    assert await store.get("r0") and await store.get("r3")
    assert store.nbytes <= 300 and store.evictions == 1


async def test_memory_store_entries_expire_after_ttl():
    store = MemoryStore(ttl_s=0.05)
    await store.put(state("r1"))
    assert await store.get("r1")
    deadline = time.monotonic() + 5
    while await store.get("r1") is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert len(store) == 0 and store.nbytes == 0
