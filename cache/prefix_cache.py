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

**Tenants never meet.** A lookup reads only the caller's entries. (The gateway also seeds every
digest with the tenant, so even equal digests could not name the same prefix.)

**One LRU.** The chains are the entries of a :class:`~cache.lru.BoundedLRU` whose parts are the
tenants, each charged as above: ``tenant_bytes`` is a hard cap (the tenant's own least recently used
chains go first, as its share of the map) and ``max_bytes`` the map's bound. A chain is put
``force``d — kept whatever its size, then trimmed by the tenant's cap — so "larger than the tenant's
budget" is decided in one place, the cap.

**Threads.** Lookups run in the prepare pool for big requests while the event loop inserts: reads
are single dict operations (atomic under the GIL), every change holds one lock.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections.abc import Hashable

import msgspec

from cache.lru import BoundedLRU
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
        self.view = view  # the longest view of the buffer an entry holds
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


class PrefixCache:
    def __init__(self, max_bytes: int, tenant_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.tenant_bytes = min(tenant_bytes, max_bytes)
        # a tenant's share of the map is its cap (+ half a byte: the float product rounds down)
        share = min(1.0, (self.tenant_bytes + 0.5) / max(1, max_bytes))
        self._chains: BoundedLRU[Chain, Chain] = BoundedLRU(
            sys.maxsize, max_bytes, part=operator.attrgetter("tenant"), share=share, on_evict=self._evicted
        )
        #: (tenant, key) -> entry, for every chain held
        self._entries: dict[tuple[str, bytes], CachedPrefix] = {}
        self._lock = threading.Lock()
        self.entries = 0
        #: new chains above a tenant's cap, never put (evictions too: what the bound dropped)
        self._refused = 0

    @property
    def nbytes(self) -> int:
        return self._chains.nbytes

    @property
    def evictions(self) -> int:
        """Chains dropped by a byte bound (counted once per chain)."""
        return self._chains.evictions + self._refused

    @staticmethod
    def _tenant_key(tenant: Hashable | None) -> str:
        return "" if tenant is None else str(tenant)

    def get(self, tenant: str | None, key: bytes) -> CachedPrefix | None:
        """The entry under ``key`` for ``tenant`` (no recency change: see :meth:`touch`)."""
        return self._entries.get((self._tenant_key(tenant), key))

    def touch(self, entry: CachedPrefix) -> None:
        """``entry`` was used: its chain becomes the most recently used."""
        with self._lock:
            if entry.chain in self._chains:
                self._chains.get(entry.chain)

    def put(
        self,
        tenant: str | None,
        key: bytes,
        ids: TokenSeq,
        prompt_len: int,
        outputs: int,
        flagged: bool,
        near: Chain | None = None,
        root_id: str | None = None,
    ) -> CachedPrefix | None:
        """Keep ``ids`` under ``key``; ``near`` is the chain the turn continued from (the entry joins
        it when it reads the same buffer). Returns the entry, or None when it was evicted at once
        (larger than the tenant's budget)."""
        name = self._tenant_key(tenant)
        with self._lock:
            old = self._entries.pop((name, key), None)
            if old is not None:
                self._drop_key(old.chain, key)  # the same input again (a retry): the newer turn wins
            chain = (
                near
                if (
                    near is not None
                    and near.tenant == name
                    and near in self._chains
                    and ids.shares_prefix_with(near.view)
                )
                else None
            )
            if chain is None:
                chain = Chain(name, ids)
            elif len(ids) > len(chain.view):
                chain.view = ids
            entry = CachedPrefix(ids, prompt_len, outputs, flagged, chain, root_id)
            self._entries[(name, key)] = entry
            chain.keys.add(key)
            self.entries += 1
            self._keep(name, chain)
            return entry if self._entries.get((name, key)) is entry else None

    def tenant_nbytes(self, tenant: str | None) -> int:
        return self._chains.part_usage(self._tenant_key(tenant))[1]

    def __len__(self) -> int:
        return self.entries

    # -- under the lock ---------------------------------------------------------------------------

    def _keep(self, name: str, chain: Chain) -> None:
        """Charge ``chain`` anew as the tenant's most recently used: the tenant's least recently used
        chains go while it would be over its cap, then the map's bound evicts across tenants (as a
        plain LRU: no tenant is over its share then). A chain above the cap alone goes too, after
        every other chain of its tenant (it was the most recently used)."""
        charge = chain.charge()
        # chain.nbytes: its charge while the map holds it, 0 once it is out (_charge, _drop_key, _evicted)
        mine = chain.nbytes
        if charge <= self.tenant_bytes and self._chains.part_usage(name)[1] - mine + charge <= self.tenant_bytes:
            self._charge(chain, charge)  # within the cap (every turn): the put alone makes it the most recently used
            return
        held = chain in self._chains
        if held:
            self._chains.get(chain)
        while self._chains.part_usage(name)[1] - mine + charge > self.tenant_bytes:
            if self._chains.part_usage(name)[0] <= held or not self._chains.evict_one(name):
                break
        if charge <= self.tenant_bytes:
            self._charge(chain, charge)
        elif held:
            self._chains.evict_one(name)
        else:
            self._evicted(chain, chain)
            self._refused += 1

    def _charge(self, chain: Chain, charge: int) -> None:
        """(Re)put ``chain`` at its ``charge`` (``chain.charge()``), the most recently used: kept
        whatever its size (the tenant's cap decides), the map's bound evicting others."""
        chain.nbytes = charge
        self._chains.put(chain, chain, chain.nbytes, force=True)

    def _drop_key(self, chain: Chain, key: bytes) -> None:
        chain.keys.discard(key)
        self.entries -= 1
        if chain.keys:
            chain.nbytes = chain.charge()  # smaller now; its place in the order stays
            self._chains.recharge(chain, chain.nbytes)
        else:
            self._chains.pop(chain)
            chain.nbytes = 0

    def _evicted(self, chain: Chain, _: Chain) -> None:
        """A byte bound dropped ``chain``: its entries go with it."""
        for key in chain.keys:
            del self._entries[(chain.tenant, key)]
        self.entries -= len(chain.keys)
        chain.keys.clear()
        chain.nbytes = 0
