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
"""

from __future__ import annotations

from typing import Sequence

from inference.harmony_core import ToolCatalog, harmony_encoding, harmony_tokens
from inference.parse import ItemDelta, ItemEnd, ItemStart, ParseEvent

__all__ = ["HarmonyParseError", "HarmonyStreamParser"]


class HarmonyParseError(ValueError):
    """The sampled tokens are not valid harmony."""


class HarmonyStreamParser:
    """:class:`inference.parse.StreamParser` for one gpt-oss generation."""

    def __init__(self, catalog: ToolCatalog | None = None) -> None:
        from openai_harmony import Role, StreamableParser

        self._catalog = catalog if catalog is not None else ToolCatalog(())
        self._tok = harmony_tokens()
        self._terminators = self._tok.terminators
        self._parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT)
        self._in_content = False
        self._reasoning = False
        self._header_tokens = 0
        self.reasoning_tokens = 0

    def feed(self, token_ids: Sequence[int]) -> list[ParseEvent]:
        from openai_harmony import HarmonyError

        events: list[ParseEvent] = []
        parser = self._parser
        for tok in token_ids:
            try:
                parser.process(tok)
            except HarmonyError as e:
                raise HarmonyParseError(str(e)) from e
            if not self._in_content:
                self._header_tokens += 1
                if tok == self._tok.message:
                    events.append(self._open())
                continue
            if self._reasoning:
                self.reasoning_tokens += 1
            if tok in self._terminators:
                self._in_content = False
                self._reasoning = False
                self._header_tokens = 0
                events.append(ItemEnd())
                continue
            delta = parser.last_content_delta
            if delta:
                # one delta per item per feed: the engine's chunking, not one event per token
                if events and isinstance(events[-1], ItemDelta):
                    events[-1] = ItemDelta(events[-1].text + delta)
                else:
                    events.append(ItemDelta(delta))
        return events

    def _open(self) -> ItemStart:
        """Header complete: decide the item kind from channel and recipient."""
        parser = self._parser
        channel = parser.current_channel
        recipient = parser.current_recipient
        self._in_content = True
        if recipient and recipient != "assistant":
            name, namespace = self._catalog.split_recipient(recipient)
            kind = "custom_tool_call" if self._catalog.is_custom(name, namespace) else "function_call"
            return ItemStart(kind, name=name, namespace=namespace, phase=channel)
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
