"""The uvicorn server with a graceful shutdown: stop accepting, finish turns, say goodbye, drain billing.

uvicorn's own shutdown closes open WebSockets with 1012 ("service restart") right away, cutting
in-flight responses off mid-stream. Ours, on SIGTERM:

1. stops accepting connections and marks the gateway not ready (``/readyz`` answers 503, so a
   load balancer stops routing here);
2. every WebSocket refuses new ``response.create`` frames and lets its in-flight turns reach their
   terminal events, for up to ``shutdown_grace_s`` seconds in all;
3. each socket then gets an ``error`` event (503, "The server is shutting down") and a close with
   **1001 going away**. Turns still running at the deadline are aborted first (the engine request
   is cancelled and the cancelled response's usage is recorded);
4. uvicorn finishes HTTP requests in flight with what is left of the same deadline;
5. the lifespan shutdown flushes pending store writes and drains the billing queue (to the ledger,
   or to the local journal), so no usage record is lost.

Why 1001 here but 1000 at the 60-minute age limit: the age limit is OpenAI's documented behaviour
(error + 1000, and clients open a new socket themselves). A shutting-down replica is "going away",
and 1001 is what tells a client's auto-reconnect (openai-python's ``on_reconnecting``) that trying
again — which lands on another replica — is right. A reconnected client's next continuation
resolves through the shared store when it used ``store=true`` with Redis; a ``store=false`` chain
died with the socket and gets ``previous_response_not_found``, which Codex and the agents SDKs
answer by re-sending the full context.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import uvicorn

log = logging.getLogger(__name__)


class GatewayServer(uvicorn.Server):
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting first
        gw = getattr(getattr(self.config.app, "state", None), "gateway", None)
        if gw is None:
            await super().shutdown(sockets)
            return
        gw.accepting = False
        grace = gw.settings.shutdown_grace_s
        deadline = time.monotonic() + grace
        conns = list(gw.connections)
        if conns:
            log.info("draining %d WebSocket connection(s) (up to %.0f s)", len(conns), grace)
            drains = {asyncio.ensure_future(conn.drain()): conn for conn in conns}
            _, late = await asyncio.wait(drains, timeout=grace)
            if late:
                cut = await asyncio.gather(*(drains[t].cut() for t in late), return_exceptions=True)
                n = sum(c for c in cut if isinstance(c, int))
                gw.metrics.shutdown_cut.inc(n)
                log.warning("shutdown deadline (%.0f s) passed: aborted %d turn(s) on %d socket(s)",
                            grace, n, len(late))
                for t in late:
                    t.cancel()
        # HTTP turns in flight get what is left of the same deadline
        self.config.timeout_graceful_shutdown = max(0.5, deadline - time.monotonic())
        await super().shutdown(sockets)
