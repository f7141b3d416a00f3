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

from collections import OrderedDict

from cache.response_state import ResponseState

DEFAULT_LANE = ""


class ConnectionCache:
    def __init__(self, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._lanes: OrderedDict[str, ResponseState] = OrderedDict()
        self._by_id: dict[str, str] = {}
        self._bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lanes)

    @property
    def nbytes(self) -> int:
        """Sum of the lanes' context sizes (lanes sharing a buffer count it each: conservative)."""
        return self._bytes

    def get(self, response_id: str) -> ResponseState | None:
        lane = self._by_id.get(response_id)
        if lane is None:
            return None
        self._lanes.move_to_end(lane)
        return self._lanes[lane]

    def lane_of(self, response_id: str) -> str | None:
        return self._by_id.get(response_id)

    def states(self) -> list[ResponseState]:
        """Each lane's latest response, least recently used first (what a closing connection may
        leave resumable, ``gateway.transport.resumable``)."""
        return list(self._lanes.values())

    def put(self, lane: str, state: ResponseState) -> None:
        old = self._lanes.pop(lane, None)
        if old is not None:
            self._by_id.pop(old.id, None)
            self._bytes -= _size(old)
        self._lanes[lane] = state
        self._by_id[state.id] = lane
        self._bytes += _size(state)
        self._enforce_budget(keep=lane)

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
        state = self._lanes.pop(lane, None)
        if state is not None:
            self._bytes -= _size(state)
        self.evictions += 1
        return True

    def clear(self) -> None:
        self._lanes.clear()
        self._by_id.clear()
        self._bytes = 0

    def _enforce_budget(self, keep: str) -> None:
        while self._bytes > self.max_bytes and len(self._lanes) > 1:
            lane, state = next(iter(self._lanes.items()))
            if lane == keep:
                self._lanes.move_to_end(lane)
                continue
            self._lanes.pop(lane)
            self._by_id.pop(state.id, None)
            self.evictions += 1
            self._bytes -= _size(state)


def _size(state: ResponseState) -> int:
    # The whole context a lane keeps alive: cumulative size is tracked on the snapshot.
    return state.nbytes
