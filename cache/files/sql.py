"""One small async SQL surface over the two databases the file stores run on — SQLite (embedded, one
process) and Postgres (shared by replicas) — so that each catalog is written once
(``cache.files.catalog``, ``cache.files.store_catalog``) and runs on both.

Queries are written with ``?`` placeholders and portable SQL (``RETURNING``, partial indexes,
``coalesce``); :class:`PostgresSql` turns the placeholders into psycopg's. Only a table's DDL
differs (:meth:`SqlDb.ddl`: an auto-increment column). Numbers come back as Python ints on both
(Postgres' ``sum(bigint)`` is a ``numeric``: the callers ``int()`` what they sum).

:meth:`SqlDb.atomic` runs several statements as one transaction (a quota check and its insert):
SQLite under ``BEGIN IMMEDIATE`` with the database's one connection held for the whole
transaction; Postgres in a transaction on one pooled connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

__all__ = ["PostgresSql", "Row", "Sql", "SqlDb", "SqliteSql"]

T = TypeVar("T")
Row = tuple[Any, ...]


class Sql(Protocol):
    """Statements on one connection (a transaction's, or any)."""

    async def all(self, query: str, args: Sequence[Any] = ()) -> list[Row]: ...

    async def one(self, query: str, args: Sequence[Any] = ()) -> Row | None: ...

    async def run(self, query: str, args: Sequence[Any] = ()) -> int:
        """Execute; the rows it changed."""
        ...


class SqlDb(Sql, Protocol):
    dialect: Literal["sqlite", "postgres"]

    def ddl(self, statements: str) -> str:
        """``statements`` with ``SERIAL_KEY`` as this database's auto-increment primary key."""
        ...

    async def setup(self, schema: str) -> None:
        """Create the tables (idempotent; on Postgres serialised between replicas)."""
        ...

    async def atomic(self, steps: Callable[[Sql], Awaitable[T]]) -> T: ...

    async def serialize(self, conn: Sql, key: str) -> None:
        """Inside :meth:`atomic`: no other transaction serialising on ``key`` (a tenant) runs until
        this one ends. SQLite's ``BEGIN IMMEDIATE`` already serialises every write transaction;
        Postgres takes a transaction-scoped advisory lock on the key's hash."""
        ...

    async def aclose(self) -> None: ...


# -- SQLite ------------------------------------------------------------------------------------------


class _SqliteConn:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    async def all(self, query: str, args: Sequence[Any] = ()) -> list[Row]:
        return await asyncio.to_thread(lambda: self._db.execute(query, tuple(args)).fetchall())

    async def one(self, query: str, args: Sequence[Any] = ()) -> Row | None:
        row: Row | None = await asyncio.to_thread(lambda: self._db.execute(query, tuple(args)).fetchone())
        return row

    async def run(self, query: str, args: Sequence[Any] = ()) -> int:
        return await asyncio.to_thread(lambda: self._db.execute(query, tuple(args)).rowcount)


class SqliteSql:
    """One SQLite database (WAL) and its one connection, used by one statement or transaction at a
    time (an asyncio lock; the statements run in threads, off the event loop)."""

    dialect: Literal["sqlite", "postgres"] = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._conn = _SqliteConn(self._db)
        self._lock = asyncio.Lock()
        self._thread_lock = threading.Lock()

    def ddl(self, statements: str) -> str:
        return statements.replace("SERIAL_KEY", "INTEGER PRIMARY KEY AUTOINCREMENT")

    async def setup(self, schema: str) -> None:
        async with self._lock:
            await asyncio.to_thread(self._db.executescript, self.ddl(schema))

    async def all(self, query: str, args: Sequence[Any] = ()) -> list[Row]:
        async with self._lock:
            return await self._conn.all(query, args)

    async def one(self, query: str, args: Sequence[Any] = ()) -> Row | None:
        async with self._lock:
            return await self._conn.one(query, args)

    async def run(self, query: str, args: Sequence[Any] = ()) -> int:
        async with self._lock:
            return await self._conn.run(query, args)

    async def atomic(self, steps: Callable[[Sql], Awaitable[T]]) -> T:
        async with self._lock:
            await self._conn.run("BEGIN IMMEDIATE")
            try:
                result = await steps(self._conn)
            except BaseException:
                await self._conn.run("ROLLBACK")
                raise
            await self._conn.run("COMMIT")
            return result

    async def serialize(self, conn: Sql, key: str) -> None:
        return None

    async def aclose(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self._db.close)


# -- Postgres ----------------------------------------------------------------------------------------

#: the advisory lock that serialises schema creation between replicas starting at once
_SCHEMA_LOCK = 0x72657370_66696C65  # "respfile"


def _pg(query: str) -> str:
    """``?`` placeholders as psycopg's (no query here has a literal ``?`` or ``%``)."""
    return query.replace("%", "%%").replace("?", "%s")


class _PgConn:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def all(self, query: str, args: Sequence[Any] = ()) -> list[Row]:
        cur = await self._conn.execute(_pg(query), tuple(args))
        return list(await cur.fetchall()) if cur.description is not None else []

    async def one(self, query: str, args: Sequence[Any] = ()) -> Row | None:
        cur = await self._conn.execute(_pg(query), tuple(args))
        row: Row | None = await cur.fetchone() if cur.description is not None else None
        return row

    async def run(self, query: str, args: Sequence[Any] = ()) -> int:
        cur = await self._conn.execute(_pg(query), tuple(args))
        return int(cur.rowcount)


class PostgresSql:
    """A Postgres database through a bounded pool (psycopg 3), opened on first use; every statement
    under ``statement_timeout``."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, dsn: str, *, pool_size: int = 8, timeout_s: float = 10.0, statement_timeout_s: float = 30.0):
        self._dsn = dsn
        self._pool_size = pool_size
        self._timeout = timeout_s
        self._statement_ms = max(1, int(statement_timeout_s * 1000))
        self._pool: Any = None
        self._opening = asyncio.Lock()

    def ddl(self, statements: str) -> str:
        return statements.replace("SERIAL_KEY", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY")

    async def _configure(self, conn: Any) -> None:
        await conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{self._statement_ms}ms",))
        await conn.commit()

    async def _ready(self) -> Any:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    from psycopg_pool import AsyncConnectionPool

                    pool = AsyncConnectionPool(
                        self._dsn,
                        min_size=1,
                        max_size=self._pool_size,
                        timeout=self._timeout,
                        configure=self._configure,
                        open=False,
                    )
                    await pool.open(wait=True, timeout=self._timeout)
                    self._pool = pool
        return self._pool

    @asynccontextmanager
    async def _conn(self, transaction: bool) -> AsyncIterator[_PgConn]:
        pool = await self._ready()
        async with pool.connection() as conn:
            if transaction:
                async with conn.transaction():
                    yield _PgConn(conn)
            else:
                await conn.set_autocommit(True)
                try:
                    yield _PgConn(conn)
                finally:
                    await conn.set_autocommit(False)

    async def setup(self, schema: str) -> None:
        async with self._conn(True) as conn:
            await conn.run("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            for statement in (s.strip() for s in self.ddl(schema).split(";")):
                if statement:
                    await conn.run(statement)

    async def all(self, query: str, args: Sequence[Any] = ()) -> list[Row]:
        async with self._conn(False) as conn:
            return await conn.all(query, args)

    async def one(self, query: str, args: Sequence[Any] = ()) -> Row | None:
        async with self._conn(False) as conn:
            return await conn.one(query, args)

    async def run(self, query: str, args: Sequence[Any] = ()) -> int:
        async with self._conn(False) as conn:
            return await conn.run(query, args)

    async def atomic(self, steps: Callable[[Sql], Awaitable[T]]) -> T:
        async with self._conn(True) as conn:
            return await steps(conn)

    async def serialize(self, conn: Sql, key: str) -> None:
        await conn.run("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
