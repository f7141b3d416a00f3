"""cache.lru.BoundedLRU: the bounds, and each tenant's share of them (a flood by one tenant only churns
its own entries once it holds its share; a lone tenant still has the whole map)."""

from __future__ import annotations

import random

from cache.lru import BoundedLRU, tenant_of


def test_a_plain_map_evicts_the_least_recently_used_by_entries_and_bytes():
    lru: BoundedLRU[str, int] = BoundedLRU(3, 1000)
    for k in "abc":
        lru.put(k, 0, 100)
    assert lru.get("a") == 0  # a is now the most recently used
    lru.put("d", 0, 100)
    assert "b" not in lru and {"a", "c", "d"} == {k for k in "abcd" if k in lru}
    lru.put("e", 0, 260)  # above a quarter of the bytes: never kept
    assert "e" not in lru and lru.nbytes == 300
    lru.put("f", 0, 250)
    lru.put("g", 0, 250)
    lru.put("h", 0, 250)
    assert lru.nbytes <= 1000 and len(lru) <= 3


def test_a_lone_tenant_has_the_whole_map():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 10**9, part=tenant_of)
    for i in range(100):
        lru.put(("solo", i), i, 10)
    assert len(lru) == 100 and all(("solo", i) in lru for i in range(100))
    lru.put(("solo", 100), 100, 10)  # full: its own oldest goes, as in a plain map
    assert ("solo", 0) not in lru and len(lru) == 100 and lru.part_usage("solo") == (100, 1000)


def test_a_flooding_tenant_takes_at_most_its_share_and_then_churns_its_own():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 10_000, part=tenant_of, share=0.25)
    for i in range(75):  # the victims fill three quarters
        lru.put((f"victim{i % 3}", i), i, 100)
    for i in range(10_000):  # then the attacker floods, entries and bytes
        lru.put(("attacker", i), i, 100)
        assert lru.part_usage("attacker")[0] <= 25 and lru.nbytes <= 10_000
    assert all((f"victim{i % 3}", i) in lru for i in range(75)), "a victim's entry went"
    assert lru.part_usage("attacker") == (25, 2_500)
    assert ("attacker", 9_999) in lru and ("attacker", 9_974) not in lru  # its own least recent went


def test_shares_bound_by_bytes_too():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(1_000, 10_000, part=tenant_of, share=0.25)
    for i in range(25):
        lru.put(("victim", i), i, 100)  # its share of the bytes, in few of the entries
    for i in range(200):
        lru.put(("attacker", i), i, 500)
        assert lru.nbytes <= 10_000
    assert all(("victim", i) in lru for i in range(25))
    assert lru.part_usage("attacker")[1] == 7_500  # the room the victim left, no more
    small = BoundedLRU(1_000, 10_000, part=tenant_of, share=0.1)
    assert not small.put(("a", 0), 0, 1_500)  # above its share (1,000), below a quarter: refused
    assert BoundedLRU(1_000, 10_000).put(("a", 0), 0, 1_500)  # without parts: kept


def test_two_tenants_that_both_want_more_end_up_with_equal_shares():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 10**9, part=tenant_of, share=0.25)
    for i in range(100):
        lru.put(("first", i), i, 1)  # alone: the whole map
    for i in range(1_000):
        lru.put(("second", i), i, 1)
        lru.put(("first", 100 + i), i, 1)
    assert lru.part_usage("first")[0] == lru.part_usage("second")[0] == 50


def test_a_tenant_below_its_share_evicts_the_least_recently_used_of_all():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(8, 10**9, part=tenant_of, share=0.25)
    for i in range(8):
        lru.put(("big", i), i, 1)  # one tenant fills the map alone
    lru.put(("small", 0), 0, 1)  # a newcomer evicts the oldest of all: big's
    assert ("big", 0) not in lru and ("small", 0) in lru
    lru.put(("big", 8), 8, 1)  # big is above its share (2): it evicts its own
    assert ("small", 0) in lru and ("big", 1) not in lru


def test_the_bookkeeping_matches_the_map_under_random_use():
    """Random puts (some replacing a key), gets and tenants: the parts always add up to the map, no
    part holds a key the map lacks, and the bounds hold after every put."""
    rng = random.Random(7)
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(40, 4_000, part=tenant_of, share=0.3)
    for _ in range(20_000):
        key = (rng.choice("abcde"), rng.randrange(60))
        if rng.random() < 0.3:
            lru.get(key) if rng.random() < 0.5 else lru.get_many([key, (key[0], key[1] + 1)])
        else:
            assert lru.put(key, 0, rng.randrange(1, 400))
            assert key in lru  # a put never evicts its own key
            assert len(lru) <= 40 and lru.nbytes <= 4_000
        parts = {t: lru.part_usage(t) for t in "abcde"}
        assert sum(n for n, _ in parts.values()) == len(lru)
        assert sum(b for _, b in parts.values()) == lru.nbytes


def test_item_checks_hold_each_tenant_to_its_share():
    """A flood takes the room nobody uses, churns its own entries, and gives the room back as soon
    as another tenant puts."""
    from gateway.turn.checks import ItemChecks

    checks = ItemChecks(max_bytes=64 * 1024 * 1024, max_entries=400)
    mine = [b'{"role":"user","content":"victim %d"}' % i for i in range(200)]
    for key in mine[:100]:
        checks.keep("victim", key, object())
    for i in range(5_000):
        checks.keep("attacker", b'{"role":"user","content":"flood %d"}' % i, object())
    assert checks.lru.part_usage("attacker")[0] == 300 and len(checks.lru) == 400
    for key in mine[100:]:  # the victim needs more room: the attacker, over its share, gives it
        checks.keep("victim", key, object())
    assert all(found is not None for found in checks.found("victim", list(mine)))
    assert checks.lru.part_usage("attacker")[0] == 200


def test_a_tenant_within_its_share_never_loses_an_entry_to_one_over_it():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(8, 10**9, part=tenant_of, share=0.25)
    lru.put(("small", 0), 0, 1)  # the oldest of all, within its share (2)
    for i in range(50):
        lru.put(("big", i), i, 1)
    lru.put(("small", 1), 1, 1)
    assert ("small", 0) in lru and ("small", 1) in lru and lru.part_usage("big")[0] == 6


def test_get_many_is_get_for_each_key():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(3, 10**6, part=tenant_of)
    for i in range(3):
        lru.put(("t", i), i * 10, 1)
    assert lru.get_many([("t", 0), ("t", 9), ("t", 2)]) == [0, None, 20]
    assert (lru.hits, lru.misses) == (2, 1)
    lru.put(("t", 3), 30, 1)  # 1 is now the least recently used
    assert ("t", 1) not in lru and ("t", 0) in lru and ("t", 2) in lru


def test_a_share_outside_zero_to_one_is_refused():
    import pytest

    for share in (0, -0.5, 1.5):
        with pytest.raises(ValueError):
            BoundedLRU(10, 100, part=tenant_of, share=share)


def test_owner_hooks_on_evict_pop_peek_oldest_and_evict_one():
    """What the stores of records use (issue 28 item 9): evictions are reported, a pop is not one, a
    peek is not a use, and evict_one gives back by the shares (the preferred part first)."""
    gone: list[tuple[str, int]] = []
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(8, 10**6, part=tenant_of, on_evict=lambda k, v: gone.append(k))
    for i in range(4):
        lru.put(("b", i), i, 10)
    for i in range(10):
        lru.put(("a", i), i, 10)
    assert gone == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("a", 4), ("a", 5)] and lru.evictions == 6
    assert lru.peek(("b", 0)) == 0 and lru.oldest() == (("b", 0), 0)  # a peek leaves the order alone
    assert lru.pop(("b", 0)) == 0 and ("b", 0) not in lru and lru.evictions == 6
    assert lru.pop(("b", 0), "none") == "none"
    assert lru.evict_one(prefer="b") and gone[-1] == ("b", 1)
    assert lru.evict_one() and gone[-1] == ("a", 6)  # no part over its share: the least recently used


def test_evict_one_with_outside_bytes_takes_only_from_a_part_over_its_share():
    """Memory a part holds beyond the map (running logs) counts in its usage; a part with no entry of
    its own takes from a part over its share only, else nothing (review of issue 28 item 9)."""
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 1_000, part=tenant_of)
    lru.put(("b", 0), 0, 100)
    lru.put(("c", 0), 0, 100)
    assert not lru.evict_one(prefer="a", outside={"a": 5_000}) and len(lru) == 2  # nobody else over
    assert lru.evict_one(prefer="a", outside={"a": 5_000, "c": 200}) and ("c", 0) not in lru
    assert lru.evict_one(prefer="b", outside={}) and len(lru) == 0  # its own entry first
    lru.put((None, 0), 0, 100)  # None is a part like any other (an unauthenticated gateway's tenant)
    assert lru.evict_one(prefer=None, outside={}) and len(lru) == 0


def test_sweep_removes_from_the_least_recently_used_end_while_expired_and_at_most_limit():
    gone: list[tuple[str, int]] = []
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 10**6, part=tenant_of, on_evict=lambda k, v: gone.append(k))
    for i in range(12):
        lru.put(("a", i), i, 10)
    lru.get(("a", 0))  # a use: now the most recently used
    assert lru.sweep(lambda v: v < 11, limit=3) == [(("a", 1), 1), (("a", 2), 2), (("a", 3), 3)]
    assert [k for k, _ in lru.sweep(lambda v: v < 11, limit=None)] == [("a", i) for i in range(4, 11)]
    assert lru.sweep(lambda v: v < 11) == [] and len(lru) == 2 and lru.part_usage("a") == (2, 20)
    assert gone == [] and lru.evictions == 0 and lru.nbytes == 20  # removals, not evictions


def test_a_forced_put_is_kept_above_the_cap_and_never_evicts_itself():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 1_000, part=tenant_of)
    lru.put(("b", 0), 0, 100)
    lru.put(("a", 0), 0, 100)
    assert not lru.put(("a", 1), 1, 600)  # above the share (250): refused
    assert lru.put(("a", 1), 1, 900, force=True)  # forced: kept; its own tenant makes room first
    assert ("a", 1) in lru and ("b", 0) in lru and ("a", 0) not in lru and lru.nbytes <= 1_000
    assert lru.put(("a", 2), 2, 2_000, force=True)  # alone above the whole bound: still kept
    assert ("a", 2) in lru and len(lru) == 1


def test_without_a_byte_bound_it_is_bounded_by_entries_alone():
    lru: BoundedLRU[str, str] = BoundedLRU(3)
    for k in "abc":
        assert lru.put(k, k.upper())  # no charge: a memo of small values
    assert lru.get("a") == "A"
    lru.put("d", "D")
    assert [k for k in "abcd" if k in lru] == ["a", "c", "d"] and lru.nbytes == 0 and lru.evictions == 1


def test_clear_drops_everything_without_calling_on_evict():
    dropped: list[str] = []
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(
        4, 100, part=tenant_of, on_evict=lambda k, v: dropped.append(k[0])
    )
    for i in range(3):
        lru.put(("t", i), i, 10)
    lru.clear()
    assert len(lru) == 0 and lru.nbytes == 0 and lru.part_usage("t") == (0, 0) and dropped == []
    lru.put(("t", 9), 9, 10)  # the bookkeeping starts afresh
    assert lru.part_usage("t") == (1, 10) and lru.get(("t", 9)) == 9


def test_recharge_changes_an_entrys_charge_and_leaves_its_place_in_the_order():
    """An owner whose value shrank in place (a prefix chain that lost a key to a retry) charges it
    anew without making it the most recently used: the next eviction still takes it first."""
    gone: list[tuple[str, int]] = []
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(
        100, 1_000, part=tenant_of, share=1.0, on_evict=lambda k, v: gone.append(k)
    )
    lru.put(("a", 0), 0, 200)
    lru.put(("b", 0), 0, 200)
    assert lru.recharge(("a", 0), 100) and lru.nbytes == 300 and lru.part_usage("a") == (1, 100)
    assert lru.oldest() == (("a", 0), 0) and lru.hits == 0  # not a use
    assert not lru.recharge(("c", 0), 10) and lru.nbytes == 300  # not held: nothing changes
    lru.put(("c", 0), 0, 200)
    lru.put(("c", 1), 1, 200)
    lru.put(("b", 1), 1, 200)
    lru.put(("b", 2), 2, 200)  # 1,100 B: one goes
    assert gone == [("a", 0)] and lru.nbytes == 1_000


def test_recharge_that_grows_an_entry_past_the_bound_evicts_others_never_itself():
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 1_000)
    for i in range(4):
        lru.put(("t", i), i, 200)
    assert lru.recharge(("t", 0), 500) and ("t", 0) in lru and lru.nbytes <= 1_000
    assert [("t", i) in lru for i in range(4)] == [True, False, True, True]
    assert lru.recharge(("t", 0), 5_000) and len(lru) == 1 and lru.oldest() == (("t", 0), 0)


def test_evict_one_never_drops_the_protected_key_while_another_is_held():
    """The entry an owner just wrote is what room is made for (the Redis store's token and chain
    caches): ``protect`` skips it — a part whose only entry it is is not a candidate, and without
    ``outside`` the least recently used of the others goes."""
    lru: BoundedLRU[tuple[str, int], int] = BoundedLRU(100, 1_000, part=tenant_of)
    lru.put(("b", 0), 0, 100)
    lru.put(("a", 0), 0, 100)
    assert not lru.evict_one(outside={"a": 900}, protect=("a", 0)) and len(lru) == 2
    assert lru.evict_one(outside={"a": 900}) and ("a", 0) not in lru  # unprotected: it goes
    lru.put(("a", 0), 0, 100)
    assert lru.evict_one(prefer="a", protect=("a", 0)) and ("b", 0) not in lru and ("a", 0) in lru
    assert not lru.evict_one(protect=("a", 0)) and len(lru) == 1  # the only one left
    lru.put(("a", 1), 1, 100)
    assert lru.evict_one(prefer="a", protect=("a", 1)) and list(lru.values()) == [1]
