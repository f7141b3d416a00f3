"""Rejection logs that a flood cannot turn into a flood of log lines.

Why: a refused handshake, an oversized frame or a malformed body is the client's fault and may
come from an unauthenticated client in a loop. Logged at ERROR with a traceback each time, it
fills disks and buries real failures; not logged at all, operators cannot see an attack. So each
kind of rejection is logged at INFO/WARNING, without a traceback, at most ``burst`` times per
``period`` seconds; the rest are counted and the next line that gets through says how many were
left out. The counters in ``gateway/base/metrics.py`` still count every one.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable


class RateLimitedLog:
    """A per-key token bucket in front of a logger (``key`` is the kind of rejection, never a client value)."""

    __slots__ = ("_log", "_period", "_burst", "_clock", "_buckets")

    def __init__(self, logger: logging.Logger, *, period: float = 10.0, burst: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._period = period
        self._burst = burst
        self._clock = clock
        #: key -> [window start, lines logged in the window, lines suppressed since the last one logged]
        self._buckets: dict[str, list[float]] = {}

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False, **extra: Any) -> bool:
        """Log ``msg % args`` unless ``key`` has used up its lines for this window; True if logged.
        ``exc_info``: with the exception being handled (a fault a client can repeat, not a rejection)."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None or now - bucket[0] >= self._period:
            suppressed = int(bucket[2]) if bucket is not None else 0
            bucket = self._buckets[key] = [now, 0, suppressed]
        if bucket[1] >= self._burst:
            bucket[2] += 1
            return False
        bucket[1] += 1
        if bucket[2]:
            msg = f"{msg} ({int(bucket[2])} similar line(s) suppressed)"
            bucket[2] = 0
        self._log.log(level, msg, *args, exc_info=exc_info or None, extra=extra or None)
        return True

    def info(self, key: str, msg: str, *args: Any, **extra: Any) -> bool:
        return self.log(logging.INFO, key, msg, *args, **extra)

    def warning(self, key: str, msg: str, *args: Any, **extra: Any) -> bool:
        return self.log(logging.WARNING, key, msg, *args, **extra)
