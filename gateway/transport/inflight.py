"""HTTP turns in flight: each runs in a task of its own, and the gateway knows it until it ends.

**A task of its own.** The request's task is not a safe place to run a turn: Starlette cancels a
streaming response through an anyio cancel scope when the client leaves, and anyio cancellation is
level-triggered — every later ``await`` in the scope is cancelled again, including the engine's own
abort (vLLM awaits ``abort()``) and the store write. Cancelling the turn's own task instead is
edge-triggered: the abort, the ``cancelled`` snapshot and its usage record all complete.

**Known to the gateway** (``GatewayState.http_turns``), as WebSocket connections are
(``GatewayState.connections``): at shutdown (``gateway/ops/server.py``) the gateway waits for both
within ``shutdown_grace_s``, then cuts what still runs itself — the engine request is aborted, the
cancelled snapshot finalized and billed, and the route answers (a 503 ``server_shutting_down``, or
on SSE an ``error`` event and ``response.failed``) — before uvicorn's own forced cancellation,
which would cancel only the request's task: the client would get a bare 500 and the turn, left
running, would never be billed.

**Always started before it is stopped.** A task cancelled before its first step never runs its
coroutine at all — not the turn's ``finally``, so nothing would be billed or stored. A stop that
comes that early is deferred by one loop iteration, by when the turn has started (and its
cancellation bills it ``cancelled``). A background turn (``gateway.sessions.background``) also
``settle``s in its own task after the turn's generator is closed, whatever ended it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from gateway.turn.events import Event, late_terminal
from gateway.turn.types import PreparedTurn
from gateway.wire.errors import is_fault, server_error, shutting_down
from gateway.wire.kinds import ResponseStatus

#: called once at the end of the turn's task, with the fault that ended it (None: none did)
Settle = Callable[["HttpTurn", "BaseException | None"], Awaitable[None]]

log = logging.getLogger(__name__)


class HttpTurn:
    """One HTTP create's turn: its events go to ``deliver``, from the turn's own task."""

    def __init__(
        self,
        turn: PreparedTurn,
        events: AsyncIterator[Event],
        deliver: Callable[[Event], Awaitable[None]],
        settle: Settle | None = None,
    ) -> None:
        #: the live Response: once the task ended, the snapshot as it was billed
        self.response: dict[str, Any] = turn.response
        #: the shutdown deadline cut the turn while it ran
        self.cut_short = False
        #: stopped because someone asked (``POST /responses/{id}/cancel``), not by a fault or the shutdown
        self.requested = False
        self._cancelled = False
        self._started = False
        self.task: asyncio.Task[None] = asyncio.ensure_future(self._pump(events, deliver, settle))

    @classmethod
    def start(
        cls,
        registry: set[Any],
        turn: PreparedTurn,
        events: AsyncIterator[Event],
        deliver: Callable[[Event], Awaitable[None]],
        settle: Settle | None = None,
    ) -> HttpTurn:
        """Start the turn and keep it in ``registry`` until its task ends."""
        running = cls(turn, events, deliver, settle)
        registry.add(running)
        running.task.add_done_callback(lambda _: registry.discard(running))
        running.task.add_done_callback(running._log_crash)
        return running

    def _log_crash(self, task: asyncio.Task[None]) -> None:
        """A fault that escaped the turn (the turn itself turns its faults into ``failed``): logged
        here, once, with its traceback, whether or not a route is still there to answer."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("response %s crashed", self.response.get("id"), exc_info=exc)

    async def _pump(
        self, events: AsyncIterator[Event], deliver: Callable[[Event], Awaitable[None]], settle: Settle | None
    ) -> None:
        self._started = True
        fault: BaseException | None = None
        try:
            async with contextlib.aclosing(events) as stream:  # type: ignore[type-var]
                async for ev in stream:
                    await deliver(ev)
        except BaseException as exc:
            fault = exc if is_fault(exc) else None
            raise
        finally:
            if settle is not None:
                await settle(self, fault)

    async def drain(self) -> None:
        """Shutdown: let the turn reach its end by itself."""
        await asyncio.wait({self.task})

    async def cut(self) -> int:
        """Shutdown deadline: abort the turn (billed as ``cancelled`` with what it generated) and
        wait until it is billed. Returns how many turns were cut (0: it had ended already)."""
        if self.task.done():
            return 0
        self.cut_short = True
        self._cancel()
        await asyncio.wait({self.task})
        return int(self.response["status"] == ResponseStatus.CANCELLED)

    def stop(self, *, requested: bool = False) -> None:
        """The request is over before the turn (client gone, or the request's task cancelled), or
        (``requested``) a client cancelled it: abort the turn in its own task, not awaited here
        (see the module docstring)."""
        if requested and not self.task.done():
            self.requested = True
        self._cancel()

    def _cancel(self) -> None:
        """Cancel the turn's task once: a second cancellation would land in the abort or the
        billing that the first one started. Not before the task's first step (module docstring)."""
        if self.task.done() or self._cancelled:
            return
        if not self._started:
            asyncio.get_running_loop().call_soon(self._cancel)
            return
        self._cancelled = True
        self.task.cancel()


def closing_events(running: HttpTurn, last: int, fault: bool) -> list[Event]:
    """The events that end a stream whose turn ended without sending its terminal: an ``error``
    event saying why (a fault, the shutdown deadline, or a server error), then the terminal of the
    response as it was billed — ``response.failed`` for a ``cancelled`` snapshot — so a stream
    never just stops. A turn a client cancelled gets only that terminal; one cut after it was
    billed ``completed`` only its own terminal. ``last``: the sequence number sent last. (The
    terminal may not encode: what made the turn fail is in its snapshot; the caller skips it.)"""
    status = running.response["status"]
    out: list[Event] = []
    if fault:  # logged by HttpTurn
        out.append(server_error().sse_event(last + 1))
    elif status in (ResponseStatus.IN_PROGRESS, ResponseStatus.CANCELLED) and not running.requested:
        out.append((shutting_down() if running.cut_short else server_error()).sse_event(last + 1))
    if status not in (ResponseStatus.IN_PROGRESS, ResponseStatus.QUEUED):
        out.append(late_terminal(running.response, last + 1 + len(out)))
    return out
