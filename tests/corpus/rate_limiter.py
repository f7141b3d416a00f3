"""A token bucket rate limiter for the public API gateway.

Each API key owns a bucket holding up to ``capacity`` tokens. A request takes one token; tokens
come back at ``refill_per_second``. When the bucket is empty the request is rejected with
``RATE_LIMIT_EXCEEDED`` and a ``Retry-After`` hint instead of being queued, so a burst from one
client cannot delay the others.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

RATE_LIMIT_EXCEEDED = "RATE_LIMIT_EXCEEDED"


@dataclass
class TokenBucket:
    capacity: float
    refill_per_second: float
    tokens: float = field(init=False)
    updated: float = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.tokens = self.capacity
        self.updated = time.monotonic()

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.capacity, self.tokens + elapsed * self.refill_per_second)
        self.updated = now

    def try_acquire(self, cost: float = 1.0) -> tuple[bool, float]:
        """Take ``cost`` tokens if there are enough.

        Returns (allowed, retry_after_seconds). When refused, retry_after_seconds is how long
        until enough tokens will have come back.
        """
        with self.lock:
            now = time.monotonic()
            self._refill(now)
            if self.tokens >= cost:
                self.tokens -= cost
                return True, 0.0
            missing = cost - self.tokens
            return False, missing / self.refill_per_second


class KeyedLimiter:
    """One bucket per API key, created on first use and forgotten after ``idle_seconds``."""

    def __init__(self, capacity: float, refill_per_second: float, idle_seconds: float = 600.0) -> None:
        self.capacity = capacity
        self.refill_per_second = refill_per_second
        self.idle_seconds = idle_seconds
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def check(self, api_key: str) -> dict[str, object]:
        with self._lock:
            bucket = self._buckets.get(api_key)
            if bucket is None:
                bucket = self._buckets[api_key] = TokenBucket(self.capacity, self.refill_per_second)
        allowed, retry_after = bucket.try_acquire()
        if allowed:
            return {"allowed": True}
        return {"allowed": False, "error": RATE_LIMIT_EXCEEDED, "retry_after": round(retry_after, 3)}

    def sweep(self) -> int:
        """Drop buckets that have been full and unused for ``idle_seconds``; returns how many."""
        now = time.monotonic()
        with self._lock:
            stale = [k for k, b in self._buckets.items() if now - b.updated > self.idle_seconds]
            for key in stale:
                del self._buckets[key]
        return len(stale)
