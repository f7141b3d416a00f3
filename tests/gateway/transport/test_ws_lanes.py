"""WebSocket mode, "Queueing and lanes" (ws-mode spec §6, checklist §14).

Concurrency is asserted from the order of frames on the one socket, never from timing: the
simulated engine decodes slowly (``delay_per_token_s``) so that two responses that really run
concurrently interleave their events, and two that are queued cannot.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import Turn

pytestmark = pytest.mark.timeout(60)

MODEL = "gpt-oss-sim"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
SLOW = 0.01  # seconds per token: ~40-token answers stream for ~0.4 s
LONG_TEXT = " ".join(f"word{i}" for i in range(12))


# -- helpers -------------------------------------------------------------------------------------


def transcript(view: PromptView) -> list[str]:
    return [f"{m.role}: {m.text}" for m in view.messages() if m.role not in ("system", "developer")]


def slow_echo(view: PromptView) -> Turn:
    """Slow answers. ``RECALL`` gets the transcript (one line per message), ``FAIL`` a mid-stream
    engine failure, anything else a long acknowledgement naming what was said."""
    said = view.last.text if view.last is not None else ""
    if "RECALL" in said:
        return Turn(text="\n".join(transcript(view)), delay_per_token_s=SLOW)
    if "FAIL" in said:
        return Turn(text=LONG_TEXT, fail_after_tokens=5, delay_per_token_s=SLOW)
    return Turn(text=f"ack<{said}> {LONG_TEXT}", delay_per_token_s=SLOW)


def recv(conn: Any) -> dict[str, Any]:
    ev = json.loads(conn.recv_bytes())
    assert isinstance(ev, dict)
    return ev


def collect(conn: Any, n: int) -> list[dict[str, Any]]:
    """Frames until ``n`` turns ended (a terminal event or an ``error`` frame each)."""
    out: list[dict[str, Any]] = []
    ended = 0
    while ended < n:
        ev = recv(conn)
        out.append(ev)
        if ev["type"] in TERMINAL or ev["type"] == "error":
            ended += 1
    return out


def by_response(events: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Response id -> indexes (in socket order) of all its events."""
    out: dict[str, list[int]] = {}
    current: dict[str, str] = {}  # lane -> id of its running response
    for i, ev in enumerate(events):
        lane = ev.get("stream_id", "")
        if ev["type"] == "response.created":
            current[lane] = ev["response"]["id"]
        if ev["type"] == "error":
            continue
        rid = ev["response"]["id"] if "response" in ev else current[lane]
        out.setdefault(rid, []).append(i)
    return out


def created_ids(events: list[dict[str, Any]], lane: str | None = None) -> list[str]:
    return [e["response"]["id"] for e in events if e["type"] == "response.created" and e.get("stream_id") == lane]


def terminal(events: list[dict[str, Any]], rid: str) -> dict[str, Any]:
    got = [e for e in events if e["type"] in TERMINAL and e["response"]["id"] == rid]
    assert len(got) == 1, got
    return got[0]


def text_of(resp: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for o in resp["output"] if o["type"] == "message" for p in o["content"])


def overlap(events: list[dict[str, Any]], a: str, b: str) -> bool:
    """Some event of ``b`` lies strictly between the first and last event of ``a``."""
    idx = by_response(events)
    lo, hi = idx[a][0], idx[a][-1]
    return any(lo < j < hi for j in idx[b])


@pytest.fixture
def slow_gw(make_gateway):
    return make_gateway(Settings(), engine=SimulatedEngine(script=slow_echo, record_prompts=True))


# -- default lane ---------------------------------------------------------------------------------


def test_default_lane_back_to_back_creates_run_sequentially(slow_gw):
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="first", store=False)
        conn.response.create(model=MODEL, input="second", store=False)
        events = collect(conn, 2)
    assert not any(e["type"] == "error" for e in events)
    assert not any("stream_id" in e for e in events)
    first, second = created_ids(events)
    idx = by_response(events)
    assert max(idx[first]) < min(idx[second]), "#2 started before #1 reached its terminal event"
    assert events[max(idx[first])]["type"] == "response.completed"
    assert events[min(idx[second])]["type"] == "response.created"
    assert text_of(terminal(events, first)["response"]).startswith("ack<first>")
    assert text_of(terminal(events, second)["response"]).startswith("ack<second>")
    # per-response sequence numbers restart at 0
    assert [events[i]["sequence_number"] for i in idx[second]] == list(range(len(idx[second])))


def test_default_lane_second_create_references_first_while_it_runs(slow_gw):
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="remember OSPREY", store=False)
        created = recv(conn)
        assert created["type"] == "response.created"
        first = created["response"]["id"]
        # #1 is still streaming (slow engine): chain #2 on it right away
        conn.response.create(model=MODEL, input="RECALL", previous_response_id=first, store=False)
        events = [created] + collect(conn, 2)
    assert not any(e["type"] == "error" for e in events)
    assert events[1]["type"] != "response.completed", "#1 finished before #2 was even sent: not a queueing test"
    second = created_ids(events)[1]
    idx = by_response(events)
    assert max(idx[first]) < min(idx[second])
    r2 = terminal(events, second)["response"]
    assert r2["status"] == "completed" and r2["previous_response_id"] == first
    assert text_of(r2).splitlines()[0] == "user: remember OSPREY"
    assert text_of(r2).splitlines()[1].startswith("assistant: ack<remember OSPREY>")


# -- named lanes ----------------------------------------------------------------------------------


def test_lanes_run_concurrently_and_tag_every_event(slow_gw):
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="on a", store=False, stream_id="a")
        conn.response.create(model=MODEL, input="on b", store=False, stream_id="b")
        conn.response.create(model=MODEL, input="on default", store=False)
        events = collect(conn, 3)
    assert not any(e["type"] == "error" for e in events)
    (a,), (b,), (d,) = created_ids(events, "a"), created_ids(events, "b"), created_ids(events, None)
    idx = by_response(events)
    for rid, lane in ((a, "a"), (b, "b")):
        assert all(events[i].get("stream_id") == lane for i in idx[rid]), lane
        assert events[idx[rid][-1]]["type"] == "response.completed"
    assert all("stream_id" not in events[i] for i in idx[d])
    assert len(idx[a]) + len(idx[b]) + len(idx[d]) == len(events)
    # really concurrent: their events interleave on the socket
    assert overlap(events, a, b) or overlap(events, b, a)
    assert overlap(events, a, d) or overlap(events, d, a)
    assert text_of(terminal(events, a)["response"]).startswith("ack<on a>")
    assert text_of(terminal(events, b)["response"]).startswith("ack<on b>")


def test_lane_is_fifo(slow_gw):
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="a one", store=False, stream_id="a")
        conn.response.create(model=MODEL, input="a two", store=False, stream_id="a")
        conn.response.create(model=MODEL, input="b one", store=False, stream_id="b")
        events = collect(conn, 3)
    assert not any(e["type"] == "error" for e in events)
    a1, a2 = created_ids(events, "a")
    (b1,) = created_ids(events, "b")
    idx = by_response(events)
    assert max(idx[a1]) < min(idx[a2]), "two responses of lane a overlapped"
    assert text_of(terminal(events, a1)["response"]).startswith("ack<a one>")
    assert text_of(terminal(events, a2)["response"]).startswith("ack<a two>")
    # while lane b did run alongside lane a
    assert overlap(events, a1, b1) or overlap(events, b1, a1)


def test_17th_concurrent_response_is_queued_not_rejected(slow_gw):
    assert slow_gw.gw.settings.ws_max_inflight == 16
    client = slow_gw.openai()
    lanes = [f"l{i}" for i in range(17)]
    with client.responses.connect() as conn:
        for lane in lanes:
            conn.response.create(model=MODEL, input=f"hello {lane}", store=False, stream_id=lane)
        events = collect(conn, 17)
    assert not any(e["type"] == "error" for e in events)
    types = [e["type"] for e in events]
    first_end = next(i for i, t in enumerate(types) if t in TERMINAL)
    created_at = [i for i, t in enumerate(types) if t == "response.created"]
    assert len(created_at) == 17
    # 16 started at once; the 17th only after one of them finished
    assert sum(1 for i in created_at if i < first_end) == 16
    assert sum(1 for i in created_at if i > first_end) == 1
    assert [e["response"]["status"] for e in events if e["type"] in TERMINAL] == ["completed"] * 17
    late_lane = events[created_at[-1]]["stream_id"]
    late = terminal(events, events[created_at[-1]]["response"]["id"])["response"]
    assert text_of(late).startswith(f"ack<hello {late_lane}>")


def test_33rd_distinct_stream_id_is_rejected(make_gateway):
    gw = make_gateway(Settings(), engine=SimulatedEngine(script=lambda v: Turn(text="ok")))
    client = gw.openai()
    with client.responses.connect() as conn:
        for i in range(32):
            conn.response.create(model=MODEL, input="hi", store=False, stream_id=f"s{i}")
        events = collect(conn, 32)
        assert [e["type"] for e in events].count("response.completed") == 32
        assert not any(e["type"] == "error" for e in events)

        conn.response.create(model=MODEL, input="hi", store=False, stream_id="s32")
        (err,) = collect(conn, 1)
        assert err["type"] == "error" and err["status"] == 400
        assert err["stream_id"] == "s32"
        assert err["error"]["type"] == "invalid_request_error"
        assert err["error"]["code"] == "websocket_stream_limit_reached"
        assert err["error"]["param"] == "stream_id"
        assert "(32)" in err["error"]["message"]

        # an existing lane still works, and so does the default lane (it does not count)
        conn.response.create(model=MODEL, input="hi", store=False, stream_id="s7")
        (done,) = [e for e in collect(conn, 1) if e["type"] in TERMINAL]
        assert done["type"] == "response.completed" and done["stream_id"] == "s7"
        conn.response.create(model=MODEL, input="hi", store=False)
        evs = collect(conn, 1)
        assert evs[-1]["type"] == "response.completed" and "stream_id" not in evs[-1]
        # a rejected id did not consume a lane: it is still refused
        conn.response.create(model=MODEL, input="hi", store=False, stream_id="s33")
        (err,) = collect(conn, 1)
        assert err["error"]["code"] == "websocket_stream_limit_reached" and err["stream_id"] == "s33"


@pytest.mark.parametrize(
    "bad",
    ["", "x" * 257, "a b", "a\n", "lane/1", "é", 7],
    ids=["empty", "257-chars", "space", "trailing-newline", "slash", "non-ascii", "not-a-string"],
)
def test_invalid_stream_id(make_gateway, bad):
    gw = make_gateway(Settings(), engine=SimulatedEngine(script=lambda v: Turn(text="ok")))
    client = gw.openai()
    with client.responses.connect() as conn:
        conn.send({"type": "response.create", "model": MODEL, "input": "hi", "store": False, "stream_id": bad})
        (err,) = collect(conn, 1)
        assert err["type"] == "error" and err["status"] == 400
        assert "stream_id" not in err
        assert err["error"]["code"] == "invalid_stream_id"
        assert err["error"]["param"] == "stream_id"
        assert err["error"]["type"] == "invalid_request_error"
        # the socket stays usable, and the longest valid id works
        longest = "A-z_0.9" + "x" * 249
        conn.response.create(model=MODEL, input="hi", store=False, stream_id=longest)
        evs = collect(conn, 1)
        assert evs[-1]["type"] == "response.completed"
        assert all(e["stream_id"] == longest for e in evs)


# -- forks ----------------------------------------------------------------------------------------


def test_fork_sees_parent_context_and_parent_lane_continues_in_parallel(slow_gw):
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="fact KESTREL", store=False, stream_id="a")
        (a1,) = [e["response"] for e in collect(conn, 1) if e["type"] == "response.completed"]
        conn.response.create(
            model=MODEL, input="RECALL fork", previous_response_id=a1["id"], store=False, stream_id="f"
        )
        conn.response.create(
            model=MODEL, input="RECALL main", previous_response_id=a1["id"], store=False, stream_id="a"
        )
        events = collect(conn, 2)
    assert not any(e["type"] == "error" for e in events)
    (f1,), (a2,) = created_ids(events, "f"), created_ids(events, "a")
    assert overlap(events, f1, a2) or overlap(events, a2, f1), "fork and lane a did not run in parallel"
    parent_lines = ["user: fact KESTREL", f"assistant: {text_of(a1)}"]
    fork = terminal(events, f1)
    main = terminal(events, a2)
    assert fork["stream_id"] == "f" and main["stream_id"] == "a"
    assert text_of(fork["response"]).splitlines() == parent_lines + ["user: RECALL fork"]
    assert text_of(main["response"]).splitlines() == parent_lines + ["user: RECALL main"]


def test_fork_from_response_still_in_flight_is_not_found(slow_gw):
    """Only finished responses are resolvable (spec §5.3): with store=false, a fork of a response
    that is still streaming on another lane fails, on the fork's lane, before it exists."""
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="still running", store=False, stream_id="a")
        created = recv(conn)
        assert created["type"] == "response.created" and created["stream_id"] == "a"
        running = created["response"]["id"]
        conn.response.create(model=MODEL, input="fork", previous_response_id=running, store=False, stream_id="f")
        events = [created] + collect(conn, 2)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1
    err = errors[0]
    assert err["stream_id"] == "f" and err["status"] == 400
    assert err["error"]["code"] == "previous_response_not_found"
    assert err["error"]["message"] == f"Previous response with id '{running}' not found."
    types = [e["type"] for e in events]
    assert events.index(err) < types.index("response.completed"), "the fork was not refused while lane a ran"
    assert created_ids(events, "f") == []
    assert terminal(events, running)["type"] == "response.completed"


@pytest.mark.parametrize("failure", ["4xx", "response.failed"])
def test_failed_fork_does_not_evict_parent(slow_gw, failure):
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="fact HERON", store=False, stream_id="a")
        (a1,) = [e["response"] for e in collect(conn, 1) if e["type"] == "response.completed"]
        if failure == "4xx":
            conn.response.create(
                model=MODEL, input="RECALL", previous_response_id=a1["id"], store=False, stream_id="f", temperature=5
            )
            (err,) = collect(conn, 1)
            assert err["type"] == "error" and err["status"] == 400 and err["stream_id"] == "f"
        else:
            conn.response.create(model=MODEL, input="FAIL", previous_response_id=a1["id"], store=False, stream_id="f")
            evs = collect(conn, 1)
            assert evs[-1]["type"] == "response.failed" and evs[-1]["stream_id"] == "f"
        # another fork from the same parent still works ...
        conn.response.create(model=MODEL, input="RECALL", previous_response_id=a1["id"], store=False, stream_id="g")
        assert collect(conn, 1)[-1]["type"] == "response.completed"
        # ... and lane a continues from the shared parent
        conn.response.create(model=MODEL, input="RECALL", previous_response_id=a1["id"], store=False, stream_id="a")
        evs = collect(conn, 1)
        assert evs[-1]["type"] == "response.completed", evs[-1]
        assert text_of(evs[-1]["response"]).splitlines()[0] == "user: fact HERON"


def test_failed_same_lane_continuation_on_named_lane_evicts_parent(slow_gw):
    """The counterpart of the fork rule: on its own lane a failed continuation does evict."""
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="fact", store=False, stream_id="a")
        (a1,) = [e["response"] for e in collect(conn, 1) if e["type"] == "response.completed"]
        conn.response.create(model=MODEL, input="FAIL", previous_response_id=a1["id"], store=False, stream_id="a")
        assert collect(conn, 1)[-1]["type"] == "response.failed"
        conn.response.create(model=MODEL, input="again", previous_response_id=a1["id"], store=False, stream_id="a")
        (err,) = collect(conn, 1)
        assert err["type"] == "error" and err["stream_id"] == "a"
        assert err["error"]["code"] == "previous_response_not_found"
        assert err["error"]["message"] == f"Previous response with id '{a1['id']}' not found."


def test_reusing_lane_without_previous_response_id_starts_fresh(slow_gw):
    client = slow_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="secret WREN", store=False, stream_id="a")
        collect(conn, 1)
        conn.response.create(model=MODEL, input="RECALL", store=False, stream_id="a")
        evs = collect(conn, 1)
    done = evs[-1]
    assert done["type"] == "response.completed" and done["stream_id"] == "a"
    assert done["response"]["previous_response_id"] is None
    assert text_of(done["response"]).splitlines() == ["user: RECALL"]
