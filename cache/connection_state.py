"""Per-connection state cache: the latest response of each lane, bounded in bytes.

WebSocket mode keeps the previous turn's state in memory for the connection, which is what lets a
continuation with ``store=false`` work and lets it skip re-rendering the history. Rules (ws-mode
spec §5): each lane keeps its latest finished response, replaced when the next one on that lane
finishes; ``previous_response_id`` resolves against the latest response of *any* lane (cross-lane
references are forks); a failed same-lane continuation evicts its parent; closing the connection
discards everything. The byte bound protects the server from one connection holding many huge
lanes: when over budget, least recently used lanes are dropped first (never the one being written).
"""

from __future__ import annotations

import sys

from cache.lru import BoundedLRU, LRUOwner
from cache.response_state import ResponseState

DEFAULT_LANE = ""


class ConnectionCache(LRUOwner):
    """Lane -> its latest response, in a :class:`~cache.lru.BoundedLRU` bounded by bytes alone (a
    connection's lanes are few: ``gateway.transport.lanes`` bounds them). One connection is one
    tenant's, so the map has no parts. Every put is ``force``d: the lane being written is always
    kept, however large (it was already paid for), and the others make room."""

    def __init__(self, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        #: charged each lane's context size (lanes sharing a buffer count it each: conservative)
        self._lru: BoundedLRU[str, ResponseState] = BoundedLRU(sys.maxsize, max_bytes, on_evict=self._dropped)
        self._by_id: dict[str, str] = {}
        #: lanes dropped by :meth:`evict` (the byte bound's are the map's)
        self._evicted = 0

    @property
    def evictions(self) -> int:
        return self._lru.evictions + self._evicted

    def get(self, response_id: str) -> ResponseState | None:
        lane = self._by_id.get(response_id)
        if lane is None:
            return None
        state: ResponseState | None = self._lru.get(lane)
        return state

    def lane_of(self, response_id: str) -> str | None:
        return self._by_id.get(response_id)

    def states(self) -> list[ResponseState]:
        """Each lane's latest response, least recently used first (what a closing connection may
        leave resumable, ``gateway.sessions``)."""
        return list(self._lru.values())

    def put(self, lane: str, state: ResponseState) -> None:
        old = self._lru.peek(lane)  # put replaces it (no pop + put: one map operation per turn)
        if old is not None:
            self._by_id.pop(old.id, None)
        self._by_id[state.id] = lane
        self._lru.put(lane, state, _size(state), force=True)

    def discard_failed_parent(self, previous_response_id: str | None, lane: str) -> bool:
        """A continuation on ``lane`` failed: its parent is evicted if it is that lane's latest
        response (spec 5.4: the client must not chain from a state whose successor failed). A
        failed fork (a parent on another lane) leaves the parent alone."""
        if previous_response_id is None or self._by_id.get(previous_response_id) != lane:
            return False
        return self.evict(previous_response_id)

    def evict(self, response_id: str) -> bool:
        lane = self._by_id.pop(response_id, None)
        if lane is None:
            return False
        self._lru.pop(lane)
        self._evicted += 1
        return True

    def clear(self) -> None:
        self._lru.clear()
        self._by_id.clear()

    def _dropped(self, lane: str, state: ResponseState) -> None:
        """The byte bound dropped ``lane``: its response is no longer found by id."""
        if self._by_id.get(state.id) == lane:
            del self._by_id[state.id]


def _size(state: ResponseState) -> int:
    # The whole context a lane keeps alive: cumulative size is tracked on the snapshot.
    return state.nbytes
