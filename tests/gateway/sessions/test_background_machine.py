"""The background machine without a server (gateway/sessions/background_machine.py): each row of the
lifecycle written out here on its own (not read from ``TABLE``), a check that the two agree row for
row, that every pair the table does not list is refused, and the cancel and replay plans; then a
background response driven through its machine with a fake turn task."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgspec
import pytest

from gateway.sessions.background_machine import (
    TABLE,
    Act,
    Cancel,
    Phase,
    Refused,
    Replay,
    Signal,
    Window,
    plan_cancel,
    plan_replay,
    probe_signal,
    step,
)

P, S, A = Phase, Signal, Act

#: the lifecycle as the module docstring states it: (state, signal) -> (next, actions)
EXPECTED: dict[tuple[Phase, Signal], tuple[Phase, tuple[Act, ...]]] = {
    (P.QUEUED, S.IN_PROGRESS): (P.RUNNING, (A.STORE_PROGRESS,)),
    (P.QUEUED, S.CANCEL): (P.QUEUED, (A.STOP_TURN,)),
    (P.QUEUED, S.CANCEL_REMOTE): (P.QUEUED, (A.STOP_TURN,)),
    (P.QUEUED, S.LEASE_LOST): (P.QUEUED, (A.STOP_TURN,)),
    (P.QUEUED, S.SHUTDOWN): (P.QUEUED, (A.CUT_TURN,)),
    (P.QUEUED, S.SETTLED): (P.ENDED, (A.CLOSE_STREAM, A.RECORD_OUTCOME, A.FORGET)),
    (P.RUNNING, S.CANCEL): (P.RUNNING, (A.STOP_TURN,)),
    (P.RUNNING, S.CANCEL_REMOTE): (P.RUNNING, (A.STOP_TURN,)),
    (P.RUNNING, S.LEASE_LOST): (P.RUNNING, (A.STOP_TURN,)),
    (P.RUNNING, S.SHUTDOWN): (P.RUNNING, (A.CUT_TURN,)),
    (P.RUNNING, S.SETTLED): (P.ENDED, (A.CLOSE_STREAM, A.RECORD_OUTCOME, A.FORGET)),
    (P.ENDED, S.CANCEL): (P.ENDED, ()),
    (P.ENDED, S.CANCEL_REMOTE): (P.ENDED, ()),
    (P.ENDED, S.LEASE_LOST): (P.ENDED, ()),
    (P.ENDED, S.SHUTDOWN): (P.ENDED, ()),
    (P.FOREIGN, S.LEASE_HELD): (P.FOREIGN, (A.WAIT,)),
    (P.FOREIGN, S.LEASE_LAPSED): (P.LAPSED, (A.CLAIM,)),
    (P.FOREIGN, S.LEASE_GONE): (P.GONE, (A.READ_STATE,)),
    (P.LAPSED, S.CLAIM_WON): (P.REAPED, (A.REAP,)),
    (P.LAPSED, S.CLAIM_LOST): (P.FOREIGN, (A.WAIT,)),
}


@pytest.mark.parametrize("pair", list(EXPECTED), ids=lambda p: f"{p[0].value}-{p[1].value}")
def test_each_row(pair: tuple[Phase, Signal]) -> None:
    assert step(*pair) == EXPECTED[pair]


def test_the_table_lists_exactly_these_rows() -> None:
    assert {(row.state, row.signal): (row.next, row.actions) for row in TABLE} == EXPECTED
    assert len(TABLE) == len(EXPECTED)  # no pair listed twice


@pytest.mark.parametrize(
    "pair",
    [p for p in itertools.product(Phase, Signal) if p not in EXPECTED],
    ids=lambda p: f"{p[0].value}-{p[1].value}",
)
def test_unlisted_pairs_are_refused(pair: tuple[Phase, Signal]) -> None:
    with pytest.raises(Refused, match=f"{pair[0].value}.*{pair[1].value}"):
        step(*pair)


def test_terminal_states_take_no_signal() -> None:
    for state in (P.REAPED, P.GONE):
        for signal in Signal:
            with pytest.raises(Refused):
                step(state, signal)


def test_a_response_runs_once_through_its_lifecycle() -> None:
    phase = P.QUEUED
    seen: list[Act] = []
    for signal in (S.IN_PROGRESS, S.CANCEL, S.CANCEL_REMOTE, S.SETTLED, S.CANCEL):
        phase, actions = step(phase, signal)
        seen.extend(actions)
    assert phase is P.ENDED
    assert seen == [A.STORE_PROGRESS, A.STOP_TURN, A.STOP_TURN, A.CLOSE_STREAM, A.RECORD_OUTCOME, A.FORGET]
    with pytest.raises(Refused):
        step(phase, S.IN_PROGRESS)  # a second in_progress, or one after the end, is a bug


def test_probe_answers_map_to_signals() -> None:
    assert [probe_signal(a) for a in (True, False, None)] == [S.LEASE_HELD, S.LEASE_LAPSED, S.LEASE_GONE]


# -- cancel -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("background", "active", "here", "shared", "plan"),
    [
        (False, True, True, True, Cancel.REFUSE),
        (True, False, True, True, Cancel.AS_IS),
        (True, True, True, True, Cancel.LOCAL),
        (True, True, True, False, Cancel.LOCAL),
        (True, True, False, True, Cancel.REMOTE),
        (True, True, False, False, Cancel.LATEST),
    ],
)
def test_cancel_plan(background: bool, active: bool, here: bool, shared: bool, plan: Cancel) -> None:
    assert plan_cancel(background=background, active=active, here=here, shared=shared) is plan


# -- replay from N ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "background", "window", "expected", "plan"),
    [
        (-1, False, Window(0, 5, True), True, Replay.NOT_BACKGROUND),
        (-1, True, None, False, Replay.NO_EVENTS),  # no stream=true, or expired
        (-1, True, None, True, Replay.FOLLOW),  # streamed, runs elsewhere, nothing written yet
        (5, True, Window(7, 9, False), True, Replay.TRUNCATED),  # 6 is gone
        (6, True, Window(7, 9, False), True, Replay.FOLLOW),  # 7 is the oldest kept
        (9, True, Window(7, 9, True), True, Replay.NOTHING),  # N is the terminal
        (12, True, Window(7, 9, True), True, Replay.NOTHING),  # past it
        (9, True, Window(7, 9, False), True, Replay.FOLLOW),  # live: wait for 10
        (-1, True, Window(0, -1, False), True, Replay.FOLLOW),  # an empty log of this replica
    ],
)
def test_replay_plan(after: int, background: bool, window: Window | None, expected: bool, plan: Replay) -> None:
    assert plan_replay(after, background=background, window=window, expected=expected) is plan


# -- a background response driven through its machine (a fake turn task) ------------------------------


class FakeRunning:
    def __init__(self) -> None:
        self.response: dict[str, Any] = {"status": "in_progress"}
        self.stops: list[bool] = []
        self.cuts = 0
        self.task: asyncio.Task[None] = asyncio.ensure_future(asyncio.sleep(0))

    def stop(self, *, requested: bool = False) -> None:
        self.stops.append(requested)

    async def cut(self) -> int:
        self.cuts += 1
        if not self.task.done():  # as HttpTurn.cut: cancel the task, wait until it is over
            self.task.cancel()
            await asyncio.wait({self.task})
        return 1


class FakeOwner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def closing(self, running: Any, last: int, fault: bool) -> list[dict[str, Any]]:
        self.calls.append("closing")
        return []

    async def put_quietly(self, state: Any) -> None:
        self.calls.append("put")

    async def finished(self, bg: Any, response: dict[str, Any]) -> None:
        self.calls.append("finished")

    def forget(self, bg: Any) -> None:
        self.calls.append("forget")


class _State(msgspec.Struct):
    response: dict[str, Any]


def _turn(owner: FakeOwner) -> Any:
    from types import SimpleNamespace

    from gateway.sessions.background_turn import BackgroundTurn, Slot

    turn = SimpleNamespace(id="resp_x", ctx=SimpleNamespace(tenant="t"), tools_json=None)
    bg = BackgroundTurn(owner, turn, Slot(lambda: None), _State({}), None, None)  # type: ignore[arg-type]
    bg.running = FakeRunning()
    return bg


async def test_a_cancel_stops_the_turn_once_asked_and_a_late_one_leaves_its_settling_alone() -> None:
    """Before the machine, a cancel (or a lost lease) that came while the turn's task was settling —
    writing its final state, releasing its lease — cancelled that task in the middle of it."""
    owner = FakeOwner()
    bg = _turn(owner)
    await bg.deliver({"type": "response.in_progress", "sequence_number": 1, "response": {"output": []}})
    assert bg.phase is P.RUNNING and owner.calls == ["put"]
    bg.stop(S.CANCEL)
    assert bg.running.stops == [True]
    await bg.settle(bg.running, None)
    assert bg.phase is P.ENDED and owner.calls == ["put", "finished", "forget"]
    bg.stop(S.CANCEL_REMOTE)
    bg.stop(S.LEASE_LOST)
    await bg.cut(30.0)
    assert bg.running.stops == [True] and bg.running.cuts == 0


async def test_shutdown_cuts_a_running_turn() -> None:
    bg = _turn(FakeOwner())
    await bg.cut(30.0)
    assert bg.running.cuts == 1 and bg.phase is P.QUEUED


class HangingOwner(FakeOwner):
    """Its store never answers: a turn's settling (recording its outcome) never ends by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.settling = asyncio.Event()

    async def finished(self, bg: Any, response: dict[str, Any]) -> None:
        self.calls.append("finished")
        self.settling.set()
        await asyncio.Event().wait()


def _gauges(bg: Any) -> tuple[int, int]:
    from types import SimpleNamespace

    from gateway.sessions.background import BackgroundTurns

    owner = SimpleNamespace(_local={bg.id: bg})
    return BackgroundTurns.queued.fget(owner), BackgroundTurns.running.fget(owner)  # type: ignore[attr-defined]


async def test_shutdown_leaves_a_settling_turn_alone_only_up_to_its_bound() -> None:
    """A settling turn is left to finish its record, but one that never does (a store that hangs)
    must not hang the shutdown: past the bound it is cut. Before, shutdown waited on it forever. Until
    it is forgotten it is counted as running, as the gauges counted it before the machine."""
    owner = HangingOwner()
    bg = _turn(owner)
    running = bg.running
    await bg.deliver({"type": "response.in_progress", "sequence_number": 1, "response": {"output": []}})
    assert _gauges(bg) == (0, 1)
    running.task = asyncio.ensure_future(bg.settle(running, None))  # the turn's task, settling
    await owner.settling.wait()
    assert bg.phase is P.ENDED and _gauges(bg) == (0, 1)
    bg.stop(S.CANCEL)  # a late cancel: left alone
    assert running.stops == [] and not running.task.done()
    await asyncio.wait_for(bg.cut(0.01), 30)  # the guard only catches a hang
    assert running.cuts == 1 and running.task.cancelled()
    assert owner.calls == ["put", "finished", "forget"]


async def test_a_queued_turn_that_settles_is_counted_queued_until_forgotten() -> None:
    owner = HangingOwner()
    bg = _turn(owner)
    bg.running.task = asyncio.ensure_future(bg.settle(bg.running, None))
    await owner.settling.wait()
    assert bg.phase is P.ENDED and _gauges(bg) == (1, 0)
    await asyncio.wait_for(bg.cut(0.0), 30)  # the guard only catches a hang
    assert bg.running.task.cancelled()
