"""What a kept record really costs in memory: the charge the stores' byte bounds count.

Why not the JSON size, or ``sys.getsizeof`` of the top object: a Python dict of short strings
costs several times its JSON (each ``str`` is ~50 bytes before its first character, each dict
~200), so a bound charged by JSON lets the process grow far past it — 20,000 empty conversations
with full metadata grew RSS by ~190 MiB under a 16 MiB bound. :func:`deep_size` walks the value
(dicts, lists, tuples, strings, numbers) and sums what each object occupies; an object reachable
twice is counted twice (a conservative estimate, never an under-count of what the walk sees).
The stores add a fixed overhead per record and per index entry (:data:`RECORD_OVERHEAD`,
:data:`INDEX_ENTRY`) for the containers that hold the record itself.

The walk is iterative (no recursion limit) and costs O(objects): what the store already paid to
receive and parse them.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["deep_size", "RECORD_OVERHEAD", "INDEX_ENTRY", "ITEM_OVERHEAD"]

#: the containers a store keeps per record beyond its value (the map's entry tuple and ordered-dict
#: node, the part's node, the id string, the record object, its expiry float)
RECORD_OVERHEAD = 1024
#: one entry of an index from a key to a record: the key tuple and its strings, the slot, the home tuple
INDEX_ENTRY = 320
#: one item of a conversation beyond the item itself: its sequence number in the order list, the
#: (item, size) tuple and dict slot by sequence, the id -> sequence slot
ITEM_OVERHEAD = 256

_getsizeof = sys.getsizeof


def deep_size(value: Any) -> int:
    """The bytes ``value`` and everything it holds occupy (JSON-like values; any other object is
    charged its own ``getsizeof``)."""
    total = 0
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        obj = pop()
        total += _getsizeof(obj)
        kind = type(obj)
        if kind is dict:
            for k, v in obj.items():
                push(k)
                push(v)
        elif kind is list or kind is tuple:
            extend(obj)
    return total
