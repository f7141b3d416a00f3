"""The Redis response store: ``store=true`` responses shared by every replica and connection.

Layout: one hash per response, ``{prefix}r:{id}``, holding everything needed to serve it and to
chain from it — the Response object, its own input items (``input_items`` pagination), its
*context delta* (the items it added on top of its parent: its input + its output, never the whole
context), its tenant, its prelude key, and a small ``meta`` blob (parent, ancestors, model, pending
calls, flag bit, byte counts). The hash is its own index: ``DELETE`` is one key.

Why deltas plus an ancestor list: storing each response's full context would make every write
O(history) bytes and a chain O(n²) in Redis. Each record instead lists its ancestors' ids (oldest
first), so hydrating a response is two round trips whatever the chain's depth: read the record,
then pipeline-read every ancestor's delta. O(history) bytes on this path is expected (it is the
cross-replica path; a WebSocket connection's own cache stays O(new input)).

Ancestors must outlive descendants, so a write refreshes the TTL of every ancestor (same
transaction): a chain expires together with its newest response. ``DELETE`` of a response that has
descendants leaves a tombstone — the Response object and input items are removed, so it can no
longer be retrieved, listed or chained from, but its delta stays so descendants still hydrate; a
response without descendants is removed outright. If an ancestor is nonetheless gone (Redis
evicted it under memory pressure, or a race with a delete) ``get`` returns None: the client gets
``previous_response_not_found``, never a silently truncated context.

Items by id: ``{prefix}i:{tenant tag}:{item id}`` holds ``[response id, position]`` of the stored
response that first held the item among its own items (input, then output), written with ``NX`` in
the response's write transaction (O(new items)) and expiring with the store's TTL from that write.
The tenant tag (a digest of the tenant) is part of the key, so another tenant's lookup misses like
an unknown id. A lookup is one pipelined ``GET`` per id plus one read of each home response.

Rendered token ids stay process-local (``TokenCache``): they are large (4 bytes a token packed, many
per item) and only useful to the process whose renderer made them. A miss hydrates the
items with empty ``history_ids`` and ``prelude_key=b""``, which the pipeline renders in full once
(counted), after which this process holds the chain's tokens again.

Redis Cluster: not supported as is. The one Lua script (``DELETE``) touches a single key, so it is
slot-safe; but a write is a MULTI transaction over the new record *and its ancestors* (the parent's
``kids`` count, every ancestor's TTL), and ``get`` reads all ancestors — keys named by response id,
so a chain spreads over many slots and Cluster would refuse the transaction (CROSSSLOT). Making it
Cluster-safe means tagging keys with their chain's root (``<prefix>r:{<root id>}:<id>``), which needs
the root at every lookup by id (another key or an id format change): a format change left for
when Cluster is needed. Use a standalone Redis/Valkey (with replicas or Sentinel for failover).

Redis errors become ``StoreUnavailable`` (the gateway answers 503), so an outage is a clear,
retryable error and never a "not found".
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Sequence

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from cache.items import ItemLog
from cache.seq import TOKEN_BYTES, TokenSeq
from cache.state import ResponseState
from cache.store import StoredItem, StoreUnavailable, index_keys

_FIELDS = ("tenant", "deleted", "meta", "response", "input", "delta", "pk")

# Tenant check and delete (or tombstone) in one atomic step; see the module docstring.
_DELETE_LUA = """
local r = redis.call('HMGET', KEYS[1], 'tenant', 'deleted', 'kids')
if not r[1] or r[1] ~= ARGV[1] or r[2] then return 0 end
if r[3] and tonumber(r[3]) > 0 then
  redis.call('HDEL', KEYS[1], 'response', 'input')
  redis.call('HSET', KEYS[1], 'deleted', '1')
else
  redis.call('DEL', KEYS[1])
end
return 1
"""


class TokenCache:
    """Process-local LRU: response id -> its ``history_ids`` view (no copy), bounded in bytes.

    Views of one chain share one buffer, so charging each entry its own length would count the
    same tokens many times over. Bytes are charged per distinct buffer instead: a buffer costs its
    length (measured when an entry over it is added; buffers only grow) until no entry refers to it.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, TokenSeq] = OrderedDict()
        #: id(buffer) -> [entries referring to it, tokens charged for it]
        self._bufs: dict[int, list[int]] = {}
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> TokenSeq | None:
        seq = self._entries.get(response_id)
        if seq is not None:
            self._entries.move_to_end(response_id)
        return seq

    def put(self, response_id: str, seq: TokenSeq) -> None:
        self.discard(response_id)
        buf = seq._buf  # the shared buffer: same package, deliberately read for accounting
        ref = self._bufs.setdefault(id(buf), [0, 0])
        ref[0] += 1
        self.nbytes += TOKEN_BYTES * (len(buf) - ref[1])
        ref[1] = len(buf)
        self._entries[response_id] = seq
        while self.nbytes > self.max_bytes and self._entries:
            self._release(self._entries.popitem(last=False)[1])
            self.evictions += 1

    def discard(self, response_id: str) -> None:
        seq = self._entries.pop(response_id, None)
        if seq is not None:
            self._release(seq)

    def clear(self) -> None:
        self._entries.clear()
        self._bufs.clear()
        self.nbytes = 0

    def _release(self, seq: TokenSeq) -> None:
        key = id(seq._buf)
        ref = self._bufs[key]
        ref[0] -= 1
        if ref[0] == 0:
            self.nbytes -= TOKEN_BYTES * ref[1]
            del self._bufs[key]


class RedisStore:
    """``ResponseStore`` over redis-py asyncio; see the module docstring for the layout and choices."""

    shared = True

    def __init__(self, client: aioredis.Redis, *, ttl_s: float = 86400.0,
                 token_cache_bytes: int = 256 * 1024 * 1024, prefix: str = "respgate:") -> None:
        self.redis = client
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.prefix = prefix
        self.tokens = TokenCache(token_cache_bytes)
        #: hydrations that found / did not find this process's token ids (exported as metrics later)
        self.token_hits = 0
        self.token_misses = 0
        self._delete = client.register_script(_DELETE_LUA)

    @classmethod
    def from_url(cls, url: str, *, ttl_s: float = 86400.0, token_cache_bytes: int = 256 * 1024 * 1024,
                 prefix: str = "respgate:", **client_kwargs: Any) -> "RedisStore":
        # Short timeouts and one quick retry: a stale pooled connection after a Redis restart is
        # retried once, but an outage surfaces in milliseconds (as a 503), not after seconds of backoff.
        client_kwargs.setdefault("socket_connect_timeout", 2.0)
        client_kwargs.setdefault("socket_timeout", 5.0)
        client_kwargs.setdefault("retry", Retry(ExponentialBackoff(cap=0.05, base=0.01), 1))
        return cls(aioredis.Redis.from_url(url, **client_kwargs), ttl_s=ttl_s,
                   token_cache_bytes=token_cache_bytes, prefix=prefix)

    def _key(self, response_id: str) -> str:
        return f"{self.prefix}r:{response_id}"

    def _item_key(self, tenant: str | None, item_id: str) -> str:
        tag = hashlib.blake2b(orjson.dumps(tenant), digest_size=8).hexdigest()
        return f"{self.prefix}i:{tag}:{item_id}"

    async def put(self, state: ResponseState) -> None:
        try:
            await self._put(state)
        except RedisError as exc:
            raise StoreUnavailable(f"response store write failed: {exc}") from exc
        if state.prelude_key and len(state.history_ids):
            self.tokens.put(state.id, state.history_ids)

    async def _put(self, state: ResponseState) -> None:
        ancestors: list[str] = []
        start = 0
        if state.parent_id is not None:
            raw = await self.redis.hget(self._key(state.parent_id), "meta")
            parent = orjson.loads(raw) if raw is not None else None
            if parent is not None and parent["clen"] <= len(state.context):
                ancestors, start = [*parent["ancestors"], state.parent_id], parent["clen"]
            # else: the parent is not in Redis (a store=false WebSocket turn, or expired): this
            # record stands alone, its delta is the whole context (rare, and still correct)
        meta = {
            "parent_id": state.parent_id, "root_id": state.root_id, "ancestors": ancestors, "clen": len(state.context),
            "model": state.model,
            "pending_calls": sorted(state.pending_calls), "flagged": state.flagged, "store": state.store,
            "nbytes": state.nbytes, "delta_bytes": state.delta_bytes, "created": state.created,
        }
        key = self._key(state.id)
        tx = self.redis.pipeline(transaction=True)
        tx.hset(key, mapping={
            "tenant": orjson.dumps(state.tenant), "meta": orjson.dumps(meta), "pk": state.prelude_key,
            "response": orjson.dumps(state.response), "input": orjson.dumps(list(state.input_items)),
            "delta": orjson.dumps(state.context[start:]),
        })
        tx.pexpire(key, self.ttl_ms)
        for item_key, side, pos in index_keys(state):
            tx.set(self._item_key(state.tenant, item_key), orjson.dumps([state.id, side, pos]), nx=True,
                   px=self.ttl_ms)
        if ancestors:
            tx.hincrby(self._key(ancestors[-1]), "kids", 1)
        for ancestor in ancestors:  # a chain expires with its newest response
            tx.pexpire(self._key(ancestor), self.ttl_ms)
        await tx.execute()

    async def get(self, response_id: str, tenant: str | None = None) -> ResponseState | None:
        try:
            return await self._get(response_id, tenant)
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc

    async def _get(self, response_id: str, tenant: str | None) -> ResponseState | None:
        raw_tenant, deleted, raw_meta, response, inputs, delta, pk = await self.redis.hmget(
            self._key(response_id), _FIELDS)
        if raw_meta is None or response is None or deleted is not None or orjson.loads(raw_tenant) != tenant:
            return None
        meta = orjson.loads(raw_meta)
        items: list[dict[str, Any]] = []
        if meta["ancestors"]:
            reads = self.redis.pipeline(transaction=False)
            for ancestor in meta["ancestors"]:
                reads.hget(self._key(ancestor), "delta")
            for chunk in await reads.execute():
                if chunk is None:
                    return None  # an ancestor is gone: refuse rather than hydrate a truncated context
                items.extend(orjson.loads(chunk))
        items.extend(orjson.loads(delta))
        history = self.tokens.get(response_id)
        if history is not None:
            self.token_hits += 1
        else:
            self.token_misses += 1
        return ResponseState(
            id=response_id, response=orjson.loads(response), input_items=tuple(orjson.loads(inputs)),
            context=ItemLog(items), history_ids=history if history is not None else TokenSeq(),
            model=meta["model"], prelude_key=pk if history is not None else b"", store=meta["store"],
            # a record from before roots were kept: its oldest stored ancestor stands in
            parent_id=meta["parent_id"], root_id=meta.get("root_id") or (meta["ancestors"] or [None])[0],
            pending_calls=frozenset(meta["pending_calls"]), flagged=meta["flagged"],
            tenant=tenant, nbytes=meta["nbytes"], delta_bytes=meta["delta_bytes"], created=meta["created"],
        )

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        try:
            deleted = await self._delete(keys=[self._key(response_id)], args=[orjson.dumps(tenant)])
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc
        if deleted:
            self.tokens.discard(response_id)
        return bool(deleted)

    async def items(self, item_ids: Sequence[str], tenant: str | None = None) -> dict[str, StoredItem]:
        if not item_ids:
            return {}
        try:
            return await self._items(item_ids, tenant)
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc

    async def _items(self, item_ids: Sequence[str], tenant: str | None) -> dict[str, StoredItem]:
        homes = await self.redis.mget([self._item_key(tenant, i) for i in item_ids])
        where = {i: orjson.loads(h) for i, h in zip(item_ids, homes) if h is not None}
        # per home response, only the list that holds the items: the Response for outputs
        wanted = sorted({(rid, "response" if side == "output" else "input") for rid, side, _ in where.values()})
        if not wanted:
            return {}
        reads = self.redis.pipeline(transaction=False)
        for rid, field in wanted:
            reads.hmget(self._key(rid), ("tenant", "deleted", field))
        lists: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for (rid, field), (raw_tenant, deleted, raw) in zip(wanted, await reads.execute()):
            if raw_tenant is None or deleted is not None or raw is None or orjson.loads(raw_tenant) != tenant:
                continue
            value = orjson.loads(raw)
            lists[(rid, field)] = (value.get("output") or []) if field == "response" else value
        found: dict[str, StoredItem] = {}
        for item_id, (rid, side, pos) in where.items():
            items = lists.get((rid, "response" if side == "output" else "input"))
            if items is not None and pos < len(items):
                found[item_id] = StoredItem(rid, items[pos])
        return found

    async def close(self) -> None:
        self.tokens.clear()
        await self.redis.aclose()
