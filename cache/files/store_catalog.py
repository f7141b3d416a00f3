"""What the Vector Stores API knows, per tenant: the stores, the files attached to each (with their
ingestion status, attributes and chunking) and the batches that attached them. The chunks
themselves are in the chunk index (``cache.files.index``); the bytes in ``cache.files.blobs``.

The embedded backend is SQLite; a shared one (Postgres) implements the same
:class:`StoreCatalog` for several replicas. A store's file counts and bytes are computed from its
files' rows, so they can never drift from them; its status follows: ``in_progress`` while any file
is, else ``completed`` (``expired`` once its ``expires_at`` passed).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from cache.files.sqlite_db import SqliteDb

__all__ = [
    "BatchRecord",
    "FileCounts",
    "FileStatus",
    "Page",
    "SqliteStoreCatalog",
    "StoreCatalog",
    "StoreFileRecord",
    "StoreRecord",
    "StoresQuotaExceeded",
]

FileStatus = Literal["in_progress", "completed", "cancelled", "failed"]
Order = Literal["asc", "desc"]


class FileCounts(NamedTuple):
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        return self.in_progress + self.completed + self.failed + self.cancelled


@dataclass(frozen=True, slots=True)
class StoreRecord:
    id: str
    tenant: str
    name: str
    created_at: int
    last_active_at: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    #: ``expires_after`` (anchor ``last_active_at``): days, and the moment it expires
    expires_after_days: int | None = None
    expires_at: int | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class StoreFileRecord:
    store_id: str
    file_id: str
    tenant: str
    created_at: int
    status: FileStatus
    attributes: Mapping[str, Any] = field(default_factory=dict)
    #: the ``chunking_strategy`` as the API echoes it (``{"type": "static", "static": {...}}``)
    chunking: Mapping[str, Any] = field(default_factory=dict)
    usage_bytes: int = 0
    last_error_code: str | None = None
    last_error_message: str | None = None
    batch_id: str | None = None


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    store_id: str
    tenant: str
    created_at: int
    cancelled: bool = False


class Page(NamedTuple):
    items: list[Any]
    has_more: bool


class StoresQuotaExceeded(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"vector store quota of {limit} reached")
        self.limit = limit


class StoreCatalog(Protocol):
    async def create_store(self, record: StoreRecord, max_stores: int) -> None: ...
    async def get_store(self, tenant: str, store_id: str) -> StoreRecord | None: ...
    async def page_stores(
        self, tenant: str, *, after: str | None, before: str | None, limit: int, order: Order
    ) -> Page: ...
    async def update_store(self, record: StoreRecord) -> bool: ...
    async def delete_store(self, tenant: str, store_id: str) -> bool:
        """The store, its files' rows and its batches."""
        ...

    async def touch(self, tenant: str, store_id: str, now: int) -> None:
        """``last_active_at`` = now (and ``expires_at`` moved with it)."""
        ...

    async def counts(self, tenant: str, store_id: str, batch_id: str | None = None) -> tuple[FileCounts, int]:
        """File counts by status and the bytes of the completed files' chunks."""
        ...

    async def attach(self, record: StoreFileRecord) -> None:
        """Attach a file (again: its row replaced, back to ``in_progress``)."""
        ...

    async def get_file(self, tenant: str, store_id: str, file_id: str) -> StoreFileRecord | None: ...
    async def page_files(
        self,
        tenant: str,
        store_id: str,
        *,
        after: str | None,
        before: str | None,
        limit: int,
        order: Order,
        status: FileStatus | None,
        batch_id: str | None = None,
    ) -> Page: ...
    async def finish_file(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        status: FileStatus,
        usage_bytes: int = 0,
        error: tuple[str, str] | None = None,
    ) -> bool:
        """Set an ``in_progress`` file's outcome; False when it is no longer ``in_progress`` (cancelled,
        detached, re-attached meanwhile)."""
        ...

    async def set_attributes(self, tenant: str, store_id: str, file_id: str, attributes: Mapping[str, Any]) -> bool: ...
    async def detach(self, tenant: str, store_id: str, file_id: str) -> bool: ...
    async def stores_of_file(self, tenant: str, file_id: str) -> list[str]: ...
    async def create_batch(self, record: BatchRecord) -> None: ...
    async def get_batch(self, tenant: str, store_id: str, batch_id: str) -> BatchRecord | None: ...
    async def cancel_batch(self, tenant: str, store_id: str, batch_id: str) -> list[str]:
        """Mark the batch cancelled and its ``in_progress`` files ``cancelled``; their ids."""
        ...

    async def in_progress(self, limit: int) -> list[StoreFileRecord]:
        """Files (any tenant) still ``in_progress``: ingestion a restart must take up again."""
        ...

    async def expired_stores(self, now: int, limit: int) -> list[StoreRecord]: ...
    async def store_count(self, tenant: str) -> int: ...
    async def aclose(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS stores (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL, id TEXT NOT NULL, name TEXT NOT NULL, description TEXT,
    created_at INTEGER NOT NULL, last_active_at INTEGER NOT NULL, metadata TEXT NOT NULL,
    expires_after_days INTEGER, expires_at INTEGER,
    UNIQUE (tenant, id)
);
CREATE INDEX IF NOT EXISTS stores_expiry ON stores (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS store_files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL, store_id TEXT NOT NULL, file_id TEXT NOT NULL,
    created_at INTEGER NOT NULL, status TEXT NOT NULL, attributes TEXT NOT NULL, chunking TEXT NOT NULL,
    usage_bytes INTEGER NOT NULL DEFAULT 0, last_error_code TEXT, last_error_message TEXT, batch_id TEXT,
    UNIQUE (tenant, store_id, file_id)
);
CREATE INDEX IF NOT EXISTS store_files_of_file ON store_files (tenant, file_id);
CREATE INDEX IF NOT EXISTS store_files_pending ON store_files (status) WHERE status = 'in_progress';
CREATE TABLE IF NOT EXISTS batches (
    tenant TEXT NOT NULL, store_id TEXT NOT NULL, id TEXT NOT NULL, created_at INTEGER NOT NULL,
    cancelled INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, store_id, id)
);
"""

_STORE = "id, tenant, name, created_at, last_active_at, metadata, expires_after_days, expires_at, description"
_FILE = (
    "store_id, file_id, tenant, created_at, status, attributes, chunking, usage_bytes, "
    "last_error_code, last_error_message, batch_id"
)


def _store(row: tuple[Any, ...]) -> StoreRecord:
    return StoreRecord(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), row[6], row[7], row[8])


def _file(row: tuple[Any, ...]) -> StoreFileRecord:
    return StoreFileRecord(
        row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), json.loads(row[6]), row[7], row[8], row[9], row[10]
    )


def _cursor_page(
    db: sqlite3.Connection,
    table: str,
    columns: str,
    where: list[str],
    args: list[Any],
    cursor: tuple[str, str] | None,
    limit: int,
    order: Order,
) -> tuple[list[tuple[Any, ...]], bool] | None:
    """Rows of ``table`` in ``seq`` order after (or before) the row whose ``cursor[0]`` column is
    ``cursor[1]`` (None when that row is not among ``where``'s: an empty page)."""
    where, args = list(where), list(args)
    ascending = order == "asc"
    if cursor is not None:
        direction, wanted = cursor
        column = "id" if table == "stores" else "file_id"
        row = db.execute(
            f"SELECT seq FROM {table} WHERE {' AND '.join(where)} AND {column} = ?", (*args, wanted)
        ).fetchone()
        if row is None:
            return None
        forward = (direction == "after") == ascending
        where.append("seq > ?" if forward else "seq < ?")
        args.append(row[0])
        if direction == "before":  # the page just before the cursor, still in the order asked
            rows = db.execute(
                f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} "
                f"ORDER BY seq {'DESC' if ascending else 'ASC'} LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
            return list(reversed(rows[:limit])), len(rows) > limit
    rows = db.execute(
        f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} "
        f"ORDER BY seq {'ASC' if ascending else 'DESC'} LIMIT ?",
        (*args, limit + 1),
    ).fetchall()
    return rows[:limit], len(rows) > limit


class SqliteStoreCatalog:
    """The embedded catalog of vector stores (``cache.files.sqlite_db``)."""

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteDb(path, _SCHEMA)

    async def create_store(self, record: StoreRecord, max_stores: int) -> None:
        def create(db: sqlite3.Connection) -> None:
            (count,) = db.execute("SELECT count(*) FROM stores WHERE tenant = ?", (record.tenant,)).fetchone()
            if count >= max_stores:
                raise StoresQuotaExceeded(max_stores)
            db.execute(
                f"INSERT INTO stores ({_STORE}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.tenant,
                    record.name,
                    record.created_at,
                    record.last_active_at,
                    json.dumps(dict(record.metadata)),
                    record.expires_after_days,
                    record.expires_at,
                    record.description,
                ),
            )

        await self._db.transaction(create)

    async def get_store(self, tenant: str, store_id: str) -> StoreRecord | None:
        row = await self._db.run(
            lambda db: db.execute(
                f"SELECT {_STORE} FROM stores WHERE tenant = ? AND id = ?", (tenant, store_id)
            ).fetchone()
        )
        return _store(row) if row else None

    async def page_stores(
        self, tenant: str, *, after: str | None, before: str | None, limit: int, order: Order
    ) -> Page:
        cursor = ("after", after) if after is not None else ("before", before) if before is not None else None

        def page(db: sqlite3.Connection) -> Page:
            got = _cursor_page(db, "stores", _STORE, ["tenant = ?"], [tenant], cursor, limit, order)
            return Page([], False) if got is None else Page([_store(r) for r in got[0]], got[1])

        return await self._db.run(page)

    async def update_store(self, record: StoreRecord) -> bool:
        def update(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "UPDATE stores SET name = ?, metadata = ?, expires_after_days = ?, expires_at = ?, last_active_at = ? "
                "WHERE tenant = ? AND id = ?",
                (
                    record.name,
                    json.dumps(dict(record.metadata)),
                    record.expires_after_days,
                    record.expires_at,
                    record.last_active_at,
                    record.tenant,
                    record.id,
                ),
            )
            return cur.rowcount > 0

        return await self._db.run(update)

    async def delete_store(self, tenant: str, store_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            cur = db.execute("DELETE FROM stores WHERE tenant = ? AND id = ?", (tenant, store_id))
            db.execute("DELETE FROM store_files WHERE tenant = ? AND store_id = ?", (tenant, store_id))
            db.execute("DELETE FROM batches WHERE tenant = ? AND store_id = ?", (tenant, store_id))
            return cur.rowcount > 0

        return await self._db.transaction(delete)

    async def touch(self, tenant: str, store_id: str, now: int) -> None:
        await self._db.run(
            lambda db: db.execute(
                "UPDATE stores SET last_active_at = ?, expires_at = CASE WHEN expires_after_days IS NULL THEN NULL "
                "ELSE ? + expires_after_days * 86400 END WHERE tenant = ? AND id = ?",
                (now, now, tenant, store_id),
            )
        )

    async def counts(self, tenant: str, store_id: str, batch_id: str | None = None) -> tuple[FileCounts, int]:
        def counts(db: sqlite3.Connection) -> tuple[FileCounts, int]:
            where, args = "tenant = ? AND store_id = ?", [tenant, store_id]
            if batch_id is not None:
                where += " AND batch_id = ?"
                args.append(batch_id)
            by = dict(
                db.execute(f"SELECT status, count(*) FROM store_files WHERE {where} GROUP BY status", args).fetchall()
            )
            (used,) = db.execute(
                f"SELECT coalesce(sum(usage_bytes), 0) FROM store_files WHERE {where} AND status = 'completed'", args
            ).fetchone()
            return FileCounts(
                by.get("in_progress", 0), by.get("completed", 0), by.get("failed", 0), by.get("cancelled", 0)
            ), used

        return await self._db.run(counts)

    async def attach(self, record: StoreFileRecord) -> None:
        def attach(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM store_files WHERE tenant = ? AND store_id = ? AND file_id = ?",
                (record.tenant, record.store_id, record.file_id),
            )
            db.execute(
                f"INSERT INTO store_files ({_FILE}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.store_id,
                    record.file_id,
                    record.tenant,
                    record.created_at,
                    record.status,
                    json.dumps(dict(record.attributes)),
                    json.dumps(dict(record.chunking)),
                    record.usage_bytes,
                    record.last_error_code,
                    record.last_error_message,
                    record.batch_id,
                ),
            )

        await self._db.transaction(attach)

    async def get_file(self, tenant: str, store_id: str, file_id: str) -> StoreFileRecord | None:
        row = await self._db.run(
            lambda db: db.execute(
                f"SELECT {_FILE} FROM store_files WHERE tenant = ? AND store_id = ? AND file_id = ?",
                (tenant, store_id, file_id),
            ).fetchone()
        )
        return _file(row) if row else None

    async def page_files(
        self,
        tenant: str,
        store_id: str,
        *,
        after: str | None,
        before: str | None,
        limit: int,
        order: Order,
        status: FileStatus | None,
        batch_id: str | None = None,
    ) -> Page:
        cursor = ("after", after) if after is not None else ("before", before) if before is not None else None
        where, args = ["tenant = ?", "store_id = ?"], [tenant, store_id]
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if batch_id is not None:
            where.append("batch_id = ?")
            args.append(batch_id)

        def page(db: sqlite3.Connection) -> Page:
            got = _cursor_page(db, "store_files", _FILE, where, args, cursor, limit, order)
            return Page([], False) if got is None else Page([_file(r) for r in got[0]], got[1])

        return await self._db.run(page)

    async def finish_file(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        status: FileStatus,
        usage_bytes: int = 0,
        error: tuple[str, str] | None = None,
    ) -> bool:
        code, message = error if error is not None else (None, None)
        cur = await self._db.run(
            lambda db: db.execute(
                "UPDATE store_files SET status = ?, usage_bytes = ?, last_error_code = ?, last_error_message = ? "
                "WHERE tenant = ? AND store_id = ? AND file_id = ? AND status = 'in_progress'",
                (status, usage_bytes, code, message, tenant, store_id, file_id),
            )
        )
        return bool(cur.rowcount > 0)

    async def set_attributes(self, tenant: str, store_id: str, file_id: str, attributes: Mapping[str, Any]) -> bool:
        cur = await self._db.run(
            lambda db: db.execute(
                "UPDATE store_files SET attributes = ? WHERE tenant = ? AND store_id = ? AND file_id = ?",
                (json.dumps(dict(attributes)), tenant, store_id, file_id),
            )
        )
        return bool(cur.rowcount > 0)

    async def detach(self, tenant: str, store_id: str, file_id: str) -> bool:
        cur = await self._db.run(
            lambda db: db.execute(
                "DELETE FROM store_files WHERE tenant = ? AND store_id = ? AND file_id = ?", (tenant, store_id, file_id)
            )
        )
        return bool(cur.rowcount > 0)

    async def stores_of_file(self, tenant: str, file_id: str) -> list[str]:
        rows = await self._db.run(
            lambda db: db.execute(
                "SELECT store_id FROM store_files WHERE tenant = ? AND file_id = ?", (tenant, file_id)
            ).fetchall()
        )
        return [r[0] for r in rows]

    async def create_batch(self, record: BatchRecord) -> None:
        await self._db.run(
            lambda db: db.execute(
                "INSERT INTO batches (tenant, store_id, id, created_at, cancelled) VALUES (?, ?, ?, ?, ?)",
                (record.tenant, record.store_id, record.id, record.created_at, int(record.cancelled)),
            )
        )

    async def get_batch(self, tenant: str, store_id: str, batch_id: str) -> BatchRecord | None:
        row = await self._db.run(
            lambda db: db.execute(
                "SELECT id, store_id, tenant, created_at, cancelled FROM batches "
                "WHERE tenant = ? AND store_id = ? AND id = ?",
                (tenant, store_id, batch_id),
            ).fetchone()
        )
        return BatchRecord(row[0], row[1], row[2], row[3], bool(row[4])) if row else None

    async def cancel_batch(self, tenant: str, store_id: str, batch_id: str) -> list[str]:
        def cancel(db: sqlite3.Connection) -> list[str]:
            db.execute(
                "UPDATE batches SET cancelled = 1 WHERE tenant = ? AND store_id = ? AND id = ?",
                (tenant, store_id, batch_id),
            )
            rows = db.execute(
                "UPDATE store_files SET status = 'cancelled' WHERE tenant = ? AND store_id = ? AND batch_id = ? "
                "AND status = 'in_progress' RETURNING file_id",
                (tenant, store_id, batch_id),
            ).fetchall()
            return [r[0] for r in rows]

        return await self._db.transaction(cancel)

    async def in_progress(self, limit: int) -> list[StoreFileRecord]:
        rows = await self._db.run(
            lambda db: db.execute(
                f"SELECT {_FILE} FROM store_files WHERE status = 'in_progress' ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        )
        return [_file(r) for r in rows]

    async def expired_stores(self, now: int, limit: int) -> list[StoreRecord]:
        rows = await self._db.run(
            lambda db: db.execute(
                f"SELECT {_STORE} FROM stores WHERE expires_at IS NOT NULL AND expires_at <= ? "
                "ORDER BY expires_at LIMIT ?",
                (now, limit),
            ).fetchall()
        )
        return [_store(r) for r in rows]

    async def store_count(self, tenant: str) -> int:
        (count,) = await self._db.run(
            lambda db: db.execute("SELECT count(*) FROM stores WHERE tenant = ?", (tenant,)).fetchone()
        )
        return int(count)

    async def aclose(self) -> None:
        await self._db.aclose()
