"""The simulated engine's prefix cache: vLLM's automatic prefix caching, at O(new tokens) a turn.

What vLLM does (and what the emulation reports alike): a request's tokens are cut into blocks of
``block_size``; a *full* block is named by a hash chained from its parent block's hash and its own
token ids, and a ``cache_salt`` starts the chain, so equal hashes mean equal prefixes under equal
salts. Computed blocks stay cached (LRU) after their request ends; a new request hits the longest
run of leading blocks that are cached and reports ``num_cached_tokens = hit blocks * block_size``,
never the whole prompt (its last token is always computed, for the logits), so a prompt of
``n`` tokens hits at most ``(n - 1) // block_size`` blocks. What a request computes — its prompt,
and its output but the last sampled token (never fed back) — is cached in full blocks.

What differs, so that a continuation costs O(new tokens) however long its history (vLLM walks
every block of every request; its GPU time dwarfs that, ours must not):

* **Hashes are computed once per block of a sequence** (:class:`KnownSequences`). The gateway
  passes prompts as append-only views whose earlier tokens never change (``cache.seq``); a view
  that shares a remembered view's buffer is a continuation of it, so only the blocks past the
  remembered hashes are read and hashed. A prompt in a fresh buffer (a plain list, a fork, an HTTP
  full-history request) is hashed from its first block: O(prompt) once, then remembered.
* **The hit is found from the sequence's last hit**: the block reached last time is checked (one
  probe), then the search gallops forward over what was cached since (the previous output).
  This is exact because the cache stays *prefix-closed*: a block is only ever cached with its
  parent, and eviction only takes leaves, so "block *i* cached" implies all blocks before *i* are.
* **LRU over leaves, with recency propagated lazily**: only the deepest block a request reached
  is stamped (not every block of its chain); when a leaf is evicted its parent inherits its stamp.
  An inner block's recency is the newest stamp below it, and only leaves are candidates, so the
  least recently used block is always a leaf and eviction keeps prefixes. A running request pins
  its deepest prompt block (so its chain cannot be evicted under it, as vLLM's reference counts).

Hashes are Python's 64-bit tuple hash (vLLM's ``builtin`` option): a collision is ~2^-64 per pair,
which a test stand-in can accept; there is no adversary here.

Work is counted in :class:`CacheWork` (tokens hashed, blocks probed, ...): tests assert from these
counts, not from time, that a turn's work does not grow with the history.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cache.lru import BoundedLRU

__all__ = ["Admission", "BlockPrefixCache", "CacheWork", "Known", "KnownSequences", "SharedBuffer"]


class SharedBuffer(Protocol):
    """A prompt that can say it extends another (``cache.seq.AppendOnlyView``): both read the
    same append-only buffer, so the shorter one is a prefix of the longer one."""

    def __len__(self) -> int: ...

    def shares_prefix_with(self, other: Any) -> bool: ...


@dataclass(slots=True)
class CacheWork:
    """Operations the prefix cache emulation did (cumulative)."""

    #: tokens read to hash blocks, and blocks hashed
    tokens_hashed: int = 0
    blocks_hashed: int = 0
    #: cache lookups by block hash
    blocks_probed: int = 0
    #: blocks inserted / evicted
    blocks_stored: int = 0
    blocks_evicted: int = 0
    #: prompts whose blocks were hashed from the first one (no remembered sequence to extend)
    fresh_sequences: int = 0


class Known:
    """What the engine remembers of one sequence: a view of its buffer (to recognise
    continuations), the hashes of its full blocks (for one salt) and the deepest of those known
    cached, plus ``notes`` that other parts derive from its immutable prefix (the prompt view's
    prelude)."""

    __slots__ = ("view", "salt", "hashes", "hit", "hit_depth", "notes")

    def __init__(self, view: SharedBuffer) -> None:
        self.view = view
        self.salt: str | None = None
        self.hashes: list[int] = []
        self.hit: _Block | None = None
        self.hit_depth = 0
        self.notes: Any = None

    def for_salt(self, salt: str | None) -> None:
        """Hashes are chained from the salt: another salt starts them afresh (rare: a salt is
        fixed per tenant and conversation)."""
        if salt != self.salt:
            self.salt, self.hashes, self.hit, self.hit_depth = salt, [], None, 0


class KnownSequences:
    """The most recent ``limit`` append-only sequences, most recently used first.

    Finding a prompt's sequence asks each remembered view whether it shares the prompt's buffer
    (one identity compare each, MRU first): O(sequences), never O(tokens). Remembering a view keeps
    its buffer alive, which bounds ``limit``.
    """

    def __init__(self, limit: int = 32) -> None:
        self._seqs: BoundedLRU[int, Known] = BoundedLRU(max(1, limit))
        #: the most recently used sequence (the last of ``_seqs``), asked first and alone: a
        #: connection's next turn continues it, so a turn usually costs one compare
        self._mru: Known | None = None

    def find(self, prompt: Sequence[int]) -> Known | None:
        """The remembered sequence ``prompt`` continues (or is a prefix of); remembered anew when
        ``prompt`` is an append-only view; None for other sequences (a list may change)."""
        shares = getattr(prompt, "shares_prefix_with", None)
        if not callable(shares):
            return None
        kind = type(prompt)
        mru = self._mru
        if mru is not None and type(mru.view) is kind and shares(mru.view):
            return mru  # already the most recent: nothing to move
        for known in reversed(list(self._seqs.values())):
            if type(known.view) is kind and shares(known.view):
                self._seqs.get(id(known))  # now the most recently used
                self._mru = known
                return known
        known = Known(prompt)  # type: ignore[arg-type]
        self._seqs.put(id(known), known)
        self._mru = known
        return known

    def __len__(self) -> int:
        return len(self._seqs)


class _Block:
    __slots__ = ("key", "parent", "children", "stamp", "pins", "cached")

    def __init__(self, key: int, parent: _Block | None) -> None:
        self.key = key
        self.parent = parent
        self.children = 0  # cached children: a block without any is a leaf (an eviction candidate)
        self.stamp = 0  # the newest use of this block or of any block below it
        self.pins = 0  # running requests whose deepest prompt block this is
        self.cached = True


@dataclass(slots=True)
class Admission:
    """A request admitted to the cache: what it hit, and what :meth:`BlockPrefixCache.finish`
    needs to cache its output."""

    #: prompt tokens served from cache (``num_cached_tokens``)
    cached: int
    prompt: Sequence[int]
    #: hash and block of the prompt's last full block (the chain the output extends)
    tail_hash: int
    tail: _Block | None


class BlockPrefixCache:
    """Full blocks of computed tokens, by chained hash, under a capacity in tokens (KV space)."""

    def __init__(self, block_size: int = 16, capacity_tokens: int = 1 << 20, work: CacheWork | None = None) -> None:
        self.block_size = max(1, block_size)
        self.capacity_blocks = max(1, capacity_tokens // self.block_size)
        self.work = work if work is not None else CacheWork()
        self._blocks: dict[int, _Block] = {}
        self._leaves: list[tuple[int, int, _Block]] = []  # (stamp, serial, block); stale entries skipped
        self._clock = itertools.count(1)
        self._serial = itertools.count()

    def __len__(self) -> int:
        """Cached blocks."""
        return len(self._blocks)

    @staticmethod
    def _root(salt: str | None) -> int:
        return hash(("respgate-sim-kv", salt))

    # -- hashing -------------------------------------------------------------------------------

    def _hash_blocks(self, tokens: Sequence[int], parent: int, out: list[int]) -> None:
        """Append the chained hashes of ``tokens``' full blocks to ``out``."""
        b = self.block_size
        it = iter(tokens)
        count = 0
        for block in zip(*[it] * b):
            parent = hash((parent, block))
            out.append(parent)
            count += 1
        self.work.tokens_hashed += count * b
        self.work.blocks_hashed += count

    def _prompt_hashes(self, prompt: Sequence[int], salt: str | None, known: Known | None) -> list[int]:
        """Hashes of the prompt's full blocks (a remembered sequence's list may hold more: a
        longer view of the same buffer was seen; its first ``len(prompt) // block_size`` apply)."""
        full = len(prompt) // self.block_size
        if known is None:
            hashes: list[int] = []
        else:
            known.for_salt(salt)
            hashes = known.hashes
        have = len(hashes)
        if have == 0 and full > 0:
            self.work.fresh_sequences += 1
        if have < full:  # only the blocks past those already hashed for this buffer are read
            b = self.block_size
            self._hash_blocks(prompt[have * b : full * b], hashes[-1] if hashes else self._root(salt), hashes)
        return hashes

    # -- lookup --------------------------------------------------------------------------------

    def _probe(self, key: int) -> _Block | None:
        self.work.blocks_probed += 1
        return self._blocks.get(key)

    def _longest_hit(self, hashes: list[int], full: int, known: Known | None) -> tuple[int, _Block | None]:
        """(depth, block): how many leading blocks of the first ``full`` are cached, and the
        deepest of them. Starts from the sequence's last hit when that block is still cached,
        then gallops forward and bisects (the cache is prefix-closed, so "cached" is monotone)."""
        depth, node = 0, None
        if known is not None and known.hit is not None and known.hit.cached and known.hit_depth > 0:
            if known.hit_depth >= full:  # a shorter view of the same buffer: all its blocks are cached
                if full == 0:
                    return 0, None
                node = known.hit if known.hit_depth == full else self._probe(hashes[full - 1])
                return (full, node) if node is not None else (0, None)
            depth, node = known.hit_depth, known.hit
        step = 1
        hi = full + 1  # the shallowest depth not known to be cached (none yet: past the prompt)
        while depth < full:  # gallop: depth + 1, + 2, + 4, ... until a miss
            probe = min(depth + step, full)
            found = self._probe(hashes[probe - 1])
            if found is None:
                hi = probe
                break
            depth, node = probe, found
            step *= 2
        while hi - depth > 1:  # bisect between the last hit and the first miss
            mid = (depth + hi) // 2
            found = self._probe(hashes[mid - 1])
            if found is None:
                hi = mid
            else:
                depth, node = mid, found
        return depth, node

    # -- insertion and eviction ----------------------------------------------------------------

    def _insert(self, hashes: list[int], start: int, stop: int, parent: _Block | None) -> _Block | None:
        """Cache blocks ``hashes[start:stop]`` below ``parent`` (the block at depth ``start``);
        the deepest block. Existing blocks are reused (another request computed them)."""
        blocks = self._blocks
        for i in range(start, stop):  # not islice: it would step over the first ``start`` hashes
            key = hashes[i]
            node = blocks.get(key)
            if node is None:
                node = _Block(key, parent)
                blocks[key] = node
                if parent is not None:
                    parent.children += 1
                self.work.blocks_stored += 1
            parent = node
        return parent

    def _touch(self, node: _Block | None) -> None:
        if node is None:
            return
        node.stamp = next(self._clock)
        if node.children == 0:
            heapq.heappush(self._leaves, (node.stamp, next(self._serial), node))
        if len(self._leaves) > 2 * len(self._blocks) + 64:  # stale entries: rebuild (amortised O(1))
            self._leaves = [(n.stamp, next(self._serial), n) for n in self._blocks.values() if n.children == 0]
            heapq.heapify(self._leaves)

    def _evict(self) -> None:
        """Drop least recently used leaves until the cache fits (pinned chains stay: a cache
        whose every leaf is pinned runs over, as vLLM would preempt instead)."""
        blocks, leaves = self._blocks, self._leaves
        pinned: list[tuple[int, int, _Block]] = []
        while len(blocks) > self.capacity_blocks and leaves:
            entry = heapq.heappop(leaves)
            stamp, _, node = entry
            if not node.cached or node.children or node.stamp != stamp:
                continue  # stale
            if node.pins:
                pinned.append(entry)
                continue
            node.cached = False
            del blocks[node.key]
            self.work.blocks_evicted += 1
            parent = node.parent
            if parent is not None:
                parent.children -= 1
                parent.stamp = max(parent.stamp, stamp)  # its recency includes the child's
                if parent.children == 0:
                    heapq.heappush(leaves, (parent.stamp, next(self._serial), parent))
        for entry in pinned:
            heapq.heappush(leaves, entry)

    # -- requests ------------------------------------------------------------------------------

    def admit(self, prompt: Sequence[int], salt: str | None = None, known: Known | None = None) -> Admission:
        """Look the prompt up and cache its full blocks (computed by the prefill), pinned until
        :meth:`finish`. O(new blocks of the sequence) when ``known`` remembers it."""
        hashes = self._prompt_hashes(prompt, salt, known)
        full = len(prompt) // self.block_size
        depth, node = self._longest_hit(hashes, full, known)
        cached = min(depth, (len(prompt) - 1) // self.block_size) * self.block_size
        tail = self._insert(hashes, depth, full, node) if depth < full else node
        if tail is not None:
            tail.pins += 1
        self._touch(tail)
        if (
            known is not None
            and tail is not None
            and (full >= known.hit_depth or known.hit is None or not known.hit.cached)
        ):
            known.hit, known.hit_depth = tail, full  # a shorter view (a retry) keeps the deeper hit
        self._evict()
        tail_hash = hashes[full - 1] if full else self._root(salt)
        return Admission(max(0, cached), prompt, tail_hash, tail)

    def finish(self, adm: Admission, output: Sequence[int] = ()) -> None:
        """The request ended having computed ``output`` after its prompt: cache those full blocks
        (the prompt's partial last block plus the output: O(output + one block)) and unpin."""
        b = self.block_size
        n = len(adm.prompt)
        tokens = list(adm.prompt[n - n % b : n]) + list(output) if output else []
        hashes: list[int] = []
        self._hash_blocks(tokens, adm.tail_hash, hashes)
        # the prompt's tail block was pinned, so the chain the output extends is still cached
        deepest = self._insert(hashes, 0, len(hashes), adm.tail) if hashes else adm.tail
        if adm.tail is not None:
            adm.tail.pins -= 1
        self._touch(deepest)
        self._evict()
