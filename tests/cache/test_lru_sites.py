"""The bounded maps that moved onto ``cache.lru.BoundedLRU`` (issue 29 item 3) answer as before, and
give tenants the shares they did not have: one tenant's flood does not evict another's entries."""

from __future__ import annotations

from cache.prefix_cache import ENTRY_BYTES, TOKEN_BYTES, PrefixCache
from cache.redis_response_store import TokenCache
from cache.seq import TokenSeq


def _chain_bytes(tokens: int) -> int:
    return tokens * TOKEN_BYTES + ENTRY_BYTES


def test_prefix_cache_a_chain_above_its_tenants_cap_takes_nothing_from_another_tenant():
    """The cap is decided before the map's bound: a full map does not make room for a chain its own
    tenant's cap refuses (a forced put alone would have evicted the other tenant's chain first)."""
    cache = PrefixCache(max_bytes=_chain_bytes(100) * 2, tenant_bytes=_chain_bytes(150))
    assert cache.put("a", b"a", TokenSeq(list(range(100))), 100, 0, False) is not None
    assert cache.put("b", b"b", TokenSeq(list(range(100))), 100, 0, False) is not None
    assert cache.put("b", b"big", TokenSeq(list(range(160))), 160, 0, False) is None
    assert cache.get("a", b"a") is not None and cache.tenant_nbytes("a") == _chain_bytes(100)
    assert cache.get("b", b"b") is None and cache.tenant_nbytes("b") == 0  # its own went first, as before


def test_prefix_cache_a_growing_chain_evicts_its_tenants_older_chains_before_itself():
    cache = PrefixCache(max_bytes=10**9, tenant_bytes=_chain_bytes(250) + ENTRY_BYTES)
    old = cache.put("t", b"old", TokenSeq(list(range(100))), 100, 0, False)
    first = cache.put("t", b"c1", TokenSeq(list(range(100))), 100, 0, False)
    grown = first.ids.extend(range(150))
    assert cache.put("t", b"c2", grown, 250, 0, False, near=first.chain) is not None
    assert cache.get("t", b"old") is None and old.chain.keys == set()
    assert cache.get("t", b"c1") is first and len(cache) == 2 and cache.evictions == 1


def test_the_redis_token_cache_never_evicts_the_chain_being_written_for_room():
    """Review of issue 29 item 3: a tenant whose one new chain puts it over its share (counting that
    chain) is the tenant furthest over, but its only entry is the one being written — the room comes
    from the least recently used entry of all instead (as the plain LRU before the shares did)."""
    cache = TokenCache(10_000)  # 4 B a token; each share 2,500 B
    for name, tenant in (("b0", "b"), ("b1", "b"), ("c0", "c"), ("c1", "c"), ("d0", "d")):
        cache.put(name, TokenSeq(range(300)), tenant)  # 1,200 B each: 6,000 B, none over
    cache.put("a1", TokenSeq(range(1_100)), "a")  # 4,400 B: 10,400 B in all
    assert cache.get("a1", "a") is not None and cache.nbytes == 9_200
    assert cache.get("b0", "b") is None and all(cache.get(n, n[0]) is not None for n in ("b1", "c0", "c1", "d0"))
    cache.put("z", TokenSeq(range(3_000)), "z")  # alone above the whole bound: dropped last
    assert len(cache) == 0 and cache.nbytes == 0
