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

from collections.abc import Iterable
from typing import Any

import regex

__all__ = ["MAX_RUN", "cut", "segments"]

#: longest run of one character class handed to a tokenizer in one piece
MAX_RUN = 4096
_N = MAX_RUN + 1
#: a run of each class longer than MAX_RUN. Each alternative starts only where its class starts
#: (or where the previous run found ended: ``\G``), so a run is read once from its first character,
#: not again from each of its characters — without that guard, text made of runs just under
#: ``_N`` long cost the search O(length x MAX_RUN): 5 s for 160 KB of ``"a" * 4096 + " "``
_LONG_RUN = regex.compile(
    r"(?:\G|(?<![\p{L}\p{M}]))[\p{L}\p{M}]{%d,}"
    r"|(?:\G|(?<!\s))\s{%d,}"
    r"|(?:\G|(?<![^\s\p{L}\p{N}]))[^\s\p{L}\p{N}]{%d,}" % (_N, _N, _N)
)
#: a run longer than MAX_RUN holds a whole window of this size that starts at a multiple of it
_WINDOW = _N // 2
#: per class of ``_LONG_RUN``: a character outside it (a window without one is all that class)
_OUTSIDE = (regex.compile(r"[^\p{L}\p{M}]"), regex.compile(r"\S"), regex.compile(r"[\s\p{L}\p{N}]"))


def segments(text: str) -> list[str]:
    """``text`` in tokenizer-safe segments (``[text]`` itself when it has no long run)."""
    if len(text) <= MAX_RUN or not _may_run_long(text):
        return [text]
    return cut(text, _LONG_RUN.finditer(text, concurrent=True))  # the GIL is let go while it reads


def cut(text: str, runs: Iterable[Any]) -> list[str]:
    """``text`` cut around ``runs`` (matches of long runs, in order): each run in ``MAX_RUN`` chunks."""
    out: list[str] = []
    pos = 0
    for m in runs:
        start, end = m.span()
        if start > pos:
            out.append(text[pos:start])
        out.extend(text[i : min(i + MAX_RUN, end)] for i in range(start, end, MAX_RUN))
        pos = end
    if pos < len(text):
        out.append(text[pos:])
    return out or [text]


def _may_run_long(text: str) -> bool:
    """False only when ``text`` has no run longer than ``MAX_RUN`` (True: the full search decides).

    Why: the search for long runs tries three Unicode classes at every position (~0.13-0.3 us a
    character: 2 ms for a 14 KB tool output, ~300 ms for a megabyte of minified JSON), yet real
    text leaves every class within a few characters. A run of more than ``MAX_RUN`` = 2 x
    ``_WINDOW`` characters of one class contains a whole window ``[k*_WINDOW, (k+1)*_WINDOW)`` of
    that class alone. So a text where every whole window holds a character outside each class is
    cleared by three searches a window, each stopping at the first such character (a few in);
    only text with a window of one class (hostile, or degenerate: 2 KB of one letter, of spaces,
    of ``=``) is searched in full."""
    for start in range(0, len(text) - _WINDOW + 1, _WINDOW):
        end = start + _WINDOW
        if any(outside.search(text, start, end) is None for outside in _OUTSIDE):
            return True
    return False
