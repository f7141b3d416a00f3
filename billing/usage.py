"""Usage records and the queue that takes them off the turn's critical path.

The pipeline hands a record to ``UsageQueue.submit``: a deque append, never a wait. One worker
task takes records in batches and writes them to the sink (the Redis Stream ledger, or memory on a
single host) while the client is already sending its next turn.

A usage record is money, so no path drops one:

* the sink fails or is slow (``write_timeout_s``): the batch is appended to the journal (fsync'd)
  and the queue marks the sink *down*; later batches go straight to the journal, so an outage
  costs one timeout, not one per batch. A replay loop re-sends the journal and marks the sink up
  again once a replay succeeds. Replays are safe because the ledger is idempotent by response id.
* the queue is full: records go to a bounded *overflow* that the worker spills to the journal in
  one fsync'd batch (a full queue means the sink is behind; disk is the fastest place to make them
  durable). Only when the overflow is full too does ``submit`` append to the journal itself,
  synchronously — a last resort that costs the turn one fsync instead of losing the record.
  Without a journal the overflow is unbounded: memory is then the only place a record can live.
* shutdown (``drain``): the worker empties the queue into the sink or the journal; whatever is
  still in memory at the deadline is appended to the journal synchronously.
* a kill: ``submit`` first appends the record to the write-ahead log (``billing.wal``: one
  unsynced ``write`` to the page cache, before the pipeline sends the terminal event), so a
  SIGKILL loses nothing the client saw finish; start-up moves what a killed process left in its
  WAL into the journal, then replays the journal (the replay loop's first pass). Power loss is
  covered as before the WAL: a record is on disk once its batch is acknowledged by the sink or
  fsync'd to the journal (one batch round trip, milliseconds); see ``billing.wal``.

The WAL is on when there is a journal and the sink is durable (the Redis ledger): records kept by
a memory sink die with the process anyway. A durable sink without a journal has no crash safety
at all (logged at start).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import msgspec

from billing.journal import Journal
from billing.wal import WriteAheadLog, record_line

log = logging.getLogger(__name__)


class UsageRecord(msgspec.Struct, frozen=True):
    """One finished response (completed, incomplete, failed or cancelled), as billed."""

    response_id: str
    model: str
    #: the tenant / API key id (``None`` when the gateway runs without keys)
    tenant: str | None
    status: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    transport: str
    #: wall-clock seconds (epoch) when the request arrived and when the response finished
    created_at: float = msgspec.field(default_factory=time.time)
    finished_at: float = msgspec.field(default_factory=time.time)
    #: seconds from arrival to the first output token (``None``: no token was produced)
    ttft_s: float | None = None
    duration_s: float = 0.0
    #: calls the gateway ran for the model in this response (MCP; ``gateway.tools``), and their
    #: wall-clock seconds summed (calls that ran at once each count their own)
    tool_calls: int = 0
    tool_s: float = 0.0

    FIELDS: ClassVar[tuple[str, ...]]

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageRecord:
        """Inverse of ``to_dict``; unknown keys (a newer writer's) are ignored."""
        return cls(**{k: data[k] for k in cls.FIELDS if k in data})

    def to_fields(self) -> dict[str, str]:
        """Flat string fields for a Redis Stream entry (``None`` becomes ``""``)."""
        return {k: "" if v is None else str(v) for k, v in self.to_dict().items()}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> UsageRecord:
        data: dict[str, Any] = {}
        for name in cls.FIELDS:
            raw = fields.get(name)
            if raw is None:
                continue
            if name.endswith("_tokens") or name == "tool_calls":
                data[name] = int(raw)
            elif name in ("created_at", "finished_at", "duration_s", "tool_s"):
                data[name] = float(raw)
            elif name == "ttft_s":
                data[name] = float(raw) if raw else None
            elif name == "tenant":
                data[name] = raw or None
            else:
                data[name] = raw
        return cls(**data)


UsageRecord.FIELDS = UsageRecord.__struct_fields__


class UsageSink(Protocol):
    #: whether a written record survives this process (journal replay targets durable sinks only:
    #: replaying into memory would take records off the disk and lose them at exit)
    durable: bool

    async def write_batch(self, records: Sequence[UsageRecord]) -> None:
        """Write every record or raise; writing a record twice must count it once."""
        ...


class MemorySink:
    """Keeps records in memory, idempotent by response id (the default when no ledger is set)."""

    durable = False

    def __init__(self) -> None:
        self.records: dict[str, UsageRecord] = {}

    async def write_batch(self, records: Sequence[UsageRecord]) -> None:
        for record in records:
            self.records[record.response_id] = record


class UsageQueue:
    """Never-blocking submit, one batching writer, journal fallback and replay (see module doc)."""

    def __init__(
        self,
        sink: UsageSink,
        journal: Journal | None = None,
        *,
        maxsize: int = 10_000,
        overflow_max: int = 10_000,
        batch_max: int = 256,
        write_timeout_s: float = 5.0,
        retry_s: float = 0.25,
        retry_max_s: float = 5.0,
        wal: WriteAheadLog | bool | None = None,
    ) -> None:
        self.sink = sink
        self.journal = journal
        if wal is None:  # default: on exactly where it adds safety (see the module docstring)
            wal = journal is not None and sink.durable
        if wal is True:
            if journal is None:
                raise ValueError("the usage WAL needs a journal to recover into")
            wal = WriteAheadLog(journal.path)
        #: the write-ahead log ``submit`` appends to (None: off)
        self.wal: WriteAheadLog | None = wal or None
        if journal is None and sink.durable:
            log.warning(
                "usage ledger without a journal: records in flight are lost if the process dies "
                "or the ledger is unreachable (set RESPGATE_USAGE_JOURNAL)"
            )
        self.maxsize = maxsize
        self.overflow_max = overflow_max
        self.batch_max = batch_max
        self.write_timeout_s = write_timeout_s
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self._queue: deque[UsageRecord] = deque()
        self._overflow: deque[UsageRecord] = deque()
        self._batch: list[UsageRecord] = []  # being written right now
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._replayer: asyncio.Task[None] | None = None
        #: the sink failed; batches go straight to the journal until a replay succeeds
        self.sink_down = False
        # counters (records): acknowledged by the sink, spilled to the journal (by the worker, and
        # synchronously by submit), and re-sent from the journal by replays
        self.written = 0
        self.journaled = 0
        self.journaled_sync = 0
        self.replayed = 0

    # -- the turn's side --------------------------------------------------------------------------

    def submit(self, record: UsageRecord) -> None:
        """Hand over a record. Never awaits; one unsynced WAL ``write``, and one fsync only when
        queue and overflow are full. Call it before the client sees the response end."""
        if self.wal is not None:
            self.wal.append(record.response_id, record_line(record))
        if len(self._queue) < self.maxsize:  # order does not matter: records carry their own times
            self._queue.append(record)
        elif self.journal is None or len(self._overflow) < self.overflow_max:
            self._overflow.append(record)
        else:
            try:
                self.journal.append([record.to_dict()])
                self.journaled_sync += 1
                self.journaled += 1
                self._ack([record])
            except OSError:
                log.exception("usage journal append failed; keeping record %s in memory", record.response_id)
                self._overflow.append(record)
        self._wake.set()

    @property
    def pending(self) -> int:
        """Records in memory, not yet acknowledged by the sink or the journal."""
        return len(self._queue) + len(self._overflow) + len(self._batch)

    @property
    def oldest_pending_at(self) -> float | None:
        """Finish time (epoch) of the oldest record in memory, for the billing-lag gauge; ``None`` when
        nothing is pending. Each deque is in submit order, so only the heads are looked at."""
        heads = [q[0].finished_at for q in (self._batch, self._queue, self._overflow) if q]
        return min(heads) if heads else None

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer and, for a durable sink with a journal, the replay loop (which first
        replays whatever an earlier process left: the start-up replay). Before either, WAL
        generations left by a killed process are moved into the journal."""
        loop = asyncio.get_running_loop()
        if self._worker is None and self._replayer is None and self.journal is not None:
            (self.wal or WriteAheadLog(self.journal.path)).recover(self.journal)
        if self._worker is None:
            self._worker = loop.create_task(self._run(), name="usage-writer")
        if self._replayer is None and self.journal is not None and self.sink.durable:
            self._replayer = loop.create_task(self._replay_loop(), name="usage-replay")

    async def drain(self, timeout: float = 30.0) -> None:
        """Shutdown: write everything submitted to the sink or the journal, then stop."""
        if self._worker is None:
            self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pending and loop.time() < deadline:
            self._wake.set()
            await asyncio.sleep(0.01)
        inflight = list(self._batch)  # the worker clears its batch when cancelled: keep it here
        for task in (self._replayer, self._worker):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._worker = self._replayer = None
        # A write cut off above may have reached the sink; journaling it again is harmless (idempotent).
        left = [*inflight, *self._queue, *self._overflow]
        self._batch, self._queue, self._overflow = [], deque(), deque()
        if left and self.journal is not None:
            try:
                self.journal.append(r.to_dict() for r in left)
                self.journaled += len(left)
                self._ack(left)
                log.warning("shutdown: %d usage records journaled for replay at next start", len(left))
            except OSError:  # the WAL still holds them (if on): the next start recovers them
                log.exception("shutdown: journaling %d usage records failed", len(left))
        elif left:
            log.error("shutdown with %d usage records not written (no journal configured)", len(left))
        if self.wal is not None:
            self.wal.close()
        close = getattr(self.sink, "close", None)
        if close is not None:
            await close()

    # -- the writer -------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self._queue and not self._overflow:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._overflow and self.journal is not None:
                batch = list(self._overflow)
                self._overflow.clear()
                await self._spill(batch)
                continue
            source = self._queue if self._queue else self._overflow
            batch = [source.popleft() for _ in range(min(self.batch_max, len(source)))]
            while self._overflow and len(self._queue) < self.maxsize:  # no journal: overflow refills the queue
                self._queue.append(self._overflow.popleft())
            await self._deliver(batch)

    async def _deliver(self, batch: list[UsageRecord]) -> None:
        self._batch = batch
        delay = self.retry_s
        try:
            while True:
                if not self.sink_down or self.journal is None:
                    try:
                        await self._write(batch)
                        self.written += len(batch)
                        self._ack(batch)
                        return
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # timeouts included: a slow ledger is a down ledger
                        if self.journal is None:
                            log.warning("usage sink failed (%r); retrying %d records", exc, len(batch))
                            await asyncio.sleep(delay)
                            delay = min(delay * 2, self.retry_max_s)
                            continue
                        log.warning("usage sink failed (%r); journaling until it is back", exc)
                        # only a replay loop can clear it again (a non-durable sink has none)
                        self.sink_down = self._replayer is not None
                if await self._journal(batch):
                    return
                self.sink_down = False  # the disk failed too: try the sink again after a pause
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)
        finally:
            self._batch = []

    async def _write(self, batch: list[UsageRecord]) -> None:
        """One batch to the sink within ``write_timeout_s`` (a slow ledger is a down ledger).
        ``asyncio.timeout`` rather than ``wait_for``: the write runs in the worker's own task instead of
        a new task per batch (and one more loop iteration) — the writer delivers a batch per turn when
        turns come one at a time."""
        async with asyncio.timeout(self.write_timeout_s):
            await self.sink.write_batch(batch)

    async def _spill(self, batch: list[UsageRecord]) -> None:
        """Overflow goes to the journal; if the disk fails, back to the sink path."""
        self._batch = batch
        try:
            if await self._journal(batch):
                return
        finally:
            self._batch = []
        await self._deliver(batch)

    async def _journal(self, batch: list[UsageRecord]) -> bool:
        assert self.journal is not None
        try:
            await asyncio.to_thread(self.journal.append, [r.to_dict() for r in batch])
        except OSError:
            log.exception("usage journal append failed for %d records", len(batch))
            return False
        self.journaled += len(batch)
        self._ack(batch)
        return True

    def _ack(self, records: Sequence[UsageRecord]) -> None:
        """These records are durable (sink or fsync'd journal): the WAL may forget them."""
        if self.wal is not None:
            self.wal.ack(r.response_id for r in records)

    # -- replay -----------------------------------------------------------------------------------

    async def _replay_loop(self) -> None:
        # ``sink_down`` is cleared only here, by a replay that succeeded: while it is set the
        # journal holds (or is being given) the batch that failed, so a replay is the probe.
        delay = self.retry_s
        while True:
            if self.journal is not None and await asyncio.to_thread(self.journal.pending):
                if await self.replay():
                    self.sink_down, delay = False, self.retry_s
                else:
                    delay = min(delay * 2, self.retry_max_s)
            await asyncio.sleep(delay)

    async def replay(self) -> bool:
        """Send the journal to the sink, segment by segment; True when nothing is left."""
        journal = self.journal
        assert journal is not None
        try:
            for segment in await asyncio.to_thread(journal.rotate):
                records = journal.read(segment)
                try:
                    # the islice is lazy: the journal is read in the worker thread, by list()
                    while chunk := await asyncio.to_thread(list, itertools.islice(records, self.batch_max)):
                        batch = _parse(chunk, segment)
                        await self._write(batch)
                        self.replayed += len(batch)
                finally:
                    records.close()
                await asyncio.to_thread(journal.discard, segment)
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("usage journal replay failed (%r); retrying later", exc)
            return False


def _parse(rows: list[dict[str, Any]], where: object) -> list[UsageRecord]:
    """Journal rows to records; a row that is not a record (hand-edited, foreign) is logged, skipped."""
    out = []
    for row in rows:
        try:
            out.append(UsageRecord.from_dict(row))
        except (TypeError, ValueError):
            log.error("usage journal %s: skipping malformed record %r", where, row)
    return out
