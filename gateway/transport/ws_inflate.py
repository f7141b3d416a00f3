"""permessage-deflate whose inflation of a too-big message stops at the limit in small steps and keeps nothing.

``websockets`` already bounds a compressed frame's inflation by ``max_size`` (zlib's
``max_length``), but CPython's zlib fills that bound with an output buffer of growing blocks (up to
16 MiB each) and then copies them into one ``bytes`` of the full size before ``websockets`` sees the
leftover input and refuses the frame (1009): a ~64 KB frame that inflates past a 32 MiB limit cost
~64 MiB at its peak, all of it freed at once. Blocks that size raise glibc's dynamic ``mmap``
threshold, so later ones come from the heap, and up to twice that threshold of freed heap is kept
rather than returned: after bursts of such frames the process stayed ~50 MiB above where it began
(issue 28 item 14; ``malloc_trim`` gave it back, the collector did not — the memory was free, not
held).

:class:`SteppedInflater` inflates in :data:`INFLATE_STEP` pieces and, when the message would pass
the bound, drops them and returns nothing (``websockets`` then refuses the frame, as before, from
``unconsumed_tail``): a refused frame costs at most ``max_size`` in step-sized pieces, never a copy
of it, and pieces that size come and go without moving the allocator's thresholds. A message
within the bound is inflated and joined exactly as before.

Installed by ``CorkedWebSocketProtocol`` (gateway/transport/corked.py) in place of the server's
``permessage-deflate`` factory; negotiation, compression and every other frame path are
``websockets``' code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from websockets.extensions.base import ServerExtensionFactory
from websockets.extensions.permessage_deflate import PerMessageDeflate, ServerPerMessageDeflateFactory

__all__ = ["INFLATE_STEP", "SteppedDeflateFactory", "SteppedInflater", "stepped_extensions"]

#: bytes a compressed message is inflated by at a time
INFLATE_STEP = 1024 * 1024


class SteppedInflater:
    """A ``zlib.decompressobj`` as ``PerMessageDeflate.decode`` uses it (``decompress(data,
    max_length)`` and ``unconsumed_tail``), inflating a bounded call in :data:`INFLATE_STEP` steps
    and returning ``b""`` when the bound is reached with input left (the caller refuses the frame)."""

    __slots__ = ("_zlib", "unconsumed_tail")

    def __init__(self, decompressor: Any) -> None:
        self._zlib = decompressor
        self.unconsumed_tail = b""

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        z = self._zlib
        if max_length <= INFLATE_STEP:  # 0: unbounded; a small bound: one step anyway
            out: bytes = z.decompress(data, max_length)
            self.unconsumed_tail = z.unconsumed_tail
            return out
        parts: list[bytes] = []
        room = max_length
        while True:
            part = z.decompress(data, min(INFLATE_STEP, room))
            parts.append(part)
            room -= len(part)
            data = z.unconsumed_tail
            if not data or not room:
                break
        self.unconsumed_tail = data
        if data:  # past the bound: refused by the caller, so nothing is joined
            parts.clear()
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)


class SteppedDeflate(PerMessageDeflate):
    """``websockets``' extension, its decoder wrapped in a :class:`SteppedInflater` whenever set."""

    @property  # type: ignore[override]
    def decoder(self) -> SteppedInflater:
        return self._stepped

    @decoder.setter
    def decoder(self, decompressor: Any) -> None:
        self._stepped = SteppedInflater(decompressor)

    @decoder.deleter
    def decoder(self) -> None:
        del self._stepped


class SteppedDeflateFactory(ServerExtensionFactory):
    """The server's ``permessage-deflate`` factory, negotiating as ``inner`` does, its extension a
    :class:`SteppedDeflate`."""

    def __init__(self, inner: ServerPerMessageDeflateFactory) -> None:
        self.inner = inner
        self.name = inner.name

    def process_request_params(
        self, params: Sequence[tuple[str, str | None]], accepted_extensions: Sequence[Any]
    ) -> tuple[list[tuple[str, str | None]], Any]:
        response, ext = self.inner.process_request_params(params, accepted_extensions)
        return response, SteppedDeflate(
            ext.remote_no_context_takeover,
            ext.local_no_context_takeover,
            ext.remote_max_window_bits,
            ext.local_max_window_bits,
            ext.compress_settings,
        )


def stepped_extensions(factories: Sequence[Any] | None) -> list[Any] | None:
    """``factories`` with each ``permessage-deflate`` factory wrapped in a :class:`SteppedDeflateFactory`."""
    if factories is None:
        return None
    return [SteppedDeflateFactory(f) if isinstance(f, ServerPerMessageDeflateFactory) else f for f in factories]
