"""Which replica runs which background response, in Redis: leases, owners, cancel requests.

A background response runs in the replica that accepted it: its engine request, its event builder
and its billing live in that process and cannot move. Any other replica must still be able to
tell whether it runs, ask its owner to stop it, and finish it when the owner died. Redis holds:

- ``{p}{bg}:run``, a sorted set: response id -> lease deadline (milliseconds, Redis's clock). The
  owner renews the lease of every response it runs (``renew``); a deadline in the past means the
  owner stopped renewing — it died, or stalled for longer than the lease.
- ``{p}{bg}:info``, a hash: response id -> ``{owner, tenant, model, stream, created_at}``, what
  another replica needs to finish it (the tenant to read its state, the model and times for its
  usage record) and to reach its owner.
- ``{p}bgcancel:{owner}``, a list per replica: the ids other replicas asked it to cancel, popped by
  the owner with ``BLPOP``. A list rather than pub/sub: a request made while the owner's
  connection blinked is still there when it reconnects.

Times come from Redis (``TIME`` inside the scripts), so the replicas' clocks need not agree.
``claim`` is atomic: of several replicas that find one lease expired, exactly one gets it, so a
response whose owner died is finished — and billed — once.

Redis Cluster: every step is one command or one Lua script (no ``MULTI``: see
``cache.redis_client``). The two ``{bg}`` keys share a hash slot (``release`` and ``acquire`` touch
both); a cancel list is one key. That slot holds one small entry per *running* background response
of the whole deployment, so it is one shard's load by design: the lease sweep (``expired``) must see
every lease in one read, and the entries are bytes, not contexts (those are in the response store,
spread by chain).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from cache.redis_client import AsyncClient

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

_ACQUIRE = (
    _NOW
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""
)

_RENEW = (
    _NOW
    + """
local missing = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(missing, ARGV[i])
  end
end
return missing
"""
)

_EXPIRED = (
    _NOW
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[1]))
"""
)

_CLAIM = (
    _NOW
    + """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) < now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
"""
)

# KEYS run, info; ARGV id
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""

# KEYS the owner's cancel list; ARGV id, TTL (ms)
_REQUEST_CANCEL = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_STATE = (
    _NOW
    + """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s then return -1 end
if tonumber(s) < now then return 0 end
return 1
"""
)


class RedisLeases:
    """One replica's view of the background responses' leases (see the module docstring)."""

    def __init__(
        self, client: AsyncClient, *, lease_s: float, prefix: str = "respgate:", owner: str | None = None
    ) -> None:
        self.redis = client
        self.lease_ms = max(1, int(lease_s * 1000))
        self.prefix = prefix
        #: this process: a restarted replica is a new owner, whatever its host
        self.owner = owner or uuid.uuid4().hex
        self._run = f"{prefix}{{bg}}:run"
        self._info = f"{prefix}{{bg}}:info"
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._expired = client.register_script(_EXPIRED)
        self._claim = client.register_script(_CLAIM)
        self._state = client.register_script(_STATE)
        self._release = client.register_script(_RELEASE)
        self._request_cancel = client.register_script(_REQUEST_CANCEL)

    def _cancel_key(self, owner: str) -> str:
        return f"{self.prefix}bgcancel:{owner}"

    async def acquire(self, response_id: str, info: dict[str, Any]) -> None:
        """This replica runs ``response_id`` from now on (before its state is first written)."""
        await self._acquire(
            keys=[self._run, self._info], args=[self.lease_ms, response_id, orjson.dumps({**info, "owner": self.owner})]
        )

    async def renew(self, response_ids: Sequence[str]) -> list[str]:
        """Extend the leases; returns the ids whose lease was gone (another replica claimed them)."""
        if not response_ids:
            return []
        missing = await self._renew(keys=[self._run], args=[self.lease_ms, *response_ids])
        return [m.decode() if isinstance(m, bytes) else m for m in missing]

    async def release(self, response_id: str) -> None:
        """The response is finished, stored and billed here: no lease, no info."""
        await self._release(keys=[self._run, self._info], args=[response_id])

    async def info(self, response_id: str) -> dict[str, Any] | None:
        raw = await self.redis.hget(self._info, response_id)
        return None if raw is None else orjson.loads(raw)

    async def forget(self, response_id: str) -> None:
        """Drop the info of a response finished by ``claim``."""
        await self.redis.hdel(self._info, response_id)

    async def alive(self, response_id: str) -> bool | None:
        """True: its lease holds; False: it lapsed (``claim`` it); None: no lease (never, or released)."""
        state = await self._state(keys=[self._run], args=[response_id])
        return None if state < 0 else bool(state)

    async def expired(self, limit: int = 100) -> list[str]:
        ids = await self._expired(keys=[self._run], args=[limit])
        return [i.decode() if isinstance(i, bytes) else i for i in ids]

    async def claim(self, response_id: str) -> bool:
        """Take over a response whose lease lapsed; True for exactly one caller."""
        return bool(await self._claim(keys=[self._run], args=[response_id]))

    async def request_cancel(self, response_id: str) -> str | None:
        """Ask the owner to cancel ``response_id``; returns the owner (None: no owner recorded)."""
        info = await self.info(response_id)
        if info is None:
            return None
        # a dead owner's requests do not outlive its leases by much
        await self._request_cancel(keys=[self._cancel_key(info["owner"])], args=[response_id, 2 * self.lease_ms])
        return info["owner"]

    async def next_cancel(self, timeout_s: float) -> str | None:
        """The next id another replica asked this one to cancel, waiting up to ``timeout_s``."""
        got = await self.redis.blpop([self._cancel_key(self.owner)], timeout=timeout_s)
        if got is None:
            return None
        value = got[1]
        return value.decode() if isinstance(value, bytes) else value
