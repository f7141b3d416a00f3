"""Per-key rate limits: requests and tokens per minute, as token buckets (memory, or Redis + Lua).

**Why buckets and not fixed windows.** Each limit is a bucket holding up to ``limit`` units that
refills continuously at ``limit / 60`` units a second. A fixed one-minute window lets a client
spend twice its limit across a window edge; a bucket never does, and it tells a refused client
exactly how long to wait (``retry-after``) instead of "until the minute ends". It also makes the
headers OpenAI clients read (``x-ratelimit-remaining-*``, ``x-ratelimit-reset-*`` = time until the
bucket is full again) a direct readout of its state.

**Token cost is reconciled after the turn.** A turn's output tokens are only known at its end. So
a turn is admitted in two steps — ``acquire(requests=1)`` when the request arrives (refused if
either bucket is empty), then ``acquire(tokens=prompt)`` once the prompt is rendered (refused if the
prompt does not fit; a prompt larger than the whole limit can never fit: "request too large") —
and ``adjust(tokens=actual - reserved)`` after the terminal event charges the output. The bucket
may go negative then (debt): later turns wait until it refills, so a client cannot exceed its
limit by asking for long outputs.

**Atomic across replicas.** The Redis limiter runs each step as one Lua script (Redis executes
scripts atomically) with Redis's own clock (``TIME``), so replicas with skewed clocks share one
consistent bucket per key and two replicas can never both spend the last unit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import msgspec

Kind = Literal["requests", "tokens"]
WINDOW_S = 60.0


class Quota(msgspec.Struct, frozen=True):
    """Limits per minute; ``None`` = unlimited."""

    rpm: int | None = None
    tpm: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.rpm is None and self.tpm is None


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    quota: Quota
    #: bucket levels after the step (may be negative: debt after reconciliation)
    requests_level: float
    tokens_level: float
    #: which limit refused the step, and how many units it needed
    refused: Kind | None = None
    needed: int = 0

    @property
    def retry_after_s(self) -> float:
        """Seconds until the refused step would fit (``inf``: never, it exceeds the limit)."""
        if self.refused is None:
            return 0.0
        cap, level = self._bucket(self.refused)
        if self.needed > cap:
            return math.inf
        return max(0.0, (self.needed - level) * WINDOW_S / cap)

    def remaining(self, kind: Kind) -> int:
        return max(0, math.floor(self._bucket(kind)[1]))

    def reset_s(self, kind: Kind) -> float:
        """Seconds until that bucket is full again."""
        cap, level = self._bucket(kind)
        return max(0.0, (cap - level) * WINDOW_S / cap) if cap else 0.0

    def _bucket(self, kind: Kind) -> tuple[int, float]:
        if kind == "requests":
            return self.quota.rpm or 0, self.requests_level
        return self.quota.tpm or 0, self.tokens_level


class RateLimiterUnavailable(Exception):
    """The shared limiter cannot be reached."""


class RateLimiter(Protocol):
    async def acquire(self, subject: str, quota: Quota, *, requests: int = 0, tokens: int = 0) -> Decision:
        """Take ``requests`` and ``tokens`` from the subject's buckets if both fit, else take nothing.

        The token bucket must hold ``max(tokens, 1)``: a request is refused while the tokens are
        spent, before any work is done for it."""
        ...

    async def adjust(self, subject: str, quota: Quota, tokens: int) -> None:
        """Charge (or refund, if negative) tokens without a check: reconciliation after a turn."""
        ...

    async def close(self) -> None: ...


def _refill(level: float | None, ts: float, cap: int | None, now: float) -> float:
    if not cap:
        return 0.0
    if level is None:
        return float(cap)
    return min(float(cap), level + (now - ts) * cap / WINDOW_S)


class MemoryRateLimiter:
    """Buckets in this process (single host). Steps never await, so each one is atomic on the loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: subject -> [requests level, tokens level, time of last update]
        self._buckets: dict[str, list[float]] = {}

    def _levels(self, subject: str, quota: Quota, now: float) -> tuple[float, float]:
        b = self._buckets.get(subject)
        if b is None:
            return _refill(None, now, quota.rpm, now), _refill(None, now, quota.tpm, now)
        return _refill(b[0], b[2], quota.rpm, now), _refill(b[1], b[2], quota.tpm, now)

    async def acquire(self, subject: str, quota: Quota, *, requests: int = 0, tokens: int = 0) -> Decision:
        now = self.clock()
        rl, tl = self._levels(subject, quota, now)
        refused: Kind | None = None
        needed = 0
        if quota.rpm and requests > 0 and rl < requests:
            refused, needed = "requests", requests
        elif quota.tpm and tl < max(tokens, 1):
            refused, needed = "tokens", max(tokens, 1)
        if refused is None:
            rl, tl = rl - requests, tl - tokens
            self._buckets[subject] = [rl, tl, now]
        return Decision(refused is None, quota, rl, tl, refused, needed)

    async def adjust(self, subject: str, quota: Quota, tokens: int) -> None:
        if not quota.tpm or tokens == 0:
            return
        now = self.clock()
        rl, tl = self._levels(subject, quota, now)
        self._buckets[subject] = [rl, min(float(quota.tpm), tl - tokens), now]

    async def close(self) -> None:
        self._buckets.clear()


# ARGV: rpm, tpm (0 = unlimited), requests, tokens, mode ('acquire' | 'adjust').
# Returns {refused kind or '', requests level, tokens level, needed} (levels as strings: Lua
# numbers would be truncated to integers on the way back).
_BUCKET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local nreq, ntok, mode = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local v = redis.call('HMGET', KEYS[1], 'rl', 'tl', 'ts')
local function refill(l, cap)
  if cap <= 0 then return 0 end
  if not l then return cap end
  l = tonumber(l) + (now - tonumber(v[3])) * cap / 60
  if l > cap then l = cap end
  return l
end
local rl, tl = refill(v[1], rpm), refill(v[2], tpm)
local refused, need = '', 0
if mode == 'acquire' then
  if rpm > 0 and nreq > 0 and rl < nreq then
    refused, need = 'requests', nreq
  elseif tpm > 0 and tl < math.max(ntok, 1) then
    refused, need = 'tokens', math.max(ntok, 1)
  end
  if refused == '' then rl, tl = rl - nreq, tl - ntok end
else
  tl = tl - ntok
  if tl > tpm then tl = tpm end
end
if refused == '' then
  redis.call('HSET', KEYS[1], 'rl', tostring(rl), 'tl', tostring(tl), 'ts', tostring(now))
  local ttl = 1
  if rpm > 0 then ttl = math.max(ttl, math.ceil((rpm - rl) * 60 / rpm) + 1) end
  if tpm > 0 then ttl = math.max(ttl, math.ceil((tpm - tl) * 60 / tpm) + 1) end
  redis.call('EXPIRE', KEYS[1], ttl)
end
return {refused, tostring(rl), tostring(tl), tostring(need)}
"""


class RedisRateLimiter:
    """Buckets in Redis, one hash per subject (``{prefix}rl:{subject}``), expiring once full again."""

    def __init__(self, client: Any, prefix: str = "respgate:") -> None:
        self.redis = client
        self.prefix = prefix
        self._script = client.register_script(_BUCKET_LUA)

    @classmethod
    def from_url(cls, url: str, prefix: str = "respgate:") -> RedisRateLimiter:
        # the stores' client, like the response store: one quick retry (a stale pooled connection
        # after a Redis restart), an outage surfaces in seconds
        from cache.redis_client import connect_store

        return cls(connect_store(url), prefix)

    async def _run(self, subject: str, quota: Quota, requests: int, tokens: int, mode: str) -> list[Any]:
        from redis.exceptions import RedisError

        try:
            answer: list[Any] = await self._script(
                keys=[f"{self.prefix}rl:{subject}"], args=[quota.rpm or 0, quota.tpm or 0, requests, tokens, mode]
            )
            return answer
        except (TimeoutError, RedisError, OSError) as exc:
            raise RateLimiterUnavailable(str(exc)) from exc

    async def acquire(self, subject: str, quota: Quota, *, requests: int = 0, tokens: int = 0) -> Decision:
        refused, rl, tl, need = await self._run(subject, quota, requests, tokens, "acquire")
        kind = refused.decode() if isinstance(refused, bytes) else refused
        limit = cast(Literal["requests", "tokens"] | None, kind or None)  # what the script answers
        return Decision(not kind, quota, float(rl), float(tl), limit, int(float(need)))

    async def adjust(self, subject: str, quota: Quota, tokens: int) -> None:
        if quota.tpm and tokens:
            await self._run(subject, quota, 0, tokens, "adjust")

    async def close(self) -> None:
        await self.redis.aclose()
