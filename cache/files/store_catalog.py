"""What the Vector Stores API knows, per tenant: the stores, the files attached to each (with their
ingestion status, attributes and chunking) and the batches that attached them. The chunks
themselves are in the chunk index (``cache.files.index``); the bytes in ``cache.files.blobs``.

The embedded backend is SQLite, Postgres serves several replicas: one implementation runs on both
(``cache.files.sql``). A store's file counts and bytes are computed from its
files' rows, so they can never drift from them; its status follows: ``in_progress`` while any file
is, else ``completed`` (``expired`` once its ``expires_at`` passed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from cache.files.sql import Row, Sql, SqlDb

__all__ = [
    "BatchRecord",
    "FileCounts",
    "FileStatus",
    "Page",
    "SqlStoreCatalog",
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
        owner: str | None = None,
    ) -> bool:
        """Set an ``in_progress`` file's outcome; False when it is no longer ``in_progress`` (cancelled,
        detached, re-attached meanwhile) or, with ``owner``, no longer leased to that owner."""
        ...

    async def set_attributes(self, tenant: str, store_id: str, file_id: str, attributes: Mapping[str, Any]) -> bool: ...
    async def detach(self, tenant: str, store_id: str, file_id: str) -> bool: ...
    async def stores_of_file(self, tenant: str, file_id: str) -> list[str]: ...
    async def create_batch(self, record: BatchRecord) -> None: ...
    async def get_batch(self, tenant: str, store_id: str, batch_id: str) -> BatchRecord | None: ...
    async def cancel_batch(self, tenant: str, store_id: str, batch_id: str) -> list[str]:
        """Mark the batch cancelled and its ``in_progress`` files ``cancelled``; their ids."""
        ...

    async def in_progress(self, limit: int, now_ms: int | None = None) -> list[StoreFileRecord]:
        """Files (any tenant) still ``in_progress``: ingestion a restart must take up again; with
        ``now_ms``, only those nobody holds a lease on (never claimed, or the lease lapsed)."""
        ...

    async def claim(
        self, tenant: str, store_id: str, file_id: str, owner: str, now_ms: int, until_ms: int
    ) -> StoreFileRecord | None:
        """Take the lease on ingesting an ``in_progress`` file until ``until_ms``: the file's record,
        or None when it is no longer ``in_progress`` or another owner's lease has not lapsed at
        ``now_ms``. One statement: of two replicas claiming at once, one gets it."""
        ...

    async def renew(self, tenant: str, store_id: str, file_id: str, owner: str, until_ms: int) -> bool:
        """Extend ``owner``'s lease; False when it is no longer the owner's (taken over, finished)."""
        ...

    async def expired_stores(self, now: int, limit: int) -> list[StoreRecord]: ...
    async def store_count(self, tenant: str) -> int: ...
    async def aclose(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS stores (
    seq SERIAL_KEY,
    tenant TEXT NOT NULL, id TEXT NOT NULL, name TEXT NOT NULL, description TEXT,
    created_at BIGINT NOT NULL, last_active_at BIGINT NOT NULL, metadata TEXT NOT NULL,
    expires_after_days BIGINT, expires_at BIGINT,
    UNIQUE (tenant, id)
);
CREATE INDEX IF NOT EXISTS stores_expiry ON stores (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS store_files (
    seq SERIAL_KEY,
    tenant TEXT NOT NULL, store_id TEXT NOT NULL, file_id TEXT NOT NULL,
    created_at BIGINT NOT NULL, status TEXT NOT NULL, attributes TEXT NOT NULL, chunking TEXT NOT NULL,
    usage_bytes BIGINT NOT NULL DEFAULT 0, last_error_code TEXT, last_error_message TEXT, batch_id TEXT,
    lease_owner TEXT, lease_until BIGINT NOT NULL DEFAULT 0,
    UNIQUE (tenant, store_id, file_id)
);
CREATE INDEX IF NOT EXISTS store_files_of_file ON store_files (tenant, file_id);
CREATE INDEX IF NOT EXISTS store_files_pending ON store_files (status) WHERE status = 'in_progress';
CREATE TABLE IF NOT EXISTS batches (
    tenant TEXT NOT NULL, store_id TEXT NOT NULL, id TEXT NOT NULL, created_at BIGINT NOT NULL,
    cancelled BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, store_id, id)
)
"""

_STORE = "id, tenant, name, created_at, last_active_at, metadata, expires_after_days, expires_at, description"
_FILE = (
    "store_id, file_id, tenant, created_at, status, attributes, chunking, usage_bytes, "
    "last_error_code, last_error_message, batch_id"
)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _store(row: Row) -> StoreRecord:
    return StoreRecord(
        row[0], row[1], row[2], int(row[3]), int(row[4]), json.loads(row[5]), _int(row[6]), _int(row[7]), row[8]
    )


def _file(row: Row) -> StoreFileRecord:
    return StoreFileRecord(
        row[0],
        row[1],
        row[2],
        int(row[3]),
        row[4],
        json.loads(row[5]),
        json.loads(row[6]),
        int(row[7]),
        row[8],
        row[9],
        row[10],
    )


async def _cursor_page(
    db: Sql,
    table: str,
    columns: str,
    where: list[str],
    args: list[Any],
    cursor: tuple[str, str] | None,
    limit: int,
    order: Order,
) -> tuple[list[Row], bool] | None:
    """Rows of ``table`` in ``seq`` order after (or before) the row whose id is ``cursor[1]`` (None
    when that row is not among ``where``'s: an empty page)."""
    where, args = list(where), list(args)
    ascending = order == "asc"
    if cursor is not None:
        direction, wanted = cursor
        column = "id" if table == "stores" else "file_id"
        row = await db.one(f"SELECT seq FROM {table} WHERE {' AND '.join(where)} AND {column} = ?", (*args, wanted))
        if row is None:
            return None
        forward = (direction == "after") == ascending
        where.append("seq > ?" if forward else "seq < ?")
        args.append(row[0])
        if direction == "before":  # the page just before the cursor, still in the order asked
            rows = await db.all(
                f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} "
                f"ORDER BY seq {'DESC' if ascending else 'ASC'} LIMIT ?",
                (*args, limit + 1),
            )
            return list(reversed(rows[:limit])), len(rows) > limit
    rows = await db.all(
        f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} "
        f"ORDER BY seq {'ASC' if ascending else 'DESC'} LIMIT ?",
        (*args, limit + 1),
    )
    return rows[:limit], len(rows) > limit


def _cursor(after: str | None, before: str | None) -> tuple[str, str] | None:
    return ("after", after) if after is not None else ("before", before) if before is not None else None


class SqlStoreCatalog:
    """The catalog of vector stores as tables (``cache.files.sql``): SQLite embedded, Postgres for
    replicas."""

    def __init__(self, db: SqlDb) -> None:
        self._db = db
        self._ready = False

    async def _setup(self) -> SqlDb:
        if not self._ready:
            await self._db.setup(_SCHEMA)
            await self._add_lease_columns()
            self._ready = True
        return self._db

    async def _add_lease_columns(self) -> None:
        """A catalog an earlier version created has no lease columns: they are added."""
        try:
            await self._db.all("SELECT lease_owner, lease_until FROM store_files WHERE 1 = 0")
            return
        except Exception:  # the columns are missing (sqlite3.OperationalError, psycopg's UndefinedColumn)
            pass
        guard = " IF NOT EXISTS" if self._db.dialect == "postgres" else ""  # replicas upgrading together
        await self._db.setup(
            f"ALTER TABLE store_files ADD COLUMN{guard} lease_owner TEXT;"
            f"ALTER TABLE store_files ADD COLUMN{guard} lease_until BIGINT NOT NULL DEFAULT 0"
        )

    async def create_store(self, record: StoreRecord, max_stores: int) -> None:
        db = await self._setup()

        async def create(conn: Sql) -> None:
            await db.serialize(conn, f"stores:{record.tenant}")
            row = await conn.one("SELECT count(*) FROM stores WHERE tenant = ?", (record.tenant,))
            if row is not None and int(row[0]) >= max_stores:
                raise StoresQuotaExceeded(max_stores)
            await conn.run(
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

        await db.atomic(create)

    async def get_store(self, tenant: str, store_id: str) -> StoreRecord | None:
        db = await self._setup()
        row = await db.one(f"SELECT {_STORE} FROM stores WHERE tenant = ? AND id = ?", (tenant, store_id))
        return _store(row) if row else None

    async def page_stores(
        self, tenant: str, *, after: str | None, before: str | None, limit: int, order: Order
    ) -> Page:
        db = await self._setup()
        got = await _cursor_page(db, "stores", _STORE, ["tenant = ?"], [tenant], _cursor(after, before), limit, order)
        return Page([], False) if got is None else Page([_store(r) for r in got[0]], got[1])

    async def update_store(self, record: StoreRecord) -> bool:
        db = await self._setup()
        changed = await db.run(
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
        return changed > 0

    async def delete_store(self, tenant: str, store_id: str) -> bool:
        db = await self._setup()

        async def delete(conn: Sql) -> bool:
            gone = await conn.run("DELETE FROM stores WHERE tenant = ? AND id = ?", (tenant, store_id))
            await conn.run("DELETE FROM store_files WHERE tenant = ? AND store_id = ?", (tenant, store_id))
            await conn.run("DELETE FROM batches WHERE tenant = ? AND store_id = ?", (tenant, store_id))
            return gone > 0

        return await db.atomic(delete)

    async def touch(self, tenant: str, store_id: str, now: int) -> None:
        db = await self._setup()
        await db.run(
            "UPDATE stores SET last_active_at = ?, expires_at = CASE WHEN expires_after_days IS NULL THEN NULL "
            "ELSE ? + expires_after_days * 86400 END WHERE tenant = ? AND id = ?",
            (now, now, tenant, store_id),
        )

    async def counts(self, tenant: str, store_id: str, batch_id: str | None = None) -> tuple[FileCounts, int]:
        db = await self._setup()
        where, args = "tenant = ? AND store_id = ?", [tenant, store_id]
        if batch_id is not None:
            where += " AND batch_id = ?"
            args.append(batch_id)
        by = {
            str(status): int(n)
            for status, n in await db.all(
                f"SELECT status, count(*) FROM store_files WHERE {where} GROUP BY status", args
            )
        }
        row = await db.one(
            f"SELECT coalesce(sum(usage_bytes), 0) FROM store_files WHERE {where} AND status = 'completed'", args
        )
        used = int(row[0]) if row else 0
        counts = FileCounts(
            by.get("in_progress", 0), by.get("completed", 0), by.get("failed", 0), by.get("cancelled", 0)
        )
        return counts, used

    async def attach(self, record: StoreFileRecord) -> None:
        db = await self._setup()

        async def attach(conn: Sql) -> None:
            await conn.run(
                "DELETE FROM store_files WHERE tenant = ? AND store_id = ? AND file_id = ?",
                (record.tenant, record.store_id, record.file_id),
            )
            await conn.run(
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

        await db.atomic(attach)

    async def get_file(self, tenant: str, store_id: str, file_id: str) -> StoreFileRecord | None:
        db = await self._setup()
        row = await db.one(
            f"SELECT {_FILE} FROM store_files WHERE tenant = ? AND store_id = ? AND file_id = ?",
            (tenant, store_id, file_id),
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
        db = await self._setup()
        where, args = ["tenant = ?", "store_id = ?"], [tenant, store_id]
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if batch_id is not None:
            where.append("batch_id = ?")
            args.append(batch_id)
        got = await _cursor_page(db, "store_files", _FILE, where, args, _cursor(after, before), limit, order)
        return Page([], False) if got is None else Page([_file(r) for r in got[0]], got[1])

    async def finish_file(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        status: FileStatus,
        usage_bytes: int = 0,
        error: tuple[str, str] | None = None,
        owner: str | None = None,
    ) -> bool:
        db = await self._setup()
        code, message = error if error is not None else (None, None)
        where, args = "", []
        if owner is not None:
            where, args = " AND lease_owner = ?", [owner]
        changed = await db.run(
            "UPDATE store_files SET status = ?, usage_bytes = ?, last_error_code = ?, last_error_message = ?, "
            "lease_owner = NULL, lease_until = 0 "
            f"WHERE tenant = ? AND store_id = ? AND file_id = ? AND status = 'in_progress'{where}",
            (status, usage_bytes, code, message, tenant, store_id, file_id, *args),
        )
        return changed > 0

    async def claim(
        self, tenant: str, store_id: str, file_id: str, owner: str, now_ms: int, until_ms: int
    ) -> StoreFileRecord | None:
        db = await self._setup()
        row = await db.one(
            "UPDATE store_files SET lease_owner = ?, lease_until = ? "
            "WHERE tenant = ? AND store_id = ? AND file_id = ? AND status = 'in_progress' "
            f"AND (lease_until <= ? OR lease_owner = ?) RETURNING {_FILE}",
            (owner, until_ms, tenant, store_id, file_id, now_ms, owner),
        )
        return _file(row) if row else None

    async def renew(self, tenant: str, store_id: str, file_id: str, owner: str, until_ms: int) -> bool:
        db = await self._setup()
        changed = await db.run(
            "UPDATE store_files SET lease_until = ? "
            "WHERE tenant = ? AND store_id = ? AND file_id = ? AND status = 'in_progress' AND lease_owner = ?",
            (until_ms, tenant, store_id, file_id, owner),
        )
        return changed > 0

    async def set_attributes(self, tenant: str, store_id: str, file_id: str, attributes: Mapping[str, Any]) -> bool:
        db = await self._setup()
        changed = await db.run(
            "UPDATE store_files SET attributes = ? WHERE tenant = ? AND store_id = ? AND file_id = ?",
            (json.dumps(dict(attributes)), tenant, store_id, file_id),
        )
        return changed > 0

    async def detach(self, tenant: str, store_id: str, file_id: str) -> bool:
        db = await self._setup()
        changed = await db.run(
            "DELETE FROM store_files WHERE tenant = ? AND store_id = ? AND file_id = ?", (tenant, store_id, file_id)
        )
        return changed > 0

    async def stores_of_file(self, tenant: str, file_id: str) -> list[str]:
        db = await self._setup()
        rows = await db.all("SELECT store_id FROM store_files WHERE tenant = ? AND file_id = ?", (tenant, file_id))
        return [str(r[0]) for r in rows]

    async def create_batch(self, record: BatchRecord) -> None:
        db = await self._setup()
        await db.run(
            "INSERT INTO batches (tenant, store_id, id, created_at, cancelled) VALUES (?, ?, ?, ?, ?)",
            (record.tenant, record.store_id, record.id, record.created_at, int(record.cancelled)),
        )

    async def get_batch(self, tenant: str, store_id: str, batch_id: str) -> BatchRecord | None:
        db = await self._setup()
        row = await db.one(
            "SELECT id, store_id, tenant, created_at, cancelled FROM batches "
            "WHERE tenant = ? AND store_id = ? AND id = ?",
            (tenant, store_id, batch_id),
        )
        return BatchRecord(row[0], row[1], row[2], int(row[3]), bool(row[4])) if row else None

    async def cancel_batch(self, tenant: str, store_id: str, batch_id: str) -> list[str]:
        db = await self._setup()

        async def cancel(conn: Sql) -> list[str]:
            await conn.run(
                "UPDATE batches SET cancelled = 1 WHERE tenant = ? AND store_id = ? AND id = ?",
                (tenant, store_id, batch_id),
            )
            rows = await conn.all(
                "UPDATE store_files SET status = 'cancelled' WHERE tenant = ? AND store_id = ? AND batch_id = ? "
                "AND status = 'in_progress' RETURNING file_id",
                (tenant, store_id, batch_id),
            )
            return [str(r[0]) for r in rows]

        return await db.atomic(cancel)

    async def in_progress(self, limit: int, now_ms: int | None = None) -> list[StoreFileRecord]:
        db = await self._setup()
        lapsed, args = ("", []) if now_ms is None else (" AND lease_until <= ?", [now_ms])
        rows = await db.all(
            f"SELECT {_FILE} FROM store_files WHERE status = 'in_progress'{lapsed} ORDER BY seq LIMIT ?",
            (*args, limit),
        )
        return [_file(r) for r in rows]

    async def expired_stores(self, now: int, limit: int) -> list[StoreRecord]:
        db = await self._setup()
        rows = await db.all(
            f"SELECT {_STORE} FROM stores WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?",
            (now, limit),
        )
        return [_store(r) for r in rows]

    async def store_count(self, tenant: str) -> int:
        db = await self._setup()
        row = await db.one("SELECT count(*) FROM stores WHERE tenant = ?", (tenant,))
        return int(row[0]) if row else 0

    async def aclose(self) -> None:
        await self._db.aclose()
