"""(a) Per-turn gateway overhead of a continuation at 1k .. 128k tokens of history, three ways.

* ``ws``            WebSocket mode: ``response.create`` with ``previous_response_id``, ``store=false``,
                    only the new item in the frame; the parent comes from the connection cache.
* ``http_stateless`` the stateless HTTP way (Codex's HTTP transport, the Vercel AI SDK): every turn
                    POSTs the whole conversation (``store=false``, reasoning replayed as
                    ``encrypted_content``), SSE-streamed; nothing is kept between turns.
* ``http_chained``  HTTP with ``previous_response_id`` + ``store=true``: only the new item is posted;
                    the parent comes from the response store.

Each chain's history is built the way an agent's grows — turns of up to 4,096-token items (a
file, a command's output), each answered with reasoning and a message — so at 128k the
full-history path resends ~100 items (reasoning as ``encrypted_content``), as Codex's HTTP
transport does, not one giant message.

The simulated engine runs at zero latency with its prefix-cache emulation off, so the engine costs
the same for every prompt and what is measured is the gateway: framing and parsing, validation,
parent resolution, the classifier hook, rendering, event building and streaming, plus each
client's own read loop. Time runs from the first byte sent (the request already serialized) to
``response.completed`` received. The gateway runs in its own process (:mod:`benchmarks.sim_server`,
script ``short``), as it does for its clients; all chains (3 paths x 4 history sizes) are driven
turn for turn by this process, in an order that rotates every round, so machine noise hits them
alike.

The goal (DESIGN.md): the WS 128k/1k ratio of the median stays <= 1.2, i.e. a continuation costs
O(new input), not O(history); the HTTP rows are the baselines it is compared with.

Per turn, each chain also records the server's own view from its /metrics endpoint (turns are
serial, so deltas are per turn): the tokens the renderer encoded and the prepare time
(``respgate_turn_prepare_seconds``: validate .. render, before the engine is called).

    python -m benchmarks.ws_overhead [--turns 200] [--history 1000 8192 32768 131072] [--paths ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.sync.client import connect

from benchmarks.common import MODEL, ChildGateway, filler, metric_value

RESULTS = Path(__file__).parent / "results"
PATHS = ("ws", "http_stateless", "http_chained")
LABELS = {"ws": "WS continuation", "http_stateless": "HTTP full history", "http_chained": "HTTP prev_id + store"}
SHORT = {"ws": "WS", "http_stateless": "HTTP\nfull", "http_chained": "HTTP\nchained"}
FAILED = ("error", "response.failed", "response.incomplete")
CHUNK = 4096  # tokens per history item


class Chain:
    """One conversation on one path; ``turn`` sends one user item and returns seconds to completion."""

    def __init__(self, live: ChildGateway, path: str, history_tokens: int) -> None:
        self.live = live
        self.path = path
        self.history_tokens = history_tokens
        self.prev: str | None = None
        self.history: list[dict[str, Any]] = []  # http_stateless: the whole conversation, client-side
        self.input_tokens = 0
        self.encoded: list[float] = []  # renderer tokens encoded, per measured turn
        self.prepare_ms: list[float] = []  # server prepare time, per measured turn
        self.times: list[float] = []  # client-side seconds, per measured turn
        if path == "ws":
            self.ws = connect(live.ws_url, max_size=None, compression=None)
        else:
            self.http = httpx.Client(base_url=live.url + "/v1", timeout=300)
        self.first_input_tokens = 0
        # the history grows as an agent's does: items of up to CHUNK tokens (a file, a command's
        # output), each answered with reasoning and a message; full history resends them all
        left, k = history_tokens, 0
        while left > 0:
            size = min(CHUNK, left)
            self.turn({"role": "user", "content": filler(size, seed=k)})
            left, k = left - size, k + 1
        self.first_input_tokens = self.input_tokens

    def _body(self, item: dict[str, Any]) -> dict[str, Any]:
        if self.path == "http_stateless":
            self.history.append(item)
            return {
                "model": MODEL,
                "store": False,
                "stream": True,
                "input": self.history,
                "include": ["reasoning.encrypted_content"],
            }
        body: dict[str, Any] = {"model": MODEL, "store": self.path == "http_chained", "input": [item]}
        if self.path != "ws":
            body["stream"] = True
        if self.prev:
            body["previous_response_id"] = self.prev
        return body

    def turn(self, item: dict[str, Any], record: bool = False) -> float:
        body = self._body(item)
        if self.path == "ws":
            body["type"] = "response.create"
        data = orjson.dumps(body)
        enc0, prep0 = self._server_counters()
        t0 = time.perf_counter()
        ev = self._send_ws(data) if self.path == "ws" else self._send_http(data)
        dt = time.perf_counter() - t0
        enc1, prep1 = self._server_counters()
        response = ev["response"]
        self.prev = response["id"]
        self.input_tokens = response["usage"]["input_tokens"]
        if self.path == "http_stateless":
            self.history.extend(response["output"])
        if record:
            self.times.append(dt)
            self.encoded.append(enc1 - enc0)
            self.prepare_ms.append((prep1 - prep0) * 1e3)
        return dt

    def _send_ws(self, data: bytes) -> dict[str, Any]:
        self.ws.send(data.decode())
        while True:
            ev = orjson.loads(self.ws.recv())
            if ev["type"] == "response.completed":
                return ev
            if ev["type"] in FAILED:
                raise RuntimeError(f"{self.path}: {str(ev)[:500]}")

    def _send_http(self, data: bytes) -> dict[str, Any]:
        with self.http.stream("POST", "/responses", content=data, headers={"content-type": "application/json"}) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.path}: HTTP {r.status_code}: {r.read()[:500]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                ev = orjson.loads(line[6:])
                if ev["type"] == "response.completed":
                    return ev
                if ev["type"] in FAILED:
                    raise RuntimeError(f"{self.path}: {str(ev)[:500]}")
        raise RuntimeError(f"{self.path}: stream ended before response.completed")

    def _server_counters(self) -> tuple[float, float]:
        text = self.live.metrics_text()
        return (
            metric_value(text, "respgate_render_tokens_total", '{mode="append"}')
            + metric_value(text, "respgate_render_tokens_total", '{mode="full"}'),
            metric_value(text, "respgate_turn_prepare_seconds_sum"),
        )

    def close(self) -> None:
        (self.ws if self.path == "ws" else self.http).close()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summarize(chains: list[Chain], args: argparse.Namespace, wall_s: float, load: tuple[float, float]) -> dict:
    sizes = sorted(args.history)
    small, big = sizes[0], sizes[-1]
    rows: dict[str, dict[str, Any]] = {}
    for c in chains:
        rows.setdefault(c.path, {})[str(c.history_tokens)] = {
            "input_tokens_first": c.first_input_tokens,
            "input_tokens_last": c.input_tokens,
            "median_ms": statistics.median(c.times) * 1e3,
            "p99_ms": pct(c.times, 99) * 1e3,
            "mean_ms": statistics.fmean(c.times) * 1e3,
            "encoded_tokens_per_turn_median": statistics.median(c.encoded),
            "server_prepare_ms_median": statistics.median(c.prepare_ms),
        }
    for row in rows.values():
        row["ratio_median_vs_smallest"] = {
            str(n): row[str(n)]["median_ms"] / row[str(small)]["median_ms"] for n in sizes
        }
        row["ratio_median_big_over_small"] = row[str(big)]["median_ms"] / row[str(small)]["median_ms"]
        row["ratio_p99_big_over_small"] = row[str(big)]["p99_ms"] / row[str(small)]["p99_ms"]
    vs_ws: dict[str, Any] = {}
    ws_share: dict[str, Any] = {}
    if "ws" in rows:
        for path in rows:
            if path != "ws":
                vs_ws[path] = {str(n): rows[path][str(n)]["median_ms"] / rows["ws"][str(n)]["median_ms"] for n in sizes}
                # the target's form: WS overhead as a fraction of the other path's, same history
                ws_share[path] = {
                    str(n): {
                        "client_median": rows["ws"][str(n)]["median_ms"] / rows[path][str(n)]["median_ms"],
                        "server_prepare_median": rows["ws"][str(n)]["server_prepare_ms_median"]
                        / rows[path][str(n)]["server_prepare_ms_median"],
                    }
                    for n in sizes
                }
    return {
        "benchmark": "ws_overhead",
        "engine": "simulated, zero latency, prefix-cache emulation off",
        "turns": args.turns,
        "warmup": args.warmup,
        "history_tokens": sizes,
        "paths": rows,
        "median_ratio_vs_ws": vs_ws,
        "ws_fraction_of": ws_share,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_1m_start": load[0],
            "loadavg_1m_end": load[1],
            "wall_s": wall_s,
        },
    }


def plot(chains: list[Chain], result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"ws": "tab:green", "http_stateless": "tab:red", "http_chained": "tab:blue"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    data = [[t * 1e3 for t in c.times] for c in chains]
    box = left.boxplot(data, showfliers=False, patch_artist=True)
    for patch, c in zip(box["boxes"], chains):
        patch.set_facecolor(colors[c.path])
        patch.set_alpha(0.5)
    left.set_xticks(
        range(1, len(chains) + 1),
        [f"{SHORT[c.path]}\n{max(1, round(c.history_tokens / 1024))}k" for c in chains],
        fontsize=8,
    )
    left.set_yscale("log")
    left.set_ylabel("ms per turn (client: send -> response.completed)")
    left.set_title("Per-turn latency, simulated engine at zero latency")
    sizes = sorted(result["history_tokens"])
    for c in chains:
        if c.history_tokens not in (sizes[0], sizes[-1]):
            continue
        style = "-" if c.history_tokens == sizes[0] else "--"
        right.plot(
            [t * 1e3 for t in c.times],
            style,
            color=colors[c.path],
            linewidth=0.8,
            label=f"{LABELS[c.path]}, {c.history_tokens:,} tok start",
        )
    right.set_yscale("log")
    right.set_xlabel("measured turn")
    right.set_ylabel("ms")
    right.set_title("Per turn, as the conversation grows")
    right.set_ylim(top=right.get_ylim()[1] * 10)  # room for the legend above the lines
    right.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--history", type=int, nargs="+", default=[1000, 8192, 32768, 131072])
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--plot", type=Path, default=RESULTS / "ws_overhead.png")
    ap.add_argument("--json", type=Path, default=RESULTS / "ws_overhead.json")
    args = ap.parse_args(argv)

    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    live = ChildGateway("--script", "short", "--max-context", str(max(args.history) * 2))
    try:
        chains = [Chain(live, p, n) for p in args.paths for n in args.history]
        for i in range(args.warmup + args.turns):
            k = i % len(chains)
            for chain in chains[k:] + chains[:k]:
                chain.turn({"role": "user", "content": f"step {i}: continue"}, record=i >= args.warmup)
            if (i + 1) % 50 == 0:
                print(f"  round {i + 1}/{args.warmup + args.turns}", file=sys.stderr)
        for c in chains:
            c.close()
    finally:
        live.close()

    result = summarize(chains, args, time.perf_counter() - t_start, (load0, os.getloadavg()[0]))
    print(json.dumps(result, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    try:
        plot(chains, result, args.plot)
        print(f"plot: {args.plot}")
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
