"""A raw HTTP server on loopback that misbehaves in one chosen way, for the MCP client's bounds.

It reads each request (head and ``content-length`` body) on a keep-alive connection and answers
per :class:`Mode`. ``requests`` counts the requests it read; ``connections`` the connections;
``closed`` the connections a client closed on a ``SILENT`` server (how a test sees a cancelled
client hang up).
"""

from __future__ import annotations

import asyncio
import enum
import gzip
from collections.abc import Iterator
from contextlib import contextmanager

from tests.mcp_servers.running import running_asyncio


class Mode(enum.Enum):
    #: accepts and reads the request, then says nothing
    SILENT = "silent"
    #: answers 200 ``text/event-stream`` headers, then one byte every 50 ms, never an event
    DRIP = "drip"
    #: answers 200 ``application/json`` with a chunked body that never ends
    ENDLESS = "endless"
    #: answers 200 ``application/json`` that is not JSON-RPC (not even JSON)
    MALFORMED = "malformed"
    #: answers 500
    HTTP_500 = "http_500"
    #: answers 200 ``text/html``
    WRONG_TYPE = "wrong_type"
    #: answers 200 ``application/json`` gzip-coded though the client asked for no coding (a small
    #: body could inflate a thousandfold: a gzip bomb)
    COMPRESSED = "compressed"


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n"


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


class HostileServer:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.requests = 0
        self.connections = 0
        #: connections the client closed while the server kept silent (``SILENT``)
        self.closed = 0

    async def _read_request(self, reader: asyncio.StreamReader) -> bool:
        """One request read whole; False at the end of the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        if length:
            await reader.readexactly(length)
        self.requests += 1
        return True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while await self._read_request(reader):
            mode = self.mode
            if mode is Mode.SILENT:
                await reader.read()  # nothing more comes: this ends when the client closes
                self.closed += 1
                return
            elif mode is Mode.DRIP:
                writer.write(_CHUNKED_HEAD % b"text/event-stream")
                while True:
                    writer.write(b"1\r\n:\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)
            elif mode is Mode.ENDLESS:
                writer.write(_CHUNKED_HEAD % b"application/json")
                chunk = b"[" + b"1," * 32767 + b"1"
                framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                while True:
                    writer.write(framed)
                    await writer.drain()
            elif mode is Mode.MALFORMED:
                writer.write(_response("200 OK", "application/json", b'{"jsonrpc": "2.0", "id": oops'))
            elif mode is Mode.HTTP_500:
                writer.write(_response("500 Internal Server Error", "text/plain", b"boom"))
            elif mode is Mode.WRONG_TYPE:
                writer.write(_response("200 OK", "text/html", b"<html>hello</html>"))
            elif mode is Mode.COMPRESSED:
                body = gzip.compress(b'{"jsonrpc": "2.0", "id": 1, "result": {"x": "' + b"a" * 100_000 + b'"}}')
                head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()


@contextmanager
def running_hostile(mode: Mode) -> Iterator[tuple[str, HostileServer]]:
    """A :class:`HostileServer` in ``mode`` while the block runs: yields its MCP URL (``/mcp``)
    and the server (for its counters)."""
    server = HostileServer(mode)
    with running_asyncio(server.handle) as base:
        yield f"{base}/mcp", server
