"""The steer book (gateway/transport/steering.py) row by row, without a socket: what becomes of a
finished response's steers, what a create claims, and the bounds an attacker meets."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.transport.steering import (
    REMEMBERED,
    Plan,
    Refused,
    Steer,
    SteerBook,
    steered_input,
    successor_frame,
)
from gateway.turn.types import SteerSignal
from gateway.wire.steer import SteerCode

USER = [{"type": "message", "role": "user", "content": "go"}]


def book(**kw: Any) -> SteerBook:
    kw.setdefault("max_pending", 4)
    kw.setdefault("max_bytes", 1000)
    kw.setdefault("max_items", 100)
    return SteerBook(**kw)


def running(b: SteerBook, rid: str = "resp_1", lane: str = "", refusal: Refused | None = None) -> SteerSignal:
    signal = SteerSignal()
    b.open(rid, lane, signal, refusal)
    return signal


def accept(b: SteerBook, rid: str = "resp_1", nbytes: int = 10) -> Steer:
    steer = b.submit(rid, "go", USER, nbytes)
    assert isinstance(steer, Steer), steer
    return steer


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}", "id": "fc_1"}
APPROVAL = {"type": "mcp_approval_request", "id": "mcpr_1", "name": "add", "server_label": "s", "arguments": "{}"}
MESSAGE = {"type": "message", "role": "assistant", "content": []}


@pytest.mark.parametrize(
    ("response", "plan"),
    [
        ({"status": "failed", "output": []}, Plan.FAIL),
        ({"status": "cancelled", "output": []}, Plan.DROP),
        ({"status": "incomplete", "incomplete_details": {"reason": "content_filter"}, "output": []}, Plan.FAIL),
        ({"status": "completed", "output": [MESSAGE, CALL]}, Plan.PENDING),
        ({"status": "completed", "output": [APPROVAL]}, Plan.PENDING),
        ({"status": "completed", "output": [MESSAGE]}, Plan.SUCCESSOR),
        ({"status": "incomplete", "incomplete_details": {"reason": "steered"}, "output": [MESSAGE]}, Plan.SUCCESSOR),
        ({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": []}, Plan.SUCCESSOR),
        ({"status": "incomplete", "incomplete_details": {"reason": "steered"}, "output": [CALL]}, Plan.SUCCESSOR),
    ],
)
def test_each_row_of_the_table(response: dict[str, Any], plan: Plan) -> None:
    b = book()
    signal = running(b)
    steers = [accept(b), accept(b)]
    assert signal.requested
    settled = b.close("resp_1", "", response)
    assert settled.plan is plan and settled.steers == steers
    if plan is Plan.PENDING:
        stub = (
            {"type": "function_call_output", "call_id": "call_1", "name": "get_weather"}
            if CALL in response["output"]
            else {"type": "mcp_approval_response", "approval_request_id": "mcpr_1"}
        )
        assert settled.required == [stub]
        assert b.claim("resp_1", "") == (steers, []) and b.claim("resp_1", "") == ([], [])  # taken once
    else:
        assert b.claim("resp_1", "") == ([], [])
    if plan is Plan.FAIL:
        assert settled.message


def test_a_response_nobody_steered_settles_to_nothing_and_is_then_finished() -> None:
    b = book()
    running(b)
    assert b.close("resp_1", "", {"status": "completed", "output": []}).plan is Plan.DROP
    late = b.submit("resp_1", "go", USER, 10)
    assert isinstance(late, Refused) and late.code is SteerCode.ALREADY_COMPLETED
    unknown = b.submit("resp_other", "go", USER, 10)
    assert isinstance(unknown, Refused) and unknown.code is SteerCode.RESPONSE_NOT_FOUND


def test_bounds_count_and_bytes() -> None:
    b = book(max_pending=2, max_bytes=100)
    running(b)
    accept(b, nbytes=40)
    accept(b, nbytes=40)
    by_count = b.submit("resp_1", "go", USER, 1)
    assert isinstance(by_count, Refused) and by_count.code is SteerCode.TOO_MANY
    b2 = book(max_pending=10, max_bytes=100)
    running(b2, "resp_1", lane="a")
    running(b2, "resp_2", lane="b")
    accept(b2, "resp_1", nbytes=60)
    by_bytes = b2.submit("resp_2", "go", USER, 41)  # the bytes are the connection's, across lanes
    assert isinstance(by_bytes, Refused) and by_bytes.code is SteerCode.TOO_MANY
    assert b2.queued == 1 and b2.nbytes == 60
    b2.close("resp_1", "a", {"status": "completed", "output": [CALL]})  # waiting: still held
    assert b2.nbytes == 60 and isinstance(b2.submit("resp_2", "go", USER, 41), Refused)
    assert len(b2.claim("resp_1", "a")[0]) == 1 and b2.nbytes == 0  # taken by the client's create
    accept(b2, "resp_2", nbytes=41)
    b2.close("resp_2", "b", {"status": "completed", "output": []})  # a successor takes them
    assert b2.nbytes == 0
    # items: a response's steers add at most max_items (the successor's input is theirs)
    b3 = book(max_items=3)
    running(b3)
    assert isinstance(b3.submit("resp_1", "go", USER * 2, 1), Steer)
    by_items = b3.submit("resp_1", "go", USER * 2, 1)
    assert isinstance(by_items, Refused) and by_items.code is SteerCode.TOO_MANY
    assert isinstance(b3.submit("resp_1", "go", USER, 1), Steer)


def test_a_refused_target_says_why_and_is_never_signalled() -> None:
    b = book()
    why = Refused(SteerCode.NOT_SUPPORTED, "no")
    signal = running(b, refusal=why)
    assert b.submit("resp_1", "go", USER, 1) == why and not signal.requested


def test_claims_are_per_lane_and_a_lane_that_goes_on_orphans_its_waiting_steers() -> None:
    b = book()
    running(b, "resp_a", lane="a")
    (steer,) = [accept(b, "resp_a", nbytes=7)]
    assert b.close("resp_a", "a", {"status": "completed", "output": [CALL]}).plan is Plan.PENDING
    assert b.claim("resp_a", "b") == ([], [])  # another lane's create does not touch them
    assert b.lane_of("resp_a") == "a" and b.nbytes == 7
    # lane a goes on with a create that continues something else: the steer can never apply
    assert b.claim("resp_other", "a") == ([], [steer])
    assert b.nbytes == 0 and b.queued == 0 and b.claim("resp_a", "a") == ([], [])


def test_finished_ids_are_remembered_within_a_bound() -> None:
    b = book()
    for i in range(REMEMBERED + 5):
        running(b, f"resp_{i}")
        b.close(f"resp_{i}", "", {"status": "completed", "output": []})
    assert b.lane_of("resp_0") is None and b.lane_of(f"resp_{REMEMBERED + 4}") == ""
    gone = b.submit("resp_0", "go", USER, 1)
    assert isinstance(gone, Refused) and gone.code is SteerCode.RESPONSE_NOT_FOUND


def test_the_successor_inherits_the_create_but_its_input_and_parent() -> None:
    create = {
        "type": "response.create",
        "model": "m",
        "input": "first",
        "previous_response_id": "resp_0",
        "generate": True,
        "instructions": "be brief",
        "tools": [{"type": "function", "name": "f"}],
        "max_output_tokens": 99,
        "store": False,
        "stream_id": "a",
    }
    steers = [
        Steer("steer_1", "resp_1", "one", [{"type": "message", "role": "user", "content": "one"}], 3),
        Steer("steer_2", "resp_1", "two", [{"type": "message", "role": "user", "content": "two"}], 3),
    ]
    frame = successor_frame(create, "resp_1", steers)
    assert frame["previous_response_id"] == "resp_1" and "generate" not in frame
    assert [m["content"] for m in frame["input"]] == ["one", "two"]
    for key in ("model", "instructions", "tools", "max_output_tokens", "store", "stream_id", "type"):
        assert frame[key] == create[key]
    # a client's create after pending: the steers first, its own input after (a string is a message)
    assert [m["content"] for m in steered_input(steers, "three")] == ["one", "two", "three"]
    assert steered_input(steers, [CALL])[-1] is CALL
