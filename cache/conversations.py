"""The conversation store: server-side conversations (OpenAI's Conversations API) and their items.

A conversation is an ordered list of items (the same dicts a turn's context holds: canonical
input items with ids, and output items as the Response carried them) plus ``metadata`` and a
**revision**. Every change to the items (an append, a deleted item) bumps the revision, so a
process that remembers "after my last turn on this conversation the items were exactly my
response's context, at revision R" (:class:`ConversationTips`) can tell with one small read
whether anyone changed the conversation since — and if nobody did, continue from its own rendered
tokens instead of re-rendering the items (the O(new input) rule; ``gateway.turn.conversation``).

One protocol, two implementations: :class:`MemoryConversationStore` here (one process) and
``cache.redis_conversations.RedisConversationStore`` (shared by every replica). Rules both keep:

* **Tenancy.** A conversation belongs to the tenant that created it; every other tenant gets
  :class:`ConversationNotFound`, exactly as for an id that never existed.
* **Bounds in bytes.** A conversation holds at most ``max_items`` items and ``max_bytes`` bytes of
  item JSON (:func:`item_bytes`); an append beyond either is refused whole
  (:class:`ConversationFull`). A turn's own append is ``force``d: the turn already ran and was
  billed, so its items are kept even when they cross the bound (by at most one turn's items; the
  next addition is refused). The memory store also bounds all conversations together, in number
  and in the memory each really holds (:meth:`_Record.footprint`: metadata, ids, items as Python
  objects, the containers), in a :class:`~cache.lru.BoundedLRU` whose parts are the tenants: once
  it is full, a tenant above its share (a quarter of the count or of the bytes) loses its own least
  recently used conversations, never those of a tenant within its share. A conversation may hold no
  more than a tenant's share of the bytes (an addition beyond is ``ConversationFull``, like the
  per-conversation bound; a turn's forced append is kept).
* **Ids.** Items keep the id they came with; an id may appear once per conversation
  (:class:`DuplicateItem`). Forced appends skip items whose id is already there.
* **Expiry.** A conversation expires ``ttl_s`` after its last change.

Backend failures are ``cache.response_store.StoreUnavailable`` (a retryable 503), never "not found".
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from cache.footprint import ITEM_OVERHEAD, RECORD_OVERHEAD, deep_size
from cache.lru import BoundedLRU, TenantShared, tenant_of
from cache.response_state import ResponseState

Item = dict[str, Any]
Order = Literal["asc", "desc"]


class ConversationNotFound(LookupError):
    """No such conversation for this tenant (missing, expired, deleted, or another tenant's)."""


class ConversationFull(Exception):
    """An append would take the conversation past ``max_items`` or ``max_bytes``."""


class DuplicateItem(Exception):
    """An item's id is already in the conversation (or twice in one append)."""

    def __init__(self, item_id: str) -> None:
        super().__init__(item_id)
        self.item_id = item_id


class UnknownCursor(LookupError):
    """``after`` names no item of the conversation."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_items: int = 10_000
    max_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    #: bumped by every change to the items; a remembered tip is current only at its revision
    revision: int = 0
    count: int = 0
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class Appended:
    conversation: Conversation
    #: the revision just before this append: equal to the one a turn resolved at when nobody
    #: changed the conversation while the turn ran
    previous_revision: int
    #: what was appended (a forced append skips ids already present)
    items: tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Item]
    has_more: bool


@dataclass(frozen=True, slots=True)
class ConversationRef:
    """The conversation a turn runs on, and the revision whose items it was resolved against."""

    id: str
    revision: int


def item_bytes(item: Item) -> int:
    """What an item counts against a conversation's byte bound: its JSON (as Redis stores it)."""
    return len(orjson.dumps(item))


class ConversationStore(Protocol):
    #: other gateway processes read this store (a client may call any replica next)
    shared: bool
    limits: Limits

    async def create(
        self, conversation_id: str, tenant: str | None, metadata: dict[str, str], items: Sequence[Item]
    ) -> Conversation:
        """A new conversation holding ``items`` (bounded like an append; raises ``ConversationFull``,
        ``DuplicateItem``)."""

    async def get(self, conversation_id: str, tenant: str | None) -> Conversation | None: ...

    async def update(self, conversation_id: str, tenant: str | None, metadata: dict[str, str]) -> Conversation | None:
        """Replace the metadata (the items and the revision are unchanged)."""

    async def delete(self, conversation_id: str, tenant: str | None) -> bool: ...

    async def append(
        self, conversation_id: str, tenant: str | None, items: Sequence[Item], *, force: bool = False
    ) -> Appended:
        """Raises ``ConversationNotFound``; unless ``force``d also ``ConversationFull``, ``DuplicateItem``."""

    async def items(self, conversation_id: str, tenant: str | None) -> tuple[Conversation, list[Item]]:
        """Every item, oldest first, with the conversation at that revision (one consistent read)."""

    async def page(
        self, conversation_id: str, tenant: str | None, *, after: str | None, limit: int, order: Order
    ) -> Page:
        """Up to ``limit`` items after the item ``after`` in ``order``; raises ``UnknownCursor``."""

    async def item(self, conversation_id: str, tenant: str | None, item_id: str) -> Item | None: ...

    async def delete_item(self, conversation_id: str, tenant: str | None, item_id: str) -> Conversation | None:
        """The conversation after the delete; None when it has no such item."""

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Record:
    """One conversation inside the memory store (mutable: the store owns it, nobody else sees it)."""

    tenant: str | None
    created_at: int
    metadata: dict[str, str]
    expires: float
    revision: int = 0
    nbytes: int = 0
    next_seq: int = 0
    #: ascending sequence numbers of the live items (bisect for cursors), and their items
    seqs: list[int] = field(default_factory=list)
    #: sequence -> (item, its JSON bytes (the conversation's bound), its memory (the store's bound))
    by_seq: dict[int, tuple[Item, int, int]] = field(default_factory=dict)
    seq_of: dict[str, int] = field(default_factory=dict)
    #: the memory the items hold (``deep_size`` + ``ITEM_OVERHEAD`` each)
    items_footprint: int = 0

    def footprint(self, conversation_id: str) -> int:
        """What the record costs this process: its items, its metadata, its id and containers."""
        return self.items_footprint + deep_size(self.metadata) + 2 * len(conversation_id) + RECORD_OVERHEAD

    def value(self, conversation_id: str) -> Conversation:
        return Conversation(
            conversation_id, self.created_at, dict(self.metadata), self.revision, len(self.seqs), self.nbytes
        )


Key = tuple[str | None, str]  # (tenant, conversation id)


class MemoryConversationStore(TenantShared):
    """Conversations in this process: LRU + TTL, bounded per conversation, and in number and memory
    in total with each tenant held to its share (module docstring)."""

    shared = False

    def __init__(
        self,
        limits: Limits = Limits(),
        *,
        max_total_bytes: int = 1024 * 1024 * 1024,
        ttl_s: float = 30 * 86400.0,
        max_conversations: int = 1_000_000,
    ) -> None:
        self.limits = limits
        self.max_total_bytes = max_total_bytes
        self.max_conversations = max_conversations
        self.ttl_s = ttl_s
        self._lru: BoundedLRU[Key, _Record] = BoundedLRU(max_conversations, max_total_bytes, part=tenant_of)

    def _find(self, conversation_id: str, tenant: str | None) -> _Record:
        key = (tenant, conversation_id)
        rec = self._lru.peek(key)
        if rec is not None and rec.expires < time.monotonic():
            self._lru.pop(key)
            rec = None
        if rec is None:
            raise ConversationNotFound(conversation_id)
        self._lru.get(key)  # a use: now the most recently used
        return rec

    def _changed(self, conversation_id: str, rec: _Record, *, bump: bool = True, force: bool = False) -> None:
        """After a write: the revision (items changed), the expiry, the charge (the total bounds)."""
        rec.revision += bump
        rec.expires = time.monotonic() + self.ttl_s
        self._charge(conversation_id, rec)

    def _charge(self, conversation_id: str, rec: _Record) -> None:
        """(Re)charge the record its footprint: the total bounds evict others if need be (forced: the
        write was checked against a tenant's share before, or is a turn's own append)."""
        self._lru.put((rec.tenant, conversation_id), rec, rec.footprint(conversation_id), force=True)

    def _fits(self, conversation_id: str, rec: _Record, extra: int) -> bool:
        """Whether the record, grown by ``extra`` bytes of memory, is within a tenant's share."""
        return rec.footprint(conversation_id) + extra <= self._lru.value_limit

    def _sweep(self) -> None:
        """Drop expired conversations from the least recently used end (a create's housekeeping)."""
        now = time.monotonic()
        self._lru.sweep(lambda rec: rec.expires < now)

    async def create(
        self, conversation_id: str, tenant: str | None, metadata: dict[str, str], items: Sequence[Item]
    ) -> Conversation:
        self._sweep()
        rec = _Record(tenant, int(time.time()), dict(metadata), time.monotonic() + self.ttl_s)
        self._add(conversation_id, rec, items, force=False)  # raises before the conversation exists
        self._changed(conversation_id, rec, bump=False)  # a new conversation starts at revision 0
        return rec.value(conversation_id)

    async def get(self, conversation_id: str, tenant: str | None) -> Conversation | None:
        try:
            return self._find(conversation_id, tenant).value(conversation_id)
        except ConversationNotFound:
            return None

    async def update(self, conversation_id: str, tenant: str | None, metadata: dict[str, str]) -> Conversation | None:
        try:
            rec = self._find(conversation_id, tenant)
        except ConversationNotFound:
            return None
        rec.metadata = dict(metadata)
        self._charge(conversation_id, rec)  # new metadata, new footprint; not an item change: same expiry
        return rec.value(conversation_id)

    async def delete(self, conversation_id: str, tenant: str | None) -> bool:
        try:
            self._find(conversation_id, tenant)
        except ConversationNotFound:
            return False
        self._lru.pop((tenant, conversation_id))
        return True

    async def append(
        self, conversation_id: str, tenant: str | None, items: Sequence[Item], *, force: bool = False
    ) -> Appended:
        rec = self._find(conversation_id, tenant)
        before = rec.revision
        added = self._add(conversation_id, rec, items, force=force)
        self._changed(conversation_id, rec)
        return Appended(rec.value(conversation_id), before, added)

    def _add(self, conversation_id: str, rec: _Record, items: Sequence[Item], *, force: bool) -> tuple[Item, ...]:
        """Check then add (nothing is added when a check fails); returns what was added."""
        sizes: list[tuple[Item, int, int]] = []
        seen: set[str] = set()
        for item in items:
            item_id = item["id"]
            if item_id in rec.seq_of or item_id in seen:
                if force:
                    continue
                raise DuplicateItem(item_id)
            seen.add(item_id)
            sizes.append((item, item_bytes(item), deep_size(item) + ITEM_OVERHEAD))
        total = rec.nbytes + sum(n for _, n, _ in sizes)
        if not force and (
            len(rec.seqs) + len(sizes) > self.limits.max_items
            or total > self.limits.max_bytes
            or not self._fits(conversation_id, rec, sum(m for _, _, m in sizes))
        ):
            raise ConversationFull(f"{len(rec.seqs)} items, {rec.nbytes} bytes")
        for item, n, m in sizes:
            seq = rec.next_seq
            rec.next_seq += 1
            rec.seqs.append(seq)
            rec.by_seq[seq] = (item, n, m)
            rec.seq_of[item["id"]] = seq
            rec.items_footprint += m
        rec.nbytes = total
        return tuple(item for item, _, _ in sizes)

    async def items(self, conversation_id: str, tenant: str | None) -> tuple[Conversation, list[Item]]:
        rec = self._find(conversation_id, tenant)
        return rec.value(conversation_id), [rec.by_seq[s][0] for s in rec.seqs]

    async def page(
        self, conversation_id: str, tenant: str | None, *, after: str | None, limit: int, order: Order
    ) -> Page:
        rec = self._find(conversation_id, tenant)
        seqs = rec.seqs
        if after is None:
            lo, hi = 0, len(seqs)
        else:
            at = rec.seq_of.get(after)
            if at is None:
                raise UnknownCursor(after)
            pos = bisect.bisect_left(seqs, at)
            lo, hi = (pos + 1, len(seqs)) if order == "asc" else (0, pos)
        chosen = seqs[lo : min(hi, lo + limit)] if order == "asc" else seqs[max(lo, hi - limit) : hi][::-1]
        return Page([rec.by_seq[s][0] for s in chosen], hi - lo > limit)

    async def item(self, conversation_id: str, tenant: str | None, item_id: str) -> Item | None:
        rec = self._find(conversation_id, tenant)
        seq = rec.seq_of.get(item_id)
        return rec.by_seq[seq][0] if seq is not None else None

    async def delete_item(self, conversation_id: str, tenant: str | None, item_id: str) -> Conversation | None:
        rec = self._find(conversation_id, tenant)
        seq = rec.seq_of.pop(item_id, None)
        if seq is None:
            return None
        del rec.seqs[bisect.bisect_left(rec.seqs, seq)]
        _, n, m = rec.by_seq.pop(seq)
        rec.nbytes -= n
        rec.items_footprint -= m
        self._changed(conversation_id, rec)
        return rec.value(conversation_id)

    async def close(self) -> None:
        while (oldest := self._lru.oldest()) is not None:
            self._lru.pop(oldest[0])


@dataclass(frozen=True, slots=True)
class Tip:
    """This process's last response on a conversation, and the revision the conversation had right
    after that response's items were appended (when its items were exactly the response's context)."""

    state: ResponseState
    revision: int


class ConversationTips(TenantShared):
    """Process-local LRU: conversation id -> :class:`Tip`, bounded by the bytes the states keep alive,
    each tenant (the state's) held to its share (``cache.lru``: a tenant running many conversations
    churns its own tips, not another's).

    A state's ``nbytes`` counts its whole context and tokens; a state that is also a WebSocket
    lane's latest response is counted there too (conservative, like the connection cache).
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, max_entries: int = 65_536) -> None:
        self.max_bytes = max_bytes
        #: conversation id -> the tenant of its tip (the part of its key)
        self._tenant: dict[str, str | None] = {}
        self._lru: BoundedLRU[str, Tip] = BoundedLRU(
            max_entries,
            max_bytes,
            part=self._tenant.__getitem__,
            on_evict=lambda cid, _tip: self._tenant.pop(cid, None),
        )

    def get(self, conversation_id: str) -> Tip | None:
        tip: Tip | None = self._lru.get(conversation_id)
        return tip

    def put(self, conversation_id: str, tip: Tip) -> None:
        self.discard(conversation_id)
        self._tenant[conversation_id] = tip.state.tenant
        if not self._lru.put(conversation_id, tip, tip.state.nbytes + RECORD_OVERHEAD):
            del self._tenant[conversation_id]

    def discard(self, conversation_id: str) -> None:
        if conversation_id in self._tenant:
            self._lru.pop(conversation_id)
            del self._tenant[conversation_id]

    def clear(self) -> None:
        for conversation_id in list(self._tenant):
            self.discard(conversation_id)
