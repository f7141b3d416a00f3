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

Workers are few (``file_ingest_workers``): embedding is CPU work, and a queue of 100k tiny files
must not starve the turns served beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
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
    ) -> None:
        self.files = files
        self._catalog = catalog
        self._index = index
        self.prepare = prepare
        self.embed = embed
        self.workers = workers
        self.max_chunks = max_chunks_per_tenant
        self.metrics = metrics
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        #: jobs finished (any outcome), for tests and metrics
        self.done = 0

    def submit(self, tenant: str, store_id: str, file_id: str) -> None:
        self.queue.put_nowait(Job(tenant, store_id, file_id))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work(), name=f"respgate-ingest-{i}") for i in range(self.workers)]

    async def resume(self, limit: int = 100_000) -> int:
        """Queue the files a previous run left ``in_progress``; how many."""
        pending = await self._catalog().in_progress(limit)
        for record in pending:
            self.submit(record.tenant, record.store_id, record.file_id)
        return len(pending)

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
            t0 = time.perf_counter()
            outcome = "server_error"
            try:
                outcome = await self.ingest(job)
            except Exception:
                log.exception("ingesting a file failed")
                with contextlib.suppress(Exception):
                    await self._catalog().finish_file(
                        job.tenant, job.store_id, job.file_id, "failed", error=("server_error", "Ingestion failed.")
                    )
            finally:
                if outcome != "skipped":
                    self.metrics.file_ingestions.labels(outcome).inc()
                    self.metrics.file_ingestion_seconds.observe(time.perf_counter() - t0)
                self.done += 1
                self.queue.task_done()

    async def ingest(self, job: Job) -> str:
        """Ingest one file; its outcome: ``completed``, ``cancelled``, the failure's code, or
        ``skipped`` (no longer ``in_progress`` when its turn came)."""
        catalog, index = self._catalog(), self._index()
        record = await catalog.get_file(job.tenant, job.store_id, job.file_id)
        if record is None or record.status != "in_progress":
            return "skipped"  # detached or cancelled while queued
        file = await self.files.catalog.get(job.tenant, job.file_id)
        if file is None:  # the file was deleted while queued
            await catalog.finish_file(job.tenant, job.store_id, job.file_id, "failed", error=_gone())
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
            await catalog.finish_file(job.tenant, job.store_id, job.file_id, "failed", error=_gone())
            return "invalid_file"
        except PrepareFailed as exc:
            await catalog.finish_file(job.tenant, job.store_id, job.file_id, "failed", error=(exc.code, exc.message))
            return exc.code
        held = await index.count(job.tenant)
        if held + len(prepared) > self.max_chunks:
            message = (
                f"The file's {len(prepared)} chunks would take this tenant past its {self.max_chunks} "
                "(setting file_search_chunks_per_tenant)."
            )
            await catalog.finish_file(job.tenant, job.store_id, job.file_id, "failed", error=("invalid_file", message))
            return "invalid_file"
        chunks = await self._embedded(prepared)
        await index.add(job.tenant, job.store_id, job.file_id, chunks, record.attributes)
        usage = sum(len(c.text.encode()) for c in prepared)
        if not await catalog.finish_file(job.tenant, job.store_id, job.file_id, "completed", usage_bytes=usage):
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
