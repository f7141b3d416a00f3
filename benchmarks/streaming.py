"""(c) Streaming: the most output tokens per second one connection carries, and 64 at once.

The simulated engine runs at unlimited speed (no decode delay) with an answer that never ends, so
``max_output_tokens`` sets each response's length and the gateway (detokenize, event building,
JSON, WebSocket framing) is the only limit. The gateway runs in its own process
(:mod:`benchmarks.sim_server`); the client process reads frames without parsing them (a substring
test finds the terminal event), so it stays cheaper than the server.

``tokens_per_delta`` is how many tokens the engine hands over at once: 1 is the worst case (one
``response.output_text.delta`` event per token, what a vLLM step gives a single sequence without
speculative decoding); larger values show what batching deltas buys. In these rows the engine waits
for the gateway to take each delta: the rate is the gateway's ceiling at that event size.

The *paced* rows model how vLLM actually delivers: the engine decodes one token per step at a fixed
rate (``decode_tps``) on its own clock, and tokens that fell due while the gateway was busy reach it
as one delta (vLLM's ``RequestOutputCollector`` merges the outputs a consumer has not taken yet).
There the question is whether one connection keeps up with an engine decoding at 25,000 or 50,000
tokens/s, and how many tokens each event ends up carrying.

Rate = output tokens / (last event - first delta), per connection; with N connections the
aggregate is all tokens / (last completion - first delta), and the CPU seconds the gateway process
used are read from /proc.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import orjson
from websockets.asyncio.client import connect

from benchmarks.common import ChildGateway

MODEL = "gpt-oss-sim"


async def one_stream(url: str, tokens: int) -> dict[str, float]:
    async with connect(url, max_size=None, compression=None) as ws:
        frame = orjson.dumps(
            {
                "type": "response.create",
                "model": MODEL,
                "store": False,
                "max_output_tokens": tokens,
                "input": "Write forever.",
            }
        ).decode()
        t0 = time.perf_counter()
        await ws.send(frame)
        first = None
        frames = 0
        while True:
            msg = await ws.recv()
            frames += 1
            if first is None and "output_text.delta" in msg[:60]:
                first = time.perf_counter()
            if '"response.completed"' in msg[:40] or '"response.incomplete"' in msg[:40]:
                end = time.perf_counter()
                usage = orjson.loads(msg)["response"]["usage"]
                break
            if '"type":"error"' in msg[:40] or '"response.failed"' in msg[:40]:
                raise RuntimeError(msg[:500])
        return {"t0": t0, "first": first or end, "end": end, "output_tokens": usage["output_tokens"], "frames": frames}


async def run_streams(url: str, connections: int, tokens: int) -> list[dict[str, float]]:
    return await asyncio.gather(*(one_stream(url, tokens) for _ in range(connections)))


def measure(
    per_delta: int, tokens_one: int, tokens_many: int, connections: int, reps: int, decode_tps: float = 0.0
) -> dict[str, Any]:
    pace = ["--decode-tps", str(decode_tps), "--paced"] if decode_tps else []
    with ChildGateway("--script", "stream", "--tokens-per-delta", str(per_delta), *pace) as gw:
        asyncio.run(run_streams(gw.ws_url, 2, 2000))  # warm-up: JIT-free, but caches and allocators
        singles = []
        for _ in range(reps):
            cpu0 = gw.cpu_seconds()
            (r,) = asyncio.run(run_streams(gw.ws_url, 1, tokens_one))
            cpu = gw.cpu_seconds() - cpu0
            singles.append(
                {
                    "tok_s": r["output_tokens"] / (r["end"] - r["first"]),
                    "tokens": r["output_tokens"],
                    "frames": r["frames"],
                    "ttft_ms": (r["first"] - r["t0"]) * 1e3,
                    "server_cpu_s": cpu,
                    "wall_s": r["end"] - r["t0"],
                }
            )
        cpu0 = gw.cpu_seconds()
        many = asyncio.run(run_streams(gw.ws_url, connections, tokens_many))
        cpu = gw.cpu_seconds() - cpu0
    total = sum(r["output_tokens"] for r in many)
    span = max(r["end"] for r in many) - min(r["first"] for r in many)
    per_conn = [r["output_tokens"] / (r["end"] - r["first"]) for r in many]
    return {
        "tokens_per_delta": per_delta,
        "decode_tps": decode_tps,
        "one_connection": {
            "median_tok_s": statistics.median(s["tok_s"] for s in singles),
            "tokens_per_event": sum(s["tokens"] for s in singles) / sum(s["frames"] for s in singles),
            "max_tok_s": max(s["tok_s"] for s in singles),
            "runs": singles,
            "server_cpu_s_per_1k_tokens": 1000
            * sum(s["server_cpu_s"] for s in singles)
            / sum(s["tokens"] for s in singles),
        },
        "many": {
            "connections": connections,
            "tokens_each": tokens_many,
            "aggregate_tok_s": total / span,
            "per_connection_median_tok_s": statistics.median(per_conn),
            "per_connection_min_tok_s": min(per_conn),
            "server_cpu_s": cpu,
            "wall_s": span,
            "server_cpu_s_per_1k_tokens": 1000 * cpu / total,
        },
    }


def run(quick: bool) -> dict[str, Any]:
    tokens_one = 20_000 if quick else 100_000
    tokens_many = 1_000 if quick else 5_000
    reps = 2 if quick else 5
    rows = [measure(k, tokens_one, tokens_many, 64, reps) for k in (1, 4, 16)]
    rows += [measure(1, tokens_one, tokens_many, 64, reps, decode_tps=r) for r in (25_000.0, 50_000.0)]
    return {
        "benchmark": "streaming",
        "engine": "simulated, unlimited speed, endless answer",
        "tokens_one_connection": tokens_one,
        "reps": reps,
        "rows": rows,
    }


def plot(result: dict[str, Any], path) -> None:
    from benchmarks.common import plt

    pyplot = plt()
    rows = result["rows"]
    labels = [
        f"paced {r['decode_tps'] / 1000:g}k/s\n1/step" if r.get("decode_tps") else str(r["tokens_per_delta"])
        for r in rows
    ]
    fig, ax = pyplot.subplots(figsize=(7, 4.5))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["one_connection"]["median_tok_s"] for r in rows], 0.4, label="1 connection")
    ax.bar(
        [i + 0.2 for i in x],
        [r["many"]["aggregate_tok_s"] for r in rows],
        0.4,
        label=f"{rows[0]['many']['connections']} connections, aggregate",
    )
    ax.axhline(20_000, color="k", linestyle="--", linewidth=0.8, label="target 20k tok/s (1 connection)")
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("tokens per engine delta (engine waits for the gateway) | paced engine, vLLM-style merging")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Streaming throughput, simulated engine at unlimited speed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)
