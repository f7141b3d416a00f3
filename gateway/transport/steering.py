"""One WebSocket connection's ``response.steer`` submissions, sans I/O: who may be steered, what
is queued for whom, and what happens to the queue when a response ends.

A steer names the connection's **active** response. Accepted, its input is queued on that
response and the turn is told (``gateway.turn.types.SteerSignal``): it stops at the next token
boundary — or once the tools it is running return — and ends ``incomplete`` with reason
``steered``. When it ends, :meth:`SteerBook.close` reads the outcome as a table (first row whose
columns match)::

    status      asks the client   plan        what the adapter does
    failed      -                 FAIL        response.steer.failed (successor_creation_failed)
    cancelled   -                 DROP        nothing: the socket is gone
    incomplete  content_filter    FAIL        (a flagged turn is not continued on its own)
    completed   yes               PENDING     response.steer.pending per steer; the input waits
                                              for the client's explicit response.create
    any other   -                 SUCCESSOR   a successor response.create, same lane, inheriting
                                              the create's settings, its input the queued steers

"Asks the client": the response ends with a call the client runs or an approval request, so it
cannot go on without the client; OpenAI's answer is ``pending`` with the stubs of what it waits
for, and the steers are prepended to the client's next create for that response on that lane
(:meth:`SteerBook.claim`). The **successor's** ``response.created`` is the commit point: until
then a steer can still fail (its successor could not be created) and is handed back.

Bounds (an attacker's view: a steer is a frame that costs nothing to send and holds memory
until its response ends): per response at most ``max_pending`` steers, and on the whole
connection at most ``max_bytes`` of queued input (so a successor's create fits the frame limit it
would have had, and sixteen lanes cannot hold sixteen times it); beyond either,
``too_many_pending_steers``; a response's steers add at most ``max_items`` input items (the
successor's input is theirs, and a create may hold no more). Steers waiting for the client's
create: one response's per lane — the lane's next create takes them, or, continuing something
else, orphans them (handed back: they can never be applied). Finished response ids are remembered (the last
:data:`REMEMBERED`) only to answer ``response_already_completed`` rather than ``not found``.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gateway.turn.types import SteerSignal
from gateway.wire.kinds import ResponseStatus
from gateway.wire.steer import SteerCode, new_steer_id, required_input, user_message

#: finished response ids kept per connection to tell "finished" from "unknown"
REMEMBERED = 256


class Plan(enum.Enum):
    SUCCESSOR = "successor"
    PENDING = "pending"
    FAIL = "fail"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class Steer:
    """One accepted submission: its id, the response it targets, its input as sent (handed back
    when it fails) and as create items (what a successor's input is made of)."""

    id: str
    target: str
    input: Any
    items: list[dict[str, Any]]
    nbytes: int


@dataclass(frozen=True, slots=True)
class Refused:
    """A steer the book will not take: the failed event's code and text."""

    code: SteerCode
    message: str


@dataclass(slots=True)
class _Target:
    lane: str
    signal: SteerSignal
    #: why this response cannot be steered (None: it can)
    refusal: Refused | None
    queue: list[Steer] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Settled:
    """What :meth:`SteerBook.close` decided for a finished response's queue."""

    plan: Plan
    steers: list[Steer]
    #: PENDING: the stubs of what the response waits for (``required_input``)
    required: list[dict[str, Any]] = field(default_factory=list)
    #: FAIL: why
    message: str = ""


#: what a response nobody steered settles to (shared: built once, never changed)
_NOTHING = Settled(Plan.DROP, [])

#: rows of the table above: (status, incomplete reason or None, asks the client or None) -> plan
_ROWS: tuple[tuple[str | None, str | None, bool | None, Plan, str], ...] = (
    (ResponseStatus.FAILED, None, None, Plan.FAIL, "The response failed; the steer input was not applied."),
    (ResponseStatus.CANCELLED, None, None, Plan.DROP, ""),
    (
        ResponseStatus.INCOMPLETE,
        "content_filter",
        None,
        Plan.FAIL,
        "The response ended incomplete (content_filter); no successor response was created.",
    ),
    (ResponseStatus.COMPLETED, None, True, Plan.PENDING, ""),
    (None, None, None, Plan.SUCCESSOR, ""),
)


def _row(status: Any, reason: Any, asks: bool) -> tuple[Plan, str]:
    """The first row of ``_ROWS`` that matches (the last matches everything)."""
    for row_status, row_reason, row_asks, plan, message in _ROWS:
        if (
            (row_status is None or row_status == status)
            and (row_reason is None or row_reason == reason)
            and (row_asks is None or row_asks == asks)
        ):
            return plan, message
    raise AssertionError("the last row matches everything")


class SteerBook:
    def __init__(self, *, max_pending: int, max_bytes: int, max_items: int) -> None:
        self.max_pending = max_pending
        self.max_bytes = max_bytes
        #: input items one response's steers may add up to (a create's ``max_input_items``: the
        #: successor's input is theirs)
        self.max_items = max_items
        self._active: dict[str, _Target] = {}
        #: responses that asked the client something, with the steers waiting for its create
        self._waiting: dict[str, tuple[str, list[Steer]]] = {}
        self._done: OrderedDict[str, str] = OrderedDict()  # response id -> lane
        #: the input bytes of every steer still in the book (active and waiting responses)
        self.nbytes = 0

    def open(self, response_id: str, lane: str, signal: SteerSignal, refusal: Refused | None) -> None:
        """A response of this connection is running (its ``response.created`` is out)."""
        self._active[response_id] = _Target(lane, signal, refusal)

    def lane_of(self, response_id: Any) -> str | None:
        """The lane of a response this connection runs or ran (the steer events' ``stream_id``)."""
        if not isinstance(response_id, str):
            return None
        target = self._active.get(response_id)
        if target is not None:
            return target.lane
        waiting = self._waiting.get(response_id)
        return waiting[0] if waiting is not None else self._done.get(response_id)

    def refusal(self, target_id: str, nbytes: int, n_items: int = 0) -> Refused | None:
        """Why a steer of ``nbytes`` (and ``n_items`` input items) on ``target_id`` would be refused,
        or None. Asked before its input is validated too — a frame for a response that takes no
        steer costs a lookup, not a walk of its input — and again by :meth:`submit`."""
        target = self._active.get(target_id)
        if target is None:
            if target_id in self._waiting or target_id in self._done:
                return Refused(
                    SteerCode.ALREADY_COMPLETED,
                    f"Response '{target_id}' has already finished and no longer accepts steering input.",
                )
            return Refused(SteerCode.RESPONSE_NOT_FOUND, f"Response '{target_id}' is not active on this connection.")
        if target.refusal is not None:
            return target.refusal
        queued_items = sum(len(q.items) for q in target.queue)
        if (
            len(target.queue) >= self.max_pending
            or self.nbytes + nbytes > self.max_bytes
            or queued_items + n_items > self.max_items
        ):
            return Refused(
                SteerCode.TOO_MANY,
                f"Too much steering input is pending for response '{target_id}' (at most {self.max_pending} "
                f"submissions and {self.max_items} input items, and {self.max_bytes} bytes on this connection).",
            )
        return None

    def submit(self, target_id: str, steer_input: Any, items: list[dict[str, Any]], nbytes: int) -> Steer | Refused:
        """Queue a valid steer on ``target_id`` and signal its turn, or say why not."""
        refused = self.refusal(target_id, nbytes, len(items))
        if refused is not None:
            return refused
        target = self._active[target_id]
        steer = Steer(new_steer_id(), target_id, steer_input, items, nbytes)
        target.queue.append(steer)
        self.nbytes += nbytes
        target.signal.requested = True
        return steer

    def close(self, response_id: str, lane: str, response: dict[str, Any]) -> Settled:
        """The response ended (its terminal is out): what becomes of its steers (the table above)."""
        target = self._active.pop(response_id, None)
        self._remember(response_id, lane)
        if target is None or not target.queue:
            return _NOTHING  # nearly every response: nobody steered it
        status = response.get("status")
        reason = (response.get("incomplete_details") or {}).get("reason")
        stubs = required_input(response.get("output") or [])
        plan, message = _row(status, reason, bool(stubs))
        if plan is Plan.PENDING:
            # at most one waiting response per lane: the lane's next create takes its steers or
            # orphans them (:meth:`claim`) before another can end waiting
            self._waiting[response_id] = (target.lane, target.queue)
        else:
            self._release(target.queue)
        return Settled(plan, target.queue, stubs if plan is Plan.PENDING else [], message)

    def claim(self, previous_response_id: str | None, lane: str) -> tuple[list[Steer], list[Steer]]:
        """A create starts on ``lane``: the steers waiting on ``previous_response_id`` there, which
        it takes (prepended to its input, in submission order), and the steers waiting on another
        response of the lane, which it orphans — the lane went on without answering that response,
        so they can never be applied: the adapter hands them back."""
        taken: list[Steer] = []
        orphaned: list[Steer] = []
        for rid in [rid for rid, (waiting_lane, _) in self._waiting.items() if waiting_lane == lane]:
            steers = self._waiting.pop(rid)[1]
            self._release(steers)
            if rid == previous_response_id:
                taken = steers
            else:
                orphaned += steers
        return taken, orphaned

    def _release(self, steers: list[Steer]) -> None:
        self.nbytes -= sum(s.nbytes for s in steers)

    def _remember(self, response_id: str, lane: str) -> None:
        self._done[response_id] = lane
        while len(self._done) > REMEMBERED:
            self._done.popitem(last=False)

    @property
    def queued(self) -> int:
        """Steers accepted and not yet committed or failed (active and waiting responses)."""
        return sum(len(t.queue) for t in self._active.values()) + sum(len(s) for _, s in self._waiting.values())


def steered_input(steers: list[Steer], create_input: Any = None) -> list[Any]:
    """The queued steers' items in submission order, then the create's own input (a string is a
    user message)."""
    items: list[Any] = [item for s in steers for item in s.items]
    if isinstance(create_input, str):
        items.append(user_message(create_input))
    elif isinstance(create_input, list):
        items.extend(create_input)
    return items


#: create fields a successor does not inherit: its own input and parent, and what made the
#: original a warm-up; ``type`` and ``stream_id`` are the frame's, the lane is the target's
_NOT_INHERITED = frozenset({"input", "previous_response_id", "generate"})


def successor_frame(create: dict[str, Any], steered_id: str, steers: list[Steer]) -> dict[str, Any]:
    """The automatic successor's create: the original create's settings, continuing from the
    steered response with the queued input."""
    frame = {k: v for k, v in create.items() if k not in _NOT_INHERITED}
    frame["previous_response_id"] = steered_id
    frame["input"] = steered_input(steers)
    return frame
