"""Ingestion: a file attached to a vector store becomes chunks with vectors in the index, in the
background, while the client polls the file's status (``in_progress`` → ``completed`` / ``failed``
with ``last_error``, or ``cancelled``).

The durable record of the work is the catalog: a file is ``in_progress`` until a worker finishes
it, so a restart takes up what was left (``resume``) and the queue in memory holds only ids. Each
file goes through four bounded steps — its text and chunks (``Prepare``: extraction in a worker
with a deadline, ``gateway.tools.documents``), the chunk quota, the vectors (``Embedder``, in
batches, off the event loop), the index — and only then is it marked ``completed``; a file
cancelled, detached or re-attached meanwhile keeps no chunks of this run (``finish_file`` says
it is no longer ``in_progress``, and what was added is removed).

Several replicas on one database (``file_store=postgres``) share the work: a worker first *claims*
the file (``StoreCatalog.claim``: a lease with an owner token and an expiry, taken in one
statement), renews the lease while it works, and finishes the file only while the lease is its
own; a file another replica holds is skipped. A replica that dies mid-ingestion leaves a lease
that lapses after :attr:`Ingestion.lease_s`; every replica that has opened the stores looks for
such files (and for files attached through a replica that died before claiming them) every
``lease_s`` (``rescan_loop``) and takes them over. On SQLite the same code runs in one process.

Workers are few (``file_ingest_workers``): embedding is CPU work, and a queue of 100k tiny files
must not starve the turns served beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

import numpy as np

from cache.files.index import ChunkIndex, NewChunk
from cache.files.store_catalog import StoreCatalog, StoreFileRecord
from gateway.base.metrics import Metrics
from gateway.files.files import Files

__all__ = ["Embed", "Ingestion", "Prepare", "PrepareFailed", "Prepared"]

log = logging.getLogger(__name__)

#: chunks embedded per call
EMBED_BATCH = 32
#: seconds a claim on a file holds (renewed every third of it while the file is worked on)
LEASE_S = 60.0


class Prepared(NamedTuple):
    """One chunk of a file's text: the text, its character span in the extracted text, its tokens."""

    text: str
    start: int
    end: int
    tokens: int


class PrepareFailed(Exception):
    """A file that cannot be ingested: ``unsupported_file`` (a type the extractor does not read) or
    ``invalid_file`` (malformed, too big, too slow): the file's ``last_error``."""

    def __init__(self, code: Literal["unsupported_file", "invalid_file"], message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Prepare(Protocol):
    async def __call__(self, path: Path, filename: str, max_tokens: int, overlap_tokens: int) -> list[Prepared]:
        """The file's chunks (:class:`PrepareFailed` when it cannot be read)."""
        ...


#: texts -> their vectors (n, dims), L2-normalised
Embed = Callable[[Sequence[str]], Awaitable[np.ndarray]]


@dataclass
class Job:
    tenant: str
    store_id: str
    file_id: str
    #: the lease's owner token, once claimed
    owner: str | None = None


class Ingestion:
    def __init__(
        self,
        files: Files,
        catalog: Callable[[], StoreCatalog],
        index: Callable[[], ChunkIndex],
        prepare: Prepare,
        embed: Embed,
        *,
        workers: int,
        max_chunks_per_tenant: int,
        metrics: Metrics,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.time,
        opened: Callable[[], bool] = lambda: True,
    ) -> None:
        """``opened``: whether the store catalog is open here (the rescan never opens it)."""
        self.files = files
        self._catalog = catalog
        self._index = index
        self.prepare = prepare
        self.embed = embed
        self.workers = workers
        self.max_chunks = max_chunks_per_tenant
        self.metrics = metrics
        self.lease_s = lease_s
        self.clock = clock
        self._opened = opened
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        #: files queued and not yet taken by a worker (a rescan does not queue them twice)
        self._queued: set[tuple[str, str, str]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        #: jobs finished (any outcome), for tests and metrics
        self.done = 0

    def submit(self, tenant: str, store_id: str, file_id: str) -> None:
        key = (tenant, store_id, file_id)
        if key in self._queued:
            return
        self._queued.add(key)
        self.queue.put_nowait(Job(tenant, store_id, file_id))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work(), name=f"respgate-ingest-{i}") for i in range(self.workers)]
        self._tasks.append(loop.create_task(self.rescan_loop(), name="respgate-ingest-rescan"))

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def resume(self, limit: int = 100_000) -> int:
        """Queue the ``in_progress`` files nobody holds a lease on (a previous run left them, a
        replica died working on them or before claiming them); how many."""
        pending = await self._catalog().in_progress(limit, now_ms=self._now_ms())
        for record in pending:
            self.submit(record.tenant, record.store_id, record.file_id)
        return len(pending)

    async def rescan_loop(self) -> None:
        """``resume`` every ``lease_s`` once the stores are open here (a failure is logged)."""
        while True:
            await asyncio.sleep(self.lease_s)
            if not self._opened():
                continue
            try:
                await self.resume()
            except Exception:
                log.exception("looking for files to ingest failed; trying again in %g s", self.lease_s)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def idle(self) -> None:
        """Until every queued file is finished (tests, and a drain)."""
        await self.queue.join()

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            self._queued.discard((job.tenant, job.store_id, job.file_id))  # attached again now: queued again
            t0 = time.perf_counter()
            outcome = "server_error"
            try:
                outcome = await self.ingest(job)
            except Exception:
                log.exception("ingesting a file failed")
                with contextlib.suppress(Exception):
                    await self._catalog().finish_file(
                        job.tenant,
                        job.store_id,
                        job.file_id,
                        "failed",
                        error=("server_error", "Ingestion failed."),
                        owner=job.owner,
                    )
            finally:
                if outcome != "skipped":
                    self.metrics.file_ingestions.labels(outcome).inc()
                    self.metrics.file_ingestion_seconds.observe(time.perf_counter() - t0)
                self.done += 1
                self.queue.task_done()

    async def ingest(self, job: Job) -> str:
        """Ingest one file under a lease on it; its outcome: ``completed``, ``cancelled``, the
        failure's code, or ``skipped`` (no longer ``in_progress`` when its turn came, or another
        replica's lease holds it)."""
        catalog = self._catalog()
        owner = uuid.uuid4().hex
        now = self._now_ms()
        record = await catalog.claim(job.tenant, job.store_id, job.file_id, owner, now, now + int(self.lease_s * 1000))
        if record is None:
            return "skipped"  # detached or cancelled while queued, or another replica's
        job.owner = owner
        renewing = asyncio.create_task(self._renew(job, owner), name="respgate-ingest-lease")
        try:
            return await self._ingest(job, record, owner)
        finally:
            renewing.cancel()

    async def _renew(self, job: Job, owner: str) -> None:
        catalog = self._catalog()
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                until = self._now_ms() + int(self.lease_s * 1000)
                if not await catalog.renew(job.tenant, job.store_id, job.file_id, owner, until):
                    return  # finished, cancelled or taken over: finish_file will say so
            except Exception:
                log.warning("renewing an ingestion lease failed; trying again", exc_info=True)

    async def _ingest(self, job: Job, record: StoreFileRecord, owner: str) -> str:
        catalog, index = self._catalog(), self._index()
        file = await self.files.catalog.get(job.tenant, job.file_id)
        if file is None:  # the file was deleted while queued
            await catalog.finish_file(job.tenant, job.store_id, job.file_id, "failed", error=_gone(), owner=owner)
            return "invalid_file"
        static = record.chunking.get("static") or {}
        try:
            async with self.files.blobs.local_path(job.tenant, job.file_id) as path:
                prepared = await self.prepare(
                    path,
                    file.filename,
                    int(static.get("max_chunk_size_tokens", 800)),
                    int(static.get("chunk_overlap_tokens", 400)),
                )
        except FileNotFoundError:
            await catalog.finish_file(job.tenant, job.store_id, job.file_id, "failed", error=_gone(), owner=owner)
            return "invalid_file"
        except PrepareFailed as exc:
            await catalog.finish_file(
                job.tenant, job.store_id, job.file_id, "failed", error=(exc.code, exc.message), owner=owner
            )
            return exc.code
        held = await index.count(job.tenant)
        if held + len(prepared) > self.max_chunks:
            message = (
                f"The file's {len(prepared)} chunks would take this tenant past its {self.max_chunks} "
                "(setting file_search_chunks_per_tenant)."
            )
            await catalog.finish_file(
                job.tenant, job.store_id, job.file_id, "failed", error=("invalid_file", message), owner=owner
            )
            return "invalid_file"
        chunks = await self._embedded(prepared)
        await index.add(job.tenant, job.store_id, job.file_id, chunks, record.attributes)
        usage = sum(len(c.text.encode()) for c in prepared)
        if not await catalog.finish_file(
            job.tenant, job.store_id, job.file_id, "completed", usage_bytes=usage, owner=owner
        ):
            await self._dropped(index, catalog, record)
            return "cancelled"
        self.metrics.file_ingestion_chunks.inc(len(chunks))
        return "completed"

    async def _embedded(self, prepared: list[Prepared]) -> list[NewChunk]:
        chunks: list[NewChunk] = []
        for at in range(0, len(prepared), EMBED_BATCH):
            part = prepared[at : at + EMBED_BATCH]
            vectors = await self.embed([p.text for p in part])
            chunks.extend(NewChunk(at + i, p.text, p.start, p.end, p.tokens, vectors[i]) for i, p in enumerate(part))
        return chunks

    async def _dropped(self, index: ChunkIndex, catalog: StoreCatalog, record: StoreFileRecord) -> None:
        """The file left ``in_progress`` while it was ingested (cancelled, detached): unless it was
        attached again meanwhile (then that run's chunks are the ones to keep), drop these."""
        now = await catalog.get_file(record.tenant, record.store_id, record.file_id)
        if now is None or now.status == "cancelled":
            await index.remove_file(record.tenant, record.store_id, record.file_id)


def _gone() -> tuple[str, str]:
    return ("invalid_file", "The file was deleted before it was ingested.")
