"""What the simulated engine reads from a harmony prompt — lazily, and never the whole history.

The simulated engine gets only token ids, like a real one. To answer plausibly it needs two
things: the newest message (to echo it, or to know a tool just returned) and the tools offered in
the prelude (to build a call). Benchmarks run it with 128k-token histories, so a turn must cost
O(newest message + prelude), not O(history):

* the **tail**: search backwards (C-speed, in reversed chunks) for the last ``<|start|>`` before
  the generation prompt, and decode only that message;
* the **prelude**: the leading system/developer messages, found with ``list.index`` from the
  front; their tool declarations (harmony's TypeScript-like rendering) are parsed and cached by
  the prelude's tokens.

:meth:`PromptView.messages` decodes everything, for recall tests that ask for it explicitly.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

from inference.harmony_core import FREEFORM_NOTE, FUNCTIONS, harmony_encoding, harmony_tokens
from inference.harmony_render import TOOL_CHOICE_NAMED, TOOL_CHOICE_NONE, TOOL_CHOICE_REQUIRED

__all__ = ["MessageView", "PromptView", "ToolSpec", "parse_tool_declarations"]

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
            tools.append(
                ToolSpec(name, None if ns == FUNCTIONS else ns, desc, params, FREEFORM_NOTE in desc)
            )
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


def _rfind(seq: list[int], value: int, end: int, chunk: int = 512) -> int:
    """Last index of ``value`` in ``seq[:end]`` (-1 if absent), scanning reversed slices in C so
    the cost is proportional to the distance from ``end``, not to ``len(seq)``."""
    hi = end
    while hi > 0:
        lo = max(0, hi - chunk)
        part = seq[lo:hi]
        part.reverse()
        try:
            return hi - 1 - part.index(value)
        except ValueError:
            hi = lo
    return -1


_prelude_cache: OrderedDict[tuple[int, ...], tuple[tuple[ToolSpec, ...], str]] = OrderedDict()
_prelude_lock = threading.Lock()


class PromptView:
    """Lazy read-only view of a harmony prompt, handed to simulated-engine scripts."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = prompt_ids
        tok = harmony_tokens()
        self._tok = tok
        n = len(prompt_ids)
        self._body_end = n - 2 if prompt_ids[-2:] == [tok.start, tok.assistant] else n

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @cached_property
    def last(self) -> MessageView | None:
        """The newest message before the generation prompt (O(its length))."""
        start = _rfind(self.prompt_ids, self._tok.start, self._body_end)
        if start < 0:
            return None
        return _decode_message(self.prompt_ids[start : self._body_end])

    @cached_property
    def _prelude(self) -> tuple[tuple[ToolSpec, ...], str]:
        ids, tok = self.prompt_ids, self._tok
        pos, stop = 0, self._body_end
        dev_text = ""
        for _ in range(4):  # system, developer (and a spare): never walk into the history
            if pos >= stop or ids[pos] != tok.start:
                break
            end = _next(ids, tok.end, pos, stop)
            head = _next(ids, tok.message, pos, end) if end >= 0 else -1
            if head < 0:
                break
            role = harmony_encoding().decode(ids[pos + 1 : head]).partition("<|")[0].strip()
            if role not in ("system", "developer"):
                break
            if role == "developer":
                key = tuple(ids[pos : end + 1])
                with _prelude_lock:
                    hit = _prelude_cache.get(key)
                if hit is None:
                    msg = _decode_message(ids[pos : end + 1])
                    dev_text = msg.text if msg is not None else ""
                    hit = (parse_tool_declarations(dev_text), dev_text)
                    with _prelude_lock:
                        _prelude_cache[key] = hit
                        if len(_prelude_cache) > 32:
                            _prelude_cache.popitem(last=False)
                return hit
            pos = end + 1
        return (), dev_text

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        """Tools declared in the prelude's developer message."""
        return self._prelude[0]

    @property
    def developer_text(self) -> str:
        return self._prelude[1]

    @property
    def tool_choice(self) -> str | None:
        """``"none"``, ``"required"``, a forced tool's name, or ``None`` (auto)."""
        text = self._prelude[1]
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
        ids, start = self.prompt_ids, self._tok.start
        out: list[MessageView] = []
        pos = _next(ids, start, 0, self._body_end)
        while 0 <= pos < self._body_end:
            nxt = _next(ids, start, pos + 1, self._body_end)
            msg = _decode_message(ids[pos : nxt if nxt >= 0 else self._body_end])
            if msg is not None:
                out.append(msg)
            pos = nxt
        return out


def _next(ids: list[int], value: int, lo: int, hi: int) -> int:
    try:
        return ids.index(value, lo, hi)
    except ValueError:
        return -1
