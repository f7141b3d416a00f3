"""One turn's data as it moves through the pipeline: who asks, what was rendered, what runs.

A prepared turn holds the rendered *delta* (``new_ids``) next to the parent's token view
(``base_ids``) instead of an already-extended sequence: the shared append-only buffer is only
touched when the turn actually runs, so a request that is rejected (or only counted, as by
``/responses/input_tokens``) never leaves the parent's buffer past its tip — which would make the
parent's next continuation copy the whole history.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping

from cache.items import ItemLog
from cache.seq import TokenSeq
from cache.state import ResponseState
from gateway.wire.request import CreateRequest
from inference.engine import SamplingParams
from inference.registry import ModelRoute
from inference.render import Prelude
from security.classify import Verdict

Transport = Literal["http", "ws"]


@dataclass(slots=True)
class TurnContext:
    """Who is asking and where the answer goes; transports fill it in."""

    transport: Transport
    tenant: str | None = None
    conn_cache: Any = None  # cache.connection.ConnectionCache on WebSocket turns
    lane: str = ""
    #: called once with the turn's usage object when it finishes (rate-limit token reconciliation)
    on_usage: Any = None


@dataclass(slots=True)
class RenderStats:
    mode: Literal["append", "full"]
    new_tokens: int
    fallback_reason: str | None = None
    truncated_items: int = 0


@dataclass(slots=True)
class PreparedTurn:
    req: CreateRequest
    ctx: TurnContext
    route: ModelRoute
    response: dict[str, Any]
    prelude: Prelude
    prelude_key: bytes
    new_items: list[dict[str, Any]]
    parent: ResponseState | None
    base_context: ItemLog
    #: the parent's rendered history when appending; None for a full render
    base_ids: TokenSeq | None
    #: tokens rendered for this turn (the new items; or prelude + whole context on a full render)
    new_ids: list[int]
    #: the generation prompt (empty for a ``generate: false`` warm-up)
    gen_ids: list[int]
    sampling: SamplingParams | None
    pending_calls: frozenset[str]
    verdicts: tuple[Verdict, ...]
    flagged: bool
    render: RenderStats
    generate: bool
    store: bool
    include_encrypted: bool
    #: perf_counter when the request arrived (the pipeline passes its own start)
    started: float = field(default_factory=time.perf_counter)
    #: wall clock at arrival, and perf_counter of the first output token (billing: created_at, ttft)
    created_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    #: a ``compaction_trigger`` input item asked for compaction (``gateway.turn.compaction``)
    compact_trigger: bool = False
    #: after a compaction: the pruned context the response's state continues from
    compacted_context: ItemLog | None = None

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def prompt_len(self) -> int:
        base = len(self.base_ids) if self.base_ids is not None else 0
        return base + len(self.new_ids) + len(self.gen_ids)


class CallLookup(Mapping[str, Mapping[str, Any]]):
    """call_id -> call item over the chain's context and this turn's new items, without copying.

    Lookup-only: iteration covers the new calls alone (renderers only ever ``get``).
    """

    def __init__(self, context: ItemLog, new_calls: dict[str, dict[str, Any]]) -> None:
        self._context = context
        self._new = new_calls

    def __getitem__(self, call_id: str) -> Mapping[str, Any]:
        item = self._new.get(call_id) or self._context.call(call_id)
        if item is None:
            raise KeyError(call_id)
        return item

    def __iter__(self) -> Iterator[str]:
        return iter(self._new)

    def __len__(self) -> int:
        return len(self._new)
