"""The uvicorn server with a graceful shutdown: stop accepting, finish turns, say goodbye, drain billing.

uvicorn's own shutdown closes open WebSockets with 1012 ("service restart") right away, cutting
in-flight responses off mid-stream, and at ``timeout_graceful_shutdown`` cancels the tasks of HTTP
requests still running — a bare 500, and a turn left running that is never billed. Ours, on
SIGTERM:

1. stops accepting connections and marks the gateway not ready (``/readyz`` answers 503, so a
   load balancer stops routing here); a create that still arrives on an open keep-alive connection
   gets a 503 ``server_shutting_down`` (SDKs retry it, on another replica);
2. every WebSocket refuses new ``response.create`` frames, and every in-flight turn — on a socket,
   or an HTTP request's (``gateway.transport.inflight``) — may reach its terminal event, for up to
   ``shutdown_grace_s`` seconds in all;
3. at the deadline the gateway cuts what still runs itself: each turn's engine request is
   aborted and its ``cancelled`` snapshot finalized and billed once, with the tokens it generated.
   Each socket then gets an ``error`` event (503, "The server is shutting down") and a close with
   **1001 going away**; an HTTP JSON request gets that error as a 503 body; an SSE stream gets an
   ``error`` event and then ``response.failed`` carrying the cancelled snapshot;
4. uvicorn finishes the HTTP requests still open (the answers just decided, and requests that are
   not turns) with what is left of the same deadline, at least half a second;
5. the lifespan shutdown flushes pending store writes and drains the billing queue (to the ledger,
   or to the local journal), so no usage record is lost.

Why 1001 here but 1000 at the 60-minute age limit: the age limit is OpenAI's documented behaviour
(error + 1000, and clients open a new socket themselves). A shutting-down replica is "going away",
and 1001 is what tells a client's auto-reconnect (openai-python's ``on_reconnecting``) that trying
again — which lands on another replica — is right. A reconnected client's next continuation
resolves through the shared store when it used ``store=true`` with Redis; a ``store=false`` chain
died with the socket and gets ``previous_response_not_found``, which Codex and the agents SDKs
answer by re-sending the full context.

**The metrics listener** (``metrics_port``): Prometheus inside a cluster or a compose network
scrapes without a key, while the gateway's own ``/metrics`` needs one like every route once keys
exist. So a second uvicorn server, in the same process and event loop (the collectors read the
gateway's live state, which must not be touched from another thread), serves prometheus-client's
own ASGI app on an address that is not published. Its socket is bound before the engines load, so
a port already in use fails the start at once; it closes after the gateway's drain, so the last
scrape sees the shutdown.

**The heap after start-up** (:func:`settle_heap`): what start-up built — the engine and its
libraries, vocabularies, models, routes — lives as long as the process, yet CPython's cyclic
collector walks all of it in every full collection, and a turn allocates a few thousand objects,
so the young generation's default threshold (700) ran a collection inside most turns and promoted
objects that die with the turn. Once the server is up, one collection clears start-up's garbage,
``gc.freeze()`` moves every survivor out of the collector's sight, and the young threshold is
:data:`GC_YOUNG_THRESHOLD`, above a turn's allocations: ~3% of a short WebSocket turn's CPU
(``gc_collect_main`` and its visits in ``perf``). Cycles are still collected, just less often.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import sys
import time
from typing import Any, Iterator

import uvicorn

log = logging.getLogger(__name__)


#: allocations (net of frees) between young-generation collections: above what one turn allocates
GC_YOUNG_THRESHOLD = 20_000


def settle_heap() -> None:
    """Freeze what start-up left on the heap and raise the young generation's threshold (see the
    module docstring). Called once the server is up; the older generations keep their thresholds."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


class MetricsServer(uvicorn.Server):
    """``/metrics`` alone, unauthenticated, beside the gateway (see the module docstring)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the gateway's server owns SIGTERM/SIGINT; this one stops when it is told to


def bind_metrics_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class GatewayServer(uvicorn.Server):
    _metrics: MetricsServer | None = None
    _metrics_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        gw = getattr(getattr(self.config.app, "state", None), "gateway", None)
        settings = getattr(gw, "settings", None)
        if settings is not None and settings.metrics_port is not None:
            host = settings.metrics_host or settings.host
            try:
                sock = bind_metrics_socket(host, settings.metrics_port)
            except OSError as exc:
                log.error("metrics listener: cannot bind %s:%s: %s", host, settings.metrics_port, exc)
                sys.exit(3)  # as uvicorn does when the main port is taken
            await self._start_metrics(gw.metrics.registry, sock, settings.log_level)
            log.info("metrics listener on http://%s:%d/metrics (no authentication)", host, sock.getsockname()[1])
        await super().startup(sockets)
        settle_heap()

    async def _start_metrics(self, registry: Any, sock: socket.socket, log_level: str) -> None:
        from prometheus_client import make_asgi_app

        config = uvicorn.Config(make_asgi_app(registry), lifespan="off", log_config=None, log_level=log_level,
                                access_log=False)
        self._metrics = MetricsServer(config)
        self._metrics_task = asyncio.ensure_future(self._metrics.serve(sockets=[sock]))
        while not self._metrics.started and not self._metrics_task.done():
            await asyncio.sleep(0.01)

    async def _stop_metrics(self) -> None:
        if self._metrics is not None and self._metrics_task is not None:
            self._metrics.should_exit = True
            await asyncio.gather(self._metrics_task, return_exceptions=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await self._shutdown_gateway(sockets)
        finally:
            await self._stop_metrics()

    async def _shutdown_gateway(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting first
        gw = getattr(getattr(self.config.app, "state", None), "gateway", None)
        if gw is None:
            await super().shutdown(sockets)
            return
        gw.accepting = False  # from here no HTTP turn starts (http_routes checks it as it registers one)
        grace = gw.settings.shutdown_grace_s
        deadline = time.monotonic() + grace
        conns, turns = list(gw.connections), list(gw.http_turns)
        if conns or turns:
            log.info("draining %d WebSocket connection(s) and %d HTTP turn(s) (up to %g s)",
                     len(conns), len(turns), grace)
            drains = {asyncio.ensure_future(x.drain()): x for x in (*conns, *turns)}
            _, late = await asyncio.wait(drains, timeout=grace)
            if late:
                cut = await asyncio.gather(*(drains[t].cut() for t in late), return_exceptions=True)
                n = sum(c for c in cut if isinstance(c, int))
                gw.metrics.shutdown_cut.inc(n)
                on_sockets = set(conns)
                sockets_cut = sum(1 for t in late if drains[t] in on_sockets)
                log.warning("shutdown deadline (%g s) passed: aborted %d turn(s) on %d socket(s) and %d HTTP "
                            "request(s)", grace, n, sockets_cut, len(late) - sockets_cut)
                for t in late:
                    t.cancel()
        # the HTTP answers (and requests that are not turns) get what is left of the same deadline
        self.config.timeout_graceful_shutdown = max(0.5, deadline - time.monotonic())
        await super().shutdown(sockets)
