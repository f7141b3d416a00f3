"""Packed token ids (issue 15, item 5): an idle connection's history costs ≤ 8 bytes a token, and a
continuation turn copies none of it.

Idle WebSocket connections hold their whole rendered histories (``ResponseState.history_ids``).
In a Python list each id was an 8-byte pointer to a 28-byte int object; a ``TokenSeq`` packs them
into an ``array`` of 4-byte ids that parent and child views share. These tests measure what the
live gateway holds (tracemalloc: every allocation still alive at idle that was made by the
renderer/tokenizer or by the shared buffers — wherever the ids are made and kept, whatever their
representation) and count what a continuation turn reads out of the shared buffer (copies to
lists, slices, whole iterations): that must not depend on the history's length.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from websockets.sync.client import connect

from cache.seq import TOKEN_BYTES, AppendOnlyView, TokenSeq
from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.turn_helpers import text_of, ws_turn

pytestmark = pytest.mark.timeout(240)

MODEL = "gpt-oss-sim"
SETTINGS = Settings(max_context=300_000, max_request_bytes=64 * 1024 * 1024)


def state_tokens(resp: dict) -> int:
    """Tokens of the history a response leaves behind: its prompt and its output."""
    return resp["usage"]["input_tokens"] + resp["usage"]["output_tokens"]


# -- bytes per idle token ------------------------------------------------------------------------


def traced_token_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Traced bytes allocated where token ids are made and kept: by the renderer and tokenizer
    (``inference``) or by the shared buffers (``cache/seq.py``) — not by the simulated engine's own
    bookkeeping (a real engine's KV lives in the engine, not in the gateway). Grouped by traceback
    first: a history's ids share a few allocation sites, so this is quick."""
    total = 0
    for stat in snapshot.statistics("traceback"):
        files = [frame.filename for frame in stat.traceback]
        if any("/inference/simulated" in f for f in files):
            continue
        if any(f.endswith("/cache/seq.py") or "/inference/" in f for f in files):
            total += stat.size
    return total


def test_idle_connections_hold_at_most_8_bytes_per_history_token(make_gateway) -> None:
    engine = SimulatedEngine(script=lambda view: Turn(reasoning="ok", text="done"), prefix_cache=False)
    live = make_gateway(SETTINGS, engine=engine)
    history = text_of(32_000)
    with connect(live.ws_url, max_size=None, compression=None) as ws:  # one-time allocations first
        ws_turn(ws, MODEL, history + " warm", None)
    gc.collect()
    tracemalloc.start(12)
    sockets = []
    try:
        before = traced_token_bytes(tracemalloc.take_snapshot())
        tokens = 0
        for i in range(4):
            ws = connect(live.ws_url, max_size=None, compression=None)
            sockets.append(ws)
            resp = ws_turn(ws, MODEL, f"{history} session {i}", None)  # a full render
            resp = ws_turn(ws, MODEL, [{"role": "user", "content": "and then?"}], resp["id"])  # an append
            tokens += state_tokens(resp)
        gc.collect()
        held = traced_token_bytes(tracemalloc.take_snapshot()) - before
    finally:
        tracemalloc.stop()
        for ws in sockets:
            ws.close()
    per_token = held / tokens
    print(f"idle token state: {per_token:.2f} bytes per token ({tokens} tokens on 4 connections)")
    assert tokens > 4 * 32_000
    # at least the packed ids themselves (the filter sees the buffers), at most 8 bytes a token
    assert TOKEN_BYTES <= per_token <= 8, per_token


def test_parent_and_child_share_one_packed_buffer() -> None:
    root = TokenSeq(range(100_000, 100_300))
    child = root.extend([199_999, 7])
    assert child.shares_prefix_with(root) and root.is_tip() is False and child.is_tip()
    assert child.tolist()[-2:] == [199_999, 7] and len(root) == 300
    assert root.itemsize == TOKEN_BYTES == 4
    # an id that does not fit is refused before the shared buffer is touched: the child stays the tip
    with pytest.raises(OverflowError):
        child.extend([1, -1])
    assert child.is_tip() and len(child.extend([3])) == 303


# -- no O(history) copy per continuation turn ----------------------------------------------------


class Reads:
    """Counts tokens read out of ``TokenSeq`` buffers as Python objects (lists, slices, whole
    iterations): what a consumer that copies the history would have to do."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tokens = 0
        tolist, getitem, iterate = TokenSeq.tolist, TokenSeq.__getitem__, TokenSeq.__iter__

        def counted_tolist(seq: TokenSeq) -> list[int]:
            self.tokens += len(seq)
            return tolist(seq)

        def counted_getitem(seq: TokenSeq, i):
            if isinstance(i, slice):
                self.tokens += len(range(*i.indices(len(seq))))
            return getitem(seq, i)

        def counted_iter(seq: TokenSeq):
            self.tokens += len(seq)
            return iterate(seq)

        monkeypatch.setattr(TokenSeq, "tolist", counted_tolist)
        monkeypatch.setattr(TokenSeq, "__getitem__", counted_getitem)
        monkeypatch.setattr(TokenSeq, "__iter__", counted_iter)


def continuation_reads(live, reads: Reads, history_tokens: int) -> tuple[int, int, dict]:
    """(tokens read, prefix copies) during the third turn of a WS chain, and that turn."""
    with connect(live.ws_url, max_size=None, compression=None) as ws:
        resp = ws_turn(ws, MODEL, text_of(history_tokens), None)
        resp = ws_turn(ws, MODEL, "And tomorrow?", resp["id"])
        read0, copies0 = reads.tokens, AppendOnlyView.copies
        resp = ws_turn(ws, MODEL, "Weather in Oslo, please?", resp["id"])
        return reads.tokens - read0, AppendOnlyView.copies - copies0, resp


def test_a_continuation_turn_reads_and_copies_no_history(make_gateway, monkeypatch) -> None:
    """Through the gateway and the simulated engine with its prefix cache (which reads a prompt
    through the views: new blocks and the newest message only), at 1k and at 64k tokens."""
    reads = Reads(monkeypatch)
    live = make_gateway(SETTINGS, engine=SimulatedEngine())
    small, small_copies, _ = continuation_reads(live, reads, 1_000)
    large, large_copies, turn = continuation_reads(live, reads, 64_000)
    print("tokens read out of the history in one continuation turn:", small, large)
    assert turn["usage"]["input_tokens"] > 64_000
    assert small_copies == large_copies == 0
    # the engine hashes the new blocks: where they start in a block moves that by < 2 blocks
    assert abs(large - small) <= 32 and large < 1_000, (small, large)
