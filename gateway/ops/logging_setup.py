"""Structured logs: one JSON object per line, with the request and response ids of the turn.

Log collectors (Loki, CloudWatch, Elastic) index JSON fields without parsing rules, and an
operator chasing one bad turn filters by ``response_id`` across the gateway's and uvicorn's lines.
``log_format = "text"`` keeps a human-readable line for a terminal.

uvicorn is started with ``log_config=None`` so its loggers (``uvicorn.error``, ``uvicorn.access``)
propagate to the root handler configured here and come out in the same format.
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

from gateway.base import log_context


class ContextFilter(logging.Filter):
    """Stamp every record with the current request and response ids (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = log_context.request_id.get()
        record.response_id = log_context.response_id.get()
        return True


def json_formatter() -> logging.Formatter:
    return JsonFormatter("{asctime}{levelname}{name}{message}{request_id}{response_id}", style="{",
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                         timestamp=False)


def setup_logging(level: str = "info", fmt: str = "json", stream=None) -> None:
    """Configure the root logger once for the process (``respgate serve``)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    if fmt == "json":
        handler.setFormatter(json_formatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(request_id)s %(response_id)s] %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
