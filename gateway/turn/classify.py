"""Classify: the NEW items of a turn, each once per conversation (``security/`` decides).

Which text of an item is classified (and counted):

* ``message``: the ``text`` of every text part (``input_text``, ``output_text``, ``refusal``);
  images and files are not text and are not classified here.
* a tool call: its payload (``arguments`` of a ``function_call``, ``input`` of a
  ``custom_tool_call``: the kinds map, ``gateway/wire/kinds.py``).
* a tool output: the ``output`` string (list outputs are joined text parts, see
  ``gateway.wire.items.canonical_item``), marked as tool text (where prompt injection arrives).
* ``reasoning``: the reasoning text and summary text.

Items re-included by ``item_reference`` were classified when they entered the conversation and
are skipped. Items added to a server-side conversation through the Conversations API enter there
(:meth:`ClassifyStage.classify_added`), so a turn on the conversation does not see them again. So
are the first items of a request with no parent that the tenant's prefix cache knows
(``gateway.turn.prefix``: classified in the earlier turn that sent them, or the model's own
output); a flag among them still counts for the conversation (``TurnInput.flagged_before``). A
block is a 400 naming the category and the item, never the matched value; flags are
reported asynchronously (``security.flags``) once the response id exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.base.metrics import Metrics
from gateway.turn.offload import INLINE, Cpu
from gateway.turn.types import PreparedTurn, TurnContext, TurnInput
from gateway.wire.errors import ApiError
from gateway.wire.kinds import OUTPUT_TYPES, ItemType, call_kind
from security.classifiers import Classifier, ClassifierUnavailable, ItemText, Verdict, block_message
from security.flags import FlagRecord, FlagReporter


class ClassifyStage:
    def __init__(self, classifier: Classifier, metrics: Metrics, flags: FlagReporter | None = None) -> None:
        self.classifier = classifier
        self.metrics = metrics
        self.flags = flags

    async def classify(self, turn: TurnInput, ctx: TurnContext, cpu: Cpu = INLINE) -> tuple[Verdict, ...]:
        """The turn's non-allow verdicts; counts items and bytes; a block raises (and is reported).

        ``cpu`` runs the texts' extraction (a big turn's in the prepare pool); the classifier decides
        itself where its scans run (``security.classifiers.Composite``)."""
        seen = turn.prefix.seen if turn.prefix is not None else 0
        texts = (
            texts_of(turn.new_items, turn.base_context.has_id, seen)
            if cpu.inline
            else await cpu(texts_of, turn.new_items, turn.base_context.has_id, seen)
        )
        if seen:
            self.metrics.prefix_skipped_items.inc(seen)
        verdicts = await self._verdicts(texts)
        blocks = [v for v in verdicts if v.action == "block"]
        if blocks:
            self.report(blocks, turn, ctx, response_id=None)
            first = blocks[0]
            raise ApiError(
                400,
                block_message(first),
                code="content_policy_violation",
                param=f"input[{first.index}]" if first.index is not None else "input",
            )
        return verdicts

    async def classify_added(self, items: Sequence[Mapping[str, Any]], ctx: TurnContext) -> tuple[Verdict, ...]:
        """Items a client adds to a conversation (not a turn): classified once as they enter; a block
        is a 400 naming ``items[i]`` (nothing is added), flags are reported without a response."""
        verdicts = await self._verdicts(texts_of(items))
        if self.flags is not None and verdicts:
            self.flags.report(
                [
                    FlagRecord.of(
                        v,
                        item_type=items[v.index].get("type") if v.index is not None else None,
                        response_id=None,
                        previous_response_id=None,
                        tenant=ctx.tenant,
                        model=None,
                        transport=ctx.transport,
                        flagged_before=False,
                    )
                    for v in verdicts
                ]
            )
        blocks = [v for v in verdicts if v.action == "block"]
        if blocks:
            raise ApiError(
                400,
                block_message(blocks[0]),
                code="content_policy_violation",
                param=f"items[{blocks[0].index}]" if blocks[0].index is not None else "items",
            )
        return verdicts

    async def tool_outputs(self, outputs: Sequence[Mapping[str, Any]], turn: PreparedTurn) -> bool:
        """The outputs of calls the gateway ran, classified as new input (as a client's tool output
        would be: where prompt injection arrives); flags and blocks are reported with the response.
        True when one is blocked: the tool loop stops."""
        verdicts = await self._verdicts(texts_of(outputs))
        if self.flags is not None and verdicts:
            self.flags.report(
                [
                    FlagRecord.of(
                        v,
                        item_type="mcp_call",
                        response_id=turn.id,
                        previous_response_id=turn.req.previous_response_id,
                        tenant=turn.ctx.tenant,
                        model=turn.route.name,
                        transport=turn.ctx.transport,
                        flagged_before=turn.flagged,
                    )
                    for v in verdicts
                ]
            )
        return any(v.action == "block" for v in verdicts)

    async def _verdicts(self, texts: list[ItemText]) -> tuple[Verdict, ...]:
        """The non-allow verdicts on ``texts``, counted."""
        try:
            verdicts = tuple(v for v in await self.classifier.classify(texts) if v.action != "allow")
        except ClassifierUnavailable:
            raise ApiError(
                503,
                "The content classifier is temporarily unavailable. Please retry your request.",
                type="server_error",
                code="classifier_unavailable",
            ) from None
        self.metrics.classified_items.inc(len(texts))
        self.metrics.classified_bytes.inc(sum(t.nbytes for t in texts))
        for v in verdicts:
            self.metrics.classifier_verdicts.labels(v.action, (v.category or "")[:64]).inc()
        return verdicts

    def report(self, verdicts: Sequence[Verdict], turn: TurnInput, ctx: TurnContext, response_id: str | None) -> None:
        """Queue flag records (never awaited: reporting is off the turn's path)."""
        if self.flags is None or not verdicts:
            return
        self.flags.report(
            [
                FlagRecord.of(
                    v,
                    item_type=turn.new_items[v.index].get("type") if v.index is not None else None,
                    response_id=response_id,
                    previous_response_id=turn.req.previous_response_id,
                    tenant=ctx.tenant,
                    model=turn.route.name,
                    transport=ctx.transport,
                    flagged_before=turn.flagged_before,
                )
                for v in verdicts
            ]
        )


def texts_of(
    items: Sequence[Mapping[str, Any]], known: Callable[[str], bool] | None = None, start: int = 0
) -> list[ItemText]:
    """The classifiable text of each new item from ``start`` on (see the module docstring), skipping
    items whose id ``known`` says is already in the conversation (``item_reference`` re-inclusions).
    Indices stay those of ``items``."""
    out: list[ItemText] = []
    message = ItemType.MESSAGE
    for index in range(start, len(items)):
        item = items[index]
        item_id = item.get("id")
        if not isinstance(item_id, str):
            item_id = None
        elif known is not None and known(item_id):
            continue
        t = str(item.get("type", message))
        out.append(
            ItemText(
                index,
                item_id,
                t,
                item.get("role") if t == message else None,
                _text(t, item),
                tool_output=t in OUTPUT_TYPES,
            )
        )
    return out


def _text(t: str, item: Mapping[str, Any]) -> str:
    """An item's classifiable text: its texts joined by newlines."""
    if t == ItemType.MESSAGE or t == ItemType.REASONING:
        content = item.get("content")
        if item.get("summary") is None:  # a message: one text, or one text part (the usual ones)
            if type(content) is str:
                return content
            if type(content) is list and len(content) == 1 and type(content[0]) is dict:
                text = content[0].get("text")
                return text if type(text) is str else ""
        texts: list[str] = []
        for key in ("content", "summary"):
            parts = content if key == "content" else item.get(key)
            if isinstance(parts, str):
                texts.append(parts)
            elif isinstance(parts, list):
                for p in parts:
                    if isinstance(p, Mapping) and isinstance(p.get("text"), str):
                        texts.append(p["text"])
        return "\n".join(texts)
    if (kind := call_kind(t)) is not None:
        return _str(item.get(kind.payload))
    if t in OUTPUT_TYPES:
        return _str(item.get("output"))
    return ""


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""
