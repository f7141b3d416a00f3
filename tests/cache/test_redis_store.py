"""The Redis response store: unit round trips against a real server, then two gateways sharing it.

Two gateway instances in one test are two apps with separate process-local token caches and one
Redis, which is exactly what two replicas see: a chain continues across them over HTTP and over
WebSocket, the replica without the chain's tokens re-renders in full once (counted), and an outage
of Redis is a clean 503 on the paths that need it while everything else keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import msgspec
import pytest
import redis

from cache.item_log import ItemLog
from cache.redis_response_store import ChainCache, ChainEntry, RedisStore, TokenCache
from cache.response_state import ResponseState
from cache.response_store import StoreUnavailable
from cache.seq import TOKEN_BYTES, TokenSeq
from gateway.base.settings import Settings
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import assert_error, create, post, wait_for

pytestmark = pytest.mark.timeout(120)


def item(text: str, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "id": f"msg_{text}", "content": [{"type": "input_text", "text": text}]}


def chain(n: int, tenant: str | None = "t1", name: str = "resp", width: int = 0) -> list[ResponseState]:
    """n chained states as the finalizer builds them: shared item and token buffers, each a delta.
    ``width``: zero-padded numbers, so every state of the chain has fields of the same sizes."""
    states: list[ResponseState] = []
    context, ids = ItemLog(), TokenSeq()
    for i in range(n):
        k = f"{i:0{width}d}"
        new, out = [item(f"in{k}")], [item(f"out{k}", "assistant")]
        context = context.extend(new + out)
        ids = ids.extend(range(10 * i, 10 * i + 10))
        states.append(
            ResponseState(
                id=f"{name}_{k}",
                response={"id": f"{name}_{k}", "status": "completed", "output": out},
                input_items=tuple(new),
                context=context,
                history_ids=ids,
                model="m",
                prelude_key=b"\x00pk\xff",
                store=True,
                parent_id=states[-1].id if states else None,
                pending_calls=frozenset({f"call_{k}"}),
                flagged=i == 1,
                tenant=tenant,
                nbytes=100 * (i + 1) if not width else 10**width,
                delta_bytes=100,
                **({"created": 1.5} if width else {}),
            )
        )
    return states


def link(url: str, root: str, response_id: str) -> tuple[list[dict[str, Any]], str] | None:
    """A response's entry in its chain hash: (its delta, its parent in the chain)."""
    raw = redis.Redis.from_url(url).hget(f"respgate:c:{{{root}}}", f"d:{response_id}")
    if raw is None:
        return None
    delta, _, parent = raw.partition(b"\n")
    return json.loads(delta), parent.decode()


def redis_keys(url: str) -> list[bytes]:
    return sorted(redis.Redis.from_url(url).keys("*"))


# -- unit: the store against a real server --------------------------------------------------------


async def test_chain_round_trip_from_a_second_process_hydrates_context_and_misses_tokens(redis_url):
    a, b = RedisStore.from_url(redis_url), RedisStore.from_url(redis_url)
    try:
        states = chain(4)
        for s in states:
            await a.put(s)
        # the chain holds each response's delta once (never the whole context), the record none
        delta, parent = link(redis_url, "resp_0", "resp_3")
        assert [i["id"] for i in delta] == ["msg_in3", "msg_out3"] and parent == "resp_2"
        assert link(redis_url, "resp_0", "resp_0")[1] == ""
        record = redis.Redis.from_url(redis_url).hgetall("respgate:r:{resp_0}:resp_3")
        assert sorted(record) == [b"input", b"meta", b"pk", b"response", b"tenant"]
        assert json.loads(redis.Redis.from_url(redis_url).get("respgate:p:resp_3")) == {
            "root": "resp_0",
            "depth": 3,
            "clen": 8,
        }

        got = await b.get("resp_3", "t1")
        assert got is not None
        assert list(got.context) == list(states[3].context)
        assert got.context.has_id("msg_in0") and got.context.get("msg_out2") == item("out2", "assistant")
        assert got.input_items == states[3].input_items and got.response == states[3].response
        assert (got.parent_id, got.model, got.pending_calls, got.nbytes) == ("resp_2", "m", {"call_3"}, 400)
        assert not got.flagged and (await b.get("resp_1", "t1")).flagged
        # no tokens in that process: empty ids and no prelude key, so the pipeline renders in full
        assert len(got.history_ids) == 0 and got.prelude_key == b""
        assert (b.token_hits, b.token_misses) == (0, 2)

        hit = await a.get("resp_3", "t1")
        assert hit.history_ids is states[3].history_ids  # the view itself, not a copy
        assert hit.prelude_key == b"\x00pk\xff" and a.token_hits == 1
    finally:
        await a.close()
        await b.close()


async def test_tenant_isolation(redis_url):
    store = RedisStore.from_url(redis_url)
    try:
        for s in chain(2, tenant="t1"):
            await store.put(s)
        assert await store.get("resp_1", "t2") is None
        assert await store.get("resp_1", None) is None
        assert not await store.delete("resp_1", "t2")
        assert await store.get("resp_1", "t1") is not None
        await store.put(msgspec.structs.replace(chain(1, tenant=None)[0], id="x"))
        assert await store.get("x", None) is not None and await store.get("x", "t1") is None
    finally:
        await store.close()


async def until(check: Any, what: str) -> None:
    """Bounded polling for a state of Redis (not a timing assertion)."""
    deadline = time.monotonic() + 15
    while not await check():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.05)


async def test_a_response_expires_from_its_own_write_its_chain_from_the_newest(redis_url):
    """Retention: a response's record lives for the TTL from its own write; the chain's deltas for
    the TTL from the chain's newest write, so a live descendant always hydrates whole."""
    r = redis.Redis.from_url(redis_url)
    store = RedisStore.from_url(redis_url, ttl_s=2.0)
    try:
        s0, s1 = chain(2)
        await store.put(s0)
        await asyncio.sleep(1.2)
        await store.put(s1)  # one PEXPIRE of the chain: resp_0's delta lives as long as resp_1
        assert r.pttl("respgate:c:{resp_0}") > r.pttl("respgate:r:{resp_0}:resp_0")

        async def root_gone() -> bool:
            return await store.get("resp_0", "t1") is None

        await until(root_gone, "expired resp_0")  # its own TTL, from its own write
        assert r.exists("respgate:r:{resp_0}:resp_0", "respgate:p:resp_0") == 0
        cold = RedisStore.from_url(redis_url)  # a replica that never saw the chain: hydrates whole
        try:
            got = await cold.get("resp_1", "t1")
            assert got is not None and list(got.context) == list(s1.context)
        finally:
            await cold.close()

        async def all_gone() -> bool:
            return await store.get("resp_1", "t1") is None and redis_keys(redis_url) == []

        await until(all_gone, "expired the chain")  # and nothing is left behind
    finally:
        await store.close()


async def test_delete_keeps_descendants_whole_and_removes_leaves_outright(redis_url):
    store = RedisStore.from_url(redis_url)
    try:
        states = chain(3)
        for s in states:
            await store.put(s)
        assert await store.delete("resp_1", "t1")
        assert await store.get("resp_1", "t1") is None  # gone for retrieval and chaining
        assert not await store.delete("resp_1", "t1")  # a second delete is a miss
        got = await store.get("resp_2", "t1")
        assert got is not None and list(got.context) == list(states[2].context)
        # the tombstone keeps only what descendants need: its delta (no record, no pointer)
        keys = redis_keys(redis_url)
        assert b"respgate:r:{resp_0}:resp_1" not in keys and b"respgate:p:resp_1" not in keys
        assert link(redis_url, "resp_0", "resp_1")[0] == list(states[1].context[2:])
        cold = RedisStore.from_url(redis_url)  # another replica walks through the tombstone
        try:
            got = await cold.get("resp_2", "t1")
            assert got is not None and list(got.context) == list(states[2].context)
        finally:
            await cold.close()

        assert await store.delete("resp_2", "t1")  # a leaf: removed outright
        keys = redis_keys(redis_url)
        assert b"respgate:r:{resp_0}:resp_2" not in keys and link(redis_url, "resp_0", "resp_2") is None
        # and no longer counts as its parent's child
        assert redis.Redis.from_url(redis_url).hget("respgate:c:{resp_0}", "k:resp_1") is None
    finally:
        await store.close()


async def test_missing_ancestor_fails_cleanly_and_parentless_records_stand_alone(redis_url):
    store = RedisStore.from_url(redis_url)
    try:
        states = chain(3)
        for s in states:
            await store.put(s)
        redis.Redis.from_url(redis_url).hdel("respgate:c:{resp_0}", "d:resp_0")  # e.g. lost in a failover
        other = RedisStore.from_url(redis_url)  # another replica: it must read the ancestors' deltas
        try:
            assert await other.get("resp_2", "t1") is None  # never a truncated context
        finally:
            await other.close()
        # the writer holds resp_2's whole context itself: still exact, and nothing truncated
        assert list((await store.get("resp_2", "t1")).context) == list(states[2].context)

        # a parent that never reached Redis (a store=false WebSocket turn): the whole context is stored
        await store.put(msgspec.structs.replace(states[2], id="resp_orphan", parent_id="resp_ws_only"))
        meta = json.loads(redis.Redis.from_url(redis_url).get("respgate:p:resp_orphan"))
        assert meta == {"root": "resp_orphan", "depth": 0, "clen": 6}  # a new chain
        got = await store.get("resp_orphan", "t1")
        assert got is not None and list(got.context) == list(states[2].context)
    finally:
        await store.close()


def commands(r: redis.Redis) -> dict[str, int]:
    """Data commands since the last ``CONFIG RESETSTAT`` (INFO, CONFIG and a new connection's
    handshake not counted); a script's own commands count, each."""
    skip = tuple(f"cmdstat_{c}" for c in ("info", "config", "hello", "client", "select", "ping"))
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items() if not k.startswith(skip)}


async def load_scripts(url: str) -> None:
    """Load the store's scripts, so that a count does not include a first use's ``NOSCRIPT`` retry."""
    from cache import redis_response_store as redis_store

    r = redis.Redis.from_url(url)
    for name, script in vars(redis_store).items():
        if name.endswith("_LUA"):
            r.script_load(script)


def sent_bytes(r: redis.Redis) -> int:
    return r.info("stats")["total_net_input_bytes"]


async def measure_write(r: redis.Redis, store: RedisStore, state: ResponseState) -> tuple[dict[str, int], int]:
    """The Redis commands and the bytes clients sent for one ``put`` (the measuring INFO's own
    request is in both readings of the byte count, alike at every depth)."""
    # the two connections a write uses (script and pipeline go together) opened before counting
    await asyncio.gather(store.redis.ping(), store.redis.ping())
    r.config_resetstat()
    before = sent_bytes(r)
    await store.put(state)
    after = sent_bytes(r)
    return commands(r), after - before


async def test_a_write_costs_the_same_calls_and_bytes_at_depth_2_and_40(redis_url):
    """O(new input) writes: one script (the record, the delta, the parent's child count, one TTL
    for the whole chain) beside the pointer and the item index — no per-ancestor TTL, no ancestor
    list — for the writer that holds the parent and for another replica (+ the parent's pointer)."""
    r = redis.Redis.from_url(redis_url)
    writer, other, cold = (RedisStore.from_url(redis_url) for _ in range(3))
    try:
        states = chain(42, width=2)  # ids, items and meta of one size at every depth
        await load_scripts(redis_url)
        for st in states[:2]:
            await writer.put(st)
        warm_2 = await measure_write(r, writer, states[2])
        cold_3 = await measure_write(r, other, states[3])
        for st in states[4:40]:
            await writer.put(st)
        warm_40 = await measure_write(r, writer, states[40])
        cold_41 = await measure_write(r, other, states[41])
        assert warm_2[0] == warm_40[0] and cold_3[0] == cold_41[0], (warm_2, warm_40, cold_3, cold_41)
        # the bytes too, but for the digits of two numbers in the pointer (depth, context length)
        digits = len("40") - len("2") + len(str(len(states[40].context))) - len(str(len(states[2].context)))
        assert (warm_40[1] - warm_2[1], cold_41[1] - cold_3[1]) == (digits, digits), (warm_2, warm_40, cold_3, cold_41)
        assert warm_40[0] == {"evalsha": 1, "hexists": 1, "hset": 2, "hincrby": 1, "pexpire": 2, "set": 3}
        assert cold_41[0] == {**warm_40[0], "get": 1}  # + the parent's pointer
        # what stays in Redis per response is O(1) too: the pointer has no ancestor list
        assert len(r.get("respgate:p:resp_40")) - len(r.get("respgate:p:resp_02")) == digits
        for st in states[:3] + states[38:]:
            got = await cold.get(st.id, "t1")
            assert got is not None and list(got.context) == list(st.context), st.id
    finally:
        await writer.close()
        await other.close()
        await cold.close()


async def test_a_cold_read_hydrates_a_deep_chain_exactly_in_two_round_trips(redis_url):
    """Another replica's first read of a 200-deep chain: the pointer, then one script that walks
    the chain in its slot; every item comes back as written (newlines, non-ASCII, nesting)."""
    r = redis.Redis.from_url(redis_url)
    writer, cold = RedisStore.from_url(redis_url), RedisStore.from_url(redis_url)
    try:
        states, context = [], ItemLog()
        for i in range(200):
            new = [
                {
                    "type": "message",
                    "role": "user",
                    "id": f"msg_u{i}",
                    "content": [{"type": "input_text", "text": f'line one\nline {i} — 日本語 ✓ "q"\\'}],
                }
            ]
            out = [
                {
                    "type": "function_call",
                    "id": f"fc_{i}",
                    "call_id": f"call_{i}",
                    "name": "f",
                    "arguments": json.dumps({"n": i, "nested": {"list": [1, 2.5, None, True]}}),
                }
            ]
            context = context.extend(new + out)
            states.append(
                ResponseState(
                    id=f"resp_{i}",
                    response={"id": f"resp_{i}", "output": out},
                    input_items=tuple(new),
                    context=context,
                    history_ids=TokenSeq(),
                    model="m",
                    prelude_key=b"",
                    store=True,
                    parent_id=f"resp_{i - 1}" if i else None,
                    tenant="t1",
                    nbytes=i + 1,
                )
            )
            await writer.put(states[-1])
        await load_scripts(redis_url)
        r.config_resetstat()
        got = await cold.get("resp_199", "t1")
        assert got is not None and list(got.context) == list(states[199].context)
        assert json.dumps(list(got.context)) == json.dumps(list(states[199].context))  # byte for byte
        assert got.context.call("call_7") == states[7].response["output"][0]
        assert commands(r) == {"get": 1, "evalsha": 1, "hmget": 1, "hget": 200}
        assert await cold.get("resp_199", "t2") is None  # another tenant's: not walked
    finally:
        await writer.close()
        await cold.close()


async def test_a_lost_chain_is_not_found_never_truncated_and_a_holder_starts_a_new_one(redis_url):
    """The chain key gone (expired, evicted): another replica's read is None, not the record's own
    delta; the writer still holds the context whole, and its next turn is written as the root of a
    new chain with the whole context (its pointer and index entries too), readable everywhere."""
    r = redis.Redis.from_url(redis_url)
    writer = RedisStore.from_url(redis_url)
    try:
        states = chain(5)
        for st in states[:4]:
            await writer.put(st)
        r.delete("respgate:c:{resp_0}")
        for rid in ("resp_3", "resp_1", "resp_0"):
            cold = RedisStore.from_url(redis_url)
            try:
                assert await cold.get(rid, "t1") is None, rid
            finally:
                await cold.close()
        assert list((await writer.get("resp_3", "t1")).context) == list(states[3].context)
        await writer.put(states[4])
        assert writer.rerooted == 1
        assert json.loads(r.get("respgate:p:resp_4")) == {"root": "resp_4", "depth": 0, "clen": 10}
        assert link(redis_url, "resp_4", "resp_4")[0] == list(states[4].context)
        cold = RedisStore.from_url(redis_url)
        try:
            got = await cold.get("resp_4", "t1")
            assert got is not None and list(got.context) == list(states[4].context)
            assert got.parent_id == "resp_3"  # the client's chain, unchanged
            found = await cold.items(["msg_in4", "msg_out4", "msg_in0"], "t1")
            assert {k: v.response_id for k, v in found.items()} == {
                "msg_in4": "resp_4",
                "msg_out4": "resp_4",
                "msg_in0": "resp_0",
            }
        finally:
            await cold.close()
    finally:
        await writer.close()


async def test_a_pointer_of_the_previous_layout_is_not_found(redis_url):
    """Upgrade: a response stored by the previous layout (its pointer lists ancestors, its record
    holds its delta) is not found — not read as a chain of one."""
    r = redis.Redis.from_url(redis_url)
    r.set("respgate:p:resp_old", json.dumps({"root": "resp_old", "anc": [], "clen": 2}))
    r.hset(
        "respgate:r:{resp_old}:resp_old",
        mapping={"tenant": json.dumps("t1"), "meta": "{}", "response": "{}", "input": "[]", "delta": "[]", "pk": ""},
    )
    store = RedisStore.from_url(redis_url)
    try:
        assert await store.get("resp_old", "t1") is None and not await store.delete("resp_old", "t1")
        child = msgspec.structs.replace(chain(1)[0], id="resp_new", parent_id="resp_old")
        await store.put(child)  # its parent is unknown: a new chain
        assert json.loads(r.get("respgate:p:resp_new"))["root"] == "resp_new"
    finally:
        await store.close()


async def test_a_process_reads_a_chain_it_holds_in_one_round_trip_whatever_its_depth(redis_url):
    """O(new input) on the store=true path: a continuation's read of a parent this process wrote
    (or read once) is one HMGET of the record's own fields; no pointer, no ancestor deltas.
    Another process reads the pointer and walks every ancestor's delta (O(history)), once."""
    r = redis.Redis.from_url(redis_url)
    writer, other = RedisStore.from_url(redis_url), RedisStore.from_url(redis_url)
    try:
        states = chain(40)
        for st in states:
            await writer.put(st)
        await load_scripts(redis_url)
        for depth in (4, 39):
            r.config_resetstat()
            got = await writer.get(f"resp_{depth}", "t1")
            assert list(got.context) == list(states[depth].context)
            assert commands(r) == {"hmget": 1}, depth
        r.config_resetstat()
        cold = await other.get("resp_39", "t1")
        assert list(cold.context) == list(states[39].context)
        # the pointer, then one script in the chain's slot: the record + a walk over 40 deltas
        assert commands(r) == {"get": 1, "evalsha": 1, "hmget": 1, "hget": 40}
        r.config_resetstat()
        assert list((await other.get("resp_39", "t1")).context) == list(states[39].context)
        assert commands(r) == {"hmget": 1}  # read once: held from then on
        assert (writer.chain_hits, writer.chain_misses, other.chain_hits, other.chain_misses) == (2, 0, 1, 1)
        # a child written by a process that holds its parent skips the parent's pointer too
        r.config_resetstat()
        child = msgspec.structs.replace(
            states[39],
            id="resp_40",
            parent_id="resp_39",
            context=states[39].context.extend([item("in40"), item("out40", "assistant")]),
        )
        await writer.put(child)
        assert "get" not in commands(r)
        assert list((await other.get("resp_40", "t1")).context) == list(child.context)
    finally:
        await writer.close()
        await other.close()


async def test_a_held_chain_is_still_checked_deleted_elsewhere_another_tenant_expired(redis_url):
    a, b = RedisStore.from_url(redis_url), RedisStore.from_url(redis_url)
    try:
        states = chain(3)
        for st in states:
            await a.put(st)
        assert await a.get("resp_2", "t2") is None  # another tenant: not found
        assert await b.get("resp_2", "t1") is not None
        assert await b.delete("resp_2", "t1")  # deleted on another replica
        assert await a.get("resp_2", "t1") is None and a.chains.get("resp_2", "t1") is None
        redis.Redis.from_url(redis_url).delete("respgate:r:{resp_0}:resp_1")  # expired
        assert await a.get("resp_1", "t1") is None
        assert await a.get("resp_0", "t1") is not None
    finally:
        await a.close()
        await b.close()


def test_chain_cache_charges_a_shared_item_buffer_once_and_is_bounded():
    cache = ChainCache(max_bytes=1000)
    root = ItemLog([item("a")])
    child = root.extend([item("b")])
    cache.put("r0", ChainEntry("r0", 0, root), 300)
    cache.put("r1", ChainEntry("r0", 1, child), 400)
    assert cache.nbytes == 400  # one buffer, its largest charge
    cache.put("x", ChainEntry("x", 0, ItemLog([item("c")])), 500)
    assert cache.nbytes == 900
    cache.put("y", ChainEntry("y", 0, ItemLog([item("d")])), 500)  # over: the oldest entries go
    assert cache.nbytes <= 1000 and cache.get("y") is not None and cache.evictions >= 1
    cache.discard("y")
    cache.discard("x")
    assert cache.nbytes == (400 if cache.get("r1") is not None else 0)


def test_token_cache_charges_shared_buffers_once_and_is_bounded_lru():
    cache = TokenCache(max_bytes=TOKEN_BYTES * 100)
    root = TokenSeq(list(range(30)))
    child = root.extend(range(30))
    cache.put("a", root)
    cache.put("b", child)
    assert cache.nbytes == TOKEN_BYTES * 60  # one buffer of 60 tokens, not 30 + 60
    other = TokenSeq(list(range(30)))
    cache.put("c", other)
    assert cache.get("a") is root  # touch: "b" is now the oldest
    cache.put("d", TokenSeq(list(range(20))))  # 60 + 30 + 20 > 100: evict LRU entries
    # "b" goes first but frees nothing ("a" still pins the shared buffer), so "c" goes too
    assert cache.get("b") is None and cache.get("c") is None
    assert cache.get("a") is root and cache.get("d") is not None and cache.nbytes == TOKEN_BYTES * 80
    cache.put("huge", TokenSeq(list(range(1000))))  # bigger than the bound: not kept
    assert cache.get("huge") is None and cache.nbytes <= cache.max_bytes


async def test_store_token_cache_byte_bound(redis_url):
    store = RedisStore.from_url(redis_url, token_cache_bytes=TOKEN_BYTES * 50)
    try:
        first, second = chain(4), chain(4, name="other")  # each chain: one shared buffer of 40 tokens
        for s in first[:3]:
            await store.put(s)
        assert store.tokens.nbytes == TOKEN_BYTES * 40 and len(store.tokens) == 3
        await store.put(second[0])  # 80 tokens > 50: the first chain's entries are evicted
        assert store.tokens.nbytes == TOKEN_BYTES * 40 and len(store.tokens) == 1
        assert (await store.get("resp_2", "t1")).prelude_key == b"" and store.token_misses == 1
        assert (await store.get("other_0", "t1")).prelude_key != b"" and store.token_hits == 1
    finally:
        await store.close()


async def test_outage_raises_store_unavailable_then_recovers(redis_url, redis_server):
    store = RedisStore.from_url(redis_url)
    try:
        s0, s1 = chain(2)
        await store.put(s0)
        redis_server.stop()
        with pytest.raises(StoreUnavailable):
            await store.get("resp_0", "t1")
        with pytest.raises(StoreUnavailable):
            await store.put(s1)
        with pytest.raises(StoreUnavailable):
            await store.delete("resp_0", "t1")
        redis_server.start()  # an empty server (no persistence): the stale pooled connection is replaced
        await store.put(s0)
        assert await store.get("resp_0", "t1") is not None
    finally:
        if redis_server.proc is None:
            redis_server.start()
        await store.close()


def test_settings_read_redis_url_and_the_app_builds_a_redis_store(monkeypatch, redis_url):
    from gateway.app import create_app

    monkeypatch.delenv("RESPGATE_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert Settings.from_env().redis_url == redis_url
    monkeypatch.setenv("RESPGATE_REDIS_URL", "redis://example:1/0")
    assert Settings.from_env().redis_url == "redis://example:1/0"
    app = create_app(Settings(engine="simulated", redis_url=redis_url, store_ttl_s=60))
    store = app.state.gateway.store
    assert isinstance(store, RedisStore) and store.ttl_ms == 60_000


# -- through two gateways sharing one Redis -------------------------------------------------------


@pytest.fixture
def pair(make_gateway, redis_url) -> tuple[LiveGateway, LiveGateway]:
    return (make_gateway(store=RedisStore.from_url(redis_url)), make_gateway(store=RedisStore.from_url(redis_url)))


def landed(live: LiveGateway, response_id: str) -> None:
    """Wait for the writing gateway's store write (HTTP turns already wait; WS turns do not)."""
    live.call(live.gw.pipeline.finalizer.wait_for(response_id))


class SlowWriter(RedisStore):
    """A store on a slow network: each write takes 200 ms to land."""

    async def put(self, state):
        await asyncio.sleep(0.2)
        await super().put(state)


@pytest.mark.parametrize("stream", [False, True])
def test_an_http_response_is_in_the_shared_store_when_the_client_sees_it_end(make_gateway, redis_url, stream):
    """No waiting on the writer: the next request goes straight to the other replica."""
    import httpx

    a = make_gateway(store=SlowWriter.from_url(redis_url))
    b = make_gateway(store=RedisStore.from_url(redis_url))
    for _ in range(3):
        if stream:
            with httpx.stream(
                "POST", a.base_url + "/responses", timeout=30, json={"model": MODEL, "input": "hello", "stream": True}
            ) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            rid = json.loads(lines[-1][len("data: ") :])["response"]["id"]
        else:
            rid = create(a, input="hello")["id"]
        assert create(b, input="next", previous_response_id=rid)["status"] == "completed"


def fallbacks(live: LiveGateway) -> float:
    return live.metric("respgate_render_full_fallbacks_total", {"reason": "tokens_missing"})


def seen_by_model(live: LiveGateway) -> list[int]:
    return live.engine.stats.prompts[-1]


def test_http_chain_continues_across_gateways(pair):
    a, b = pair
    r1 = create(a, input="the code word is PELICAN")
    landed(a, r1["id"])
    r2 = create(a, input="second", previous_response_id=r1["id"])  # A holds r1's tokens: append
    landed(a, r2["id"])
    assert a.gw.store.token_hits == 1 and fallbacks(a) == 0

    r3 = create(b, input="third", previous_response_id=r2["id"])  # B has only the items: full render
    assert b.gw.store.token_misses == 1 and fallbacks(b) == 1
    landed(b, r3["id"])
    # B prompted the engine with the same history A would have: A's last prompt + its output is a prefix
    assert seen_by_model(b)[: len(seen_by_model(a))] == seen_by_model(a)
    r4 = create(b, input="fourth", previous_response_id=r3["id"])  # now B holds the chain's tokens
    assert b.gw.store.token_hits == 1 and fallbacks(b) == 1
    landed(b, r4["id"])

    r5 = create(a, input="fifth", previous_response_id=r4["id"])  # and back on A: one re-render there
    assert fallbacks(a) == 1 and r5["previous_response_id"] == r4["id"]
    assert r5["usage"]["input_tokens"] > r4["usage"]["input_tokens"]


def test_ws_continues_a_chain_created_over_http_on_another_gateway(pair):
    a, b = pair
    r1 = create(a, input="remember PELICAN")
    landed(a, r1["id"])
    with b.openai().responses.connect() as conn:
        conn.response.create(model=MODEL, input="and then?", previous_response_id=r1["id"])
        r2 = _ws_completed(conn)
        conn.response.create(model=MODEL, input="more", previous_response_id=r2["id"], store=False)
        r3 = _ws_completed(conn)  # resolved from the connection cache: an append, no store read
    assert r2["previous_response_id"] == r1["id"] and r3["previous_response_id"] == r2["id"]
    assert b.gw.store.token_misses == 1 and fallbacks(b) == 1
    assert b.metric("respgate_parent_resolution_total", {"source": "connection"}) == 1
    landed(b, r2["id"])
    # and the WS turn (store=true) is continued over HTTP on A
    r4 = create(a, input="over http again", previous_response_id=r2["id"])
    assert r4["status"] == "completed" and fallbacks(a) == 1


def _ws_completed(conn: Any) -> dict[str, Any]:
    while True:
        ev = json.loads(conn.recv_bytes())
        assert ev["type"] != "error", ev
        if ev["type"] == "response.completed":
            return ev["response"]


def test_retrieve_list_and_delete_through_the_other_gateway(pair):
    a, b = pair
    inputs = [{"type": "message", "role": "user", "content": f"m{i}"} for i in range(5)]
    r1 = create(a, input=inputs)
    landed(a, r1["id"])
    got = httpx.get(f"{b.base_url}/responses/{r1['id']}")
    assert got.status_code == 200 and got.json() == r1

    page = httpx.get(f"{b.base_url}/responses/{r1['id']}/input_items", params={"limit": 2, "order": "asc"}).json()
    assert [i["content"][0]["text"] for i in page["data"]] == ["m0", "m1"] and page["has_more"]
    rest = httpx.get(
        f"{b.base_url}/responses/{r1['id']}/input_items", params={"order": "asc", "after": page["last_id"]}
    ).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["m2", "m3", "m4"] and not rest["has_more"]

    r2 = create(a, input="child", previous_response_id=r1["id"])
    landed(a, r2["id"])
    d = httpx.delete(f"{b.base_url}/responses/{r1['id']}")
    assert d.status_code == 200 and d.json() == {"id": r1["id"], "object": "response", "deleted": True}
    assert_error(httpx.get(f"{a.base_url}/responses/{r1['id']}"), 404)
    assert_error(
        post(a, {"model": MODEL, "input": "x", "previous_response_id": r1["id"]}),
        400,
        code="previous_response_not_found",
    )
    # its descendant still carries the whole context
    r3 = create(b, input="grandchild", previous_response_id=r2["id"])
    assert r3["status"] == "completed" and r3["usage"]["input_tokens"] > r2["usage"]["input_tokens"]


def test_tenants_are_the_same_on_every_replica(make_gateway, redis_url):
    keys = Settings(api_keys=["key-one", "key-two"])
    a = make_gateway(keys, store=RedisStore.from_url(redis_url))
    b = make_gateway(keys, store=RedisStore.from_url(redis_url))
    one, two = {"authorization": "Bearer key-one"}, {"authorization": "Bearer key-two"}
    r = post(a, {"model": MODEL, "input": "mine"}, headers=one)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    landed(a, rid)
    assert httpx.get(f"{b.base_url}/responses/{rid}", headers=one).status_code == 200
    assert_error(httpx.get(f"{b.base_url}/responses/{rid}", headers=two), 404)
    assert_error(
        post(b, {"model": MODEL, "input": "x", "previous_response_id": rid}, headers=two),
        400,
        code="previous_response_not_found",
    )


def test_redis_outage_is_a_clean_503_and_recovery_needs_no_restart(pair, redis_server):
    a, b = pair
    r1 = create(a, input="before the outage")
    landed(a, r1["id"])
    redis_server.stop()
    try:
        err = assert_error(
            post(b, {"model": MODEL, "input": "x", "previous_response_id": r1["id"]}),
            503,
            code="server_is_overloaded",
            type_="server_error",
        )
        assert "retry" in err["message"].lower()
        assert_error(
            httpx.get(f"{b.base_url}/responses/{r1['id']}"), 503, code="server_is_overloaded", type_="server_error"
        )
        # non-chained requests keep being served; a store=true one cannot be kept, so it is never
        # reported completed (it fails: "could not be stored"), a store=false one completes
        plain = create(b, input="no parent needed")
        assert plain["status"] == "failed" and "could not be stored" in plain["error"]["message"]
        assert create(b, input="not kept", store=False)["status"] == "completed"
        with b.openai().responses.connect() as conn:
            conn.response.create(model=MODEL, input="x", previous_response_id=r1["id"])
            ev = json.loads(conn.recv_bytes())
            assert ev["type"] == "error" and ev["status"] == 503 and ev["error"]["code"] == "server_is_overloaded"
            conn.response.create(model=MODEL, input="fine", store=False)
            assert _ws_completed(conn)["status"] == "completed"
    finally:
        redis_server.start()
    r2 = create(a, input="after the outage")  # a fresh, empty server: a new chain works across replicas
    landed(a, r2["id"])
    wait_for(lambda: b.call(b.gw.store.get(r2["id"])) is not None, what="the write on A")
    r3 = create(b, input="continued", previous_response_id=r2["id"])
    assert r3["status"] == "completed"


async def test_a_tenants_flood_of_chains_leaves_anothers_cached_tokens_and_context(redis_url):
    """The process-local caches hold each tenant to its share (issue 29 item 3): tenant t2 writing
    forty one-response chains churns its own, while t1's chain (within its share) stays cached, so
    t1's next read still costs one round trip and needs no full render."""
    store = RedisStore.from_url(redis_url, token_cache_bytes=TOKEN_BYTES * 100, chain_cache_bytes=4000)
    try:
        mine = chain(2)  # one buffer of 20 tokens, context charged 200
        for s in mine:
            await store.put(s)
        for k in range(40):
            await store.put(chain(1, tenant="t2", name=f"flood{k}")[0])
        assert store.tokens.nbytes <= TOKEN_BYTES * 100 and store.chains.nbytes <= 4000
        hits = store.chain_hits
        got = await store.get("resp_1", "t1")
        assert got.prelude_key != b"" and store.chain_hits == hits + 1
        assert store.tokens.tenant_nbytes("t1") == TOKEN_BYTES * 20
    finally:
        await store.close()
