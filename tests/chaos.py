"""A live gateway in its own process for the hostile-input ("chaos") tests, with memory and stall probes.

Why a child process: a case's bound is on the *gateway's* memory and its event loop, and the
in-process fixtures share both with the test's own clients. ``ChaosGateway`` runs ``python -m
gateway serve --engine simulated`` on loopback with ``RESPGATE_*`` settings and offers:

* :meth:`ChaosGateway.rss_peak` — the child's peak resident set while a block runs. Linux keeps a
  high-water mark (``VmHWM``) that writing ``5`` to ``/proc/PID/clear_refs`` resets; where that is not
  permitted, a 5 ms sampler of ``VmRSS`` stands in (it can miss a spike shorter than its period, so
  the hostile loops below hold their load for longer than that).
* :meth:`ChaosGateway.healthz_stall` — the worst ``/healthz`` latency seen while a block runs (the
  event loop's fairness, measured from outside; a figure for the note, never a timed assertion).

Every bound asserted with these is memory or correctness, not time (tests/README: no timed assertions).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import free_port, terminate, wait_until_ready

REPO = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@dataclass
class Peak:
    """Filled in when the ``rss_peak`` block ends."""

    before: int = 0  # bytes resident when the block began
    peak: int = 0  # the highest resident set seen during the block
    method: str = ""  # "hwm" (kernel high-water mark) or "sampled"

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.before)

    def __str__(self) -> str:
        return f"RSS {self.before / MiB:.0f} -> peak {self.peak / MiB:.0f} MiB ({self.method})"


@dataclass
class Stall:
    worst: float = 0.0
    samples: int = 0
    failures: int = 0


@dataclass
class ChaosGateway:
    settings: dict[str, Any] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, log_dir: Path) -> ChaosGateway:
        self.port = free_port()
        env = {**os.environ, "RESPGATE_LOG_LEVEL": "info"}
        env.pop("RESPGATE_REDIS_URL", None)
        env.pop("REDIS_URL", None)
        # keyless whatever an earlier test left in the shared keys file (its own, absent, file)
        env["RESPGATE_KEYS_FILE"] = str(log_dir / f"keys-{self.port}.json")
        for name, value in self.settings.items():
            env[f"RESPGATE_{name.upper()}"] = str(value)
        self.log_path = log_dir / f"gateway-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway",
                    "serve",
                    "--engine",
                    "simulated",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    *self.extra_args,
                ],
                env=env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until_ready(self.proc, self.port, self.log_path, timeout=90)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            terminate(self.proc, timeout=30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def rss(self) -> int:
        return _status_kib(self.pid, "VmRSS") * 1024

    @contextlib.contextmanager
    def rss_peak(self) -> Iterator[Peak]:
        result = Peak(before=self.rss())
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            result.method = "hwm"
        except OSError:
            result.method = "sampled"
        stop = threading.Event()
        seen = [result.before]

        def sample() -> None:
            while not stop.wait(0.005):
                with contextlib.suppress(OSError, KeyError):
                    seen.append(self.rss())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield result
        finally:
            stop.set()
            sampler.join()
            peak = max(seen)
            if result.method == "hwm":
                with contextlib.suppress(OSError, KeyError):
                    peak = max(peak, _status_kib(self.pid, "VmHWM") * 1024)
            result.peak = peak

    @contextlib.contextmanager
    def healthz_stall(self, period: float = 0.02) -> Iterator[Stall]:
        """Probe ``/healthz`` every ``period`` seconds from a thread; record the worst latency."""
        result = Stall()
        stop = threading.Event()

        def probe() -> None:
            with httpx.Client(timeout=60) as client:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    try:
                        client.get(self.url + "/healthz")
                    except httpx.HTTPError:
                        result.failures += 1
                    result.worst = max(result.worst, time.perf_counter() - t0)
                    result.samples += 1
                    stop.wait(period)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        try:
            yield result
        finally:
            stop.set()
            prober.join()


@contextlib.contextmanager
def chaos_gateway(tmp_path: Path, **settings: Any) -> Iterator[ChaosGateway]:
    gw = ChaosGateway(settings=settings).start(tmp_path)
    try:
        yield gw
    finally:
        gw.stop()
