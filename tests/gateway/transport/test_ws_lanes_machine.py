"""The WebSocket lane machine without sockets (gateway/transport/lanes.py): one scenario per table row,
a check that every row is exercised, and the illegal transitions."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.transport.lanes import (
    DEFAULT_LANE,
    TABLE,
    Act,
    Action,
    Ev,
    Event,
    Farewell,
    LaneError,
    LaneMachine,
    Refusal,
    Row,
    State,
)


def machine(**kw: int) -> LaneMachine:
    return LaneMachine(**{"max_inflight": 2, "max_queued": 8, "max_lanes": 2, **kw})


def kinds(actions: list[Action]) -> list[Act]:
    return [a.kind for a in actions]


def start(m: LaneMachine, lane: str = DEFAULT_LANE, frame: object = "f") -> list[Action]:
    """A create through the admission checks; returns the admission's actions."""
    assert kinds(m.handle(Event(Ev.CREATE, lane=lane, frame=frame))) == [Act.CHECK]
    return m.handle(Event(Ev.ADMITTED, lane=lane, frame=frame))


def draining(m: LaneMachine) -> LaneMachine:
    """DRAINING with one turn still running on lane "busy"."""
    start(m, "busy")
    m.handle(Event(Ev.SHUTDOWN))
    assert m.state is State.DRAINING
    return m


Scenario = Callable[[], set[Row]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


def applied(m: LaneMachine, event: Event, rows: set[Row]) -> list[Action]:
    actions = m.handle(event)
    rows.update(m.applied)
    return actions


# -- OPEN --------------------------------------------------------------------------------------------


@scenario
def open_create_aged() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m, "a")
    assert kinds(applied(m, Event(Ev.CREATE, aged=True, frame="late"), rows)) == [Act.DROP]
    assert m.state is State.DRAINING and m.farewell is Farewell.AGE_LIMIT
    return rows


@scenario
def open_create_bad_lane() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    (a,) = applied(m, Event(Ev.CREATE, valid_lane=False), rows)
    assert a.kind is Act.REFUSE and a.refusal is Refusal.BAD_LANE and m.state is State.OPEN
    return rows


@scenario
def open_create_lane_limit() -> set[Row]:
    rows: set[Row] = set()
    m = machine(max_lanes=1)
    start(m, "a")
    start(m)  # the default lane never counts against the limit
    (a,) = applied(m, Event(Ev.CREATE, lane="b"), rows)
    assert a.kind is Act.REFUSE and a.refusal is Refusal.LANE_LIMIT and a.lane == "b"
    assert kinds(m.handle(Event(Ev.CREATE, lane="a"))) == [Act.CHECK]  # a known lane is fine
    return rows


@scenario
def open_create_queue_full() -> set[Row]:
    rows: set[Row] = set()
    m = machine(max_queued=2, max_inflight=1)
    start(m)
    start(m)  # queued behind the first
    (a,) = applied(m, Event(Ev.CREATE), rows)
    assert a.kind is Act.REFUSE and a.refusal is Refusal.QUEUE_FULL and m.queued == 2
    return rows


@scenario
def open_create() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    (a,) = applied(m, Event(Ev.CREATE, lane="x", frame="f1", previous_response_id="resp_1"), rows)
    assert a == Action(Act.CHECK, lane="x", frame="f1", previous_response_id="resp_1")
    return rows


@scenario
def open_admitted_slot_free() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    m.handle(Event(Ev.CREATE, frame="f1"))
    (a,) = applied(m, Event(Ev.ADMITTED, frame="f1"), rows)
    assert a == Action(Act.START, frame="f1") and m.running == 1 and m.queued == 1
    return rows


@scenario
def open_admitted_queues_behind_lane_or_slots() -> set[Row]:
    rows: set[Row] = set()
    m = machine(max_inflight=1)
    start(m, frame="first")
    m.handle(Event(Ev.CREATE, frame="second"))
    (a,) = applied(m, Event(Ev.ADMITTED, frame="second"), rows)  # same lane: waits for it
    assert a.kind is Act.QUEUE
    m.handle(Event(Ev.CREATE, lane="b", frame="other"))
    assert kinds(applied(m, Event(Ev.ADMITTED, lane="b", frame="other"), rows)) == [Act.QUEUE]  # no slot
    assert m.running == 1 and m.queued == 3
    return rows


@scenario
def open_refused() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    err = object()
    actions = applied(m, Event(Ev.REFUSED, lane="a", previous_response_id="resp_p", error=err), rows)
    assert [(a.kind, a.lane, a.previous_response_id) for a in actions] == [
        (Act.EVICT, "a", "resp_p"),
        (Act.ERROR, "a", "resp_p"),
    ]
    assert actions[1].error is err and m.state is State.OPEN
    return rows


@scenario
def open_revoked() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    assert kinds(applied(m, Event(Ev.REVOKED), rows)) == [Act.DROP]
    assert m.state is State.DRAINING and m.farewell is Farewell.REVOKED
    return rows


@scenario
def open_turn_done_starts_next() -> set[Row]:
    rows: set[Row] = set()
    m = machine(max_inflight=1)
    start(m, frame="f1")
    start(m, frame="f2")
    start(m, "b", frame="b1")
    # the slot goes to lane b (it waited first); the default lane's next waits behind it
    assert applied(m, Event(Ev.TURN_DONE), rows) == [Action(Act.START, lane="b", frame="b1")]
    assert m.handle(Event(Ev.TURN_DONE, lane="b")) == [Action(Act.START, frame="f2")]
    assert m.handle(Event(Ev.TURN_DONE)) == [] and m.running == 0 and m.queued == 0
    return rows


@scenario
def open_turn_failed() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m, "a", frame="a1")
    start(m, "a", frame="a2")
    actions = applied(m, Event(Ev.TURN_FAILED, lane="a", previous_response_id="resp_p"), rows)
    assert actions == [
        Action(Act.EVICT, lane="a", previous_response_id="resp_p"),
        Action(Act.START, lane="a", frame="a2"),
    ]
    return rows


@scenario
def open_age_limit() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    assert applied(m, Event(Ev.AGE_LIMIT), rows) == []
    assert m.state is State.DRAINING and m.farewell is Farewell.AGE_LIMIT
    return rows


@scenario
def open_idle_limit_busy() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    assert applied(m, Event(Ev.IDLE_LIMIT), rows) == [] and m.state is State.OPEN
    return rows


@scenario
def open_idle_limit_closes_at_once() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    actions = applied(m, Event(Ev.IDLE_LIMIT), rows)
    assert actions == [Action(Act.FAREWELL, farewell=Farewell.IDLE), Action(Act.CLOSE, farewell=Farewell.IDLE)]
    assert m.state is State.CLOSED and Farewell.IDLE.code == 1000
    return rows


@scenario
def open_shutdown_drops_queued() -> set[Row]:
    rows: set[Row] = set()
    m = machine(max_inflight=1)
    start(m)
    start(m, "b")  # waits for the slot
    assert applied(m, Event(Ev.SHUTDOWN), rows) == []
    assert m.state is State.DRAINING and m.farewell is Farewell.SHUTDOWN and m.queued == 1
    actions = m.handle(Event(Ev.TURN_DONE))  # the queued create never starts: farewell and close
    assert kinds(actions) == [Act.FAREWELL, Act.CLOSE] and actions[1].farewell.code == 1001
    return rows


@scenario
def open_deadline() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    assert kinds(applied(m, Event(Ev.DEADLINE), rows)) == [Act.ABORT, Act.FAREWELL, Act.CLOSE]
    assert m.state is State.CLOSED and m.farewell is Farewell.SHUTDOWN
    return rows


# -- DRAINING ----------------------------------------------------------------------------------------


@scenario
def draining_create_and_admitted_drop() -> set[Row]:
    rows: set[Row] = set()
    m = draining(machine())
    assert kinds(applied(m, Event(Ev.CREATE), rows)) == [Act.DROP]
    assert kinds(applied(m, Event(Ev.ADMITTED), rows)) == [Act.DROP]  # checked before the drain began
    assert m.queued == 1
    return rows


@scenario
def draining_refused() -> set[Row]:
    rows: set[Row] = set()
    m = draining(machine())
    assert kinds(applied(m, Event(Ev.REFUSED, lane="x", previous_response_id="p"), rows)) == [Act.EVICT, Act.ERROR]
    return rows


@scenario
def draining_turn_done_then_quiet() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m, "a")
    start(m, "b")
    m.handle(Event(Ev.SHUTDOWN))
    assert applied(m, Event(Ev.TURN_DONE, lane="a"), rows) == [] and m.state is State.DRAINING  # b still runs
    actions = applied(m, Event(Ev.TURN_DONE, lane="b"), rows)  # the last one: quiet -> farewell + close
    assert kinds(actions) == [Act.FAREWELL, Act.CLOSE] and m.state is State.CLOSED
    assert actions[0].farewell is Farewell.SHUTDOWN
    return rows


@scenario
def draining_turn_failed() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m, "a")
    start(m, "b")
    m.handle(Event(Ev.AGE_LIMIT))
    assert applied(m, Event(Ev.TURN_FAILED, lane="a", previous_response_id="p"), rows) == [
        Action(Act.EVICT, lane="a", previous_response_id="p")
    ]
    return rows


@scenario
def draining_deadline_forces_shutdown_farewell() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    m.handle(Event(Ev.AGE_LIMIT))
    actions = applied(m, Event(Ev.DEADLINE), rows)
    assert kinds(actions) == [Act.ABORT, Act.FAREWELL, Act.CLOSE] and actions[2].farewell is Farewell.SHUTDOWN
    return rows


@scenario
def draining_first_farewell_stands() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    m.handle(Event(Ev.AGE_LIMIT))
    for ev in (Ev.AGE_LIMIT, Ev.IDLE_LIMIT, Ev.REVOKED, Ev.SHUTDOWN):
        assert applied(m, Event(ev), rows) == []
    assert m.state is State.DRAINING and m.farewell is Farewell.AGE_LIMIT
    actions = m.handle(Event(Ev.TURN_DONE))
    assert actions[-1] == Action(Act.CLOSE, farewell=Farewell.AGE_LIMIT)  # 1000, as OpenAI closes at the limit
    return rows


# -- any state ---------------------------------------------------------------------------------------


@scenario
def client_gone_aborts() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    assert kinds(applied(m, Event(Ev.CLIENT_GONE), rows)) == [Act.ABORT] and m.state is State.CLOSED
    m = draining(machine())
    assert kinds(applied(m, Event(Ev.CLIENT_GONE), rows)) == [Act.ABORT] and m.state is State.CLOSED
    return rows


@scenario
def send_stalled_aborts_and_closes_1008() -> set[Row]:
    """The client stopped reading: its turns are aborted (each billed as cancelled) and the close is
    1008, whatever farewell a drain had chosen (none of them could reach it)."""
    rows: set[Row] = set()
    m = machine(max_inflight=1)
    start(m)
    start(m, "b")  # waits for the slot: dropped, never started
    actions = applied(m, Event(Ev.SEND_STALLED), rows)
    assert actions == [Action(Act.ABORT), Action(Act.CLOSE, farewell=Farewell.SEND_STALLED)]
    assert m.state is State.CLOSED and m.waiting == 0 and Farewell.SEND_STALLED.code == 1008
    m = draining(machine())
    assert m.farewell is Farewell.SHUTDOWN
    actions = applied(m, Event(Ev.SEND_STALLED), rows)
    assert kinds(actions) == [Act.ABORT, Act.CLOSE] and actions[1].farewell.code == 1008
    assert m.farewell is Farewell.SEND_STALLED and m.state is State.CLOSED
    return rows


@scenario
def closed_ignores_late_events() -> set[Row]:
    rows: set[Row] = set()
    m = machine()
    start(m)
    m.handle(Event(Ev.CLIENT_GONE))
    for ev in Ev:
        if ev is not Ev.QUIET:
            assert applied(m, Event(ev), rows) == [] and m.state is State.CLOSED
    return rows


@pytest.mark.parametrize("name", SCENARIOS)
def test_row(name: str) -> None:
    assert SCENARIOS[name]()


def test_every_row_of_the_table_is_exercised() -> None:
    seen: set[Row] = set()
    for fn in SCENARIOS.values():
        seen |= fn()
    missing = [(r.state.value, r.event.value, r.guard) for r in TABLE if r not in seen]
    assert not missing, f"rows without a scenario: {missing}"


def test_illegal_transitions_name_state_and_event() -> None:
    m = machine()
    with pytest.raises(LaneError, match="'quiet' is not allowed in state 'open'"):
        m.handle(Event(Ev.QUIET))
    with pytest.raises(LaneError, match="lane 'nope'.*runs no turn"):
        m.handle(Event(Ev.TURN_DONE, lane="nope"))
    m.handle(Event(Ev.CLIENT_GONE))
    with pytest.raises(LaneError, match="'quiet' is not allowed in state 'closed'"):
        m.handle(Event(Ev.QUIET))


def test_lanes_never_overlap_and_slots_bound_concurrency() -> None:
    """A random-ish workload: at no point do two turns run on one lane or more than max_inflight at once."""
    m = machine(max_inflight=3, max_queued=64, max_lanes=8)
    running: dict[str, int] = {}
    order = ["a", "b", "a", "c", "d", "a", "b", "e", "c", "a"] * 3

    def apply(actions: list[Action]) -> None:
        for a in actions:
            if a.kind is Act.START:
                running[a.lane] = running.get(a.lane, 0) + 1
                assert running[a.lane] == 1 and sum(running.values()) <= 3

    for i, lane in enumerate(order):
        m.handle(Event(Ev.CREATE, lane=lane))
        apply(m.handle(Event(Ev.ADMITTED, lane=lane, frame=i)))
        if i % 3 == 2:
            done = next(iter(sorted(k for k, v in running.items() if v)))
            running[done] -= 1
            apply(m.handle(Event(Ev.TURN_DONE, lane=done)))
    while any(running.values()):
        done = next(k for k, v in running.items() if v)
        running[done] -= 1
        apply(m.handle(Event(Ev.TURN_DONE, lane=done)))
    assert m.queued == 0 and m.running == 0
