"""Usage records and the queue that takes them off the turn's critical path.

The pipeline hands a record to ``UsageQueue.submit`` (never blocks, never awaits I/O); a worker task
writes it to the sink while the client is already sending its next turn. Shutdown drains the queue.
A full queue spills to an in-process overflow list rather than dropping: a usage record is money.
The durable sinks (Redis Streams ledger, crash-safe journal) arrive with the billing issue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UsageRecord:
    response_id: str
    model: str
    tenant: str | None
    status: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    transport: str
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class UsageSink(Protocol):
    async def write(self, record: UsageRecord) -> None: ...


class MemorySink:
    """Keeps records in memory, idempotent by response id (the default when no ledger is set)."""

    def __init__(self) -> None:
        self.records: dict[str, UsageRecord] = {}

    async def write(self, record: UsageRecord) -> None:
        self.records[record.response_id] = record


class UsageQueue:
    """Bounded queue + one writer task. ``submit`` never blocks; overflow waits in a side list."""

    def __init__(self, sink: UsageSink, maxsize: int = 10_000) -> None:
        self.sink = sink
        self._queue: asyncio.Queue[UsageRecord] = asyncio.Queue(maxsize=maxsize)
        self._overflow: deque[UsageRecord] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._inflight = 0
        self.written = 0

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="usage-queue")

    def submit(self, record: UsageRecord) -> None:
        if self._overflow:
            self._overflow.append(record)  # keep submission order behind earlier overflow
            return
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._overflow.append(record)

    @property
    def pending(self) -> int:
        return self._queue.qsize() + len(self._overflow) + self._inflight

    def _refill(self) -> None:
        while self._overflow and not self._queue.full():
            self._queue.put_nowait(self._overflow.popleft())

    async def _run(self) -> None:
        while True:
            record = await self._queue.get()
            self._inflight = 1
            try:
                await self._write(record)
            finally:
                self._inflight = 0
                self._refill()

    async def _write(self, record: UsageRecord) -> None:
        delay = 0.05
        while True:  # a failing sink must not lose the record nor kill the worker
            try:
                await self.sink.write(record)
                self.written += 1
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("usage sink failed; retrying record %s", record.response_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def drain(self, timeout: float = 30.0) -> None:
        """Write everything submitted, then stop the worker (called at shutdown)."""
        if self._worker is None:
            self.start()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.pending and asyncio.get_running_loop().time() < deadline:
            self._refill()
            await asyncio.sleep(0.01)
        if self.pending:
            log.error("shutdown with %d usage records not yet written", self.pending)
        assert self._worker is not None
        self._worker.cancel()
        try:
            await self._worker
        except asyncio.CancelledError:
            pass
        self._worker = None
