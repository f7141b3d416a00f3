"""The gateway's work per WebSocket continuation turn, counted: Python bytecodes, not seconds.

Why: the CPU figures of the other benchmarks move by ±30% between runs on these shared two-core
machines, which hides a 10% change in the gateway's own work. This one counts every bytecode the
gateway process executes (``sys.settrace`` opcode events, switched on for the measured turns only)
for two kinds of turn — a short one (one user message, a terse answer) and a Codex-shaped one
(the recorded Codex CLI continuation's tools, reasoning, include and text fields re-sent every
turn) — and attributes them to the pipeline's stages by the file they run in. The count does not
depend on the machine's load; it leaves out what runs in C (orjson, tiktoken, pydantic-core,
uvloop, the kernel's socket work), which the CPU figures have. Tracing makes the server ~20×
slower while it counts: no time is read here.

    python -m benchmarks.work_count [--turns N] [--json OUT]

The server is :mod:`benchmarks.sim_server` with ``--count-bytecodes FILE``: SIGUSR1 starts the
count, SIGUSR2 stops it and writes ``{function: bytecodes}`` to ``FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from benchmarks.common import ChildGateway, filler
from benchmarks.concurrency import codex_fields, create

#: stage -> path fragments of the files whose bytecodes it counts (first match wins; the rest is "other")
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "transport and event loop",
        ("gateway/transport/", "websockets/", "uvicorn/", "starlette/", "asyncio/", "gateway/access/"),
    ),
    ("simulated engine", ("inference/simulated",)),
    ("metrics", ("gateway/base/metrics", "prometheus_client/")),
    ("run", ("gateway/turn/run.py", "gateway/turn/events.py", "inference/harmony_parse", "inference/parse")),
    ("finalize", ("gateway/turn/finalize", "billing/", "cache/")),
    ("prepare", ("gateway/", "security/", "inference/", "pydantic/", "openai_harmony/", "tiktoken/")),
)


def install_counter(path: str) -> None:
    """In the server: count bytecodes per function between SIGUSR1 and SIGUSR2 (then write them)."""
    counts: collections.Counter[Any] = collections.Counter()

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return local

    def new_frame(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    def start(*_: Any) -> None:
        counts.clear()
        sys.settrace(new_frame)
        frame = sys._getframe(1)
        while frame is not None:  # the frames already running (the connection's loop) count too
            frame.f_trace, frame.f_trace_opcodes = local, True
            frame = frame.f_back

    def stop(*_: Any) -> None:
        sys.settrace(None)
        out = collections.Counter()
        for code, n in counts.items():
            out[f"{code.co_filename}:{code.co_firstlineno}:{code.co_qualname}"] += n
        Path(path).write_text(json.dumps(out))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


def _short_name(where: str) -> str:
    root = str(Path(__file__).resolve().parents[1]) + "/"
    where = where.replace(root, "")
    for marker in ("site-packages/", "/lib/python3.11/", "/lib/python3.12/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return where


def _stage(where: str) -> str:
    for stage, parts in STAGES:
        if any(p in where for p in parts):
            return stage
    return "other"


async def _measure(gw: ChildGateway, out: Path, turns: int, extra: dict[str, Any]) -> dict[str, Any]:
    async with connect(gw.ws_url, max_size=None, compression=None, ping_interval=None) as ws:
        _, resp = await create(ws, {"input": filler(1000), **extra})
        for i in range(50):  # warm: caches filled, first-turn paths taken
            _, resp = await create(
                ws, {"previous_response_id": resp["id"], **extra, "input": [{"role": "user", "content": f"warm {i}"}]}
            )
        out.unlink(missing_ok=True)
        os.kill(gw.proc.pid, signal.SIGUSR1)
        await asyncio.sleep(0.5)
        for i in range(turns):
            _, resp = await create(
                ws,
                {
                    "previous_response_id": resp["id"],
                    **extra,
                    "input": [{"role": "user", "content": f"step {i}: continue"}],
                },
            )
        os.kill(gw.proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    counts = {_short_name(k): v for k, v in json.loads(out.read_text()).items()}
    total = sum(counts.values())
    stages: collections.Counter[str] = collections.Counter()
    for where, n in counts.items():
        stages[_stage(where)] += n
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:25]
    return {
        "turns": turns,
        "bytecodes_per_turn": total / turns,
        "stages": {k: v / turns for k, v in stages.most_common()},
        "top": [[k, v / turns] for k, v in top],
    }


def run(quick: bool = False, turns: int | None = None) -> dict[str, Any]:
    turns = turns or (30 if quick else 300)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "counts.json"
        with ChildGateway("--count-bytecodes", str(out)) as gw:
            result["short"] = asyncio.run(_measure(gw, out, turns, {}))
            result["codex"] = asyncio.run(_measure(gw, out, turns, codex_fields()))
    return result


def plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    kinds = [k for k in ("short", "codex") if k in result]
    stages = [s for s, _ in STAGES] + ["other"]
    left = [0.0] * len(kinds)
    for stage in stages:
        vals = [result[k]["stages"].get(stage, 0.0) for k in kinds]
        ax.barh(kinds, vals, left=left, label=stage)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("Python bytecodes per turn (gateway process)")
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    result = run(turns=args.turns)
    for kind, r in result.items():
        print(
            f"{kind}: {r['bytecodes_per_turn']:,.0f} bytecodes a turn",
            ", ".join(f"{s} {v:,.0f}" for s, v in r["stages"].items()),
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
