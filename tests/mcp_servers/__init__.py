"""Real MCP servers for tests, started in-process on loopback (issue 30).

API (import from ``tests.mcp_servers``):

- ``ToolsServer(token=None)``: an MCP server made with the ``mcp`` SDK's server side. Tools
  ``add(a, b)``, ``echo(text)``, ``slow(seconds)``, ``fail(message)`` (tool error),
  ``huge(n, char="x")`` (n bytes of text), ``whoami()`` (the request's ``Authorization``),
  ``regional(region)`` (a header-mirrored argument: refused unless the session listed the tool).
  Counters: ``calls`` (a ``Counter`` by tool name), ``lists`` (tools/list requests served),
  ``seen_authorization`` (what ``whoami`` saw), ``requests`` (a ``Counter`` of HTTP requests by
  ``(method, path)``). With ``token``, every HTTP request needs
  ``Authorization: Bearer <token>`` or gets 401. ``.app("streamable_http" | "sse")`` is its ASGI
  app; ``ToolsServer.path(transport)`` its MCP path (``/mcp`` or ``/sse``).
- ``running_tools_server(server=None, transport="streamable_http")``: context manager serving a
  ``ToolsServer`` (a new one when None); yields ``(url, server)`` with ``url`` the full MCP URL
  (``http://127.0.0.1:PORT/mcp`` or ``.../sse``).
- ``running_app(asgi_app)``: context manager serving any ASGI app with uvicorn; yields the base URL
  ``http://127.0.0.1:PORT``.
- ``Mode`` / ``running_hostile(mode)``: a raw asyncio HTTP server that misbehaves (``SILENT``
  accepts and never answers, ``DRIP`` sends headers then a byte every 50 ms forever, ``ENDLESS``
  an endless JSON body, ``MALFORMED`` a body that is not JSON-RPC, ``HTTP_500``, ``WRONG_TYPE``
  text/html, ``COMPRESSED`` a gzip body nobody asked for); yields ``(url, server)``, with
  ``server.requests`` counting requests read and ``server.closed`` the hang-ups a ``SILENT`` server
  saw.
- ``published.running_time_server()``: the published ``mcp-server-time`` package served over
  Streamable HTTP by ``fastmcp run`` in a subprocess; yields its MCP URL. ``published.available()``
  says whether both are installed (the test extra).

Every server runs in a thread with its own event loop (or a subprocess), so sync tests, async tests
and a gateway running in its own thread can all reach it; each binds port 0 itself (no port race)
and stops when its block ends. They listen on 127.0.0.1 only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.mcp_servers.hostile import HostileServer, Mode, running_hostile
from tests.mcp_servers.running import loopback_socket, running_app, running_asyncio
from tests.mcp_servers.tools_server import ServerTransport, ToolsServer


@contextmanager
def running_tools_server(
    server: ToolsServer | None = None, transport: ServerTransport = "streamable_http"
) -> Iterator[tuple[str, ToolsServer]]:
    """Serve ``server`` (a fresh :class:`ToolsServer` when None) over ``transport``."""
    server = server or ToolsServer()
    with running_app(server.app(transport)) as base:
        yield base + ToolsServer.path(transport), server


__all__ = [
    "HostileServer",
    "Mode",
    "ServerTransport",
    "ToolsServer",
    "loopback_socket",
    "running_app",
    "running_asyncio",
    "running_hostile",
    "running_tools_server",
]
