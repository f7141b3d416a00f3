"""Hermes output parser (chat-template family): sampled token ids -> item events, as they stream.

Output grammar (Qwen2.5 / Hermes; SmolLM2 gets the same format through emulation)::

    [<think> reasoning </think>] [text] (<tool_call>{"name": N, "arguments": {...}}</tool_call>)* <|im_end|>

==================================================  =========================================
sampled text                                        item
==================================================  =========================================
``<think>…</think>``                                ``reasoning`` (one leading/trailing ``\\n``
                                                    of the text and the ``\\n`` after the tag
                                                    are format, not content)
text outside tags                                   ``message`` (the ``\\n`` before a
                                                    ``<tool_call>`` is format; whitespace-only
                                                    text between/after calls is dropped)
``<tool_call>{"name": "ns__t", "arguments": A}``    ``function_call`` name ``t`` namespace
                                                    ``ns`` (flattened names restored), argument
                                                    deltas streamed as they arrive
same, for a freeform (``custom``) tool              ``custom_tool_call``, input = ``A["input"]``
                                                    (emitted when the call closes: it is a JSON
                                                    string inside the envelope)
``<tool_call>`` with malformed JSON                  the tag and body as ``message`` text
==================================================  =========================================

Decoding is incremental (vLLM's offsets method: decode a small window of recent tokens and emit
the new text once it no longer ends in U+FFFD), so a multi-byte character split across tokens is
emitted whole, once, and the cost per token is O(window), not O(output). Tags may be split across
tokens: text that could be the start of a tag is held back until it is decided.

Never raises on model output: what does not parse is text. One exception to "malformed -> text":
a call whose header ``{"name": "f", "arguments":`` was well-formed has already been streamed as a
``function_call``; if its arguments then turn out not to be JSON the item keeps them verbatim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from inference.hermes_tools import CUSTOM_ARG, HermesToolCatalog
from inference.item_types import CALL_TYPES
from inference.parse import ItemDelta, ItemEnd, ItemStart, ParseEvent

__all__ = ["HermesStreamParser"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
_TEXT, _THINK, _CALL = 0, 1, 2


def _held_prefix(text: str, tags: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class HermesStreamParser:
    """:class:`inference.parse.StreamParser` for one generation of a Hermes-format model."""

    def __init__(
        self, tokenizer: Any, catalog: HermesToolCatalog | None = None, *, stop_token_ids: Sequence[int] = ()
    ) -> None:
        #: a ``tokenizers.Tokenizer`` (the fast backend): only ``decode`` is used
        self._tok = tokenizer
        self._catalog = catalog if catalog is not None else HermesToolCatalog(())
        self._stops = frozenset(stop_token_ids)
        self._ids: list[int] = []
        self._prefix = 0  # decode window start
        self._read = 0  # tokens already turned into text
        self._state = _TEXT
        self._pending = ""  # decoded text not yet classified
        self._open: str | None = None  # kind of the open item
        self._after_call = False  # text now follows a tool call (leading whitespace is format)
        self._think_started = False  # inside <think>: leading newlines skipped already
        self._after_think = False  # newlines right after </think> are skipped
        self._call_prefix = ""  # the format newline dropped before a <tool_call>
        self._body = ""  # the current <tool_call> body
        self._streamed = -1  # chars of the call's arguments already emitted (-1: header not seen)
        self._header_end = 0
        self._items = 0
        self._stopped = False
        self._finished = False
        self.reasoning_tokens = 0

    # -- input ---------------------------------------------------------------------------------

    def feed(self, token_ids: Sequence[int]) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        for tok in token_ids:
            if self._stopped or self._finished:
                break
            if tok in self._stops:
                self._stopped = True
                self._drain(events)
                self._flush(events, final=True)
                self._close_all(events, complete=True)
                break
            before = self._state
            self._ids.append(tok)
            text = self._decode_step()
            if text:
                self._pending += text
                self._scan(events)
            if before == _THINK or self._state == _THINK:
                self.reasoning_tokens += 1
        return self._coalesce(events)

    def finish(self) -> list[ParseEvent]:
        """End of generation. Without a stop token the open item (if any) ends incomplete."""
        if self._finished:
            return []
        self._finished = True
        events: list[ParseEvent] = []
        if not self._stopped:
            self._drain(events)
            self._flush(events, final=True)
            self._close_all(events, complete=False)
        return self._coalesce(events)

    def _drain(self, events: list[ParseEvent]) -> None:
        """Decode what is still held for an incomplete character (end of text: emit it as is)."""
        if self._read < len(self._ids):
            tail = self._tok.decode(self._ids[self._prefix :], skip_special_tokens=False)
            done = self._tok.decode(self._ids[self._prefix : self._read], skip_special_tokens=False)
            self._pending += tail[len(done) :]
            self._prefix = self._read = len(self._ids)
            self._scan(events)

    def _decode_step(self) -> str:
        ids = self._ids
        done = self._tok.decode(ids[self._prefix : self._read], skip_special_tokens=False)
        text = self._tok.decode(ids[self._prefix :], skip_special_tokens=False)
        if len(text) > len(done) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(ids)
            return text[len(done) :]
        return ""

    # -- scanning ------------------------------------------------------------------------------

    def _scan(self, events: list[ParseEvent]) -> None:
        while self._pending:
            if self._state == _CALL:
                if not self._scan_call(events):
                    return
            elif self._state == _THINK:
                i = self._pending.find(THINK_CLOSE)
                if i < 0:
                    self._reasoning_text(events, self._pending, final=False)
                    return
                self._reasoning_text(events, self._pending[:i], final=True)
                self._pending = self._pending[i + len(THINK_CLOSE) :]
                self._end(events, complete=True)
                self._state, self._after_think = _TEXT, True
            else:
                if self._after_think:  # the newlines after </think> are format
                    self._pending = self._pending.lstrip("\n")
                    if not self._pending:
                        return
                    self._after_think = False
                i, tag = self._find_open()
                if i < 0:
                    return self._message_text(events, final=False)
                head, self._pending = self._pending[:i], self._pending[i + len(tag) :]
                self._message_text(events, final=True, text=head, before_call=tag == CALL_OPEN)
                if tag == THINK_OPEN:
                    self._end(events, complete=True)
                # before a call the message stays open: a malformed call continues it as text
                if tag == THINK_OPEN:
                    self._start(events, ItemStart("reasoning"))
                    self._state, self._think_started = _THINK, False
                else:
                    self._state, self._body, self._streamed = _CALL, "", -1

    def _find_open(self) -> tuple[int, str]:
        t, c = self._pending.find(THINK_OPEN), self._pending.find(CALL_OPEN)
        if c >= 0 and (t < 0 or c < t):
            return c, CALL_OPEN
        return (t, THINK_OPEN) if t >= 0 else (-1, "")

    def _message_text(
        self, events: list[ParseEvent], *, final: bool, text: str | None = None, before_call: bool = False
    ) -> None:
        """Emit outside-tag text; hold back what may be a tag start or a format newline."""
        if text is None:  # streaming: decide how much of the pending text is safe to emit
            text = self._pending
            hold = _held_prefix(text, (THINK_OPEN, CALL_OPEN))
            if text[: len(text) - hold].endswith("\n"):
                hold += 1  # maybe the newline before a <tool_call>
            if self._open != "message" and self._after_call and not text[: len(text) - hold].strip():
                return  # whitespace after a call is format until real text arrives
            text, self._pending = text[: len(text) - hold], text[len(text) - hold :]
        elif before_call:
            self._call_prefix = "\n" if text.endswith("\n") else ""
            text = text[: len(text) - len(self._call_prefix)]
        if self._open != "message":
            if self._after_call:
                text = text.lstrip()
            if not text:
                return
            self._start(events, ItemStart("message"))
        if text:
            events.append(ItemDelta(text))

    def _reasoning_text(self, events: list[ParseEvent], text: str, *, final: bool) -> None:
        if not self._think_started:
            text = text.lstrip("\n")
            if not text:
                self._pending = ""
                return
            self._think_started = True
        if final:
            text = text.rstrip("\n")
            self._pending = ""
        else:
            hold = _held_prefix(text, (THINK_CLOSE,))
            keep = len(text) - hold
            while keep > 0 and text[keep - 1] == "\n":
                keep -= 1
            text, self._pending = text[:keep], text[keep:]
        if text:
            events.append(ItemDelta(text))

    def _scan_call(self, events: list[ParseEvent]) -> bool:
        """Consume call body text; return whether the call closed (scanning continues)."""
        i = self._pending.find(CALL_CLOSE)
        if i >= 0:
            self._body += self._pending[:i]
            self._pending = self._pending[i + len(CALL_CLOSE) :]
        else:
            hold = _held_prefix(self._pending, (CALL_CLOSE,))
            self._body += self._pending[: len(self._pending) - hold]
            self._pending = self._pending[len(self._pending) - hold :]
        closed = i >= 0
        if self._streamed < 0:
            self._try_header(events)
        if self._streamed >= 0:
            args = self._body[self._header_end :]
            j = len(args)
            while j and args[j - 1].isspace():
                j -= 1
            end = j - 1 if j and args[j - 1] == "}" else len(args)  # the envelope's closing brace
            if end > self._streamed:
                events.append(ItemDelta(args[self._streamed : end]))
                self._streamed = end
        if not closed:
            return False
        self._state = _TEXT
        self._after_call = True
        if self._streamed >= 0:
            self._end(events, complete=True)
        else:
            self._whole_call(events)
        return True

    def _try_header(self, events: list[ParseEvent]) -> None:
        m = _HEADER.match(self._body)
        if m is None:
            return
        try:
            flat = json.loads(f'"{m.group(1)}"')
        except ValueError:
            return
        name, namespace, custom = self._catalog.resolve(flat)
        if custom:
            return  # the raw input is a JSON string: emitted whole when the call closes
        self._start(events, ItemStart("function_call", name=name, namespace=namespace))
        self._header_end, self._streamed = m.end(), 0

    def _whole_call(self, events: list[ParseEvent]) -> None:
        """A call not streamed (custom tool, unusual key order): parse it whole, or it is text."""
        body = self._body
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and "arguments" in obj:
            name, namespace, custom = self._catalog.resolve(obj["name"])
            args = obj["arguments"]
            if custom and isinstance(args, dict) and isinstance(args.get(CUSTOM_ARG), str):
                self._start(events, ItemStart("custom_tool_call", name=name, namespace=namespace))
                events.append(ItemDelta(args[CUSTOM_ARG]))
            else:
                self._start(events, ItemStart("function_call", name=name, namespace=namespace))
                text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                events.append(ItemDelta(text))
            self._end(events, complete=True)
            return
        self._as_text(events, CALL_OPEN + body + CALL_CLOSE)

    def _as_text(self, events: list[ParseEvent], text: str) -> None:
        """A would-be call that is not one: message text (continuing the message before it)."""
        self._after_call = False
        if self._open != "message":
            self._start(events, ItemStart("message"))
        events.append(ItemDelta(self._call_prefix + text))
        self._call_prefix = ""

    # -- items ---------------------------------------------------------------------------------

    def _start(self, events: list[ParseEvent], start: ItemStart) -> None:
        if self._open is not None:
            self._end(events, complete=True)
        self._open = start.kind
        self._items += 1
        if start.kind != "message":
            self._call_prefix = ""
        if start.kind != "message":
            self._after_call = start.kind in CALL_TYPES
        events.append(start)

    def _end(self, events: list[ParseEvent], *, complete: bool) -> None:
        if self._open is not None:
            self._open = None
            events.append(ItemEnd(complete=complete))

    def _flush(self, events: list[ParseEvent], *, final: bool) -> None:
        """End of text: whatever is held back is content of the current state."""
        pending, self._pending = self._pending, ""
        if self._state == _THINK:
            self._reasoning_text(events, pending, final=True)
        elif self._state == _CALL:
            if self._streamed < 0:  # cut off inside a call that never became one: text
                self._as_text(events, CALL_OPEN + self._body + pending)
            else:
                self._body += pending
                args = self._body[self._header_end :]
                if len(args) > self._streamed:
                    events.append(ItemDelta(args[self._streamed :]))
                    self._streamed = len(args)
        else:
            self._message_text(events, final=True, text=pending)
        if final and self._items == 0 and self._stopped:
            self._start(events, ItemStart("message"))  # an empty answer is still an answer

    def _close_all(self, events: list[ParseEvent], *, complete: bool) -> None:
        self._end(events, complete=complete)
        self._state = _TEXT

    @staticmethod
    def _coalesce(events: list[ParseEvent]) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        for ev in events:
            if isinstance(ev, ItemDelta) and out and isinstance(out[-1], ItemDelta):
                out[-1] = ItemDelta(out[-1].text + ev.text)
            elif not (isinstance(ev, ItemDelta) and not ev.text):
                out.append(ev)
        return out
