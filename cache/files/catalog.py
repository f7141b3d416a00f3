"""What the Files API knows of each uploaded file (its catalog record), per tenant: the embedded
backend keeps it in SQLite beside the bytes (``cache.files.blobs``); a shared one (Postgres) serves
several replicas behind the same :class:`FileCatalog` interface.

Why a catalog apart from the bytes: listing, quotas and ownership are queries over small records,
and must be answered without touching (or trusting) the file system; the bytes are written first,
under a name nobody lists, and only a committed record makes a file exist. Quotas are checked in
the same transaction that adds the record, so two uploads racing for a tenant's last byte of quota
cannot both land.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

from cache.files.sqlite_db import SqliteDb

__all__ = ["FileCatalog", "FilePage", "FileRecord", "QuotaExceeded", "SqliteFileCatalog", "Usage"]


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file: ``tenant`` ``""`` where the gateway runs without keys (open mode)."""

    id: str
    tenant: str
    filename: str
    bytes: int
    purpose: str
    created_at: int
    expires_at: int | None = None


class FilePage(NamedTuple):
    files: list[FileRecord]
    has_more: bool


class Usage(NamedTuple):
    files: int
    bytes: int


class QuotaExceeded(Exception):
    """Adding the file would take its tenant past ``files`` or ``bytes`` (which one: ``what``)."""

    def __init__(self, what: Literal["files", "bytes"], limit: int) -> None:
        super().__init__(f"{what} quota of {limit} reached")
        self.what = what
        self.limit = limit


class FileCatalog(Protocol):
    async def add(self, record: FileRecord, max_files: int, max_bytes: int) -> None:
        """Add ``record`` unless its tenant would then hold more than ``max_files`` files or
        ``max_bytes`` bytes (:class:`QuotaExceeded`), in one step."""
        ...

    async def get(self, tenant: str, file_id: str) -> FileRecord | None: ...

    async def page(
        self, tenant: str, *, after: str | None, limit: int, order: Literal["asc", "desc"], purpose: str | None
    ) -> FilePage:
        """A tenant's files in upload order (``after``: those past that id; an id that is not the
        tenant's starts nowhere: an empty page)."""
        ...

    async def delete(self, tenant: str, file_id: str) -> FileRecord | None:
        """Remove a file's record; the record it was, or None when the tenant has no such file."""
        ...

    async def usage(self, tenant: str) -> Usage: ...

    async def expired(self, now: int, limit: int) -> list[FileRecord]:
        """Up to ``limit`` records (any tenant) whose ``expires_at`` has passed, oldest first."""
        ...

    async def aclose(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    purpose TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    UNIQUE (tenant, id)
);
CREATE INDEX IF NOT EXISTS files_expiry ON files (expires_at) WHERE expires_at IS NOT NULL;
"""

_COLUMNS = "id, tenant, filename, bytes, purpose, created_at, expires_at"


class SqliteFileCatalog:
    """The embedded catalog: a table in a SQLite database (``cache.files.sqlite_db``). Each call is a
    few indexed rows."""

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteDb(path, _SCHEMA)
        self._run = self._db.run

    async def add(self, record: FileRecord, max_files: int, max_bytes: int) -> None:
        def add(db: sqlite3.Connection) -> None:
            files, used = db.execute(
                "SELECT count(*), coalesce(sum(bytes), 0) FROM files WHERE tenant = ?", (record.tenant,)
            ).fetchone()
            if files + 1 > max_files:
                raise QuotaExceeded("files", max_files)
            if used + record.bytes > max_bytes:
                raise QuotaExceeded("bytes", max_bytes)
            db.execute(
                f"INSERT INTO files ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.tenant,
                    record.filename,
                    record.bytes,
                    record.purpose,
                    record.created_at,
                    record.expires_at,
                ),
            )

        await self._db.transaction(add)

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        row = await self._run(
            lambda db: db.execute(
                f"SELECT {_COLUMNS} FROM files WHERE tenant = ? AND id = ?", (tenant, file_id)
            ).fetchone()
        )
        return FileRecord(*row) if row else None

    async def page(
        self, tenant: str, *, after: str | None, limit: int, order: Literal["asc", "desc"], purpose: str | None
    ) -> FilePage:
        def page(db: sqlite3.Connection) -> FilePage:
            where, args = ["tenant = ?"], [tenant]
            if purpose is not None:
                where.append("purpose = ?")
                args.append(purpose)
            if after is not None:
                row = db.execute("SELECT seq FROM files WHERE tenant = ? AND id = ?", (tenant, after)).fetchone()
                if row is None:
                    return FilePage([], False)
                where.append("seq > ?" if order == "asc" else "seq < ?")
                args.append(row[0])
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM files WHERE {' AND '.join(where)} "
                f"ORDER BY seq {'ASC' if order == 'asc' else 'DESC'} LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
            return FilePage([FileRecord(*r) for r in rows[:limit]], len(rows) > limit)

        return await self._run(page)

    async def delete(self, tenant: str, file_id: str) -> FileRecord | None:
        def delete(db: sqlite3.Connection) -> FileRecord | None:
            row = db.execute(
                f"DELETE FROM files WHERE tenant = ? AND id = ? RETURNING {_COLUMNS}", (tenant, file_id)
            ).fetchone()
            return FileRecord(*row) if row else None

        return await self._run(delete)

    async def usage(self, tenant: str) -> Usage:
        files, used = await self._run(
            lambda db: db.execute(
                "SELECT count(*), coalesce(sum(bytes), 0) FROM files WHERE tenant = ?", (tenant,)
            ).fetchone()
        )
        return Usage(files, used)

    async def expired(self, now: int, limit: int) -> list[FileRecord]:
        rows = await self._run(
            lambda db: db.execute(
                f"SELECT {_COLUMNS} FROM files WHERE expires_at IS NOT NULL AND expires_at <= ? "
                "ORDER BY expires_at LIMIT ?",
                (now, limit),
            ).fetchall()
        )
        return [FileRecord(*r) for r in rows]

    async def aclose(self) -> None:
        await self._db.aclose()
