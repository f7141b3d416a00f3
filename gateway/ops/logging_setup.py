"""Structured logs: one JSON object per line, with the request and response ids of the turn.

Log collectors (Loki, CloudWatch, Elastic) index JSON fields without parsing rules, and an
operator chasing one bad turn filters by ``response_id`` across the gateway's and uvicorn's lines.
``log_format = "text"`` keeps a human-readable line for a terminal.

uvicorn is started with ``log_config=None`` so its loggers (``uvicorn.error``, ``uvicorn.access``)
propagate to the root handler configured here and come out in the same format.

vLLM configures its own ``vllm`` logger (a plain-text handler on stdout, ``propagate=False``) when
it is imported, in the gateway process and again in each engine-core and worker process it
starts. Its own means of changing that is ``VLLM_LOGGING_CONFIG_PATH``, a ``dictConfig`` JSON file
read in every one of those processes (they inherit the environment): :func:`setup_logging` writes
one that gives the ``vllm`` logger the handler built here, so a vLLM record is a line in the same
format as ours. An operator's own file (the variable already set) is left alone.

**On a terminal** the log is not what a person wants to read: JSON lines, a dozen engine warnings
and progress bars hide the one line that matters (where the gateway listens). So when stderr is
a terminal (or ``log_file`` names a file), :func:`divert_output` points this process's stdout and
stderr -- the file descriptors, which vLLM's engine processes inherit and where torch, transformers
and tqdm write -- at a log file (default ``<cache dir>/logs/<command>[-<port>].log``, the previous
run's kept as ``.1``), and keeps the terminal for a :class:`Console`: plain lines only -- what is
starting and where the log is, warnings and errors of respgate's own loggers (one line each, no
traceback), and the banner ``serve`` prints when ready. Nothing is lost: the file has every line,
in ``log_format``. Not on a terminal (containers, systemd, CI) nothing changes: every log line on
stderr, JSON by default, the banner one of them. ``log_file = "-"`` keeps the logs on stderr even on
a terminal.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
import tempfile
from typing import Any, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from gateway.base import log_context
from gateway.base.log_limit import FaultLogLimit

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s %(response_id)s] %(message)s"


class ContextFilter(logging.Filter):
    """Stamp every record with the current request and response ids (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = log_context.request_id.get()
        record.response_id = log_context.response_id.get()
        return True


def json_formatter() -> logging.Formatter:
    return JsonFormatter(
        "{asctime}{levelname}{name}{message}{request_id}{response_id}",
        style="{",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        timestamp=False,
        # uvicorn's terminal colouring and vLLM's process tag are not fields to index
        reserved_attrs=[*RESERVED_ATTRS, "color_message", "vllm_process_name"],
    )


def make_formatter(fmt: str = "json") -> logging.Formatter:
    """The formatter of ``log_format`` (also named by the vLLM logging config, so keep the name)."""
    return json_formatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def setup_logging(
    level: str = "info", fmt: str = "json", stream: TextIO | None = None, *, console: Console | None = None
) -> None:
    """Configure the root logger once for the process (``respgate serve``), and vLLM's. With a
    ``console`` that :func:`divert_output` made, respgate's own warnings and errors also reach the
    terminal, as plain lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    handler.addFilter(FaultLogLimit())  # tracebacks a client can repeat: a few per place and kind a window
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    if console is not None and console.diverted:
        terminal = TerminalHandler(console)
        terminal.addFilter(FaultLogLimit())  # the terminal is no place for a flood either
        root.addHandler(terminal)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    if root.level >= logging.INFO:  # a line per HTTP request (ours, the MCP SDK's: a session each)
        for name in ("httpx", "httpx2", "httpcore", "httpcore2", "mcp"):
            logging.getLogger(name).setLevel(logging.WARNING)
    route_vllm_logs(level, fmt, stream)


def vllm_logging_config(level: str, fmt: str) -> dict[str, Any]:
    """A ``dictConfig`` for vLLM's loggers: our formatter and context filter, on stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"respgate": {"()": f"{__name__}.make_formatter", "fmt": fmt}},
        "filters": {"context": {"()": f"{__name__}.ContextFilter"}},
        "handlers": {
            "respgate": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "respgate",
                "filters": ["context"],
            }
        },
        "loggers": {"vllm": {"handlers": ["respgate"], "level": level.upper(), "propagate": False}},
    }


def route_vllm_logs(level: str, fmt: str, stream: TextIO | None = None) -> str | None:
    """Point ``VLLM_LOGGING_CONFIG_PATH`` at :func:`vllm_logging_config` (unless the operator set
    it, or turned vLLM's logging configuration off) and apply it here if vLLM is already loaded."""
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH") or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return None
    config = vllm_logging_config(level, fmt)
    path = _write_config(config, f"vllm-logging-{fmt}-{level.lower()}.json")
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path
    if "vllm.logger" in sys.modules:  # imported before us (tests, an embedding application)
        if stream is not None:
            config["handlers"]["respgate"]["stream"] = stream
        logging.config.dictConfig(config)
    return path


def _write_config(config: dict[str, Any], name: str) -> str:
    """The config file, in respgate's cache folder (the user's own: a file another user could plant
    in a shared temp folder would be code vLLM runs), rewritten atomically at each start so no file
    per process is left behind; a private temp file where the cache folder is not writable."""
    from gateway.base.settings import default_cache_path

    path = default_cache_path(name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=os.path.dirname(path))
    except OSError:
        fd, tmp = tempfile.mkstemp(prefix="respgate-vllm-logging-", suffix=".json")
        path = tmp
    with os.fdopen(fd, "w") as f:
        json.dump(config, f)
    if tmp != path:
        os.replace(tmp, path)
    return path


# -- the terminal ---------------------------------------------------------------------------------------

#: the loggers whose warnings and errors a person at the terminal sees: respgate's own
OWN_LOGGERS = ("gateway", "inference", "cache", "security", "billing", "respgate")


class Console:
    """Where plain lines for a person go, and the log file that has everything else (None: the
    logs are on stderr, and so are these lines)."""

    def __init__(self, stream: TextIO, log_path: str | None = None, out: TextIO | None = None) -> None:
        self.stream = stream
        self.log_path = log_path
        #: a command's own output (``check``'s report): stdout as it was before the diversion
        self.out = out or sys.stdout
        #: the last error any logger wrote (``Type: message``), for the line a failed start ends with
        self.last_error: str | None = None

    @property
    def diverted(self) -> bool:
        return self.log_path is not None

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


class TerminalHandler(logging.Handler):
    """respgate's own warnings and errors as one plain line each on the console (a traceback stays
    in the log file); remembers the last error of any logger."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else ""
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                message = f"{message}: {type(exc).__name__}: {exc}".strip(": ")
            if record.levelno >= logging.ERROR:
                self.console.last_error = message
            if record.name.split(".", 1)[0] in OWN_LOGGERS:
                self.console.say(f"respgate {record.levelname.lower()}: {message}")
        except Exception:  # a log line must never take the server down
            self.handleError(record)


_console: Console | None = None


def console() -> Console:
    """The console of this process: the terminal kept by :func:`divert_output`, else stderr."""
    return _console if _console is not None else Console(sys.stderr)


def log_file_path(setting: str | None, name: str, cache_dir: str | None = None) -> str | None:
    """Where the logs of command ``name`` go instead of stderr: ``setting`` when it names a file;
    none for ``-``; unset, ``<cache dir>/logs/<name>.log`` when stderr is a terminal, else none."""
    if setting == "-":
        return None
    if setting:
        return os.path.expanduser(setting)
    if not os.isatty(2):
        return None
    from gateway.base.settings import default_cache_path

    root = os.path.expanduser(cache_dir) if cache_dir else default_cache_path("")
    return os.path.join(root, "logs", f"{name}.log")


def divert_output(path: str) -> Console:
    """Point file descriptors 1 and 2 at the log file ``path`` (the previous one kept as ``.1``)
    and return the console: the terminal (or whatever stderr was), kept on a duplicate descriptor.

    The descriptors, not ``sys.stderr``: vLLM's engine processes inherit them, and C extensions,
    ``warnings`` and tqdm write to them directly. A stdout that is not a terminal (piped to a
    program) is left alone."""
    global _console
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        os.replace(path, path + ".1")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    terminal = os.dup(2)
    out = os.dup(1) if os.isatty(1) else None
    os.dup2(fd, 2)
    if out is not None:
        os.dup2(fd, 1)
    os.close(fd)

    def reopen(descriptor: int) -> TextIO:
        return os.fdopen(descriptor, "w", buffering=1, encoding="utf-8", errors="replace")

    _console = Console(reopen(terminal), path, reopen(out) if out is not None else sys.stdout)
    return _console
