"""The prefix cache on ``BoundedLRU`` (issue 29 item 3) evicts what it evicted before: the same
chains, in the same order, for the same bytes. The oracle is the cache's logic before the move
(commit dcd7a88's ``cache/prefix_cache.py``), kept here small: chains least recently used first, per
tenant and overall; a retry (the same input again) recharges the old chain in place, leaving its
place in the order."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from cache.prefix_cache import Chain, PrefixCache
from cache.seq import TokenSeq

TENANTS = ("a", "b", None)
KEYS = [bytes([i]) for i in range(10)]


class _OldPrefixCache:
    """The eviction logic of the prefix cache before it sat on ``BoundedLRU`` (the oracle)."""

    def __init__(self, max_bytes: int, tenant_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.tenant_bytes = min(tenant_bytes, max_bytes)
        self.chains: OrderedDict[Chain, None] = OrderedDict()
        self.tenant_chains: dict[str, OrderedDict[Chain, None]] = {}
        self.held: dict[tuple[str, bytes], Chain] = {}
        self.nbytes = 0
        self.tenant_bytes_held: dict[str, int] = {}
        self.evictions = 0

    def put(self, tenant: str | None, key: bytes, ids: TokenSeq, near: Chain | None) -> Chain | None:
        name = "" if tenant is None else tenant
        old = self.held.pop((name, key), None)
        if old is not None:
            old.keys.discard(key)
            if old.keys:
                self._recharge(old)
            else:
                self._forget(old)
        mine = self.tenant_chains.setdefault(name, OrderedDict())
        chain = (
            near
            if (near is not None and near.tenant == name and near in mine and ids.shares_prefix_with(near.view))
            else None
        )
        if chain is None:
            chain = Chain(name, ids)
            mine[chain] = self.chains[chain] = None
        elif len(ids) > len(chain.view):
            chain.view = ids
        self.held[(name, key)] = chain
        chain.keys.add(key)
        self._recharge(chain)
        mine.move_to_end(chain)
        self.chains.move_to_end(chain)
        while self.tenant_bytes_held.get(name, 0) > self.tenant_bytes and mine:
            self._evict(next(iter(mine)))
        while self.nbytes > self.max_bytes and self.chains:
            self._evict(next(iter(self.chains)))
        return chain if self.held.get((name, key)) is chain else None

    def touch(self, chain: Chain) -> None:
        mine = self.tenant_chains.get(chain.tenant)
        if mine is not None and chain in mine:
            mine.move_to_end(chain)
            self.chains.move_to_end(chain)

    def _recharge(self, chain: Chain) -> None:
        delta = chain.charge() - chain.nbytes
        chain.nbytes += delta
        self.nbytes += delta
        self.tenant_bytes_held[chain.tenant] = self.tenant_bytes_held.get(chain.tenant, 0) + delta

    def _forget(self, chain: Chain) -> None:
        self.nbytes -= chain.nbytes
        self.tenant_bytes_held[chain.tenant] -= chain.nbytes
        chain.nbytes = 0
        self.tenant_chains[chain.tenant].pop(chain, None)
        self.chains.pop(chain, None)
        if not self.tenant_chains[chain.tenant]:
            del self.tenant_chains[chain.tenant]

    def _evict(self, chain: Chain) -> None:
        for key in chain.keys:
            del self.held[(chain.tenant, key)]
        chain.keys.clear()
        self._forget(chain)
        self.evictions += 1


def _held(cache: PrefixCache) -> set[tuple[str, bytes]]:
    return {("" if t is None else t, k) for t in TENANTS for k in KEYS if cache.get(t, k) is not None}


@pytest.mark.parametrize("seed", range(8))
def test_the_prefix_cache_evicts_as_before_under_random_turns_and_retries(seed: int) -> None:
    """Random turns of three tenants (new chains, continuations of a held entry, retries of an input
    already held, uses): after each, both hold the same entries and charge the same bytes."""
    rnd = random.Random(seed)
    max_bytes, tenant_bytes = rnd.choice([4_000, 8_000, 20_000]), rnd.choice([3_000, 8_000, 30_000])
    new, old = PrefixCache(max_bytes, tenant_bytes), _OldPrefixCache(max_bytes, tenant_bytes)
    mine: dict[tuple[str | None, bytes], tuple[TokenSeq, Chain]] = {}
    theirs: dict[tuple[str | None, bytes], tuple[TokenSeq, Chain]] = {}
    for step in range(300):
        tenant, key, near_key = rnd.choice(TENANTS), rnd.choice(KEYS), rnd.choice(KEYS)
        if rnd.random() < 0.7:
            tokens = [rnd.randrange(1_000) for _ in range(rnd.randrange(1, 400))]
            continued = step % 3 != 0 and (tenant, near_key) in theirs
            for side in (mine, theirs):
                base = side.get((tenant, near_key)) if continued else None
                ids = base[0].extend(tokens) if base is not None else TokenSeq(tokens)
                near = base[1] if base is not None else None
                if side is mine:
                    entry = new.put(tenant, key, ids, len(ids), 0, False, near=near)
                    kept = None if entry is None else entry.chain
                else:
                    kept = old.put(tenant, key, ids, near)
                if kept is not None:
                    side[(tenant, key)] = (ids, kept)
        else:
            entry = new.get(tenant, near_key)
            if entry is not None:
                new.touch(entry)
            hit = theirs.get((tenant, near_key))
            if hit is not None:
                old.touch(hit[1])
        held = _held(new)
        assert held == set(old.held), (step, sorted(held ^ set(old.held), key=str))
        assert (new.nbytes, new.evictions, len(new)) == (old.nbytes, old.evictions, len(old.held)), step
        for t in TENANTS:
            assert new.tenant_nbytes(t) == old.tenant_bytes_held.get("" if t is None else t, 0), step
        for side in (mine, theirs):
            for k in [k for k in side if ("" if k[0] is None else k[0], k[1]) not in held]:
                del side[k]


def test_a_retried_key_leaves_its_old_chain_where_it_was_in_the_order() -> None:
    """The review's case: chain X holds x1 and x2, chain Y is newer; x2 comes again on a fresh chain
    (a retry), which shrinks X — and X, still the oldest, is what the next overflow takes, not Y."""
    cache = PrefixCache(max_bytes=10_000, tenant_bytes=10_000)
    x1 = cache.put("t", b"x1", TokenSeq(range(500)), 500, 0, False)
    assert x1 is not None
    cache.put("t", b"x2", x1.ids.extend(range(500, 600)), 600, 0, False, near=x1.chain)
    cache.put("t", b"y", TokenSeq(range(1000, 1500)), 500, 0, False)
    cache.put("t", b"x2", TokenSeq(range(2000, 2500)), 500, 0, False)
    cache.put("t", b"w", TokenSeq(range(3000, 4000)), 1000, 0, False)
    assert [k for k in (b"x1", b"y", b"x2", b"w") if cache.get("t", k) is not None] == [b"y", b"x2", b"w"]
