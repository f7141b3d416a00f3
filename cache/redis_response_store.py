"""The Redis response store: ``store=true`` responses shared by every replica and connection.

Layout (``P`` = the prefix, ``respgate:`` by default; ``R`` = the id of the chain's root, the first
response of the chain that reached the store)::

    P r:{R}:<id>            hash    the record: what serving this response needs (below)
    P c:{R}                 hash    the chain: per response ``d:<id>`` = its context delta and its
                                    parent in the chain, and ``k:<id>`` = its number of children
    P p:<id>                string  the pointer: {"root": R, "depth": n, "clen": n}
    P i:<tenant tag>:<key>  string  items by id: [response id, side, position, R]

The record holds what serving the response needs — the Response object, its own input items
(``input_items`` pagination), its tenant, its prelude key and a small ``meta`` blob (parent,
model, pending calls, flag bit, byte counts). The chain hash holds, per response, its *context
delta* (the items it added on top of its parent: its input + its output, never the whole context)
followed by a newline and the id of its parent in the chain (empty for the root; orjson never writes
a raw newline, so the first one is the separator). The pointer is how a lookup by id finds the
tag; its depth (0 for the root) and context length let a reader check a hydrated chain is whole.

**Why a chain key: a write is O(new input) whatever the depth.** Ancestors' deltas must outlive
every descendant (a descendant is hydrated from them), and with a record per response holding its
delta that meant refreshing every ancestor's TTL on each write: one ``PEXPIRE`` per ancestor
record and per ancestor pointer, plus the ancestor id list in every pointer — calls and bytes per
turn grew with the chain's depth (an agent session of several hundred turns paid several hundred
Redis calls a turn). Every delta of a chain lives in one hash instead, so one ``PEXPIRE`` of
``c:{R}`` keeps the whole chain alive as long as its newest response; the pointer holds no
ancestor list. A write is the parent's pointer (only when this process does not hold the parent)
and then one script (the new record, its delta, the parent's child count, two ``PEXPIRE``) sent
together with a pipeline of single-key commands (the pointer, the item index entries): a fixed
number of calls, O(new input) bytes, at depth 2 or 2,000.

**Retention.** A response's own record and pointer expire with the store's TTL from its own
write (standard: a response is kept for the TTL after it was created), so ``GET`` by id, listing
its input items and chaining from it (a fork from an old ancestor) work for that long. Its delta
lives as long as its chain — the TTL from the chain's newest write — so the hydration of a live
descendant never breaks; an old ancestor whose record expired costs only its delta. Nothing is
stored twice across records: each delta is in the chain hash once, each Response object in its
own record once.

**Why chain tags (Redis Cluster).** The write script touches the new record and the chain hash,
and the cold read walks the chain hash: both tagged with the root, they share one slot — the
write and the read stay on one node — while different chains (random roots) spread evenly over
every slot. (A script rather than ``MULTI``: see ``cache.redis_client``.) The pointer lives in
another slot and is written beside the script, not in it; each order of failure reads as "not
found", never as a wrong context: a pointer whose record is missing (or a record whose pointer
is) is a miss, and readers validate the record itself (tenant, present).

**Reads.** A process keeps the context of every response it wrote or read (``ChainCache``: deltas
are immutable once written) and from then on reads only the record's own fields — one round
trip, O(new input) bytes — checked as always (tenant, present). A process that does not hold the
chain reads the pointer, then one script in the chain's slot that checks the record's tenant and
walks from the response to the root through the chain hash, returning every delta: O(history)
bytes once per process and chain (the hydration), two round trips whatever the depth. The walk
takes exactly ``depth + 1`` steps and must end at the root, and the deltas must add up to the
pointer's context length; a missing link (an ancestor's delta evicted under memory pressure, the
chain expired or deleted) is None — the client gets ``previous_response_not_found``, never a
silently truncated context. An HTTP ``store=true`` chain served by one replica is O(new input) per
turn, like a WebSocket connection's own cache; a replica that takes over a chain pays O(history)
once.

If the parent's delta is gone when a child is written (its chain was evicted, or expired or the
parent was deleted while the turn ran), the script writes nothing and the child is written again
as the root of a new chain with its whole context as its delta (O(history), rare), so it stays
readable everywhere rather than being an orphan no other process could hydrate.

``DELETE`` removes the response's record and pointer: it can no longer be retrieved, listed or
chained from. Its delta is removed too when it has no children; a response with children leaves
its delta in the chain as a tombstone, so descendants still hydrate (it goes with the chain's TTL).

Items by id: the index entry of an item (or of a tool call the gateway issued) names the stored
response that first held it among its own items (input, then output) and that response's root, so
the lookup reads the record directly. Written with ``NX`` alongside the record (O(new items)) and
expiring with the store's TTL from that write. The tenant tag (a digest of the tenant) is part of
the key, so another tenant's lookup misses like an unknown id. A lookup is one pipelined ``GET`` per
id (one key each, so any slot) plus one read of each home response.

Rendered token ids stay process-local (``TokenCache``): they are large (4 bytes a token packed, many
per item) and only useful to the process whose renderer made them. A miss hydrates the
items with empty ``history_ids`` and ``prelude_key=b""``, which the pipeline renders in full once
(counted), after which this process holds the chain's tokens again. Both process-local caches are
keyed by tenant and response id and hold each tenant to its share of their bytes
(``SharedBufferLRU``): one tenant's flood of chains does not make another's turns hydrate again.

Upgrading from an earlier layout (records holding their own delta, pointers listing ancestors, or
the untagged ``P r:<id>``): responses stored before it are not found after it (a pointer without a
depth reads as missing; they expire within the store TTL); the ledger and conversations are not
affected.

Redis errors become ``StoreUnavailable`` (the gateway answers 503), so an outage is a clear,
retryable error and never a "not found".
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import RedisError

from cache.item_log import ItemLog
from cache.lru import BoundedLRU, LRUOwner, tenant_of
from cache.redis_client import AsyncClient, check_prefix, connect_store
from cache.response_state import ResponseState
from cache.response_store import StoredItem, StoreUnavailable, index_keys
from cache.seq import TOKEN_BYTES, TokenSeq

#: the record's fields: what a read of a response whose context this process holds needs
_FIELDS = ("tenant", "meta", "response", "input", "pk")

# The write, atomically, in the chain's slot. KEYS[1] = the new record, KEYS[2] = the chain hash.
# ARGV[1] = TTL (ms), ARGV[2] = the response id, ARGV[3] = its parent in the chain ('' for a root),
# ARGV[4] = its chain entry (delta, '\n', parent), then the record's field/value pairs. Returns 0,
# writing nothing, when the parent's delta is not in the chain (see the module docstring).
# Fixed work whatever the chain's depth: the chain's one PEXPIRE keeps every ancestor's delta alive.
_PUT_LUA = """
local parent = ARGV[3]
if parent ~= '' and redis.call('HEXISTS', KEYS[2], 'd:' .. parent) == 0 then return 0 end
if redis.call('HSET', KEYS[2], 'd:' .. ARGV[2], ARGV[4]) == 1 and parent ~= '' then
  redis.call('HINCRBY', KEYS[2], 'k:' .. parent, 1)
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# A cold read, in the chain's slot: the record's fields (tenant-checked), then the chain entries
# from the response up to the root. KEYS[1] = the record, KEYS[2] = the chain hash; ARGV[1] = the
# response id, ARGV[2] = its depth (the pointer's), ARGV[3] = the tenant. Exactly depth + 1 links
# that must end at the root: anything else (a link missing, a chain longer or shorter than its
# pointer says) is a miss, never a truncated context — and the walk is bounded by the pointer.
_READ_LUA = """
local head = redis.call('HMGET', KEYS[1], 'tenant', 'meta', 'response', 'input', 'pk')
if not head[1] or head[1] ~= ARGV[3] or not head[2] or not head[3] then return false end
local cur = ARGV[1]
for _ = 0, tonumber(ARGV[2]) do
  if cur == '' then return false end
  local link = redis.call('HGET', KEYS[2], 'd:' .. cur)
  if not link then return false end
  local nl = string.find(link, '\\n', 1, true)
  if not nl then return false end
  head[#head + 1] = link
  cur = string.sub(link, nl + 1)
end
if cur ~= '' then return false end
return head
"""

# Tenant check and delete in one atomic step. KEYS[1] = the record, KEYS[2] = the chain hash;
# ARGV[1] = the tenant, ARGV[2] = the response id. The record goes; the delta too unless the
# response has children (then it stays as the tombstone descendants hydrate from), and a removed
# leaf no longer counts as its parent's child. O(1): nothing cascades up the chain.
_DELETE_LUA = """
local r = redis.call('HMGET', KEYS[1], 'tenant', 'response')
if not r[1] or r[1] ~= ARGV[1] or not r[2] then return 0 end
redis.call('DEL', KEYS[1])
if tonumber(redis.call('HGET', KEYS[2], 'k:' .. ARGV[2]) or '0') > 0 then return 1 end
local link = redis.call('HGET', KEYS[2], 'd:' .. ARGV[2])
if not link then return 1 end
redis.call('HDEL', KEYS[2], 'd:' .. ARGV[2], 'k:' .. ARGV[2])
local nl = string.find(link, '\\n', 1, true)
local parent = nl and string.sub(link, nl + 1) or ''
if parent ~= '' and redis.call('HEXISTS', KEYS[2], 'k:' .. parent) == 1 then
  if redis.call('HINCRBY', KEYS[2], 'k:' .. parent, -1) <= 0 then redis.call('HDEL', KEYS[2], 'k:' .. parent) end
end
return 1
"""


class SharedBufferLRU(LRUOwner):
    """Process-local LRU of views over shared, append-only buffers, bounded in bytes, each tenant
    held to its share.

    Views of one chain share one buffer, so charging each entry its own size would count the same
    bytes many times over. Bytes are charged per distinct buffer instead: a buffer costs the largest
    charge any entry over it was put with (buffers only grow) until no entry refers to it, and the
    tenant of its first entry is charged for it. The entries are a :class:`~cache.lru.BoundedLRU`
    whose parts are the tenants (its own charge is nil: the buffers are charged here, as memory
    outside the map): while the bytes are over the bound, the least recently used entry of the
    tenant furthest over its share goes, or, when none is over, the least recently used of all — so
    one tenant's flood of chains churns its own once it holds its share of ``max_bytes``. The entry
    being written is never the one that goes while another is held (a tenant whose only entry it is
    counts as not over): a put keeps what it puts unless it alone is above the bound, as before the
    shares.
    """

    def __init__(self, max_bytes: int, share: float = 0.25) -> None:
        self.max_bytes = max_bytes
        self._lru: BoundedLRU[tuple[str | None, str], tuple[Any, Any]] = BoundedLRU(
            sys.maxsize, max_bytes, part=tenant_of, share=share, on_evict=self._dropped
        )
        #: id(buffer) -> [entries referring to it, bytes charged for it, the tenant charged]
        self._bufs: dict[int, list[Any]] = {}
        #: tenant -> the bytes of the buffers charged to it
        self._tenants: dict[str | None, int] = {}
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """The bytes of the buffers held (the map itself charges nothing)."""
        return self._bytes

    def tenant_nbytes(self, tenant: str | None) -> int:
        return self._tenants.get(tenant, 0)

    def _get(self, key: str, tenant: str | None) -> Any:
        hit = self._lru.get((tenant, key))
        return None if hit is None else hit[0]

    def _put(self, key: str, value: Any, buf: Any, charge: int, tenant: str | None) -> None:
        self.discard(key, tenant)
        ref = self._bufs.setdefault(id(buf), [0, 0, tenant])
        ref[0] += 1
        if charge > ref[1]:
            self._charge(ref, charge - ref[1])
            ref[1] = charge
        mine = (tenant, key)
        self._lru.put(mine, (value, buf))
        while self._bytes > self.max_bytes and len(self._lru):
            # the entry just written makes room, never is it (while another is left): by the shares
            # when a tenant with another entry is over its own, else the least recently used of all
            protect = mine if len(self._lru) > 1 else None
            if not self._lru.evict_one(outside=self._tenants, protect=protect):
                self._lru.evict_one(protect=protect)

    def discard(self, key: str, tenant: str | None = None) -> None:
        hit = self._lru.pop((tenant, key))
        if hit is not None:
            self._release(hit[1])

    def clear(self) -> None:
        self._lru.clear()
        self._bufs.clear()
        self._tenants.clear()
        self._bytes = 0

    def _dropped(self, _: tuple[str | None, str], hit: tuple[Any, Any]) -> None:
        self._release(hit[1])

    def _charge(self, ref: list[Any], delta: int) -> None:
        self._bytes += delta
        left = self._tenants.get(ref[2], 0) + delta
        if left:
            self._tenants[ref[2]] = left
        else:
            self._tenants.pop(ref[2], None)

    def _release(self, buf: Any) -> None:
        ref = self._bufs[id(buf)]
        ref[0] -= 1
        if ref[0] == 0:
            self._charge(ref, -ref[1])
            del self._bufs[id(buf)]


class TokenCache(SharedBufferLRU):
    """Response id -> its ``history_ids`` view (no copy), charged 4 bytes a token of its buffer."""

    def get(self, response_id: str, tenant: str | None = None) -> TokenSeq | None:
        return self._get(response_id, tenant)

    def put(self, response_id: str, seq: TokenSeq, tenant: str | None = None) -> None:
        buf = seq._buf  # the shared buffer: same package, deliberately read for accounting
        self._put(response_id, seq, buf, TOKEN_BYTES * len(buf), tenant)


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """What this process knows of a stored response's place in its chain: the chain's root (the
    keys' tag), the response's depth in it, and its context (a view, shared with the chain's other
    entries; its length is the pointer's context length). O(1) besides the shared view: no
    ancestor list, so a chain's entries cost the chain's items once, not its depth squared."""

    root: str
    depth: int
    context: ItemLog


class ChainCache(SharedBufferLRU):
    """Response id -> :class:`ChainEntry` for responses this process wrote or read.

    Why: a record's context delta is immutable once written, so a process that holds a response's
    context need not read it back. A continuation's read of its parent is then one round trip for
    the record's small fields (tenant, the Response object, its own input) — O(new input) bytes —
    instead of the pointer and the walk over every ancestor's delta, which is O(history) bytes
    every turn; and its write skips the parent's pointer. The record is still read and checked
    each time: a response deleted or expired elsewhere, or another tenant's, is not found as
    before. Charged per distinct item buffer with the largest ``nbytes`` (the state's approximate
    bytes) of an entry over it."""

    def get(self, response_id: str, tenant: str | None = None) -> ChainEntry | None:
        return self._get(response_id, tenant)

    def put(self, response_id: str, entry: ChainEntry, nbytes: int, tenant: str | None = None) -> None:
        self._put(response_id, entry, entry.context._buf, max(1, nbytes), tenant)


def _present(reply: Sequence[object]) -> list[bytes] | None:
    """An ``HMGET`` reply's fields, or None when one is missing: the script writes a record's fields
    in one ``HSET``, so a missing one means the record was deleted or expired."""
    fields = [value for value in reply if isinstance(value, bytes)]
    return fields if len(fields) == len(reply) else None


@dataclass(frozen=True, slots=True)
class _Link:
    """Where a write goes in the store: the chain (``root``), the parent there ('' for the chain's
    root), the response's depth and the start of its delta in its context."""

    root: str
    parent: str
    depth: int
    start: int


class RedisStore:
    """``ResponseStore`` over redis-py asyncio; see the module docstring for the layout and choices."""

    shared = True

    def __init__(
        self,
        client: AsyncClient,
        *,
        ttl_s: float = 86400.0,
        token_cache_bytes: int = 256 * 1024 * 1024,
        chain_cache_bytes: int = 256 * 1024 * 1024,
        prefix: str = "respgate:",
    ) -> None:
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
        #: writes whose parent's delta was gone from its chain, written again as a new chain's root
        self.rerooted = 0
        self._write = client.register_script(_PUT_LUA)
        self._read = client.register_script(_READ_LUA)
        self._delete = client.register_script(_DELETE_LUA)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        ttl_s: float = 86400.0,
        token_cache_bytes: int = 256 * 1024 * 1024,
        chain_cache_bytes: int = 256 * 1024 * 1024,
        prefix: str = "respgate:",
        **client_kwargs: Any,
    ) -> RedisStore:
        # the stores' client (``connect_store``): a stale pooled connection after a Redis restart is
        # retried once, but an outage surfaces in seconds (as a 503), not after a long backoff
        return cls(
            connect_store(url, **client_kwargs),
            ttl_s=ttl_s,
            token_cache_bytes=token_cache_bytes,
            chain_cache_bytes=chain_cache_bytes,
            prefix=prefix,
        )

    def record_key(self, root: str, response_id: str) -> str:
        """The record of ``response_id`` in the chain rooted at ``root`` (tag ``{root}``: one slot a chain)."""
        return f"{self.prefix}r:{{{root}}}:{response_id}"

    def chain_key(self, root: str) -> str:
        """The chain rooted at ``root``: every delta of it, and the one TTL that keeps them."""
        return f"{self.prefix}c:{{{root}}}"

    def pointer_key(self, response_id: str) -> str:
        return f"{self.prefix}p:{response_id}"

    def item_key(self, tenant: str | None, item_id: str) -> str:
        tag = hashlib.blake2b(orjson.dumps(tenant), digest_size=8).hexdigest()
        return f"{self.prefix}i:{tag}:{item_id}"

    async def _pointer(self, response_id: str) -> dict[str, Any] | None:
        raw = await self.redis.get(self.pointer_key(response_id))
        pointer = orjson.loads(raw) if raw is not None else None
        # a pointer of an earlier layout (no depth: its chain is not in a chain hash) is not found
        return pointer if isinstance(pointer, dict) and isinstance(pointer.get("depth"), int) else None

    async def put(self, state: ResponseState) -> None:
        try:
            await self._put(state)
        except RedisError as exc:
            raise StoreUnavailable(f"response store write failed: {exc}") from exc
        if state.prelude_key and len(state.history_ids):
            self.tokens.put(state.id, state.history_ids, state.tenant)

    async def _put(self, state: ResponseState) -> None:
        link = _Link(state.id, "", 0, 0)
        if state.parent_id is not None:
            known = self.chains.get(state.parent_id, state.tenant)
            parent: dict[str, Any] | None = (
                {"root": known.root, "depth": known.depth, "clen": len(known.context)}
                if known is not None
                else await self._pointer(state.parent_id)
            )
            if parent is not None and parent["clen"] <= len(state.context):
                link = _Link(parent["root"], state.parent_id, parent["depth"] + 1, parent["clen"])
            # else: the parent is not in Redis (a store=false WebSocket turn, or expired): this
            # record is the root of a new chain, its delta is the whole context (rare, and still correct)
        meta = orjson.dumps(
            {
                "parent_id": state.parent_id,
                "root_id": state.root_id,
                "model": state.model,
                "pending_calls": sorted(state.pending_calls),
                "mcp_listed": sorted(state.mcp_listed),
                "flagged": state.flagged,
                "store": state.store,
                "nbytes": state.nbytes,
                "delta_bytes": state.delta_bytes,
                "created": state.created,
            }
        )
        record = [
            "tenant",
            orjson.dumps(state.tenant),
            "meta",
            meta,
            "pk",
            state.prelude_key,
            "response",
            orjson.dumps(state.response),
            "input",
            orjson.dumps(list(state.input_items)),
        ]
        index = [(self.item_key(state.tenant, item_key), where, pos) for item_key, where, pos in index_keys(state)]
        wrote, claimed = await self._send(state, link, record, index, None)
        if not wrote:
            # the parent's delta is gone from its chain (evicted, or the chain expired or the parent
            # was deleted while this turn ran): this response starts a chain of its own, whole; the
            # pointer and the index entries the first attempt claimed are written again for it
            self.rerooted += 1
            link = _Link(state.id, "", 0, 0)
            await self._send(state, link, record, index, claimed)
        self.chains.put(state.id, ChainEntry(link.root, link.depth, state.context), state.nbytes, state.tenant)

    async def _send(
        self,
        state: ResponseState,
        link: _Link,
        record: list[Any],
        index: list[tuple[str, str, int]],
        again: list[bool] | None,
    ) -> tuple[Any, list[bool]]:
        """The write's script and, beside it, a pipeline of single-key commands (the pointer, the
        item index entries: any slots). Index entries are set ``NX`` (the first response to hold an
        item keeps it), or with ``again`` (a second attempt) exactly those the first attempt
        claimed, overwritten. Returns the script's result and which index entries were set."""
        entry = orjson.dumps(state.context[link.start :]) + b"\n" + link.parent.encode()
        write = self._write(
            keys=[self.record_key(link.root, state.id), self.chain_key(link.root)],
            args=[self.ttl_ms, state.id, link.parent, entry, *record],
        )
        side = self.redis.pipeline(transaction=False)
        side.set(
            self.pointer_key(state.id),
            orjson.dumps({"root": link.root, "depth": link.depth, "clen": len(state.context)}),
            px=self.ttl_ms,
        )
        sent = [again is None or again[n] for n in range(len(index))]
        for (key, where, pos), send in zip(index, sent):
            if send:
                side.set(key, orjson.dumps([state.id, where, pos, link.root]), nx=again is None, px=self.ttl_ms)
        wrote, results = await asyncio.gather(write, side.execute())
        replies = iter(results[1:])
        return wrote, [send and bool(next(replies)) for send in sent]

    async def get(self, response_id: str, tenant: str | None = None) -> ResponseState | None:
        try:
            return await self._get(response_id, tenant)
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc

    async def _get(self, response_id: str, tenant: str | None) -> ResponseState | None:
        known = self.chains.get(response_id, tenant)
        if known is not None:  # this process holds the context: read and check the record only
            self.chain_hits += 1
            fields = _present(await self.redis.hmget(self.record_key(known.root, response_id), _FIELDS))
            if fields is None:
                self.chains.discard(response_id, tenant)  # deleted or expired: gone for every reader
                return None
            raw_tenant, raw_meta, response, inputs, pk = fields
            if orjson.loads(raw_tenant) != tenant:
                return None
            return self._state(
                response_id, known.root, orjson.loads(raw_meta), response, inputs, pk, known.context, tenant
            )
        self.chain_misses += 1
        pointer = await self._pointer(response_id)
        if pointer is None:
            return None
        root, depth = pointer["root"], pointer["depth"]
        found = await self._read(
            keys=[self.record_key(root, response_id), self.chain_key(root)],
            args=[response_id, depth, orjson.dumps(tenant)],
        )
        if not found:
            return None  # missing, another tenant's, or a link of its chain gone: never a truncated context
        _, raw_meta, response, inputs, pk, *links = found
        items: list[dict[str, Any]] = []
        for link in reversed(links):  # the walk went from the response up to the root
            items.extend(orjson.loads(link[: link.index(b"\n")]))
        if len(items) != pointer["clen"]:
            return None
        meta = orjson.loads(raw_meta)
        context = ItemLog(items)
        self.chains.put(response_id, ChainEntry(root, depth, context), meta["nbytes"], tenant)
        return self._state(response_id, root, meta, response, inputs, pk, context, tenant)

    def _state(
        self,
        response_id: str,
        root: str,
        meta: dict[str, Any],
        response: bytes,
        inputs: bytes,
        pk: bytes | None,
        context: ItemLog,
        tenant: str | None,
    ) -> ResponseState:
        history = self.tokens.get(response_id, tenant)
        if history is not None:
            self.token_hits += 1
        else:
            self.token_misses += 1
        return ResponseState(
            id=response_id,
            response=orjson.loads(response),
            input_items=tuple(orjson.loads(inputs)),
            context=context,
            history_ids=history if history is not None else TokenSeq(),
            model=meta["model"],
            store=meta["store"],
            prelude_key=pk if history is not None and pk is not None else b"",
            # the routing root (``ResponseState.root_id``); a record without one: its chain's first
            # stored response (the storage root of the key layout) stands in
            parent_id=meta["parent_id"],
            root_id=meta.get("root_id") or root,
            pending_calls=frozenset(meta["pending_calls"]),
            mcp_listed=frozenset(meta.get("mcp_listed", ())),  # a record written before MCP: none
            flagged=meta["flagged"],
            tenant=tenant,
            nbytes=meta["nbytes"],
            delta_bytes=meta["delta_bytes"],
            created=meta["created"],
        )

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        try:
            known = self.chains.get(response_id, tenant)
            pointer = {"root": known.root} if known is not None else await self._pointer(response_id)
            if pointer is None:
                return False
            root = pointer["root"]
            deleted = await self._delete(
                keys=[self.record_key(root, response_id), self.chain_key(root)],
                args=[orjson.dumps(tenant), response_id],
            )
            if deleted:  # no longer found by id either way
                await self.redis.delete(self.pointer_key(response_id))
        except RedisError as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from exc
        if deleted:
            self.tokens.discard(response_id, tenant)
            self.chains.discard(response_id, tenant)
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
                where[item_id] = tuple(entry)
        # per home response, only the list that holds the items: the Response for outputs
        wanted = sorted(
            {(rid, root, "response" if side == "output" else "input") for rid, side, _, root in where.values()}
        )
        if not wanted:
            return {}
        reads = self.redis.pipeline(transaction=False)
        for rid, root, field in wanted:
            reads.hmget(self.record_key(root, rid), ("tenant", field))
        lists: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for (rid, _, field), (raw_tenant, raw) in zip(wanted, await reads.execute()):
            if raw_tenant is None or raw is None or orjson.loads(raw_tenant) != tenant:
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
