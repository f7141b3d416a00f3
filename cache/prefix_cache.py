"""Rendered prefixes of full-history conversations, per tenant, bounded in bytes, least recently used out.

A client that keeps the conversation itself and sends all of it every turn (Codex's HTTP transport,
the AI SDK with ``store: false``) gives the gateway no ``previous_response_id`` to append to. What
it can find instead is the longest prefix of the request it already rendered for that tenant: the
gateway (``gateway.turn.prefix``) names each prefix by a digest and keeps, under the digest of each
turn's whole input, the token view the turn left behind. This module is only the bounded map; it
knows nothing of items, renderers or digests beyond their bytes ("cache stores token ids but knows
nothing of renderers", DESIGN.md).

**Bytes, by buffer.** The entries of one conversation share one append-only token buffer (turn N+1
extended turn N's view in place, ``cache.seq``), so charging each entry its whole length would
count a 40-turn conversation forty times. Entries are grouped into *chains* — the entries whose views
read one buffer (``TokenSeq.shares_prefix_with``) — and a chain is charged its longest view plus a
fixed overhead per entry. Evicting one entry of a live chain frees no tokens (the others hold the
buffer), so the unit of eviction is the chain: the least recently used chain of the tenant goes when
the tenant is over ``tenant_bytes``, the least recently used chain of any tenant when the total is
over ``max_bytes``. A chain larger than the tenant's budget is not kept at all.

**Tenants never meet.** Each tenant has its own map; a lookup reads only the caller's. (The gateway
also seeds every digest with the tenant, so even equal digests could not name the same prefix.)

**Threads.** Lookups run in the prepare pool for big requests while the event loop inserts: reads
are single dict operations (atomic under the GIL), every change holds one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable

import msgspec

from cache.seq import TokenSeq

#: bytes charged per token id: the packed buffer's item size where ``TokenSeq`` has one, else a
#: list slot (the figure the rest of the gateway charges for list-backed views)
TOKEN_BYTES: int = getattr(TokenSeq, "itemsize", 8)
#: bytes charged per entry for its key, record and map slots
ENTRY_BYTES = 256


class Chain:
    """The entries of one token buffer, and what they are charged (see the module docstring)."""

    __slots__ = ("tenant", "view", "keys", "nbytes")

    def __init__(self, tenant: str, view: TokenSeq) -> None:
        self.tenant = tenant
        self.view = view          # the longest view of the buffer an entry holds
        self.keys: set[bytes] = set()
        self.nbytes = 0

    def charge(self) -> int:
        return len(self.view) * TOKEN_BYTES + ENTRY_BYTES * len(self.keys)


class CachedPrefix(msgspec.Struct, frozen=True):
    """What one turn of a full-history conversation left: its prompt and what followed it.

    ``ids[:prompt_len]`` is the rendering of the turn's input (prelude + items, no generation
    prompt); ``ids[prompt_len:]`` is what the turn appended after it (the generation prompt and the
    model's sampled tokens), produced as ``outputs`` output items."""

    ids: TokenSeq
    prompt_len: int
    outputs: int
    #: some item of the turn's input, or of a prefix it continued, was flagged by a classifier
    flagged: bool
    chain: Chain
    #: the root response of the turn's chain (its engine requests' routing: ``ResponseState.root``)
    root_id: str | None = None


class _Tenant:
    __slots__ = ("entries", "chains", "nbytes")

    def __init__(self) -> None:
        self.entries: dict[bytes, CachedPrefix] = {}
        self.chains: OrderedDict[Chain, None] = OrderedDict()
        self.nbytes = 0


class PrefixCache:
    def __init__(self, max_bytes: int, tenant_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.tenant_bytes = min(tenant_bytes, max_bytes)
        self._tenants: dict[str, _Tenant] = {}
        self._chains: OrderedDict[Chain, None] = OrderedDict()  # every tenant's, least recently used first
        self._lock = threading.Lock()
        self.nbytes = 0
        self.entries = 0
        #: chains dropped by a byte bound (counted once per chain)
        self.evictions = 0

    @staticmethod
    def _tenant_key(tenant: Hashable | None) -> str:
        return "" if tenant is None else str(tenant)

    def get(self, tenant: str | None, key: bytes) -> CachedPrefix | None:
        """The entry under ``key`` for ``tenant`` (no recency change: see :meth:`touch`)."""
        t = self._tenants.get(self._tenant_key(tenant))
        return None if t is None else t.entries.get(key)

    def touch(self, entry: CachedPrefix) -> None:
        """``entry`` was used: its chain becomes the most recently used."""
        with self._lock:
            t = self._tenants.get(entry.chain.tenant)
            if t is not None and entry.chain in t.chains:
                t.chains.move_to_end(entry.chain)
                self._chains.move_to_end(entry.chain)

    def put(self, tenant: str | None, key: bytes, ids: TokenSeq, prompt_len: int, outputs: int, flagged: bool,
            near: Chain | None = None, root_id: str | None = None) -> CachedPrefix | None:
        """Keep ``ids`` under ``key``; ``near`` is the chain the turn continued from (the entry joins
        it when it reads the same buffer). Returns the entry, or None when it was evicted at once
        (larger than the tenant's budget)."""
        name = self._tenant_key(tenant)
        with self._lock:
            t = self._tenants.get(name)
            old = t.entries.pop(key, None) if t is not None else None
            if t is not None and old is not None:
                self._drop_key(t, old.chain, key)  # the same input again (a retry): the newer turn wins
            t = self._tenants.get(name)
            if t is None:
                t = self._tenants[name] = _Tenant()
            chain = near if (near is not None and near.tenant == name and near in t.chains
                             and ids.shares_prefix_with(near.view)) else None
            if chain is None:
                chain = Chain(name, ids)
                t.chains[chain] = None
                self._chains[chain] = None
            elif len(ids) > len(chain.view):
                chain.view = ids
            entry = CachedPrefix(ids, prompt_len, outputs, flagged, chain, root_id)
            t.entries[key] = entry
            chain.keys.add(key)
            self.entries += 1
            self._recharge(t, chain)
            t.chains.move_to_end(chain)
            self._chains.move_to_end(chain)
            while t.nbytes > self.tenant_bytes and t.chains:
                self._evict(next(iter(t.chains)))
            while self.nbytes > self.max_bytes and self._chains:
                self._evict(next(iter(self._chains)))
            return entry if t.entries.get(key) is entry else None

    def tenant_nbytes(self, tenant: str | None) -> int:
        t = self._tenants.get(self._tenant_key(tenant))
        return 0 if t is None else t.nbytes

    def __len__(self) -> int:
        return self.entries

    # -- under the lock ---------------------------------------------------------------------------

    def _recharge(self, t: _Tenant, chain: Chain) -> None:
        new = chain.charge()
        delta = new - chain.nbytes
        chain.nbytes = new
        t.nbytes += delta
        self.nbytes += delta

    def _drop_key(self, t: _Tenant, chain: Chain, key: bytes) -> None:
        chain.keys.discard(key)
        self.entries -= 1
        if chain.keys:
            self._recharge(t, chain)
        else:
            self._forget(t, chain)

    def _forget(self, t: _Tenant, chain: Chain) -> None:
        t.nbytes -= chain.nbytes
        self.nbytes -= chain.nbytes
        chain.nbytes = 0
        t.chains.pop(chain, None)
        self._chains.pop(chain, None)
        if not t.chains:
            self._tenants.pop(chain.tenant, None)

    def _evict(self, chain: Chain) -> None:
        t = self._tenants[chain.tenant]
        for key in chain.keys:
            del t.entries[key]
        self.entries -= len(chain.keys)
        chain.keys.clear()
        self._forget(t, chain)
        self.evictions += 1
