"""One background response on the replica that runs it: what it records as it runs, and how it ends.

Its turn runs in an :class:`~gateway.transport.inflight.HttpTurn` task (tracked for the graceful
shutdown like any HTTP turn) with no request attached: the create has already been answered. As
events pass (``deliver``, in the turn's task):

- with ``stream: true`` each one is framed once and appended to the response's event log (this
  process's, and Redis's when configured), which the create's stream and any resume read;
- at ``response.in_progress`` the stored state is rewritten to say so. The ``queued`` state was
  written before the turn started, so a poll on any replica sees queued -> in_progress -> the
  final state, which the turn's own finalize writes (``gateway.turn.finalize``).

When the task ends, whatever ended it (``settle``, in the same task, after the turn's generator
is closed and billed): a stream that did not get its terminal gets the closing events (a cancel
ends with ``response.failed`` carrying the ``cancelled`` snapshot, the shutdown deadline or a fault
with an ``error`` event first); the logs are finished and flushed; once the final state is
stored (checked: a state still ``in_progress`` is overwritten with the outcome) the Redis lease
is released. A Redis or store failure here leaves the lease to lapse, and another replica then
finishes the response as one whose owner died (``gateway.sessions.background``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import msgspec
import orjson

from cache.event_log import EventLog, RedisLogWriter
from cache.item_log import ItemLog
from cache.seq import TokenSeq
from cache.response_state import ResponseState
from gateway.transport.inflight import HttpTurn, closing_events
from gateway.transport.sse import sse_frame
from gateway.turn.events import Event, wire_event
from gateway.turn.types import PreparedTurn
from gateway.wire.kinds import TERMINAL_EVENT, ResponseStatus

if TYPE_CHECKING:
    from gateway.sessions.background import BackgroundTurns

log = logging.getLogger(__name__)

#: statuses of a background response that has not ended
ACTIVE = frozenset({ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS})
TERMINAL_EVENTS = frozenset(TERMINAL_EVENT.values())


def snapshot(response: dict[str, Any]) -> dict[str, Any]:
    """A copy of a live Response that the turn's builder will not change under a reader."""
    return dict(response, output=list(response["output"]))


def placeholder(turn: PreparedTurn, response: dict[str, Any]) -> ResponseState:
    """The state stored while the response runs: retrievable (its Response, its input items for
    ``input_items``), never chained from (its status is not chainable), and with no context of its
    own — a Redis write of it is O(new input), not O(history)."""
    size = 1024 + 64 * len(turn.input.input_items)
    return ResponseState(
        id=turn.id, response=response, input_items=turn.input.input_items, context=ItemLog(),
        history_ids=TokenSeq(), model=turn.route.name, prelude_key=b"", store=True, tenant=turn.ctx.tenant,
        nbytes=size, delta_bytes=size, created=turn.created_at,
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
    def __init__(self, owner: "BackgroundTurns", turn: PreparedTurn, slot: Slot, state: ResponseState,
                 events_log: EventLog | None, writer: RedisLogWriter | None) -> None:
        self.owner = owner
        self.id = turn.id
        self.tenant = turn.ctx.tenant
        self.tools_json = turn.tools_json
        self.slot = slot
        #: the stored ``queued`` state (later rewrites replace its Response only)
        self.state = state
        self.log = events_log
        self.writer = writer
        #: queued -> running, for the gauges
        self.phase = "queued"
        self.last_seq = -1
        self.ended = False
        self.running: HttpTurn | None = None

    @property
    def created(self) -> dict[str, Any]:
        """The Response the create answers with (``queued``)."""
        return self.state.response

    def cancel(self) -> None:
        if self.running is not None:
            self.running.stop(requested=True)

    async def deliver(self, ev: Event) -> None:
        if self.log is not None or self.writer is not None:
            self._record(ev, sse_frame(wire_event(ev, self.tools_json)))  # framed in the turn's task, once for every reader
        if ev["type"] == "response.in_progress":
            self.phase = "running"
            await self.owner.put_quietly(msgspec.structs.replace(self.state, response=snapshot(ev["response"])))

    def _record(self, ev: Event, frame: bytes) -> None:
        seq, terminal = ev["sequence_number"], ev["type"] in TERMINAL_EVENTS
        if self.log is not None:
            self.log.append(seq, frame, terminal)
        if self.writer is not None:
            self.writer.append(seq, frame, terminal)
        self.last_seq, self.ended = seq, terminal

    async def settle(self, running: HttpTurn, fault: BaseException | None) -> None:
        try:
            if not self.ended and (self.log is not None or self.writer is not None):
                for ev in closing_events(running, self.last_seq, fault is not None):
                    try:
                        frame = sse_frame(ev)
                    except orjson.JSONEncodeError:  # the failed snapshot holds what did not encode
                        continue
                    self._record(ev, frame)
            if self.log is not None:
                self.log.finish()
            if self.writer is not None:
                await self.writer.close()
            await self.owner.finished(self, running.response)
        finally:
            self.owner.forget(self)
