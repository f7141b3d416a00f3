"""The response store: where ``store=true`` responses live for HTTP retrieval and chaining.

One protocol, several implementations (memory now; Redis shares state between replicas). The
memory store is bounded in bytes and entries expire after a TTL, so a long-running single-host
gateway cannot grow without limit (vLLM's own ``store`` keeps unbounded process-local dicts).
Tenancy: every entry records the tenant that created it and reads from another tenant miss.

**Each tenant its share.** The memory store is a :class:`~cache.lru.BoundedLRU` keyed by
``(tenant, response id)`` with the tenant as its part: once the store is full, a tenant that
stores more than its share (a quarter of the entries or of the bytes) evicts its own responses,
never those of a tenant within its share (alone it still has the whole store). A record is charged
what it really holds (:func:`record_bytes`: the Response object with its metadata, the input
items, its own items and tokens, the item-id index entries, the containers), so the byte bound is
one on memory; a record above its tenant's share of the bytes is not kept (counted in ``refused``).

**Items by id.** Clients that keep the conversation themselves but let the server store it (the
AI SDK's default ``store: true``) send earlier output items back as bare references
(``{"type": "item_reference", "id": "rs_…"}``) without ``previous_response_id``. Every store keeps
an index from an item id to the stored response that first held it (its input or output), so
resolving a reference is one lookup, never a scan; the index is per tenant, so another tenant's
id is indistinguishable from a missing one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cache.footprint import INDEX_ENTRY, RECORD_OVERHEAD, deep_size
from cache.lru import BoundedLRU, TenantShared, tenant_of
from cache.response_state import ResponseState


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


def record_bytes(state: ResponseState, index_entries: int) -> int:
    """What a stored record costs this process (module docstring): its own items and tokens
    (``delta_bytes``), the Response object and input items as held (walked), its index entries and
    the containers around it. Conservative: what the walk and ``delta_bytes`` both see counts twice."""
    return (
        max(state.delta_bytes, 0)
        + deep_size(state.response)
        + deep_size(state.input_items)
        + RECORD_OVERHEAD
        + INDEX_ENTRY * index_entries
    )


Key = tuple[str | None, str]  # (tenant, response id)


class MemoryStore(TenantShared):
    """LRU + TTL store bounded in entries and in the bytes each record holds, each tenant held to its
    share of both (module docstring). Expiry is checked on each read, and the least recently used
    records are swept when expired on each write."""

    shared = False  # process-local: this process's own pending-write wait covers chaining

    def __init__(
        self, max_bytes: int = 1024 * 1024 * 1024, ttl_s: float = 24 * 3600.0, max_entries: int = 1_000_000
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._lru: BoundedLRU[Key, tuple[float, ResponseState]] = BoundedLRU(
            max_entries, max_bytes, part=tenant_of, on_evict=self._evicted
        )
        #: (tenant, item id) -> where the response that first held it keeps it; each response's keys
        self._items: dict[tuple[str | None, str], Home] = {}
        self._owned: dict[Key, list[tuple[str | None, str]]] = {}
        #: records not kept because they alone were above their tenant's share of the bytes
        self.refused = 0

    async def get(self, response_id: str, tenant: str | None = None) -> ResponseState | None:
        key = (tenant, response_id)
        entry = self._lru.peek(key)
        if entry is None:
            return None
        expires, state = entry
        if expires < time.monotonic():
            self._drop(key)
            return None
        self._lru.get(key)  # a use: now the most recently used
        return state

    async def put(self, state: ResponseState) -> None:
        """Store ``state``, replacing the record under its id only once the new one is kept: a record
        refused (above its tenant's share) leaves the one stored before — and its index entries —
        as they were (a background response stored when queued, then re-stored when done, stays
        retrievable)."""
        key = (state.tenant, state.id)
        self._sweep()
        # the index entries the record would own: keys nobody holds, and those its own earlier
        # record holds (the same tenant and id: they move to where this record keeps the item)
        index: dict[tuple[str | None, str], Home] = {}
        for item_key, side, pos in index_keys(state):
            ikey = (state.tenant, item_key)
            if ikey not in index and ((home := self._items.get(ikey)) is None or home[0] == state.id):
                index[ikey] = (state.id, side, pos)
        if not self._lru.put(key, (time.monotonic() + self.ttl_s, state), record_bytes(state, len(index))):
            self.refused += 1
            return
        if key not in self._lru:  # never (the newest is not evicted), but then _evicted tidied up
            return
        for ikey in self._owned.pop(key, ()):  # the replaced record's entries this one does not hold
            if ikey not in index and (home := self._items.get(ikey)) is not None and home[0] == state.id:
                del self._items[ikey]
        self._items.update(index)
        self._owned[key] = list(index)

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        return self._drop((tenant, response_id))

    async def items(self, item_ids: Sequence[str], tenant: str | None = None) -> dict[str, StoredItem]:
        found: dict[str, StoredItem] = {}
        for item_id in item_ids:
            home = self._items.get((tenant, item_id))
            state = await self.get(home[0], tenant) if home is not None else None
            if state is None or home is None:
                continue
            _, side, pos = home
            found[item_id] = StoredItem(
                state.id, state.input_items[pos] if side == "input" else state.response["output"][pos]
            )
        return found

    async def close(self) -> None:
        while (oldest := self._lru.oldest()) is not None:
            self._drop(oldest[0])
        self._items.clear()
        self._owned.clear()

    def _sweep(self) -> None:
        """Drop expired records from the least recently used end (a write's bounded housekeeping)."""
        now = time.monotonic()
        for key, _ in self._lru.sweep(lambda entry: entry[0] < now):
            self._unindex(key)

    def _drop(self, key: Key) -> bool:
        if self._lru.pop(key) is None:
            return False
        self._unindex(key)
        return True

    def _evicted(self, key: Key, _value: object) -> None:
        self._unindex(key)

    def _unindex(self, key: Key) -> None:
        response_id = key[1]
        for ikey in self._owned.pop(key, ()):
            home = self._items.get(ikey)
            if home is not None and home[0] == response_id:
                del self._items[ikey]
