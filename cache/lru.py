"""A least-recently-used map bounded by entries and by bytes, for values built from request content.

Why one type: the gateway keeps several small caches of things a turn would otherwise rebuild
from what the client re-sends every turn (structured-output constraints, the echoed tool list) —
each keyed by a digest of that content, each charged by the bytes its value holds, each shared by
the event loop and the prepare pool's threads. The bounds are the defence: a client decides what
goes in, so the number of entries *and* their bytes are capped, and one value above a quarter of
the byte budget is never kept (it would evict the rest for one client's sake; it is rebuilt each
time instead). Two threads missing the same key both build it; the second put replaces the first
with an equal value.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Generic, Hashable, Iterator, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

__all__ = ["BoundedLRU"]


class BoundedLRU(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        #: bytes charged by the entries held
        self.nbytes = 0
        #: lookups that found their key / did not (tests, notes and metrics read them)
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, default: Any = None) -> Any:
        """The value under ``key`` (now the most recently used), or ``default`` (counted as a miss;
        pass a sentinel when None is a value worth keeping)."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                self.misses += 1
                return default
            self._entries.move_to_end(key)
            self.hits += 1
            return hit[0]

    def put(self, key: K, value: V, nbytes: int) -> bool:
        """Keep ``value`` charged ``nbytes``, evicting the least recently used beyond the bounds;
        False (nothing kept) when it alone is above a quarter of the byte budget."""
        if nbytes > self.max_bytes // 4:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            self._entries[key] = (value, nbytes)
            self.nbytes += nbytes
            while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
                _, (_, size) = self._entries.popitem(last=False)
                self.nbytes -= size
        return True

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held; neither a use (the order stays) nor a hit or a miss."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def values(self) -> Iterator[V]:
        """The values held, least recently used first (a snapshot)."""
        with self._lock:
            return iter([v for v, _ in self._entries.values()])
