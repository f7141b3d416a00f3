"""Background responses' decisions as a sans-I/O machine: signals in, actions out.

Why a machine: a background response is decided on by several loops at once — the turn's own task
(``response.in_progress``, its end), a ``POST .../cancel`` on this replica or on another one (through
the owner's cancel list), the lease heartbeat (a lease found gone), the sweep of lapsed leases and a
resumed stream's reader (an owner that died). Each of them feeds a :class:`Signal` to :func:`step`,
and performs the :class:`Act` list it gets back (``gateway.sessions.background`` for the turns
this replica runs, ``gateway.sessions.replicas`` for the Redis side); nothing here awaits, so
every row is tested without a server (tests/gateway/sessions/test_background_machine.py).

Read the lifecycle as a table (``TABLE``)::

    state    signal         next     actions
    -- a response this replica runs --
    QUEUED   in_progress    RUNNING  store_progress       (a poll on any replica sees in_progress)
    QUEUED   cancel         QUEUED   stop_turn            (POST .../cancel here)
    QUEUED   cancel_remote  QUEUED   stop_turn            (another replica asked, via the cancel list)
    QUEUED   lease_lost     QUEUED   stop_turn            (renew found it claimed: marked failed elsewhere)
    QUEUED   shutdown       QUEUED   cut_turn             (the server stops: abort, billed cancelled)
    QUEUED   settled        ENDED    close_stream, record_outcome, forget
    RUNNING  cancel | cancel_remote | lease_lost  -> RUNNING  stop_turn
    RUNNING  shutdown       RUNNING  cut_turn
    RUNNING  settled        ENDED    close_stream, record_outcome, forget
    ENDED    cancel | cancel_remote | lease_lost | shutdown  -> ENDED  -   (it is settling: let it)
    -- a response another replica runs (Redis), as a lease probe sees it --
    FOREIGN  lease_held     FOREIGN  wait                 (its owner renews it: ask again later)
    FOREIGN  lease_lapsed   LAPSED   claim                (the owner stopped renewing)
    FOREIGN  lease_gone     GONE     read_state           (released: its final state is stored)
    LAPSED   claim_won      REAPED   reap                 (exactly one replica: failed, billed once)
    LAPSED   claim_lost     FOREIGN  wait                 (another replica is finishing it)

``stop_turn`` aborts the turn in its own task (billed ``cancelled`` with what it generated); a
second one is harmless (the turn is stopped once). ``settled`` is the turn's task ending, whatever
ended it; from then on the turn is finishing its record and a late stop must not cut that short.
A pair the table does not list raises :class:`Refused` naming state and signal.

Two decisions take no state and are plain functions: :func:`plan_cancel` (what a
``POST /v1/responses/{id}/cancel`` does) and :func:`plan_replay` (what
``GET /v1/responses/{id}?stream=true&starting_after=N`` answers).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    # a response this replica runs
    QUEUED = "queued"  # accepted: its lease taken, its queued state stored; not started yet
    RUNNING = "running"  # response.in_progress went out (and was stored)
    ENDED = "ended"  # its task settled: outcome recorded, lease released, slot given back
    # a response another replica runs, as this one's probe of its lease sees it
    FOREIGN = "foreign"  # its owner holds the lease (or this replica has not looked yet)
    LAPSED = "lapsed"  # its lease lapsed: the owner died, or stalled longer than the lease
    REAPED = "reaped"  # this replica claimed it and finished it as failed
    GONE = "gone"  # released by its owner: the stored state is final


class Signal(enum.Enum):
    IN_PROGRESS = "in_progress"  # the turn sent response.in_progress
    CANCEL = "cancel"  # POST .../cancel on this replica
    CANCEL_REMOTE = "cancel_remote"  # another replica asked through this one's cancel list
    LEASE_LOST = "lease_lost"  # the heartbeat's renew found the lease gone
    SHUTDOWN = "shutdown"  # the server stops (after its drain)
    SETTLED = "settled"  # the turn's task ended, whatever ended it
    LEASE_HELD = "lease_held"  # a probe: the owner's lease holds
    LEASE_LAPSED = "lease_lapsed"  # a probe: the owner's lease is past its deadline
    LEASE_GONE = "lease_gone"  # a probe: no lease (released, or never taken)
    CLAIM_WON = "claim_won"  # this replica's claim of a lapsed lease took it
    CLAIM_LOST = "claim_lost"  # another replica's did


class Act(enum.Enum):
    STORE_PROGRESS = "store_progress"  # write the in_progress state (a lost write: the final repairs it)
    STOP_TURN = "stop_turn"  # abort the turn in its own task (a requested stop)
    CUT_TURN = "cut_turn"  # shutdown deadline: abort it and wait until it is billed
    CLOSE_STREAM = "close_stream"  # closing events the turn did not send; finish and flush the logs
    RECORD_OUTCOME = "record_outcome"  # check the final state is stored (repair it), release the lease
    FORGET = "forget"  # out of this replica's map; the tenant's slot given back
    WAIT = "wait"  # nothing to do now: probe again later
    CLAIM = "claim"  # try to take the lapsed lease (atomic: one replica wins)
    REAP = "reap"  # store failed, end its event log, bill it once with zero tokens
    READ_STATE = "read_state"  # the stored state says how it ended


class Refused(RuntimeError):
    """A signal the table does not allow in the state (a bug in the loop that fed it)."""


@dataclass(frozen=True, slots=True)
class Row:
    state: Phase
    signal: Signal
    next: Phase
    actions: tuple[Act, ...] = ()


P, S, A = Phase, Signal, Act
_STOPS = (S.CANCEL, S.CANCEL_REMOTE, S.LEASE_LOST)

TABLE: tuple[Row, ...] = (
    Row(P.QUEUED, S.IN_PROGRESS, P.RUNNING, (A.STORE_PROGRESS,)),
    *(Row(state, signal, state, (A.STOP_TURN,)) for state in (P.QUEUED, P.RUNNING) for signal in _STOPS),
    *(Row(state, S.SHUTDOWN, state, (A.CUT_TURN,)) for state in (P.QUEUED, P.RUNNING)),
    *(Row(state, S.SETTLED, P.ENDED, (A.CLOSE_STREAM, A.RECORD_OUTCOME, A.FORGET)) for state in (P.QUEUED, P.RUNNING)),
    *(Row(P.ENDED, signal, P.ENDED) for signal in (*_STOPS, S.SHUTDOWN)),
    Row(P.FOREIGN, S.LEASE_HELD, P.FOREIGN, (A.WAIT,)),
    Row(P.FOREIGN, S.LEASE_LAPSED, P.LAPSED, (A.CLAIM,)),
    Row(P.FOREIGN, S.LEASE_GONE, P.GONE, (A.READ_STATE,)),
    Row(P.LAPSED, S.CLAIM_WON, P.REAPED, (A.REAP,)),
    Row(P.LAPSED, S.CLAIM_LOST, P.FOREIGN, (A.WAIT,)),
)

_ROWS: dict[tuple[Phase, Signal], Row] = {(row.state, row.signal): row for row in TABLE}
assert len(_ROWS) == len(TABLE), "one row per (state, signal)"


def step(state: Phase, signal: Signal) -> tuple[Phase, tuple[Act, ...]]:
    """The next state and what to do, per ``TABLE``; :class:`Refused` for a pair it does not list."""
    row = _ROWS.get((state, signal))
    if row is None:
        raise Refused(f"background response in state {state.value} cannot take {signal.value}")
    return row.next, row.actions


def probe_signal(alive: bool | None) -> Signal:
    """``cache.leases.RedisLeases.alive``'s answer as a signal (True held, False lapsed, None gone)."""
    if alive is None:
        return Signal.LEASE_GONE
    return Signal.LEASE_HELD if alive else Signal.LEASE_LAPSED


# -- cancel ------------------------------------------------------------------------------------------


class Cancel(enum.Enum):
    """What ``POST /v1/responses/{id}/cancel`` does (:func:`plan_cancel`)."""

    REFUSE = "refuse"  # not a background response: 400
    AS_IS = "as_is"  # it ended already: the response unchanged (idempotent)
    LOCAL = "local"  # it runs here: stop it, wait for its task (aborted, billed, stored, released)
    LATEST = "latest"  # one process and not here: it ended while this request read it
    REMOTE = "remote"  # another replica runs it: ask its owner, probe its lease until it ends


def plan_cancel(*, background: bool, active: bool, here: bool, shared: bool) -> Cancel:
    """``background``: the response was created so; ``active``: its stored status is queued or
    in_progress; ``here``: this replica runs it; ``shared``: replicas share Redis."""
    if not background:
        return Cancel.REFUSE
    if not active:
        return Cancel.AS_IS
    if here:
        return Cancel.LOCAL
    return Cancel.REMOTE if shared else Cancel.LATEST


# -- replay from N -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """What an event log holds: the oldest sequence number kept, the last one written, and whether
    that last one is the terminal event."""

    first: int
    last: int
    terminal: bool


class Replay(enum.Enum):
    """What ``GET .../{id}?stream=true&starting_after=N`` answers (:func:`plan_replay`)."""

    NOT_BACKGROUND = "not_background"  # 400 (param stream): only background responses stream again
    NO_EVENTS = "no_events"  # 400 (param stream): no log kept (no stream=true, or expired)
    TRUNCATED = "truncated"  # 400 (param starting_after): N is older than the window
    NOTHING = "nothing"  # N is the terminal or past it: an empty stream
    FOLLOW = "follow"  # the events after N, then the live ones, to the terminal


def plan_replay(after: int, *, background: bool, window: Window | None, expected: bool) -> Replay:
    """``after``: N (-1: from the first event). ``window``: the log's, None when there is none;
    ``expected``: a log is coming though none is written yet (a streamed response that runs)."""
    if not background:
        return Replay.NOT_BACKGROUND
    if window is None:
        return Replay.FOLLOW if expected else Replay.NO_EVENTS
    if after + 1 < window.first:
        return Replay.TRUNCATED
    if window.terminal and after >= window.last:
        return Replay.NOTHING
    return Replay.FOLLOW
