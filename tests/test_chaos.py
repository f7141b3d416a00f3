"""The hostile-input suite (issue 14): each attack against a gateway in its own process, an RSS bound per case.

Cases here: deep nesting (1), compression bombs (4), frames measured in bytes (9), rejection
counters and browser origins (10), plus a fuzz target that mixes nesting depth, placement,
compression and multi-byte text around every limit. The other cases have their own modules
(test_ledger_faults, test_ws_backpressure, test_limits_http). Every case asserts the documented
answer, that the process lived and served a normal turn afterwards, and a bound on its resident
memory growth (the kernel's high-water mark: tests/chaos.py); times are printed, never asserted.

``RESPGATE_CHAOS_REPORT=path`` appends one JSON line per case (inputs tried, answers, RSS peak,
worst /healthz latency) — the table in the issue note is made from it.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.chaos import ChaosGateway, MiB, chaos_gateway
from tests.conftest import MODEL

pytestmark = pytest.mark.slow

LIMIT = 1024 * 1024  # max_request_bytes of the gateway under attack
SLACK = 64 * 1024  # gateway/app.py WS_FRAME_SLACK: read beyond the limit before closing 1009
DEPTH = 64  # max_json_depth (default)
BASE_RSS_SLACK = 48 * MiB  # allocator noise, a turn's own buffers, the probes' sockets


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosGateway]:
    with chaos_gateway(tmp_path_factory.mktemp("chaos"), max_request_bytes=LIMIT, rate_limit_rpm=100_000) as gw:
        yield gw


def report(case: str, tried: int, answers: Counter[str], peak: Any, stall: Any = None) -> None:
    line = {
        "case": case,
        "tried": tried,
        "answers": dict(answers),
        "rss_before_mib": round(peak.before / MiB),
        "rss_peak_mib": round(peak.peak / MiB),
        "healthz_worst_s": None if stall is None else round(stall.worst, 3),
    }
    print(json.dumps(line))
    if path := os.environ.get("RESPGATE_CHAOS_REPORT"):
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def still_serves(gw: ChaosGateway) -> None:
    assert gw.alive(), gw.log()[-3000:]
    r = httpx.post(gw.url + "/v1/responses", json={"model": MODEL, "input": "still there?"}, timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    with connect(gw.ws_url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "and here?"}))
        while (ev := json.loads(ws.recv(timeout=30)))["type"] != "response.completed":
            assert ev["type"] != "error", ev


def no_tracebacks(gw: ChaosGateway, since: int) -> None:
    tail = gw.log()[since:]
    assert "Traceback" not in tail and '"level": "ERROR"' not in tail, tail[-3000:]


# -- nesting -------------------------------------------------------------------------------------

HOLE = "__nested_value__"


def nest(depth: int, kinds: str) -> str:
    """JSON text of ``depth`` containers (``kinds`` cycles through "d" dict / "l" list) around a string
    (written by hand: the json module cannot write what it is meant to test)."""
    opens = "".join('{"k": ' if kinds[i % len(kinds)] == "d" else "[" for i in range(depth))
    closes = "".join("}" if kinds[i % len(kinds)] == "d" else "]" for i in reversed(range(depth)))
    return opens + '"leaf"' + closes


def frame_with(body: dict[str, Any], nested: str) -> str:
    """``body`` (which holds HOLE somewhere) as JSON text with the nested value in the hole."""
    text = json.dumps(body, ensure_ascii=False)
    assert text.count(f'"{HOLE}"') == 1
    return text.replace(f'"{HOLE}"', nested)


#: where a nested value goes in an otherwise valid create, and the top-level param a 400 names
PLACES = {
    "tools": lambda v: {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "x": v}}]},
    "text": lambda v: {"text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object", "x": v}}}},
    "tool_choice": lambda v: {"tool_choice": {"type": "function", "name": "f", "x": v}},
    "input": lambda v: {"input": [{"role": "user", "content": "hi", "x": v}]},
    "metadata": lambda v: {"metadata": {"k": v}},
}


def body_depth(place: str, inner: int) -> int:
    """JSON depth of the whole body, counted as check_depth counts (the body object is level 1)."""
    return {"tools": 4, "text": 4, "tool_choice": 2, "input": 3, "metadata": 2}[place] + inner


def test_case1_deep_nesting_answers_400_naming_the_param_never_500(target: ChaosGateway):
    since = len(target.log())
    answers: Counter[str] = Counter()
    tried = 0
    with target.rss_peak() as peak, httpx.Client(timeout=60) as client:
        for place, wrap in PLACES.items():
            for inner in (126, 260, 500, 1000, 5000, 20_000):
                body = frame_with({"model": MODEL, **wrap(HOLE)}, nest(inner, "dl"))
                r = client.post(
                    target.url + "/v1/responses", content=body, headers={"content-type": "application/json"}
                )
                tried += 1
                answers[str(r.status_code)] += 1
                assert r.status_code == 400, (place, inner, r.text[:300])
                err = r.json()["error"]
                assert err["code"] == "invalid_value" and err["param"] == place, err
        with connect(target.ws_url, open_timeout=30, max_size=None) as ws:
            for place, wrap in PLACES.items():
                ws.send(frame_with({"type": "response.create", "model": MODEL, **wrap(HOLE)}, nest(3000, "ld")))
                ev = json.loads(ws.recv(timeout=30))
                tried += 1
                answers[f"ws {ev['type']} {ev.get('status')}"] += 1
                assert ev["type"] == "error" and ev["status"] == 400 and ev["error"]["param"] == place, ev
    report("1 deep nesting (HTTP + WS, depth 126..20,000, 5 places)", tried, answers, peak)
    assert peak.growth < BASE_RSS_SLACK, peak
    still_serves(target)
    no_tracebacks(target, since)


# -- compression bombs ----------------------------------------------------------------------------


def test_case4_compression_bombs_cost_at_most_one_frame_limit_per_connection(target: ChaosGateway):
    """30 connections each send a ~64 KB deflated frame that inflates to 64 MiB. Before: inflated in
    full before the size check (4,053 MiB peak); now each is read to the frame limit and closed 1009."""
    frame = json.dumps({"type": "response.create", "model": MODEL, "input": "a" * (64 * MiB)})
    codes: list[Any] = []
    n = 30

    def bomb() -> None:
        try:
            with connect(target.ws_url, compression="deflate", max_size=None, open_timeout=60) as ws:
                ws.send(frame)
                ws.recv(timeout=60)
                codes.append("answered")
        except ConnectionClosed as closed:
            codes.append(closed.rcvd.code if closed.rcvd is not None else None)

    since = len(target.log())
    with target.rss_peak() as peak, target.healthz_stall() as stall:
        threads = [threading.Thread(target=bomb) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    report(f"4 compression bomb ({n} x 64 MiB inflated from ~64 KB)", n, Counter(map(str, codes)), peak, stall)
    assert codes == [1009] * n
    # each connection holds at most one frame's worth (limit + slack) while it is inflated
    assert peak.growth < n * (LIMIT + SLACK) + BASE_RSS_SLACK, peak
    still_serves(target)
    no_tracebacks(target, since)


# -- frame bytes, not characters ------------------------------------------------------------------


def test_case9_frames_are_measured_in_utf8_bytes(target: ChaosGateway):
    answers: Counter[str] = Counter()
    with target.rss_peak() as peak, connect(target.ws_url, max_size=None, open_timeout=30) as ws:
        chars = LIMIT // 3 + 1000  # under the limit in characters, over it in bytes
        for text in ("中" * chars, "😀" * (LIMIT // 4 + 1000), "é" * (LIMIT // 2 + 1000)):
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": text}, ensure_ascii=False))
            ev = json.loads(ws.recv(timeout=30))
            answers[f"{ev['type']} {ev.get('status')}"] += 1
            assert ev["type"] == "error" and ev["status"] == 413, ev
    report("9 multi-byte frames over the byte limit, under it in characters", 3, answers, peak)
    assert peak.growth < 4 * LIMIT + BASE_RSS_SLACK, peak
    still_serves(target)


# -- counters and origins ------------------------------------------------------------------------


def metric(gw: ChaosGateway, name: str, **labels: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=30).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = line[len(name) + 1 : line.index("}")]
            if ",".join(sorted(got.split(","))) == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_case10_rejections_are_counted_and_browser_origins_refused(target: ChaosGateway):
    since = len(target.log())
    before = {
        r: metric(target, "respgate_input_rejections_total", transport="http", reason=r)
        for r in ("size", "depth", "count")
    }
    answers: Counter[str] = Counter()
    with target.rss_peak() as peak, httpx.Client(timeout=60) as client:
        for _ in range(50):  # a flood of refusals: counted each, logged a few times
            r = client.post(
                target.url + "/v1/responses",
                content=b'{"model": "x", "input": "' + b"a" * (LIMIT + 1) + b'"}',
                headers={"content-type": "application/json"},
            )
            answers[str(r.status_code)] += 1
            assert r.status_code == 413
            r = client.post(
                target.url + "/v1/responses",
                content=frame_with({"model": MODEL, **PLACES["tools"](HOLE)}, nest(100, "d")),
            )
            answers[str(r.status_code)] += 1
            assert r.status_code == 400
        for _ in range(50):
            with pytest.raises(InvalidStatus) as refused:
                with connect(target.ws_url, origin="http://evil.example", open_timeout=30):
                    pass
            answers[f"ws {refused.value.response.status_code}"] += 1
            assert refused.value.response.status_code == 403
            r = client.post(
                target.url + "/v1/responses",
                content=json.dumps({"model": MODEL, "input": "hi"}),
                headers={"content-type": "text/plain", "origin": "http://evil.example"},
            )
            answers[str(r.status_code)] += 1
            assert r.status_code == 403
    report("10 refusal floods (413, depth 400, cross-origin WS and POST)", 200, answers, peak)
    assert metric(target, "respgate_input_rejections_total", transport="http", reason="size") == before["size"] + 50
    assert metric(target, "respgate_input_rejections_total", transport="http", reason="depth") == before["depth"] + 50
    assert peak.growth < BASE_RSS_SLACK, peak
    no_tracebacks(target, since)
    tail = target.log()[since:]
    assert tail.count("ASGI callable returned without completing handshake") == 0
    still_serves(target)


# -- fuzz: nesting x placement x compression x size ----------------------------------------------


def expected(depth: int, nbytes: int) -> str:
    """The documented answer to one create frame: by size first (the frame is measured before it is
    parsed), then by depth."""
    if nbytes > LIMIT + SLACK:
        return "close 1009"
    if nbytes > LIMIT:
        return "error 413"
    if depth > DEPTH:
        return "error 400"
    return "served"


@pytest.fixture(scope="module")
def fuzz_log() -> Iterator[Counter[str]]:
    seen: Counter[str] = Counter()
    yield seen
    print("fuzz answers:", dict(seen))


@settings(
    max_examples=60, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck), database=None
)
@given(
    place=st.sampled_from(sorted(PLACES)),
    inner=st.integers(0, 400),
    kinds=st.sampled_from(["d", "l", "dl", "ldd"]),
    pad=st.sampled_from([0, 1000, LIMIT - 4000, LIMIT + 1000, LIMIT + SLACK + 5000]),
    char=st.sampled_from(["a", "中", "😀"]),
    deflate=st.booleans(),
)
def test_fuzz_nesting_and_compression(
    target: ChaosGateway, fuzz_log: Counter[str], place: str, inner: int, kinds: str, pad: int, char: str, deflate: bool
) -> None:
    body = {
        "type": "response.create",
        "model": MODEL,
        "max_output_tokens": 16,
        **PLACES[place](HOLE),
        "instructions": char * (pad // len(char.encode())),
    }
    frame = frame_with(body, nest(inner, kinds))
    # a create frame is the same object as an HTTP body: the same depth
    want = expected(body_depth(place, inner), len(frame.encode()))
    try:
        with connect(target.ws_url, compression="deflate" if deflate else None, max_size=None, open_timeout=30) as ws:
            ws.send(frame)
            ev = json.loads(ws.recv(timeout=60))
            if ev["type"] == "error":
                got = f"error {ev['status']}"
            else:
                while ev["type"] not in ("response.completed", "response.incomplete", "response.failed", "error"):
                    ev = json.loads(ws.recv(timeout=60))
                got = "served" if ev["type"] in ("response.completed", "response.incomplete") else f"{ev['type']}"
    except ConnectionClosed as closed:
        got = f"close {closed.rcvd.code if closed.rcvd is not None else None}"
    fuzz_log[got] += 1
    if want == "served" and got == "error 400":
        pass  # a valid-depth value in a place a schema refuses (e.g. a list where an object goes): still a 4xx
    else:
        assert got == want, (place, inner, kinds, pad, char, deflate, got)
    assert target.alive()


def test_fuzz_left_the_gateway_bounded(target: ChaosGateway) -> None:
    """After the fuzz target (same module, same process): resident memory has not run away."""
    assert target.rss() < 1024 * MiB, target.rss() / MiB
    still_serves(target)


# -- tokenizer-hostile text -------------------------------------------------------------------------


def test_case7_runs_of_one_character_cost_linear_time_and_never_panic(target: ChaosGateway):
    """A run of one character is one tokenizer piece: harmony's BPE is quadratic in it (32,000 "中"
    in instructions took 11.6 s with the GIL held: every client frozen; 1 MB took minutes) and 1 MB
    of "a" or of spaces overflowed harmony's / tiktoken's stack (a Rust panic: plain-text 500). Now
    each field is answered, and /healthz keeps answering while they run."""
    since = len(target.log())
    answers: Counter[str] = Counter()
    size = 900_000  # under the gateway's 1 MiB limit with the JSON around it
    tried = 0
    with target.rss_peak() as peak, target.healthz_stall() as stall, httpx.Client(timeout=300) as client:
        for ch in ("a", " ", "\n", "中", "😀", "!"):
            run = ch * (size // len(json.dumps(ch, ensure_ascii=False).encode()[1:-1]))
            for body in (
                {"instructions": run, "input": "hi"},
                {"input": run},
                {
                    "input": "hi",
                    "tools": [{"type": "function", "name": "f", "description": run, "parameters": {"type": "object"}}],
                },
            ):
                r = client.post(
                    target.url + "/v1/responses",
                    headers={"content-type": "application/json"},
                    content=json.dumps({"model": MODEL, "max_output_tokens": 16, **body}, ensure_ascii=False).encode(),
                )
                tried += 1
                answers[str(r.status_code)] += 1
                if r.status_code == 400:  # a megabyte of "中" is 900k tokens: more than the context holds
                    assert r.json()["error"]["code"] == "context_length_exceeded", r.text[:500]
                else:
                    assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text[:500]
    report(
        "7 tokenizer-hostile runs (900 KB of one character in instructions / input / a tool description)",
        tried,
        answers,
        peak,
        stall,
    )
    assert stall.samples > tried  # the loop kept answering between (and during) the big requests
    assert peak.growth < 512 * MiB, peak
    still_serves(target)
    no_tracebacks(target, since)
