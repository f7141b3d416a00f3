"""Gateway time of a steer against a plain continuation, side by side, at two history lengths.

* ``continuation`` a ``response.create`` continuing the chain (``previous_response_id``, a short
                   user message): from the frame sent to the response's first text delta;
* ``steer``        a ``response.steer`` (a short user message) sent while the chain's newest
                   response generates: from the frame sent to the **successor's** first text delta
                   — the cut at the next token (the simulated model samples one a millisecond),
                   the steered response's terminal and bookkeeping, the successor's prepare and
                   first pass, appended at the steered response's tip.

Both run on one WebSocket connection over the same chain (``store: false``), turn for turn,
against the gateway in its own process (``benchmarks.sim_server --script steer``), at a short and
a long history: a steer that re-rendered or re-read the history would grow with it, an append
does not.

    python -m benchmarks.steer [--turns 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.sync.client import connect

from benchmarks.common import MODEL, ChildGateway

RESULTS = Path(__file__).parent / "results"
HISTORIES = (1_000, 32_000)  # tokens, about


def _words(tokens: int) -> str:
    return " ".join(f"w{i % 997}" for i in range(tokens // 2))


def _until(ws: Any, kind: str) -> dict[str, Any]:
    while True:
        ev = orjson.loads(ws.recv(timeout=60))
        if ev["type"] == kind:
            return dict(ev)
        if ev["type"] in ("error", "response.failed"):
            raise RuntimeError(str(ev)[:300])


def _create(prev: str | None, text: str) -> bytes:
    frame: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": text, "store": False}
    if prev is not None:
        frame["previous_response_id"] = prev
    return orjson.dumps(frame)


def _chain(ws: Any, history: int, turns: int) -> dict[str, list[float]]:
    ws.send(_create(None, _words(history) + " STOP"))
    prev = _until(ws, "response.completed")["response"]["id"]
    times: dict[str, list[float]] = {"continuation": [], "steer": []}
    for i in range(turns + 3):  # the first 3: warm-up
        t0 = time.perf_counter()
        ws.send(_create(prev, f"STOP turn {i}"))
        _until(ws, "response.output_text.delta")
        dt_cont = time.perf_counter() - t0
        prev = _until(ws, "response.completed")["response"]["id"]
        ws.send(_create(prev, f"go on {i}"))
        target = _until(ws, "response.created")["response"]["id"]
        _until(ws, "response.output_text.delta")
        t0 = time.perf_counter()
        ws.send(orjson.dumps({"type": "response.steer", "previous_response_id": target, "input": f"STOP {i}"}))
        _until(ws, "response.created")  # the successor's
        _until(ws, "response.output_text.delta")
        dt_steer = time.perf_counter() - t0
        prev = _until(ws, "response.completed")["response"]["id"]
        if i >= 3:
            times["continuation"].append(dt_cont)
            times["steer"].append(dt_steer)
    return times


def run(turns: int) -> dict[str, Any]:
    gw = ChildGateway("--script", "steer")
    out: dict[str, Any] = {"turns": turns, "histories": {}}
    try:
        for history in HISTORIES:
            with connect(gw.ws_url, max_size=None) as ws:
                times = _chain(ws, history, turns)
            med = {k: statistics.median(v) * 1000 for k, v in times.items()}
            out["histories"][str(history)] = {
                "median_ms": med,
                "steer_over_continuation": med["steer"] / med["continuation"],
            }
        out["full_render_fallbacks"] = gw.metric_value("respgate_render_full_fallbacks_total")
    finally:
        gw.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    result = run(args.turns)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "steer.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
