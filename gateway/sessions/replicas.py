"""This replica's part in the background responses of every replica, through Redis.

Why a room of its own: with ``redis_url`` set, a background response runs on the replica that
accepted it, and every other replica must still be able to cancel it, follow it, and finish it
when its owner died. What Redis holds for that is ``cache.leases`` (leases, owners' info, cancel
lists) and ``cache.event_log.RedisEventLog`` (the shared copy of each stream); this module runs the
loops over them and asks the machine (``gateway.sessions.background_machine``) what each answer means:

- **heartbeat** (every third of ``background_lease_s``): renew this replica's leases; a lease found
  gone (``lease_lost``: another replica claimed it while this one stalled) stops its turn. Then
  sweep the lapsed leases of everyone: each is claimed (``claim_won`` for exactly one replica) and
  reaped — stored ``failed``, its log ended, billed once with zero tokens
  (``BackgroundTurns._abandon``).
- **cancel watch**: pop the ids other replicas asked this one to cancel (``cancel_remote``).
- **probe** (a cancel waiting on another replica, a resumed stream waiting for events): the owner's
  lease held (wait), lapsed (claim, then reap or wait) or gone (read the stored state).

The client is the stores' (``cache.redis_client.connect_store``): an outage surfaces in seconds,
with one quick retry; its socket timeout (5 s) is above the 1 s that ``BLPOP`` and ``XREAD`` block.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from redis.exceptions import RedisError

from cache.event_log import RedisEventLog
from cache.leases import RedisLeases
from cache.redis_client import connect_store
from cache.response_state import ResponseState
from cache.response_store import ResponseStore, StoreUnavailable
from gateway.base.log_limit import RateLimitedLog
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.sessions.background_machine import Act, Phase, Signal, probe_signal, step
from gateway.sessions.background_turn import ACTIVE, BackgroundTurn

log = logging.getLogger(__name__)
outage_log = RateLimitedLog(log)

#: how often a cancel waiting on another replica probes the lease
PROBE_INTERVAL_S = 0.05

Abandon = Callable[[ResponseState, dict[str, Any], dict[str, Any]], Awaitable[None]]


class Replicas:
    """The leases, the shared event logs and the loops over them (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        store: ResponseStore,
        metrics: Metrics,
        local: Mapping[str, BackgroundTurn],
        abandon: Abandon,
    ) -> None:
        assert settings.redis_url
        self.settings = settings
        self.store = store
        self.metrics = metrics
        #: the responses this replica runs (``BackgroundTurns``'s map, read here)
        self.local = local
        self._abandon = abandon
        self.redis = connect_store(settings.redis_url)
        self.leases = RedisLeases(self.redis, lease_s=settings.background_lease_s)
        self.log = RedisEventLog(
            self.redis, max_bytes=settings.background_events_bytes, ttl_s=settings.background_events_ttl_s
        )
        self._loops: list[asyncio.Task[None]] = []

    # -- a response another replica runs ---------------------------------------------------------------

    async def probe(self, rid: str) -> Phase:
        """Where another replica's response stands, by its lease (reaping it if it lapsed and this
        replica wins the claim): FOREIGN (runs, or another replica finishes it), REAPED or GONE."""
        phase, actions = step(Phase.FOREIGN, probe_signal(await self.leases.alive(rid)))
        if Act.CLAIM in actions:
            phase = await self.claim_lapsed(rid)
        return phase

    async def claim_lapsed(self, rid: str) -> Phase:
        """A lapsed lease: claim it; the one replica that wins reaps the response."""
        won = await self.leases.claim(rid)
        phase, actions = step(Phase.LAPSED, Signal.CLAIM_WON if won else Signal.CLAIM_LOST)
        if Act.REAP in actions:
            await self._reap(rid)
        return phase

    async def _reap(self, rid: str) -> None:
        """Finish a response whose owner's lease lapsed, once (this replica claimed it)."""
        info = await self.leases.info(rid)
        if info is None:
            return
        state = await self.store.get(rid, info.get("tenant"))
        if state is not None and state.status in ACTIVE:
            log.warning("background response %s: its replica stopped renewing its lease; marked failed", rid)
            await self._abandon(state, state.response, info)
            self.metrics.background_reaped.inc()
        await self.leases.forget(rid)

    async def cancel_elsewhere(self, rid: str, wait_s: float) -> None:
        """Ask the owner to cancel ``rid``, then wait (up to ``wait_s``) until it ended: the owner
        releases the lease once the final state is stored, so the (small) lease is probed, and the
        caller reads the state once. Raises ``RedisError``."""
        await self.leases.request_cancel(rid)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            await asyncio.sleep(PROBE_INTERVAL_S)
            if await self.probe(rid) in (Phase.GONE, Phase.REAPED):
                break

    async def over(self, rid: str, tenant: str | None) -> bool:
        """For a reader of the Redis log waiting for events: has the response ended? Its lease
        says while it runs (a lapsed one is reaped here, which appends the closing events the
        reader then gets); the stored state says once it is released."""
        try:
            if await self.probe(rid) is not Phase.GONE:
                return False
            state = await self.store.get(rid, tenant)  # Act.READ_STATE
            return state is None or state.status not in ACTIVE
        except (StoreUnavailable, RedisError) as exc:
            outage_log.warning("background_follow", "background response %s: cannot check its state: %s", rid, exc)
        return False

    # -- the loops --------------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Renew this replica's leases; finish the responses whose owners' leases lapsed."""
        while True:
            await asyncio.sleep(self.settings.background_lease_s / 3)
            try:
                for rid in await self.leases.renew(list(self.local)):
                    bg = self.local.get(rid)
                    if bg is not None:
                        log.error(
                            "background response %s: its lease lapsed while it ran here (an event-loop stall "
                            "longer than background_lease_s?); another replica marked it failed: stopping it",
                            rid,
                        )
                        bg.stop(Signal.LEASE_LOST)
                for rid in await self.leases.expired():
                    await self.claim_lapsed(rid)
            except (StoreUnavailable, RedisError) as exc:
                outage_log.warning("background_heartbeat", "background leases not renewed: %s", exc)
            except Exception:
                log.exception("background heartbeat crashed; retrying")

    async def _cancels(self) -> None:
        """Cancel requests other replicas sent to this one."""
        while True:
            try:
                rid = await self.leases.next_cancel(1.0)
            except RedisError as exc:
                outage_log.warning("background_cancels", "background cancel requests not read: %s", exc)
                await asyncio.sleep(1.0)
                continue
            bg = self.local.get(rid) if rid is not None else None
            if bg is not None:
                bg.stop(Signal.CANCEL_REMOTE)

    # -- lifetime -----------------------------------------------------------------------------------------

    def start_loops(self) -> None:
        if not self._loops:
            self._loops = [asyncio.ensure_future(self._heartbeat()), asyncio.ensure_future(self._cancels())]

    async def close(self) -> None:
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        await self.redis.aclose()

    async def release_quietly(self, rid: str) -> None:
        try:
            await self.leases.release(rid)
        except RedisError:
            pass
