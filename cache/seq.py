"""Append-only shared sequences: the reason a continuation turn costs O(new input).

A chain of responses is linear most of the time: turn N+1 extends turn N. Copying the parent's
token ids (or items) into the child would make every turn O(history). Instead a sequence is a
*view* ``(buffer, length)`` over a list that only ever grows. Extending a view whose length equals
the buffer's length appends in place (amortised O(new)) and returns a longer view; the parent view
is unchanged because it only ever reads ``buffer[:length]``. Extending a view that is no longer the
tip (a fork, or a retry after a failed turn already appended) copies its prefix into a fresh buffer
— O(history), but only on that rare path, and counted (``copies``) so tests and metrics see it.

This is the same trick Go slices use; it keeps every snapshot immutable from its holders' view.
"""

from __future__ import annotations

from typing import Any, Generic, Iterable, Iterator, Sequence, TypeVar, overload

T = TypeVar("T")


class AppendOnlyView(Sequence[T], Generic[T]):
    __slots__ = ("_buf", "_n")

    #: process-wide count of prefix copies (forks); exported as a metric by the gateway
    copies: int = 0

    def __init__(self, buf: list[T] | None = None, n: int | None = None) -> None:
        self._buf: list[T] = buf if buf is not None else []
        self._n = len(self._buf) if n is None else n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            return self._buf[start:stop:step]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._buf[i]

    def __iter__(self) -> Iterator[T]:
        buf = self._buf
        for i in range(self._n):
            yield buf[i]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(len={self._n})"

    def index(self, value: T, start: int = 0, stop: int | None = None) -> int:
        """``list.index`` semantics within the view, searched in C (no Python-level iteration)."""
        n = self._n
        stop = n if stop is None else min(stop, n) if stop >= 0 else max(0, n + stop)
        if start < 0:
            start = max(0, n + start)
        return self._buf.index(value, start, stop)

    def is_tip(self) -> bool:
        """True when extending this view appends in place (no copy)."""
        return len(self._buf) == self._n

    def shares_prefix_with(self, other: "AppendOnlyView[T]") -> bool:
        """Both views read the same buffer, so the shorter one is a prefix of the longer one."""
        return self._buf is other._buf

    def tolist(self) -> list[T]:
        return self._buf[: self._n]

    def extend(self, new: Iterable[T]) -> "AppendOnlyView[T]":
        new = list(new)
        if len(self._buf) == self._n:
            buf = self._buf
        else:
            buf = self._buf[: self._n]
            AppendOnlyView.copies += 1
        buf.extend(new)
        return type(self)(buf, self._n + len(new))


class TokenSeq(AppendOnlyView[int]):
    """Rendered token ids of a conversation (prompt tokens and the model's sampled tokens)."""

    __slots__ = ()
