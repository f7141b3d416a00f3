"""Resumable ``store=false`` chains: a closed WebSocket's lane states, kept for a reconnect.

Why: a ``store=false`` chain lives only in its connection's cache (``cache.connection_state``), so a
socket that drops — a network blip, a rolling update's close 1001, the 60-minute limit — loses it
and the client's next ``response.create`` gets ``previous_response_not_found``. With
``ws_resume_window_s`` > 0 (off by default) a closing connection hands each lane's latest
``store=false`` response here instead of dropping it; a connection of the **same tenant** whose
turn names one as ``previous_response_id`` takes it into its own cache and continues.

Where and how long:

* **memory, this replica** — the state object as the connection held it (items and rendered token
  ids, no copy), so a reconnect to this replica appends without rendering the history again.
  Keyed by response id; dropped when claimed, at the end of the window (a timer), or — oldest
  first — when the replica's total (``ws_resume_max_bytes``) or the tenant's share
  (``ws_resume_tenant_bytes``) would be exceeded. Never written anywhere. The bounds are the
  house's one bounded map (``cache.lru.BoundedLRU``, its parts the tenants): the tenant's share is
  held as a hard cap here (its own oldest go first), and room beyond the total is made before each
  state is added, while no tenant is over its share, so that eviction is plain oldest-first.
* **Redis, with** ``ws_resume_redis`` — a sealed record per state (``cache.redis_resumable``: no
  token ids, encrypted and authenticated with the server secret, ``PX`` = the window), so a
  reconnect that lands on another replica continues from the items (one full render there).

Claimed once: a memory claim is a synchronous pop (two sockets of this replica racing: the first
wins); when a Redis record was written too, Redis decides between replicas — this replica wins only
if its ``DEL`` removed the record, the other only if its ``GETDEL`` returned it. Another tenant's
claim finds nothing and takes nothing. What is not claimed answers as today:
``previous_response_not_found`` (``gateway.turn.resolve``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cache.lru import BoundedLRU, TenantShared, tenant_of
from cache.redis_resumable import RedisResumable, ResumeUnavailable
from cache.response_state import ResponseState
from gateway.base.log_limit import RateLimitedLog
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.turn.sealing import Sealer
from gateway.wire.kinds import CHAINABLE

log = logging.getLogger(__name__)
outage_log = RateLimitedLog(log)

#: a record this big is sealed or opened in a worker thread (O(context) CPU off the event loop)
OFFLOAD_BYTES = 256 * 1024


@dataclass(slots=True)
class _Entry:
    state: ResponseState
    tenant: str | None
    expires: float
    nbytes: int
    #: the Redis write, when there is one: resolves True once the record is in Redis
    written: asyncio.Future[bool] | None = None


#: the map's entry bound: entries are bounded by their bytes (each state is at least one byte)
_MAX_ENTRIES = 2**31

Key = tuple[str | None, str]  # (tenant, response id)


class ResumableStates(TenantShared):
    """This replica's resumable lane states (and, with ``remote``, their Redis records)."""

    def __init__(
        self,
        *,
        window_s: float,
        max_bytes: int,
        tenant_bytes: int,
        metrics: Metrics,
        remote: RedisResumable | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.max_bytes = max_bytes
        self.tenant_bytes = tenant_bytes
        self.metrics = metrics
        self.remote = remote
        self._clock = clock
        # never "used" (a claim pops): least recently used = parked first = expires first. The share is
        # just above ``tenant_bytes`` so that a tenant at its cap (held by ``_add``) is never over it
        share = min(1.0, (tenant_bytes + 0.5) / max_bytes) if max_bytes else 1.0
        self._lru: BoundedLRU[Key, _Entry] = BoundedLRU(
            _MAX_ENTRIES, max_bytes, part=tenant_of, share=share, on_evict=self._evicted
        )
        #: response id -> tenant of every entry held (a claim names the id only)
        self._ids: dict[str, str | None] = {}
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics) -> ResumableStates | None:
        """None when resuming is off (``ws_resume_window_s`` = 0)."""
        if not settings.ws_resume_window_s:
            return None
        remote = None
        if settings.ws_resume_redis:
            # validated by Settings: a Redis URL and a shared secret (other replicas must open the
            # records); a key of its own, so a record is never accepted as reasoning and vice versa
            assert settings.redis_url and settings.seal_secret
            sealer = Sealer(b"ws-resume:" + settings.seal_secret.encode())
            remote = RedisResumable.from_url(settings.redis_url, sealer)
        return cls(
            window_s=settings.ws_resume_window_s,
            max_bytes=settings.ws_resume_max_bytes,
            tenant_bytes=settings.ws_resume_tenant_bytes,
            metrics=metrics,
            remote=remote,
        )

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._ids

    def tenant_nbytes(self, tenant: str | None) -> int:
        return self.tenant_usage(tenant)[1]

    # -- a connection closes ----------------------------------------------------------------------

    async def park(self, tenant: str | None, states: Iterable[ResponseState]) -> int:
        """Keep a closed connection's lane states for the window; returns how many were kept.
        Only ``store=false`` ones: a stored response resolves from the response store anyway."""
        kept: list[_Entry] = []
        for state in states:
            if state.store or state.status not in CHAINABLE or state.id in self._ids:
                continue
            entry = _Entry(state, tenant, self._clock() + self.window_s, max(1, state.nbytes))
            if not self._add(entry):
                continue
            if self.remote is not None:
                entry.written = asyncio.get_running_loop().create_future()
            kept.append(entry)
        for entry in kept:  # after every entry is claimable here: a claim waits for the write
            if entry.written is not None:
                ok = False
                try:
                    ok = await self._write(entry)
                finally:  # even cancelled: a claim waiting on it must not wait forever
                    entry.written.set_result(ok)
        return len(kept)

    def _add(self, entry: _Entry) -> bool:
        self._sweep()
        if entry.nbytes > self.tenant_bytes or entry.nbytes > self.max_bytes:
            self.metrics.ws_resumable.labels("evicted", "memory").inc()
            return False
        # the tenant's share, a hard cap: its own oldest go first (evictions, counted by ``_evicted``)
        while self.tenant_nbytes(entry.tenant) + entry.nbytes > self.tenant_bytes and self._lru.evict_one(
            prefer=entry.tenant
        ):
            pass
        # beyond the total the oldest of all make room, BEFORE the put: every tenant is then within
        # min(tenant_bytes, max_bytes), so none is over its share and ``evict_one`` takes the oldest
        # of all. (After the put, a tenant holding nearly the whole map while its share is the whole
        # of it — ``tenant_bytes`` >= ``max_bytes`` — would be over it, and lose its own oldest instead.)
        while self._lru.nbytes + entry.nbytes > self.max_bytes and self._lru.evict_one():
            pass
        self._ids[entry.state.id] = entry.tenant
        # forced: the per-value cap is the one above, not the map's quarter (room is already made)
        self._lru.put((entry.tenant, entry.state.id), entry, entry.nbytes, force=True)
        self.metrics.ws_resumable.labels("kept", "memory").inc()
        self.metrics.ws_resumable_bytes.set(self.nbytes)
        self._arm()
        return True

    async def _write(self, entry: _Entry) -> bool:
        assert self.remote is not None
        remote, state, tenant = self.remote, entry.state, entry.tenant
        try:
            if entry.nbytes > OFFLOAD_BYTES:
                blob = await asyncio.to_thread(remote.seal, state, tenant)
            else:
                blob = remote.seal(state, tenant)
        except Exception:  # a state that does not serialize is a bug: logged, kept in memory only
            log.exception("resumable state %s could not be sealed", state.id)
            return False
        try:
            ttl = entry.expires - self._clock()
            if ttl <= 0:
                return False
            await remote.put(state.id, tenant, blob, ttl)
        except ResumeUnavailable as exc:
            self.metrics.ws_resumable.labels("failed", "redis").inc()
            outage_log.log(logging.WARNING, "resume-write", "resumable state kept in memory only: %s", exc)
            return False
        self.metrics.ws_resumable.labels("kept", "redis").inc()
        return True

    # -- a reconnect names one --------------------------------------------------------------------

    async def claim(self, response_id: str, tenant: str | None) -> ResponseState | None:
        """The state ``response_id`` names, taken out for ``tenant`` (None: not kept, expired,
        another tenant's, or claimed already — here or on another replica)."""
        self._sweep()
        if response_id in self._ids:
            if self._ids[response_id] != tenant:
                return None  # another tenant's: nothing is taken, nothing said
            entry: _Entry = self._lru.pop((tenant, response_id))
            self._dropped(entry, None)  # synchronous: of two claims on this replica, this one has it
            if entry.written is not None and await entry.written and not await self._won(entry):
                self.metrics.ws_resumable.labels("lost", "memory").inc()
                return None
            self.metrics.ws_resumable.labels("claimed", "memory").inc()
            return entry.state
        if self.remote is None:
            return None
        return await self._take(response_id, tenant)

    async def _won(self, entry: _Entry) -> bool:
        """This replica claims a state it also wrote to Redis only if the record was still there."""
        assert self.remote is not None
        try:
            return await self.remote.discard(entry.state.id, entry.tenant)
        except ResumeUnavailable as exc:
            # nobody can take the record while Redis does not answer: the copy in hand is the claim
            self.metrics.ws_resumable.labels("failed", "redis").inc()
            outage_log.log(logging.WARNING, "resume-discard", "resumable state claimed without Redis: %s", exc)
            return True

    async def _take(self, response_id: str, tenant: str | None) -> ResponseState | None:
        assert self.remote is not None
        remote = self.remote
        try:
            blob = await remote.take(response_id, tenant)
        except ResumeUnavailable as exc:
            self.metrics.ws_resumable.labels("failed", "redis").inc()
            outage_log.log(logging.WARNING, "resume-take", "resumable state not read: %s", exc)
            return None
        if blob is None:
            return None
        if len(blob) > OFFLOAD_BYTES:
            state = await asyncio.to_thread(remote.open, blob, response_id, tenant)
        else:
            state = remote.open(blob, response_id, tenant)
        if state is None:  # sealed with another secret, or not this tenant's record: taken, useless
            self.metrics.ws_resumable.labels("failed", "redis").inc()
            outage_log.log(
                logging.WARNING,
                "resume-open",
                "a resumable state record did not open (replicas with different RESPGATE_SEAL_SECRET?)",
            )
            return None
        self.metrics.ws_resumable.labels("claimed", "redis").inc()
        return state

    # -- bookkeeping ------------------------------------------------------------------------------

    def _evicted(self, key: Key, entry: _Entry) -> None:
        """The map's bounds dropped ``entry`` (the tenant's cap, or the total)."""
        self._dropped(entry, "evicted")

    def _dropped(self, entry: _Entry, outcome: str | None) -> None:
        """``entry`` left the map (evicted, expired, claimed or closed): forget its id, say so."""
        if self._ids.get(entry.state.id, _NOBODY) == entry.tenant:
            del self._ids[entry.state.id]
        self.metrics.ws_resumable_bytes.set(self.nbytes)
        if outcome is not None:
            self.metrics.ws_resumable.labels(outcome, "memory").inc()

    def _sweep(self) -> None:
        now = self._clock()
        for _, entry in self._lru.sweep(lambda e: e.expires <= now, limit=None):
            self._dropped(entry, "expired")

    def _arm(self) -> None:
        """One timer for the oldest entry: an unclaimed state does not outlive its window."""
        oldest = self._lru.oldest()
        if self._timer is not None or oldest is None:
            return
        self._timer = asyncio.get_running_loop().call_later(max(0.0, oldest[1].expires - self._clock()), self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._sweep()
        self._arm()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for key, _ in list(self._lru.sweep(lambda e: True, limit=None)):
            self._ids.pop(key[1], None)
        self.metrics.ws_resumable_bytes.set(self.nbytes)
        if self.remote is not None:
            await self.remote.close()


_NOBODY = object()
