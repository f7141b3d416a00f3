"""The tools each MCP server lists, kept per tenant, server and credentials for a while.

Why: a response that offers an ``mcp`` tool needs the server's tool list before the model runs
(the model sees the tools; the response shows an ``mcp_list_tools`` item), and an agent sends the
same ``mcp`` tool with every turn. Listing costs a round trip or more to a remote server each time;
a continuation reuses its parent's ``mcp_list_tools`` item, and this catalog serves the first turn
of every other chain (a new conversation, a client that re-sends history) from memory for ``ttl``
seconds. A list older than that is fetched again, so a server's new tools show up within ``ttl``.

**The key** is ``(tenant, label, url, credentials)``, where credentials is a keyed BLAKE2b digest
of the request's headers (names lower-cased, sorted) under a random key made when the catalog is:
two requests that send different ``Authorization`` headers never share a list (a server may list
different tools per user), and no header value is kept in clear or in a digest that could be
checked against a guess outside this process. One tenant never reads another's lists.

**Bounds.** A :class:`cache.lru.BoundedLRU` holds the lists, bounded by entries and by bytes (a
list is charged its JSON size), with the tenant as the part: a tenant that lists many servers (or
one server with many credentials) churns its own entries, never all of another's.

**Single flight.** Concurrent lookups of the same key while it is missing share one listing: the
first starts it as a task, the others wait on it. A waiter cancelled (its client went away) stops
waiting; the listing itself is cancelled when no waiter is left, so it never outlives everyone who
asked. A failed listing is **not** cached: each waiter gets the same :class:`McpError`, and the
next lookup lists again (a server that was down a moment ago is tried again; a failing server is
tried at most once per concurrent burst, and the client's timeouts bound each try).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable

import msgspec

from cache.lru import BoundedLRU, tenant_of
from gateway.tools.mcp_client import ListedTool, McpClient, McpEndpoint

__all__ = ["CatalogKey", "ToolCatalog"]

#: (tenant, server label, server URL, credentials digest)
CatalogKey = tuple[str | None, str, str, bytes]

Tools = tuple[ListedTool, ...]


class _Entry(msgspec.Struct, frozen=True):
    tools: Tools
    expires: float


class _Flight:
    """One listing in progress and how many lookups wait for it."""

    __slots__ = ("task", "waiters")

    def __init__(self, task: asyncio.Task[Tools]) -> None:
        self.task = task
        self.waiters = 0


class ToolCatalog:
    """Tool lists by tenant, server and credentials, with a TTL (see the module docstring)."""

    def __init__(
        self,
        client: McpClient,
        *,
        ttl: float = 300.0,
        max_entries: int = 256,
        max_bytes: int = 32 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.ttl = ttl
        self.clock = clock
        self.lru: BoundedLRU[CatalogKey, _Entry] = BoundedLRU(max_entries, max_bytes, part=tenant_of)
        #: listings started (a miss that joined another's listing does not count)
        self.listings = 0
        self._flights: dict[CatalogKey, _Flight] = {}
        self._digest_key = os.urandom(32)

    def key(self, tenant: str | None, endpoint: McpEndpoint) -> CatalogKey:
        """The cache key of ``endpoint`` for ``tenant``: its headers only as a keyed digest."""
        digest = hashlib.blake2b(key=self._digest_key, digest_size=16)
        for name, value in sorted((name.lower(), value) for name, value in endpoint.headers.items()):
            for part in (name, value):
                data = part.encode("utf-8", "surrogatepass")
                digest.update(len(data).to_bytes(4, "big"))  # lengths: no two header sets collide
                digest.update(data)
        return (tenant, endpoint.label, endpoint.url, digest.digest())

    async def tools(self, tenant: str | None, endpoint: McpEndpoint) -> Tools:
        """The server's tools, from the catalog while fresh, else listed (once for all concurrent
        lookups). Raises :class:`McpError` when the listing fails (nothing is cached then)."""
        key = self.key(tenant, endpoint)
        entry: _Entry | None = self.lru.get(key)
        if entry is not None:
            if self.clock() < entry.expires:
                return entry.tools
            self.lru.pop(key)
        flight = self._flights.get(key)
        if flight is None:
            flight = _Flight(asyncio.ensure_future(self._list(key, endpoint)))
            self._flights[key] = flight
            flight.task.add_done_callback(lambda task: self._landed(key, task))
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if not flight.task.done() and flight.waiters == 1:
                # the last one waiting went away: stop the listing, and let no later lookup join it
                if self._flights.get(key) is flight:
                    del self._flights[key]
                flight.task.cancel()
            raise
        finally:
            flight.waiters -= 1

    async def _list(self, key: CatalogKey, endpoint: McpEndpoint) -> Tools:
        self.listings += 1
        tools = await self.client.list_tools(endpoint)
        nbytes = len(msgspec.json.encode(tools)) + 64 * (len(tools) + 1)
        self.lru.put(key, _Entry(tools, self.clock() + self.ttl), nbytes)
        return tools

    def _landed(self, key: CatalogKey, task: asyncio.Task[Tools]) -> None:
        if self._flights.get(key) is not None and self._flights[key].task is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone

    def __len__(self) -> int:
        return len(self.lru)

    def held(self, tenant: str | None) -> int:
        """How many lists ``tenant`` holds (tests, metrics)."""
        return self.lru.part_usage(tenant)[0]

    def forget(self, tenant: str | None, endpoint: McpEndpoint) -> None:
        """Drop one list (a call found the server's tools changed)."""
        self.lru.pop(self.key(tenant, endpoint))
