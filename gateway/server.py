"""The uvicorn server with a graceful WebSocket drain.

uvicorn's own shutdown closes open WebSockets with 1012 ("service restart") right away. For
Responses WebSocket mode that is the wrong goodbye: in-flight responses are cut off, and the SDK's
optional auto-reconnect treats 1012 as recoverable and replays queued frames whose ``store=false``
parents died with the old socket. So before uvicorn's shutdown, every connection refuses new turns,
finishes its in-flight responses and closes with 1000 (bounded by ``shutdown_grace_s``).
"""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn

log = logging.getLogger(__name__)


class GatewayServer(uvicorn.Server):
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting first
        gw = getattr(getattr(self.config.app, "state", None), "gateway", None)
        if gw is not None and gw.connections:
            grace = gw.settings.shutdown_grace_s
            log.info("draining %d WebSocket connection(s) (up to %.0f s)", len(gw.connections), grace)
            drains = [conn.drain() for conn in list(gw.connections)]
            try:
                await asyncio.wait_for(asyncio.gather(*drains, return_exceptions=True), timeout=grace)
            except asyncio.TimeoutError:
                log.warning("WebSocket drain exceeded %.0f s; closing the rest", grace)
        await super().shutdown(sockets)
