"""The Files API's service: uploads streamed into storage under a tenant's quotas, and the files a
tenant holds (``/v1/files``; ``file_search`` reads them through the vector stores).

An upload is begun before its bytes are read (a tenant at its file count is refused before any
byte is), written as it streams in — each write checked against the per-file cap and what is left
of the tenant's byte quota, so a 2 GB body costs at most the cap in disk and nothing in memory —
and finished once the form is whole (the filename and purpose may come after the bytes in a form):
only then does the catalog record, added under the quotas in one step, make the file exist.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from cache.files.blobs import Blobs, BlobWriter, DiskBlobs
from cache.files.catalog import FileCatalog, FilePage, FileRecord, QuotaExceeded, SqlFileCatalog
from cache.files.pg_blobs import PgBlobs
from cache.files.sql import SqlDb, SqliteSql
from gateway.base.settings import Settings, default_cache_path
from gateway.wire.files import file_too_large, new_file_id, quota_exceeded

__all__ = ["Files", "Upload", "files_root", "tenant_key"]

log = logging.getLogger(__name__)

#: expired files deleted at a time
SWEEP_BATCH = 100
#: characters of a filename kept (the rest cut); path parts and control characters are dropped
MAX_FILENAME = 255


def files_root(settings: Settings) -> Path:
    """The embedded file store's folder: ``files_dir``, else ``$RESPGATE_CACHE_DIR/files``."""
    return Path(settings.files_dir or default_cache_path("files"))


def tenant_key(tenant: str | None) -> str:
    """The stores' name for a tenant: ``""`` where the gateway runs without keys."""
    return tenant or ""


def clean_filename(name: str | None) -> str:
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(ch for ch in base if ch.isprintable())
    return base[:MAX_FILENAME] or "upload"


class Upload:
    """One upload in progress: :meth:`write` as the bytes arrive, then :meth:`finish` or :meth:`abort`."""

    def __init__(self, files: Files, tenant: str, cap: int, file_too_large_at: int) -> None:
        self._files = files
        self.tenant = tenant
        self.file_id = new_file_id()
        self._writer: BlobWriter = files.blobs.writer(tenant, self.file_id)
        self._cap = cap
        self._per_file = file_too_large_at
        self.size = 0
        #: the first bytes, for the content check at finish
        self.head = b""

    async def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self._cap:
            await self.abort()
            if self.size > self._per_file:
                raise file_too_large(self._per_file)
            raise quota_exceeded("bytes", self._files.settings.files_bytes_per_tenant)
        if len(self.head) < 8192:
            self.head += data[: 8192 - len(self.head)]
        await self._writer.write(data)

    async def finish(self, filename: str | None, purpose: str, expires_after_s: int | None) -> FileRecord:
        now = int(self._files.clock())
        record = FileRecord(
            id=self.file_id,
            tenant=self.tenant,
            filename=clean_filename(filename),
            bytes=self.size,
            purpose=purpose,
            created_at=now,
            expires_at=now + expires_after_s if expires_after_s is not None else None,
        )
        await self._writer.commit()
        s = self._files.settings
        try:
            await self._files.catalog.add(record, s.files_per_tenant, s.files_bytes_per_tenant)
        except QuotaExceeded as exc:
            await self._files.blobs.delete(self.tenant, self.file_id)
            raise quota_exceeded(exc.what, exc.limit) from None
        except BaseException:
            await self._files.blobs.delete(self.tenant, self.file_id)
            raise
        return record

    async def abort(self) -> None:
        await self._writer.abort()


class Files:
    """A tenant's files: their catalog records and their bytes. The stores open on first use (a
    gateway nobody uploads to creates nothing on disk)."""

    def __init__(
        self,
        settings: Settings,
        open_stores: Callable[[], tuple[FileCatalog, Blobs]],
        clock: Callable[[], float] = time.time,
        exists: Callable[[], bool] | None = None,
    ) -> None:
        """``exists``: whether an earlier run left stores to sweep (default: ``files_dir`` exists)."""
        self.settings = settings
        self._open_stores = open_stores
        self._exists_hook = exists
        self._stores: tuple[FileCatalog, Blobs] | None = None
        self.clock = clock
        #: told of each deleted file (the vector stores drop its chunks)
        self.on_delete: list[Callable[[str, str], Awaitable[None]]] = []

    @classmethod
    def embedded(cls, settings: Settings) -> Files:
        """The catalog in SQLite and the bytes on disk, under ``files_dir``."""

        def open_stores() -> tuple[FileCatalog, Blobs]:
            root = files_root(settings)
            os.makedirs(root, exist_ok=True)
            return SqlFileCatalog(SqliteSql(root / "catalog.sqlite3")), DiskBlobs(root / "blobs")

        return cls(settings, open_stores)

    @classmethod
    def postgres(cls, settings: Settings, db: Callable[[], SqlDb]) -> Files:
        """The catalog and the bytes in Postgres (``file_store=postgres``), on ``db()`` — the
        database the vector stores use too — so every replica sees every tenant's files. Nothing
        connects until a file is first asked for; the expiry sweep does not connect on its own."""

        def open_stores() -> tuple[FileCatalog, Blobs]:
            shared = db()
            return SqlFileCatalog(shared), PgBlobs(shared)

        return cls(settings, open_stores, exists=lambda: False)

    @property
    def catalog(self) -> FileCatalog:
        return self._opened()[0]

    @property
    def blobs(self) -> Blobs:
        return self._opened()[1]

    def _opened(self) -> tuple[FileCatalog, Blobs]:
        if self._stores is None:
            self._stores = self._open_stores()
        return self._stores

    async def begin(self, tenant: str | None) -> Upload:
        """An upload for ``tenant``, or the 400 of a tenant already at a quota."""
        key = tenant_key(tenant)
        s = self.settings
        used = await self.catalog.usage(key)
        if used.files >= s.files_per_tenant:
            raise quota_exceeded("files", s.files_per_tenant)
        if used.bytes >= s.files_bytes_per_tenant:
            raise quota_exceeded("bytes", s.files_bytes_per_tenant)
        cap = min(s.files_max_bytes, s.files_bytes_per_tenant - used.bytes)
        return Upload(self, key, cap, s.files_max_bytes)

    async def get(self, tenant: str | None, file_id: str) -> FileRecord | None:
        return await self.catalog.get(tenant_key(tenant), file_id)

    async def page(
        self, tenant: str | None, *, after: str | None, limit: int, order: str, purpose: str | None
    ) -> FilePage:
        return await self.catalog.page(
            tenant_key(tenant), after=after, limit=limit, order="asc" if order == "asc" else "desc", purpose=purpose
        )

    def content(self, tenant: str | None, file_id: str) -> AsyncIterator[bytes]:
        return self.blobs.read(tenant_key(tenant), file_id)

    async def delete(self, tenant: str | None, file_id: str) -> bool:
        """Remove a file: its record first (it no longer exists for any reader), then everything
        derived from it (``on_delete``), then its bytes."""
        key = tenant_key(tenant)
        record = await self.catalog.delete(key, file_id)
        if record is None:
            return False
        for hook in self.on_delete:
            await hook(key, file_id)
        await self.blobs.delete(key, file_id)
        return True

    async def sweep_loop(self, interval_s: float = 60.0) -> None:
        """Delete expired files every ``interval_s`` for as long as the gateway runs (a store that
        fails is logged and tried again next time). A store nobody opened is not opened for it,
        unless it already exists on disk from an earlier run."""
        while True:
            await asyncio.sleep(interval_s)
            if self._stores is None and not self._exists():
                continue
            try:
                while await self.sweep_expired() == SWEEP_BATCH:
                    pass
            except Exception:
                log.exception("deleting expired files failed; trying again in %g s", interval_s)

    def _exists(self) -> bool:
        if self._exists_hook is not None:
            return self._exists_hook()
        return files_root(self.settings).exists()

    async def sweep_expired(self, limit: int = SWEEP_BATCH) -> int:
        """Delete up to ``limit`` files whose ``expires_at`` has passed; how many were."""
        gone = 0
        for record in await self.catalog.expired(int(self.clock()), limit):
            gone += await self.delete(record.tenant, record.id)
        return gone

    async def aclose(self) -> None:
        if self._stores is not None:
            await self._stores[0].aclose()
