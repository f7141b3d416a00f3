"""Redis Cluster: every multi-key step stays in one hash slot, and respgate runs on a real cluster.

Two kinds of evidence. The *slot rule* test drives every Redis consumer (response store,
conversations, background event logs and leases, ledger, key store, rate limiter, flag sink)
through every operation on a plain server while recording each command redis-py sends, and
checks with redis-py's ``key_slot`` that each script, each multi-key command and each transaction
names keys of one slot — so a future key that breaks the layout fails here, on the fast path,
with the offending keys in the message. A companion test checks that every Redis consumer in the
product is one this test drives and builds its client through ``cache.redis_client``.

Then the same operations, and two gateways, run on a three-master Valkey cluster started by the
test (``tests/redis_cluster.py``): the server itself refuses a cross-slot script or command, and
the client must follow the slot map. A chain continues across the gateways over HTTP and over
WebSocket, conversations and background responses (poll, resume, cancel from the other replica)
work, chains spread over the nodes, and the ledger counts a replayed usage record once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import redis.asyncio.client as aioclient
from redis.crc import key_slot

from billing.ledger import DEFAULT_STREAM, RedisLedger, marker_key, shard_of, shard_streams
from billing.report import iter_ledger
from billing.usage import MemorySink
from cache.conversations import Limits
from cache.event_log import LoggedEvent, RedisEventLog
from cache.leases import RedisLeases
from cache.redis_client import ClusterClient, connect, is_cluster
from cache.redis_conversations import RedisConversationStore
from cache.redis_response_store import RedisStore
from gateway.base.settings import Settings
from security.flags import FlagRecord, RedisFlagSink
from security.keys import RedisKeyStore, new_record
from security.token_buckets import Quota, RedisRateLimiter
from tests.billing.test_billing import record
from tests.cache.test_redis_store import chain, item
from tests.conftest import MODEL, LiveGateway
from tests.gateway.sessions.test_background import engine, events_of, poll_until_done
from tests.http_helpers import create, wait_for
from tests.redis_cluster import RedisCluster, redis_cluster, redis_cluster_url  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]


# -- every Redis operation respgate does ----------------------------------------------------------


async def exercise(url: str) -> None:
    """Every operation of every Redis consumer, once (asserting it did its job, so a no-op cannot pass)."""
    store = RedisStore.from_url(url)
    try:
        states = chain(4)
        for s in states:
            await store.put(s)
        got = await store.get("resp_3", "t1")
        assert got is not None and list(got.context) == list(states[3].context)
        found = await store.items(["msg_in0", "msg_out2", "msg_unknown"], "t1")
        assert {k: v.response_id for k, v in found.items()} == {"msg_in0": "resp_0", "msg_out2": "resp_2"}
        assert await store.delete("resp_1", "t1") and await store.delete("resp_3", "t1")  # tombstone, leaf
        assert await store.get("resp_2", "t1") is not None and await store.get("resp_1", "t1") is None
    finally:
        await store.close()

    convs = RedisConversationStore.from_url(url, Limits(max_items=100, max_bytes=1 << 20))
    try:
        await convs.create("conv_1", "t1", {"k": "v"}, [item("a")])
        await convs.append("conv_1", "t1", [item("b"), item("c")])
        await convs.append("conv_1", "t1", [item("c"), item("d")], force=True)
        conv, items = await convs.items("conv_1", "t1")
        assert [i["id"] for i in items] == ["msg_a", "msg_b", "msg_c", "msg_d"] and conv.count == 4
        page = await convs.page("conv_1", "t1", after="msg_a", limit=2, order="asc")
        assert [i["id"] for i in page.items] == ["msg_b", "msg_c"] and page.has_more
        assert (await convs.item("conv_1", "t1", "msg_b"))["id"] == "msg_b"
        assert (await convs.delete_item("conv_1", "t1", "msg_b")).count == 3
        assert (await convs.update("conv_1", "t1", {"k": "w"})).metadata == {"k": "w"}
        assert (await convs.get("conv_1", "t1")).metadata == {"k": "w"}
        assert await convs.delete("conv_1", "t1")
    finally:
        await convs.close()

    client = connect(url, socket_timeout=5.0)
    try:
        log = RedisEventLog(client, max_bytes=10, ttl_s=60)
        writer = log.writer("resp_bg")
        for seq in range(5):
            writer.append(LoggedEvent(seq, "t", b"{}", seq == 4))
        await writer.close()
        assert writer.failures == 0 and (await log.bounds("resp_bg"))[1:] == (4, True)
        await log.append("resp_bg2", [LoggedEvent(0, "t", b"a", False), LoggedEvent(1, "t", b"b", True)])

        async def ended() -> bool:
            return True

        assert [e.data async for e in log.follow("resp_bg2", -1, ended)] == [b"a", b"b"]

        a, b = RedisLeases(client, lease_s=0.05), RedisLeases(client, lease_s=30)
        await a.acquire("resp_x", {"tenant": "t1", "model": "m"})
        await b.acquire("resp_y", {"tenant": "t1", "model": "m"})
        assert await a.renew(["resp_x", "resp_gone"]) == ["resp_gone"]
        assert await b.alive("resp_y") and (await b.info("resp_y"))["owner"] == b.owner
        await asyncio.sleep(0.1)  # resp_x's lease lapses (no timing is asserted: claim decides)
        assert "resp_x" in await b.expired() and await b.claim("resp_x") and not await a.claim("resp_x")
        await b.forget("resp_x")
        assert await a.request_cancel("resp_y") == b.owner and await b.next_cancel(1.0) == "resp_y"
        await b.release("resp_y")
        assert await b.alive("resp_y") is None
    finally:
        await client.aclose()

    ledger = RedisLedger(url, "respgate:usage")
    try:
        await ledger.write_batch([record(1), record(2)])
        await ledger.write_batch([record(2), record(3)])
        assert ledger.appended == 3
    finally:
        await ledger.close()
    sharded = RedisLedger(url, "respgate:usage-sharded", shards=4, retention_s=3600)  # a script per shard
    try:
        await sharded.write_batch([record(i) for i in range(10)])
        await sharded.write_batch([record(i) for i in range(12)])
        assert sharded.appended == 12
    finally:
        await sharded.close()

    keys = RedisKeyStore.from_url(url)
    try:
        _, rec = new_record("acme", "ci")
        await keys.add(rec)
        assert (await keys.lookup(rec.hash)) == rec and [r.id for r in await keys.list()] == [rec.id]
        assert await keys.count_active() == 1
        assert (await keys.revoke(rec.id)).revoked_at is not None and await keys.count_active() == 0
    finally:
        await keys.close()

    limiter = RedisRateLimiter.from_url(url)
    try:
        assert (await limiter.acquire("key_1", Quota(rpm=10, tpm=1000), requests=1, tokens=10)).allowed
        await limiter.adjust("key_1", Quota(rpm=10, tpm=1000), 5)
    finally:
        await limiter.close()

    flags = RedisFlagSink(url, "respgate:flags")
    try:
        await flags.write(
            [
                FlagRecord("flag", "c", 0.5, "s", f"resp_{i}", None, "t1", "m", "http", 0, None, None, None, None)
                for i in range(2)
            ]
        )
    finally:
        await flags.close()


class Recorder:
    """Every command the asyncio client sends, grouped as Redis runs it: a command alone, or a
    transaction (``MULTI``) whole; a plain pipeline's commands each count alone."""

    def __init__(self) -> None:
        self.groups: list[tuple[str, list[tuple[Any, ...]]]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        command, execute = aioclient.Redis.execute_command, aioclient.Pipeline.execute
        recorder = self

        async def recorded_command(client: Any, *args: Any, **options: Any) -> Any:
            recorder.groups.append(("command", [args]))
            return await command(client, *args, **options)

        async def recorded_execute(pipe: Any, raise_on_error: bool = True) -> Any:
            stack = [args for args, _ in pipe.command_stack]
            if pipe.is_transaction or pipe.explicit_transaction:
                recorder.groups.append(("multi", stack))
            else:
                recorder.groups.extend(("command", [args]) for args in stack)
            return await execute(pipe, raise_on_error)

        monkeypatch.setattr(aioclient.Redis, "execute_command", recorded_command)
        monkeypatch.setattr(aioclient.Pipeline, "execute", recorded_execute)


def command_keys(parser: Any, conn: redis.Redis, args: tuple[Any, ...]) -> list[Any]:
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        return list(args[3 : 3 + int(args[2])])
    return list(parser.get_keys(conn, *args) or [])


def test_every_multi_key_operation_names_keys_of_one_slot(redis_url, monkeypatch):
    from redis._parsers import CommandsParser

    recorder = Recorder()
    recorder.install(monkeypatch)
    asyncio.run(exercise(redis_url))
    monkeypatch.undo()

    conn = redis.Redis.from_url(redis_url)
    parser = CommandsParser(conn)
    spans: list[tuple[str, list[Any]]] = []
    for kind, commands in recorder.groups:
        keys = [k for args in commands for k in command_keys(parser, conn, args)]
        if len(keys) > 1:
            spans.append((f"{kind} {' '.join(str(args[0]) for args in commands)}", keys))
    crossing = [(what, keys) for what, keys in spans if len({key_slot(_b(k)) for k in keys}) > 1]
    assert not crossing, "multi-key operations across slots:\n" + "\n".join(f"{w}: {k}" for w, k in crossing)
    # no MULTI anywhere (cache.redis_client: atomic steps are scripts)
    assert not [c for kind, c in recorder.groups if kind == "multi"]
    # and the enumeration really covered the multi-key steps: the chain write and read (a record
    # and its chain), the conversation's three keys, the ledger's stream + markers, both lease keys
    widest = Counter()
    for what, keys in spans:
        widest[what.split()[1]] = max(widest[what.split()[1]], len(keys))
    assert widest["EVALSHA"] >= 2 and widest["DEL"] == 3, widest
    joined = [b"|".join(_b(k) for k in keys) for _, keys in spans]
    assert any(b"r:{resp_0}:resp_3" in j and b"c:{resp_0}" in j for j in joined)  # a chain write / read
    # a store write is O(1) keys whatever the chain's depth: no script names an ancestor's record
    assert not [j for j in joined if j.count(b"respgate:r:") > 1]
    assert any(b"{respgate:usage}:seen:" in j for j in joined)  # ledger batch
    assert any(b"{bg}:run" in j and b"{bg}:info" in j for j in joined)  # lease release


def _b(key: Any) -> bytes:
    return key if isinstance(key, bytes) else str(key).encode()


#: every module that talks to Redis, each driven by ``exercise`` above (add a new one there)
CONSUMERS = {
    "cache/redis_response_store.py",
    "cache/redis_conversations.py",
    "billing/ledger.py",
    "billing/report.py",
    "security/keys.py",
    "security/token_buckets.py",
    "security/flags.py",
    "gateway/sessions/replicas.py",
    "gateway/ops/check.py",
    "cache/redis_resumable.py",
}


def test_every_redis_client_is_built_by_cache_redis_client():
    """A client built elsewhere would be standalone-only, and a new consumer would escape the slot test."""
    direct, users = [], set()
    for path in sorted(REPO.glob("[a-z]*/**/*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("tests/", "benchmarks/", ".venv")) or rel == "cache/redis_client.py":
            continue
        text = path.read_text()
        if re.search(r"\bRedis(Cluster)?(\.from_url)?\(", text):
            direct.append(rel)
        if "redis_client import" in text and "connect" in text.split("redis_client import", 1)[1].split("\n")[0]:
            users.add(rel)
    assert not direct, f"Redis clients built outside cache/redis_client.py: {direct}"
    assert users == CONSUMERS, users ^ CONSUMERS


#: the consumers on a request's path, whose client is the stores' (``connect_store``)
STORES = {
    "cache/redis_response_store.py",
    "cache/redis_conversations.py",
    "cache/redis_resumable.py",
    "gateway/sessions/replicas.py",
    "security/keys.py",
    "security/token_buckets.py",
}


def test_the_stores_options_are_written_once_in_connect_store():
    """Timeouts and retry policy by hand in a consumer drift from the others (issue 29): the stores
    take ``connect_store``'s, and no product module but ``cache/redis_client.py`` builds a ``Retry``
    with a backoff of its own (the ledger's is ``NoBackoff``: no retry, on purpose)."""
    by_hand, stores = [], set()
    for path in sorted(REPO.glob("[a-z]*/**/*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("tests/", "benchmarks/", ".venv")) or rel == "cache/redis_client.py":
            continue
        text = path.read_text()
        if "ExponentialBackoff" in text:
            by_hand.append(rel)
        if re.search(r"\bconnect_store\(", text):
            stores.add(rel)
    assert not by_hand, f"the stores' retry written by hand outside cache/redis_client.py: {by_hand}"
    assert stores == STORES, stores ^ STORES
    url = "redis://127.0.0.1:1/0"  # nothing connects: the options are read off the pool
    for client in (
        RedisStore.from_url(url).redis,
        RedisConversationStore.from_url(url).redis,
        RedisKeyStore.from_url(url).redis,
        RedisRateLimiter.from_url(url).redis,
    ):
        options = client.connection_pool.connection_kwargs
        assert (options["socket_connect_timeout"], options["socket_timeout"]) == (2.0, 5.0)
        assert options["retry"]._retries == 1


def test_cluster_urls_and_the_prefix_rule():
    assert is_cluster("redis+cluster://h:7000") and is_cluster("rediss+cluster://h:7000")
    assert not is_cluster("redis://h:6379/0") and not is_cluster("rediss://h:6379")
    assert isinstance(connect("redis+cluster://127.0.0.1:1"), ClusterClient)
    with pytest.raises(ValueError, match="database number"):
        connect("redis+cluster://127.0.0.1:1/2")
    with pytest.raises(ValueError, match="braces"):
        RedisStore.from_url("redis://127.0.0.1:1/0", prefix="{app}:")


# -- on a real cluster ----------------------------------------------------------------------------


def test_every_operation_runs_on_a_three_master_cluster(redis_cluster_url, redis_cluster):
    asyncio.run(exercise(redis_cluster_url))
    keys = redis_cluster.keys()
    # a chain's records and its chain hash share their root's slot; the ledger's markers the stream's
    chain_keys = [k for k in keys if k.startswith((b"respgate:r:", b"respgate:c:"))]
    assert len(chain_keys) == 3 and len({key_slot(k) for k in chain_keys}) == 1, chain_keys
    markers = [k for k in keys if k.startswith(b"{respgate:usage}:seen:")]
    assert len(markers) == 3 and {key_slot(k) for k in markers} == {key_slot(b"respgate:usage")}


async def _chains_on_nodes(url: str, cluster: RedisCluster, n: int) -> dict[int, int]:
    store = RedisStore.from_url(url)
    try:
        for c in range(n):
            for s in chain(3, name=f"resp_c{c}"):
                await store.put(s)
            assert await store.get(f"resp_c{c}_2", "t1") is not None
    finally:
        await store.close()
    per_node: dict[int, int] = {}
    for port in cluster.ports:
        with redis.Redis(host="127.0.0.1", port=port) as node:
            per_node[port] = len(node.keys("respgate:r:*"))
    return per_node


def test_chains_spread_over_the_nodes(redis_cluster_url, redis_cluster):
    per_node = asyncio.run(_chains_on_nodes(redis_cluster_url, redis_cluster, 30))
    assert sum(per_node.values()) == 90 and all(per_node.values()), per_node  # 30 random roots: every node


@pytest.fixture
def pair(make_gateway, redis_cluster_url, tmp_path) -> tuple[LiveGateway, LiveGateway]:
    return tuple(
        make_gateway(Settings(redis_url=redis_cluster_url, usage_journal=str(tmp_path / name))) for name in ("a", "b")
    )  # type: ignore[return-value]


def landed(live: LiveGateway, response_id: str) -> None:
    live.call(live.gw.pipeline.finalizer.wait_for(response_id))


def fallbacks(live: LiveGateway) -> float:
    return live.metric("respgate_render_full_fallbacks_total", {"reason": "tokens_missing"})


def _ws_completed(conn: Any) -> dict[str, Any]:
    while True:
        ev = json.loads(conn.recv_bytes())
        assert ev["type"] != "error", ev
        if ev["type"] == "response.completed":
            return ev["response"]


def test_http_chain_continues_across_gateways_on_the_cluster(pair, redis_cluster_url):
    a, b = pair
    assert isinstance(a.gw.store, RedisStore) and isinstance(a.gw.store.redis, ClusterClient)
    r1 = create(a, input="the code word is PELICAN")
    landed(a, r1["id"])
    r2 = create(b, input="second", previous_response_id=r1["id"])  # B has only the items: full render
    assert r2["status"] == "completed" and r2["previous_response_id"] == r1["id"]
    assert b.gw.store.token_misses == 1 and fallbacks(b) == 1
    # B prompted the engine with the history A built: A's prompt is a prefix of B's
    assert b.engine.stats.prompts[-1][: len(a.engine.stats.prompts[-1])] == a.engine.stats.prompts[-1]
    landed(b, r2["id"])
    r3 = create(a, input="third", previous_response_id=r2["id"])
    assert r3["usage"]["input_tokens"] > r2["usage"]["input_tokens"] > r1["usage"]["input_tokens"]
    got = httpx.get(f"{b.base_url}/responses/{r3['id']}")
    assert got.status_code == 200 and got.json()["id"] == r3["id"]
    assert httpx.delete(f"{b.base_url}/responses/{r1['id']}").status_code == 200
    assert httpx.get(f"{a.base_url}/responses/{r1['id']}").status_code == 404
    assert create(b, input="fourth", previous_response_id=r3["id"])["status"] == "completed"  # tombstone holds
    # the whole chain lives in one slot; the usage ledger (on the cluster too) has each response once
    pointers = [
        json.loads(v)
        for v in (
            redis.RedisCluster.from_url("redis://" + redis_cluster_url.split("://")[1]).get(f"respgate:p:{rid}")
            for rid in (r2["id"], r3["id"])
        )
    ]
    assert {p["root"] for p in pointers} == {r1["id"]}
    wanted = {r1["id"], r2["id"], r3["id"]}
    ledger = wait_for(
        lambda: (got := [r.response_id for r in iter_ledger(redis_cluster_url)]) and wanted <= set(got) and got,
        what="usage records on the cluster",
    )
    assert len(ledger) == len(set(ledger))


def test_ws_chain_continues_across_gateways_on_the_cluster(pair):
    a, b = pair
    with a.openai().responses.connect() as conn:
        conn.response.create(model=MODEL, input="remember PELICAN")
        r1 = _ws_completed(conn)
    landed(a, r1["id"])
    with b.openai().responses.connect() as conn:
        conn.response.create(model=MODEL, input="and then?", previous_response_id=r1["id"])
        r2 = _ws_completed(conn)
        conn.response.create(model=MODEL, input="more", previous_response_id=r2["id"], store=False)
        r3 = _ws_completed(conn)  # from the connection's cache
    assert r2["previous_response_id"] == r1["id"] and r3["previous_response_id"] == r2["id"]
    assert b.gw.store.token_misses == 1 and fallbacks(b) == 1
    assert b.engine.stats.prompts[-2][: len(a.engine.stats.prompts[-1])] == a.engine.stats.prompts[-1]
    landed(b, r2["id"])
    r4 = create(a, input="over http", previous_response_id=r2["id"])
    assert r4["status"] == "completed" and r4["usage"]["input_tokens"] > r2["usage"]["input_tokens"]


def test_conversations_on_the_cluster(pair):
    a, b = pair
    ca, cb = a.openai(), b.openai()
    conv = ca.conversations.create(items=[{"type": "message", "role": "user", "content": "code word HELIOTROPE"}])
    ca.responses.create(model=MODEL, input="first", conversation=conv.id)
    r2 = cb.responses.create(model=MODEL, input="second", conversation=conv.id)
    assert r2.status == "completed"
    ids_a = [i.id for i in ca.conversations.items.list(conv.id, order="asc")]
    ids_b = [i.id for i in cb.conversations.items.list(conv.id, order="asc")]
    assert ids_a == ids_b and len(ids_a) == 1 + 2 * 3
    cb.conversations.delete(conv.id)
    with pytest.raises(openai.NotFoundError):
        ca.conversations.retrieve(conv.id)


def test_background_polls_resumes_and_cancels_across_gateways_on_the_cluster(make_gateway, redis_cluster_url):
    from inference.simulated_script import Turn

    settings = Settings(redis_url=redis_cluster_url, background_lease_s=3)
    a = make_gateway(settings, engine=engine(0.01), usage_sink=MemorySink())
    b = make_gateway(settings, engine=engine(0.01), usage_sink=MemorySink())
    on_a, on_b = a.openai(), b.openai()
    stream = on_a.responses.create(model=MODEL, input="stream it", background=True, stream=True)
    first = []
    for ev in stream:
        first.append(ev.model_dump(mode="json"))
        if len(first) == 4:
            break
    stream.close()
    rid = first[0]["response"]["id"]
    tail = events_of(on_b.responses.retrieve(rid, stream=True, starting_after=3))  # from the cluster's stream
    assert tail[-1]["type"] == "response.completed"
    final, _ = poll_until_done(on_b, rid)
    assert final.status == "completed"
    assert events_of(on_b.responses.retrieve(rid, stream=True)) == first + tail

    a.engine.script = lambda view: Turn(text="word " * 200, delay_per_token_s=0.05, endless=True)
    running = on_a.responses.create(model=MODEL, input="long", background=True, stream=True)
    rid2 = next(iter(running)).response.id
    wait_for(lambda: on_b.responses.retrieve(rid2).status == "in_progress", what="in_progress on B")
    assert on_b.responses.cancel(rid2).status == "cancelled"  # through A's cancel list on the cluster
    assert a.engine.stats.aborts == 1
    rest = [ev.model_dump(mode="json") for ev in running]
    assert rest[-1]["response"]["status"] == "cancelled"


async def _ledger_twice(url: str) -> tuple[int, int, int]:
    first, again = RedisLedger(url), RedisLedger(url)  # two replicas, or a journal replay
    try:
        await first.write_batch([record(1), record(2)])
        await again.write_batch([record(2)])  # the same usage record, submitted again
        await again.write_batch([record(1), record(3), record(3)])
        return first.appended, again.appended, await first.redis.xlen("respgate:usage")
    finally:
        await first.close()
        await again.close()


def test_ledger_counts_a_record_once_on_the_cluster(redis_cluster_url):
    assert asyncio.run(_ledger_twice(redis_cluster_url)) == (2, 1, 3)
    assert [r.response_id for r in iter_ledger(redis_cluster_url)] == ["resp_1", "resp_2", "resp_3"]
    assert key_slot(marker_key("respgate:usage", "resp_1").encode()) == key_slot(b"respgate:usage")


async def _sharded_ledger_twice(url: str) -> tuple[int, int]:
    first, again = RedisLedger(url, shards=4), RedisLedger(url, shards=4)  # two replicas, or a restart
    try:
        batch = [record(i) for i in range(40)]
        await first.write_batch(batch)
        await again.write_batch([*batch[::3], record(100), record(100)])  # a replay, one new record twice
        return first.appended, again.appended
    finally:
        await first.close()
        await again.close()


def test_a_sharded_ledger_spreads_over_the_cluster_nodes_and_counts_a_record_once(redis_cluster_url, redis_cluster):
    """Four shards land on all three masters (each with its own markers, so every shard's script is
    one slot on one node: the server would refuse it otherwise), and a replay counts nothing twice."""
    assert asyncio.run(_sharded_ledger_twice(redis_cluster_url)) == (40, 1)
    streams = shard_streams(DEFAULT_STREAM, 4)
    on_node: dict[int, set[str]] = {}
    for port in redis_cluster.ports:
        with redis.Redis(host="127.0.0.1", port=port, decode_responses=True) as node:
            held = set(node.keys("*"))  # what this node holds (asking for another node's key is MOVED)
            for stream in streams:
                if stream in held:
                    on_node.setdefault(port, set()).add(stream)
                    assert {marker_key(stream, f["response_id"]) for _, f in node.xrange(stream)} <= held
    assert set(on_node) == set(redis_cluster.ports), on_node  # every node holds a shard
    assert sum(len(v) for v in on_node.values()) == 4
    ids = [r.response_id for r in iter_ledger(redis_cluster_url, shards=4)]
    assert sorted(ids) == sorted([f"resp_{i}" for i in range(40)] + ["resp_100"])
    assert len({shard_of(i, 4) for i in ids}) == 4
