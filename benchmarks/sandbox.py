"""What a ``code_interpreter`` container costs on the local sandbox (issue 34).

``python -m benchmarks.sandbox [--cold N] [--calls N] [--out DIR]`` measures, on this host:

- **cold start**: ``LocalSandbox.create()`` until the first result of ``1+1`` is back (bwrap, the
  namespaces, the seccomp filter, the system python's start-up, the REPL server's hello, one run),
  for N containers one after another, each closed before the next; and ``close()`` itself;
- **per call**: ``run("1+1")`` on a warm container, N times: the frame round trip, the rlimit and
  fd shuffling in the server, and the two folder scans on the host (before/after, for the file list);
- the same call with 100 files in the folder (the scans grow with the folder);
- for scale: a bare ``/usr/bin/python3 -I -c pass`` start, and the same under bwrap without the REPL;
- the resident memory of one idle container's process tree;
- the cost of the per-container cgroup (memory and pids bounds for the whole tree): cold start and per
  call again with ``cgroup="off"``, interleaved with the measured runs so both see the same load;
- the data-analysis runtime: a fresh container's first ``import pandas, matplotlib.pyplot``.

Writes ``sandbox.json`` beside the report (default ``benchmarks/results``). Nearest-rank percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, pct, proc_rss_bytes
from security.sandbox.local import _ENV, LocalSandbox, _fds, _SeccompFd

HERE = Path(__file__).parent


def _summary(xs: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in xs]
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99), "max_ms": max(ms)}


def _tree_rss(pid: int) -> int:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    tree, frontier = {pid}, [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        tree.update(kids)
        frontier += kids
    total = 0
    for p in tree:
        try:
            total += proc_rss_bytes(p)
        except (OSError, RuntimeError):
            pass
    return total


def _process_starts(sandbox: LocalSandbox, n: int) -> dict[str, dict[str, float]]:
    bare: list[float] = []
    wrapped: list[float] = []
    folder = tempfile.mkdtemp(dir=sandbox.base_dir)
    os.chmod(folder, 0o777)
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sandbox.python, "-I", "-c", "pass"], check=True, env=dict(_ENV))
        bare.append(time.perf_counter() - t)
        with _SeccompFd(sandbox.seccomp_filter) as fd:
            argv = sandbox._argv(folder, fd, [sandbox.python, "-I", "-c", "pass"])
            t = time.perf_counter()
            subprocess.run(argv, check=True, env=dict(_ENV), pass_fds=_fds(fd), cwd="/")
            wrapped.append(time.perf_counter() - t)
    shutil.rmtree(folder, ignore_errors=True)
    return {"python_bare": _summary(bare), "python_under_bwrap": _summary(wrapped)}


async def _cold(sandbox: LocalSandbox, cold: list[float], closes: list[float]) -> None:
    t = time.perf_counter()
    box = await sandbox.create()
    result = await box.run("1+1")
    cold.append(time.perf_counter() - t)
    assert result.ok and result.stdout.strip() == "2", result
    t = time.perf_counter()
    await box.close()
    closes.append(time.perf_counter() - t)


async def _calls(sandbox: LocalSandbox, baseline: LocalSandbox, n: int) -> tuple[list[float], list[float]]:
    """``run("1+1")`` on a warm container of each, alternately (the same load for both)."""
    boxes = [await sandbox.create(), await baseline.create()]
    calls: tuple[list[float], list[float]] = ([], [])
    try:
        for _ in range(20):  # warm-up
            for box in boxes:
                await box.run("1+1")
        for _ in range(n):
            for box, out in zip(boxes, calls, strict=True):
                t = time.perf_counter()
                result = await box.run("1+1")
                out.append(time.perf_counter() - t)
                assert result.ok
    finally:
        for box in boxes:
            await box.close()
    return calls


async def _data_runtime(sandbox: LocalSandbox, n: int) -> dict[str, float] | None:
    if not {"pandas", "matplotlib"} <= set(sandbox.available().details.get("python_modules", "").split()):
        return None
    took: list[float] = []
    for _ in range(n):
        box = await sandbox.create()
        try:
            t = time.perf_counter()
            result = await box.run("import pandas, matplotlib.pyplot")
            took.append(time.perf_counter() - t)
            assert result.ok, result
        finally:
            await box.close()
    return _summary(took)


async def _measure(sandbox: LocalSandbox, baseline: LocalSandbox, cold_n: int, calls_n: int) -> dict[str, Any]:
    cold: list[float] = []
    closes: list[float] = []
    cold_off: list[float] = []
    closes_off: list[float] = []
    for _ in range(cold_n):  # interleaved with the baseline: both see the same load
        await _cold(sandbox, cold, closes)
        await _cold(baseline, cold_off, closes_off)

    box = await sandbox.create()
    try:
        for _ in range(20):  # warm-up
            await box.run("1+1")
        rss = _tree_rss(box.pid or 0)
        calls: list[float] = []
        for _ in range(calls_n):
            t = time.perf_counter()
            result = await box.run("1+1")
            calls.append(time.perf_counter() - t)
            assert result.ok
        made = await box.run("for i in range(100):\n    open(f'/mnt/data/f{i}.csv', 'w').write('a,b\\n')")
        assert made.ok and len(made.files) == 100
        with_files: list[float] = []
        for _ in range(calls_n):
            t = time.perf_counter()
            await box.run("1+1")
            with_files.append(time.perf_counter() - t)
    finally:
        await box.close()
    calls_on, calls_off = await _calls(sandbox, baseline, calls_n)
    return {
        "cold_start_to_first_result": _summary(cold),
        "close": _summary(closes),
        "call_1plus1": _summary(calls),
        "call_1plus1_100_files": _summary(with_files),
        "idle_container_rss_mib": rss / (1 << 20),
        "python": box.python_version,
        "cgroup_cost": {
            "cold_start_with_cgroup": _summary(cold),
            "cold_start_without_cgroup": _summary(cold_off),
            "close_with_cgroup": _summary(closes),
            "close_without_cgroup": _summary(closes_off),
            "call_with_cgroup": _summary(calls_on),
            "call_without_cgroup": _summary(calls_off),
        },
        "first_import_pandas_matplotlib": await _data_runtime(sandbox, min(cold_n, 10)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold", type=int, default=50)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="respgate-sandbox-bench-"))
    base.chmod(0o711)
    sandbox = LocalSandbox(base / "containers")
    sandbox.base_dir.mkdir(mode=0o711)
    baseline = LocalSandbox(base / "containers", cgroup="off")
    availability = sandbox.available()
    if not availability.ok:
        raise SystemExit(f"the local sandbox cannot start here: {availability.reason}")
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    try:
        figures = asyncio.run(_measure(sandbox, baseline, args.cold, args.calls))
        figures.update(_process_starts(sandbox, min(args.cold, 50)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures["seccomp"] = availability.details.get("seccomp", "")
    for key in ("cgroup", "uid", "python_modules"):
        figures[key] = availability.details.get(key, "")
    figures["machine"] = machine(load0, time.perf_counter() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sandbox.json").write_text(json.dumps(figures, indent=2) + "\n")
    for name, row in figures.items():
        print(f"{name}: {row}")


if __name__ == "__main__":
    main()
