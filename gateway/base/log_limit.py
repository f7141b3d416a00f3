"""Rejection and fault logs that a flood cannot turn into a flood of log lines.

Why: a refused handshake, an oversized frame or a malformed body is the client's fault and may
come from an unauthenticated client in a loop. Logged at ERROR with a traceback each time, it
fills disks and buries real failures; not logged at all, operators cannot see an attack. So each
kind of rejection is logged at INFO/WARNING, without a traceback, at most ``burst`` times per
``period`` seconds; the rest are counted and the next line that gets through says how many were
left out. The counters in ``gateway/base/metrics.py`` still count every one.

Unexpected exceptions get the same treatment (:class:`FaultLogLimit`): a fault a client can
trigger it can trigger a thousand times (issue 28: 1,000 requests made 19,000 traceback lines).
Each one is logged with its traceback, but at most ``burst`` times per ``period`` for the same
exception type at the same place in the code; the first line after a pause says how many were
left out. It sits on the process's log handler (``gateway.ops.logging_setup``), so it covers every
site — the routes' 500s, WebSocket and background turns, the billing worker, uvicorn's own
"Exception in ASGI application" — without each having to opt in.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from cache.lru import BoundedLRU


class LineBudget:
    """A token bucket per key: ``burst`` lines per ``period`` seconds, the rest counted.

    At most ``max_keys`` keys are kept, in :class:`~cache.lru.BoundedLRU` (the least recently
    logged forgotten first): keys name places and kinds, never client values, so the cap is a
    guard, not a working limit.

    Thread-safe: a logging filter runs outside its handler's lock, on the event loop, the prepare
    pool's threads and the engine's, and an exception raised in a filter escapes from the
    ``log.error()`` that called it."""

    __slots__ = ("_period", "_burst", "_clock", "_max_keys", "_buckets", "_lock")

    def __init__(
        self, *, period: float = 10.0, burst: int = 5, clock: Callable[[], float] = time.monotonic, max_keys: int = 1024
    ) -> None:
        self._period = period
        self._burst = burst
        self._clock = clock
        self._max_keys = max_keys
        #: key -> [window start, lines let through in the window, lines suppressed since the last one]
        self._buckets: BoundedLRU[Hashable, list[float]] = BoundedLRU(max_keys, sys.maxsize)
        self._lock = threading.Lock()

    def take(self, key: Hashable) -> int | None:
        """None when ``key`` has used up its lines for this window (the line is counted as
        suppressed); else how many of its lines were suppressed since the last one let through."""
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None or now - bucket[0] >= self._period:
                suppressed = int(bucket[2]) if bucket is not None else 0
                bucket = [now, 0, suppressed]
                self._buckets.put(key, bucket)
            if bucket[1] >= self._burst:
                bucket[2] += 1
                return None
            bucket[1] += 1
            suppressed, bucket[2] = int(bucket[2]), 0
            return suppressed


def _suppressed_note(n: int) -> str:
    return f" ({n} similar line(s) suppressed)"


class RateLimitedLog:
    """A per-key token bucket in front of a logger (``key`` is the kind of rejection, never a client value)."""

    __slots__ = ("_log", "_budget")

    def __init__(
        self,
        logger: logging.Logger,
        *,
        period: float = 10.0,
        burst: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._budget = LineBudget(period=period, burst=burst, clock=clock)

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False, **extra: Any) -> bool:
        """Log ``msg % args`` unless ``key`` has used up its lines for this window; True if logged.
        ``exc_info``: with the exception being handled (a fault a client can repeat, not a rejection)."""
        suppressed = self._budget.take(key)
        if suppressed is None:
            return False
        if suppressed:
            msg += _suppressed_note(suppressed)
        self._log.log(level, msg, *args, exc_info=exc_info or None, extra=extra or None)
        return True

    def info(self, key: str, msg: str, *args: Any, **extra: Any) -> bool:
        return self.log(logging.INFO, key, msg, *args, **extra)

    def warning(self, key: str, msg: str, *args: Any, **extra: Any) -> bool:
        return self.log(logging.WARNING, key, msg, *args, **extra)


class FaultLogLimit(logging.Filter):
    """A handler filter: records of faults — ERROR and above, and any record with a traceback —
    rate-limited per place and kind: the logger, the file and line that logged it, the message's
    template, and the exception's type. Other records pass untouched.

    The first record let through after some were dropped says how many (its message gains
    ``(N similar line(s) suppressed)``). One instance per handler: each judges what it sees."""

    def __init__(self, *, period: float = 10.0, burst: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.budget = LineBudget(period=period, burst=burst, clock=clock)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        if record.levelno < logging.ERROR and exc is None:
            return True
        # the template (``msg`` before its arguments: code, not client values) tells apart the
        # callers of one shared helper that logs for them (``http_routes._fault``)
        template = record.msg if isinstance(record.msg, str) else None
        key = (record.name, record.pathname, record.lineno, template, type(exc).__qualname__ if exc else None)
        suppressed = self.budget.take(key)
        if suppressed is None:
            return False
        if suppressed:
            record.msg = str(record.msg) + _suppressed_note(suppressed)
        return True
