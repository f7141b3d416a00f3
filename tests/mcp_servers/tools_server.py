"""A real MCP server built with the SDK's server side (``MCPServer``, FastMCP's 2.x name).

Tools: ``add(a, b)``, ``echo(text)``, ``slow(seconds)`` (sleeps), ``fail(message)`` (a tool
error), ``huge(n, char="x")`` (n bytes of text, ``char`` repeated: a multi-byte char tests a cut
at a character boundary), ``whoami()`` (the ``Authorization`` header its request carried),
``regional(region)`` (an argument the 2026-07-28 protocol mirrors into an ``Mcp-Param-Region``
header: a call from a session that has not listed the tool is refused with HEADER_MISMATCH).
:class:`ToolsServer` counts what it served (``calls`` by tool, ``lists``) and remembers the
``Authorization`` headers it saw, and the HTTP requests it served (``requests`` by method and
path), so a test can prove a cache hit, a skipped handshake, or that headers arrived.
"""

from __future__ import annotations

import collections
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

ServerTransport = Literal["streamable_http", "sse"]


class _CountingServer(MCPServer):
    def __init__(self, owner: ToolsServer) -> None:
        # log_level: MCPServer configures the root logger (basicConfig) at construction
        super().__init__("respgate-test-tools", log_level="WARNING")
        self._owner = owner

    async def list_tools(self) -> list[Any]:
        self._owner.lists += 1
        return await super().list_tools()


class ToolsServer:
    """One server's state and tools; :meth:`app` serves them (see ``running_app``)."""

    def __init__(self, token: str | None = None) -> None:
        """``token``: when set, every HTTP request must carry ``Authorization: Bearer <token>``
        (401 otherwise)."""
        self.token = token
        self.calls: collections.Counter[str] = collections.Counter()
        self.lists = 0
        self.seen_authorization: list[str | None] = []
        #: HTTP requests served, by (method, path)
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.mcp = _CountingServer(self)
        self._register()

    def _register(self) -> None:
        mcp, calls = self.mcp, self.calls

        @mcp.tool(description="Add two integers.")
        def add(a: int, b: int) -> int:
            calls["add"] += 1
            return a + b

        @mcp.tool(description="Echo the text back.")
        def echo(text: str) -> str:
            calls["echo"] += 1
            return text

        @mcp.tool(description="Sleep, then say so.")
        async def slow(seconds: float) -> str:
            calls["slow"] += 1
            await anyio.sleep(seconds)
            return f"slept {seconds}"

        @mcp.tool(description="Fail with the message.")
        def fail(message: str) -> str:
            calls["fail"] += 1
            raise ToolError(message)

        @mcp.tool(description="Return n bytes of text.")
        def huge(n: int, char: str = "x") -> str:
            calls["huge"] += 1
            return char * (n // len(char.encode()))

        @mcp.tool(description="Say where: the region is mirrored into an Mcp-Param-Region header.")
        def regional(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
            calls["regional"] += 1
            return f"in {region}"

        @mcp.tool(description="The Authorization header of this request.")
        def whoami(ctx: Context) -> str:
            calls["whoami"] += 1
            headers = ctx.headers or {}
            value = headers.get("authorization")
            self.seen_authorization.append(value)
            return value or "(none)"

    def app(self, transport: ServerTransport = "streamable_http", *, sse_path: str = "/sse") -> Any:
        """The ASGI app: Streamable HTTP at ``/mcp``, or SSE at ``sse_path`` (+ ``/messages/``)."""
        if transport == "streamable_http":
            inner = self.mcp.streamable_http_app()
        else:
            inner = self.mcp.sse_app(sse_path=sse_path)
        expected = f"Bearer {self.token}".encode() if self.token is not None else None

        async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.requests[(scope["method"], scope["path"])] += 1
                if expected is not None and dict(scope["headers"]).get(b"authorization") != expected:
                    head = [(b"content-type", b"text/plain")]
                    await send({"type": "http.response.start", "status": 401, "headers": head})
                    await send({"type": "http.response.body", "body": b"unauthorized"})
                    return
            await inner(scope, receive, send)

        return counted

    @staticmethod
    def path(transport: ServerTransport = "streamable_http") -> str:
        return "/mcp" if transport == "streamable_http" else "/sse"


__all__ = ["ServerTransport", "ToolsServer"]
