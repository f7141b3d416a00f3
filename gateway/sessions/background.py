"""Background responses (``background: true``, HTTP only): run detached from the request that
created them, polled, cancelled and resumed by id — on any replica when Redis is configured.

OpenAI's semantics: ``background`` needs ``store`` (a 400 otherwise, ``gateway.turn.checks``); the
create answers at once with the ``queued`` Response (or, with ``stream: true``, streams
``response.created`` (queued) -> ``response.queued`` -> ``response.in_progress`` -> ...); the turn
survives its client, and is finalized, stored and billed like any other turn. ``GET
/v1/responses/{id}`` reads the stored state (queued, in_progress, then final); ``POST
.../cancel`` aborts the engine request and answers with the response as it ended — idempotent,
and a response that already ended is returned unchanged; ``GET ...?stream=true&starting_after=N``
replays the events after ``N`` and follows the live ones (``cache.event_log``). A client going
away — from the create's stream or from a resume — stops only its own reading.

**This replica** runs what it accepted (:class:`~gateway.sessions.background_turn.BackgroundTurn`)
and keeps at most ``background_max_per_tenant`` per tenant queued or running (429 beyond, counted
in ``respgate_rate_limit_rejections_total{limit="background"}``).

**Other replicas** (Redis, ``cache.leases``): a poll reads the shared store; a cancel asks the
owner through its cancel list and waits (up to ``CANCEL_WAIT_S``) for the stored state to end;
a resume reads the Redis copy of the event log.

**A replica that dies mid-turn.** Its leases lapse (``background_lease_s``). Every replica sweeps
the lapsed leases each third of the lease; the one that claims a response (exactly one does)
marks it ``failed`` (``OWNER_LOST_MESSAGE``, code ``server_error``), appends an ``error`` event and
``response.failed`` to its event log so that resumed streams end, and bills it once, as
``failed`` with zero tokens: its partial output died with the process, and the gateway does not
charge for work it cannot show. (A dead owner that had already billed its outcome — it died
between billing and releasing the lease — has that record in its usage WAL; the ledger is
idempotent by response id, so the response is still billed once.) Without Redis the store dies
with the process, and so does every trace of the turn: nothing is billed for it.

A lease must outlast any stall of a live owner's event loop: a replica whose lease lapsed while
it lived finds it gone at its next renewal and stops the turn, but by then another replica has
marked it failed (and billed it, first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import msgspec
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from billing.usage import UsageQueue, UsageRecord
from cache.event_log import LogUnavailable, MemoryEventLogs, RedisEventLog, Truncated
from cache.leases import RedisLeases
from cache.redis_client import AsyncClient, connect
from cache.response_state import ResponseState
from cache.response_store import ResponseStore, StoreUnavailable
from gateway.access.rate_limits import Access, rate_limit_error
from gateway.base.log_limit import RateLimitedLog
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.sessions.background_turn import ACTIVE, TERMINAL_EVENTS, BackgroundTurn, Slot, placeholder, snapshot
from gateway.transport.inflight import HttpTurn
from gateway.transport.sse import sse_frame
from gateway.turn.events import Event, late_terminal
from gateway.turn.finalize import Finalizer, timed_put
from gateway.turn.types import PreparedTurn, UsageHook
from gateway.wire.errors import ApiError, bad_request, response_not_found, store_unavailable
from gateway.wire.kinds import CHAINABLE, ResponseStatus
from gateway.wire.response import usage_object

log = logging.getLogger(__name__)
outage_log = RateLimitedLog(log)

#: ``error.message`` of a background response whose replica stopped before it finished
OWNER_LOST_MESSAGE = "The server running this response stopped before it finished. Please retry your request."
#: how long a cancel on another replica than the owner waits for the response to end
CANCEL_WAIT_S = 10.0


class BackgroundTurns:
    """This replica's background responses, and its part in everyone's (module docstring)."""

    def __init__(self, settings: Settings, store: ResponseStore, finalizer: Finalizer, usage: UsageQueue,
                 metrics: Metrics, access: Access, http_turns: set[Any]) -> None:
        self.settings = settings
        self.store = store
        self.finalizer = finalizer
        self.usage = usage
        self.metrics = metrics
        self.access = access
        self.http_turns = http_turns
        self.logs = MemoryEventLogs(settings.background_events_bytes, settings.background_events_total_bytes,
                                    settings.background_events_ttl_s)
        self._local: dict[str, BackgroundTurn] = {}
        self._per_tenant: dict[str | None, int] = {}
        self._loops: list[asyncio.Task[None]] = []
        self.redis: AsyncClient | None = None
        self.leases: RedisLeases | None = None
        self.shared_log: RedisEventLog | None = None
        if settings.redis_url:
            self.redis = connect(
                settings.redis_url, socket_connect_timeout=2.0, socket_timeout=5.0,  # > BLPOP's and XREAD's 1 s
                retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1))
            self.leases = RedisLeases(self.redis, lease_s=settings.background_lease_s)
            self.shared_log = RedisEventLog(self.redis, max_bytes=settings.background_events_bytes,
                                            ttl_s=settings.background_events_ttl_s)

    # -- gauges -------------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return sum(1 for bg in self._local.values() if bg.phase == "queued")

    @property
    def running(self) -> int:
        return sum(1 for bg in self._local.values() if bg.phase == "running")

    # -- accepting one --------------------------------------------------------------------------------

    def admit(self, tenant: str | None) -> Slot:
        """A place in the tenant's limit, before the create is prepared; 429 beyond it."""
        limit = self.settings.background_max_per_tenant
        n = self._per_tenant.get(tenant, 0)
        if limit is not None and n >= limit:
            self.access.rejected("http", "background")
            raise rate_limit_error(f"Too many background responses queued or in progress for this tenant (limit "
                                   f"{limit}). Wait for one to finish, or cancel one.", "requests")
        self._per_tenant[tenant] = n + 1
        return Slot(lambda: self._unslot(tenant))

    def _unslot(self, tenant: str | None) -> None:
        n = self._per_tenant.get(tenant, 0) - 1
        if n > 0:
            self._per_tenant[tenant] = n
        else:
            self._per_tenant.pop(tenant, None)

    async def start(self, turn: PreparedTurn, events: AsyncIterator[Event], slot: Slot,
                    on_usage: UsageHook | None) -> BackgroundTurn:
        """Store the ``queued`` state (after taking the lease), then run the turn in its own task.
        A store or Redis outage refuses the create (503) before anything ran or was billed."""
        state = placeholder(turn, snapshot(turn.response))
        try:
            if self.leases is not None:
                await self.leases.acquire(turn.id, {"tenant": turn.ctx.tenant, "model": turn.route.name,
                                                    "stream": bool(turn.req.stream), "created_at": turn.created_at})
            await self._timed_put(state)
        except (StoreUnavailable, RedisError) as exc:
            outage_log.warning("background_start", "background response %s refused, state not stored: %s",
                               turn.id, exc)
            await self._release_quietly(turn.id)
            slot.release()
            if on_usage is not None:
                on_usage(usage_object(0, 0, 0, 0))  # hand the reserved prompt tokens back
            raise store_unavailable() from None
        streamed = bool(turn.req.stream)
        bg = BackgroundTurn(self, turn, slot, state, self.logs.open(turn.id, turn.ctx.tenant) if streamed else None,
                            self.shared_log.writer(turn.id) if streamed and self.shared_log is not None else None)
        self._local[turn.id] = bg
        bg.running = HttpTurn.start(self.http_turns, turn, events, bg.deliver, bg.settle)
        return bg

    # -- how one ends (called by BackgroundTurn, in its task) -----------------------------------------------

    async def put_quietly(self, state: ResponseState) -> None:
        """An intermediate state: a failed write is logged, and the next one (the final) repairs it."""
        try:
            await self._timed_put(state)
        except StoreUnavailable as exc:
            outage_log.warning("background_progress", "state of background response %s not stored: %s",
                               state.id, exc)

    async def finished(self, bg: BackgroundTurn, response: dict[str, Any]) -> None:
        """The turn ended and was billed: check that its final state is stored, then release it."""
        await self.finalizer.wait_for(bg.id)
        try:
            if response["status"] in ACTIVE:  # its finalize crashed before billing (logged there)
                await self._abandon(bg.state, bg.state.response,
                                    {"model": bg.state.model, "created_at": bg.state.created})
            elif response["status"] not in CHAINABLE:
                # failed or cancelled: finalize wrote it off the turn's path, maybe not at all (a
                # completed or incomplete one was stored before it was billed, or it failed instead)
                stored = await self.store.get(bg.id, bg.tenant)
                if stored is not None and stored.status in ACTIVE:  # the write was lost: store the outcome
                    await self._timed_put(msgspec.structs.replace(stored, response=snapshot(response)))
            if self.leases is not None:
                await self.leases.release(bg.id)
        except (StoreUnavailable, RedisError) as exc:  # the lease lapses; another replica finishes it
            outage_log.warning("background_finish", "background response %s: end not recorded: %s", bg.id, exc)

    def forget(self, bg: BackgroundTurn) -> None:
        if self._local.get(bg.id) is bg:
            del self._local[bg.id]
        bg.slot.release()

    # -- cancel ---------------------------------------------------------------------------------------------

    async def cancel(self, state: ResponseState, tenant: str | None) -> dict[str, Any]:
        """``POST /v1/responses/{id}/cancel``: the Response as it ended (see the module docstring)."""
        if not state.response.get("background"):
            raise bad_request("Cannot cancel a synchronous response.", param="response_id")
        if state.status not in ACTIVE:
            return state.response
        bg = self._local.get(state.id)
        if bg is not None and bg.running is not None:
            self.metrics.background_cancels.labels("local").inc()
            bg.cancel()
            await asyncio.wait({bg.running.task})  # aborted, billed, stored, released
            return await self._latest(state.id, tenant, bg.running.response)
        if self.leases is None:  # one process: it ended while this request read it
            return await self._latest(state.id, tenant, state.response)
        self.metrics.background_cancels.labels("remote").inc()
        leases = self.leases
        try:
            await leases.request_cancel(state.id)
            deadline = time.monotonic() + CANCEL_WAIT_S
            # the owner releases the lease once the final state is stored: wait on the (small)
            # lease, then read the state once
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                alive = await leases.alive(state.id)
                if alive is None:
                    break
                if alive is False and await leases.claim(state.id):
                    await self._reap(state.id)
                    break
        except RedisError:
            raise store_unavailable() from None
        return (await self._get(state.id, tenant)).response

    async def _latest(self, response_id: str, tenant: str | None, fallback: dict[str, Any]) -> dict[str, Any]:
        try:
            state = await self.store.get(response_id, tenant)
        except StoreUnavailable:
            return fallback
        return fallback if state is None else state.response

    async def _get(self, response_id: str, tenant: str | None) -> ResponseState:
        try:
            state = await self.store.get(response_id, tenant)
        except StoreUnavailable:
            raise store_unavailable() from None
        if state is None:
            raise response_not_found(response_id)
        return state

    # -- resume -------------------------------------------------------------------------------------------

    async def open_stream(self, state: ResponseState, tenant: str | None, after: int) -> AsyncIterator[bytes]:
        """The SSE frames after sequence number ``after`` (-1: all), then the live ones. Raises the
        400s before anything is sent: not a background response, no events kept, or ``after`` older
        than the window."""
        rid = state.id
        if not state.response.get("background"):
            raise bad_request("Streaming retrieval is only available for background responses.",
                              code="unsupported_parameter", param="stream")
        local = self.logs.get(rid)
        if local is not None:
            if after + 1 < local.first_seq:
                raise _truncated(rid, local.first_seq)
            return self._frames(rid, tenant, local.follow(after), after, lambda: _done(local.terminal_seq is not None))
        if self.shared_log is None or self.leases is None:
            raise _no_events(rid, self.settings.background_events_ttl_s)
        try:
            bounds = await self.shared_log.bounds(rid)
            info = await self.leases.info(rid) if bounds is None else None
        except RedisError:
            raise store_unavailable() from None
        if bounds is None and not (info is not None and info.get("stream")):
            raise _no_events(rid, self.settings.background_events_ttl_s)
        if bounds is not None and after + 1 < bounds[0]:
            raise _truncated(rid, bounds[0])
        shared = self.shared_log
        if bounds is not None and bounds[2] and after >= bounds[1]:  # nothing after the terminal
            return _empty()

        async def logged() -> bool:
            got = await shared.bounds(rid)
            return got is not None and got[2]

        return self._frames(rid, tenant, shared.follow(rid, after, lambda: self._over(rid, tenant)), after, logged)

    async def _frames(self, rid: str, tenant: str | None, source: AsyncIterator[bytes], after: int,
                      has_terminal: Callable[[], Awaitable[bool]]) -> AsyncIterator[bytes]:
        """A log's frames as one SSE stream that always ends with a terminal event: a gap or an
        outage while following ends it with an ``error`` event; a log that stopped short of its
        terminal (its owner died, or it was dropped) ends with the stored response's terminal. A
        reader that started after the terminal gets nothing."""
        last, ended = after, False
        try:
            async for frame in source:
                last += 1
                ended = _event_type(frame) in TERMINAL_EVENTS
                yield frame
        except Truncated as exc:
            yield sse_frame(_truncated(rid, exc.first_kept).sse_event(last + 1))
            return
        except LogUnavailable:
            yield sse_frame(store_unavailable().sse_event(last + 1))
            return
        if not ended:
            try:
                state = None if await has_terminal() else await self.store.get(rid, tenant)
            except (StoreUnavailable, RedisError):
                state = None
            if state is not None and state.status not in ACTIVE:
                yield sse_frame(late_terminal(state.response, last + 1))

    async def _over(self, rid: str, tenant: str | None) -> bool:
        """For a reader of the Redis log waiting for events: has the response ended? Its lease
        says while it runs (a lapsed one is finished here, which appends the closing events the
        reader then gets); the stored state says once it is released."""
        assert self.leases is not None
        try:
            alive = await self.leases.alive(rid)
            if alive is False and await self.leases.claim(rid):
                await self._reap(rid)
            if alive is not None:
                return False
            state = await self.store.get(rid, tenant)
            return state is None or state.status not in ACTIVE
        except (StoreUnavailable, RedisError) as exc:
            outage_log.warning("background_follow", "background response %s: cannot check its state: %s", rid, exc)
        return False

    # -- replicas that died (Redis) ---------------------------------------------------------------------

    async def _reap(self, rid: str) -> None:
        """Finish a response whose owner's lease lapsed, once (this replica claimed it)."""
        assert self.leases is not None
        info = await self.leases.info(rid)
        if info is None:
            return
        state = await self.store.get(rid, info.get("tenant"))
        if state is not None and state.status in ACTIVE:
            log.warning("background response %s: its replica stopped renewing its lease; marked failed", rid)
            await self._abandon(state, state.response, info)
            self.metrics.background_reaped.inc()
        await self.leases.forget(rid)

    async def _abandon(self, state: ResponseState, response: dict[str, Any], info: dict[str, Any]) -> None:
        """Store ``failed`` (``OWNER_LOST_MESSAGE``), end its event log, bill it once with zero tokens."""
        failed = dict(response, status=ResponseStatus.FAILED.value, completed_at=None, usage=usage_object(0, 0, 0, 0),
                      error={"code": "server_error", "message": OWNER_LOST_MESSAGE, "type": "server_error",
                             "param": None, "misalignment": None})
        await self._timed_put(msgspec.structs.replace(state, response=failed))
        if self.shared_log is not None and info.get("stream"):
            bounds = await self.shared_log.bounds(state.id)
            if bounds is None or not bounds[2]:  # (an owner that wrote its terminal before dying: left as is)
                last = bounds[1] if bounds is not None else -1
                err = ApiError(500, OWNER_LOST_MESSAGE, type="server_error", code="server_error").sse_event(last + 1)
                await self.shared_log.append(state.id, [(last + 1, sse_frame(err), False),
                                                        (last + 2, sse_frame(late_terminal(failed, last + 2)), True)])
        now = time.time()
        created = float(info.get("created_at") or now)
        self.usage.submit(UsageRecord(
            response_id=state.id, model=str(info.get("model") or state.model), tenant=state.tenant,
            status=ResponseStatus.FAILED.value, input_tokens=0, cached_tokens=0, output_tokens=0, reasoning_tokens=0,
            transport="http", created_at=created, finished_at=now, ttft_s=None, duration_s=max(0.0, now - created)))

    async def _heartbeat(self) -> None:
        """Renew this replica's leases; finish the responses whose owners' leases lapsed."""
        assert self.leases is not None
        while True:
            await asyncio.sleep(self.settings.background_lease_s / 3)
            try:
                for rid in await self.leases.renew(list(self._local)):
                    bg = self._local.get(rid)
                    if bg is not None:
                        log.error("background response %s: its lease lapsed while it ran here (an event-loop stall "
                                  "longer than background_lease_s?); another replica marked it failed: stopping it",
                                  rid)
                        bg.cancel()
                for rid in await self.leases.expired():
                    if await self.leases.claim(rid):
                        await self._reap(rid)
            except (StoreUnavailable, RedisError) as exc:
                outage_log.warning("background_heartbeat", "background leases not renewed: %s", exc)
            except Exception:
                log.exception("background heartbeat crashed; retrying")

    async def _cancels(self) -> None:
        """Cancel requests other replicas sent to this one."""
        assert self.leases is not None
        while True:
            try:
                rid = await self.leases.next_cancel(1.0)
            except RedisError as exc:
                outage_log.warning("background_cancels", "background cancel requests not read: %s", exc)
                await asyncio.sleep(1.0)
                continue
            bg = self._local.get(rid) if rid is not None else None
            if bg is not None:
                bg.cancel()

    # -- lifetime -----------------------------------------------------------------------------------------

    def start_loops(self) -> None:
        if self.leases is not None and not self._loops:
            self._loops = [asyncio.ensure_future(self._heartbeat()), asyncio.ensure_future(self._cancels())]

    async def close(self) -> None:
        """Shutdown: the server has drained or cut every turn (``gateway.ops.server``); cut what a
        server without that shutdown left, then stop the loops and close Redis."""
        for bg in list(self._local.values()):
            if bg.running is not None:
                await bg.running.cut()
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        if self.redis is not None:
            await self.redis.aclose()

    async def _timed_put(self, state: ResponseState) -> None:
        await timed_put(self.store, self.metrics, state)

    async def _release_quietly(self, rid: str) -> None:
        if self.leases is not None:
            try:
                await self.leases.release(rid)
            except RedisError:
                pass


async def _done(value: bool) -> bool:
    return value


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


def _event_type(frame: bytes) -> str:
    """``event: <type>\\n...``: the type of an SSE frame (``gateway.transport.sse``)."""
    return frame[7:frame.find(b"\n")].decode()


def _no_events(rid: str, ttl_s: float) -> ApiError:
    return bad_request(f"No event stream is kept for response '{rid}': only background responses created with "
                       f"stream=true keep their events, for {ttl_s:g} s after the last one. Retrieve it without "
                       "stream=true.", code="invalid_value", param="stream")


def _truncated(rid: str, first_kept: int) -> ApiError:
    return bad_request(f"The events of response '{rid}' before sequence number {first_kept} are no longer kept; "
                       f"resume from starting_after={first_kept - 1} or later, or retrieve it without stream=true.",
                       code="invalid_value", param="starting_after")
