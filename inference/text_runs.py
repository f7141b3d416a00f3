"""Cut client text so that no tokenizer call sees an unbounded run of one character class.

Why: BPE tokenizers pre-split text with a regex into pieces (a word, a run of whitespace, a run
of punctuation) and merge bytes within each piece in time that grows faster than the piece's
length. Real text has short pieces; a hostile one does not: measured on these machines, 1 MB of
one letter costs tiktoken 2.1 s and Hugging Face ``tokenizers`` 1.4 s (GIL held), 1 MB of "中"
2.7 s in ``tokenizers``, and 1M spaces overflow tiktoken's regex stack (a Rust panic). So every
text longer than :data:`MAX_RUN` is cut into segments: the text between long runs as it is, and
each run of more than ``MAX_RUN`` letters, whitespace or symbols in chunks of ``MAX_RUN``.

The tokens differ from one call on the whole text only around a run longer than ``MAX_RUN``
(no real text has 4,096 letters or spaces in a row); the cut is deterministic, so a text always
tokenizes the same way and appends stay exact.
"""

from __future__ import annotations

import regex

__all__ = ["MAX_RUN", "segments"]

#: longest run of one character class handed to a tokenizer in one piece
MAX_RUN = 4096
_N = MAX_RUN + 1
_LONG_RUN = regex.compile(r"[\p{L}\p{M}]{%d,}|\s{%d,}|[^\s\p{L}\p{N}]{%d,}" % (_N, _N, _N))


def segments(text: str) -> list[str]:
    """``text`` in tokenizer-safe segments (``[text]`` itself when it has no long run)."""
    if len(text) <= MAX_RUN:
        return [text]
    out: list[str] = []
    pos = 0
    for m in _LONG_RUN.finditer(text):
        start, end = m.span()
        if start > pos:
            out.append(text[pos:start])
        out.extend(text[i:min(i + MAX_RUN, end)] for i in range(start, end, MAX_RUN))
        pos = end
    if pos < len(text):
        out.append(text[pos:])
    return out or [text]
