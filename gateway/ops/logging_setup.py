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
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
import tempfile
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from gateway.base import log_context

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s %(response_id)s] %(message)s"


class ContextFilter(logging.Filter):
    """Stamp every record with the current request and response ids (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = log_context.request_id.get()
        record.response_id = log_context.response_id.get()
        return True


def json_formatter() -> logging.Formatter:
    return JsonFormatter("{asctime}{levelname}{name}{message}{request_id}{response_id}", style="{",
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                         timestamp=False,
                         # uvicorn's terminal colouring and vLLM's process tag are not fields to index
                         reserved_attrs=[*RESERVED_ATTRS, "color_message", "vllm_process_name"])


def make_formatter(fmt: str = "json") -> logging.Formatter:
    """The formatter of ``log_format`` (also named by the vLLM logging config, so keep the name)."""
    return json_formatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def setup_logging(level: str = "info", fmt: str = "json", stream=None) -> None:
    """Configure the root logger once for the process (``respgate serve``), and vLLM's."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    if root.level >= logging.INFO:  # a line per HTTP request of the Hub client and our own clients
        for name in ("httpx", "httpx2", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
    route_vllm_logs(level, fmt, stream)


def vllm_logging_config(level: str, fmt: str) -> dict[str, Any]:
    """A ``dictConfig`` for vLLM's loggers: our formatter and context filter, on stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"respgate": {"()": f"{__name__}.make_formatter", "fmt": fmt}},
        "filters": {"context": {"()": f"{__name__}.ContextFilter"}},
        "handlers": {"respgate": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                  "formatter": "respgate", "filters": ["context"]}},
        "loggers": {"vllm": {"handlers": ["respgate"], "level": level.upper(), "propagate": False}},
    }


def route_vllm_logs(level: str, fmt: str, stream=None) -> str | None:
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
