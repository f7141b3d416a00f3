"""The Rust peer, vllm-project/agentic-api: its release binary from the PyPI wheel, run as a process.

agentic-api's wheel ships the compiled gateway (``agentic-server``) as a wheel *script*
(``agentic_api-<v>.data/scripts/agentic-server``) next to a small Python launcher. The benchmarks
need only the binary, and must not put another project into respgate's environment, so
:func:`install` never installs the wheel: it ``pip download``\\s the pinned wheel (``--only-binary``:
never a build, no Rust toolchain) into a cache folder outside the project and unpacks the one file.
A wheel already in that folder is used as it is, without the network.

What it is, as measured against (``agentic-server --help``, the wheel's README, its
ARCHITECTURE.md): a stateful Responses-API gateway (HTTP + SSE, and WebSocket ``/v1/responses``)
that owns conversation state — SQLite for ``store: true``, a per-connection session for
WebSocket ``store: false`` — and on every turn sends the whole conversation to an upstream's
stateless ``/v1/responses`` (vLLM's own, streamed), which tokenizes and generates. Flags used:
``--llm-api-base`` (the upstream; readiness is its ``GET /health``), ``--gateway-host``/``--gateway-port``,
``--db-url``, ``--max-request-body-size-bytes``.

:class:`AgenticServer` runs it in front of any upstream; :class:`StubUpstream` is the near-instant
upstream of :mod:`benchmarks.upstream_stub` in its own process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import wait_healthy

#: the one pin: the agentic-api release the benchmarks measure
AGENTIC_API_VERSION = "0.9.0"
BINARY = "agentic-server"


def cache_root() -> Path:
    """Where downloaded peers live: the user's cache, not the project or its environment."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "respgate-benchmarks"


def _wheel_member(version: str) -> str:
    return f"agentic_api-{version}.data/scripts/{BINARY}"


def find_wheel(folder: Path, version: str = AGENTIC_API_VERSION) -> Path | None:
    """A wheel of that version in ``folder`` that carries the binary (a ``pip download`` left it there)."""
    for wheel in sorted(folder.glob(f"agentic_api-{version}-*.whl")):
        try:
            with zipfile.ZipFile(wheel) as z:
                if _wheel_member(version) in z.namelist():
                    return wheel
        except zipfile.BadZipFile:
            continue
    return None


def pip_download(folder: Path, version: str = AGENTIC_API_VERSION) -> None:
    """``pip download`` of the pinned wheel for this platform, no dependencies, never a source build."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(folder),
        f"agentic-api=={version}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"pip download agentic-api=={version} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def binary_version(path: Path) -> str:
    done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    return (done.stdout or done.stderr).strip()


def install(
    cache: Path | None = None, version: str = AGENTIC_API_VERSION, download: Callable[[Path, str], None] = pip_download
) -> Path:
    """The path of the pinned ``agentic-server`` binary, unpacked from its wheel into ``cache``.

    Order: the unpacked binary if it is there and says it is that version; else a wheel already in
    ``cache``; else ``download`` (``pip download``) one into it. The binary must answer
    ``--version`` with the pinned version, so a stale or foreign file is never run.
    """
    folder = (cache or cache_root()) / f"agentic-api-{version}"
    target = folder / "bin" / BINARY
    want = f"{BINARY} {version}"
    if target.is_file() and os.access(target, os.X_OK) and binary_version(target) == want:
        return target
    wheel = find_wheel(folder, version)
    if wheel is None:
        download(folder, version)
        wheel = find_wheel(folder, version)
        if wheel is None:
            raise RuntimeError(f"no agentic-api {version} wheel with {BINARY} in {folder} after download")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as z, z.open(_wheel_member(version)) as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    partial.chmod(0o755)
    partial.replace(target)
    got = binary_version(target)
    if got != want:
        raise RuntimeError(f"{target} says {got!r}, expected {want!r}")
    return target


def _stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)


class StubUpstream:
    """:mod:`benchmarks.upstream_stub` on a free loopback port, in its own process."""

    def __init__(self, model: str) -> None:
        from tests.conftest import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.upstream_stub", "--port", str(self.port), "--model", model],
            cwd=root,
            start_new_session=True,
        )
        self._client = httpx.Client(base_url=self.url, timeout=30)
        wait_healthy(self.proc, self.url, what="upstream stub", timeout_s=60, poll_s=0.05)

    def stats(self) -> dict[str, Any]:
        return self._client.get("/stats").json()

    def close(self) -> None:
        self._client.close()
        _stop(self.proc)

    def __enter__(self) -> StubUpstream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AgenticServer:
    """``agentic-server`` in front of ``upstream`` (vLLM's server or the stub), on a free loopback port.

    Its own HOME, working folder and SQLite file under a temporary folder, so it reads no user
    configuration and leaves nothing behind; request bodies up to 64 MiB (respgate's benchmark
    setting), so a 128k-token history fits either way.
    """

    def __init__(
        self, binary: Path, upstream: str, *, log_path: Path | None = None, ready_timeout_s: float = 120
    ) -> None:
        from tests.conftest import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/responses"
        self.home = Path(tempfile.mkdtemp(prefix="agentic-peer-"))
        self.log_path = log_path or self.home / "agentic-server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIC_", "OPENAI_", "LLM_", "GATEWAY_"))}
        env.update(HOME=str(self.home))
        cmd = [
            str(binary),
            "--llm-api-base",
            upstream,
            "--gateway-host",
            "127.0.0.1",
            "--gateway-port",
            str(self.port),
            "--db-url",
            f"sqlite://{self.home / 'agentic.db'}?mode=rwc",
            "--max-request-body-size-bytes",
            str(64 * 1024 * 1024),
            "--llm-ready-interval-s",
            "1",
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=self.home, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_healthy(
                self.proc,
                self.url,
                what="agentic-server",
                path="/ready",
                timeout_s=ready_timeout_s,
                poll_s=0.1,
                log_path=self.log_path,
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        _stop(self.proc)
        self._log.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> AgenticServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
