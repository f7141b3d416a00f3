"""Request bodies sent with ``Content-Encoding``: decoded a bounded step at a time, never past a bound.

Codex can send its request bodies in ``zstd``, and proxies in front of clients compress them with
``gzip``, ``deflate`` or ``br``; before this module such a body was parsed as the JSON it is not
(400 ``invalid_json``). What makes decoding a body dangerous is its ratio: 10 MB of gzip is
10 GB of zeros, and a brotli or zstd stream of a few KB can be as much. So the bound is on the
*decoded* bytes and every decompressor call is bounded in its output:

* :class:`BodyDecoder` takes the body chunk by chunk once the transport read it whole — its pace
  and its bytes on the wire are bounded there (``gateway/transport/http_routes.py``), and a body
  that stalls then holds what it sent, not what that inflates to — and inflates each in
  calls of at most :data:`STEP` bytes of output (zlib's ``max_length``, zstd's ``max_length``,
  brotli's ``output_buffer_limit``). It keeps what it decoded and raises :class:`DecodedTooLarge`
  as soon as that passes the limit: a bomb costs the limit plus a step or two (a brotli call may
  overshoot its bound by one buffer block), and the rest of it is never inflated.
* The decoders' own memory is bounded too: a zstd frame may ask for a window of up to 8 MiB — RFC
  9659's bound for the ``zstd`` content coding; zstd's own default would allow 128 MiB — and
  brotli's is at most 16 MiB by its format; gzip and deflate take 32 KiB. A body's worst case is
  the limit plus a window per layer.
* Stacked codings (``Content-Encoding: gzip, br``, RFC 9110 §8.4: listed in the order applied) are
  decoded in reverse order, each layer fed a step at a time by the one outside it, at most
  :data:`MAX_LAYERS` of them; ``identity`` is no coding. An outer layer's output is bounded too
  (the limit and a little): an inner layer that swallows input without output — a gzip name that
  never ends, empty stored blocks, zstd skippable frames — cannot make it inflate unseen, and the
  caller pauses after every call of every layer. Concatenated gzip members and zstd frames
  are one body (as ``gzip -d`` and ``zstd -d`` read them), at most :data:`MAX_MEMBERS` per layer:
  an empty member is ~20 bytes of input that cost a fresh decompressor each.

Refusals are :class:`~gateway.wire.validation.InputRejected` in the house's error shape: a coding
the gateway does not decode, or too many of them, is a 415 naming it, with ``Accept-Encoding``
listing the ones it does (RFC 9110 §15.5.16); data that does not decode — corrupt, truncated,
trailing bytes, a zstd window past the bound — is a 400 ``invalid_content_encoding`` naming the
coding. All are found before any JSON is parsed, so none reads as ``invalid_json``.

Decoding is sans-I/O (bytes in, steps out): the route awaits between steps, so a chunk that inflates
to the whole limit does not hold the event loop for all of it at once.
"""

from __future__ import annotations

import enum
import sys
import zlib
from collections.abc import Iterator, Sequence
from typing import Protocol

import brotli

from gateway.wire.validation import InputRejected

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # the same module, backported (pyproject.toml)
    from backports import zstd

__all__ = [
    "MAX_LAYERS",
    "MAX_MEMBERS",
    "STEP",
    "BodyDecoder",
    "Coding",
    "DecodedTooLarge",
    "parse_codings",
]

#: decoded bytes one decompressor call may produce (a brotli call may overshoot by a buffer block)
STEP = 1024 * 1024
#: most content codings one body may stack (beyond: 415): a client applies one, a proxy in front of
#: it may add another; each layer costs a decoder window (up to 16 MiB for brotli)
MAX_LAYERS = 2
#: most gzip members or zstd frames one layer may hold (beyond: 400)
MAX_MEMBERS = 64
#: the largest zstd window a frame may ask for, as a power of two: 8 MiB (RFC 9659)
ZSTD_WINDOW_LOG_MAX = 23


class Coding(enum.Enum):
    """The content codings the gateway decodes (their registered names, RFC 9110 §8.4.1)."""

    GZIP = "gzip"
    DEFLATE = "deflate"
    ZSTD = "zstd"
    BR = "br"


#: names that mean one of the codings (RFC 9110 §8.4.1.3: ``x-gzip`` is ``gzip``)
_ALIASES = {"x-gzip": Coding.GZIP}
#: the value of ``Accept-Encoding`` on a 415: what a client may send instead
ACCEPTED = ", ".join(c.value for c in Coding)


class DecodedTooLarge(Exception):
    """The decoded body passed the limit (the route answers its 413, the same as for the wire size)."""


def parse_codings(values: Sequence[str]) -> tuple[Coding, ...]:
    """The codings of ``Content-Encoding`` header values, in the order they were applied (a list may
    span several header lines; ``identity`` and empty elements are no coding). An unknown coding,
    or more than :data:`MAX_LAYERS`, is a 415."""
    names = [name for value in values for part in value.split(",") if (name := part.strip().lower())]
    codings: list[Coding] = []
    for name in names:
        if name == "identity":
            continue
        coding = _ALIASES.get(name)
        if coding is None:
            try:
                coding = Coding(name)
            except ValueError:
                # the client's name, cut: a header may be 64 KiB, and the message is logged too
                raise unsupported(f"Unsupported Content-Encoding {name[:64]!r}: supported are {ACCEPTED}.") from None
        codings.append(coding)
    if len(codings) > MAX_LAYERS:
        listed = ", ".join(c.value for c in codings)
        raise unsupported(f"Too many content codings ({listed}): at most {MAX_LAYERS} are decoded.")
    return tuple(codings)


def unsupported(message: str) -> InputRejected:
    """The 415 for a ``Content-Encoding`` the gateway does not decode; the body is left unread."""
    return InputRejected(
        "unsupported_encoding",
        415,
        message,
        code="unsupported_content_encoding",
        headers={"accept-encoding": ACCEPTED, "connection": "close"},
    )


def undecodable(coding: Coding, detail: str) -> InputRejected:
    """The 400 for a body that its coding does not decode; the rest of it is left unread."""
    return InputRejected(
        "invalid_encoding",
        400,
        f"The request body is not valid {coding.value} data (Content-Encoding): {detail}",
        code="invalid_content_encoding",
        headers={"connection": "close"},
    )


class _Layer(Protocol):
    """One decompressor as :class:`BodyDecoder` drives it: fed only once it is :attr:`drained`."""

    coding: Coding

    def decompress(self, data: bytes, max_length: int) -> bytes:
        """Take ``data`` (``b""``: go on with what was fed before) and return at most about
        ``max_length`` bytes."""
        ...

    @property
    def drained(self) -> bool:
        """Nothing more comes out without more input."""
        ...

    @property
    def finished(self) -> bool:
        """At the end of a complete stream (the body may end here)."""
        ...


class _Zlib:
    """gzip (members one after another) or deflate (one zlib stream, RFC 9110 §8.4.1.2; a raw
    deflate stream, as some clients send it, is told apart by its first two bytes, which a zlib
    header's check bits fix)."""

    def __init__(self, coding: Coding) -> None:
        self.coding = coding
        self._z: zlib._Decompress | None = None
        self._tail = b""  # input taken but not yet decompressed
        self._full = False  # the last call filled its bound: more output may be waiting
        self._members = 0

    def _start(self, data: bytes) -> None:
        self._members += 1
        if self._members > MAX_MEMBERS:
            raise undecodable(self.coding, f"more than {MAX_MEMBERS} concatenated members.")
        if self.coding is Coding.GZIP:
            wbits = 16 + zlib.MAX_WBITS
        else:
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        self._z = zlib.decompressobj(wbits)

    def decompress(self, data: bytes, max_length: int) -> bytes:
        data = self._tail + data if self._tail else data
        self._tail = b""
        z = self._z
        if z is not None and z.eof:
            if not data:
                return b""
            if self.coding is not Coding.GZIP:
                raise undecodable(self.coding, "data after the end of the stream.")
            z = None  # the next gzip member
        if z is None:
            if len(data) < 2:  # a member's header (and deflate's sniff) wants two bytes
                self._tail = data
                return b""
            self._start(data)
            z = self._z
            assert z is not None
        out = z.decompress(data, max_length)
        self._tail = z.unused_data if z.eof else z.unconsumed_tail
        self._full = len(out) >= max_length
        return out

    @property
    def drained(self) -> bool:
        if self._full:
            return False
        if not self._tail:
            return True
        z = self._z
        if z is None:  # under two bytes of a first header: wait for more
            return True
        if z.eof:  # a gzip member's first byte waits for the next; any byte after deflate's end is refused
            return self.coding is Coding.GZIP and len(self._tail) < 2
        return False  # input left: more output to come

    @property
    def finished(self) -> bool:
        return self._z is not None and self._z.eof and not self._tail


class _Zstd:
    """zstd frames one after another, each decoded in a window of at most 8 MiB."""

    coding = Coding.ZSTD

    def __init__(self) -> None:
        self._d: zstd.ZstdDecompressor | None = None
        self._frames = 0

    def _start(self) -> zstd.ZstdDecompressor:
        self._frames += 1
        if self._frames > MAX_MEMBERS:
            raise undecodable(self.coding, f"more than {MAX_MEMBERS} concatenated frames.")
        self._d = zstd.ZstdDecompressor(options={zstd.DecompressionParameter.window_log_max: ZSTD_WINDOW_LOG_MAX})
        return self._d

    def decompress(self, data: bytes, max_length: int) -> bytes:
        d = self._d
        if d is not None and d.eof:
            data = d.unused_data + data
            if not data:
                return b""
            d = None  # the next frame
        if d is None:
            if not data:
                return b""
            d = self._start()
        return d.decompress(data, max_length)

    @property
    def drained(self) -> bool:
        d = self._d
        if d is None:
            return True
        return not d.unused_data if d.eof else d.needs_input

    @property
    def finished(self) -> bool:
        return self._d is not None and self._d.eof and not self._d.unused_data


class _Brotli:
    """One brotli stream (its ring buffer at most 16 MiB by the format); bytes after its end are
    refused."""

    coding = Coding.BR

    def __init__(self) -> None:
        self._d = brotli.Decompressor()
        self._full = False  # the last call filled its bound: more output may be waiting

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if data and self._d.is_finished():
            raise undecodable(self.coding, "data after the end of the stream.")
        out: bytes = self._d.process(data, output_buffer_limit=max_length)
        self._full = len(out) >= max_length
        return out

    @property
    def drained(self) -> bool:
        # can_accept_more_data() alone says only that no input is left: output may still wait in
        # the decoder (brotli 1.2.1), so a call that filled its bound is followed by another
        return not self._full and bool(self._d.can_accept_more_data())

    @property
    def finished(self) -> bool:
        return bool(self._d.is_finished())


def _layer(coding: Coding) -> _Layer:
    if coding is Coding.ZSTD:
        return _Zstd()
    if coding is Coding.BR:
        return _Brotli()
    return _Zlib(coding)


#: what each library raises on data it cannot decode
_ERRORS = (zlib.error, zstd.ZstdError, brotli.error)


class BodyDecoder:
    """A request body's bytes as they arrive -> the body it encodes, at most ``limit`` bytes of it.

    :meth:`feed` each chunk read from the wire and step through it (it yields between decompressor
    calls, so the caller can let other work run); :meth:`body` at the end. With no coding the
    chunks are kept as they are."""

    def __init__(self, codings: Sequence[Coding], limit: int) -> None:
        self._layers = [_layer(c) for c in reversed(codings)]  # the last coding applied comes off first
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        #: what each outer layer produced so far: an inner layer that eats its input without output
        #: (a gzip name that never ends, empty stored blocks, zstd skippable frames) would otherwise
        #: let the outer one inflate without bound, its output counted nowhere
        self._made = [0] * len(self._layers)
        #: an outer layer's bound: the inner coding of ``limit`` decoded bytes is at most a little
        #: larger than them (incompressible data: deflate, zstd and brotli add a few bytes a block)
        self._outer_limit = limit + limit // 64 + STEP

    @classmethod
    def for_headers(cls, values: Sequence[str], limit: int) -> BodyDecoder:
        """A decoder for a request's ``Content-Encoding`` header values (415 for one it cannot)."""
        return cls(parse_codings(values), limit)

    def feed(self, chunk: bytes) -> Iterator[None]:
        """Decode ``chunk``, a step at a time (a pause after each piece of output); raises
        :class:`DecodedTooLarge` once the body passes the limit, an ``InputRejected`` (400) on data
        that does not decode."""
        if not self._layers:
            self._keep(chunk)
            return
        yield from self._pump(0, chunk)

    def body(self) -> bytes:
        """The whole decoded body, once the last chunk was fed (400 if a coding's stream is cut short)."""
        for layer in self._layers:
            if not layer.finished:
                raise undecodable(layer.coding, "the data ends before the end of the stream.")
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def size(self) -> int:
        """Decoded bytes so far."""
        return self._size

    def _keep(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self._limit:
            self._parts.clear()  # refused: nothing of it is kept
            raise DecodedTooLarge(self._size)
        self._parts.append(piece)

    def _pump(self, index: int, data: bytes) -> Iterator[None]:
        """Feed ``data`` to layer ``index`` and drain it, each output step fed on inward before the
        next call, so no layer holds more than a step of its input."""
        if index == len(self._layers):
            if data:
                self._keep(data)
                yield
            return
        layer = self._layers[index]
        inner = index + 1 < len(self._layers)
        while True:
            try:
                out = layer.decompress(data, STEP)
            except _ERRORS as err:
                raise undecodable(layer.coding, f"{err}.") from None
            data = b""
            if inner:
                self._made[index] += len(out)
                if self._made[index] > self._outer_limit:
                    self._parts.clear()
                    raise DecodedTooLarge(self._made[index])
            yield  # after every call of every layer, output or not: the caller's pause
            if out:
                yield from self._pump(index + 1, out)
            if layer.drained:
                return
