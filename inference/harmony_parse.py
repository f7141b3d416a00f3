"""Harmony output parser (gpt-oss): sampled token ids -> item events, one token at a time.

Wraps harmony's own ``StreamableParser`` (role ``assistant``: the prompt already ended with
``<|start|>assistant``) so that grammar details — the recipient in the role header or in the
channel header, ``<|constrain|>``, multi-message outputs — are harmony's, not ours. We only map
each message to an item:

==========================================  =================================================
message header                              item
==========================================  =================================================
recipient ``functions.X`` / ``ns.X``        ``function_call`` (``name=X``, ``namespace=ns``), or
                                            ``custom_tool_call`` when X is a freeform tool
channel ``analysis`` (no recipient)          ``reasoning``
channel ``final`` / ``commentary`` / other   ``message`` with ``phase`` = the channel
==========================================  =================================================

Why we watch token ids instead of polling the parser's state: the parser's ``state`` and
``messages`` properties serialise JSON of everything parsed so far, which would make a long
generation quadratic. The transitions that matter are visible in the token itself: ``<|message|>``
ends a header (then we read channel/recipient once), ``<|end|>``/``<|return|>``/``<|call|>`` end
the content. Text comes from ``last_content_delta``, which harmony only yields once the bytes
decode, so a multi-byte character split across tokens is emitted whole, exactly once. Cost is
O(1) per token fed. Text of one item within one ``feed`` call is coalesced into one
:class:`ItemDelta`, so the event count follows the engine's delta size, not the token count.

Malformed output (a header that never reaches ``<|message|>``, a missing ``<|start|>``) raises
:class:`HarmonyParseError`; the pipeline fails the turn, like vLLM does.

Fast path. Harmony's Rust parser costs ~50 µs per *header* token and ~190 µs to create (measured:
~0.7 ms for a short two-message turn, a fifth of the gateway's CPU for it), while content tokens
cost ~2 µs. So the parser reads the common case itself: headers of exactly the canonical shapes
(:data:`_HEADER`: ``[ to=R]<|channel|>analysis|commentary|final[ to=R][ [<|constrain|>]json]``, the
role ``assistant``), content decoded with an incremental UTF-8 decoder from the vocabulary's bytes,
terminators ``<|end|>``/``<|return|>``/``<|call|>``. Anything else — another header shape, a special
token inside content, bytes that are not UTF-8, a token out of the vocabulary, text after a
terminator — hands the generation to harmony's parser, which replays every token seen so far and
takes over from there, so the uncommon cases stay harmony's. A property test checks both paths
give the same events (``tests/inference/test_harmony_fast_parse.py``).
"""

from __future__ import annotations

import re
import threading
from codecs import utf_8_decode as _utf_8_decode
from collections.abc import Sequence
from typing import Any

from inference.harmony_core import ToolCatalog, content_encoding, harmony_encoding, harmony_tokens
from inference.parse import ItemDelta, ItemEnd, ItemStart, ParseEvent

__all__ = ["HarmonyParseError", "HarmonyStreamParser"]

#: canonical header text between the role and ``<|message|>`` (verified against harmony's parser,
#: which reads a bare word after the channel as a recipient: a content type needs a recipient, and
#: one glued to the channel name needs ``to=`` right before it)
_HEADER = re.compile(
    r"(?: to=(?P<r1>[^\s<]+))?<\|channel\|>(?P<channel>analysis|commentary|final)"
    r"(?: to=(?P<r2>[^\s<]+))?(?P<ct> <\|constrain\|>json| json|<\|constrain\|>json)?"
)
_ROLE = "assistant"


#: (role expected, header token ids) -> (channel, recipient), for headers the fast path read before:
#: a turn's headers are the same few (``<|channel|>analysis``, ``<|channel|>final``, a call to a
#: known tool), and reading one decodes and matches its tokens. Bounded: a model writing odd
#: headers fills it once and then reads them each time. Only headers that read (no fallback) go in.
_HEADERS: dict[tuple[Any, ...], tuple[str, str | None]] = {}
_MAX_HEADERS = 4096


class HarmonyParseError(ValueError):
    """The sampled tokens are not valid harmony."""


class _Vocab:
    """Token id -> bytes (o200k's ordinary tokens via tiktoken; harmony's specials by name), and
    the text of each ordinary token whose bytes are whole UTF-8 on their own (``texts``: filled as
    tokens are first decoded, so at most the vocabulary; a dict write is atomic, so threads share it)."""

    def __init__(self) -> None:
        self.token_bytes = content_encoding().decode_single_token_bytes
        self.texts: dict[int, str] = {}
        enc = harmony_encoding()
        self.specials: dict[int, str] = {}
        for name in enc.special_tokens_set:
            ids = enc.encode(name, allowed_special="all")
            if len(ids) == 1:
                self.specials[ids[0]] = name
        tok = harmony_tokens()
        #: tokens a header does not simply take in: ``<|message|>`` (it ends the header) and the
        #: special tokens other than ``<|channel|>`` and ``<|constrain|>`` (the fast path leaves them
        #: to harmony's parser)
        self.header_stops = frozenset(self.specials).difference((tok.channel, tok.constrain)) | {tok.message}


_vocab: _Vocab | None = None
_vocab_lock = threading.Lock()


def vocab_bytes() -> _Vocab:
    global _vocab
    if _vocab is None:
        with _vocab_lock:
            if _vocab is None:
                _vocab = _Vocab()
    return _vocab


class _Fallback(Exception):
    """The fast path met something it does not read: harmony's parser takes over."""


class HarmonyStreamParser:
    """:class:`inference.parse.StreamParser` for one gpt-oss generation."""

    def __init__(self, catalog: ToolCatalog | None = None, *, fast: bool = True) -> None:
        """``fast=False`` reads every token with harmony's parser (the reference the fast path is
        tested against)."""
        self._catalog = catalog if catalog is not None else ToolCatalog(())
        self._tok = harmony_tokens()
        self._terminators = self._tok.terminators
        self._vocab = vocab_bytes()
        self._parser: Any = None  # harmony's StreamableParser, once the fast path gave up
        #: tokens fed since the last terminator, for the hand-over (which replays only the
        #: message in progress: after a terminator harmony's parser expects ``<|start|>``)
        self._seen: list[int] = []
        self._first_message = True  # the role came with the prompt: replay with role=assistant
        self._header: list[int] = []
        self._expect_role = False  # the generation prompt already said <|start|>assistant
        self._expect_start = False  # after a terminator: only <|start|> may follow
        #: bytes of a character split across tokens, not decoded yet (``codecs.utf_8_decode`` with
        #: ``final=False`` keeps an incomplete trailing sequence back, as an incremental decoder does)
        self._pending = b""
        self._texts = self._vocab.texts
        self._in_content = False
        self._reasoning = False
        self._header_tokens = 0
        self.reasoning_tokens = 0
        if not fast:
            self._hand_over()

    @property
    def handed_over(self) -> bool:
        """Whether harmony's parser reads this generation (the fast path met something unusual)."""
        return self._parser is not None

    def feed(self, token_ids: Sequence[int]) -> list[ParseEvent]:
        if len(token_ids) == 1 and self._parser is None:
            # most engine deltas are one token: the two commonest kinds read here, the rest below
            tok = token_ids[0]
            if self._in_content:
                # an ordinary token of an open item, its text known whole (a terminator, a special
                # token or a split character is not in ``texts``)
                text = self._texts.get(tok) if not self._pending else None
                if text is not None:
                    self._seen.append(tok)
                    if self._reasoning:
                        self.reasoning_tokens += 1
                    return [ItemDelta(text)]
            elif not self._expect_start and tok not in self._vocab.header_stops:
                # a header token that neither ends the header nor is foreign to it: kept for reading
                self._header.append(tok)
                self._header_tokens += 1
                self._seen.append(tok)
                return []
        events: list[ParseEvent] = []
        if self._parser is None:
            for i, tok in enumerate(token_ids):
                try:
                    self._fast(tok, events)
                except _Fallback:
                    self._hand_over()
                    self._slow(token_ids[i:], events)
                    return events
                if not self._expect_start:  # a terminator just cleared it
                    self._seen.append(tok)
            return events
        self._slow(token_ids, events)
        return events

    # -- fast path -----------------------------------------------------------------------------

    def _fast(self, tok: int, events: list[ParseEvent]) -> None:
        if self._in_content:
            if tok in self._terminators:
                if self._reasoning:
                    self.reasoning_tokens += 1
                self._end(events)
                self._pending = b""
                self._expect_start = True
                self._seen.clear()
                self._first_message = False
                return
            if tok in self._vocab.specials:
                raise _Fallback
            text = self._texts.get(tok) if not self._pending else None
            if text is None:
                try:
                    data = self._vocab.token_bytes(tok)
                    text, used = _utf_8_decode(self._pending + data, "strict", False)
                except (KeyError, UnicodeDecodeError) as e:
                    raise _Fallback from e
                if not self._pending and used == len(data) and text:
                    self._texts[tok] = text  # whole on its own: the next time, a lookup
                self._pending = (self._pending + data)[used:]
            if self._reasoning:
                self.reasoning_tokens += 1
            if text:
                self._delta(text, events)
            return
        if self._expect_start:
            if tok != self._tok.start:
                raise _Fallback
            self._expect_start = False
            self._expect_role = True
            self._header_tokens += 1
            return
        if tok == self._tok.message:
            key = (self._expect_role, *self._header)
            known = _HEADERS.get(key)
            if known is None:
                known = self._read_header()
                if len(_HEADERS) < _MAX_HEADERS:
                    _HEADERS[key] = known
            else:
                self._expect_role = False  # what reading it sets
            channel, recipient = known
            self._header_tokens += 1
            self._header.clear()
            events.append(self._open(channel, recipient))
            return
        if tok in self._vocab.header_stops:  # <|message|> was read above: another special token
            raise _Fallback
        self._header.append(tok)
        self._header_tokens += 1

    def _read_header(self) -> tuple[str, str | None]:
        specials = self._vocab.specials
        try:
            text = b"".join(
                specials[t].encode() if t in specials else self._vocab.token_bytes(t) for t in self._header
            ).decode("utf-8")
        except (KeyError, UnicodeDecodeError) as e:
            raise _Fallback from e
        if self._expect_role:
            if not text.startswith(_ROLE):
                raise _Fallback
            text = text[len(_ROLE) :]
        m = _HEADER.fullmatch(text)
        if m is None or (m["r1"] and m["r2"]):
            raise _Fallback
        ct = m["ct"]
        if ct and not (m["r2"] or (m["r1"] and ct[0] == " ")):
            raise _Fallback
        self._expect_role = False
        return m["channel"], m["r1"] or m["r2"]

    def _hand_over(self) -> None:
        """Replay everything seen into harmony's parser, which reads the rest."""
        from openai_harmony import HarmonyError, Role, StreamableParser

        parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT if self._first_message else None)
        try:
            for tok in self._seen:
                parser.process(tok)
        except HarmonyError as e:
            raise HarmonyParseError(str(e)) from e
        self._parser = parser
        self._seen = []

    # -- harmony's parser ----------------------------------------------------------------------

    def _slow(self, token_ids: Sequence[int], events: list[ParseEvent]) -> None:
        from openai_harmony import HarmonyError

        parser = self._parser
        for tok in token_ids:
            try:
                parser.process(tok)
            except HarmonyError as e:
                raise HarmonyParseError(str(e)) from e
            if not self._in_content:
                self._header_tokens += 1
                if tok == self._tok.message:
                    events.append(self._open(parser.current_channel, parser.current_recipient))
                continue
            if self._reasoning:
                self.reasoning_tokens += 1
            if tok in self._terminators:
                self._end(events)
                continue
            delta = parser.last_content_delta
            if delta:
                self._delta(delta, events)

    # -- shared --------------------------------------------------------------------------------

    @staticmethod
    def _delta(text: str, events: list[ParseEvent]) -> None:
        # one delta per item per feed: the engine's chunking, not one event per token
        if events and isinstance(events[-1], ItemDelta):
            events[-1] = ItemDelta(events[-1].text + text)
        else:
            events.append(ItemDelta(text))

    def _end(self, events: list[ParseEvent]) -> None:
        self._in_content = False
        self._reasoning = False
        self._header_tokens = 0
        events.append(ItemEnd())

    def _open(self, channel: str | None, recipient: str | None) -> ItemStart:
        """Header complete: decide the item kind from channel and recipient."""
        self._in_content = True
        if recipient and recipient != "assistant":
            name, namespace = self._catalog.split_recipient(recipient)
            custom = self._catalog.is_custom(name, namespace)
            return ItemStart(
                "custom_tool_call" if custom else "function_call", name=name, namespace=namespace, phase=channel
            )
        if channel == "analysis":
            self._reasoning = True
            self.reasoning_tokens += self._header_tokens
            return ItemStart("reasoning", phase=channel)
        return ItemStart("message", phase=channel or "final")

    def finish(self) -> list[ParseEvent]:
        """Close an item cut off mid-content as incomplete; a dangling header yields nothing."""
        if self._in_content:
            self._in_content = False
            self._reasoning = False
            return [ItemEnd(complete=False)]
        return []
