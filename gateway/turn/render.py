"""Render: a :class:`TurnInput` -> :class:`Rendered` token ids, appending to the parent's when exact.

A continuation appends the new items' tokens to the parent's rendered history (an append-only
view, no copy), so its cost is O(new input). So does a request with no parent whose first items the
tenant's earlier turns rendered (``gateway.turn.prefix``: Codex HTTP, the AI SDK with ``store:
false``): the cached prefix's view, then the rest. When an append is not provably exact the turn renders
in full and says why (``RenderStats.fallback_reason``, counted in
``respgate_render_full_fallbacks``). Each reason is a case where no append can be right, and none
arises in a standard rollout (the same prelude every turn, the model's output last in every
parent; output caps of any size included):

=============== ==============================================================================
reason          why a full render is required
=============== ==============================================================================
tokens_missing  the parent came from a shared store written by a process that kept no tokens:
                there is nothing to append to (once per hand-over: the child has tokens)
prelude_changed instructions, tools, tool_choice or reasoning effort differ from the parent's:
                they are rendered *first*, so every history token after them moves or changes
                and no cached KV past the prelude is valid anyway
not_canonical   the parent's history holds sampled tokens its output does not (a
                ``parallel_tool_calls: false`` turn stopped after the first call, whose kept
                output the renderer could not render, ``gateway.turn.run``): appending would show
                the model a call the client never got
<renderer's>    the template itself joins items across the boundary (``template``, ``joined``,
                ``assistant_turn``: ``inference.chat_template_render``): the parent's closing
                tokens are not where that template puts them
truncation      ``truncation: "auto"`` and the append does not fit: the oldest items are dropped,
                so the prompt's prefix changes
=============== ==============================================================================

Cut-off parents append
----------------------
A parent whose generation ended without its stop token — ``incomplete`` by ``max_output_tokens``
or the context limit, or stopped without a stop token — is not a fallback. The run stage keeps its
sampled tokens verbatim (they are what the engine's KV cache holds) and closes the cut message the
way the format closes a message (``Renderer.cut_history``): harmony appends ``<|end|>``, or
``<|call|>`` inside a tool call, and drops a header cut before its ``<|message|>`` (no content, and
the parser made no item of it); a chat template appends what it emits after an assistant message
(end-of-turn + post-message tokens, ``<|im_end|>\\n`` for ChatML) wherever the cut landed. The
next turn then appends like any other::

    prompt + sampled + closing + render_items(new items) + generation_prompt

**When this equals a full render** of the same items (the prelude and every item, the cut output
items as the parser made them, status ``incomplete``): when the cut output re-renders to the
tokens sampled — the cut lands between messages or in a (dropped) harmony header, or inside text,
reasoning or harmony call arguments whose tokens are the tokenizer's own tokens of their text (no
character split by the cut, no word the cut left that tokenizes differently on its own), and for
a chat template not inside a ``<tool_call>``, not on whitespace the parser reads as format, and
not in reasoning the template drops. Property tests per family check these cases, in both
directions where the condition is the tokenizer's (``tests/gateway/turn/test_render_cutoff.py``; contract (d)
of ``inference.harmony_render`` and ``inference.chat_template_render``).

**When it deliberately differs**, and why that is right: a full render re-tokenizes the decoded
text of the cut item — a multi-byte character split by the cut is dropped, a cut word may
tokenize differently; a chat template re-serializes a cut ``<tool_call>`` body (not JSON) as a JSON
string (``"arguments": "{\\"city\\": \\"Os"``); templates without a reasoning field (SmolLM2,
Qwen2.5) drop ``<think>`` reasoning. Each rewrites tokens *inside* the history, so the engine's
prefix cache misses from there on (at 128k, the whole history is prefilled again) and the model is
shown a turn it did not write. The append keeps the cache hit, costs O(new input), and the next
model call sees exactly what it generated, closed. Model behaviour: the model sees its cut turn as
it wrote it (a cut tool call, closed with ``<|call|>``, is followed by the next input, not by a tool
output — as in a full render); harmony's reference renderer would drop the analysis of earlier
turns, which neither path here does (``inference.harmony_render``: history is never rewritten).

Never extends a shared buffer: that happens when the turn runs (``gateway.turn.run``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cache.item_log import ItemLog
from gateway.base.metrics import Metrics
from gateway.turn.types import Item, Rendered, RenderStats, TurnInput
from gateway.wire.errors import ApiError, bad_request
from gateway.wire.kinds import OUTPUT_TYPES
from inference.hosted_items import call_of
from inference.registry import ModelRoute
from inference.renderer import Prelude, Renderer

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
        raise bad_request(
            f"Invalid request for this model's prompt format: {exc}",
            code="invalid_value",
            param="tools" if "tool" in type(exc).__name__.lower() else "input",
        ) from None


def observe(metrics: Metrics, rendered: Rendered) -> None:
    """Count what a render encoded, what it reused, and why it fell back (an accepted turn only)."""
    stats = rendered.stats
    metrics.render_tokens.labels(stats.mode).inc(stats.new_tokens)
    metrics.reused_tokens.inc(len(rendered.base_ids) if rendered.base_ids is not None else 0)
    if stats.fallback_reason:
        metrics.render_fallbacks.labels(stats.fallback_reason).inc()


def prelude_key(route: ModelRoute, prelude: Prelude) -> bytes:
    r = route.renderer
    return hashlib.blake2b(
        route.name.encode() + b"\0" + r.family.encode() + b"\0" + r.prelude_key(prelude), digest_size=16
    ).digest()


def check_length(prompt_len: int, route: ModelRoute, generate: bool) -> None:
    limit = route.max_context - (MIN_OUTPUT_ROOM if generate else 0)
    if prompt_len > limit:
        raise ApiError(
            400,
            f"Your input exceeds the context window of this model ({prompt_len} tokens; the limit is "
            f"{route.max_context} including at least {MIN_OUTPUT_ROOM} output tokens). Shorten the input "
            "or set truncation to 'auto'.",
            code="context_length_exceeded",
            param="input",
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
            reason = "not_canonical" if parent.prelude_key == b"" else "prelude_changed"
        elif broken:
            reason = broken
        else:
            new_ids = renderer.render_items(new_items, calls=calls)
            total = len(parent.history_ids) + len(new_ids) + len(gen_ids)
            if total <= budget or not auto:
                check_length(total, route, turn.generate)
                return Rendered(key, parent.history_ids, new_ids, gen_ids, RenderStats("append", len(new_ids)))
            reason = "truncation"
    elif turn.prefix is not None and turn.prefix.ids is not None:
        # No parent, but the tenant's earlier turns rendered the first items (``gateway.turn.prefix``:
        # a hit is token-exact, its cut checked against the renderer's append contract).
        hit, base_ids = turn.prefix, turn.prefix.ids
        rendered = renderer.render_items(new_items[hit.covered :], calls=calls)
        new_ids = [*hit.lead, *rendered] if hit.lead else rendered
        total = len(base_ids) + len(new_ids) + len(gen_ids)
        if total <= budget or not auto:
            check_length(total, route, turn.generate)
            return Rendered(key, base_ids, new_ids, gen_ids, RenderStats("append", len(new_ids)))
    # Full render (first turn, fallback, or truncation): O(history) by nature, counted.
    items = list(turn.base_context) + list(new_items)
    prelude_ids = renderer.render_prelude(turn.prelude)
    ids = prelude_ids + renderer.render_items(items, calls=calls)
    dropped = 0
    if len(ids) + len(gen_ids) > budget and auto:
        ids, dropped = _truncate(renderer, prelude_ids, items, calls, budget - len(gen_ids))
    check_length(len(ids) + len(gen_ids), route, turn.generate)
    return Rendered(key, None, ids, gen_ids, RenderStats("full", len(ids), reason, dropped))


def _truncate(
    renderer: Renderer, prelude_ids: list[int], items: Sequence[Item], calls: CallLookup, budget: int
) -> tuple[list[int], int]:
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
            # an MCP approval request is a call by its item id (``inference.hosted_items.call_of``):
            # a refusal in a later turn is rendered under its tool's name
            earlier = self._context.get(call_id)
            item = call_of(earlier) if earlier is not None else None
        if item is None:
            raise KeyError(call_id)
        return item

    def __iter__(self) -> Iterator[str]:
        return iter(self._new)

    def __len__(self) -> int:
        return len(self._new)
