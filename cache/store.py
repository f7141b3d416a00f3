"""The response store: where ``store=true`` responses live for HTTP retrieval and chaining.

One protocol, several implementations (memory now; Redis shares state between replicas). The
memory store is bounded in bytes and entries expire after a TTL, so a long-running single-host
gateway cannot grow without limit (vLLM's own ``store`` keeps unbounded process-local dicts).
Tenancy: every entry records the tenant that created it and reads from another tenant miss.

**Items by id.** Clients that keep the conversation themselves but let the server store it (the
AI SDK's default ``store: true``) send earlier output items back as bare references
(``{"type": "item_reference", "id": "rs_…"}``) without ``previous_response_id``. Every store keeps
an index from an item id to the stored response that first held it (its input or output), so
resolving a reference is one lookup, never a scan; the index is per tenant, so another tenant's
id is indistinguishable from a missing one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

from cache.state import ResponseState


class StoreUnavailable(Exception):
    """The store's backend cannot be reached (e.g. Redis is down).

    Distinct from "not found": the gateway answers it with a retryable 503 instead of telling the
    client its previous response does not exist (it may well exist once the backend is back).
    """


@dataclass(frozen=True, slots=True)
class StoredItem:
    """An item of a stored response, found by its id."""

    #: the stored response that first held the item (its input or output)
    response_id: str
    item: dict[str, Any]


def own_items(state: ResponseState) -> Iterable[dict[str, Any]]:
    """The items a response brought into its conversation (input items, then output items)."""
    yield from state.input_items
    yield from state.response.get("output") or ()


def call_key(call_id: str) -> str:
    """The index key of a tool call this gateway issued (a response's output item with that
    ``call_id``): clients that re-send calls whole, without their ids, name them by it."""
    return "\0call:" + call_id


Home = tuple[str, str, int]  # (response id, "input" | "output", position there)


def index_keys(state: ResponseState) -> Iterable[tuple[str, str, int]]:
    """(key, "input" | "output", position) of what a store indexes: item ids, and the call ids of
    the response's output (the calls the gateway issued). The side says which of the response's
    lists holds the item, so a lookup reads that list only (an output is a handful of items; the
    input of a client that re-sends its history is the whole conversation)."""
    for pos, item in enumerate(state.input_items):
        if isinstance(item_id := item.get("id"), str):
            yield item_id, "input", pos
    for pos, item in enumerate(state.response.get("output") or ()):
        if isinstance(item_id := item.get("id"), str):
            yield item_id, "output", pos
        if isinstance(call_id := item.get("call_id"), str):
            yield call_key(call_id), "output", pos


class ResponseStore(Protocol):
    #: other gateway processes read this store: a client may chain its next request through
    #: another replica, so an HTTP response must be written before the client sees it end
    shared: bool

    async def get(self, response_id: str, tenant: str | None = None) -> ResponseState | None: ...

    async def put(self, state: ResponseState) -> None: ...

    async def delete(self, response_id: str, tenant: str | None = None) -> bool: ...

    async def items(self, item_ids: Sequence[str], tenant: str | None = None) -> dict[str, StoredItem]:
        """The stored items of ``tenant`` with these ids (missing ones are absent): one lookup each."""

    async def close(self) -> None: ...


class MemoryStore:
    """LRU + TTL store bounded by the bytes each snapshot adds (its own items and tokens)."""

    shared = False  # process-local: this process's own pending-write wait covers chaining

    def __init__(self, max_bytes: int = 1024 * 1024 * 1024, ttl_s: float = 24 * 3600.0) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, int, ResponseState]] = OrderedDict()
        #: (tenant, item id) -> where the response that first held it keeps it; each response's keys
        self._items: dict[tuple[str | None, str], Home] = {}
        self._owned: dict[str, list[tuple[str | None, str]]] = {}
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
        owned = []
        for item_key, side, pos in index_keys(state):
            if (key := (state.tenant, item_key)) not in self._items:
                self._items[key] = (state.id, side, pos)
                owned.append(key)
        self._owned[state.id] = owned
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

    async def items(self, item_ids: Sequence[str], tenant: str | None = None) -> dict[str, StoredItem]:
        found: dict[str, StoredItem] = {}
        for item_id in item_ids:
            home = self._items.get((tenant, item_id))
            state = await self.get(home[0], tenant) if home is not None else None
            if state is None or home is None:
                continue
            _, side, pos = home
            found[item_id] = StoredItem(state.id, state.input_items[pos] if side == "input"
                                        else state.response["output"][pos])
        return found

    async def close(self) -> None:
        self._entries.clear()
        self._items.clear()
        self._owned.clear()
        self._bytes = 0

    def _drop(self, response_id: str) -> None:
        _, size, _ = self._entries.pop(response_id)
        self._bytes -= size
        for key in self._owned.pop(response_id, ()):
            home = self._items.get(key)
            if home is not None and home[0] == response_id:
                del self._items[key]

