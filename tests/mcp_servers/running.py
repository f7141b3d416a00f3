"""Serve an ASGI app (uvicorn) or a raw asyncio server on loopback, in a thread with its own loop.

A thread of its own, not the test's loop: the server keeps answering while a test blocks (a
synchronous openai client, a gateway in its own thread) or cancels its own tasks, and one helper
serves sync and async tests alike. The listening socket is bound to port 0 here and handed to the
server, so there is no window in which another process can take the port.

The socket is made with ``IPPROTO_TCP`` named: asyncio sets ``TCP_NODELAY`` only on sockets whose
``proto`` says TCP, and one made with ``socket.socket()`` (proto 0) leaves Nagle on for every
connection it accepts: each keep-alive request then waits ~40 ms for a delayed ACK (measured:
44 ms per warm request against 1.5 ms).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def loopback_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to ``host`` (a loopback address: any of 127.0.0.0/8 on Linux) on a port the
    kernel picked (read it with getsockname)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


@contextmanager
def running_app(app: Any, *, ready_timeout: float = 30.0, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` with uvicorn (lifespan on) while the block runs; yields its base URL
    ``http://HOST:PORT`` (no trailing slash). ``host``: another loopback address (127.0.0.2) serves
    as a second machine for outbound-policy tests."""
    sock = loopback_socket(host)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"mcp-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if failed or not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"test server did not start: {failed[:1]}")
        time.sleep(0.005)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        if thread.is_alive():  # an open stream the graceful shutdown did not end
            server.force_exit = True
            thread.join(timeout=10)
        sock.close()


@contextmanager
def running_asyncio(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> Iterator[str]:
    """Serve raw connections with ``handler`` (``asyncio.start_server``'s callback) while the block
    runs; yields ``http://127.0.0.1:PORT``. On exit every connection still open is cancelled and
    closed."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    handlers: set[asyncio.Task[Any]] = set()
    started = threading.Event()
    stop = asyncio.Event()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client hung up, or the server is stopping
        finally:
            handlers.discard(task)
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(tracked, sock=sock)
        started.set()
        await stop.wait()
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def run() -> None:
        try:
            loop.run_until_complete(serve())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name=f"raw-{port}", daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("raw test server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        sock.close()
