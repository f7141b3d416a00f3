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

The decisions are the machine's (``gateway.sessions.background_machine``: its table is the
lifecycle below, row by row); this module and its neighbours perform them:

- here, :class:`BackgroundTurns`: accepting one, starting it, how it ends, cancel, shutdown;
- ``gateway.sessions.background_turn``: one response this replica runs (its events, its end);
- ``gateway.sessions.replicas``: Redis — the leases' heartbeat, the cancel watch, the reaper;
- ``gateway.sessions.replay``: a stream resumed after ``N``, as events each transport frames.

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
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
from redis.exceptions import RedisError

from billing.usage import UsageQueue, UsageRecord
from cache.event_log import LoggedEvent, MemoryEventLogs
from cache.response_state import ResponseState
from cache.response_store import ResponseStore, StoreUnavailable
from gateway.base.log_limit import RateLimitedLog
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.sessions.background_machine import Cancel, Phase, Signal, plan_cancel
from gateway.sessions.background_turn import (
    ACTIVE,
    BackgroundTurn,
    Closing,
    Launch,
    Slot,
    logged,
    placeholder,
    snapshot,
)
from gateway.sessions.replay import Replayer
from gateway.sessions.replicas import Replicas
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


def limit_message(limit: int | None) -> str:
    """The 429's message when a tenant has ``background_max_per_tenant`` queued or running."""
    return (
        f"Too many background responses queued or in progress for this tenant (limit {limit}). Wait for one "
        "to finish, or cancel one."
    )


class BackgroundTurns:
    """This replica's background responses, and its part in everyone's (module docstring).

    ``launch`` starts a turn in the transport's task (``HttpTurn.start``: known to the shutdown) and
    ``closing`` gives the events that end a stream whose turn did not send its terminal: both
    handed in by the app, so that this room never imports the transport."""

    def __init__(
        self,
        settings: Settings,
        store: ResponseStore,
        finalizer: Finalizer,
        usage: UsageQueue,
        metrics: Metrics,
        launch: Launch,
        closing: Closing,
    ) -> None:
        self.settings = settings
        self.store = store
        self.finalizer = finalizer
        self.usage = usage
        self.metrics = metrics
        self.launch = launch
        self.closing = closing
        self.logs = MemoryEventLogs(
            settings.background_events_bytes, settings.background_events_total_bytes, settings.background_events_ttl_s
        )
        self._local: dict[str, BackgroundTurn] = {}
        self._per_tenant: dict[str | None, int] = {}
        #: the Redis side (None: one process, nothing shared)
        self.replicas = Replicas(settings, store, metrics, self._local, self._abandon) if settings.redis_url else None
        self.replay = Replayer(settings, store, self.logs, self.replicas)

    # -- gauges -------------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return sum(1 for bg in self._local.values() if bg.counted is Phase.QUEUED)

    @property
    def running(self) -> int:
        return sum(1 for bg in self._local.values() if bg.counted is Phase.RUNNING)

    # -- accepting one --------------------------------------------------------------------------------

    def admit(self, tenant: str | None) -> Slot | None:
        """A place in the tenant's limit, before the create is prepared; None beyond it (the
        transport answers 429, :func:`limit_message`)."""
        limit = self.settings.background_max_per_tenant
        n = self._per_tenant.get(tenant, 0)
        if limit is not None and n >= limit:
            return None
        self._per_tenant[tenant] = n + 1
        return Slot(lambda: self._unslot(tenant))

    def _unslot(self, tenant: str | None) -> None:
        n = self._per_tenant.get(tenant, 0) - 1
        if n > 0:
            self._per_tenant[tenant] = n
        else:
            self._per_tenant.pop(tenant, None)

    async def start(
        self, turn: PreparedTurn, events: AsyncIterator[Event], slot: Slot, on_usage: UsageHook | None
    ) -> BackgroundTurn:
        """Store the ``queued`` state (after taking the lease), then run the turn in its own task.
        A store or Redis outage refuses the create (503) before anything ran or was billed."""
        state = placeholder(turn, snapshot(turn.response))
        replicas = self.replicas
        try:
            if replicas is not None:
                await replicas.leases.acquire(
                    turn.id,
                    {
                        "tenant": turn.ctx.tenant,
                        "model": turn.route.name,
                        "stream": bool(turn.req.stream),
                        "created_at": turn.created_at,
                    },
                )
            await self._timed_put(state)
        except (StoreUnavailable, RedisError) as exc:
            outage_log.warning("background_start", "background response %s refused, state not stored: %s", turn.id, exc)
            if replicas is not None:
                await replicas.release_quietly(turn.id)
            slot.release()
            if on_usage is not None:
                on_usage(usage_object(0, 0, 0, 0))  # hand the reserved prompt tokens back
            raise store_unavailable() from None
        streamed = bool(turn.req.stream)
        bg = BackgroundTurn(
            self,
            turn,
            slot,
            state,
            self.logs.open(turn.id, turn.ctx.tenant) if streamed else None,
            replicas.log.writer(turn.id) if streamed and replicas is not None else None,
        )
        self._local[turn.id] = bg
        bg.running = self.launch(turn, events, bg.deliver, bg.settle)
        return bg

    # -- how one ends (called by BackgroundTurn, in its task) -----------------------------------------------

    async def put_quietly(self, state: ResponseState) -> None:
        """An intermediate state: a failed write is logged, and the next one (the final) repairs it."""
        try:
            await self._timed_put(state)
        except StoreUnavailable as exc:
            outage_log.warning("background_progress", "state of background response %s not stored: %s", state.id, exc)

    async def finished(self, bg: BackgroundTurn, response: dict[str, Any]) -> None:
        """The turn ended and was billed: check that its final state is stored, then release it."""
        await self.finalizer.wait_for(bg.id)
        try:
            if response["status"] in ACTIVE:  # its finalize crashed before billing (logged there)
                await self._abandon(
                    bg.state, bg.state.response, {"model": bg.state.model, "created_at": bg.state.created}
                )
            elif response["status"] not in CHAINABLE:
                # failed or cancelled: finalize wrote it off the turn's path, maybe not at all (a
                # completed or incomplete one was stored before it was billed, or it failed instead)
                stored = await self.store.get(bg.id, bg.tenant)
                if stored is not None and stored.status in ACTIVE:  # the write was lost: store the outcome
                    await self._timed_put(msgspec.structs.replace(stored, response=snapshot(response)))
            if self.replicas is not None:
                await self.replicas.leases.release(bg.id)
        except (StoreUnavailable, RedisError) as exc:  # the lease lapses; another replica finishes it
            outage_log.warning("background_finish", "background response %s: end not recorded: %s", bg.id, exc)

    def forget(self, bg: BackgroundTurn) -> None:
        if self._local.get(bg.id) is bg:
            del self._local[bg.id]
        bg.slot.release()

    # -- cancel ---------------------------------------------------------------------------------------------

    async def cancel(self, state: ResponseState, tenant: str | None) -> dict[str, Any]:
        """``POST /v1/responses/{id}/cancel``: the Response as it ended (see the module docstring)."""
        bg = self._local.get(state.id)
        here = bg is not None and bg.running is not None
        plan = plan_cancel(
            background=bool(state.response.get("background")),
            active=state.status in ACTIVE,
            here=here,
            shared=self.replicas is not None,
        )
        if plan is Cancel.REFUSE:
            raise bad_request("Cannot cancel a synchronous response.", param="response_id")
        if plan is Cancel.AS_IS:
            return state.response
        if plan is Cancel.LOCAL:
            assert bg is not None and bg.running is not None
            self.metrics.background_cancels.labels("local").inc()
            bg.stop(Signal.CANCEL)
            await asyncio.wait({bg.running.task})  # aborted, billed, stored, released
            return await self._latest(state.id, tenant, bg.running.response)
        if plan is Cancel.LATEST:  # one process: it ended while this request read it
            return await self._latest(state.id, tenant, state.response)
        assert self.replicas is not None
        self.metrics.background_cancels.labels("remote").inc()
        try:
            await self.replicas.cancel_elsewhere(state.id, CANCEL_WAIT_S)
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

    async def open_events(
        self, state: ResponseState, tenant: str | None, after: int
    ) -> AsyncGenerator[LoggedEvent, None]:
        """The events after sequence number ``after`` (-1: all), then the live ones, for the
        transport to frame (``gateway.sessions.replay``); the 400s are raised before any is sent."""
        return await self.replay.open(state, tenant, after)

    # -- a response whose owner is lost --------------------------------------------------------------------

    async def _abandon(self, state: ResponseState, response: dict[str, Any], info: dict[str, Any]) -> None:
        """Store ``failed`` (``OWNER_LOST_MESSAGE``), end its event log, bill it once with zero tokens."""
        failed = dict(
            response,
            status=ResponseStatus.FAILED.value,
            completed_at=None,
            usage=usage_object(0, 0, 0, 0),
            error={
                "code": "server_error",
                "message": OWNER_LOST_MESSAGE,
                "type": "server_error",
                "param": None,
                "misalignment": None,
            },
        )
        await self._timed_put(msgspec.structs.replace(state, response=failed))
        if self.replicas is not None and info.get("stream"):
            shared = self.replicas.log
            bounds = await shared.bounds(state.id)
            if bounds is None or not bounds[2]:  # (an owner that wrote its terminal before dying: left as is)
                last = bounds[1] if bounds is not None else -1
                err = ApiError(500, OWNER_LOST_MESSAGE, type="server_error", code="server_error").sse_event(last + 1)
                await shared.append(state.id, [logged(err), logged(late_terminal(failed, last + 2))])
        now = time.time()
        created = float(info.get("created_at") or now)
        self.usage.submit(
            UsageRecord(
                response_id=state.id,
                model=str(info.get("model") or state.model),
                tenant=state.tenant,
                status=ResponseStatus.FAILED.value,
                input_tokens=0,
                cached_tokens=0,
                output_tokens=0,
                reasoning_tokens=0,
                transport="http",
                created_at=created,
                finished_at=now,
                ttft_s=None,
                duration_s=max(0.0, now - created),
            )
        )

    # -- lifetime -----------------------------------------------------------------------------------------

    def start_loops(self) -> None:
        if self.replicas is not None:
            self.replicas.start_loops()

    async def close(self) -> None:
        """Shutdown: the server has drained or cut every turn (``gateway.ops.server``); cut what a
        server without that shutdown left, then stop the loops and close Redis. A turn still settling
        gets what is left of the shutdown's grace (``shutdown_grace_s``, one deadline for all of them)
        to finish its record, then is cut."""
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        for bg in list(self._local.values()):
            await bg.cut(max(0.0, deadline - time.monotonic()))
        if self.replicas is not None:
            await self.replicas.close()

    async def _timed_put(self, state: ResponseState) -> None:
        await timed_put(self.store, self.metrics, state)
