"""The conversation's items as an append-only log with O(1) lookups by item id and call id.

Validation of a continuation needs two questions answered against the *whole* chain: "is this
item id already present?" (duplicates are a 400) and "which call does this tool output answer?"
(unknown call ids are a 400, and renderers need the call's tool name). Answering them by scanning
the history would make each turn O(history). The log keeps two dicts — item id -> position and
call id -> position — that are shared, like the item buffer, between all views of one buffer; an
entry is visible to a view when its position is below the view's length.

The call index holds the *first* item carrying each ``call_id``. That is the call: a tool output
only enters a conversation after its call (the gateway refuses an output whose call it has not
seen), so the log needs no list of which item types are calls — item kinds are the gateway's and
the renderers' vocabulary, not the cache's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cache.seq import AppendOnlyView

Item = dict[str, Any]


class ItemLog(AppendOnlyView[Item]):
    __slots__ = ("_ids", "_calls")

    def __init__(
        self,
        buf: list[Item] | None = None,
        n: int | None = None,
        ids: dict[str, int] | None = None,
        calls: dict[str, int] | None = None,
    ) -> None:
        super().__init__(buf, n)
        if ids is None or calls is None:
            ids, calls = {}, {}
            for pos, item in enumerate(self._buf[: self._n]):
                _index(item, pos, ids, calls)
        self._ids = ids
        self._calls = calls

    def has_id(self, item_id: str) -> bool:
        pos = self._ids.get(item_id)
        return pos is not None and pos < self._n

    def call(self, call_id: str) -> Item | None:
        """The tool call item with ``call_id`` in this view (the first item carrying it), if any."""
        pos = self._calls.get(call_id)
        if pos is None or pos >= self._n:
            return None
        return self._buf[pos]

    def get(self, item_id: str) -> Item | None:
        pos = self._ids.get(item_id)
        if pos is None or pos >= self._n:
            return None
        return self._buf[pos]

    def extend(self, new: Iterable[Item]) -> ItemLog:
        new = list(new)
        if len(self._buf) == self._n:
            buf, ids, calls = self._buf, self._ids, self._calls
        else:
            AppendOnlyView.copies += 1
            buf = self._buf[: self._n]
            ids, calls = {}, {}
            for pos, item in enumerate(buf):
                _index(item, pos, ids, calls)
        start = len(buf)
        buf.extend(new)
        for off, item in enumerate(new):
            _index(item, start + off, ids, calls)
        return ItemLog(buf, start + len(new), ids, calls)


def _index(item: Item, pos: int, ids: dict[str, int], calls: dict[str, int]) -> None:
    item_id = item.get("id")
    if item_id:
        ids.setdefault(item_id, pos)
    call_id = item.get("call_id")
    if call_id:
        calls.setdefault(call_id, pos)
