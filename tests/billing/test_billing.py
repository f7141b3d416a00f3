"""Billing: usage records, the journal, the idempotent Redis Stream ledger, the queue, reports.

Integration tests drive a real gateway (in-process, or a subprocess for SIGKILL) with real clients
and a real Redis-protocol server. The outage tests start their own server with an fsync'd AOF:
the session fixture runs without persistence, so stopping it would wipe the ledger and the test
would measure Redis's durability instead of ours. No timing assertions: bounded polling only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from billing.journal import Journal
from billing.ledger import (
    DEFAULT_MARKER_TTL_S,
    DEFAULT_STREAM,
    RedisLedger,
    marker_key,
    shard_of,
    shard_stream,
    shard_streams,
)
from billing.report import iter_ledger, usage_report
from billing.usage import UsageQueue, UsageRecord
from billing.wal import WriteAheadLog, record_line
from gateway.access.auth import KeyAuth
from gateway.base.settings import Settings
from tests.conftest import MODEL, RedisServer, redis_server_binary
from tests.http_helpers import wait_for

pytestmark = pytest.mark.timeout(180)

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
REPO = Path(__file__).resolve().parents[2]


# -- helpers -------------------------------------------------------------------------------------


async def await_for(predicate: Callable[[], Any], what: str = "condition", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def record(i: int, **kw: Any) -> UsageRecord:
    base: dict[str, Any] = dict(
        response_id=f"resp_{i}",
        model="m",
        tenant="t",
        status="completed",
        input_tokens=10 + i,
        cached_tokens=i,
        output_tokens=3,
        reasoning_tokens=1,
        transport="ws",
        created_at=1_700_000_000.0 + i,
        finished_at=1_700_000_001.0 + i,
        ttft_s=0.01,
        duration_s=1.0,
    )
    base.update(kw)
    return UsageRecord(**base)


def wal_files(journal_path: Path) -> list[Path]:
    return sorted(journal_path.parent.glob(journal_path.name + ".wal-*"))


def stream_ids(url: str, stream: str = DEFAULT_STREAM, shards: int = 1) -> list[str]:
    try:
        return [r.response_id for r in iter_ledger(url, stream, shards=shards)]
    except redis.ConnectionError:
        return []


class DurableRedis(RedisServer):
    """The fixture's server, but with an fsync'd AOF in its own folder: it survives stop/start."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), 10, "redis to answer")


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.BusyLoadingError):
        return False


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[DurableRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = DurableRedis(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Load:
    """Chained WebSocket turns (plus a plain HTTP turn every few) in a thread, in gated phases."""

    def __init__(self, base: str, phases: list[int], *, key: str = "test-key", http_every: int = 4) -> None:
        self.base = base
        self.phases = phases
        self.key = key
        self.http_every = http_every
        self.gates = [threading.Event() for _ in phases]
        self.gates[0].set()
        self.created: list[str] = []
        self.completed: list[str] = []
        self.usage: dict[str, dict[str, Any]] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Load:
        self.thread.start()
        return self

    def _run(self) -> None:
        from websockets.sync.client import connect

        ws_url = self.base.replace("http://", "ws://") + "/v1/responses"
        headers = {"Authorization": f"Bearer {self.key}"}
        prev: str | None = None
        n = 0
        try:
            with connect(ws_url, additional_headers=headers, max_size=None) as ws, httpx.Client(timeout=30) as http:
                for count, gate in zip(self.phases, self.gates):
                    gate.wait()
                    for _ in range(count):
                        n += 1
                        if n % self.http_every == 0:
                            r = http.post(
                                self.base + "/v1/responses",
                                headers=headers,
                                json={"model": MODEL, "input": f"http {n}", "store": False},
                            )
                            body = r.json()
                            assert r.status_code == 200 and body["status"] == "completed", body
                            self.created.append(body["id"])
                            self._done(body)
                            continue
                        msg: dict[str, Any] = {
                            "type": "response.create",
                            "model": MODEL,
                            "input": f"turn {n}",
                            "store": False,
                        }
                        if prev is not None:
                            msg["previous_response_id"] = prev
                        ws.send(json.dumps(msg))
                        while True:
                            ev = json.loads(ws.recv(timeout=30))
                            assert ev["type"] != "error", ev
                            if ev["type"] == "response.created":
                                self.created.append(ev["response"]["id"])
                            if ev["type"] in TERMINAL:
                                assert ev["type"] == "response.completed", ev
                                self._done(ev["response"])
                                prev = ev["response"]["id"]
                                break
        except BaseException as exc:
            self.error = exc

    def _done(self, response: dict[str, Any]) -> None:
        self.usage[response["id"]] = response["usage"]
        self.completed.append(response["id"])

    def wait_completed(self, n: int) -> None:
        wait_for(lambda: len(self.completed) >= n or self.error, 60, f"{n} completed turns")
        if self.error is not None:
            raise self.error

    def join(self, *, allow_error: bool = False) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error is not None and not allow_error:
            raise self.error


# -- journal -------------------------------------------------------------------------------------


def test_journal_append_rotate_replay_discard(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    assert not journal.pending()
    assert journal.append([record(1).to_dict(), record(2).to_dict()]) == 2
    assert journal.path.read_bytes().count(b"\n") == 2
    assert journal.pending()
    segments = journal.rotate()
    assert len(segments) == 1 and not journal.path.exists()
    journal.append([record(3).to_dict()])  # appends during a replay go to a fresh live file
    assert [r["response_id"] for r in journal.read(segments[0])] == ["resp_1", "resp_2"]
    assert [r["response_id"] for r in journal.records()] == ["resp_1", "resp_2", "resp_3"]
    # A crash before discard leaves the segment: a new process (new Journal) replays it again.
    again = Journal(tmp_path / "j.jsonl")
    assert again.segments() == segments and again.pending()
    journal.discard(segments[0])
    assert [r["response_id"] for r in again.records()] == ["resp_3"]
    assert [UsageRecord.from_dict(d) for d in again.records()] == [record(3)]
    again.discard(again.rotate()[0])
    assert not again.pending()


def test_journal_shared_by_processes_loses_nothing_while_one_replays(tmp_path: Path) -> None:
    """Replicas on one host share the default journal path. Separate ``Journal`` objects (separate
    file descriptions: ``flock`` treats them as separate processes) append while another one
    rotates, reads and discards segments over and over; every record ends up read exactly once."""
    path = tmp_path / "shared.jsonl"
    writers, per_writer = 8, 1000
    done = threading.Event()
    replayed: list[str] = []

    def write(w: int) -> None:
        journal = Journal(path)
        for i in range(per_writer):
            journal.append([{"response_id": f"w{w}-{i}"}])

    def replay() -> None:
        journal = Journal(path)
        while True:
            finished = done.is_set()
            for segment in journal.rotate():
                replayed.extend(r["response_id"] for r in Journal.read(segment))
                journal.discard(segment)
            if finished:
                return

    replayer = threading.Thread(target=replay)
    replayer.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    replayer.join(60)
    assert not replayer.is_alive()
    expected = {f"w{w}-{i}" for w in range(writers) for i in range(per_writer)}
    assert Counter(replayed) == Counter(expected), "a record was lost or read twice"
    assert not Journal(path).pending()


def test_journal_heals_a_torn_tail(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    journal.append([record(1).to_dict()])
    with open(journal.path, "ab") as f:  # what a SIGKILL in the middle of a write leaves
        f.write(b'{"response_id": "resp_torn", "mod')
    journal.append([record(2).to_dict()])
    assert [r["response_id"] for r in journal.records()] == ["resp_1", "resp_2"]


# -- write-ahead log -----------------------------------------------------------------------------


def test_wal_rotates_truncates_and_deletes_generations_as_records_are_acknowledged(tmp_path: Path) -> None:
    base = tmp_path / "j.jsonl"
    line = len(record_line(record(0)))
    wal = WriteAheadLog(base, max_bytes=3 * line)  # three records per generation
    for i in range(7):
        assert wal.append(f"resp_{i}", record_line(record(i)))
    gens = wal_files(base)
    assert wal.generations == gens and len(gens) == 3 and wal.rotations == 2
    assert [[r["response_id"] for r in Journal.read(g)] for g in gens] == [
        ["resp_0", "resp_1", "resp_2"],
        ["resp_3", "resp_4", "resp_5"],
        ["resp_6"],
    ]
    assert [UsageRecord.from_dict(r) for r in Journal.read(gens[0])] == [record(0), record(1), record(2)]
    wal.ack(["resp_0", "resp_2", "resp_4", "resp_unknown"])  # out of order, plus one it never held
    assert wal_files(base) == gens and wal.unacked == 4
    wal.ack(["resp_1"])  # the first generation is fully acknowledged: deleted
    assert wal_files(base) == gens[1:]
    wal.ack(["resp_6"])  # the live generation is fully acknowledged: truncated, kept
    assert wal_files(base) == gens[1:] and gens[2].stat().st_size == 0
    wal.append("resp_7", record_line(record(7)))  # ... and written from offset 0 again
    assert [r["response_id"] for r in Journal.read(gens[2])] == ["resp_7"]
    wal.ack(["resp_3", "resp_5"])
    assert wal_files(base) == [gens[2]]
    # continuous load never lets the live generation empty: size-based rotation still bounds it
    for i in range(8, 40):
        wal.append(f"resp_{i}", record_line(record(i)))
        wal.ack([f"resp_{i - 1}"])
    assert wal.rotations > 2 and len(wal_files(base)) <= 2
    assert all(g.stat().st_size < 4 * line for g in wal_files(base))  # max_bytes + at most one line
    assert wal.unacked == 1
    wal.close()  # shutdown keeps only the generation with an unacknowledged record (acked ones
    (kept,) = wal_files(base)  # share it: recovering them again is harmless, the ledger is idempotent)
    assert [r["response_id"] for r in Journal.read(kept)][-1] == "resp_39"


def test_wal_age_rotation_and_a_duplicate_id(tmp_path: Path) -> None:
    base = tmp_path / "j.jsonl"
    wal = WriteAheadLog(base, max_age_s=0.0)  # every append opens a new generation
    wal.append("resp_1", record_line(record(1)))
    wal.append("resp_1", record_line(record(1)))  # the same id twice: two lines, two acks
    assert len(wal_files(base)) == 2
    wal.ack(["resp_1"])
    assert len(wal_files(base)) == 1 and wal.unacked == 1
    wal.ack(["resp_1"])
    assert wal.unacked == 0
    wal.close()
    assert not wal_files(base)


def test_start_up_recovers_a_killed_process_wal_including_a_torn_line(tmp_path: Path) -> None:
    """A real process submits records and SIGKILLs itself before its worker ever runs: only its
    WAL holds them. A torn last line (killed mid-write) is appended too. Recovery moves the
    records into the journal (fsync) and deletes the WAL; the replay delivers them."""
    journal_path = tmp_path / "j.jsonl"
    script = f"""
import os, signal
from billing.journal import Journal
from billing.usage import UsageQueue
from tests.billing.test_billing import GatedSink, record
queue = UsageQueue(GatedSink(), Journal({str(journal_path)!r}))
for i in range(5):
    queue.submit(record(i))
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL
    (left,) = wal_files(journal_path)
    with open(left, "ab") as f:
        f.write(b'{"response_id": "resp_torn", "mod')
    assert not Journal(journal_path).pending()  # nothing in the journal: without the WAL, lost

    async def restart() -> None:
        sink = GatedSink()
        sink.gate.set()
        queue = UsageQueue(sink, Journal(journal_path), retry_s=0.01)
        queue.start()  # recovery runs before the replay loop's first pass
        assert not wal_files(journal_path)
        await await_for(lambda: len(sink.records) == 5 and not queue.journal.pending(), "the replay")
        assert sink.records == {f"resp_{i}": record(i) for i in range(5)}
        await queue.drain()

    asyncio.run(restart())


def test_recovery_leaves_a_live_wal_alone(tmp_path: Path) -> None:
    """Two replicas sharing a journal folder: one's start-up must not take the other's live WAL."""
    base = tmp_path / "j.jsonl"
    live = WriteAheadLog(base)
    live.append("resp_1", record_line(record(1)))
    journal = Journal(base)
    assert WriteAheadLog(base).recover(journal) == 0  # locked by its (living) writer
    assert wal_files(base) == live.generations and not journal.pending()
    live.close()  # unacknowledged: the file stays, its lock goes
    assert WriteAheadLog(base).recover(journal) == 1
    assert not wal_files(base) and [r["response_id"] for r in journal.records()] == ["resp_1"]


async def test_queue_acknowledges_wal_records_once_the_sink_or_journal_has_them(tmp_path: Path) -> None:
    sink = GatedSink()
    journal = Journal(tmp_path / "j.jsonl")
    queue = UsageQueue(sink, journal, maxsize=2, overflow_max=1, retry_s=0.01)
    assert queue.wal is not None  # on by default: a journal and a durable sink
    for i in range(4):  # 2 queued, 1 overflow, 1 journaled synchronously (acknowledged at once)
        queue.submit(record(i))
    assert queue.wal.appended == 4 and queue.wal.unacked == 3
    (gen,) = wal_files(journal.path)
    assert [r["response_id"] for r in Journal.read(gen)] == [f"resp_{i}" for i in range(4)]
    queue.start()
    await await_for(lambda: queue.journaled == 2, "the overflow spilled to the journal")
    assert queue.wal.unacked == 2  # the queued pair waits on the blocked sink
    sink.gate.set()
    await await_for(lambda: queue.wal.unacked == 0, "the sink acknowledged")
    assert gen.stat().st_size == 0  # fully acknowledged: truncated
    await queue.drain()
    assert not wal_files(journal.path)
    assert UsageQueue(MemorySinkForTest(), journal).wal is None  # memory loses records anyway: no WAL


class MemorySinkForTest:
    durable = False

    async def write_batch(self, records: Any) -> None:
        pass


# -- ledger --------------------------------------------------------------------------------------


async def test_ledger_is_idempotent_by_response_id(redis_url: str) -> None:
    ledger = RedisLedger(redis_url, "test:usage")
    try:
        batch = [record(1), record(2), record(3)]
        await ledger.write_batch(batch)
        await ledger.write_batch(batch)  # a replay of the same batch
        await ledger.write_batch([record(2), record(4), record(4)])  # known + new + a duplicate in one batch
        assert ledger.appended == 4
        assert await ledger.redis.xlen("test:usage") == 4
        assert (
            DEFAULT_MARKER_TTL_S - 60
            < await ledger.redis.ttl(marker_key("test:usage", "resp_1"))
            <= DEFAULT_MARKER_TTL_S
        )
    finally:
        await ledger.close()
    # the stream round-trips the records exactly (None fields included)
    assert list(iter_ledger(redis_url, "test:usage", page=3)) == [record(1), record(2), record(3), record(4)]
    odd = record(9, tenant=None, ttft_s=None)
    assert UsageRecord.from_fields(odd.to_fields()) == odd


def test_ledger_keys_of_one_batch_share_a_cluster_slot() -> None:
    """Redis Cluster runs a script only when all its keys are in one slot (CROSSSLOT otherwise)."""
    from redis.crc import key_slot

    for stream in (DEFAULT_STREAM, "billing:usage:v2", "{tenantA}usage"):
        slots = {key_slot(k.encode()) for k in [stream, *(marker_key(stream, f"resp_{i}") for i in range(50))]}
        assert slots == {key_slot(stream.encode())}, stream
    assert marker_key(DEFAULT_STREAM, "resp_1") == "{respgate:usage}:seen:resp_1"
    for bad in ("a{}b", "a}b", "x{y"):
        with pytest.raises(ValueError, match="hash tag"):
            RedisLedger("redis://127.0.0.1:1", bad)


def test_one_shard_is_the_layout_before_shards_and_more_shards_spread_over_slots() -> None:
    from redis.crc import key_slot

    assert shard_streams(DEFAULT_STREAM, 1) == [DEFAULT_STREAM]  # today's stream and markers, unchanged
    assert all(shard_of(f"resp_{i}", 1) == 0 for i in range(100))
    streams = shard_streams(DEFAULT_STREAM, 8)
    assert streams[:3] == ["respgate:usage", "respgate:usage:1", "respgate:usage:2"]
    assert marker_key(streams[1], "resp_1") == "{respgate:usage:1}:seen:resp_1"
    assert shard_streams("{usage}:s", 3) == ["{usage}:s", "{usage:1}:s", "{usage:2}:s"]
    for base in (DEFAULT_STREAM, "{usage}:s"):
        names = shard_streams(base, 8)
        assert len({key_slot(n.encode()) for n in names}) == 8, names  # each shard its own slot
        for n in names:  # and each shard's script is single-slot
            assert {key_slot(k.encode()) for k in [n, *(marker_key(n, f"resp_{i}") for i in range(20))]} == {
                key_slot(n.encode())
            }
    # a record's shard is a function of its id alone (the same in every process), and ids spread
    spread = Counter(shard_of(f"resp_{i:04x}", 8) for i in range(4000))
    assert set(spread) == set(range(8)) and min(spread.values()) > 4000 / 8 * 0.8
    assert shard_of("resp_abc", 8) == 2  # crc32: no per-process salt, the same on every replica
    with pytest.raises(ValueError, match="at least 1"):
        RedisLedger("redis://127.0.0.1:1", shards=0)
    assert shard_stream("a:b", 0) == "a:b"


async def test_a_sharded_ledger_counts_each_record_once_across_shards_replays_and_restarts(
    redis_url: str, tmp_path: Path
) -> None:
    """Each record goes to its id's shard only; replays of a batch that every shard, or only some
    shards, took (a reply lost, a batch cut off at one shard) append nothing twice — through the
    same ledger, a fresh one (a restart), and the journal's start-up replay of a real queue."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    streams = shard_streams("test:usage", 4)
    batch = [record(i) for i in range(40)]
    taken = [r for r in batch if shard_of(r.response_id, 4) in (0, 1)]  # as if shards 2 and 3 had failed
    ledger = RedisLedger(redis_url, "test:usage", shards=4, marker_ttl_s=600)
    try:
        await ledger.write_batch(taken)
        assert ledger.appended == len(taken) and 0 < len(taken) < 40
        assert [client.xlen(s) for s in streams[2:]] == [0, 0]
        await ledger.write_batch(batch)  # the retry: only the other shards' records are new
        await ledger.write_batch(batch[::-1])  # and again, in another order
        assert ledger.appended == 40
        assert client.ttl(marker_key(streams[shard_of("resp_7", 4)], "resp_7")) <= 600
    finally:
        await ledger.close()
    lengths = [client.xlen(s) for s in streams]
    assert sum(lengths) == 40 and all(n > 0 for n in lengths), lengths
    for s in streams:  # every record on its id's shard, nowhere else
        assert {f["response_id"] for _, f in client.xrange(s)} == {
            r.response_id for r in batch if streams[shard_of(r.response_id, 4)] == s
        }

    # a restart: the batch sat in the journal (its reply timed out), and a new process replays it
    journal = Journal(tmp_path / "j.jsonl")
    journal.append(r.to_dict() for r in batch)
    restarted = RedisLedger(redis_url, "test:usage", shards=4)
    queue = UsageQueue(restarted, journal, retry_s=0.01, wal=False)
    queue.start()
    await await_for(lambda: not journal.pending(), "the start-up replay")
    await queue.drain()
    assert queue.replayed == 40 and restarted.appended == 0
    assert sum(client.xlen(s) for s in streams) == 40
    # every shard read back, oldest first; one shard's worth when only one is asked for
    got = list(iter_ledger(redis_url, "test:usage", shards=4, page=3))
    assert sorted(got, key=lambda r: r.response_id) == sorted(batch, key=lambda r: r.response_id)
    for s in streams:  # a merge: each shard's own order is kept
        assert [r.response_id for r in got if streams[shard_of(r.response_id, 4)] == s] == [
            f["response_id"] for _, f in client.xrange(s)
        ]
    assert len(list(iter_ledger(redis_url, "test:usage", page=3))) == lengths[0]
    assert usage_report(redis_url, "test:usage", shards=4)[0].responses == 40


async def test_ledger_retention_trims_old_records_and_their_replays_still_count_once(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    kept = RedisLedger(redis_url, "test:kept")  # no retention: the stream only grows
    trimmed = RedisLedger(redis_url, "test:trim", retention_s=0.05)
    try:
        old = [record(i) for i in range(300)]  # three of the stream's 100-entry nodes
        for ledger in (kept, trimmed):
            await ledger.write_batch(old)
        await asyncio.sleep(0.2)  # the old records are now older than the retention
        for ledger in (kept, trimmed):
            await ledger.write_batch([record(1000)])
        assert client.xlen("test:kept") == 301
        left = [f["response_id"] for _, f in client.xrange("test:trim")]
        assert left[-1] == "resp_1000" and len(left) < 301 - 100  # whole nodes of old records went
        await trimmed.write_batch(old)  # a late replay of trimmed records: their markers still live
        assert trimmed.appended == 301 and client.xlen("test:trim") == len(left)
    finally:
        await kept.close()
        await trimmed.close()


# -- queue ---------------------------------------------------------------------------------------


class GatedSink:
    """A durable sink whose writes wait for ``gate`` (a blocked ledger), then count each id once."""

    durable = True

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.records: dict[str, UsageRecord] = {}
        self.calls = 0

    async def write_batch(self, records: Any) -> None:
        self.calls += 1
        await self.gate.wait()
        for r in records:
            self.records[r.response_id] = r


class DownSink(GatedSink):
    """Fails fast while ``up`` is false, like Redis refusing connections."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.set()
        self.up = False

    async def write_batch(self, records: Any) -> None:
        self.calls += 1
        if not self.up:
            raise ConnectionError("ledger down")
        await super().write_batch(records)


async def test_queue_overflow_spills_to_the_journal_and_loses_nothing(tmp_path: Path) -> None:
    sink = GatedSink()
    journal = Journal(tmp_path / "j.jsonl")
    queue = UsageQueue(sink, journal, maxsize=2, overflow_max=3, retry_s=0.01)
    for i in range(10):  # worker not started: 2 queued, 3 in overflow, 5 journaled by submit itself
        queue.submit(record(i))
    assert queue.pending == 5 and queue.journaled_sync == 5 and len(journal.records()) == 5
    queue.start()
    await await_for(lambda: queue.journaled == 8, "the overflow spilled to the journal")
    assert not sink.records  # the sink is still blocked; nothing is lost meanwhile
    sink.gate.set()
    await await_for(lambda: len(sink.records) == 10 and not journal.pending(), "sink + replay")
    await queue.drain()
    assert set(sink.records) == {f"resp_{i}" for i in range(10)}


async def test_queue_journals_while_the_sink_is_down_and_replays_when_it_is_back(tmp_path: Path) -> None:
    sink = DownSink()
    journal = Journal(tmp_path / "j.jsonl")
    queue = UsageQueue(sink, journal, retry_s=0.01, retry_max_s=0.05)
    queue.start()
    queue.submit(record(1))
    await await_for(lambda: queue.journaled == 1 and queue.sink_down, "the first batch journaled")
    for i in range(2, 6):
        queue.submit(record(i))
    await await_for(lambda: queue.journaled == 5, "later batches journaled")
    sink.up = True
    # the replay clears ``sink_down`` after its segment is discarded: wait for both, or record 6
    # is (correctly, but not what this test checks) journaled for the next replay
    await await_for(lambda: len(sink.records) == 5 and not journal.pending() and not queue.sink_down, "the replay")
    queue.submit(record(6))
    await await_for(lambda: queue.written == 1, "direct writes once the sink is back")
    await queue.drain()
    assert set(sink.records) == {f"resp_{i}" for i in range(1, 7)}


async def test_shutdown_with_a_blocked_sink_journals_and_start_up_replays(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    blocked = GatedSink()
    queue = UsageQueue(blocked, journal)
    queue.start()
    for i in range(5):
        queue.submit(record(i))
    await queue.drain(timeout=0.05)  # the in-flight batch included: journaling it twice is harmless
    assert {r["response_id"] for r in journal.records()} == {f"resp_{i}" for i in range(5)}
    fresh = GatedSink()
    fresh.gate.set()
    restarted = UsageQueue(fresh, journal, retry_s=0.01)
    restarted.start()
    await await_for(lambda: len(fresh.records) == 5 and not journal.pending(), "the start-up replay")
    await restarted.drain()


# -- through a real gateway ----------------------------------------------------------------------


def test_redis_outage_during_a_load_leaves_exactly_one_record_per_response(
    make_gateway: Callable[..., Any], durable_redis: DurableRedis, tmp_path: Path
) -> None:
    journal_path = tmp_path / "j.jsonl"
    live = make_gateway(Settings(redis_url=durable_redis.url, usage_journal=str(journal_path)))
    load = Load(live.url, [10, 10, 10, 10]).start()
    load.wait_completed(10)
    load.gates[1].set()
    durable_redis.stop()  # while phase 2 is flowing
    load.gates[2].set()  # phase 3 runs with Redis certainly down
    load.wait_completed(30)
    load.gates[3].set()
    durable_redis.start()  # while phase 4 is flowing
    load.join()
    assert len(load.completed) == 40
    assert live.gw.usage.journaled > 0  # the outage did go through the journal

    expected = set(load.completed)
    wait_for(lambda: set(stream_ids(durable_redis.url)) == expected, 60, "the ledger to catch up")
    wait_for(lambda: not Journal(journal_path).pending(), 30, "the journal to be replayed")
    ids = stream_ids(durable_redis.url)
    assert len(ids) == len(expected) and set(ids) == expected
    by_id = {r.response_id: r for r in iter_ledger(durable_redis.url)}
    for rid, usage in load.usage.items():
        r = by_id[rid]
        assert (r.input_tokens, r.cached_tokens, r.output_tokens) == (
            usage["input_tokens"],
            usage["input_tokens_details"]["cached_tokens"],
            usage["output_tokens"],
        )
        assert r.status == "completed" and r.model == MODEL and r.finished_at >= r.created_at
        assert r.ttft_s is not None and 0 <= r.ttft_s <= r.duration_s
    assert Counter(r.transport for r in by_id.values()) == {"ws": 30, "http": 10}


def test_a_blocked_sink_never_blocks_turns(make_gateway: Callable[..., Any], tmp_path: Path) -> None:
    sink = GatedSink()
    live = make_gateway(Settings(usage_journal=str(tmp_path / "j.jsonl")), usage_sink=sink)
    load = Load(live.url, [20]).start()
    load.join()  # every turn completed while the sink is blocked
    assert len(load.completed) == 20 and not sink.records
    live.loop.call_soon_threadsafe(sink.gate.set)
    wait_for(lambda: set(sink.records) == set(load.completed), 60, "every record after release")


def test_sigkill_loses_no_acknowledged_record_and_duplicates_none(durable_redis: DurableRedis, tmp_path: Path) -> None:
    """The guarantee under test: every response the client saw complete before the process was
    SIGKILLed is in the ledger exactly once after restart — not only the records the ledger or
    the journal had acknowledged: the rest were in the usage WAL, written before the terminal
    event was sent — and nothing else is there: only responses the client saw, plus at most the
    one turn each load had in flight when its process was killed. That turn is billed when the kill
    lands after its WAL write and before its events left the process (it was produced; the client
    saw a dropped connection, not a failure), so the client never learned its id.

    Kill 1 lands while Redis is down (records go to the journal; restart must replay them); kill 2
    while Redis is up and records flow straight to the stream."""
    journal_path = tmp_path / "j.jsonl"
    port = _free_port()
    env = {
        **os.environ,
        "RESPGATE_REDIS_URL": durable_redis.url,
        "RESPGATE_USAGE_JOURNAL": str(journal_path),
        "RESPGATE_LOG_LEVEL": "warning",
    }
    journaled = lambda: {r["response_id"] for r in Journal(journal_path).records()}  # noqa: E731
    in_stream = lambda: set(stream_ids(durable_redis.url))  # noqa: E731

    def serve() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--engine", "simulated", "--port", str(port)], env=env, cwd=REPO
        )
        wait_for(lambda: proc.poll() is not None or _listening(port), 60, "the gateway to listen")
        assert proc.poll() is None
        return proc

    kills: list[float] = []

    def kill_mid_load(proc: subprocess.Popen[bytes], load: Load, n: int) -> None:
        load.wait_completed(n)
        kills.append(time.time())
        proc.send_signal(signal.SIGKILL)  # turns are flowing
        proc.wait(10)
        load.join(allow_error=True)
        assert load.error is not None  # the client saw the gateway die mid-load

    proc = serve()
    try:
        load = Load(f"http://127.0.0.1:{port}", [10, 10, 100_000]).start()
        load.wait_completed(10)
        s1 = set(load.completed)
        wait_for(lambda: s1 <= in_stream(), 30, "phase 1 in the stream")
        durable_redis.stop()
        load.gates[1].set()
        load.wait_completed(20)
        s2 = set(load.completed[10:20])
        wait_for(lambda: s2 <= journaled(), 30, "phase 2 in the journal")
        load.gates[2].set()
        kill_mid_load(proc, load, 25)  # kill 1: Redis down, the journal holds the records
        # As if Redis had applied phase 1's batches but their replies timed out: journaled too.
        durable_redis.start()
        Journal(journal_path).append(r.to_dict() for r in iter_ledger(durable_redis.url) if r.response_id in s1)
        assert s2 <= journaled()

        proc = serve()  # start-up replays the journal
        wait_for(lambda: s1 | s2 <= in_stream(), 60, "journaled records replayed at start-up")
        load2 = Load(f"http://127.0.0.1:{port}", [10, 100_000]).start()
        load2.wait_completed(10)
        s3 = set(load2.completed)
        wait_for(lambda: s3 <= in_stream(), 30, "phase 3 in the stream")
        load2.gates[1].set()
        kill_mid_load(proc, load2, 20)  # kill 2: Redis up, records flowing straight to the stream

        proc = serve()
        acknowledged = s1 | s2 | s3
        wait_for(lambda: acknowledged <= in_stream(), 60, "acknowledged records")
        seen_complete = set(load.completed) | set(load2.completed)
        assert len(seen_complete) > len(acknowledged)  # the kills did land while turns completed
        wait_for(lambda: seen_complete <= in_stream(), 60, "every response the client saw complete")
        wait_for(lambda: not Journal(journal_path).pending(), 30, "the journal to be replayed")
        assert not wal_files(journal_path), "the killed processes' WAL generations were not recovered"
        ids = stream_ids(durable_redis.url)
        assert len(ids) == len(set(ids)), "a record was counted twice"
        by_id = {r.response_id: r for r in iter_ledger(durable_redis.url)}
        seen = set(load.created) | set(load.completed) | set(load2.created) | set(load2.completed)
        unseen = [r for r in by_id.values() if r.response_id not in seen]
        for each, since, killed_at in zip((load, load2), [0.0, *kills], kills):  # load 1 ran until kill 1
            in_flight = [r for r in unseen if since < r.created_at <= killed_at]
            last_seen = max(by_id[rid].created_at for rid in each.completed)
            assert len(in_flight) <= 1 and all(last_seen < r.created_at for r in in_flight), (in_flight, last_seen)
        assert len(unseen) <= len(kills), unseen
        for rid, usage in {**load.usage, **load2.usage}.items():  # the WAL's copy is the same record
            assert (by_id[rid].input_tokens, by_id[rid].output_tokens) == (
                usage["input_tokens"],
                usage["output_tokens"],
            )
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("shards", [1, 4])
def test_usage_report_per_key_model_and_day(
    make_gateway: Callable[..., Any],
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    shards: int,
) -> None:
    from gateway.ops.cli import main

    live = make_gateway(
        Settings(
            redis_url=redis_url, api_keys=["k1", "k2"], usage_journal=str(tmp_path / "j"), usage_stream_shards=shards
        )
    )
    loads = {"k1": Load(live.url, [7], key="k1").start(), "k2": Load(live.url, [5], key="k2", http_every=2).start()}
    for load in loads.values():
        load.join()
    wait_for(lambda: len(stream_ids(redis_url, shards=shards)) == 12, 30, "12 records in the ledger")
    lengths = [redis.Redis.from_url(redis_url).xlen(s) for s in shard_streams(DEFAULT_STREAM, shards)]
    assert sum(lengths) == 12 and (shards == 1 or sum(1 for n in lengths if n) > 1), lengths

    assert main(["usage", "--redis-url", redis_url, "--json", "--shards", str(shards)]) == 0
    rows = json.loads(capsys.readouterr().out)
    auth = KeyAuth(["k1", "k2"])
    for key, load in loads.items():
        tenant = auth.tenant({"authorization": f"Bearer {key}"})
        mine = [r for r in rows if r["tenant"] == tenant]
        assert {r["model"] for r in mine} == {MODEL}
        assert all(time.strptime(r["day"], "%Y-%m-%d") for r in mine)
        total = lambda f, mine=mine: sum(r[f] for r in mine)  # noqa: E731
        assert total("responses") == len(load.completed)
        assert total("input_tokens") == sum(u["input_tokens"] for u in load.usage.values())
        assert total("cached_tokens") == sum(u["input_tokens_details"]["cached_tokens"] for u in load.usage.values())
        assert total("output_tokens") == sum(u["output_tokens"] for u in load.usage.values())
    assert usage_report(redis_url, shards=shards, page=5) == usage_report(
        redis_url, shards=shards
    )  # paging changes nothing

    monkeypatch.setenv("RESPGATE_USAGE_STREAM_SHARDS", str(shards))  # the setting, as the gateway reads it
    assert main(["usage", "--redis-url", redis_url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "day",
        "tenant",
        "model",
        "responses",
        "input_tokens",
        "cached_tokens",
        "output_tokens",
        "reasoning_tokens",
    ]
    assert len(table) == 1 + len(rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.1).close()
        return True
    except OSError:
        return False


async def test_billing_gauges_report_lag_wal_and_journal_from_the_components(tmp_path: Path) -> None:
    """The scrape-time collector reads the queue's public surface: lag of the oldest pending record,
    WAL appends and unacknowledged records, and the journal's bytes on disk."""
    from prometheus_client import CollectorRegistry

    from gateway.base.metrics import ComponentCollector

    sink = GatedSink()  # blocked: records stay pending
    journal = Journal(tmp_path / "j.jsonl")
    queue = UsageQueue(sink, journal, wal=WriteAheadLog(journal.path))
    registry = CollectorRegistry()
    registry.register(ComponentCollector(queue, store=None))
    queue.start()
    for i in range(3):
        queue.submit(record(i, finished_at=time.time() - 5))  # finished 5 s ago, not yet billed
    sample = lambda name: registry.get_sample_value(name) or 0.0  # noqa: E731
    assert sample("respgate_billing_wal_appends_total") == 3
    assert sample("respgate_billing_wal_unacked") == 3
    assert sample("respgate_billing_lag_seconds") >= 5
    assert sample("respgate_billing_journal_bytes") == 0
    journal.append([record(9).to_dict()])
    assert sample("respgate_billing_journal_bytes") == journal.path.stat().st_size > 0
    sink.gate.set()
    await await_for(lambda: {f"resp_{i}" for i in range(3)} <= set(sink.records), "the sink to take the records")
    await await_for(lambda: sample("respgate_billing_wal_unacked") == 0, "the WAL to be acknowledged")
    assert sample("respgate_billing_lag_seconds") == 0
    await queue.drain()
