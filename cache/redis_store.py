"""The Redis response store: ``store=true`` responses shared by every replica and connection.

Layout (``P`` = the prefix, ``respgate:`` by default; ``R`` = the id of the chain's root, the first
response of the chain that reached the store)::

    P r:{R}:<id>            hash    the record (below); every record of one chain shares the tag {R}
    P p:<id>                string  the chain pointer: {"root": R, "anc": [ancestor ids], "clen": n}
    P i:<tenant tag>:<key>  string  items by id: [response id, side, position, R]

The record holds everything needed to serve a response and to chain from it — the Response
object, its own input items (``input_items`` pagination), its *context delta* (the items it added
on top of its parent: its input + its output, never the whole context), its tenant, its prelude
key, a ``kids`` count and a small ``meta`` blob (parent, model, pending calls, flag bit, byte
counts). The pointer is how a lookup by id finds the record's tag, and it carries the ancestors'
ids (oldest first) and the context length, which is all a continuation needs of its parent.

**Why chain tags (Redis Cluster).** A write is one atomic step (a Lua script) over the new record
*and its ancestors* (the parent's ``kids`` count, every ancestor's TTL), and a read pipelines every
ancestor's delta: with records named by their own id a chain would spread over many slots and
Cluster would refuse the script (``CROSSSLOT``). Tagged with their root, a chain's records share
one slot — the write and the read stay on one node — while different chains (random roots) spread
evenly over every slot. (A script rather than ``MULTI``: see ``cache.redis_client``.)

Response ids stay as they are (``resp_<random>``), so a lookup by id first reads the pointer (its
own key, any slot); the pointer holds the ancestors, so a read is still two round trips whatever
the chain's depth: the pointer, then the record with every ancestor's delta. A write is also two:
the parent's pointer, then the record's script sent together with a pipeline of single-key
commands (the new pointer, the ancestors' pointer TTLs, the item index entries) that the cluster
client splits per node. Nothing here is a cross-slot transaction, script or multi-key command.
Load: a chain's bytes live on one shard, as a conversation's do; 100,000 sessions are 100,000
roots spread over 16,384 slots.

The pointer is written with the record but not in its script (it lives in another slot). Each
order of failure reads as "not found", never as a wrong context: a pointer whose record is missing
(or a record whose pointer is) is a miss; readers validate the record itself (tenant, not deleted).

Why deltas plus an ancestor list: storing each response's full context would make every write
O(history) bytes and a chain O(n²) in Redis. Reading every ancestor's delta is O(history) bytes,
so it happens once per process and chain: a process keeps the context of every response it wrote
or read (``ChainCache``: deltas are immutable once written) and from then on reads only the
record's own fields — one round trip, O(new input) bytes — checked as always (tenant, tombstone,
present). An HTTP ``store=true`` chain served by one replica is O(new input) per turn, like a
WebSocket connection's own cache; a replica that takes over a chain pays O(history) once.

Ancestors must outlive descendants, so a write refreshes the TTL of every ancestor's record (same
script) and pointer (same round trip): a chain expires together with its newest response.
``DELETE`` of a response that has descendants leaves a tombstone — the Response object and input
items are removed, so it can no longer be retrieved, listed or chained from, but its delta stays so
descendants still hydrate; a response without descendants is removed outright; either way its
pointer goes. If an ancestor is nonetheless gone (Redis evicted it under memory pressure, or a
race with a delete) ``get`` returns None: the client gets ``previous_response_not_found``, never a
silently truncated context.

Items by id: the index entry of an item (or of a tool call the gateway issued) names the stored
response that first held it among its own items (input, then output) and that response's root, so
the lookup reads the record directly. Written with ``NX`` alongside the record (O(new items)) and
expiring with the store's TTL from that write. The tenant tag (a digest of the tenant) is part of
the key, so another tenant's lookup misses like an unknown id. A lookup is one pipelined ``GET`` per
id (one key each, so any slot) plus one read of each home response.

Rendered token ids stay process-local (``TokenCache``): they are large (4 bytes a token packed, many
per item) and only useful to the process whose renderer made them. A miss hydrates the
items with empty ``history_ids`` and ``prelude_key=b""``, which the pipeline renders in full once
(counted), after which this process holds the chain's tokens again.

Upgrading from the untagged layout (``P r:<id>``): responses stored before it are not found after
it (they expire within the store TTL); the ledger and conversations are not affected.

Redis errors become ``StoreUnavailable`` (the gateway answers 503), so an outage is a clear,
retryable error and never a "not found".
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import orjson
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from cache.items import ItemLog
from cache.redis_client import AsyncClient, check_prefix, connect
from cache.seq import TOKEN_BYTES, TokenSeq
from cache.state import ResponseState
from cache.store import StoredItem, StoreUnavailable, index_keys

_FIELDS = ("tenant", "deleted", "meta", "response", "input", "delta", "pk")
#: a record's fields but its delta: what a read of a response whose context this process holds needs
_HEAD_FIELDS = ("tenant", "deleted", "meta", "response", "input", "pk")

# The write, atomically (one slot: every key is tagged with the chain's root). KEYS[1] = the new
# record, KEYS[2..] = its ancestors' records, oldest first (the parent last). ARGV[1] = TTL (ms), then
# field/value pairs of the record.
_PUT_LUA = """
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if #KEYS > 1 then redis.call('HINCRBY', KEYS[#KEYS], 'kids', 1) end
for i = 2, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
return 1
"""

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


class SharedBufferLRU:
    """Process-local LRU of views over shared, append-only buffers, bounded in bytes.

    Views of one chain share one buffer, so charging each entry its own size would count the same
    bytes many times over. Bytes are charged per distinct buffer instead: a buffer costs the largest
    charge any entry over it was put with (buffers only grow) until no entry refers to it.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[Any, Any]] = OrderedDict()   # key -> (value, buffer)
        #: id(buffer) -> [entries referring to it, bytes charged for it]
        self._bufs: dict[int, list[int]] = {}
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, key: str) -> Any:
        hit = self._entries.get(key)
        if hit is None:
            return None
        self._entries.move_to_end(key)
        return hit[0]

    def _put(self, key: str, value: Any, buf: Any, charge: int) -> None:
        self.discard(key)
        ref = self._bufs.setdefault(id(buf), [0, 0])
        ref[0] += 1
        if charge > ref[1]:
            self.nbytes += charge - ref[1]
            ref[1] = charge
        self._entries[key] = (value, buf)
        while self.nbytes > self.max_bytes and self._entries:
            self._release(self._entries.popitem(last=False)[1][1])
            self.evictions += 1

    def discard(self, key: str) -> None:
        hit = self._entries.pop(key, None)
        if hit is not None:
            self._release(hit[1])

    def clear(self) -> None:
        self._entries.clear()
        self._bufs.clear()
        self.nbytes = 0

    def _release(self, buf: Any) -> None:
        ref = self._bufs[id(buf)]
        ref[0] -= 1
        if ref[0] == 0:
            self.nbytes -= ref[1]
            del self._bufs[id(buf)]


class TokenCache(SharedBufferLRU):
    """Response id -> its ``history_ids`` view (no copy), charged 4 bytes a token of its buffer."""

    def get(self, response_id: str) -> TokenSeq | None:
        return self._get(response_id)

    def put(self, response_id: str, seq: TokenSeq) -> None:
        buf = seq._buf  # the shared buffer: same package, deliberately read for accounting
        self._put(response_id, seq, buf, TOKEN_BYTES * len(buf))


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """What this process knows of a stored response's place in its chain: the record's tag, the
    pointer's ancestors and context length, and the context itself (a view, shared with the
    chain's other entries)."""

    root: str
    ancestors: tuple[str, ...]
    context: ItemLog


class ChainCache(SharedBufferLRU):
    """Response id -> :class:`ChainEntry` for responses this process wrote or read.

    Why: a record's context delta is immutable once written, so a process that holds a response's
    context need not read it back. A continuation's read of its parent is then one round trip for
    the record's small fields (tenant, tombstone, the Response object, its own input) — O(new
    input) bytes — instead of the pointer and every ancestor's delta, which is O(history) bytes
    every turn. The record is still read and checked each time: a response deleted or expired
    elsewhere, or another tenant's, is not found as before. Charged per distinct item buffer with
    the largest ``nbytes`` (the state's approximate bytes) of an entry over it."""

    def get(self, response_id: str) -> ChainEntry | None:
        return self._get(response_id)

    def put(self, response_id: str, entry: ChainEntry, nbytes: int) -> None:
        self._put(response_id, entry, entry.context._buf, max(1, nbytes))


class RedisStore:
    """``ResponseStore`` over redis-py asyncio; see the module docstring for the layout and choices."""

    shared = True

    def __init__(self, client: AsyncClient, *, ttl_s: float = 86400.0,
                 token_cache_bytes: int = 256 * 1024 * 1024, chain_cache_bytes: int = 256 * 1024 * 1024,
                 prefix: str = "respgate:") -> None:
        self.redis = client
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.prefix = check_prefix(prefix)
        self.tokens = TokenCache(token_cache_bytes)
        #: hydrations that found / did not find this process's token ids (exported as metrics later)
        self.token_hits = 0
        self.token_misses = 0
        self.chains = ChainCache(chain_cache_bytes)
        #: reads answered from this process's chain cache (one round trip, no ancestor deltas) / not
        self.chain_hits = 0
        self.chain_misses = 0
        self._write = client.register_script(_PUT_LUA)
        self._delete = client.register_script(_DELETE_LUA)

    @classmethod
    def from_url(cls, url: str, *, ttl_s: float = 86400.0, token_cache_bytes: int = 256 * 1024 * 1024,
                 chain_cache_bytes: int = 256 * 1024 * 1024, prefix: str = "respgate:",
                 **client_kwargs: Any) -> "RedisStore":
        # Short timeouts and one quick retry: a stale pooled connection after a Redis restart is
        # retried once, but an outage surfaces in milliseconds (as a 503), not after seconds of backoff.
        client_kwargs.setdefault("socket_connect_timeout", 2.0)
        client_kwargs.setdefault("socket_timeout", 5.0)
        client_kwargs.setdefault("retry", Retry(ExponentialBackoff(cap=0.05, base=0.01), 1))
        return cls(connect(url, **client_kwargs), ttl_s=ttl_s, token_cache_bytes=token_cache_bytes,
                   chain_cache_bytes=chain_cache_bytes, prefix=prefix)

    def record_key(self, root: str, response_id: str) -> str:
        """The record of ``response_id`` in the chain rooted at ``root`` (tag ``{root}``: one slot a chain)."""
        return f"{self.prefix}r:{{{root}}}:{response_id}"

    def pointer_key(self, response_id: str) -> str:
        return f"{self.prefix}p:{response_id}"

    def item_key(self, tenant: str | None, item_id: str) -> str:
        tag = hashlib.blake2b(orjson.dumps(tenant), digest_size=8).hexdigest()
        return f"{self.prefix}i:{tag}:{item_id}"

    async def _pointer(self, response_id: str) -> dict[str, Any] | None:
        raw = await self.redis.get(self.pointer_key(response_id))
        return orjson.loads(raw) if raw is not None else None

    async def put(self, state: ResponseState) -> None:
        try:
            await self._put(state)
        except RedisError as exc:
            raise StoreUnavailable(f"response store write failed: {exc}") from exc
        if state.prelude_key and len(state.history_ids):
            self.tokens.put(state.id, state.history_ids)

    async def _put(self, state: ResponseState) -> None:
        root, ancestors, start = state.id, [], 0
        if state.parent_id is not None:
            known = self.chains.get(state.parent_id)
            parent = ({"root": known.root, "anc": known.ancestors, "clen": len(known.context)} if known is not None
                      else await self._pointer(state.parent_id))
            if parent is not None and parent["clen"] <= len(state.context):
                root, ancestors, start = parent["root"], [*parent["anc"], state.parent_id], parent["clen"]
            # else: the parent is not in Redis (a store=false WebSocket turn, or expired): this
            # record is the root of a new chain, its delta is the whole context (rare, and still correct)
        meta = {
            "parent_id": state.parent_id, "root_id": state.root_id, "model": state.model, "pending_calls": sorted(state.pending_calls),
            "flagged": state.flagged, "store": state.store, "nbytes": state.nbytes, "delta_bytes": state.delta_bytes,
            "created": state.created,
        }
        record = [self.record_key(root, state.id), *(self.record_key(root, a) for a in ancestors)]
        write = self._write(keys=record, args=[
            self.ttl_ms, "tenant", orjson.dumps(state.tenant), "meta", orjson.dumps(meta), "pk", state.prelude_key,
            "response", orjson.dumps(state.response), "input", orjson.dumps(list(state.input_items)),
            "delta", orjson.dumps(state.context[start:])])
        side = self.redis.pipeline(transaction=False)  # single-key commands, any slots
        side.set(self.pointer_key(state.id), orjson.dumps({"root": root, "anc": ancestors, "clen": len(state.context)}),
                 px=self.ttl_ms)
        for ancestor in ancestors:
            side.pexpire(self.pointer_key(ancestor), self.ttl_ms)
        for item_key, where, pos in index_keys(state):
            side.set(self.item_key(state.tenant, item_key), orjson.dumps([state.id, where, pos, root]), nx=True,
                     px=self.ttl_ms)
        await asyncio.gather(write, side.execute())
        self.chains.put(state.id, ChainEntry(root, tuple(ancestors), state.context), state.nbytes)

    async def get(self, response_id: str, tenant: str | None = None) -> ResponseState | None:
        try:
            return await self._get(response_id, tenant)
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc

    async def _get(self, response_id: str, tenant: str | None) -> ResponseState | None:
        known = self.chains.get(response_id)
        if known is not None:  # this process holds the context: read and check the record only
            self.chain_hits += 1
            head = await self.redis.hmget(self.record_key(known.root, response_id), _HEAD_FIELDS)
            raw_tenant, deleted, raw_meta, response, inputs, pk = head
            if raw_meta is None or response is None or deleted is not None:
                self.chains.discard(response_id)  # deleted or expired: gone for every reader
                return None
            if orjson.loads(raw_tenant) != tenant:
                return None
            return self._state(response_id, known.root, orjson.loads(raw_meta), response, inputs, pk,
                               known.context, tenant)
        self.chain_misses += 1
        pointer = await self._pointer(response_id)
        if pointer is None:
            return None
        root, ancestors = pointer["root"], pointer["anc"]
        reads = self.redis.pipeline(transaction=False)  # one slot: the chain's
        reads.hmget(self.record_key(root, response_id), _FIELDS)
        for ancestor in ancestors:
            reads.hget(self.record_key(root, ancestor), "delta")
        (raw_tenant, deleted, raw_meta, response, inputs, delta, pk), *chunks = await reads.execute()
        if raw_meta is None or response is None or deleted is not None or orjson.loads(raw_tenant) != tenant:
            return None
        meta = orjson.loads(raw_meta)
        items: list[dict[str, Any]] = []
        for chunk in chunks:
            if chunk is None:
                return None  # an ancestor is gone: refuse rather than hydrate a truncated context
            items.extend(orjson.loads(chunk))
        items.extend(orjson.loads(delta))
        context = ItemLog(items)
        self.chains.put(response_id, ChainEntry(root, tuple(ancestors), context), meta["nbytes"])
        return self._state(response_id, root, meta, response, inputs, pk, context, tenant)

    def _state(self, response_id: str, root: str, meta: dict[str, Any], response: bytes, inputs: bytes,
               pk: bytes | None, context: ItemLog, tenant: str | None) -> ResponseState:
        history = self.tokens.get(response_id)
        if history is not None:
            self.token_hits += 1
        else:
            self.token_misses += 1
        return ResponseState(
            id=response_id, response=orjson.loads(response), input_items=tuple(orjson.loads(inputs)),
            context=context, history_ids=history if history is not None else TokenSeq(),
            model=meta["model"], prelude_key=pk if history is not None else b"", store=meta["store"],
            # the routing root (``ResponseState.root_id``); a record without one: its chain's first
            # stored response (the storage root of the key layout) stands in
            parent_id=meta["parent_id"], root_id=meta.get("root_id") or root,
            pending_calls=frozenset(meta["pending_calls"]), flagged=meta["flagged"],
            tenant=tenant, nbytes=meta["nbytes"], delta_bytes=meta["delta_bytes"], created=meta["created"],
        )

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        try:
            known = self.chains.get(response_id)
            pointer = {"root": known.root} if known is not None else await self._pointer(response_id)
            if pointer is None:
                return False
            deleted = await self._delete(keys=[self.record_key(pointer["root"], response_id)],
                                         args=[orjson.dumps(tenant)])
            if deleted:  # deleted or tombstoned: no longer found by id either way
                await self.redis.delete(self.pointer_key(response_id))
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc
        if deleted:
            self.tokens.discard(response_id)
            self.chains.discard(response_id)
        return bool(deleted)

    async def items(self, item_ids: Sequence[str], tenant: str | None = None) -> dict[str, StoredItem]:
        if not item_ids:
            return {}
        try:
            return await self._items(item_ids, tenant)
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc

    async def _items(self, item_ids: Sequence[str], tenant: str | None) -> dict[str, StoredItem]:
        lookups = self.redis.pipeline(transaction=False)  # one GET per id (not MGET: ids hash anywhere)
        for item_id in item_ids:
            lookups.get(self.item_key(tenant, item_id))
        where: dict[str, tuple[str, str, int, str]] = {}
        for item_id, home in zip(item_ids, await lookups.execute()):
            if home is not None and len(entry := orjson.loads(home)) == 4:
                where[item_id] = tuple(entry)  # type: ignore[assignment]
        # per home response, only the list that holds the items: the Response for outputs
        wanted = sorted({(rid, root, "response" if side == "output" else "input")
                         for rid, side, _, root in where.values()})
        if not wanted:
            return {}
        reads = self.redis.pipeline(transaction=False)
        for rid, root, field in wanted:
            reads.hmget(self.record_key(root, rid), ("tenant", "deleted", field))
        lists: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for (rid, _, field), (raw_tenant, deleted, raw) in zip(wanted, await reads.execute()):
            if raw_tenant is None or deleted is not None or raw is None or orjson.loads(raw_tenant) != tenant:
                continue
            value = orjson.loads(raw)
            lists[(rid, field)] = (value.get("output") or []) if field == "response" else value
        found: dict[str, StoredItem] = {}
        for item_id, (rid, side, pos, _) in where.items():
            items = lists.get((rid, "response" if side == "output" else "input"))
            if items is not None and pos < len(items):
                found[item_id] = StoredItem(rid, items[pos])
        return found

    async def close(self) -> None:
        self.tokens.clear()
        await self.redis.aclose()
