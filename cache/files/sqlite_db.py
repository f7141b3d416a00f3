"""One SQLite database used from the event loop: a connection, a lock, every call in a thread.

Why: the embedded catalogs (files, vector stores) are a few indexed rows per call, too little to
pool connections for, but each call still blocks on disk; running it in a thread keeps the loop
free, and the lock keeps one connection safe across threads. WAL lets readers run while a write
commits; autocommit unless a call opens a transaction (``BEGIN IMMEDIATE`` for check-then-write
steps such as a quota check and its insert).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["SqliteDb"]

T = TypeVar("T")


class SqliteDb:
    def __init__(self, path: str | Path, schema: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(schema)

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work(connection)`` in a thread, alone on the connection."""

        def locked() -> T:
            with self._lock:
                return work(self._db)

        return await asyncio.to_thread(locked)

    async def transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` inside ``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back when it raises)."""

        def within(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                result = work(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return result

        return await self.run(within)

    async def aclose(self) -> None:
        await self.run(lambda db: db.close())
