"""Event logs of background streams: the events a ``background`` + ``stream`` response sent, kept
for a bounded window so that a client whose connection dropped resumes with
``GET /v1/responses/{id}?stream=true&starting_after=N`` and gets every event after ``N``, exactly as
first sent.

A log is a run of :class:`LoggedEvent` entries ``(sequence_number, type, JSON, terminal)``, dense
from the first one kept. Events, not transport bytes: the JSON is encoded once, in the turn's task,
and each reader's transport frames it (``gateway.transport.sse`` for HTTP; a WebSocket text frame is
the JSON itself), so the log knows nothing of SSE. The byte bounds count the JSON (Redis's window
counts what a record stores: for one release, also the SSE frame written beside it, ``_fields``).
Two places hold them:

- **this process** (:class:`MemoryEventLogs`): the replica that runs the turn appends each event as
  it is produced, and its own readers (the create's stream, a resume that lands here) follow it
  live. Bounded per response (``max_bytes``: the oldest events are dropped, so a resume from before
  the window fails clearly instead of skipping events), in all, and in time (a finished log lives
  ``ttl_s``). In all: finished logs are kept in a :class:`~cache.lru.BoundedLRU` whose parts are
  the tenants, so a tenant that runs many streams drops its own finished logs, never those of a
  tenant within its share (a quarter of the total); when a running log grows the total past the
  bound, its own tenant's finished logs go first, then those of the tenant furthest over its share
  counting its running logs, and none of a tenant within it (the total then goes over). Running
  logs stay (each is bounded by ``max_bytes``, their number by the per-tenant limit). A finished
  log is always kept at first, whatever its size (it was counted while it ran): a client resumes
  a stream that filled its window.
- **Redis** (:class:`RedisEventLog`), when configured, so that any replica can serve a resume: one
  Stream per response, entry id ``0-(sequence_number + 1)`` so that ``XREAD`` after a sequence number
  is one call, trimmed to the same byte window (``XTRIM MINID``), expiring ``ttl_s`` after its last
  write. The owner writes in batches from a task of its own (:class:`RedisLogWriter`): a turn never
  waits for a Redis round trip per event, and a Redis outage costs only cross-replica resumes.
  Redis Cluster: every command, and every batch's pipeline, touches that one stream key
  (``{prefix}bgev:<id>``), so logs spread over the slots by response id and nothing crosses one.

Readers detect a gap (events dropped by the window before they were read) and raise
:class:`Truncated` rather than hand a client a stream with holes in it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from cache.footprint import RECORD_OVERHEAD
from cache.lru import BoundedLRU, tenant_of
from cache.redis_client import AsyncClient

log = logging.getLogger(__name__)


class LoggedEvent(NamedTuple):
    """One event as a log keeps it."""

    seq: int
    #: the event's ``type`` (what SSE's ``event:`` line names)
    type: str
    #: the event's JSON, as every reader sends it
    data: bytes
    #: it ends the stream
    terminal: bool


Entry = LoggedEvent


class Truncated(Exception):
    """The reader asked for events the window no longer holds (``first_kept`` is the oldest kept)."""

    def __init__(self, first_kept: int) -> None:
        super().__init__(f"events before {first_kept} are no longer kept")
        self.first_kept = first_kept


class LogUnavailable(Exception):
    """The shared log cannot be read (Redis is down)."""


class EventLog:
    """One response's events in this process, followed live by any number of readers."""

    def __init__(
        self,
        max_bytes: int,
        on_bytes: Callable[[int], None] | None = None,
        on_finish: Callable[[EventLog], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self._on_bytes = on_bytes
        self._on_finish = on_finish
        self._entries: list[Entry] = []
        self._head = 0  # entries before it were dropped (compacted away now and then)
        self._first = 0  # sequence number of the oldest kept entry
        self._next = 0  # sequence number the next entry must have
        self.nbytes = 0
        self.finished_at: float | None = None
        #: the sequence number of the terminal event, once appended
        self.terminal_seq: int | None = None
        self._wake = asyncio.Event()

    @property
    def first_seq(self) -> int:
        """The oldest sequence number a reader can still get (== ``next_seq`` when empty)."""
        return self._first

    @property
    def next_seq(self) -> int:
        return self._next

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def append(self, entry: LoggedEvent) -> None:
        seq = entry.seq
        if seq != self._next:
            raise ValueError(f"event {seq} out of order (expected {self._next})")
        self._entries.append(entry)
        self._next = seq + 1
        if entry.terminal:
            self.terminal_seq = seq
        added = len(entry.data)
        while self.nbytes + added > self.max_bytes and len(self._entries) - self._head > 1:
            added -= len(self._entries[self._head].data)
            self._head += 1
            self._first += 1
        if self._head > 1024 and self._head * 2 > len(self._entries):
            del self._entries[: self._head]
            self._head = 0
        self._grow(added)
        self._notify()

    def finish(self) -> None:
        if self.finished_at is None:
            self.finished_at = time.monotonic()
            self._notify()
            if self._on_finish is not None:
                self._on_finish(self)

    def drop(self) -> None:
        """Forget every event (evicted): readers still following stop at once."""
        self._entries, self._head, self._first = [], 0, self._next
        self._grow(-self.nbytes)
        self.finish()

    def _grow(self, delta: int) -> None:
        self.nbytes += delta
        if self._on_bytes is not None and delta:
            self._on_bytes(delta)

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()  # each reader waits on its own future inside Event.wait: cancelling one is safe

    async def follow(self, after: int) -> AsyncIterator[LoggedEvent]:
        """The events after sequence number ``after``, then each new one as it comes, until the
        terminal (or the log finishes). Raises :class:`Truncated` when the next event it should
        give was dropped, before or while reading (a reader slower than the window)."""
        cursor = after
        while True:
            while cursor + 1 < self._next:
                if cursor + 1 < self._first:
                    raise Truncated(self._first)
                entry = self._entries[self._head + (cursor + 1 - self._first)]
                cursor = entry.seq
                yield entry
                if entry.terminal:
                    return
            if self.finished or self.terminal_seq is not None:  # nothing comes after the terminal
                return
            await self._wake.wait()


class MemoryEventLogs:
    """This process's logs by response id, bounded per log, in all and in time, each tenant's finished
    logs held to its share (module docstring)."""

    def __init__(self, max_bytes: int, max_total_bytes: int, ttl_s: float, max_finished: int = 65_536) -> None:
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.ttl_s = ttl_s
        self._logs: dict[str, EventLog] = {}
        #: finished logs by (tenant, response id), in the order they finished (never "used": a read
        #: goes through ``_logs``), so the oldest is the first to expire
        self._finished: BoundedLRU[tuple[str | None, str], EventLog] = BoundedLRU(
            max_finished, max_total_bytes, part=tenant_of, on_evict=self._gone
        )
        #: each tenant's bytes in running logs (counted in its usage when shares decide an eviction)
        self._running: dict[str | None, int] = {}
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._logs)

    @property
    def evictions(self) -> int:
        return self._finished.evictions

    def open(self, response_id: str, tenant: str | None = None) -> EventLog:
        self._expire()
        log_ = EventLog(
            self.max_bytes,
            lambda delta: self._count(tenant, log_, delta),
            lambda done: self._done(tenant, response_id, done),
        )
        self._logs[response_id] = log_
        return log_

    def get(self, response_id: str) -> EventLog | None:
        self._expire()
        return self._logs.get(response_id)

    def _done(self, tenant: str | None, response_id: str, log_: EventLog) -> None:
        self._run(tenant, -log_.nbytes)  # no longer running: from now on its bytes are the map's
        if self._logs.get(response_id) is not log_:
            return  # replaced, or dropped
        # forced: the log was counted in the total while it ran, and a resume needs it whole; refusing
        # it for its size would drop every stream that filled its window the moment it ended (a
        # per-log bound above a quarter of the total). Over its tenant's share, that tenant's own
        # finished logs are the first to go.
        self._finished.put((tenant, response_id), log_, log_.nbytes + RECORD_OVERHEAD, force=True)

    def _count(self, tenant: str | None, log_: EventLog, delta: int) -> None:
        """A log's events grew or shrank by ``delta``. Past the total, the growing tenant's own
        finished logs go first; when it has none, only those of a tenant over its share counting its
        running logs' bytes (``BoundedLRU.evict_one``), and when none is, the total is let go over:
        running logs are never dropped, and they are bounded anyway — each by ``max_bytes``, their
        number by the per-tenant limit on background responses (``background_max_per_tenant``)."""
        self.nbytes += delta
        if not log_.finished:
            self._run(tenant, delta)
        while (
            delta > 0
            and self.nbytes > self.max_total_bytes
            and self._finished.evict_one(prefer=tenant, outside=self._running)
        ):
            pass

    def _run(self, tenant: str | None, delta: int) -> None:
        """Keep ``_running`` (each tenant's bytes in running logs; none at 0: it stays small)."""
        left = self._running.get(tenant, 0) + delta
        if left > 0:
            self._running[tenant] = left
        else:
            self._running.pop(tenant, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for key, log_ in self._finished.sweep(
            lambda done: now - (done.finished_at or now) > self.ttl_s, limit=None
        ):  # in the order they finished: all expired first
            self._gone(key, log_)

    def _gone(self, key: tuple[str | None, str], log_: EventLog) -> None:
        """A finished log left the bounds (evicted or expired): forget it and its events."""
        if self._logs.get(key[1]) is log_:
            del self._logs[key[1]]
        log_.drop()


def _entry_id(seq: int) -> str:
    return f"0-{seq + 1}"


def _seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[1]) - 1


class RedisEventLog:
    """The shared copy of the logs: one Redis Stream per response (module docstring)."""

    #: how long one ``XREAD`` blocks before the reader checks whether the response still runs
    BLOCK_MS = 1000

    def __init__(self, client: AsyncClient, *, prefix: str = "respgate:", max_bytes: int, ttl_s: float) -> None:
        self.redis = client
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.ttl_ms = max(1, int(ttl_s * 1000))

    def key(self, response_id: str) -> str:
        return f"{self.prefix}bgev:{response_id}"

    def writer(self, response_id: str) -> RedisLogWriter:
        return RedisLogWriter(self, response_id)

    async def append(self, response_id: str, entries: list[Entry]) -> None:
        """Write entries now (the reaper's closing events for a response whose owner is gone)."""
        pipe = self.redis.pipeline(transaction=False)
        for entry in entries:
            pipe.xadd(self.key(response_id), _fields(entry), id=_entry_id(entry.seq))
        pipe.pexpire(self.key(response_id), self.ttl_ms)
        await pipe.execute()

    async def bounds(self, response_id: str) -> tuple[int, int, bool] | None:
        """(first kept, last, whether the last is the terminal) sequence numbers; None when there is
        no log (never written, or expired)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrange(self.key(response_id), count=1)
        pipe.xrevrange(self.key(response_id), count=1)
        first, last = await pipe.execute()
        if not first or not last:
            return None
        return _seq_of(first[0][0]), _seq_of(last[0][0]), bool(last[0][1].get(b"t"))

    async def follow(
        self, response_id: str, after: int, ended: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[LoggedEvent]:
        """Like :meth:`EventLog.follow`, from Redis. Between entries that do not come, ``ended()``
        says whether to stop waiting (the response is over, and its log said all it will); two
        quiet reads after it said so end the stream."""
        key, cursor, quiet = self.key(response_id), after, 0
        while True:
            try:
                got: Any = await self.redis.xread({key: _entry_id(cursor)}, count=256, block=self.BLOCK_MS)
            except RedisError as exc:
                raise LogUnavailable(str(exc)) from exc
            entries = got[0][1] if got else []
            if not entries:
                if await ended():
                    quiet += 1
                    if quiet >= 2:
                        return
                continue
            quiet = 0
            for entry_id, fields in entries:
                seq = _seq_of(entry_id)
                if seq != cursor + 1:
                    raise Truncated(seq)
                cursor = seq
                entry = _entry(seq, fields)
                yield entry
                if entry.terminal:
                    return


def _legacy_frame(entry: LoggedEvent) -> bytes:
    """The entry as a replica of the previous release wrote and reads it: its SSE frame
    (``event: <type>\ndata: <json>\n\n``, byte for byte ``gateway.transport.sse.sse_encoded``;
    built here because cache never imports gateway)."""
    return b"event: " + entry.type.encode() + b"\ndata: " + entry.data + b"\n\n"


def _fields(entry: LoggedEvent) -> dict[FieldT, EncodableT]:
    # ``f`` (the SSE frame) is written beside ``y``/``d`` for ONE release, for the rolling update:
    # an old replica's resume reads ``fields[b"f"]`` and would fail on a record without it. Remove
    # it (and ``_legacy_frame``, and its bytes in ``_stored_size``) in the release after this one,
    # when no replica older than this one can be running; ``_entry`` keeps reading ``f``-only records
    # until then too.
    fields: dict[FieldT, EncodableT] = {"y": entry.type, "d": entry.data, "f": _legacy_frame(entry)}
    if entry.terminal:
        fields["t"] = b"1"
    return fields


def _stored_size(entry: LoggedEvent) -> int:
    """What one entry costs in Redis (the window counts it): the type, the JSON, and the legacy
    frame written beside them (``_fields``)."""
    return 2 * (len(entry.type) + len(entry.data)) + _FRAME_OVERHEAD


#: the bytes an SSE frame adds around its type and JSON (``_legacy_frame``)
_FRAME_OVERHEAD = len(b"event: \ndata: \n\n")


def _entry(seq: int, fields: dict[bytes, bytes]) -> LoggedEvent:
    terminal = bool(fields.get(b"t"))
    if b"d" in fields:
        return LoggedEvent(seq, fields[b"y"].decode(), fields[b"d"], terminal)
    # written by a replica of an older version, mid rolling update: an SSE frame
    # (``event: <type>\ndata: <json>\n\n``)
    frame = fields[b"f"]
    nl = frame.find(b"\n")
    return LoggedEvent(seq, frame[7:nl].decode(), frame[nl + 7 :].rstrip(b"\n"), terminal)


class RedisLogWriter:
    """The owner's side of one shared log: ``append`` never waits; a task writes batches.

    The window is kept here, where the sizes are known: entries written are remembered as
    (sequence number, size), and when they exceed ``max_bytes`` the stream is trimmed to the
    newest that fit. Events the writer could not send (Redis down, or more pending than the window)
    are dropped; a reader then sees the gap and says so."""

    def __init__(self, log_: RedisEventLog, response_id: str) -> None:
        self.log = log_
        self.key = log_.key(response_id)
        self.response_id = response_id
        self._pending: list[Entry] = []
        self._pending_bytes = 0
        self._kept: deque[tuple[int, int]] = deque()
        self._kept_bytes = 0
        self._wake = asyncio.Event()
        self._closed = False
        self.failures = 0
        self._task = asyncio.ensure_future(self._run())

    def append(self, entry: LoggedEvent) -> None:
        self._pending.append(entry)
        self._pending_bytes += _stored_size(entry)
        while self._pending_bytes > self.log.max_bytes and len(self._pending) > 1:
            self._pending_bytes -= _stored_size(self._pending.pop(0))
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch, self._pending, self._pending_bytes = self._pending, [], 0
                try:
                    await self._write(batch)
                except RedisError as exc:
                    self.failures += 1
                    self._kept.clear()  # what landed is unknown: the window restarts from here
                    self._kept_bytes = 0
                    log.warning(
                        "background events of %s not written to Redis (%d dropped): %s",
                        self.response_id,
                        len(batch),
                        exc,
                    )
            if self._closed:
                return

    async def _write(self, batch: list[Entry]) -> None:
        pipe = self.log.redis.pipeline(transaction=False)
        for entry in batch:
            pipe.xadd(self.key, _fields(entry), id=_entry_id(entry.seq))
            size = _stored_size(entry)
            self._kept.append((entry.seq, size))
            self._kept_bytes += size
        trim = None
        while self._kept_bytes > self.log.max_bytes and len(self._kept) > 1:
            self._kept_bytes -= self._kept.popleft()[1]
            trim = self._kept[0][0]
        if trim is not None:
            pipe.xtrim(self.key, minid=_entry_id(trim), approximate=False)
        pipe.pexpire(self.key, self.log.ttl_ms)
        await pipe.execute()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Write what is pending and stop (at most ``timeout_s``: a hung Redis must not hold a
        turn's end, or the shutdown)."""
        self._closed = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            log.warning(
                "background events of %s: Redis writes still pending after %g s, dropped", self.response_id, timeout_s
            )
            self._task.cancel()
