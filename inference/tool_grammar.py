"""Grammars of ``custom`` tools (``format: {type: "grammar", syntax: "lark"|"regex", definition}``)
as xgrammar EBNF, for the structured-output constraints both renderer families build.

Why xgrammar here: it is vLLM's structured-output backend, so the gateway converts and checks a
grammar with the same library (same version) the engine will compile it with. A grammar that does
not convert (bad Lark, bad regex, an unknown syntax, xgrammar not installed next to a remote
engine) raises :class:`GrammarUnavailable`; the renderer then leaves that tool unconstrained — its
grammar is still described in prose in the tool's description — and reports the syntax, which the
gateway counts (``respgate_grammar_fallbacks_total{syntax}``). The turn never fails for it.

Harmony writes a freeform call's input raw (``<|message|>`` ... ``<|call|>``), so the grammar
applies as is. A Hermes chat-template call carries the input as a JSON string
(``{"name": "apply_patch", "arguments": {"input": "<escaped>"}}``), so the grammar must hold for
the *unescaped* text: :func:`json_string_ebnf` rewrites the grammar into one over its JSON-escaped
spelling. The rewrite is terminal by terminal — the language of an EBNF grammar is built from
string literals and character classes, and escaping is a per-character substitution — so every
literal becomes its escaped literal and every character class becomes "the class's characters that
JSON writes as themselves, or the escape of each one it does not". Escapes are the canonical ones
(``json.dumps``: ``\\"`` ``\\\\`` ``\\n`` ``\\r`` ``\\t`` ``\\b`` ``\\f``, ``\\u00XX`` for the other
control characters; non-ASCII raw, as the renderer's ``ensure_ascii=False`` writes it), so what
the model writes is exactly what the renderer writes for the same input and the call round-trips
token for token.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from inference.item_types import ToolType

__all__ = [
    "GRAMMAR_SYNTAXES",
    "GrammarUnavailable",
    "ToolGrammar",
    "check_structural_tag",
    "grammar_library_ready",
    "iter_custom_tools",
    "json_string_ebnf",
    "needs_grammar_library",
    "preload_grammar_library",
    "tool_grammar",
]

GRAMMAR_SYNTAXES = ("lark", "regex")
_MAX_CODEPOINT = 0x10FFFF


class GrammarUnavailable(ValueError):
    """A custom tool's grammar cannot be enforced by the engine (it stays prose only)."""

    def __init__(self, syntax: str, why: str) -> None:
        super().__init__(f"{syntax} grammar cannot be enforced: {why}")
        self.syntax = syntax


@dataclass(frozen=True, slots=True)
class ToolGrammar:
    syntax: str
    #: xgrammar EBNF (root rule ``root``) of the tool's raw input
    ebnf: str


#: set once xgrammar has been imported in full (by whichever thread got there first)
_LOADED = threading.Event()


def _xgr() -> Any:
    import xgrammar

    _LOADED.set()
    return xgrammar


def grammar_library_ready() -> bool:
    """Whether xgrammar is imported. The first import takes seconds (it brings in torch): a caller
    on the event loop sends the turn that would pay it to a worker thread instead (the pipeline
    does), so one client's first custom tool does not stall every other client's stream."""
    return _LOADED.is_set()


def preload_grammar_library() -> bool:
    """Import xgrammar now (a gateway in front of a real model calls this in a thread at start-up:
    its first Codex turn would otherwise pay the import while other streams wait on the GIL).
    False when it is not installed (grammars then fall back to prose, as ever)."""
    try:
        _xgr()
    except ImportError:
        return False
    return True


def needs_grammar_library(tools: Any) -> bool:
    """Whether building these tools' constraint imports xgrammar: a ``custom`` tool with a grammar."""
    for _, tool in iter_custom_tools(tools):
        fmt = tool.get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "grammar":
            return True
    return False


def tool_grammar(tool: Mapping[str, Any]) -> ToolGrammar | None:
    """The grammar a ``custom`` tool's input must match, or None when it has none (``text`` format).

    Raises :class:`GrammarUnavailable` when it has one that cannot be enforced."""
    fmt = tool.get("format")
    if not isinstance(fmt, Mapping) or fmt.get("type") != "grammar":
        return None
    syntax = str(fmt.get("syntax") or "lark")
    definition = fmt.get("definition")
    if syntax not in GRAMMAR_SYNTAXES:
        raise GrammarUnavailable(syntax if len(syntax) <= 32 else "other", "unknown syntax")
    if not isinstance(definition, str) or not definition:
        raise GrammarUnavailable(syntax, "empty definition")
    try:
        xgr = _xgr()
        grammar = xgr.Grammar.from_lark(definition) if syntax == "lark" else xgr.Grammar.from_regex(definition)
    except ImportError as exc:
        raise GrammarUnavailable(syntax, "xgrammar is not installed") from exc
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError with its parser's message
        raise GrammarUnavailable(syntax, str(exc).strip().splitlines()[0][:200] if str(exc) else "invalid") from exc
    return ToolGrammar(syntax, str(grammar))


def iter_custom_tools(tools: Any) -> Iterator[tuple[str | None, Mapping[str, Any]]]:
    """``(namespace or None, tool)`` for every ``custom`` tool offered, namespace members included."""
    for tool in tools or ():
        if tool.get("type") == ToolType.CUSTOM and tool.get("name"):
            yield None, tool
        elif tool.get("type") == ToolType.NAMESPACE and tool.get("name"):
            for sub in tool.get("tools") or ():
                if sub.get("type") == ToolType.CUSTOM and sub.get("name"):
                    yield str(tool["name"]), sub


def check_structural_tag(tag_json: str) -> None:
    """Parse a structural tag the way vLLM's request validation does (``Grammar.from_structural_tag``);
    raises :class:`GrammarUnavailable` if it would be rejected."""
    try:
        _xgr().Grammar.from_structural_tag(tag_json)
    except Exception as exc:
        raise GrammarUnavailable("structural_tag", str(exc).strip()[:200]) from exc


# -- JSON-string rewrite ------------------------------------------------------------------------

#: characters JSON must escape inside a string
_ESCAPED = frozenset([0x22, 0x5C, *range(0x20)])
_SIMPLE_ESCAPES = {"n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B, "f": 0x0C, "b": 0x08, "a": 0x07, "e": 0x1B, "0": 0x00}
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<cls>\[(?:[^\]\\]|\\.)*\])
  | (?P<rep>\{\s*-?\d+\s*(?:,\s*-?\d+\s*)?\})
  | (?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)
  | (?P<def>::=)
  | (?P<punct>\(=|\(|\)|\||\*|\+|\?)
""",
    re.VERBOSE | re.DOTALL,
)


def _unescape(body: str) -> list[int]:
    """Codepoints of the inside of an EBNF string literal or character class (escapes resolved;
    a class's ``-`` and a leading ``^`` stay literal characters for the caller to interpret)."""
    out: list[int] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(ord(c))
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in "xuU":
            width = {"x": 8, "u": 4, "U": 8}[nxt]  # xgrammar reads ``\x`` greedily
            m = re.match(r"[0-9a-fA-F]{1,%d}" % width, body[i + 2 :])
            if not m:
                raise ValueError(f"bad escape in {body!r}")
            out.append(int(m.group(0), 16))
            i += 2 + len(m.group(0))
        elif nxt in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[nxt])
            i += 2
        else:
            out.append(-ord(nxt))  # an escaped literal (``\-``, ``\]``, ``\\``...): negative = not special
            i += 2
    return out


def _lit(text: str) -> str:
    """An EBNF string literal for ``text``."""
    out = ['"']
    for ch in text:
        cp = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\u{cp:04x}")  # ``\u`` takes exactly four digits (``\x`` would eat a next hex digit)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _json_escape(cp: int) -> str:
    return json.dumps(chr(cp), ensure_ascii=False)[1:-1]


def _class_ranges(items: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(items):
        lo = abs(items[i])
        if i + 2 < len(items) and items[i + 1] == ord("-"):
            ranges.append((lo, abs(items[i + 2])))
            i += 3
        else:
            ranges.append((lo, lo))
            i += 1
    return ranges


def _contains(ranges: list[tuple[int, int]], cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


def _class_text(ranges: list[tuple[int, int]], negated: bool) -> str:
    def one(cp: int) -> str:
        if chr(cp) in "]\\^-" or cp < 0x20 or cp == 0x7F:
            return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"
        return chr(cp)

    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    body = "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in merged)
    return f"[{'^' if negated else ''}{body}]"


def _subtract(ranges: list[tuple[int, int]], cut: frozenset[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        start = lo
        for cp in sorted(c for c in cut if lo <= c <= hi):
            if cp > start:
                out.append((start, cp - 1))
            start = cp + 1
        if start <= hi:
            out.append((start, hi))
    return out


def _json_class(token: str) -> str:
    """``[...]`` over raw characters -> a group over their JSON-escaped spellings."""
    items = _unescape(token[1:-1])
    negated = bool(items) and items[0] == ord("^")
    if negated:
        items = items[1:]
    ranges = _class_ranges(items)
    if negated:
        plain = _class_text(ranges + [(cp, cp) for cp in sorted(_ESCAPED)], True)
        escaped = [cp for cp in sorted(_ESCAPED) if not _contains(ranges, cp)]
    else:
        kept = _subtract(ranges, _ESCAPED)
        plain = _class_text(kept, False) if kept else ""
        escaped = [cp for cp in sorted(_ESCAPED) if _contains(ranges, cp)]
    alternatives = ([plain] if plain else []) + [_lit(_json_escape(cp)) for cp in escaped]
    if not alternatives:
        raise ValueError(f"empty character class {token}")
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def json_string_ebnf(ebnf: str) -> str:
    """The grammar of the JSON-escaped spellings (canonical escapes) of ``ebnf``'s strings.

    ``ebnf`` is xgrammar's printed EBNF (``str(Grammar)``). Raises ValueError on a construct it does
    not know (the caller then falls back to prose)."""
    out: list[str] = []
    pos = 0
    while pos < len(ebnf):
        m = _TOKEN.match(ebnf, pos)
        if m is None:
            raise ValueError(f"unsupported EBNF at {ebnf[pos : pos + 40]!r}")
        pos = m.end()
        kind, text = m.lastgroup, m.group(0)
        if kind == "str":
            raw = "".join(chr(abs(cp)) for cp in _unescape(text[1:-1]))
            out.append(_lit(json.dumps(raw, ensure_ascii=False)[1:-1]))
        elif kind == "cls":
            out.append(_json_class(text))
        elif kind == "name" and ebnf[pos : pos + 1] == "(":
            raise ValueError(f"unsupported EBNF macro {text}")  # e.g. TagDispatch(...)
        else:
            out.append(text)
    return "".join(out)
