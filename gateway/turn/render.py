"""Render: a :class:`TurnInput` -> :class:`Rendered` token ids, appending to the parent's when exact.

A continuation appends the new items' tokens to the parent's rendered history (an append-only
view, no copy), so its cost is O(new input). When an append is not provably exact the turn renders
in full and says why (``RenderStats.fallback_reason``, counted in
``respgate_render_full_fallbacks``):

============== ===============================================================================
reason         why an append would not be token-exact
============== ===============================================================================
tokens_missing the parent came from a shared store written by a process that kept no tokens
prelude_changed instructions, tools, tool_choice or reasoning effort differ from the parent's
cut_off        the parent's output was cut off or failed: no exact rendering to append to
<renderer's>   the renderer knows its template joins items across the boundary
truncation     ``truncation: "auto"`` and the append does not fit: oldest items are dropped
============== ===============================================================================

Never extends a shared buffer: that happens when the turn runs (``gateway.turn.run``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator, Mapping, Sequence

from cache.items import ItemLog
from gateway.base.metrics import Metrics
from gateway.turn.types import Item, Rendered, RenderStats, TurnInput
from gateway.wire.errors import ApiError, bad_request
from gateway.wire.kinds import OUTPUT_TYPES
from inference.registry import ModelRoute
from inference.render import Prelude, Renderer

#: output tokens a prompt must leave room for (OpenAI's minimum max_output_tokens)
MIN_OUTPUT_ROOM = 16


def render(turn: TurnInput) -> Rendered:
    """The turn's prompt; request-shaped renderer errors (two tools whose flattened names collide,
    a tool output whose call the renderer cannot name) are a 400, not a crash."""
    try:
        return _render(turn, prelude_key(turn.route, turn.prelude))
    except ApiError:
        raise
    except ValueError as exc:
        raise bad_request(f"Invalid request for this model's prompt format: {exc}", code="invalid_value",
                          param="tools" if "tool" in type(exc).__name__.lower() else "input") from None


def observe(metrics: Metrics, rendered: Rendered) -> None:
    """Count what a render encoded, what it reused, and why it fell back (an accepted turn only)."""
    stats = rendered.stats
    metrics.render_tokens.labels(stats.mode).inc(stats.new_tokens)
    metrics.reused_tokens.inc(len(rendered.base_ids) if rendered.base_ids is not None else 0)
    if stats.fallback_reason:
        metrics.render_fallbacks.labels(stats.fallback_reason).inc()


def prelude_key(route: ModelRoute, prelude: Prelude) -> bytes:
    r = route.renderer
    return hashlib.blake2b(route.name.encode() + b"\0" + r.family.encode() + b"\0" + r.prelude_key(prelude),
                           digest_size=16).digest()


def check_length(prompt_len: int, route: ModelRoute, generate: bool) -> None:
    limit = route.max_context - (MIN_OUTPUT_ROOM if generate else 0)
    if prompt_len > limit:
        raise ApiError(
            400,
            f"Your input exceeds the context window of this model ({prompt_len} tokens; the limit is "
            f"{route.max_context} including at least {MIN_OUTPUT_ROOM} output tokens). Shorten the input "
            "or set truncation to 'auto'.",
            code="context_length_exceeded", param="input",
        )


def _render(turn: TurnInput, key: bytes) -> Rendered:
    route, parent, new_items = turn.route, turn.parent, turn.new_items
    renderer = route.renderer
    calls = CallLookup(turn.base_context, turn.new_calls)
    gen_ids = renderer.generation_prompt() if turn.generate else []
    budget = route.max_context - (MIN_OUTPUT_ROOM if turn.generate else 0)
    auto = turn.req.truncation == "auto"
    reason = None
    if parent is not None:
        # A renderer that knows appends it cannot do exactly (e.g. a template that merges
        # consecutive tool results) says why; the check looks at the boundary only: O(1).
        broken = renderer.append_break(turn.base_context, new_items)
        if parent.prelude_key == b"" and not parent.history_ids:
            reason = "tokens_missing"  # hydrated from a shared store by a process without its tokens
        elif parent.prelude_key != key:
            reason = "cut_off" if parent.prelude_key == b"" else "prelude_changed"
        elif broken:
            reason = broken
        else:
            new_ids = renderer.render_items(new_items, calls=calls)
            total = len(parent.history_ids) + len(new_ids) + len(gen_ids)
            if total <= budget or not auto:
                check_length(total, route, turn.generate)
                return Rendered(key, parent.history_ids, new_ids, gen_ids, RenderStats("append", len(new_ids)))
            reason = "truncation"
    # Full render (first turn, fallback, or truncation): O(history) by nature, counted.
    items = list(turn.base_context) + list(new_items)
    prelude_ids = renderer.render_prelude(turn.prelude)
    ids = prelude_ids + renderer.render_items(items, calls=calls)
    dropped = 0
    if len(ids) + len(gen_ids) > budget and auto:
        ids, dropped = _truncate(renderer, prelude_ids, items, calls, budget - len(gen_ids))
    check_length(len(ids) + len(gen_ids), route, turn.generate)
    return Rendered(key, None, ids, gen_ids, RenderStats("full", len(ids), reason, dropped))


def _truncate(renderer: Renderer, prelude_ids: list[int], items: Sequence[Item], calls: "CallLookup",
              budget: int) -> tuple[list[int], int]:
    """Drop the oldest items (keeping tool outputs with their calls) until the prompt fits."""
    parts = [renderer.render_items([item], calls=calls) for item in items]
    total = len(prelude_ids) + sum(len(p) for p in parts)
    start = 0
    while total > budget and start < len(items):
        total -= len(parts[start])
        start += 1
        # an output whose call was dropped cannot stand alone
        while start < len(items) and items[start].get("type") in OUTPUT_TYPES:
            total -= len(parts[start])
            start += 1
    # Render the kept items once more as a whole: per-item renders may differ at item
    # boundaries (templates join assistant turns and consecutive tool results).
    return prelude_ids + renderer.render_items(items[start:], calls=calls), start


class CallLookup(Mapping[str, Mapping[str, Any]]):
    """call_id -> call item over the chain's context and this turn's new items, without copying.

    Lookup-only: iteration covers the new calls alone (renderers only ever ``get``).
    """

    def __init__(self, context: ItemLog, new_calls: Mapping[str, Item]) -> None:
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
