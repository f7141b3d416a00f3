"""Server-side compaction: the model summarizes the history, a sealed item stands in for it.

Long agent sessions outgrow any context window; compaction keeps them going. Three entry points
share one mechanism:

* ``POST /v1/responses/compact`` (``gateway/turn/compact_request.py``) returns a new context window: the most
  recent user messages verbatim, then one ``{type: "compaction", id: "cmp_…", encrypted_content}``
  item. Clients send that window back verbatim as the next ``input``.
* ``context_management: [{type: "compaction", compact_threshold: N}]`` on a create (HTTP or WS):
  when the rendered prompt is longer than N tokens (a missing N means 80% of the model's context),
  the turn compacts *before* generating (:meth:`Compactor.compact_turn`), emits the compaction
  item as its own ``output_item.added/.done`` pair, and generates from the pruned context. A
  ``compaction_trigger`` input item forces the same.
* a ``compaction`` *input* item (:meth:`Compactor.window`): its summary replaces everything before
  it, except the user messages the window kept verbatim right before it.

**The summary is the model's own**, written through the route's engine: the conversation is
rendered as usual, followed by a summarization request (:mod:`inference.summary`), so the engine's
prefix cache reuses the history's KV. It is bounded by ``max_summary_tokens``.

**``encrypted_content``** is the summary (and how many items before it the window kept), sealed
with the gateway's :class:`~gateway.turn.sealing.Sealer`: opaque in logs and tamper-evident. A blob that
does not open is a 400 ``invalid_encrypted_content`` naming the item's parameter. Renderers never
see the item: the gateway hands them a developer message carrying the summary
(:func:`inference.summary.summary_message`).

**State after compaction** is the pruned context (kept user messages + summary + the response's
output) with its own token ids, so a ``previous_response_id`` continuation appends to a short
history: O(new input) again, and small.

**Billing**: the summarization is model work the client caused. Its prompt, cached and output
tokens are added to the response's ``usage`` (and so to its usage record); ``/responses/compact``
reports and bills its own usage under the window's ``resp_…`` id.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
from prometheus_client import Counter

from cache.item_log import ItemLog
from cache.seq import TokenSeq
from gateway.base.metrics import Metrics
from gateway.turn.sampling import output_cap
from gateway.turn.sealing import Sealer, SealError
from gateway.turn.types import Item, PreparedTurn
from gateway.wire.errors import bad_request, is_fault
from gateway.wire.items import new_id
from gateway.wire.kinds import ItemType
from gateway.wire.response import usage_object
from inference.engine import EngineError, RequestRouting, SamplingParams
from inference.parse import ItemDelta, ItemStart
from inference.registry import ModelRoute
from inference.renderer import Prelude, Renderer
from inference.summary import summary_message, summary_request

log = logging.getLogger(__name__)

#: default bound on the summary's length (output tokens of the summarization)
MAX_SUMMARY_TOKENS = 1024
#: user messages a window keeps verbatim: at most this many, of at most this many tokens in all
RETAIN_USER_MESSAGES = 8
RETAIN_USER_TOKENS = 2048
#: the threshold when ``compact_threshold`` is null: this share of the model's context
DEFAULT_THRESHOLD_SHARE = 0.8
#: prompt tokens the summary needs room for, at least
MIN_SUMMARY_ROOM = 16

_KIND = "respgate.compaction.v1"
#: internal key on a summary message made from an input item (popped by ``window``)
_KEEP = "__compaction_keep"


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int


class SummaryFailed(EngineError):
    """The engine failed (or wrote nothing) while summarizing; ``partial`` is what it cost so far."""

    def __init__(self, message: str, partial: Summary) -> None:
        super().__init__(message)
        self.partial = partial


class SummaryTooLong(SummaryFailed):
    """The conversation plus the summarization request does not fit the model's context."""


@dataclass(frozen=True, slots=True)
class TurnCompaction:
    """What a compacting turn continues with."""

    item: Item  # the ``compaction`` output item
    context: ItemLog  # kept user messages + summary message: the state continues from it
    prompt_ids: TokenSeq  # that context rendered, plus the generation prompt
    sampling: SamplingParams  # max_tokens re-derived for the shorter prompt
    summary: Summary


class Compactor:
    def __init__(self, sealer: Sealer, metrics: Metrics, *, max_summary_tokens: int = MAX_SUMMARY_TOKENS) -> None:
        self._sealer = sealer
        self.metrics = metrics
        self.max_summary_tokens = max_summary_tokens
        self.compactions = Counter(
            "respgate_compactions",
            "Compactions by trigger (threshold, trigger, endpoint)",
            ["trigger"],
            registry=metrics.registry,
        )

    # -- the opaque item ----------------------------------------------------------------------

    def seal(self, summary: str, keep: int) -> str:
        return self._sealer.seal(orjson.dumps({"kind": _KIND, "summary": summary, "keep": keep}).decode())

    def open(self, blob: str, param: str) -> tuple[str, int]:
        """The summary and kept-item count of a sealed blob; a 400 naming ``param`` otherwise."""
        try:
            payload = orjson.loads(self._sealer.open(blob))
        except (SealError, orjson.JSONDecodeError):
            payload = None
        if (
            not isinstance(payload, dict)
            or payload.get("kind") != _KIND
            or not isinstance(payload.get("summary"), str)
            or not isinstance(payload.get("keep"), int)
            or payload["keep"] < 0
        ):
            raise bad_request(
                f"Invalid '{param}': the compaction item's encrypted_content could not be verified. "
                "Pass compaction items back exactly as the server returned them.",
                code="invalid_encrypted_content",
                param=param,
            )
        return payload["summary"], payload["keep"]

    def input_item(self, item: dict[str, Any], i: int) -> dict[str, Any]:
        """A client's ``compaction`` item -> the summary message renderers see (marked for ``window``)."""
        summary, keep = self.open(item.get("encrypted_content") or "", f"input[{i}].encrypted_content")
        msg = summary_message(summary, item.get("id") or new_id("cmp"))
        msg[_KEEP] = keep
        return msg

    @staticmethod
    def window(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool, bool]:
        """Apply the latest compaction item of a request's input: ``(items, pruned, triggered)``.

        Items before the latest summary are dropped, except the user messages the window kept
        verbatim right before it. ``compaction_trigger`` markers are removed (``triggered``).
        """
        triggered = any(it.get("type") == "compaction_trigger" for it in items)
        if triggered:
            items = [it for it in items if it.get("type") != "compaction_trigger"]
        last, keep = -1, 0
        for i, it in enumerate(items):
            if _KEEP in it:
                last, keep = i, it.pop(_KEEP)
        if last < 0:
            return items, False, triggered
        start = last
        while start > 0 and last - start < keep and _is_user_message(items[start - 1]):
            start -= 1
        return items[start:], True, triggered

    # -- summarizing --------------------------------------------------------------------------

    async def summarize(
        self,
        route: ModelRoute,
        prelude: Prelude,
        history: Sequence[int],
        request_id: str,
        cache_salt: str | None = None,
        routing: RequestRouting | None = None,
    ) -> Summary:
        """The model's summary of ``history`` (prelude + items, rendered), through ``route.engine``.

        Raises :class:`SummaryFailed` when the engine fails, crashes (any fault, ``is_fault``) or
        writes nothing, with the tokens spent, so that every caller bills them as it bills a failed
        turn; :class:`SummaryTooLong` when the summarization prompt does not fit the context.
        """
        renderer = route.renderer
        tail = renderer.render_items([summary_request()]) + renderer.generation_prompt()
        self.metrics.render_tokens.labels("append").inc(len(tail))
        ids = history[0 : len(history)]  # one C-level copy: the shared buffer stays untouched
        prompt = (ids if isinstance(ids, list) else list(ids)) + tail
        room = route.max_context - len(prompt)
        if room < MIN_SUMMARY_ROOM:
            raise SummaryTooLong(
                f"The conversation is too long to compact with this model ({len(prompt)} tokens; "
                f"the context window is {route.max_context}).",
                Summary("", 0, 0, 0, 0),
            )
        sampling = SamplingParams(
            max_tokens=min(self.max_summary_tokens, room),
            temperature=0.0,
            top_p=1.0,
            stop_token_ids=tuple(renderer.stop_token_ids),
            cache_salt=cache_salt,
        )
        parser = renderer.parser(prelude)
        message: list[str] = []
        other: list[str] = []
        kind = "message"
        sampled = cached = 0
        agen = route.engine.generate(request_id, prompt, sampling, routing)

        def spent(text: str = "") -> Summary:
            return Summary(text, len(prompt), cached, sampled, parser.reasoning_tokens)

        try:
            async for delta in agen:
                sampled += len(delta.token_ids)
                if delta.num_cached_tokens is not None:
                    cached = delta.num_cached_tokens
                if delta.finish_reason == "abort":
                    raise SummaryFailed("the summarization was aborted", spent())
                try:
                    events = parser.feed(delta.token_ids)
                except ValueError:  # malformed output: keep what parsed so far
                    break
                for ev in events:
                    if isinstance(ev, ItemStart):
                        kind = ev.kind
                    elif isinstance(ev, ItemDelta):
                        (message if kind == "message" else other).append(ev.text)
        except SummaryFailed:
            raise
        except EngineError as exc:
            raise SummaryFailed(str(exc), spent()) from exc
        except BaseException as exc:  # a fault (pyo3's PanicException is a BaseException): its tokens were spent too
            if not is_fault(exc):
                raise  # cancellation, the generator closed, interpreter exit
            log.exception("engine crashed summarizing %s", request_id)
            raise SummaryFailed("the engine crashed while summarizing", spent()) from exc
        finally:
            await agen.aclose()
        text = ("".join(message) or "".join(other)).strip()
        if not text:
            raise SummaryFailed("the model wrote an empty summary", spent())
        return spent(text)

    # -- a compacting turn --------------------------------------------------------------------

    def wanted(self, turn: PreparedTurn) -> str | None:
        """Why this turn compacts before generating (``trigger``/``threshold``), or None."""
        if not turn.input.generate:
            return None
        if turn.input.compact_trigger:
            return "trigger"
        if turn.req.context_management and turn.prompt_len > self._threshold(turn):
            return "threshold"
        return None

    @staticmethod
    def _threshold(turn: PreparedTurn) -> int:
        default = int(turn.route.max_context * DEFAULT_THRESHOLD_SHARE)
        limits = [cm.compact_threshold for cm in turn.req.context_management or ()]
        return min((default if n is None else n for n in limits), default=default)

    async def compact_turn(self, turn: PreparedTurn, turn_ids: TokenSeq, reason: str) -> TurnCompaction:
        """Summarize the turn's whole context and re-render it pruned (prelude + kept + summary)."""
        route, renderer = turn.route, turn.route.renderer
        assert turn.sampling is not None
        summary = await self.summarize(
            route, turn.input.prelude, turn_ids, f"{turn.id}-compact", turn.sampling.cache_salt, turn.routing()
        )
        items = list(turn.input.base_context) + list(turn.input.new_items)  # O(history): a compaction is, by nature
        # kept verbatim: at most a quarter of the threshold, or the pruned context would not shrink
        kept = self.kept_users(
            renderer, items, contiguous=True, budget=min(RETAIN_USER_TOKENS, self._threshold(turn) // 4)
        )
        item_id = new_id("cmp")
        item = {"id": item_id, "type": "compaction", "encrypted_content": self.seal(summary.text, len(kept))}
        pruned = kept + [summary_message(summary.text, item_id)]
        ids = renderer.render_prelude(turn.input.prelude) + renderer.render_items(pruned)
        self.metrics.render_tokens.labels("full").inc(len(ids))
        prompt_ids = TokenSeq(ids).extend(turn.rendered.gen_ids)
        room = route.max_context - len(prompt_ids)
        max_out = output_cap(turn.req, route)
        sampling = msgspec.structs.replace(turn.sampling, max_tokens=room if max_out is None else min(room, max_out))
        self.compactions.labels(reason).inc()
        return TurnCompaction(item, ItemLog(pruned), prompt_ids, sampling, summary)

    @staticmethod
    def add_usage(usage: dict[str, Any], summary: Summary | None) -> dict[str, Any]:
        """The response's usage plus the summarization's tokens (the client caused both)."""
        if summary is None:
            return usage
        return usage_object(
            usage["input_tokens"] + summary.prompt_tokens,
            usage["input_tokens_details"]["cached_tokens"] + summary.cached_tokens,
            usage["output_tokens"] + summary.output_tokens,
            usage["output_tokens_details"]["reasoning_tokens"] + summary.reasoning_tokens,
        )

    @staticmethod
    def kept_users(
        renderer: Renderer, items: Sequence[Item], *, contiguous: bool, budget: int = RETAIN_USER_TOKENS
    ) -> list[Item]:
        """The most recent user messages a window keeps verbatim (within the retention bounds).

        ``contiguous``: only the run of user messages at the very end (a context_management
        compaction: a stateless client's next input has exactly those right before the item).
        """
        kept: list[dict[str, Any]] = []
        for item in reversed(items):
            if not _is_user_message(item):
                if contiguous:
                    break
                continue
            cost = renderer.count_text_tokens(_text(item))
            if cost > budget or len(kept) >= RETAIN_USER_MESSAGES:
                break
            budget -= cost
            kept.append(_public(item))
        kept.reverse()
        return kept


def _is_user_message(item: Item) -> bool:
    return item.get("type", ItemType.MESSAGE) == ItemType.MESSAGE and item.get("role") == "user"


def _text(item: dict[str, Any]) -> str:
    return "".join(str(p.get("text", "")) for p in item.get("content") or () if isinstance(p, dict))


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if not k.startswith("__")}
