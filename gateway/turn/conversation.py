"""Conversation turns: what a ``conversation`` create starts from, and what it adds when it ends.

    base(conversation)   tip: this process's last response on it, when nobody changed the
                              conversation since (same revision)  -> a continuation: append, O(new)
                         else: the stored items                    -> rendered in full, counted
    append(turn)         the turn's input items + output items appended to the conversation,
                         before the client sees the terminal event (``Finalizer.write``)

**Why a tip.** A conversation's items are the context, but a process that ran the conversation's
last turn already holds that context *rendered* (the response's ``history_ids``). When the append
that ended that turn found the conversation at the revision the turn had read, the conversation's
items are exactly that response's context; as long as the revision has not moved since, the next
turn is a plain continuation of that response (classified, validated and rendered on its new
items only). Any other change — items added or deleted through the API, a turn on another
replica, a concurrent turn — moves the revision, and the turn renders the stored items in full:
``respgate_render_full_fallbacks_total{reason="tokens_missing"}``, the same reason a response
hydrated from another replica's store gets. ``respgate_conversation_turns_total{context}`` says
which way each conversation turn went.

**The items path** gives the turn a parent that stands for the conversation: its items as context,
no tokens, its open tool calls as pending (so the same request is checked the same way whichever
path it takes). ``compaction`` items in the conversation (a turn's compaction output, or one added
through the API) are opened and windowed as a create's input would be.

A failed or cancelled turn appends nothing. A turn's items are appended even past the
conversation's bounds (``cache.conversations``): it ran and will be billed, and its output must not
be lost. An append that fails (the conversation was deleted meanwhile, the store went away) fails
the turn, as a failed ``store=true`` write does (``respgate_conversation_append_failures_total``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cache.conversations import (
    Conversation,
    ConversationFull,
    ConversationNotFound,
    ConversationRef,
    ConversationStore,
    ConversationTips,
    DuplicateItem,
    Tip,
    UnknownCursor,
)
from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.response_store import ResponseStore, StoreUnavailable
from cache.seq import TokenSeq
from gateway.base.log_limit import RateLimitedLog
from gateway.base.metrics import Metrics
from gateway.turn.checks import orphan_outputs
from gateway.turn.compaction import Compactor
from gateway.turn.sealing import Sealer, SealError
from gateway.turn.types import Item, PreparedTurn
from gateway.wire.conversations import conversation_full, conversation_not_found, duplicate_item
from gateway.wire.errors import ApiError, bad_request, store_unavailable
from gateway.wire.items import (
    Compaction,
    CompactionTrigger,
    HostedItem,
    ItemReference,
    Reasoning,
    canonical_item,
    new_id,
)
from gateway.wire.kinds import CALL_TYPES, OUTPUT_TYPES

log = logging.getLogger(__name__)
#: a conversation holding orphan outputs is read on every turn: said a few times a window, not each turn
orphan_logs = RateLimitedLog(log)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConversationBase:
    """A conversation turn's starting point: the revision read, and the parent it continues."""

    ref: ConversationRef
    #: the tip response (append), or a stand-in holding the stored items (full render); None when
    #: the conversation is empty (a first turn)
    parent: ResponseState | None


class Conversations:
    """The conversation store as the gateway uses it: timed, errors as OpenAI's, tips remembered."""

    def __init__(
        self,
        store: ConversationStore,
        responses: ResponseStore,
        metrics: Metrics,
        sealer: Sealer,
        compactor: Compactor,
        *,
        tips_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.store = store
        self.responses = responses
        self.metrics = metrics
        self.sealer = sealer
        self.compactor = compactor
        self.tips = ConversationTips(tips_bytes)

    async def call(
        self,
        op: str,
        conversation_id: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        param: str | None = None,
        **kwargs: Any,
    ) -> T:
        """One store operation, timed (``respgate_conversation_store_seconds{op}``), with the store's
        errors as the API's: 404 for a missing (or another tenant's) conversation, 503 when down."""
        t0 = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        except ConversationNotFound:
            raise conversation_not_found(conversation_id, param) from None
        except StoreUnavailable:
            raise store_unavailable() from None
        except ConversationFull:
            limits = self.store.limits
            raise conversation_full(conversation_id, limits.max_items, limits.max_bytes) from None
        except DuplicateItem as exc:
            raise duplicate_item(exc.item_id) from None
        except UnknownCursor as exc:
            raise bad_request(f"Item with id '{exc}' not found.", code="invalid_value", param="after") from None
        finally:
            self.metrics.conversation_latency.labels(op).observe(time.perf_counter() - t0)

    # -- a turn's start ---------------------------------------------------------------------------

    async def base(self, conversation_id: str, tenant: str | None) -> ConversationBase:
        tip = self.tips.get(conversation_id)
        if tip is not None:
            now = await self.call("get", conversation_id, self.store.get, conversation_id, tenant, param="conversation")
            if now is None:
                raise conversation_not_found(conversation_id, "conversation")
            if now.revision == tip.revision:
                self.metrics.conversation_turns.labels("tip").inc()
                return ConversationBase(ConversationRef(conversation_id, now.revision), tip.state)
            self.tips.discard(conversation_id)
        conv, items = await self.call(
            "items", conversation_id, self.store.items, conversation_id, tenant, param="conversation"
        )
        self.metrics.conversation_turns.labels("items").inc()
        ref = ConversationRef(conversation_id, conv.revision)
        if not items:
            return ConversationBase(ref, None)
        return ConversationBase(ref, self._stand_in(conv, self._context(items), tenant))

    def _context(self, items: list[Item]) -> list[Item]:
        """The stored items as a turn's context: ``compaction`` items opened and windowed, and tool
        outputs whose call is not before them left out.

        Why leave them out: a renderer names an output by its call, so an orphan one makes every
        turn on the conversation fail. Adding one is refused (``conversations_routes``), but a
        conversation can still hold one: stored before that check, or its call deleted through
        ``DELETE .../items/{id}``. It stays stored and listed; the model is not shown it."""
        context = self._windowed(items)
        orphans = orphan_outputs(context)
        if not orphans:
            return context
        orphan_logs.warning(
            "orphan_output",
            "conversation context: %d tool output(s) without their call left out (first call_id %s)",
            len(orphans),
            orphans[0][1],
        )
        dropped = {i for i, _ in orphans}
        return [it for i, it in enumerate(context) if i not in dropped]

    def _windowed(self, items: list[Item]) -> list[Item]:
        """``items`` with ``compaction`` items opened and windowed."""
        if not any(it.get("type") == "compaction" for it in items):
            return items
        opened: list[Item] = []
        for i, item in enumerate(items):
            if item.get("type") == "compaction":
                try:
                    item = self.compactor.input_item(item, i)
                except ApiError:
                    raise bad_request(
                        f"Conversation item '{item.get('id')}' is a compaction item whose "
                        "encrypted_content this gateway cannot open (another seal secret).",
                        code="invalid_encrypted_content",
                        param="conversation",
                    ) from None
            opened.append(item)
        return self.compactor.window(opened)[0]

    @staticmethod
    def _stand_in(conv: Conversation, items: list[Item], tenant: str | None) -> ResponseState:
        """A parent holding the conversation's items and no tokens: the render stage renders it in
        full (``tokens_missing``) and the pairing check sees its open calls."""
        answered = {it.get("call_id") for it in items if it.get("type") in OUTPUT_TYPES}
        pending = frozenset(
            it["call_id"]
            for it in items
            if it.get("type") in CALL_TYPES and it.get("status") != "incomplete" and it["call_id"] not in answered
        )
        return ResponseState(
            id=conv.id,
            response={},
            input_items=(),
            context=ItemLog(items),
            history_ids=TokenSeq(),
            model="",
            prelude_key=b"",
            store=False,
            pending_calls=pending,
            tenant=tenant,
            nbytes=conv.nbytes,
        )

    # -- a turn's end -----------------------------------------------------------------------------

    async def append(self, turn: PreparedTurn, state: ResponseState, *, compacted: bool) -> bool:
        """Append a finished turn's input and output items (``Finalizer.write``, before the terminal
        event); remember the state as the tip when the conversation is now exactly its context.
        False when the append failed (logged, counted): the turn then fails."""
        ref = turn.input.conversation
        assert ref is not None
        base = turn.input.base_context
        inputs = [it for it in turn.input.new_items if not (it.get("id") and base.has_id(it["id"]))]
        items = [
            it if it.get("id") else dict(it, id=new_id("item")) for it in (*inputs, *state.response.get("output", ()))
        ]
        t0 = time.perf_counter()
        try:
            appended = await self.store.append(ref.id, turn.ctx.tenant, items, force=True)
        except (ConversationNotFound, StoreUnavailable) as exc:
            # deleted while the turn ran, or the store went away: the turn fails (no client is told
            # "completed" about a turn its conversation does not hold)
            self.tips.discard(ref.id)
            self.metrics.conversation_append_failures.inc()
            log.warning("conversation append failed for %s (%s): %s", ref.id, turn.id, exc)
            return False
        finally:
            self.metrics.conversation_latency.labels("append").observe(time.perf_counter() - t0)
        # the tip is exact when the conversation became precisely this state's context: nobody
        # changed it while the turn ran, nothing was skipped, no compaction pruned the state
        if (
            not compacted
            and len(inputs) == len(turn.input.new_items)
            and len(appended.items) == len(items)
            and appended.previous_revision == ref.revision
            and len(state.context) == len(base) + len(items)
            and len(state.history_ids)
        ):
            self.tips.put(ref.id, Tip(state, appended.conversation.revision))
        else:
            self.tips.discard(ref.id)
        return True

    # -- items added through the API --------------------------------------------------------------

    async def new_items(self, raw_items: list[Any], tenant: str | None) -> list[Item]:
        """``items`` of a conversation create or an items create, as a turn's input would be kept:
        canonical, with ids; references resolved among the tenant's stored responses; sealed
        reasoning opened (renderers need its text); compaction items checked (opened at use)."""
        refs = [raw.id for raw in raw_items if isinstance(raw, ItemReference)]
        stored = {}
        if refs:
            try:
                stored = await self.responses.items(refs, tenant)
            except StoreUnavailable:
                raise store_unavailable() from None
        out: list[Item] = []
        for i, raw in enumerate(raw_items):
            if isinstance(raw, ItemReference):
                found = stored.get(raw.id)
                if found is None:
                    raise bad_request(
                        f"Item with id '{raw.id}' not found.", code="invalid_value", param=f"items[{i}].id"
                    )
                item = dict(found.item)
            elif isinstance(raw, CompactionTrigger):
                raise bad_request(
                    "Invalid value: 'compaction_trigger'. A conversation holds items, not markers.",
                    code="invalid_value",
                    param=f"items[{i}].type",
                )
            elif isinstance(raw, HostedItem):
                item = raw.model_dump(exclude_none=True)
            else:
                item = canonical_item(raw)
                if isinstance(raw, Reasoning) and item.get("encrypted_content") and not item.get("content"):
                    try:
                        text = self.sealer.open(item["encrypted_content"])
                    except SealError as exc:
                        raise bad_request(
                            f"Invalid 'items[{i}].encrypted_content': {exc}.",
                            code="invalid_encrypted_content",
                            param=f"items[{i}].encrypted_content",
                        ) from None
                    item["content"] = [{"type": "reasoning_text", "text": text}]
                elif isinstance(raw, Compaction):
                    self.compactor.open(item["encrypted_content"], f"items[{i}].encrypted_content")
                    item.setdefault("id", new_id("cmp"))
            item.setdefault("id", new_id("item"))
            out.append(item)
        return out
