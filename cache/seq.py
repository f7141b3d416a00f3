"""Append-only shared sequences: the reason a continuation turn costs O(new input).

A chain of responses is linear most of the time: turn N+1 extends turn N. Copying the parent's
token ids (or items) into the child would make every turn O(history). Instead a sequence is a
*view* ``(buffer, length)`` over a buffer that only ever grows. Extending a view whose length
equals the buffer's length appends in place (amortised O(new)) and returns a longer view; the
parent view is unchanged because it only ever reads ``buffer[:length]``. Extending a view that is
no longer the tip (a fork, or a retry after a failed turn already appended) copies its prefix into
a fresh buffer — O(history), but only on that rare path, and counted (``copies``) so tests and
metrics see it.

This is the same trick Go slices use; it keeps every snapshot immutable from its holders' view.

Token ids are packed (:class:`TokenSeq`): an ``array('I')`` holds each id in 4 bytes, where a
Python list holds an 8-byte pointer to a 28-byte int object (ids above 256 are not cached small
ints), and idle connections hold their whole histories. Reading a packed view out as a list
(``tolist``, a slice) builds those int objects again: O(what is read), so the hot path never does
it for a whole history — only an engine API that takes nothing but a list does
(``inference.vllm_engine``, ``inference.remote_vllm``).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

#: ``array`` typecode of a packed token id: unsigned, 4 bytes. Vocabularies exceed 2-byte ids
#: (o200k has ~200k tokens) and stay far below 2**32.
TOKEN_TYPECODE = next(code for code in ("I", "L") if array(code).itemsize == 4)
#: bytes one token id occupies in a :class:`TokenSeq` buffer (before the buffer's ~6% headroom)
TOKEN_BYTES = array(TOKEN_TYPECODE).itemsize


class AppendOnlyView(Sequence[T], Generic[T]):
    __slots__ = ("_buf", "_n")

    #: process-wide count of prefix copies (forks); exported as a metric by the gateway
    copies: int = 0

    def __init__(self, buf: list[T] | None = None, n: int | None = None) -> None:
        self._buf: Any = buf if buf is not None else []
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
        # bounded by the view even while a longer view appends to the same buffer
        return islice(self._buf, self._n)

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

    def shares_prefix_with(self, other: AppendOnlyView[T]) -> bool:
        """Both views read the same buffer, so the shorter one is a prefix of the longer one."""
        return self._buf is other._buf

    def tolist(self) -> list[T]:
        return self._buf[: self._n]

    def extend(self, new: Iterable[T]) -> AppendOnlyView[T]:
        new = list(new)
        if len(self._buf) == self._n:
            buf = self._buf
        else:
            buf = self._buf[: self._n]
            AppendOnlyView.copies += 1
        buf.extend(new)
        return type(self)(buf, self._n + len(new))


class TokenSeq(AppendOnlyView[int]):
    """Rendered token ids of a conversation (prompt tokens and the model's sampled tokens), packed.

    ``TokenSeq(ids)`` packs ``ids`` into a fresh buffer (O(len), a full render's list), unless
    ``ids`` already is a packed buffer, which the view then shares (how ``extend`` hands its
    buffer on). Slices and ``tolist`` return lists, like the list-backed views did; iteration,
    ``index`` and ``len`` read the packed buffer in place.

    The buffer must never be exported (``memoryview``, ``numpy.frombuffer``) beyond one
    synchronous call: an ``array`` that exports its memory refuses to grow, and growing in place
    is what makes a continuation O(new).
    """

    __slots__ = ()

    #: bytes per token id, for the byte accounting of caches and states
    itemsize = TOKEN_BYTES

    def __init__(self, ids: Iterable[int] | None = None, n: int | None = None) -> None:
        if ids is None:
            buf = array(TOKEN_TYPECODE)
        elif type(ids) is array and ids.typecode == TOKEN_TYPECODE:
            buf = ids
        else:
            buf = array(TOKEN_TYPECODE, ids)
        super().__init__(buf, n)  # type: ignore[arg-type]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            return self._buf[start:stop:step].tolist()
        return super().__getitem__(i)

    def tolist(self) -> list[int]:
        buf = self._buf
        return (buf if len(buf) == self._n else buf[: self._n]).tolist()

    def extend(self, new: Iterable[int]) -> TokenSeq:
        # packed first: an id that does not fit raises here, before the shared buffer is touched
        if type(new) is array and new.typecode == TOKEN_TYPECODE:
            packed = new
        elif isinstance(new, TokenSeq):
            packed = new._buf[: new._n]
        else:
            packed = array(TOKEN_TYPECODE, new)
        if len(self._buf) == self._n:
            buf = self._buf
        else:
            buf = self._buf[: self._n]
            AppendOnlyView.copies += 1
        buf.extend(packed)
        seq = _new_token_seq(TokenSeq)  # the buffer is packed already: no __init__ chain to check it
        seq._buf, seq._n = buf, self._n + len(packed)
        return seq


_new_token_seq = object.__new__
