"""Ids the gateway gives (``gateway.wire.items.new_id``): shape, uniqueness, and a fork's own ids."""

from __future__ import annotations

import os
import re

import pytest

from gateway.wire.items import ID_BYTES, new_id


def test_ids_are_prefixed_hex_of_24_random_bytes_and_never_repeat():
    ids = [new_id("msg") for _ in range(5_000)]  # many batches
    assert all(re.fullmatch(r"msg_[0-9a-f]{%d}" % (2 * ID_BYTES), i) for i in ids)
    assert len(set(ids)) == len(ids)
    suffixes = [i[4:] for i in ids]
    # each hex digit is about equally frequent (random bytes, not a counter)
    counts = [sum(s.count(d) for s in suffixes) for d in "0123456789abcdef"]
    assert max(counts) < 1.1 * min(counts)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_hand_out_its_parents_ids():
    new_id("rs")  # the parent holds a batch
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the next ids, written to the parent
        try:
            os.write(w, " ".join(new_id("rs") for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = set(f.read().split())
    os.waitpid(pid, 0)
    parent = {new_id("rs") for _ in range(50)}
    assert len(child) == 50 and not child & parent
