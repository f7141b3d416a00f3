"""Uploaded files' bytes in the database (Postgres, shared by replicas): any replica reads what
another wrote, behind the same :class:`cache.files.blobs.Blobs` interface as the folder on disk.

Shape: a file is rows of pieces of at most :data:`PIECE` bytes (``blob_pieces``: tenant, file id,
upload token, sequence number, bytes), written as the upload streams in (the writer holds at most
one piece in memory), and one row in ``blobs`` naming the upload whose pieces are the file's. That
row is inserted by ``commit`` only, so until then nobody reads the pieces: a refused or aborted
upload's pieces are deleted, and those of an upload whose replica died mid-way (no ``blobs`` row,
older than :data:`STALE_UPLOAD_S`) are swept the next time a replica opens the store. A read walks
the pieces one by one (one piece in memory); ``local_path`` copies them to a temporary file for
ingestion, which reads its input from a path.

The statements are portable (``cache.files.sql``): the same code runs on SQLite, which the
conformance tests use beside Postgres.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from cache.files.blobs import READ_CHUNK, BlobWriter
from cache.files.sql import Sql, SqlDb

__all__ = ["PIECE", "STALE_UPLOAD_S", "PgBlobs"]

#: bytes of one stored piece (and of one read): the most a writer or a reader holds
PIECE = READ_CHUNK
#: seconds after which an uncommitted upload's pieces are swept (its replica died mid-upload)
STALE_UPLOAD_S = 24 * 3600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blob_pieces (
    tenant TEXT NOT NULL, file_id TEXT NOT NULL, upload TEXT NOT NULL, seq BIGINT NOT NULL,
    written_at BIGINT NOT NULL, data BYTES_TYPE NOT NULL,
    PRIMARY KEY (tenant, file_id, upload, seq)
);
CREATE INDEX IF NOT EXISTS blob_pieces_written ON blob_pieces (written_at);
CREATE TABLE IF NOT EXISTS blobs (
    tenant TEXT NOT NULL, file_id TEXT NOT NULL, upload TEXT NOT NULL, pieces BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    PRIMARY KEY (tenant, file_id)
)
"""


class PgBlobs:
    """Files' bytes as rows of pieces in ``db`` (opened on first use, like the catalogs)."""

    def __init__(self, db: SqlDb, *, temp_dir: str | Path | None = None) -> None:
        self._db = db
        self._temp_dir = None if temp_dir is None else str(temp_dir)
        self._ready = False
        self._setting_up = asyncio.Lock()

    async def _setup(self) -> SqlDb:
        if not self._ready:
            async with self._setting_up:
                if not self._ready:
                    kind = "BYTEA" if self._db.dialect == "postgres" else "BLOB"
                    await self._db.setup(_SCHEMA.replace("BYTES_TYPE", kind))
                    await self.sweep_stale(int(time.time()) - STALE_UPLOAD_S)
                    self._ready = True
        return self._db

    async def sweep_stale(self, before: int) -> int:
        """Delete the pieces of uploads never committed and last written before ``before`` (epoch
        seconds); how many pieces."""
        return await self._db.run(
            "DELETE FROM blob_pieces WHERE written_at < ? AND NOT EXISTS (SELECT 1 FROM blobs b "
            "WHERE b.tenant = blob_pieces.tenant AND b.file_id = blob_pieces.file_id "
            "AND b.upload = blob_pieces.upload)",
            (before,),
        )

    def writer(self, tenant: str, file_id: str) -> BlobWriter:
        return _PgWriter(self, tenant, file_id)

    async def _where(self, tenant: str, file_id: str) -> tuple[str, int]:
        if "\x00" in tenant or "\x00" in file_id:  # no stored name has one (Postgres text cannot)
            raise FileNotFoundError(file_id)
        db = await self._setup()
        row = await db.one("SELECT upload, pieces FROM blobs WHERE tenant = ? AND file_id = ?", (tenant, file_id))
        if row is None:
            raise FileNotFoundError(file_id)
        return str(row[0]), int(row[1])

    async def read(self, tenant: str, file_id: str) -> AsyncIterator[bytes]:
        upload, pieces = await self._where(tenant, file_id)
        for seq in range(pieces):
            row = await self._db.one(
                "SELECT data FROM blob_pieces WHERE tenant = ? AND file_id = ? AND upload = ? AND seq = ?",
                (tenant, file_id, upload, seq),
            )
            if row is None:  # deleted while it was read: not a shorter file
                raise FileNotFoundError(file_id)
            yield bytes(row[0])

    def local_path(self, tenant: str, file_id: str) -> AbstractAsyncContextManager[Path]:
        return self._local_path(tenant, file_id)

    @asynccontextmanager
    async def _local_path(self, tenant: str, file_id: str) -> AsyncIterator[Path]:
        fd, name = tempfile.mkstemp(prefix="respgate-blob-", dir=self._temp_dir)
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as handle:
                async for piece in self.read(tenant, file_id):
                    await asyncio.to_thread(handle.write, piece)
            yield path
        finally:
            path.unlink(missing_ok=True)

    async def delete(self, tenant: str, file_id: str) -> bool:
        if "\x00" in tenant or "\x00" in file_id:
            return False
        db = await self._setup()

        async def delete(conn: Sql) -> bool:
            row = await conn.one(
                "DELETE FROM blobs WHERE tenant = ? AND file_id = ? RETURNING upload", (tenant, file_id)
            )
            if row is not None:
                await conn.run(
                    "DELETE FROM blob_pieces WHERE tenant = ? AND file_id = ? AND upload = ?", (tenant, file_id, row[0])
                )
            return row is not None

        return await db.atomic(delete)

    async def aclose(self) -> None:
        await self._db.aclose()


class _PgWriter:
    def __init__(self, blobs: PgBlobs, tenant: str, file_id: str) -> None:
        self._blobs = blobs
        self._tenant = tenant
        self._file_id = file_id
        self._upload = uuid.uuid4().hex
        self._buffer = bytearray()
        self._pieces = 0
        self._bytes = 0
        self._open = True

    async def _put(self, data: bytes) -> None:
        db = await self._blobs._setup()
        await db.run(
            "INSERT INTO blob_pieces (tenant, file_id, upload, seq, written_at, data) VALUES (?, ?, ?, ?, ?, ?)",
            (self._tenant, self._file_id, self._upload, self._pieces, int(time.time()), data),
        )
        self._pieces += 1

    async def write(self, data: bytes) -> None:
        assert self._open, "written after commit or abort"
        self._buffer += data
        self._bytes += len(data)
        while len(self._buffer) >= PIECE:
            piece = bytes(self._buffer[:PIECE])
            del self._buffer[:PIECE]
            await self._put(piece)

    async def commit(self) -> None:
        assert self._open, "committed twice or after abort"
        self._open = False
        if self._buffer or self._pieces == 0:
            piece, self._buffer = bytes(self._buffer), bytearray()
            if piece:
                await self._put(piece)
        db = await self._blobs._setup()

        async def place(conn: Sql) -> None:
            old = await conn.one(
                "DELETE FROM blobs WHERE tenant = ? AND file_id = ? RETURNING upload", (self._tenant, self._file_id)
            )
            if old is not None:
                await conn.run(
                    "DELETE FROM blob_pieces WHERE tenant = ? AND file_id = ? AND upload = ?",
                    (self._tenant, self._file_id, old[0]),
                )
            await conn.run(
                "INSERT INTO blobs (tenant, file_id, upload, pieces, bytes) VALUES (?, ?, ?, ?, ?)",
                (self._tenant, self._file_id, self._upload, self._pieces, self._bytes),
            )

        await db.atomic(place)

    async def abort(self) -> None:
        if not self._open:
            return
        self._open = False
        self._buffer = bytearray()
        if self._pieces:
            db = await self._blobs._setup()
            await db.run(
                "DELETE FROM blob_pieces WHERE tenant = ? AND file_id = ? AND upload = ?",
                (self._tenant, self._file_id, self._upload),
            )
