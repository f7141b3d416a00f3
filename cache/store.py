"""The response store: where ``store=true`` responses live for HTTP retrieval and chaining.

One protocol, several implementations (memory now; Redis shares state between replicas). The
memory store is bounded in bytes and entries expire after a TTL, so a long-running single-host
gateway cannot grow without limit (vLLM's own ``store`` keeps unbounded process-local dicts).
Tenancy: every entry records the tenant that created it and reads from another tenant miss.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

from cache.state import ResponseState


class StoreUnavailable(Exception):
    """The store's backend cannot be reached (e.g. Redis is down).

    Distinct from "not found": the gateway answers it with a retryable 503 instead of telling the
    client its previous response does not exist (it may well exist once the backend is back).
    """


class ResponseStore(Protocol):
    #: other gateway processes read this store: a client may chain its next request through
    #: another replica, so an HTTP response must be written before the client sees it end
    shared: bool

    async def get(self, response_id: str, tenant: str | None = None) -> ResponseState | None: ...

    async def put(self, state: ResponseState) -> None: ...

    async def delete(self, response_id: str, tenant: str | None = None) -> bool: ...

    async def close(self) -> None: ...


class MemoryStore:
    """LRU + TTL store bounded by the bytes each snapshot adds (its own items and tokens)."""

    shared = False  # process-local: this process's own pending-write wait covers chaining

    def __init__(self, max_bytes: int = 1024 * 1024 * 1024, ttl_s: float = 24 * 3600.0) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, int, ResponseState]] = OrderedDict()
        self._bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    async def get(self, response_id: str, tenant: str | None = None) -> ResponseState | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        expires, _, state = entry
        if expires < time.monotonic():
            self._drop(response_id)
            return None
        if state.tenant != tenant:
            return None
        self._entries.move_to_end(response_id)
        return state

    async def put(self, state: ResponseState) -> None:
        if state.id in self._entries:
            self._drop(state.id)
        size = max(state.delta_bytes, 1)
        self._entries[state.id] = (time.monotonic() + self.ttl_s, size, state)
        self._bytes += size
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evictions += 1

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        entry = self._entries.get(response_id)
        if entry is None or entry[2].tenant != tenant:
            return False
        self._drop(response_id)
        return True

    async def close(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _drop(self, response_id: str) -> None:
        _, size, _ = self._entries.pop(response_id)
        self._bytes -= size

