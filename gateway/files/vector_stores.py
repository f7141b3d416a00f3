"""The Vector Stores API's service: a tenant's stores, the files attached to them (ingested in the
background, ``gateway.files.ingestion``), their batches, and search — the one ``file_search`` runs.

Everything a store holds is its tenant's: every call names the tenant, and the catalog and the
index never answer across tenants. Deleting a file (``/v1/files``) detaches it from every store and
drops its chunks (:meth:`VectorStores.file_deleted`, hooked on ``Files.on_delete``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from cache.files.index import ChunkIndex, Filter, Hit, SearchMode, SearchQuery, search
from cache.files.store_catalog import (
    BatchRecord,
    FileCounts,
    Order,
    Page,
    StoreCatalog,
    StoreFileRecord,
    StoreRecord,
    StoresQuotaExceeded,
)
from gateway.base.metrics import Metrics
from gateway.files.files import Files, tenant_key
from gateway.files.ingestion import Embed, Ingestion
from gateway.wire.errors import ApiError
from gateway.wire.files import file_not_found
from gateway.wire.items import new_id
from gateway.wire.vector_stores import AUTO, ChunkingStrategy, ExpiresAfter

__all__ = ["SearchHit", "VectorStores"]


class Closable(Protocol):
    async def aclose(self) -> None: ...


DAY_S = 86_400


class SearchHit:
    """A hit with its file's name (``filename`` of the file, or ``""`` once the file is gone)."""

    __slots__ = ("filename", "hit")

    def __init__(self, hit: Hit, filename: str) -> None:
        self.hit = hit
        self.filename = filename


class VectorStores:
    def __init__(
        self,
        files: Files,
        catalog: Callable[[], StoreCatalog],
        index: Callable[[], ChunkIndex],
        ingestion: Ingestion,
        embed_query: Embed,
        *,
        max_stores: int,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        opened: Callable[[], Sequence[Closable]] = lambda: (),
        on_disk: Callable[[], bool] = lambda: False,
    ) -> None:
        """``opened``: the stores opened so far (closed at shutdown); ``on_disk``: whether an earlier
        run left stores to take ingestion up from."""
        self.files = files
        self.metrics = metrics
        self._catalog = catalog
        self._index = index
        self.ingestion = ingestion
        self.embed_query = embed_query
        self.max_stores = max_stores
        self.clock = clock
        self._opened = opened
        self._on_disk = on_disk
        files.on_delete.append(self.file_deleted)

    async def start(self) -> None:
        """Ingestion's workers; files an earlier run left ``in_progress`` are queued again."""
        self.ingestion.start()
        if self._on_disk():
            await self.ingestion.resume()

    async def aclose(self) -> None:
        await self.ingestion.close()
        for store in self._opened():
            await store.aclose()

    @property
    def catalog(self) -> StoreCatalog:
        return self._catalog()

    def now(self) -> int:
        return int(self.clock())

    # -- stores ------------------------------------------------------------------------------------------

    async def create(
        self,
        tenant: str | None,
        *,
        name: str | None,
        description: str | None,
        metadata: Mapping[str, str] | None,
        expires_after: ExpiresAfter | None,
        file_ids: Sequence[str],
        chunking: ChunkingStrategy | None,
    ) -> StoreRecord:
        key, now = tenant_key(tenant), self.now()
        await self._files_exist(key, file_ids, "file_ids")
        days = expires_after.days if expires_after is not None else None
        record = StoreRecord(
            id="vs_" + new_id("v")[2:],
            tenant=key,
            name=name or "",
            created_at=now,
            last_active_at=now,
            metadata=dict(metadata or {}),
            expires_after_days=days,
            expires_at=now + days * DAY_S if days is not None else None,
            description=description,
        )
        try:
            await self.catalog.create_store(record, self.max_stores)
        except StoresQuotaExceeded as exc:
            raise ApiError(
                400,
                f"This tenant already holds the {exc.limit} vector stores it may (setting vector_stores_per_tenant). "
                "Delete one to make room.",
                code="quota_exceeded",
            ) from None
        for file_id in dict.fromkeys(file_ids):
            await self._attach(record.id, key, file_id, None, chunking, None)
        return record

    async def get(self, tenant: str | None, store_id: str) -> StoreRecord | None:
        return await self.catalog.get_store(tenant_key(tenant), store_id)

    async def page(
        self, tenant: str | None, *, after: str | None, before: str | None, limit: int, order: Order
    ) -> Page:
        return await self.catalog.page_stores(tenant_key(tenant), after=after, before=before, limit=limit, order=order)

    async def update(
        self,
        record: StoreRecord,
        *,
        name: str | None,
        metadata: Mapping[str, str] | None,
        expires_after: ExpiresAfter | None,
        expires_given: bool,
    ) -> StoreRecord:
        now = self.now()
        days = (
            (expires_after.days if expires_after is not None else None) if expires_given else record.expires_after_days
        )
        updated = StoreRecord(
            id=record.id,
            tenant=record.tenant,
            name=name if name is not None else record.name,
            created_at=record.created_at,
            last_active_at=now,
            metadata=dict(metadata) if metadata is not None else record.metadata,
            expires_after_days=days,
            expires_at=now + days * DAY_S if days is not None else None,
            description=record.description,
        )
        await self.catalog.update_store(updated)
        return updated

    async def delete(self, tenant: str | None, store_id: str) -> bool:
        key = tenant_key(tenant)
        if not await self.catalog.delete_store(key, store_id):
            return False
        await self._index().remove_store(key, store_id)
        return True

    async def counts(self, record: StoreRecord, batch_id: str | None = None) -> tuple[FileCounts, int]:
        return await self.catalog.counts(record.tenant, record.id, batch_id)

    # -- files -------------------------------------------------------------------------------------------

    async def attach(
        self,
        record: StoreRecord,
        file_id: str,
        attributes: Mapping[str, Any] | None,
        chunking: ChunkingStrategy | None,
    ) -> StoreFileRecord:
        await self._files_exist(record.tenant, [file_id], "file_id")
        return await self._attach(record.id, record.tenant, file_id, attributes, chunking, None)

    async def _attach(
        self,
        store_id: str,
        tenant: str,
        file_id: str,
        attributes: Mapping[str, Any] | None,
        chunking: ChunkingStrategy | None,
        batch_id: str | None,
    ) -> StoreFileRecord:
        row = StoreFileRecord(
            store_id=store_id,
            file_id=file_id,
            tenant=tenant,
            created_at=self.now(),
            status="in_progress",
            attributes=dict(attributes or {}),
            chunking=(chunking or AUTO).echo(),
            batch_id=batch_id,
        )
        await self.catalog.attach(row)
        self.ingestion.submit(tenant, store_id, file_id)
        return row

    async def _files_exist(self, tenant: str, file_ids: Sequence[str], param: str) -> None:
        for file_id in file_ids:
            if await self.files.catalog.get(tenant, file_id) is None:
                err = file_not_found(file_id)
                err.param = param
                raise err

    async def set_attributes(self, record: StoreFileRecord, attributes: Mapping[str, Any]) -> StoreFileRecord:
        await self.catalog.set_attributes(record.tenant, record.store_id, record.file_id, attributes)
        await self._index().set_attributes(record.tenant, record.store_id, record.file_id, attributes)
        got = await self.catalog.get_file(record.tenant, record.store_id, record.file_id)
        return got or record

    async def detach(self, tenant: str, store_id: str, file_id: str) -> bool:
        if not await self.catalog.detach(tenant, store_id, file_id):
            return False
        await self._index().remove_file(tenant, store_id, file_id)
        return True

    async def file_deleted(self, tenant: str, file_id: str) -> None:
        """``Files.on_delete``: the file leaves every store, its chunks with it (no store exists
        yet: nothing to open for it)."""
        if not self._opened() and not self._on_disk():
            return
        for store_id in await self.catalog.stores_of_file(tenant, file_id):
            await self.catalog.detach(tenant, store_id, file_id)
        await self._index().remove_file(tenant, None, file_id)

    async def text_of(self, record: StoreFileRecord) -> str:
        """An attached file's text, read again from its bytes (FileNotFoundError once it is gone)."""
        from gateway.files.documents import file_text  # the extraction libraries load when first used

        file = await self.files.catalog.get(record.tenant, record.file_id)
        if file is None:
            raise FileNotFoundError(record.file_id)
        async with self.files.blobs.local_path(record.tenant, record.file_id) as path:
            return await file_text(path, file.filename)

    # -- batches -----------------------------------------------------------------------------------------

    async def create_batch(
        self,
        record: StoreRecord,
        files: Sequence[tuple[str, Mapping[str, Any] | None, ChunkingStrategy | None]],
    ) -> BatchRecord:
        await self._files_exist(record.tenant, [f for f, _, _ in files], "file_ids")
        batch = BatchRecord(
            id="vsfb_" + new_id("b")[2:], store_id=record.id, tenant=record.tenant, created_at=self.now()
        )
        await self.catalog.create_batch(batch)
        for file_id, attributes, chunking in files:
            await self._attach(record.id, record.tenant, file_id, attributes, chunking, batch.id)
        return batch

    async def cancel_batch(self, batch: BatchRecord) -> BatchRecord:
        for file_id in await self.catalog.cancel_batch(batch.tenant, batch.store_id, batch.id):
            await self._index().remove_file(batch.tenant, batch.store_id, file_id)
        return BatchRecord(batch.id, batch.store_id, batch.tenant, batch.created_at, True)

    # -- search ------------------------------------------------------------------------------------------

    async def search(
        self,
        tenant: str | None,
        store_ids: Sequence[str],
        query: str,
        *,
        max_results: int,
        flt: Filter | None,
        score_threshold: float = 0.0,
        ranker: str | None = None,
        weights: tuple[float, float] | None = None,
        via: str = "api",
    ) -> list[SearchHit]:
        """The best chunks of the stores for ``query``: hybrid (vector + keyword, fused) unless the
        ranker is ``none`` (vector only) or ``hybrid_search`` weighs a side at 0."""
        t0 = time.perf_counter()
        key = tenant_key(tenant)
        vector = (await self.embed_query([query]))[0] if query.strip() else np.zeros(1, np.float32)
        embedding_weight, text_weight = weights if weights is not None else (1.0, 1.0)
        mode = SearchMode.VECTOR if ranker == "none" else SearchMode.HYBRID
        hits = await search(
            self._index(),
            key,
            SearchQuery(
                store_ids=tuple(store_ids),
                text=query,
                vector=vector,
                max_results=max_results,
                flt=flt,
                score_threshold=score_threshold,
                embedding_weight=embedding_weight,
                text_weight=text_weight,
                mode=mode,
            ),
        )
        self.metrics.vector_store_search_seconds.labels(via).observe(time.perf_counter() - t0)
        now = self.now()
        for store_id in store_ids:
            await self.catalog.touch(key, store_id, now)
        names: dict[str, str] = {}
        for hit in hits:
            if hit.file_id not in names:
                file = await self.files.catalog.get(key, hit.file_id)
                names[hit.file_id] = file.filename if file is not None else ""
        return [SearchHit(h, names[h.file_id]) for h in hits]
