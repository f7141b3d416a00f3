"""The lanes of one WebSocket connection as a sans-I/O state machine: events in, actions out.

A connection runs turns in **lanes** (the default lane plus named ``stream_id`` lanes): turns in one
lane never overlap, lanes run concurrently, at most ``max_inflight`` turns run at once across lanes
(lanes waiting for a slot are served first come, first served), and at most ``max_queued`` creates
are accepted and unfinished. The machine decides; ``gateway/transport/ws.py`` performs: it feeds
frames, timer expiries and turn results in as events and carries out the actions (send a frame,
start a turn task, evict a parent, close the socket). Nothing here awaits or touches a socket, so
every row below is tested without one (tests/gateway/transport/test_ws_lanes_machine.py).

Read the lifecycle as a table (``TABLE``; the first row whose guard holds applies)::

    state     event        guard          next      actions
    OPEN      create       aged           DRAINING  drop          (farewell: age limit, 1000)
    OPEN      create       bad_lane       OPEN      refuse        (invalid stream_id)
    OPEN      create       lane_limit     OPEN      refuse        (too many stream ids)
    OPEN      create       queue_full     OPEN      refuse        (429)
    OPEN      create       -              OPEN      check         (adapter: key still valid? rate limit?)
    OPEN      admitted     slot_free      OPEN      start
    OPEN      admitted     -              OPEN      queue
    OPEN      refused      -              OPEN      evict, error  (a failed continuation drops its parent)
    OPEN      revoked      -              DRAINING  drop          (farewell: 401, 1000)
    OPEN      turn_done    -              OPEN      next          (start what waited for this slot/lane)
    OPEN      turn_failed  -              OPEN      evict, next
    OPEN      age_limit    -              DRAINING  -             (farewell: age limit, 1000)
    OPEN      idle_limit   busy           OPEN      -             (a long generation is activity)
    OPEN      idle_limit   -              DRAINING  -             (farewell: idle, 1000)
    OPEN      shutdown     -              DRAINING  -             (farewell: shutting down, 1001)
    OPEN      deadline     -              CLOSED    abort, farewell, close
    DRAINING  create       -              DRAINING  drop
    DRAINING  admitted     -              DRAINING  drop
    DRAINING  refused      -              DRAINING  evict, error
    DRAINING  turn_done    -              DRAINING  -
    DRAINING  turn_failed  -              DRAINING  evict
    DRAINING  quiet        -              CLOSED    farewell, close   (nothing runs any more)
    DRAINING  deadline     -              CLOSED    abort, farewell, close  (farewell: shutting down)
    DRAINING  age_limit | idle_limit | revoked | shutdown  -> DRAINING   (the first farewell stands)
    any       send_stalled -              CLOSED    abort, close  (farewell: send deadline, 1008)
    any       client_gone  -              CLOSED    abort
    CLOSED    anything but quiet          CLOSED    -             (late results of aborted turns)

Entering DRAINING drops the creates still queued (none of them started: the client gets the
farewell instead), and ``quiet`` is fed by the machine itself as soon as DRAINING has nothing
running. ``send_stalled`` is the client that stopped reading: its writes made no progress for the
send deadline (gateway/transport/corked.py), so the protocol has already failed the socket with
1008 and no farewell frame could reach it; its turns are aborted, each billed as cancelled with
what it generated. An event the table has no row for raises :class:`LaneError` naming state and
event.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

DEFAULT_LANE = ""


class State(enum.Enum):
    OPEN = "open"  # accepting creates
    DRAINING = "draining"  # refusing creates; running turns finish, then farewell + close
    CLOSED = "closed"


class Ev(enum.Enum):
    CREATE = "create"  # a response.create frame arrived for a lane
    ADMITTED = "admitted"  # the adapter's admission checks passed
    REFUSED = "refused"  # ... or refused it (an error to send)
    REVOKED = "revoked"  # the key was revoked while connected
    TURN_DONE = "turn_done"
    TURN_FAILED = "turn_failed"  # rejected at prepare, failed response, or crashed
    AGE_LIMIT = "age_limit"
    IDLE_LIMIT = "idle_limit"
    SHUTDOWN = "shutdown"  # the server drains
    DEADLINE = "deadline"  # the shutdown grace passed
    SEND_STALLED = "send_stalled"  # the client stopped reading: the send deadline closed the socket
    CLIENT_GONE = "client_gone"
    QUIET = "quiet"  # internal: DRAINING with nothing running


class Act(enum.Enum):
    CHECK = "check"  # run the async admission checks, then feed ADMITTED / REFUSED / REVOKED
    START = "start"  # run this create now (it holds a slot)
    QUEUE = "queue"  # it waits for its lane or a slot (nothing to do)
    NEXT = "next"  # expands to START actions for what can run now
    DROP = "drop"  # the create is discarded (the connection is closing)
    REFUSE = "refuse"  # error frame for the create (``Action.refusal`` says why)
    ERROR = "error"  # send the error the adapter's checks produced
    EVICT = "evict"  # a failed continuation: the connection cache evicts its parent
    FAREWELL = "farewell"  # the closing error frame
    CLOSE = "close"  # close the socket with the farewell's code
    ABORT = "abort"  # cancel every running turn (each bills what it generated)


class Farewell(enum.Enum):
    """Why the connection closes (the adapter words the error frame)."""

    AGE_LIMIT = "age_limit"
    IDLE = "idle"
    REVOKED = "revoked"
    SHUTDOWN = "shutting_down"
    SEND_STALLED = "send_stalled"

    @property
    def code(self) -> int:
        """1000 where OpenAI closes normally (age limit, idle) or the key is gone; 1001 "going away"
        at shutdown, which tells a client's auto-reconnect that another replica is the answer; 1008
        (policy violation) for a client that stopped reading: its fault, not the server's (1011), and
        not a code clients auto-reconnect on to replay frames chained to the cancelled response."""
        if self is Farewell.SHUTDOWN:
            return 1001
        return 1008 if self is Farewell.SEND_STALLED else 1000


class Refusal(enum.Enum):
    BAD_LANE = "invalid_stream_id"
    LANE_LIMIT = "websocket_stream_limit_reached"
    QUEUE_FULL = "queue_full"


class Event(msgspec.Struct, frozen=True):
    kind: Ev
    lane: str = DEFAULT_LANE
    frame: Any = None  # the create frame (CREATE, ADMITTED)
    previous_response_id: str | None = None
    error: Any = None  # REFUSED: the adapter's error, handed back in ERROR
    aged: bool = False  # CREATE: the connection reached its age limit
    valid_lane: bool = True  # CREATE: the stream_id is well formed


class Action(msgspec.Struct, frozen=True):
    kind: Act
    lane: str = DEFAULT_LANE
    frame: Any = None
    previous_response_id: str | None = None
    error: Any = None
    refusal: Refusal | None = None
    farewell: Farewell | None = None


class LaneError(RuntimeError):
    """An event the table does not allow in the current state (a bug in the adapter)."""


@dataclass(frozen=True, slots=True)
class Row:
    state: State
    event: Ev
    guard: str | None
    next: State
    actions: tuple[Act, ...] = ()
    refusal: Refusal | None = None
    farewell: Farewell | None = None  # set on entering DRAINING, if none is set yet
    force_farewell: bool = False  # this farewell replaces the one set before


O, D, C = State.OPEN, State.DRAINING, State.CLOSED  # noqa: E741 (the table's one-letter columns)
A = Act
TABLE: tuple[Row, ...] = (
    Row(O, Ev.CREATE, "aged", D, (A.DROP,), farewell=Farewell.AGE_LIMIT),
    Row(O, Ev.CREATE, "bad_lane", O, (A.REFUSE,), refusal=Refusal.BAD_LANE),
    Row(O, Ev.CREATE, "lane_limit", O, (A.REFUSE,), refusal=Refusal.LANE_LIMIT),
    Row(O, Ev.CREATE, "queue_full", O, (A.REFUSE,), refusal=Refusal.QUEUE_FULL),
    Row(O, Ev.CREATE, None, O, (A.CHECK,)),
    Row(O, Ev.ADMITTED, "slot_free", O, (A.START,)),
    Row(O, Ev.ADMITTED, None, O, (A.QUEUE,)),
    Row(O, Ev.REFUSED, None, O, (A.EVICT, A.ERROR)),
    Row(O, Ev.REVOKED, None, D, (A.DROP,), farewell=Farewell.REVOKED),
    Row(O, Ev.TURN_DONE, None, O, (A.NEXT,)),
    Row(O, Ev.TURN_FAILED, None, O, (A.EVICT, A.NEXT)),
    Row(O, Ev.AGE_LIMIT, None, D, farewell=Farewell.AGE_LIMIT),
    Row(O, Ev.IDLE_LIMIT, "busy", O),
    Row(O, Ev.IDLE_LIMIT, None, D, farewell=Farewell.IDLE),
    Row(O, Ev.SHUTDOWN, None, D, farewell=Farewell.SHUTDOWN),
    Row(O, Ev.DEADLINE, None, C, (A.ABORT, A.FAREWELL, A.CLOSE), farewell=Farewell.SHUTDOWN, force_farewell=True),
    Row(D, Ev.CREATE, None, D, (A.DROP,)),
    Row(D, Ev.ADMITTED, None, D, (A.DROP,)),
    Row(D, Ev.REFUSED, None, D, (A.EVICT, A.ERROR)),
    Row(D, Ev.TURN_DONE, None, D),
    Row(D, Ev.TURN_FAILED, None, D, (A.EVICT,)),
    Row(D, Ev.QUIET, None, C, (A.FAREWELL, A.CLOSE)),
    Row(D, Ev.DEADLINE, None, C, (A.ABORT, A.FAREWELL, A.CLOSE), farewell=Farewell.SHUTDOWN, force_farewell=True),
    *(Row(D, ev, None, D) for ev in (Ev.AGE_LIMIT, Ev.IDLE_LIMIT, Ev.REVOKED, Ev.SHUTDOWN)),
    *(
        Row(s, Ev.SEND_STALLED, None, C, (A.ABORT, A.CLOSE), farewell=Farewell.SEND_STALLED, force_farewell=True)
        for s in (O, D)
    ),
    *(Row(s, Ev.CLIENT_GONE, None, C, (A.ABORT,)) for s in (O, D)),
    *(Row(C, ev, None, C) for ev in Ev if ev is not Ev.QUIET),
)


@dataclass
class _Lane:
    queue: deque[Any] = field(default_factory=deque)
    running: bool = False


class LaneMachine:
    def __init__(self, *, max_inflight: int, max_queued: int, max_lanes: int) -> None:
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.max_lanes = max_lanes
        self.state = State.OPEN
        self.farewell: Farewell | None = None
        self._lanes: dict[str, _Lane] = {}
        self._waiting: deque[str] = deque()  # lanes with a queued create and no slot, in arrival order
        self._running = 0
        self._queued = 0  # accepted and unfinished (queued or running), across lanes
        self._named = 0  # lanes other than the default one (lanes are never removed)
        #: the rows the last ``handle`` applied (tests check every row is exercised)
        self.applied: list[Row] = []
        #: (state, event) -> its rows in table order, each with its guard bound to this machine
        #: (found once here: a create is checked against four guards)
        self._rows: dict[tuple[State, Ev], list[tuple[Row, Callable[[Event], bool] | None]]] = {}
        for row in TABLE:
            guard = getattr(self, f"_guard_{row.guard}") if row.guard is not None else None
            self._rows.setdefault((row.state, row.event), []).append((row, guard))

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        """Creates accepted and unfinished: waiting or running."""
        return self._queued

    @property
    def waiting(self) -> int:
        """Creates accepted that have not started."""
        return self._queued - self._running

    @property
    def lanes(self) -> int:
        """Lanes this connection has used (the default lane and each ``stream_id``)."""
        return len(self._lanes)

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; returns what the adapter must do, in order."""
        self.applied = []
        actions = self._apply(event)
        if self.state is State.DRAINING and self._running == 0:
            actions += self._apply(Event(Ev.QUIET))
        return actions

    # -- the table --------------------------------------------------------------------------------

    def _apply(self, event: Event) -> list[Action]:
        for row, guard in self._rows.get((self.state, event.kind), ()):  # noqa: B007 (kept: the row found)
            if guard is None or guard(event):
                break
        else:
            raise LaneError(f"event {event.kind.value!r} is not allowed in state {self.state.value!r}")
        self.applied.append(row)
        if self.state is not State.CLOSED and event.kind in (Ev.TURN_DONE, Ev.TURN_FAILED):
            self._finished(event.lane)
        if row.farewell is not None and (self.farewell is None or row.force_farewell):
            self.farewell = row.farewell
        if row.next is not State.OPEN and self.state is State.OPEN:
            self._drop_queued()
        self.state = row.next
        out: list[Action] = []
        for act in row.actions:
            if act is Act.NEXT:
                out += self._start_waiting()
            elif act is Act.START or act is Act.QUEUE:
                out.append(self._admit(event, start=act is Act.START))
            elif act in (Act.FAREWELL, Act.CLOSE):
                out.append(Action(act, farewell=self.farewell))
            else:
                out.append(
                    Action(
                        act,
                        lane=event.lane,
                        frame=event.frame,
                        previous_response_id=event.previous_response_id,
                        error=event.error,
                        refusal=row.refusal,
                    )
                )
        return out

    # -- guards (the table names them) -------------------------------------------------------------

    def _guard_aged(self, event: Event) -> bool:
        return event.aged

    def _guard_bad_lane(self, event: Event) -> bool:
        return not event.valid_lane

    def _guard_lane_limit(self, event: Event) -> bool:
        return event.lane != DEFAULT_LANE and event.lane not in self._lanes and self._named >= self.max_lanes

    def _guard_queue_full(self, event: Event) -> bool:
        return self._queued >= self.max_queued

    def _guard_slot_free(self, event: Event) -> bool:
        lane = self._lanes.get(event.lane)
        return (lane is None or (not lane.running and not lane.queue)) and self._running < self.max_inflight

    def _guard_busy(self, event: Event) -> bool:
        return self._queued > 0

    # -- bookkeeping ------------------------------------------------------------------------------

    def _admit(self, event: Event, *, start: bool) -> Action:
        lane = self._lanes.get(event.lane)
        if lane is None:
            lane = self._lanes[event.lane] = _Lane()
            self._named += event.lane != DEFAULT_LANE
        self._queued += 1
        if start:
            lane.running = True
            self._running += 1
            return Action(Act.START, lane=event.lane, frame=event.frame)
        if not lane.running and not lane.queue:
            self._waiting.append(event.lane)  # an idle lane waits for a slot
        lane.queue.append(event.frame)
        return Action(Act.QUEUE, lane=event.lane, frame=event.frame)

    def _finished(self, name: str) -> None:
        lane = self._lanes.get(name)
        if lane is None or not lane.running:
            raise LaneError(f"turn ended on lane {name!r}, which runs no turn (state {self.state.value!r})")
        lane.running = False
        self._running -= 1
        self._queued -= 1
        if lane.queue:
            self._waiting.append(name)

    def _start_waiting(self) -> list[Action]:
        out: list[Action] = []
        while self._waiting and self._running < self.max_inflight:
            name = self._waiting.popleft()
            lane = self._lanes[name]
            lane.running = True
            self._running += 1
            out.append(Action(Act.START, lane=name, frame=lane.queue.popleft()))
        return out

    def _drop_queued(self) -> None:
        for lane in self._lanes.values():
            self._queued -= len(lane.queue)
            lane.queue.clear()
        self._waiting.clear()
