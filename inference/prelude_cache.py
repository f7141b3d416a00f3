"""The renderers' memo of rendered preludes: ``prelude_key`` -> token ids, the last 64 kept.

Why: every turn renders its prelude (system and developer messages: instructions, tool choice,
tools) and a coding agent sends the same ~10 KB of tools each turn; rendering them is milliseconds
of template or tokenizer work, looking them up is a digest. Each renderer's ``prelude_key`` names
its prelude exactly (equal keys imply equal tokens), so the memo needs no other check. Both
renderers (``inference.harmony_render``, ``inference.chat_template_render``) keep one each, in a
:class:`~cache.lru.BoundedLRU` bounded by entries: preludes are few per deployment, and a client
that sends a new one every turn only costs a render each, as without the memo.
"""

from __future__ import annotations

from collections.abc import Callable

from cache.lru import BoundedLRU

__all__ = ["PreludeCache"]


class PreludeCache:
    """Token ids of rendered preludes by ``prelude_key``, least recently used out (thread-safe:
    the prepare pool's threads render too)."""

    def __init__(self, size: int = 64) -> None:
        self._lru: BoundedLRU[bytes, list[int]] = BoundedLRU(size)

    def tokens(self, key: bytes, render: Callable[[], list[int]]) -> list[int]:
        """The tokens under ``key`` (a copy: callers extend it), rendered by ``render`` on a miss.
        Two threads missing the same key both render; the second put replaces an equal value."""
        hit: list[int] | None = self._lru.get(key)
        if hit is None:
            hit = render()
            self._lru.put(key, hit)
        return list(hit)

    def __len__(self) -> int:
        return len(self._lru)
