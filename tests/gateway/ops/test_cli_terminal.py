"""``respgate serve`` and ``check`` as a person at a terminal sees them (issue 28, item 4).

On a terminal the gateway's output is plain lines: where its log is, a banner when it is ready
(the base URL with ``/v1``, the served model names, the auth mode), respgate's own warnings; the
JSON log lines, the engine's warnings and progress bars go to the log file instead. Not on a
terminal nothing changes but the banner, which is one more JSON log line.

The terminal is a real pseudo-terminal (:mod:`pty`): the command runs as it does in a shell, with
its stdin, stdout and stderr on the terminal, and Ctrl-C is the terminal's interrupt character.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.conftest import free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[3]
BANNER = re.compile(
    r"^respgate ready: http://127\.0\.0\.1:(\d+)/v1  model (\S+)( \(simulated engine\))?  "
    r"auth: (open \(no key\)|API key required)  — Ctrl-C to stop$"
)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """A command on a pseudo-terminal; what it wrote there, read by a thread (so it never blocks)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path = REPO) -> None:
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            args,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            start_new_session=True,
            # a shell gives its foreground job Ctrl-C's default disposition: the suite itself may run
            # with SIGINT ignored (started in the background by a script), which a child inherits
            preexec_fn=_default_sigint,
        )
        os.close(slave)
        self._master = master
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            self._chunks.append(data)

    @property
    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace").replace("\r\n", "\n")

    @property
    def lines(self) -> list[str]:
        """The lines as the terminal shows them (a carriage return starts the line over)."""
        shown = (x.split("\r")[-1] for x in self.text.split("\n"))
        return [x for x in shown if x.strip()]

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.text, re.M)
            if match:
                return match
            assert self.proc.poll() is None or time.monotonic() < deadline, self.text[-3000:]
            assert time.monotonic() < deadline, f"no {pattern!r} on the terminal:\n{self.text[-3000:]}"
            time.sleep(0.1)

    def interrupt(self, timeout: float = 120) -> int:
        """Ctrl-C, as the terminal sends it: SIGINT to the foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        finally:
            self._reader.join(timeout=5)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._reader.join(timeout=5)
        os.close(self._master)


def serve_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPGATE_", "PYTHON"))}
    env.update(
        PYTHONPATH=str(REPO),
        HOME=str(home),
        RESPGATE_KEYS_FILE=str(home / "keys.json"),
        RESPGATE_USAGE_JOURNAL=str(home / "journal.jsonl"),
        TERM="xterm",
        **extra,
    )
    return env


def assert_quiet(lines: list[str]) -> None:
    """No log line, engine warning or progress bar among what the terminal shows."""
    for line in lines:
        assert not line.lstrip().startswith("{"), line  # a JSON log line
        assert not re.search(r"\b(INFO|WARNING|DEBUG)\b|Traceback|it/s\]|\d+%\|", line), line


def test_serve_on_a_terminal_shows_plain_lines_and_a_banner_and_logs_to_a_file(tmp_path):
    port = free_port()
    term = Terminal(
        [sys.executable, "-m", "gateway", "serve", "--engine", "simulated", "--port", str(port)], serve_env(tmp_path)
    )
    try:
        banner = term.wait_for(BANNER.pattern, 120)
        assert banner.group(1) == str(port) and banner.group(2) == "gpt-oss-sim" and banner.group(3)
        assert banner.group(4) == "open (no key)"
        # the banner's URL is the one a client needs: the SDK's base_url
        r = httpx.post(f"http://127.0.0.1:{port}/v1/responses", json={"model": banner.group(2), "input": "hi"})
        assert r.status_code == 200, r.text
        code = term.interrupt()
    finally:
        term.close()
    lines = term.lines
    assert code == 130, term.text
    log = tmp_path / ".cache" / "respgate" / "logs" / f"serve-{port}.log"
    assert lines[0] == f"respgate: starting the simulated engine; logs in {log}", lines
    assert BANNER.match(lines[1]), lines
    assert lines[2:] == ["respgate serve: stopped (Ctrl-C)"], lines
    assert_quiet(lines)
    records = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    messages = [r["message"] for r in records]
    assert "Application startup complete." in messages and "Application shutdown complete." in messages
    assert any(m.startswith("respgate ready: http://127.0.0.1:") for m in messages)
    assert "Traceback" not in log.read_text()


def test_serve_not_on_a_terminal_keeps_json_logs_with_the_banner_as_one_of_them(tmp_path):
    port = free_port()
    with open(tmp_path / "out.log", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--engine", "simulated", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=serve_env(tmp_path),
            cwd=REPO,
        )
        try:
            wait_until_ready(proc, port, tmp_path / "out.log", 120)
            deadline = time.monotonic() + 30
            while "respgate ready" not in (tmp_path / "out.log").read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    records = [json.loads(x) for x in (tmp_path / "out.log").read_text().splitlines()]  # every line is JSON
    ready = [r for r in records if r["message"].startswith("respgate ready:")]
    assert len(ready) == 1 and ready[0]["logger"] == "respgate" and ready[0]["level"] == "INFO", records
    assert f"http://127.0.0.1:{port}/v1" in ready[0]["message"] and "gpt-oss-sim" in ready[0]["message"]
    assert not (tmp_path / ".cache" / "respgate" / "logs").exists()  # no log file: stderr has it all


def test_the_banner_says_when_a_key_is_required_and_the_log_file_setting_keeps_logs_on_the_terminal(tmp_path):
    port = free_port()
    term = Terminal(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--engine",
            "simulated",
            "--port",
            str(port),
            "--api-key",
            "acme:sk-test-1234",
        ],
        serve_env(tmp_path, RESPGATE_LOG_FILE="-"),
    )
    try:
        banner = term.wait_for(BANNER.pattern, 120)
        assert banner.group(4) == "API key required"
        term.interrupt()
    finally:
        term.close()
    assert any(x.startswith("{") and "Application startup complete" in x for x in term.lines)  # logs stay here
    assert "sk-test-1234" not in term.text


def test_a_failed_start_on_a_terminal_says_why_in_one_line_and_where_the_log_is(tmp_path):
    """Start-up errors found after the logs moved to the file still reach the terminal."""
    port = free_port()
    models = tmp_path / "models.json"
    models.write_text(json.dumps([{"name": "a", "engine": "simulated"}, {"name": "a", "engine": "simulated"}]))
    term = Terminal(
        [sys.executable, "-m", "gateway", "serve", "--models-file", str(models), "--port", str(port)],
        serve_env(tmp_path),
    )
    try:
        code = term.proc.wait(timeout=120)
    finally:
        term.close()
    lines = term.lines
    log = tmp_path / ".cache" / "respgate" / "logs" / f"serve-{port}.log"
    assert code == 1 and len(lines) == 2, term.text
    assert lines[1] == (
        f"respgate serve: ValueError: {models}: model name 'a' is declared twice (traceback in {log})"
    ), lines
    assert "Traceback" in log.read_text()


def test_check_on_a_terminal_prints_its_report_there(tmp_path):
    term = Terminal([sys.executable, "-m", "gateway", "check", "--engine", "simulated"], serve_env(tmp_path))
    try:
        code = term.proc.wait(timeout=120)
    finally:
        term.close()
    lines = term.lines
    assert code == 0, term.text
    assert [x[:14] for x in lines if x.startswith("[")] == [
        "[ ok ] vocab  ",
        "[ ok ] models ",
        "[warn] redis  ",
        "[ ok ] journal",
        "[ ok ] engine ",
    ], lines
    assert lines[-1] == f"(the engine's own output is in {tmp_path}/.cache/respgate/logs/check.log)", lines
    assert_quiet(lines)


def test_a_repeated_error_reaches_the_terminal_a_few_times_a_window_not_once_each(tmp_path):
    """The console gets respgate's own errors as plain lines; one a client can repeat a thousand
    times must not flood the terminal any more than the log (issue 28 item 15)."""
    import io
    import logging

    from gateway.ops.logging_setup import Console, setup_logging

    screen, log_file = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", "text", stream=log_file, console=Console(screen, str(tmp_path / "serve.log")))
        for _ in range(1_000):
            logging.getLogger("gateway.transport.ws").error("turn failed: the same fault")
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    shown = [line for line in screen.getvalue().splitlines() if "turn failed" in line]
    assert 1 <= len(shown) <= 10, len(shown)
    assert len([line for line in log_file.getvalue().splitlines() if "turn failed" in line]) <= 10
