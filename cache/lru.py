"""A least-recently-used map bounded by entries and by bytes, for values built from request content.

Why one type: the gateway keeps several small caches of things a turn would otherwise rebuild
from what the client re-sends every turn (structured-output constraints, the echoed tool list) —
each keyed by a digest of that content, each charged by the bytes its value holds, each shared by
the event loop and the prepare pool's threads. The bounds are the defence: a client decides what
goes in, so the number of entries *and* their bytes are capped, and one value above a quarter of
the byte budget is never kept (it would evict the rest for one client's sake; it is rebuilt each
time instead). Two threads missing the same key both build it; the second put replaces the first
with an equal value.

**Shares.** A cache that several tenants fill (``part`` names the tenant of a key) holds each
tenant to its ``share`` of the bounds whenever another tenant needs the room. Once the map is full,
a put evicts from the part furthest over its share (of the entries or of the bytes), its least
recently used entry; only when no part is over its share does it evict the least recently used
entry of all, as a plain LRU does. Room nobody else uses is not wasted — a lone tenant still has
the whole map — but a tenant within its share never loses an entry while another is over it, and
two tenants that both want more end up with equal shares. So a client that floods the cache with
distinct content (an attacker, or a runaway agent) churns its own entries, and gives back what it
took above its share as soon as another tenant puts. Fewer than ``2 / share`` parts can be over
their share at once (over on entries or over on bytes), so finding the furthest over is a scan of a
handful.

**Records, not only caches.** The stores that hold what clients wrote (stored responses,
conversations, background event logs) use the same map: ``on_evict`` hears of every entry the
bounds drop (a store keeps an index consistent with it), ``pop``/``peek``/``oldest`` serve deletes,
reads that must not count as a use, and expiry (``sweep``); ``evict_one`` lets an owner whose other
memory grew (a running log) give room back by the same shares, that memory counted in its tenant's;
``force`` keeps a value the owner may not refuse (a turn's own conversation items, already billed;
a finished log, already counted while it ran) — above the per-value cap if need be, never evicting
that value itself to make room.

**Counts only.** A memo whose values are small and few (a renderer's rendered preludes, the
simulated engine's remembered sequences) passes no byte bound (``max_bytes=None``) and no charge:
it is bounded by its entries alone, as ``functools.lru_cache`` is, but keyed by what its owner
chooses and shared by threads under one lock.

**Who may import it.** It knows nothing of requests, tenants or stores — only keys, values and
charges — so it is one of the small shared utilities of ``cache/`` that the other rooms may import
(as ``billing`` imports ``cache.redis_client``): ``inference/`` keeps its renderers' and the
simulated engine's memos in it (DESIGN.md, "Layout"). Every bounded map of the product uses it;
where its bound is set is the owner's constructor, from a ``gateway/base/settings.py`` field where
operators may change it.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

__all__ = ["BoundedLRU", "LRUOwner", "NO_PART", "TenantShared", "tenant_of"]

#: the part of a ``(tenant, ...)`` key: its tenant (how the gateway's per-tenant caches key)
tenant_of = operator.itemgetter(0)

#: ``evict_one``'s "no part preferred" (None is a part: the tenant of an unauthenticated gateway)
NO_PART: Hashable = object()


class _Part:
    """One part's entries, least recently used first, and the bytes they are charged."""

    __slots__ = ("keys", "nbytes")

    def __init__(self) -> None:
        self.keys: OrderedDict[Any, None] = OrderedDict()
        self.nbytes = 0


class BoundedLRU(Generic[K, V]):
    def __init__(
        self,
        max_entries: int,
        max_bytes: int | None = None,
        *,
        part: Callable[[K], Hashable] | None = None,
        share: float = 0.25,
        on_evict: Callable[[K, V], object] | None = None,
    ) -> None:
        """``max_bytes``: None bounds the entries only (*Counts only*). ``part``: the part (tenant) a
        key belongs to, for the shares (module docstring); None: one map, no shares. ``share``: the
        fraction of both bounds past which a part gives entries back. ``on_evict``: called (outside
        the lock) with each entry the bounds drop; what it returns is ignored (a ``dict.pop`` will do)."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share!r}")
        if max_bytes is None:
            max_bytes = sys.maxsize
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        #: bytes charged by the entries held
        self.nbytes = 0
        #: lookups that found their key / did not (tests, notes and metrics read them)
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._part = part
        self._parts: dict[Hashable, _Part] = {}
        #: the parts holding more than their share of the entries or of the bytes
        self._over: set[Hashable] = set()
        self._share_entries = max(1, int(max_entries * share))
        self._share_bytes = int(max_bytes * share)
        self._on_evict = on_evict
        #: entries the bounds dropped (a count for metrics and tests)
        self.evictions = 0

    @property
    def value_limit(self) -> int:
        """The largest charge a put keeps without ``force``."""
        return min(self.max_bytes // 4, self._share_bytes) if self._part is not None else self.max_bytes // 4

    def get(self, key: K, default: Any = None) -> Any:
        """The value under ``key`` (now the most recently used), or ``default`` (counted as a miss;
        pass a sentinel when None is a value worth keeping)."""
        with self._lock:  # _use written out: a get per turn or more (a call less)
            hit = self._entries.get(key)
            if hit is None:
                self.misses += 1
                return default
            self._entries.move_to_end(key)
            if self._part is not None:
                self._parts[self._part(key)].keys.move_to_end(key)
            self.hits += 1
            return hit[0]

    def get_many(self, keys: Iterable[K]) -> list[Any]:
        """:meth:`get` for each key (None where missing), under one lock: a full-history request
        looks up every item it re-sends."""
        with self._lock:
            return [self._use(key, None) for key in keys]

    def _use(self, key: K, default: Any) -> Any:
        """``get`` with the lock held."""
        hit = self._entries.get(key)
        if hit is None:
            self.misses += 1
            return default
        self._entries.move_to_end(key)
        if self._part is not None:
            self._parts[self._part(key)].keys.move_to_end(key)
        self.hits += 1
        return hit[0]

    def put(self, key: K, value: V, nbytes: int = 0, *, force: bool = False) -> bool:
        """Keep ``value`` charged ``nbytes``, evicting beyond the bounds (the least recently used, or
        with parts, see *Shares*); False (nothing kept, an entry already under ``key`` stays) when it
        alone is above a quarter of the byte budget, or above its part's share of it — unless
        ``force``d: then it is kept, and the others make room (while any other is left)."""
        if not force and nbytes > self.value_limit:
            return False
        part = self._part
        name = part(key) if part is not None else None  # before any change: it may raise
        entries = self._entries
        with self._lock:
            old = entries.pop(key, None)
            entries[key] = (value, nbytes)
            total = self.nbytes + nbytes if old is None else self.nbytes + nbytes - old[1]
            self.nbytes = total
            if part is not None:
                if old is None:
                    mine = self._parts.get(name)
                    if mine is None:
                        mine = self._parts[name] = _Part()
                    mine.keys[key] = None  # a new key: it goes in last
                    mine.nbytes += nbytes
                else:  # a held key: its part holds it
                    mine = self._parts[name]
                    mine.keys.move_to_end(key)
                    mine.nbytes += nbytes - old[1]
                if len(mine.keys) > self._share_entries or mine.nbytes > self._share_bytes:  # _reckon, inline
                    self._over.add(name)
                else:
                    self._over.discard(name)
            if total <= self.max_bytes and len(entries) <= self.max_entries:
                return True  # nothing to evict (every turn's finalize): no list, no _evicted call
            evicted: list[tuple[K, V]] = []
            protect = key if force else None
            while (len(self._entries) > self.max_entries or self.nbytes > self.max_bytes) and (
                protect is None or len(self._entries) > 1
            ):
                victim = self._victim(protect)
                evicted.append((victim, self._evict(victim)))
        self._evicted(evicted)
        return True

    def evict_one(
        self, prefer: Hashable = NO_PART, *, outside: Mapping[Any, int] | None = None, protect: K | None = None
    ) -> bool:
        """Drop the least recently used entry of part ``prefer`` when it has one; else, without
        ``outside``, the entry a put would evict next (see *Shares*); False when nothing was dropped.
        For an owner whose memory outside the map grew (a running event log of part ``prefer``) and
        must be given back fairly. ``outside``: the bytes each part holds beyond the map (the owner's
        running logs); with it, a part that has no entry of its own takes only from a part over its
        share counting those bytes, and nothing (False) while none is: a part within its share never
        pays for another's memory outside the map. ``protect``: a key never dropped (the entry the
        owner just wrote: its room is what is being made), as a forced put's own; False when it is
        the only candidate."""
        with self._lock:
            mine = self._parts.get(prefer) if prefer is not NO_PART else None
            victim = self._first(mine.keys, protect) if mine is not None else None
            if victim is None:
                if outside is None:
                    if len(self._entries) > (1 if protect is not None and protect in self._entries else 0):
                        victim = self._victim(protect)
                else:
                    name = self._furthest_over(outside, protect)
                    if name is not None:
                        victim = self._first(self._parts[name].keys, protect)
            if victim is None:
                return False
            evicted = [(victim, self._evict(victim))]
        self._evicted(evicted)
        return True

    @staticmethod
    def _first(keys: Iterable[Any], protect: Any) -> Any:
        """The first of ``keys`` (least recently used first) that is not ``protect``, or None."""
        for key in keys:
            if protect is None or key != protect:
                return key
        return None

    def _furthest_over(self, outside: Mapping[Any, int], protect: Any = None) -> Hashable | None:
        """The part holding an entry (other than ``protect``) that is furthest over its share, its
        ``outside`` bytes counted (the lock is held); None when no such part is over. A scan of the
        parts over on their own and of those ``outside`` names (the owner's running logs: a handful
        per tenant)."""
        best, score = None, 1.0
        for name in self._over | outside.keys():
            part = self._parts.get(name)
            if part is None or (protect is not None and len(part.keys) == 1 and protect in part.keys):
                continue
            mine = max(
                len(part.keys) / self._share_entries, (part.nbytes + outside.get(name, 0)) / max(1, self._share_bytes)
            )
            if mine > score:
                best, score = name, mine
        return best

    def recharge(self, key: K, nbytes: int) -> bool:
        """Charge the entry under ``key`` ``nbytes`` instead, its place in the order unchanged (not a
        use): an owner whose value shrank or grew in place (a prefix chain that lost a key) keeps the
        bounds' sums true without making it the most recently used. A growth beyond the bounds evicts
        others as a forced put does, never ``key`` itself; False (nothing changed) when ``key`` is not
        held."""
        name = self._part(key) if self._part is not None else None
        evicted: list[tuple[K, V]] = []
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return False
            delta = nbytes - hit[1]
            self._entries[key] = (hit[0], nbytes)  # an existing key: its place stays
            self.nbytes += delta
            if self._part is not None:
                part = self._parts[name]
                part.nbytes += delta
                self._reckon(name, part)
            while (len(self._entries) > self.max_entries or self.nbytes > self.max_bytes) and len(self._entries) > 1:
                victim = self._victim(key)
                evicted.append((victim, self._evict(victim)))
        self._evicted(evicted)
        return True

    def sweep(self, expired: Callable[[V], bool], limit: int | None = 8) -> list[tuple[K, V]]:
        """Remove entries from the least recently used end while ``expired(value)`` says so, at most
        ``limit`` of them (None: no limit), and return them: the stores' expiry housekeeping, one
        loop for all (a store whose order is the expiry order passes no limit; one whose reads reorder
        bounds each write's share of the work). Not evictions: ``on_evict`` is not called, the owner
        tidies up after what it gets back."""
        gone: list[tuple[K, V]] = []
        with self._lock:
            for key, (value, _) in self._entries.items():
                if (limit is not None and len(gone) >= limit) or not expired(value):
                    break
                gone.append((key, value))
            for key, _ in gone:
                self._evict(key)
        return gone

    def _evicted(self, evicted: list[tuple[K, V]]) -> None:
        self.evictions += len(evicted)
        if self._on_evict is not None:
            for key, value in evicted:
                self._on_evict(key, value)

    def pop(self, key: K, default: Any = None) -> Any:
        """Remove ``key`` and return its value (``default`` when missing); not an eviction."""
        with self._lock:
            if key not in self._entries:
                return default
            return self._evict(key)

    def clear(self) -> None:
        """Drop every entry (the owner is closing); not evictions: ``on_evict`` is not called."""
        with self._lock:
            self._entries.clear()
            self._parts.clear()
            self._over.clear()
            self.nbytes = 0

    def peek(self, key: K, default: Any = None) -> Any:
        """The value under ``key`` without using it (the order stays; neither a hit nor a miss)."""
        hit = self._entries.get(key)
        return default if hit is None else hit[0]

    def oldest(self) -> tuple[K, V] | None:
        """The least recently used entry (without using it), or None."""
        with self._lock:
            for key, (value, _) in self._entries.items():
                return key, value
        return None

    def _victim(self, protect: K | None) -> K:
        """The key a put evicts next (the lock is held): see *Shares* in the module docstring; never
        ``protect`` (a forced put's own key; the caller keeps at least two entries then)."""
        parts = self._parts
        over = [
            n for n in self._over if not (protect is not None and len(parts[n].keys) == 1 and protect in parts[n].keys)
        ]
        if over:
            name = max(
                over,
                key=lambda n: max(
                    len(parts[n].keys) / self._share_entries, parts[n].nbytes / max(1, self._share_bytes)
                ),
            )
            for key in parts[name].keys:
                if key != protect:
                    return key
        for key in self._entries:
            if key != protect:
                return key
        raise AssertionError("no entry to evict")

    def _reckon(self, name: Hashable, part: _Part) -> None:
        if len(part.keys) > self._share_entries or part.nbytes > self._share_bytes:
            self._over.add(name)
        else:
            self._over.discard(name)

    def _evict(self, key: K) -> V:
        """Drop ``key`` (held; the lock is held) from the map and from its part; its value."""
        value, size = self._entries.pop(key)
        self.nbytes -= size
        if self._part is None:
            return value
        name = self._part(key)
        part = self._parts[name]
        del part.keys[key]
        part.nbytes -= size
        if part.keys:
            self._reckon(name, part)
        else:
            del self._parts[name]
            self._over.discard(name)
        return value

    def part_usage(self, part: Hashable) -> tuple[int, int]:
        """The entries and bytes ``part`` holds (tests and notes read it)."""
        p = self._parts.get(part)
        return (0, 0) if p is None else (len(p.keys), p.nbytes)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held; neither a use (the order stays) nor a hit or a miss."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def values(self) -> Iterator[V]:
        """The values held, least recently used first (a snapshot)."""
        with self._lock:
            return iter([v for v, _ in self._entries.values()])


class LRUOwner:
    """What an owner of one :class:`BoundedLRU` (``self._lru``) tells of itself: how many entries
    and bytes it holds, and how many the bounds have pushed out (metrics, tests and notes read
    them)."""

    _lru: BoundedLRU[Any, Any]

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        """The memory charged for every record held (the byte bound's measure)."""
        return self._lru.nbytes

    @property
    def evictions(self) -> int:
        return self._lru.evictions


class TenantShared(LRUOwner):
    """A store kept in one :class:`BoundedLRU` whose parts are the tenants: :class:`LRUOwner`, and
    what each tenant holds."""

    def tenant_usage(self, tenant: str | None) -> tuple[int, int]:
        """The records and bytes ``tenant`` holds."""
        return self._lru.part_usage(tenant)
