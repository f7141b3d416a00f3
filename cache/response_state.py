"""A response's state as an immutable snapshot ("state is a value", DESIGN.md).

A continuation derives a new snapshot from its parent plus the delta; nothing is mutated, so the
connection cache, the store and a running turn can all hold the same object safely. Items and
token ids are append-only views (``cache.seq``), so deriving a child costs O(new input).

The cache layer stores token ids but knows nothing of renderers: ``prelude_key`` is an opaque
digest the renderer produced, compared for equality only.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from cache.item_log import ItemLog
from cache.seq import TokenSeq


class ResponseState(msgspec.Struct, frozen=True):
    id: str
    #: the final Response object as sent to the client (JSON-ready dict)
    response: dict[str, Any]
    #: this response's own input items (canonical dicts, with ids), for input_items listing
    input_items: tuple[dict[str, Any], ...]
    #: the whole conversation after this response: inherited context + input + output
    context: ItemLog
    #: rendered token ids of ``context`` (prompt tokens + the model's sampled tokens, verbatim)
    history_ids: TokenSeq
    model: str
    prelude_key: bytes
    store: bool
    parent_id: str | None = None
    #: the first response of the chain this one continues (None: this response is the root, or a
    #: record written before roots were kept). Engine requests of the chain are routed by it
    #: (``inference.engine.RequestRouting``), so every turn and fork of a chain lands on one pod.
    root_id: str | None = None
    #: tool calls of the context that have no output yet
    pending_calls: frozenset[str] = frozenset()
    #: MCP server labels whose tools the chain has listed (an ``mcp_list_tools`` item in its
    #: context): a continuation reuses the listing instead of reporting a new one
    mcp_listed: frozenset[str] = frozenset()
    #: this turn's non-allow classifier verdicts (the parent's stay on the parent: no copying)
    verdicts: tuple[Any, ...] = ()
    #: some item of the chain was flagged (inherited, so a flag is never re-derived from history)
    flagged: bool = False
    tenant: str | None = None
    #: approximate bytes of the whole context this snapshot keeps alive (parent's + its own)
    nbytes: int = 0
    #: approximate bytes this snapshot adds on top of its parent (its own items and tokens)
    delta_bytes: int = 0
    #: the prefix-cache digest of this turn's input (``gateway.turn.prefix``), which a chained child
    #: extends by this response's output and its own new items; process-local (never stored)
    prefix_digest: bytes | None = None
    created: float = msgspec.field(default_factory=time.time)

    @property
    def root(self) -> str:
        """The id of the chain's root response."""
        return self.root_id or self.id

    @property
    def status(self) -> str:
        return self.response.get("status", "completed")
