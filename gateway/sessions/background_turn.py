"""One background response on the replica that runs it: what it records as it runs, and how it ends.

Its turn runs in the transport's turn task (``gateway.transport.inflight.HttpTurn``, handed in as
``launch``: tracked for the graceful shutdown like any HTTP turn) with no request attached: the
create has already been answered. What happens to it is decided by the machine
(``gateway.sessions.background_machine``: its ``phase`` is the machine's state); this module does
what the machine says. As events pass (``deliver``, in the turn's task):

- with ``stream: true`` each one is encoded once (its JSON) and appended to the response's event
  log (this process's, and Redis's when configured), which the create's stream and any resume read
  and frame for their transport;
- at ``response.in_progress`` the stored state is rewritten to say so. The ``queued`` state was
  written before the turn started, so a poll on any replica sees queued -> in_progress -> the
  final state, which the turn's own finalize writes (``gateway.turn.finalize``).

When the task ends, whatever ended it (``settle``, in the same task, after the turn's generator
is closed and billed): a stream that did not get its terminal gets the closing events (a cancel
ends with ``response.failed`` carrying the ``cancelled`` snapshot, the shutdown deadline or a fault
with an ``error`` event first); the logs are finished and flushed; once the final state is
stored (checked: a state still ``in_progress`` is overwritten with the outcome) the Redis lease
is released. A Redis or store failure here leaves the lease to lapse, and another replica then
finishes the response as one whose owner died (``gateway.sessions.replicas``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import orjson

from cache.event_log import EventLog, LoggedEvent, RedisLogWriter
from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.seq import TokenSeq
from gateway.sessions.background_machine import Act, Phase, Signal, step
from gateway.turn.events import Event, wire_event
from gateway.turn.types import PreparedTurn
from gateway.wire.kinds import TERMINAL_EVENT, ResponseStatus

if TYPE_CHECKING:
    from gateway.sessions.background import BackgroundTurns

log = logging.getLogger(__name__)

#: statuses of a background response that has not ended
ACTIVE = frozenset({ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS})
TERMINAL_EVENTS = frozenset(TERMINAL_EVENT.values())


class RunningTurn(Protocol):
    """The transport's turn task, as a background response uses it (``gateway.transport.inflight.HttpTurn``)."""

    #: the live Response; once the task ended, the snapshot as it was billed
    response: dict[str, Any]
    task: asyncio.Task[None]

    def stop(self, *, requested: bool = False) -> None: ...

    async def cut(self) -> int: ...


Deliver = Callable[[Event], Awaitable[None]]
Settle = Callable[[Any, "BaseException | None"], Awaitable[None]]
#: starts a turn in a task of its own, known to the shutdown: (turn, events, deliver, settle)
Launch = Callable[[PreparedTurn, AsyncIterator[Event], Deliver, Settle], RunningTurn]
#: the events that end a stream whose turn did not send its terminal: (running, last seq, faulted)
Closing = Callable[[Any, int, bool], list[Event]]


def logged(ev: Mapping[str, Any]) -> LoggedEvent:
    """An event (its wire form) as an event log keeps it: encoded once. Raises
    ``orjson.JSONEncodeError`` for one that does not encode."""
    kind = ev["type"]
    return LoggedEvent(ev["sequence_number"], kind, orjson.dumps(ev), kind in TERMINAL_EVENTS)


def snapshot(response: dict[str, Any]) -> dict[str, Any]:
    """A copy of a live Response that the turn's builder will not change under a reader."""
    return dict(response, output=list(response["output"]))


def placeholder(turn: PreparedTurn, response: dict[str, Any]) -> ResponseState:
    """The state stored while the response runs: retrievable (its Response, its input items for
    ``input_items``), never chained from (its status is not chainable), and with no context of its
    own — a Redis write of it is O(new input), not O(history)."""
    size = 1024 + 64 * len(turn.input.input_items)
    return ResponseState(
        id=turn.id,
        response=response,
        input_items=turn.input.input_items,
        context=ItemLog(),
        history_ids=TokenSeq(),
        model=turn.route.name,
        prelude_key=b"",
        store=True,
        tenant=turn.ctx.tenant,
        nbytes=size,
        delta_bytes=size,
        created=turn.created_at,
    )


class Slot:
    """A place in the tenant's background limit, given back once."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class BackgroundTurn:
    def __init__(
        self,
        owner: BackgroundTurns,
        turn: PreparedTurn,
        slot: Slot,
        state: ResponseState,
        events_log: EventLog | None,
        writer: RedisLogWriter | None,
    ) -> None:
        self.owner = owner
        self.id = turn.id
        self.tenant = turn.ctx.tenant
        self.tools_json = turn.tools_json
        self.slot = slot
        #: the stored ``queued`` state (later rewrites replace its Response only)
        self.state = state
        self.log = events_log
        self.writer = writer
        #: the machine's state (queued -> running -> ended)
        self.phase = Phase.QUEUED
        #: what the gauges count it as: its phase before it ended (a settling turn is still queued or
        #: running until it is forgotten, as the gauges counted it before the machine)
        self.counted = Phase.QUEUED
        self.last_seq = -1
        self.ended = False
        self.running: RunningTurn | None = None

    @property
    def created(self) -> dict[str, Any]:
        """The Response the create answers with (``queued``)."""
        return self.state.response

    def _step(self, signal: Signal) -> tuple[Act, ...]:
        self.phase, actions = step(self.phase, signal)
        if self.phase is not Phase.ENDED:
            self.counted = self.phase
        return actions

    def stop(self, signal: Signal) -> None:
        """A cancel (here or from another replica) or a lost lease: the machine says whether to stop."""
        for act in self._step(signal):
            if act is Act.STOP_TURN and self.running is not None:
                self.running.stop(requested=True)

    async def cut(self, settle_s: float) -> None:
        """Shutdown: abort it and wait until it is billed. One that is settling is left to finish its
        record, for ``settle_s`` at most (the shutdown's grace): past it, it is cut as any turn is (the
        cancel lands in its settling — a store or Redis that hangs must not hang the shutdown)."""
        if self.running is None:
            return
        if Act.CUT_TURN in self._step(Signal.SHUTDOWN):
            await self.running.cut()
            return
        _, late = await asyncio.wait({self.running.task}, timeout=settle_s)
        if late:
            log.warning("background response %s still settling after %g s at shutdown: cut", self.id, settle_s)
            await self.running.cut()

    async def deliver(self, ev: Event) -> None:
        if self.log is not None or self.writer is not None:
            # encoded in the turn's task, once for every reader: one that does not encode ends the turn
            self._record(logged(wire_event(ev, self.tools_json)))
        if ev["type"] == "response.in_progress":
            for act in self._step(Signal.IN_PROGRESS):
                if act is Act.STORE_PROGRESS:
                    await self.owner.put_quietly(msgspec.structs.replace(self.state, response=snapshot(ev["response"])))

    def _record(self, entry: LoggedEvent) -> None:
        if self.log is not None:
            self.log.append(entry)
        if self.writer is not None:
            self.writer.append(entry)
        self.last_seq, self.ended = entry.seq, entry.terminal

    async def settle(self, running: RunningTurn, fault: BaseException | None) -> None:
        try:
            for act in self._step(Signal.SETTLED):
                if act is Act.CLOSE_STREAM:
                    await self._close_stream(running, fault)
                elif act is Act.RECORD_OUTCOME:
                    await self.owner.finished(self, running.response)
        finally:  # Act.FORGET, even when what came before it failed
            self.owner.forget(self)

    async def _close_stream(self, running: RunningTurn, fault: BaseException | None) -> None:
        if not self.ended and (self.log is not None or self.writer is not None):
            for ev in self.owner.closing(running, self.last_seq, fault is not None):
                try:
                    entry = logged(ev)
                except orjson.JSONEncodeError:  # the failed snapshot holds what did not encode
                    continue
                self._record(entry)
        if self.log is not None:
            self.log.finish()
        if self.writer is not None:
            await self.writer.close()
