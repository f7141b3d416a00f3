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
    def __init__(self, sink: UsageSink, maxsize: int = 10_000) -> None:
        self.sink = sink
        self._queue: asyncio.Queue[UsageRecord] = asyncio.Queue(maxsize=maxsize)
        self._overflow: list[UsageRecord] = []
        self._worker: asyncio.Task[None] | None = None
        self.written = 0

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="usage-queue")

    def submit(self, record: UsageRecord) -> None:
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._overflow.append(record)

    async def _run(self) -> None:
        while True:
            record = await self._queue.get()
            await self._write(record)
            self._queue.task_done()
            while self._overflow and not self._queue.full():
                self._queue.put_nowait(self._overflow.pop(0))

    async def _write(self, record: UsageRecord) -> None:
        try:
            await self.sink.write(record)
            self.written += 1
        except Exception:  # a failing sink must not kill the worker; keep the record for retry
            log.exception("usage sink failed; record kept for retry")
            self._overflow.append(record)
            await asyncio.sleep(0.5)

    async def drain(self) -> None:
        """Write everything queued, then stop the worker (called at shutdown)."""
        while self._overflow:
            self.submit(self._overflow.pop(0))
        if self._worker is not None:
            await self._queue.join()
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        else:
            while not self._queue.empty():
                await self._write(self._queue.get_nowait())
