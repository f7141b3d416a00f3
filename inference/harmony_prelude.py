"""The prelude's developer message at a cost linear in its text, whatever the client put in it.

Why: openai_harmony's ``enc.render`` (Rust, holding the GIL) runs byte-pair merging in time that
grows with the *square* of each pre-tokenizer piece — a run of characters the tokenizer's regex
does not split (letters without spaces, one repeated punctuation mark, a long stretch of spaces or
newlines). Measured: 32,000 "中" in a row take 11.6 s, a 1 MB ``instructions`` of them minutes
(the whole gateway frozen: no other client served), and 1 MB of "a" overflows harmony's stack
(a Rust panic). Item text already avoids harmony's tokenizer (:mod:`inference.harmony_content`);
the developer message (``instructions``, tool descriptions and schemas) is built by harmony's own
formatter (it turns JSON schemas into TypeScript, prefixes description lines with ``//``, quotes
enum values), so we cannot build its text ourselves — but we can keep harmony's tokenizer from
ever seeing a long piece:

1. ``instructions`` of 64+ characters become one sentinel (harmony copies them verbatim, line
   breaks and all); in tools, every stretch of 64+ characters without a line break is replaced by
   a short unique *sentinel* of letters (the same stretch always by the same sentinel, so harmony's comparisons — a
   ``required`` name against a property key — come out the same). Measured, harmony copies line
   content verbatim into the developer message: instructions as they are, descriptions behind
   ``// `` per line, property names and enum values unquoted and unescaped;
2. every run of 64+ line breaks gets a marker digit ``𝟘`` (U+1D7D8) after every 32 of them: the
   marker sits on a line that was empty, so no line appears or disappears, and the run's pieces
   stay short;
3. harmony renders that *probe* message (cheap: it holds no long text); its content is decoded to
   text, the markers removed and the sentinels replaced by the original text;
4. the text is tokenized by tiktoken (:func:`inference.harmony_core.encode_text`: linear, GIL
   released) and spliced between the probe's header and terminator.

Each step is checked (as many markers removed as inserted, the
probe's content tokens equal to tiktoken's encoding of the probe's text); any check failing falls
back to harmony's own render. Property tests (``tests/inference/test_harmony_prelude.py``) check
the result equals ``enc.render`` on preludes with long runs of every kind in every field. A
prelude without long runs takes harmony's path unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import regex

from inference.harmony_core import encode_text

__all__ = ["RUN", "render_developer"]

log = logging.getLogger(__name__)

#: runs at least this long are rewritten before harmony sees them
RUN = 64
#: marker spacing inside non-word runs (pieces stay about this short)
_STEP = 32
_MARKER = "\U0001d7d8"
_SENTINEL = "Qzrespgatesentinel"
_LINE_RUN = regex.compile(r"[^\r\n]{%d,}" % RUN)
_BREAK_RUN = regex.compile(r"[\r\n]{%d,}" % RUN)
_VERBATIM = frozenset({"name", "type"})
_HAS_RUN = regex.compile(r"[^\r\n]{%d,}|[\r\n]{%d,}" % (RUN, RUN))


def _letters(n: int) -> str:
    """``n`` in base 26, as lower-case letters (a sentinel stays one class: letters)."""
    out = ""
    while True:
        n, r = divmod(n, 26)
        out = chr(97 + r) + out
        if not n:
            return out


class _Whole:
    """A stand-in for a regex match covering a whole string."""

    __slots__ = ("_s",)

    def __init__(self, s: str) -> None:
        self._s = s

    def group(self) -> str:
        return self._s


class _Probe:
    """Rewrites strings into their probe form and remembers how to undo it."""

    def __init__(self) -> None:
        self.sentinels: dict[str, str] = {}  # original -> sentinel
        self.markers = 0

    def _line(self, m: Any) -> str:
        original = m.group()
        sentinel = self.sentinels.get(original)
        if sentinel is None:
            sentinel = self.sentinels[original] = f"{_SENTINEL}{_letters(len(self.sentinels))}Q"
        return sentinel

    def _breaks(self, m: Any) -> str:
        run = m.group()
        out: list[str] = []
        for i in range(0, len(run), _STEP):
            chunk = run[i : i + _STEP]
            out.append(chunk)
            # never between "\r" and "\n" (that would turn one line break into two)
            if i + _STEP < len(run) and not (chunk[-1] == "\r" and run[i + _STEP] == "\n"):
                out.append(_MARKER)
                self.markers += 1
        return "".join(out)

    def whole(self, s: str) -> str:
        """All of ``s`` as one sentinel (for text harmony copies verbatim, line breaks included)."""
        if len(s) < RUN:
            return s
        return self._line(_Whole(s))

    def text(self, s: str) -> str:
        if len(s) < RUN:
            return s
        return _BREAK_RUN.sub(self._breaks, _LINE_RUN.sub(self._line, s))

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            # tool names and types pass unchanged: the catalog keys, sorts and resolves calls by them
            # (names are at most 64 characters by validation, so they cannot be slow to tokenize)
            return {
                self.text(k) if isinstance(k, str) else k: x
                if k in _VERBATIM and isinstance(x, str) and len(x) <= 64
                else self.value(x)
                for k, x in v.items()
            }
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple):
            return tuple(self.value(x) for x in v)
        return v

    def restore(self, text: str) -> str | None:
        if text.count(_MARKER) != self.markers:
            return None
        text = text.replace(_MARKER, "")
        if not self.sentinels:
            return text
        # one pass, longest sentinel first (sentinel "…aQ" is no prefix of "…baQ": they end in "Q")
        by_sentinel = {v: k for k, v in self.sentinels.items()}
        pattern = regex.compile("|".join(regex.escape(v) for v in sorted(by_sentinel, key=len, reverse=True)))
        return pattern.sub(lambda m: by_sentinel[m.group()], text)


def needs_probe(instructions: str | None, tools: Any) -> bool:
    """Whether any client text in the developer message has a run harmony would tokenize slowly."""
    stack: list[Any] = [instructions, tools]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if len(v) >= RUN and _HAS_RUN.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def render_developer(
    instructions: str | None,
    tools: Any,
    build: Callable[[str | None, Any], Any],
    enc: Any,
    text_enc: Any,
    message_token: int,
) -> list[int] | None:
    """Tokens of the developer message ``build(instructions, tools)`` renders, computed without harmony
    tokenizing any long run; None when a check fails (the caller renders with harmony instead)."""
    probe = _Probe()
    forbidden = (_MARKER, _SENTINEL)
    if any(f in s for f in forbidden for s in _strings(instructions, tools)):
        return None
    msg = build(probe.whole(instructions) if instructions else instructions, probe.value(tools))
    ids = enc.render(msg)
    try:
        start = ids.index(message_token) + 1
    except ValueError:
        return None
    content = ids[start:-1]
    text = enc.decode(content)
    if text_enc.encode_ordinary(text) != content:
        return None
    restored = probe.restore(text)
    if restored is None:
        return None
    return ids[:start] + encode_text(restored) + ids[-1:]


def _strings(*values: Any) -> list[str]:
    out: list[str] = []
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return out
