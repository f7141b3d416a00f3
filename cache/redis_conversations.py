"""The Redis conversation store: conversations shared by every replica (``cache.conversations``).

Layout, per conversation and tenant (``T`` = a digest of the tenant, so another tenant's lookup
names other keys and misses like an unknown id)::

    {prefix}{conv:<id>}:T:meta    hash   created_at, metadata (JSON), rev, seq, count, nbytes
    {prefix}{conv:<id>}:T:order   zset   item id -> sequence number (the items' order; cursors)
    {prefix}{conv:<id>}:T:items   hash   item id -> item JSON

**Redis Cluster.** The braces make ``conv:<id>`` the keys' hash tag: a conversation's three keys
always share one slot, so every operation — each a single Lua script or one command — is
slot-local and Cluster runs it unchanged (no cross-slot transaction exists here).

**Atomic steps.** An append checks existence, duplicate ids and the bounds, assigns sequence
numbers, writes the items, bumps ``rev`` and refreshes the TTL in one script, and returns the
revision it started from; reading all items returns them with the revision they belong to, so a
turn's "nobody appended in between" check (``gateway.turn.conversation``) cannot be fooled by an
interleaving. Item bytes are the stored JSON's length (``HSTRLEN``), the memory store's measure.

The three keys expire together ``ttl_s`` after the conversation's last change. Redis errors become
``StoreUnavailable`` (a retryable 503), never "not found".
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import orjson
from redis.exceptions import RedisError

from cache.conversations import (
    Appended,
    Conversation,
    ConversationFull,
    ConversationNotFound,
    DuplicateItem,
    Item,
    Limits,
    Order,
    Page,
    UnknownCursor,
)
from cache.redis_client import AsyncClient, check_prefix, connect_store
from cache.response_store import StoreUnavailable

T = TypeVar("T")

_META = ("created_at", "metadata", "rev", "count", "nbytes")

# KEYS meta, order, items. ARGV: mode ("create" | "append" | "force"), max_items, max_bytes, ttl_ms,
# created_at, metadata, then (id, json) pairs. Returns {status, ...}: 1 = ok with the previous rev,
# the meta after, and the 0-based indexes of the pairs appended; 0 = no such conversation; -1 =
# duplicate id (the id); -2 = full.
_APPEND_LUA = """
local mode = ARGV[1]
if mode == 'create' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {-3} end
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  return {0}
end
local force = mode == 'force'
local count, nbytes, rev = 0, 0, 0
if mode ~= 'create' then
  local m = redis.call('HMGET', KEYS[1], 'count', 'nbytes', 'rev')
  count, nbytes, rev = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
end
local seen, add, added_bytes = {}, {}, 0
for i = 7, #ARGV, 2 do
  local id = ARGV[i]
  if seen[id] or redis.call('HEXISTS', KEYS[3], id) == 1 then
    if not force then return {-1, id} end
  else
    seen[id] = true
    add[#add + 1] = i
    added_bytes = added_bytes + string.len(ARGV[i + 1])
  end
end
if not force and (count + #add > tonumber(ARGV[2]) or nbytes + added_bytes > tonumber(ARGV[3])) then
  return {-2}
end
if mode == 'create' then
  redis.call('HSET', KEYS[1], 'created_at', ARGV[5], 'metadata', ARGV[6], 'rev', 0, 'seq', 0, 'count', 0,
             'nbytes', 0)
end
local seq = 0
if #add > 0 then seq = redis.call('HINCRBY', KEYS[1], 'seq', #add) - #add end
local done = {}
for k, i in ipairs(add) do
  redis.call('ZADD', KEYS[2], seq + k, ARGV[i])
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  done[k] = (i - 7) / 2
end
redis.call('HINCRBY', KEYS[1], 'count', #add)
redis.call('HINCRBY', KEYS[1], 'nbytes', added_bytes)
if mode ~= 'create' then redis.call('HINCRBY', KEYS[1], 'rev', 1) end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ARGV[4]) end
return {1, rev, redis.call('HMGET', KEYS[1], 'created_at', 'metadata', 'rev', 'count', 'nbytes'), done}
"""

# Every item in order, with the meta they belong to: {meta, jsons} or {} when missing.
_ITEMS_LUA = """
local m = redis.call('HMGET', KEYS[1], 'created_at', 'metadata', 'rev', 'count', 'nbytes')
if not m[1] then return {} end
local ids = redis.call('ZRANGE', KEYS[2], 0, -1)
local out = {}
for i = 1, #ids, 1000 do
  local vals = redis.call('HMGET', KEYS[3], unpack(ids, i, math.min(i + 999, #ids)))
  for _, v in ipairs(vals) do out[#out + 1] = v end
end
return {m, out}
"""

# ARGV after ('' = from the start), limit + 1, order. {0} missing, {2} unknown cursor, {1, jsons}.
_PAGE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local n, asc, ids = tonumber(ARGV[2]), ARGV[3] == 'asc'
if ARGV[1] == '' then
  if asc then ids = redis.call('ZRANGE', KEYS[2], 0, n - 1)
  else ids = redis.call('ZREVRANGE', KEYS[2], 0, n - 1) end
else
  local s = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if not s then return {2} end
  if asc then ids = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. s, '+inf', 'LIMIT', 0, n)
  else ids = redis.call('ZREVRANGEBYSCORE', KEYS[2], '(' .. s, '-inf', 'LIMIT', 0, n) end
end
if #ids == 0 then return {1, {}} end
return {1, redis.call('HMGET', KEYS[3], unpack(ids))}
"""

# ARGV item id, ttl_ms. {0} missing conversation, {2} missing item, {1, meta after}.
_DELETE_ITEM_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local n = redis.call('HSTRLEN', KEYS[3], ARGV[1])
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return {2} end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'count', -1)
redis.call('HINCRBY', KEYS[1], 'nbytes', -n)
redis.call('HINCRBY', KEYS[1], 'rev', 1)
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
return {1, redis.call('HMGET', KEYS[1], 'created_at', 'metadata', 'rev', 'count', 'nbytes')}
"""

# ARGV metadata JSON. {} missing, else the meta after.
_UPDATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
redis.call('HSET', KEYS[1], 'metadata', ARGV[1])
return redis.call('HMGET', KEYS[1], 'created_at', 'metadata', 'rev', 'count', 'nbytes')
"""


class RedisConversationStore:
    """``ConversationStore`` over redis-py asyncio; see the module docstring for the layout."""

    shared = True

    def __init__(
        self, client: AsyncClient, limits: Limits = Limits(), *, ttl_s: float = 30 * 86400.0, prefix: str = "respgate:"
    ) -> None:
        self.redis = client
        self.limits = limits
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.prefix = check_prefix(prefix)
        self._append = client.register_script(_APPEND_LUA)
        self._items = client.register_script(_ITEMS_LUA)
        self._page = client.register_script(_PAGE_LUA)
        self._delete_item = client.register_script(_DELETE_ITEM_LUA)
        self._update = client.register_script(_UPDATE_LUA)

    @classmethod
    def from_url(
        cls,
        url: str,
        limits: Limits = Limits(),
        *,
        ttl_s: float = 30 * 86400.0,
        prefix: str = "respgate:",
        **client_kwargs: Any,
    ) -> RedisConversationStore:
        # the stores' client (``connect_store``), as the response store: an outage is a 503 in seconds
        return cls(connect_store(url, **client_kwargs), limits, ttl_s=ttl_s, prefix=prefix)

    def keys(self, conversation_id: str, tenant: str | None) -> list[str]:
        """meta, order, items: one hash tag per conversation (Cluster: one slot)."""
        tag = hashlib.blake2b(orjson.dumps(tenant), digest_size=8).hexdigest()
        base = f"{self.prefix}{{conv:{conversation_id}}}:{tag}:"
        return [base + "meta", base + "order", base + "items"]

    async def _io(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except RedisError as exc:
            raise StoreUnavailable(f"conversation store unavailable: {exc}") from exc

    async def create(
        self, conversation_id: str, tenant: str | None, metadata: dict[str, str], items: Sequence[Item]
    ) -> Conversation:
        created_at = int(time.time())
        res = await self._run_append(conversation_id, tenant, items, "create", created_at, metadata)
        return res.conversation

    async def append(
        self, conversation_id: str, tenant: str | None, items: Sequence[Item], *, force: bool = False
    ) -> Appended:
        return await self._run_append(conversation_id, tenant, items, "force" if force else "append", 0, {})

    async def _run_append(
        self,
        conversation_id: str,
        tenant: str | None,
        items: Sequence[Item],
        mode: str,
        created_at: int,
        metadata: dict[str, str],
    ) -> Appended:
        jsons = [orjson.dumps(item) for item in items]
        args: list[Any] = [
            mode,
            self.limits.max_items,
            self.limits.max_bytes,
            self.ttl_ms,
            created_at,
            orjson.dumps(metadata),
        ]
        for item, raw in zip(items, jsons):
            args += [item["id"], raw]
        res = await self._io(lambda: self._append(keys=self.keys(conversation_id, tenant), args=args))
        status = int(res[0])
        if status == 0:
            raise ConversationNotFound(conversation_id)
        if status == -1:
            raise DuplicateItem(res[1].decode())
        if status == -2:
            raise ConversationFull(conversation_id)
        if status == -3:  # a random 48-hex-digit id taken: not a client's doing
            raise StoreUnavailable(f"conversation id collision: {conversation_id}")
        conv = _conversation(conversation_id, res[2])
        return Appended(conv, int(res[1]), tuple(items[int(i)] for i in res[3]))

    async def get(self, conversation_id: str, tenant: str | None) -> Conversation | None:
        meta = await self._io(lambda: self.redis.hmget(self.keys(conversation_id, tenant)[0], _META))
        return _conversation(conversation_id, meta) if meta[0] is not None else None

    async def update(self, conversation_id: str, tenant: str | None, metadata: dict[str, str]) -> Conversation | None:
        meta = await self._io(
            lambda: self._update(keys=self.keys(conversation_id, tenant)[:1], args=[orjson.dumps(metadata)])
        )
        return _conversation(conversation_id, meta) if meta else None

    async def delete(self, conversation_id: str, tenant: str | None) -> bool:
        n = await self._io(lambda: self.redis.delete(*self.keys(conversation_id, tenant)))
        return bool(n)

    async def items(self, conversation_id: str, tenant: str | None) -> tuple[Conversation, list[Item]]:
        res = await self._io(lambda: self._items(keys=self.keys(conversation_id, tenant), args=[]))
        if not res:
            raise ConversationNotFound(conversation_id)
        meta, raws = res
        return _conversation(conversation_id, meta), [orjson.loads(r) for r in raws if r is not None]

    async def page(
        self, conversation_id: str, tenant: str | None, *, after: str | None, limit: int, order: Order
    ) -> Page:
        res = await self._io(
            lambda: self._page(keys=self.keys(conversation_id, tenant), args=[after or "", limit + 1, order])
        )
        if int(res[0]) == 0:
            raise ConversationNotFound(conversation_id)
        if int(res[0]) == 2:
            raise UnknownCursor(after or "")
        items = [orjson.loads(r) for r in res[1] if r is not None]
        return Page(items[:limit], len(items) > limit)

    async def item(self, conversation_id: str, tenant: str | None, item_id: str) -> Item | None:
        meta, items = self.keys(conversation_id, tenant)[0::2]

        async def read() -> list[Any]:
            async with self.redis.pipeline(transaction=False) as p:
                p.exists(meta)
                p.hget(items, item_id)
                return await p.execute()

        exists, raw = await self._io(read)
        if not exists:
            raise ConversationNotFound(conversation_id)
        return orjson.loads(raw) if raw is not None else None

    async def delete_item(self, conversation_id: str, tenant: str | None, item_id: str) -> Conversation | None:
        res = await self._io(
            lambda: self._delete_item(keys=self.keys(conversation_id, tenant), args=[item_id, self.ttl_ms])
        )
        if int(res[0]) == 0:
            raise ConversationNotFound(conversation_id)
        return _conversation(conversation_id, res[1]) if int(res[0]) == 1 else None

    async def close(self) -> None:
        await self.redis.aclose()


def _conversation(conversation_id: str, meta: Sequence[Any]) -> Conversation:
    created_at, metadata, rev, count, nbytes = meta
    return Conversation(conversation_id, int(created_at), orjson.loads(metadata), int(rev), int(count), int(nbytes))
