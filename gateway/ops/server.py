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
own ASGI app on an address that is not published. Its socket is bound before the engines load (by
``serve``, with the gateway's own), so a port already in use fails the start at once; it closes
after the gateway's drain, so the last scrape sees the shutdown.

**Ports before engines** (:func:`bind_listeners`): ``serve`` binds its port (and the metrics
port) before anything slow -- the packaged model's conversion, vLLM's load -- and hands the sockets
to uvicorn, which would otherwise bind only after the lifespan started the engines: a port in use
was found a minute later, as one log line among vLLM's hundred. A port another program listens on
cannot be bound, so that is found at once (:class:`ListenError`, one line with a fix). The sockets
are bound, not listening: asyncio's server calls ``listen`` when uvicorn starts serving, once the
engines are up. Until then a client is refused at once, as by a server that is not there yet,
instead of waiting in a backlog for a minute, and a TCP probe does not see the gateway up before
``/readyz`` would. (``SO_REUSEADDR`` lets a restart bind next to connections still in TIME_WAIT;
on Linux it also lets two processes that have both only bound share a port, so of two gateways
started on one port at the same moment, the second finds out when it starts listening.)

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
import errno
import gc
import logging
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

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


class ListenError(OSError):
    """A port ``serve`` cannot listen on: the message names it, ``fix`` says what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def bind_listeners(host: str, port: int, option: str = "--port") -> list[socket.socket]:
    """Bound sockets for ``host:port`` (not yet listening: see "Ports before engines"), one per
    address the host resolves to (as asyncio's ``create_server`` does: ``localhost`` is 127.0.0.1
    and ::1), to hand to uvicorn.

    Raises :class:`ListenError`, naming the port and ``option`` (the flag that sets it)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    host_fix = (
        f"pass an address of this machine: {option.replace('port', 'host')} 127.0.0.1 (this machine only) "
        "or 0.0.0.0 (every interface)"
    )
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {where}: unknown address {host!r} ({exc.strerror})", host_fix) from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sockets.append(_bound(family, kind, proto, address))
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise _listen_error(exc, host, port, where, option, host_fix) from None
    return sockets


def _bound(family: int, kind: int, proto: int, address: Any) -> socket.socket:
    """A socket bound to ``address``, exclusively where it can be.

    Without ``SO_REUSEADDR`` while it is only bound: on Linux two sockets that both set it and
    neither listens may share a port, so a second gateway started on the same port would bind too
    and fail only when it starts listening, after its engine loaded (:func:`reusable` sets it just
    before listening). A bind refused only by connections in TIME_WAIT (nothing accepts there: a
    gateway that stopped a moment ago) is retried with it, as servers do."""
    sock = socket.socket(family, kind, proto)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
            return sock
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or _accepting(family, address):
                raise
        sock.close()
        sock = socket.socket(family, kind, proto)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        return sock
    except BaseException:
        sock.close()
        raise


def reusable(sockets: list[socket.socket]) -> list[socket.socket]:
    """``sockets`` with ``SO_REUSEADDR`` set, just before they listen: the connections they accept
    inherit it, so a gateway restarted after this one stops -- or is killed -- binds its port again
    at once (the exclusive bind of :func:`_bound` would be refused until those connections' TIME_WAIT
    ends). Set only now: while bound and not listening, it would let a second process share the port."""
    for sock in sockets:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sockets


def _accepting(family: int, address: Any) -> bool:
    """Whether a program accepts connections at ``address`` (a wildcard asked on loopback): a
    connection to this machine's own port, never sent anywhere else."""
    host, port = address[0], address[1]
    if host in ("0.0.0.0", "::", ""):
        host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def _listen_error(exc: OSError, host: str, port: int, where: str, option: str, host_fix: str) -> ListenError:
    if exc.errno == errno.EADDRINUSE:
        free = _free_port_near(host, port)
        return ListenError(
            f"port {port} is already in use on {host} (another respgate, or another program, listens there)",
            f"stop that program, or pass another port: {option} {free or port + 1} (or {_env_name(option)})",
        )
    if exc.errno == errno.EACCES:
        return ListenError(
            f"cannot listen on {where}: permission denied",
            f"ports below 1024 need privileges: pass {option} 8000 or another port above 1023",
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return ListenError(f"cannot listen on {where}: {host} is not an address of this machine", host_fix)
    return ListenError(f"cannot listen on {where}: {exc.strerror or exc}", f"pass another {option} or host")


def _env_name(option: str) -> str:
    return "RESPGATE_" + option.lstrip("-").replace("-", "_").upper()


def _free_port_near(host: str, port: int) -> int | None:
    """A port above ``port`` that is free on ``host`` now, to suggest (none when 20 in a row are taken)."""
    for candidate in range(port + 1, min(port + 21, 65536)):
        try:
            for sock in bind_listeners(host, candidate):
                sock.close()
            return candidate
        except ListenError:
            continue
    return None


class GatewayServer(uvicorn.Server):
    _metrics: MetricsServer | None = None
    _metrics_task: asyncio.Task[None] | None = None

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        metrics_sockets: list[socket.socket] | None = None,
        on_ready: Callable[[Any, list[socket.socket]], Awaitable[None]] | None = None,
    ) -> None:
        """``metrics_sockets``: the metrics listener's, bound by the caller before the engines load
        (else bound here, at start-up). ``on_ready(gateway_state, listeners)``: awaited once the
        gateway accepts connections (``serve`` prints its banner)."""
        super().__init__(config)
        self._metrics_sockets = metrics_sockets
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        gw = getattr(getattr(self.config.app, "state", None), "gateway", None)
        settings = getattr(gw, "settings", None)
        if gw is not None and settings is not None and settings.metrics_port is not None:
            host = settings.metrics_host or settings.host
            metrics_sockets = self._metrics_sockets
            if metrics_sockets is None:
                try:
                    metrics_sockets = bind_listeners(host, settings.metrics_port, "--metrics-port")
                except ListenError as exc:
                    log.error("metrics listener: %s; fix: %s", exc, exc.fix)
                    sys.exit(3)  # as uvicorn does when the main port is taken
            await self._start_metrics(gw.metrics.registry, reusable(metrics_sockets), settings.log_level)
            log.info(
                "metrics listener on http://%s:%d/metrics (no authentication)",
                host,
                metrics_sockets[0].getsockname()[1],
            )
        await super().startup(reusable(sockets) if sockets is not None else None)
        settle_heap()
        if self._on_ready is not None and gw is not None and not self.should_exit:
            listeners = [s for server in self.servers for s in (server.sockets or ())]
            await self._on_ready(gw, listeners)

    async def _start_metrics(self, registry: Any, sockets: list[socket.socket], log_level: str) -> None:
        from prometheus_client import make_asgi_app

        config = uvicorn.Config(
            make_asgi_app(registry), lifespan="off", log_config=None, log_level=log_level, access_log=False
        )
        self._metrics = MetricsServer(config)
        self._metrics_task = asyncio.ensure_future(self._metrics.serve(sockets=sockets))
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
            log.info(
                "draining %d WebSocket connection(s) and %d HTTP turn(s) (up to %g s)", len(conns), len(turns), grace
            )
            drains = {asyncio.ensure_future(x.drain()): x for x in (*conns, *turns)}
            _, late = await asyncio.wait(drains, timeout=grace)
            if late:
                cut = await asyncio.gather(*(drains[t].cut() for t in late), return_exceptions=True)
                n = sum(c for c in cut if isinstance(c, int))
                gw.metrics.shutdown_cut.inc(n)
                on_sockets = set(conns)
                sockets_cut = sum(1 for t in late if drains[t] in on_sockets)
                log.warning(
                    "shutdown deadline (%g s) passed: aborted %d turn(s) on %d socket(s) and %d HTTP request(s)",
                    grace,
                    n,
                    sockets_cut,
                    len(late) - sockets_cut,
                )
                for t in late:
                    t.cancel()
        # the HTTP answers (and requests that are not turns) get what is left of the same deadline
        self.config.timeout_graceful_shutdown = max(0.5, deadline - time.monotonic())
        await super().shutdown(sockets)
