"""What every benchmark shares: percentiles, filler text, machine facts, a gateway in a subprocess.

Benchmarks that measure the gateway's own CPU time or memory run it in a child process
(:class:`ChildGateway`, via :mod:`benchmarks.sim_server`) so the load generator's work is not
counted: CPU seconds are read from ``/proc/<pid>/stat``, resident memory from ``/proc/<pid>/status``.
"""

from __future__ import annotations

import functools
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega"
).split()
TERMINAL = ("response.completed", "response.failed", "response.incomplete")
#: the simulated model's served name (benchmarks/sim_server.py)
MODEL = "gpt-oss-sim"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], p: float) -> float:
    """Nearest-rank percentile (no interpolation: a p99 is a sample that happened)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


@functools.cache
def _tokens_per_word() -> float:
    from inference.harmony import HarmonyRenderer

    sample = " ".join(WORDS[i % len(WORDS)] for i in range(1000))
    return HarmonyRenderer().count_text_tokens(sample) / 1000


def filler(tokens: int, seed: int = 0) -> str:
    """Text of about ``tokens`` o200k tokens (calibrated on a sample); ``seed`` shifts the words."""
    return " ".join(WORDS[(i + seed) % len(WORDS)] for i in range(int(tokens / _tokens_per_word())))


def machine(load0: float, wall_s: float) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_1m_start": load0,
        "loadavg_1m_end": os.getloadavg()[0],
        "wall_s": wall_s,
    }


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def proc_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def wait_healthy(
    proc: subprocess.Popen,
    url: str,
    *,
    what: str,
    path: str = "/health",
    timeout_s: float,
    poll_s: float,
    log_path: Path | None = None,
) -> None:
    """Poll ``url + path`` until it answers 200; fail with the log's tail if the process exits first."""

    def tail() -> str:
        return log_path.read_text(errors="replace")[-3000:] if log_path is not None else ""

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail()}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become healthy in {timeout_s:g} s:\n{tail()}")
        time.sleep(poll_s)


class ChildGateway:
    """``python -m benchmarks.sim_server`` on a free loopback port, in its own process."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        from tests.conftest import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/responses"
        self._client: httpx.Client | None = None
        cmd = [sys.executable, "-m", "benchmarks.sim_server", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, start_new_session=True)
        wait_healthy(self.proc, self.url, what="sim_server", path="/readyz", timeout_s=120, poll_s=0.1)

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def rss(self) -> int:
        return proc_rss_bytes(self.proc.pid)

    def metrics_text(self) -> str:
        # one kept-alive client: a fresh httpx.get costs ~35 ms (client and SSL context set-up)
        if self._client is None:
            self._client = httpx.Client(timeout=30)
        return self._client.get(self.url + "/metrics").text

    def metric_value(self, name: str, labels: str = "") -> float:
        return metric_value(self.metrics_text(), name, labels)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)

    def __enter__(self) -> ChildGateway:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def plt():
    """matplotlib's pyplot on the file-only backend (the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def metric_value(text: str, name: str, labels: str = "") -> float:
    """One sample from Prometheus text (``labels`` as written, e.g. ``{mode="append"}``)."""
    want = name + labels
    total = 0.0
    for line in text.splitlines():
        if line.startswith(want + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
