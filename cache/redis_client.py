"""The one place a Redis client is built: plain Redis by default, Redis Cluster when the URL says so.

**Choosing Cluster.** ``redis_url`` (``RESPGATE_REDIS_URL`` / ``REDIS_URL``) names the deployment:
``redis://`` / ``rediss://`` is one server (or a Sentinel-managed primary behind one address), and
``redis+cluster://host:port`` / ``rediss+cluster://host:port`` is a Redis (or Valkey) Cluster reached
through any of its nodes — the client reads the slot map from it (``CLUSTER SLOTS``), follows
``MOVED``/``ASK`` redirects and reconnects after a failover. The scheme rather than a separate
boolean setting: the URL is the one value every consumer already receives (store, conversations,
ledger, leases, keys, limits, flags, ``respgate usage``/``check``/``keys``), so nothing can pair a
cluster address with a standalone client or the other way round. A cluster URL has no database
number (Cluster has only database 0).

**What Cluster demands of callers.** A transaction (``MULTI``/``EXEC``), a Lua script and a
multi-key command (``MGET``, ``DEL k1 k2``, ``BLPOP k1 k2``) must name keys of one hash slot, which
each module guarantees with hash tags in its key layout (``{...}``: only the text between the first
braces is hashed); the layouts are in each module's docstring and docs/operations.md's Redis section, and
``tests/cache/test_redis_cluster.py`` enumerates them. Non-transactional pipelines may span slots — the
cluster client splits them per node — so reads that fan out over many objects use those. Nothing
in respgate uses pub/sub (cancel requests are lists popped with ``BLPOP``: see ``cache.leases``).

**No MULTI.** Every atomic multi-key step is a Lua script, never a ``MULTI``/``EXEC`` pipeline:
redis-py's (8.1) cluster transaction pipeline stages each queued command by running
``asyncio.run`` in a new thread (a thread and an event loop per command: a chain write queues one
per ancestor), and when that staging is the client's first use, the cluster's connections are
opened on that throwaway loop and fail on the real one afterwards. A script is one ``EVALSHA`` routed
by its keys, atomic on both deployments, and the same code path on both.

``prefix`` (every store's key prefix, ``respgate:`` by default) must not contain braces: a tag in
the prefix would be *the* tag of every key and put the whole deployment in one slot.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis

#: cluster URL scheme -> the scheme redis-py's cluster client takes for the same transport
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

AsyncClient = aioredis.Redis | aioredis.RedisCluster


def is_cluster(url: str) -> bool:
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def _cluster_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.path not in ("", "/", "/0"):
        raise ValueError(f"a Redis Cluster URL has no database number (Cluster has only db 0): {parts.path!r}")
    return urlunsplit((CLUSTER_SCHEMES[parts.scheme.lower()], parts.netloc, "", parts.query, parts.fragment))


class ClusterClient(aioredis.RedisCluster):
    """``RedisCluster`` that finishes discovering the cluster before its first command or pipeline runs.

    redis-py (8.1) discovers the slot map lazily on first use, and when the first uses are
    concurrent — a replica's first requests, or a write that sends a transaction and a pipeline
    together — some of them run on connections another task is still opening (``'NoneType' object
    has no attribute 'writelines'``, "attached to a different loop"). Awaiting its own (locked)
    ``initialize`` first makes every caller wait for the one discovery instead."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> aioredis.cluster.ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # refused by redis-py, as it should be
        # redis-py's (8.2) inline annotations leave ``_event_dispatcher`` abstract on ClusterPipeline,
        # which its own ``RedisCluster.pipeline`` instantiates just the same: the class is concrete
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]


class _ClusterPipeline(aioredis.cluster.ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        if self.cluster_client._initialize:
            await self.cluster_client.initialize()
        return await super().execute(raise_on_error, allow_redirections)


#: per node; redis-py's cluster default (100) *raises* ``MaxConnectionsError`` when that many commands
#: are in flight to one node (blocking ``BLPOP``/``XREAD`` readers hold one each) instead of
#: waiting: unbounded, like the standalone client's pool, the node's ``maxclients`` being the limit
CLUSTER_MAX_CONNECTIONS = 2**31


def connect(url: str, **kwargs: Any) -> AsyncClient:
    """An asyncio client for ``url``: ``RedisCluster`` for a cluster URL, else ``Redis``. ``kwargs`` are
    the usual connection options (timeouts, ``retry``, ``decode_responses``), valid for both."""
    if is_cluster(url):
        kwargs.setdefault("max_connections", CLUSTER_MAX_CONNECTIONS)
        return ClusterClient.from_url(_cluster_url(url), **kwargs)
    return aioredis.Redis.from_url(url, **kwargs)


def connect_store(url: str, **kwargs: Any) -> AsyncClient:
    """:func:`connect` with the stores' options: an outage surfaces in seconds (2 s to connect, 5 s
    per reply: above the 1 s a ``BLPOP`` or ``XREAD`` blocks) and one quick retry. ``kwargs``
    override them."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    kwargs.setdefault("socket_connect_timeout", 2.0)
    kwargs.setdefault("socket_timeout", 5.0)
    kwargs.setdefault("retry", Retry(ExponentialBackoff(cap=0.05, base=0.01), 1))
    return connect(url, **kwargs)


def connect_sync(url: str, **kwargs: Any) -> redis.Redis | redis.RedisCluster:
    """The blocking client for command-line tools (``respgate usage``, ``respgate check``)."""
    if is_cluster(url):
        kwargs.setdefault("max_connections", CLUSTER_MAX_CONNECTIONS)
        return redis.RedisCluster.from_url(_cluster_url(url), **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def check_prefix(prefix: str) -> str:
    """Refuse a key prefix with a hash tag of its own (see the module docstring)."""
    if "{" in prefix or "}" in prefix:
        raise ValueError(
            f"Redis key prefix {prefix!r} must not contain braces: its tag would put every key in one Cluster slot"
        )
    return prefix
