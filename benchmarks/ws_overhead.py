"""Per-turn gateway overhead of a WebSocket continuation, at 1k vs 128k tokens of history.

The simulated engine runs at zero latency with its prefix-cache emulation off, so what is
measured is the gateway: frame parsing, validation, parent resolution, classification hook,
incremental rendering, event building and framing, and the client's own read loop (identical for
both). Two sockets are driven side by side, turn for turn, so machine noise hits both equally.
The goal (DESIGN.md): the 128k/1k ratio of the median stays <= 1.2, i.e. a continuation costs
O(new input), not O(history).

    python -m benchmarks.ws_overhead [--turns 200] [--history 1000 131072] [--plot PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import orjson
from websockets.sync.client import connect

from gateway.settings import Settings
from inference.harmony import HarmonyRenderer
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL, start_gateway, stop_gateway

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def filler(tokens: int) -> str:
    """Text of about ``tokens`` o200k tokens (calibrated on a sample)."""
    sample = " ".join(WORDS[i % len(WORDS)] for i in range(1000))
    per_word = HarmonyRenderer().count_text_tokens(sample) / 1000
    return " ".join(WORDS[i % len(WORDS)] for i in range(int(tokens / per_word)))


def short_answer(view) -> Turn:
    """A terse agent turn: the benchmark measures the gateway, not the answer's length."""
    return Turn(reasoning="ok", text="done")


class Chain:
    def __init__(self, ws_url: str, history_tokens: int) -> None:
        self.ws = connect(ws_url, max_size=None, compression=None)
        self.prev: str | None = None
        self.history_tokens = history_tokens
        self.turn({"role": "user", "content": filler(history_tokens)})

    def turn(self, item: dict) -> float:
        frame = {"type": "response.create", "model": MODEL, "store": False, "input": [item]}
        if self.prev:
            frame["previous_response_id"] = self.prev
        data = orjson.dumps(frame).decode()
        t0 = time.perf_counter()
        self.ws.send(data)
        while True:
            ev = orjson.loads(self.ws.recv())
            if ev["type"] == "response.completed":
                break
            if ev["type"] in ("error", "response.failed", "response.incomplete"):
                raise RuntimeError(str(ev)[:500])
        dt = time.perf_counter() - t0
        self.prev = ev["response"]["id"]
        self.input_tokens = ev["response"]["usage"]["input_tokens"]
        return dt

    def close(self) -> None:
        self.ws.close()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--history", type=int, nargs=2, default=[1000, 131072])
    ap.add_argument("--plot", type=Path, default=Path(__file__).parent / "results" / "ws_overhead.png")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "ws_overhead.json")
    args = ap.parse_args(argv)

    engine = SimulatedEngine(prefix_cache=False, script=short_answer)
    live = start_gateway(Settings(max_context=args.history[1] * 2, max_request_bytes=64 * 1024 * 1024),
                         engine=engine)
    try:
        chains = [Chain(live.ws_url, n) for n in args.history]
        times: dict[int, list[float]] = {n: [] for n in args.history}
        for i in range(args.warmup + args.turns):
            for chain in (chains if i % 2 == 0 else list(reversed(chains))):
                dt = chain.turn({"role": "user", "content": f"step {i}: continue"})
                if i >= args.warmup:
                    times[chain.history_tokens].append(dt)
        render = {m: live.metric("respgate_render_tokens_total", {"mode": m}) for m in ("append", "full")}
        for c in chains:
            c.close()
    finally:
        stop_gateway(live)

    small, big = args.history
    result = {
        "turns": args.turns,
        "history_tokens": {str(n): c.input_tokens for n, c in zip(args.history, chains)},
        "median_ms": {str(n): statistics.median(times[n]) * 1e3 for n in args.history},
        "p99_ms": {str(n): pct(times[n], 99) * 1e3 for n in args.history},
        "render_tokens": render,
    }
    result["ratio_median"] = result["median_ms"][str(big)] / result["median_ms"][str(small)]
    result["ratio_p99"] = result["p99_ms"][str(big)] / result["p99_ms"][str(small)]
    print(json.dumps(result, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        ax.boxplot([[t * 1e3 for t in times[n]] for n in args.history], showfliers=False)
        ax.set_xticks([1, 2], [f"{n:,} tokens of history" for n in args.history])
        ax.set_ylabel("ms per WebSocket continuation turn")
        ax.set_title(f"Gateway overhead, simulated engine at zero latency (ratio {result['ratio_median']:.2f})")
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"plot: {args.plot}")
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
