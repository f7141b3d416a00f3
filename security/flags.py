"""Flag reporting: flagged (and blocked) items go to a review stream, off the turn's critical path.

A turn that is flagged goes on; a record per new verdict is handed to ``FlagReporter.report``,
which only appends to an in-process buffer (no await, no I/O). A worker task writes batches to a
Redis Stream (``respgate:flags`` by default, ``XADD`` with an approximate ``MAXLEN``) or, without
Redis, to a bounded in-memory sink that tests and single-host setups can read.

What a record holds is the minimum a reviewer needs to find and judge the conversation: response
id and previous_response_id, tenant, model, transport, item index/id/type, action, category,
score, rule, the classifier that decided, a redacted hint and whether the conversation was already
flagged before this turn. Never the matched value and never the item's full text (injection hints
are short excerpts with secrets masked). Verdicts of earlier turns are not re-reported: each item
is classified once per conversation, so each flag is reported once.

Redis outages must not break turns: failed writes are retried with backoff while the buffer holds
them. Flags are not money (usage records are, and they have a journal): when the buffer is full
the oldest records are dropped, counted in ``dropped`` and logged, rather than growing without
bound or slowing turns down. Shutdown drains the buffer with a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from security.classifiers import Verdict

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FlagRecord:
    action: str
    category: str
    score: float
    source: str
    response_id: str | None  # None for a blocked request (no response was created)
    previous_response_id: str | None
    tenant: str | None
    model: str | None
    transport: str | None
    item_index: int | None
    item_id: str | None
    item_type: str | None
    rule: str | None
    hint: str | None
    #: the conversation already carried a flag before this turn (inherited verdicts)
    conversation_flagged_before: bool = False
    ts: float = field(default_factory=time.time)

    @classmethod
    def of(
        cls,
        v: Verdict,
        *,
        item_type: str | None,
        response_id: str | None,
        previous_response_id: str | None,
        tenant: str | None,
        model: str | None,
        transport: str | None,
        flagged_before: bool,
    ) -> FlagRecord:
        return cls(
            v.action,
            v.category or "",
            round(v.score, 3),
            v.source,
            response_id,
            previous_response_id,
            tenant,
            model,
            transport,
            v.index,
            v.item_id,
            item_type,
            v.rule,
            v.hint,
            flagged_before,
        )

    def fields(self) -> dict[FieldT, EncodableT]:
        """Flat string fields for ``XADD`` (absent values are left out)."""
        out: dict[FieldT, EncodableT] = {}
        for k, v in asdict(self).items():
            if v is None:
                continue
            out[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out


class FlagSink(Protocol):
    async def write(self, records: Sequence[FlagRecord]) -> None: ...

    async def close(self) -> None: ...


class MemoryFlagSink:
    """Without Redis: the newest ``maxlen`` records, in memory."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.records: deque[FlagRecord] = deque(maxlen=maxlen)

    async def write(self, records: Sequence[FlagRecord]) -> None:
        self.records.extend(records)

    async def close(self) -> None:
        return None


class RedisFlagSink:
    """``XADD <stream> MAXLEN ~ <maxlen> * field value ...`` per record, one pipeline per batch."""

    def __init__(self, url: str, stream: str = "respgate:flags", maxlen: int = 1_000_000) -> None:
        from cache.redis_client import connect

        self.redis = connect(url, socket_timeout=5.0, socket_connect_timeout=2.0)
        self.stream = stream
        self.maxlen = maxlen

    async def write(self, records: Sequence[FlagRecord]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for r in records:
            pipe.xadd(self.stream, r.fields(), maxlen=self.maxlen, approximate=True)
        await pipe.execute()

    async def close(self) -> None:
        await self.redis.aclose()


class FlagReporter:
    """Bounded buffer + one writer task. ``report`` never blocks and never raises."""

    BATCH = 128

    def __init__(
        self,
        sink: FlagSink | None = None,
        *,
        buffer: int = 10_000,
        retry_max_s: float = 5.0,
        drain_timeout_s: float = 5.0,
    ) -> None:
        self.sink: FlagSink = sink if sink is not None else MemoryFlagSink()
        self.drain_timeout_s = drain_timeout_s
        self.buffer = buffer
        self.retry_max_s = retry_max_s
        self._pending: deque[FlagRecord] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.reported = 0
        self.written = 0
        self.dropped = 0
        self.write_failures = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="flag-reporter")

    def report(self, records: Sequence[FlagRecord]) -> None:
        for r in records:
            if len(self._pending) >= self.buffer:
                self._pending.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("flag buffer full: %d flag records dropped so far (sink unreachable?)", self.dropped)
            self._pending.append(r)
            self.reported += 1
        if records:
            self._wake.set()

    async def _run(self) -> None:
        delay = 0.05
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [self._pending[i] for i in range(min(self.BATCH, len(self._pending)))]
            try:
                await self.sink.write(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down, timeouts...: keep the records, retry with backoff
                self.write_failures += 1
                if self.write_failures == 1 or self.write_failures % 100 == 0:
                    log.warning(
                        "flag sink write failed (%s: %s); %d records buffered",
                        type(exc).__name__,
                        exc,
                        len(self._pending),
                    )
                await asyncio.sleep(delay)
                delay = min(self.retry_max_s, delay * 2)
                continue
            delay = 0.05
            # the buffer may have dropped its oldest records meanwhile: remove what was written
            for r in batch:
                if self._pending and self._pending[0] is r:
                    self._pending.popleft()
            self.written += len(batch)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Shutdown: write what is buffered (up to ``timeout_s``), then close the sink."""
        timeout_s = self.drain_timeout_s if timeout_s is None else timeout_s
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            except TimeoutError:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._pending:
            self.dropped += len(self._pending)
            log.warning("shutdown: %d flag records could not be written and are dropped", len(self._pending))
            self._pending.clear()
        try:
            await self.sink.close()
        except Exception:  # closing a broken connection must not fail shutdown
            log.debug("flag sink close failed", exc_info=True)

    def stats(self) -> dict[str, Any]:
        return {
            "reported": self.reported,
            "written": self.written,
            "dropped": self.dropped,
            "pending": self.pending,
            "write_failures": self.write_failures,
        }
