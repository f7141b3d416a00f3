"""Streaming output parsing: sampled token ids -> semantic item events.

Parsers are fed token deltas as the engine produces them and emit a flat stream of events the
gateway's event builder turns into Responses streaming events. They know nothing of Responses ids,
sequence numbers or transports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from inference.item_types import OutputKind as ItemKind


class ItemStart(msgspec.Struct, frozen=True):
    kind: ItemKind
    #: tool name as the client knows it (flattened names already restored)
    name: str | None = None
    namespace: str | None = None
    #: harmony channel a message came from ("final" / "commentary"), informative
    phase: str | None = None


class ItemDelta(msgspec.Struct, frozen=True):
    """More text of the open item: message text, reasoning text, JSON arguments, custom tool input."""

    text: str


class ItemEnd(msgspec.Struct, frozen=True):
    """The open item is complete (``complete=False`` when the stream ended mid-item)."""

    complete: bool = True


ParseEvent = ItemStart | ItemDelta | ItemEnd


class StreamParser(Protocol):
    #: sampled tokens that belonged to reasoning (for usage.output_tokens_details.reasoning_tokens)
    reasoning_tokens: int

    def feed(self, token_ids: Sequence[int]) -> list[ParseEvent]: ...

    def finish(self) -> list[ParseEvent]:
        """End of generation: close any open item (as incomplete if it was cut off)."""
