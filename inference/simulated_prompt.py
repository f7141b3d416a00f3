"""What the simulated engine reads from a harmony prompt — lazily, and never the whole history.

The simulated engine gets only token ids, like a real one. To answer plausibly it needs two
things: the newest message (to echo it, or to know a tool just returned) and the tools offered in
the prelude (to build a call). Benchmarks run it with 128k-token histories, so a turn must cost
O(newest message + prelude), not O(history):

* the **tail**: search backwards (C-speed, in reversed chunks) for the last ``<|start|>`` before
  the generation prompt, and decode only that message;
* the **prelude**: the leading system/developer messages, walked from the front reading each
  message's header first (so a history's first message, which may be one huge item, is never
  scanned); their tool declarations (harmony's TypeScript-like rendering) are parsed and cached
  by the developer message's tokens. The engine remembers a sequence's prelude
  (:attr:`PromptView.known_prelude`): a continuation of it reads none of it again.

:meth:`PromptView.messages` decodes everything, for recall tests that ask for it explicitly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from cache.lru import BoundedLRU
from inference.harmony_core import FREEFORM_NOTE, FUNCTIONS, harmony_encoding, harmony_tokens
from inference.harmony_render import TOOL_CHOICE_NAMED, TOOL_CHOICE_NONE, TOOL_CHOICE_REQUIRED

__all__ = ["MessageView", "PromptPrelude", "PromptView", "ToolSpec", "parse_tool_declarations"]

_ROLES = frozenset(("system", "developer", "user", "assistant"))


@dataclass(frozen=True, slots=True)
class MessageView:
    """One decoded harmony message. ``role`` is ``"tool"`` for tool outputs, whose ``author`` is
    the tool's recipient name (``functions.get_weather``)."""

    role: str
    author: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str

    @property
    def tool_name(self) -> str | None:
        """For a tool output: the tool's name without its namespace."""
        if self.role != "tool":
            return None
        return self.author.split(".", 1)[1] if "." in self.author else self.author


# -- tool declarations (harmony's TypeScript-like rendering) -----------------------------------

_TS_TOKEN = re.compile(r'"[^"\n]*"|//[^\n]*|\[\]|[{}|:?,]|[^\s{}|:?,"\[\]]+')
_NAMESPACE = re.compile(r"^namespace (\S+) \{\n(.*?)\n\} // namespace \1\b", re.S | re.M)
_TOOL = re.compile(r"((?:^//[^\n]*\n)*)^type (\S+) = \((.*?)\) => any;", re.S | re.M)


class _TsParser:
    """Recursive descent over harmony's TS rendering: ``{ a: string, b?: "x" | "y", c: T[] }``.

    Types become small tuples: ``("prim", name)``, ``("enum", values)``, ``("array", item)``,
    ``("object", ((name, required, type), ...))``, ``("union", alternatives)``.
    """

    def __init__(self, text: str) -> None:
        self.toks = [t for t in _TS_TOKEN.findall(text) if not t.startswith("//")]
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end of declaration")
        self.i += 1
        return tok

    def object(self) -> tuple:
        if self.take() != "{":
            raise ValueError("expected {")
        props = []
        while self.peek() not in ("}", None):
            name = self.take()
            optional = self.peek() == "?"
            if optional:
                self.take()
            if self.take() != ":":
                raise ValueError("expected :")
            props.append((name.strip('"'), not optional, self.type()))
            if self.peek() == ",":
                self.take()
        self.take()
        return ("object", tuple(props))

    def type(self) -> tuple:
        if self.peek() == "|":
            self.take()
        alts = [self.primary()]
        while self.peek() == "|":
            self.take()
            alts.append(self.primary())
        if all(a[0] == "enum" for a in alts):
            return ("enum", tuple(v for a in alts for v in a[1]))
        return alts[0] if len(alts) == 1 else ("union", tuple(alts))

    def primary(self) -> tuple:
        tok = self.peek()
        if tok == "{":
            t: tuple = self.object()
        elif tok is not None and tok.startswith('"'):
            self.take()
            t = ("enum", (tok[1:-1],))
        else:
            t = ("prim", self.take())
        while self.peek() == "[]":
            self.take()
            t = ("array", t)
        return t


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as declared to the model: enough to build a plausible call."""

    name: str
    namespace: str | None
    description: str
    #: ``("object", props)`` or ``None`` when the tool takes no JSON (``() => any``)
    params: tuple | None
    freeform: bool

    def example_arguments(self, text: str) -> dict[str, Any]:
        """Arguments for the required properties: strings -> ``text``, numbers -> 1,
        booleans -> true, enums -> their first value, arrays -> one element."""
        if self.params is None or self.params[0] != "object":
            return {}
        return _example(self.params, text)


def _example(t: tuple, text: str) -> Any:
    kind = t[0]
    if kind == "object":
        return {name: _example(sub, text) for name, required, sub in t[1] if required}
    if kind == "array":
        return [_example(t[1], text)]
    if kind == "enum":
        value = t[1][0]
        try:
            return json.loads(value) if value[:1] in "-0123456789tfn[{" else value
        except ValueError:
            return value
    if kind == "union":
        alts = [a for a in t[1] if a != ("prim", "null")] or list(t[1])
        return _example(alts[0], text)
    return {"number": 1, "integer": 1, "boolean": True, "null": None}.get(t[1], text)


def parse_tool_declarations(developer_text: str) -> tuple[ToolSpec, ...]:
    """Tools of a harmony developer message, in declaration order (unparseable ones skipped)."""
    tools: list[ToolSpec] = []
    for ns_match in _NAMESPACE.finditer(developer_text):
        ns, body = ns_match.group(1), ns_match.group(2)
        for m in _TOOL.finditer(body):
            comments, name, sig = m.group(1), m.group(2), m.group(3).strip()
            desc = "\n".join(line[2:].strip() for line in comments.splitlines())
            params: tuple | None = None
            if sig:
                try:
                    parser = _TsParser(sig)
                    parser.take()  # the parameter name "_"
                    parser.take()  # ":"
                    params = parser.type()
                except (ValueError, IndexError):
                    params = ("object", ())
            tools.append(ToolSpec(name, None if ns == FUNCTIONS else ns, desc, params, FREEFORM_NOTE in desc))
    return tuple(tools)


# -- messages ------------------------------------------------------------------------------------

_HEADER_TO = re.compile(r"\s*to=(\S+?)(?=\s|<\||$)")


def _decode_message(tokens: Sequence[int]) -> MessageView | None:
    """Decode ``<|start|>header<|message|>content<terminator>`` (terminator optional)."""
    enc, tok = harmony_encoding(), harmony_tokens()
    try:
        m = tokens.index(tok.message)
    except ValueError:
        return None
    header = enc.decode(tokens[1:m])
    end = len(tokens)
    if end > m + 1 and tokens[-1] in tok.terminators:
        end -= 1
    text = enc.decode(tokens[m + 1 : end])
    role_part, _, channel_part = header.partition("<|channel|>")
    recipient = None
    found = _HEADER_TO.search(role_part)
    if found:
        recipient, role_part = found.group(1), role_part[: found.start()]
    channel_part, _, content_type = channel_part.partition("<|constrain|>")
    found = _HEADER_TO.search(channel_part)
    if found:
        recipient, channel_part = found.group(1), channel_part[: found.start()]
    author = role_part.strip()
    return MessageView(
        role=author if author in _ROLES else "tool",
        author=author,
        channel=channel_part.strip() or None,
        recipient=recipient,
        content_type=content_type.strip() or None,
        text=text,
    )


def _as_list(part: Sequence[int]) -> list[int]:
    """A slice as a list (an ``AppendOnlyView`` slices its list; tuples, arrays slice as such)."""
    return part if isinstance(part, list) else list(part)


_HEADER_MAX = 64  # tokens from <|start|> to <|message|>: a role, a channel, a recipient, a type


@dataclass(frozen=True, slots=True)
class PromptPrelude:
    """What the prelude (leading system/developer messages) declares, as the script reads it."""

    tools: tuple[ToolSpec, ...] = ()
    developer_text: str = ""
    #: how many leading prompt tokens settle it: any prompt with those tokens has this prelude
    extent: int = 0


#: a developer message's tokens -> the tools it declares and its text (the engine's scripts ask each
#: turn; a benchmark or a test serves a handful of tool sets)
_developer_messages: BoundedLRU[tuple[int, ...], tuple[tuple[ToolSpec, ...], str]] = BoundedLRU(32)


class PromptView:
    """Lazy read-only view of a harmony prompt, handed to simulated-engine scripts.

    Reads only what is asked for: :attr:`last` costs O(the newest message), :attr:`tools`
    O(the prelude) — and nothing when the engine passes ``prelude`` (it remembers the prelude of
    a sequence whose prefix cannot change, :attr:`known_prelude`). ``tokens_read`` counts the
    prompt tokens the view touched, for the engine's work counters.
    """

    def __init__(self, prompt_ids: Sequence[int], prelude: PromptPrelude | None = None) -> None:
        self.prompt_ids = prompt_ids
        tok = harmony_tokens()
        self._tok = tok
        n = len(prompt_ids)
        # (a slice shorter than two never equals the two-token generation prompt; ``list`` of a
        # two-token slice is cheaper than asking whether it is one already)
        self._body_end = n - 2 if list(prompt_ids[-2:]) == [tok.start, tok.assistant] else n
        self.tokens_read = 2 if n > 2 else n
        self._given = prelude if prelude is not None and prelude.extent <= self._body_end else None
        self._definite: PromptPrelude | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def _slice(self, lo: int, hi: int) -> list[int]:
        self.tokens_read += max(0, hi - lo)
        return _as_list(self.prompt_ids[lo:hi])

    def _find(self, value: int, lo: int, hi: int) -> int:
        """First index of ``value`` in ``[lo, hi)`` (-1 if absent), searched in C; counts the
        tokens scanned."""
        try:
            at = self.prompt_ids.index(value, lo, hi)
        except ValueError:
            self.tokens_read += max(0, hi - lo)
            return -1
        self.tokens_read += at + 1 - lo
        return at

    def _rfind(self, value: int, end: int) -> int:
        """Last index of ``value`` before ``end`` (-1 if absent), in reversed slices that double
        from 64 tokens: the cost is proportional to the distance from ``end``, not to the prompt."""
        hi, chunk = end, 64
        while hi > 0:
            lo = max(0, hi - chunk)
            part = self._slice(lo, hi)
            part.reverse()
            try:
                return hi - 1 - part.index(value)
            except ValueError:
                hi, chunk = lo, min(chunk * 2, 8192)
        return -1

    @cached_property
    def last(self) -> MessageView | None:
        """The newest message before the generation prompt (O(its length))."""
        start = self._rfind(self._tok.start, self._body_end)
        if start < 0:
            return None
        return _decode_message(self._slice(start, self._body_end))

    @property
    def known_prelude(self) -> PromptPrelude | None:
        """The prelude, when it was read and is settled by the prompt's prefix alone (a longer
        prompt with the same prefix has the same prelude), for the engine to remember."""
        return self._given if self._given is not None else self._definite

    @cached_property
    def _prelude(self) -> PromptPrelude:
        if self._given is not None:
            return self._given
        got, definite = self._read_prelude()
        if definite:
            self._definite = got
        return got

    def _read_prelude(self) -> tuple[PromptPrelude, bool]:
        """(prelude, settled): walk the leading messages, reading each one's header only until
        it is a system or developer message: a history's first message (which may be one huge
        item) is never scanned to its end."""
        ids, tok, stop = self.prompt_ids, self._tok, self._body_end
        pos = 0
        for _ in range(4):  # system, developer (and a spare): never walk into the history
            if pos >= stop:
                return PromptPrelude(), False  # the prompt ends here: a longer one may say more
            self.tokens_read += 1
            if ids[pos] != tok.start:
                return PromptPrelude(extent=pos + 1), True
            head = self._find(tok.message, pos + 1, min(stop, pos + _HEADER_MAX))
            if head < 0:
                return PromptPrelude(extent=pos + _HEADER_MAX), pos + _HEADER_MAX <= stop
            role = harmony_encoding().decode(self._slice(pos + 1, head)).partition("<|")[0].strip()
            if role not in ("system", "developer"):
                return PromptPrelude(extent=head + 1), True
            end = self._find(tok.end, head, stop)
            if end < 0:
                return PromptPrelude(), False
            if role == "developer":
                return self._developer(pos, end), True
            pos = end + 1
        return PromptPrelude(extent=pos), True

    def _developer(self, pos: int, end: int) -> PromptPrelude:
        key = tuple(self._slice(pos, end + 1))
        hit = _developer_messages.get(key)
        if hit is None:
            msg = _decode_message(list(key))
            dev_text = msg.text if msg is not None else ""
            hit = (parse_tool_declarations(dev_text), dev_text)
            _developer_messages.put(key, hit)
        return PromptPrelude(hit[0], hit[1], extent=end + 1)

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        """Tools declared in the prelude's developer message."""
        return self._prelude.tools

    @property
    def developer_text(self) -> str:
        return self._prelude.developer_text

    @property
    def tool_choice(self) -> str | None:
        """``"none"``, ``"required"``, a forced tool's name, or ``None`` (auto)."""
        text = self._prelude.developer_text
        if TOOL_CHOICE_NONE in text:
            return "none"
        if TOOL_CHOICE_REQUIRED in text:
            return "required"
        prefix, _, suffix = TOOL_CHOICE_NAMED.partition("{name}")
        at = text.find(prefix)
        if at >= 0:
            rest = text[at + len(prefix) :]
            end = rest.find(suffix)
            return rest[:end] if end >= 0 else None
        return None

    def messages(self) -> list[MessageView]:
        """Every message of the prompt, decoded — O(history): only for tests that need recall."""
        start, stop = self._tok.start, self._body_end
        out: list[MessageView] = []
        pos = self._find(start, 0, stop)
        while 0 <= pos < stop:
            nxt = self._find(start, pos + 1, stop)
            msg = _decode_message(self._slice(pos, nxt if nxt >= 0 else stop))
            if msg is not None:
                out.append(msg)
            pos = nxt
        return out
