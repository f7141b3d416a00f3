"""The embedded chunk index: stdlib SQLite (FTS5 for keywords) and numpy for vectors.

Why this shape (figures in ``benchmarks/results/file_index.md``): this Python's ``sqlite3`` has
FTS5 but cannot load extensions, so a vector extension (``sqlite-vec``) would need a second SQLite
binding (``apsw``) for one brute-force scan that numpy does as fast over a matrix kept in memory.
So vectors are float32 BLOBs in the chunk rows, and each (tenant, store) gets a cached matrix of
them, built on the first search and dropped by every write to that store (a version number makes a
search that read before a write unable to install its stale matrix after it). The exact scan keeps
recall whatever the filter: the filter selects the allowed rows in SQL first (per file, since
attributes are per file), and only those rows are ranked.

Keywords: an FTS5 table over the chunk text (``unicode61``, diacritics folded). The user's text is
never FTS syntax: it is cut on whitespace into words, each word's letter/digit runs become one
quoted phrase (so ``get_user_by_id`` or ``ERR-4021`` match as written, in order), and the phrases are
OR-ed, at most :data:`MAX_QUERY_PHRASES` of them. BM25 ranks; the similarity is the score over the
best candidate's, in (0, 1].

Tenancy: the tenant is a column of every row, part of every unique key, and in every ``WHERE``;
ids from a request never reach another tenant's rows. Each tenant has its own FTS5 table, because
BM25 weighs a term by its rarity in the table: in a shared one, another tenant's text would move
this tenant's scores (a side channel on what others hold, and answers that change for no reason
the tenant can see).

Threads: every call runs off the event loop. Writes go through one connection under a lock, each
file in one ``BEGIN IMMEDIATE`` transaction; reads use one connection per worker thread, and WAL
lets them read while a write commits. An in-memory database (``path=None`` or ``":memory:"``) is
one connection, reads and writes under the same lock. One process per file: the matrix cache only
sees this process's writes (several replicas use the Postgres backend).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import math
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cache.files.index import AttributeValue, Candidate, Compound, Filter, NewChunk

__all__ = ["MAX_CANDIDATES", "MAX_QUERY_PHRASES", "SqliteChunkIndex", "fts_query"]

T = TypeVar("T")

#: most candidates one ``nearest``/``keyword`` call returns (``n`` above it is cut)
MAX_CANDIDATES = 1000
#: most phrases (whitespace-separated words) of a query's text that reach FTS5
MAX_QUERY_PHRASES = 32
#: most tokens in one phrase, and most characters of the text read for phrases
MAX_PHRASE_TOKENS = 16
MAX_QUERY_CHARS = 16_384
#: rows read per batch when a store is scanned without its cached matrix
SCAN_BATCH = 4096

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idx_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS idx_files (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    store_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    attributes TEXT NOT NULL DEFAULT '{}',
    UNIQUE (tenant, store_id, file_id)
);
CREATE INDEX IF NOT EXISTS idx_files_file ON idx_files (tenant, file_id);
CREATE TABLE IF NOT EXISTS idx_chunks (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    store_id TEXT NOT NULL,
    file_ref INTEGER NOT NULL REFERENCES idx_files (id),
    file_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_chunks_store ON idx_chunks (tenant, store_id, id);
CREATE INDEX IF NOT EXISTS idx_chunks_file ON idx_chunks (file_ref);
"""

#: one FTS5 table per tenant, named by a hash of the tenant (an identifier whatever the tenant is)
_FTS_TABLE = """
CREATE VIRTUAL TABLE IF NOT EXISTS {name} USING fts5 (
    text, content = 'idx_chunks', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2'
)
"""

_WORD = re.compile(r"\S+")
_RUN = re.compile(r"[^\W_]+")
_INT64 = (-(2**63), 2**63 - 1)


def fts_query(text: str) -> str | None:
    """``text`` as an FTS5 query that cannot be read as syntax: each whitespace-separated word's
    letter/digit runs as one double-quoted phrase, the phrases OR-ed (``None``: no word at all)."""
    phrases: list[str] = []
    seen: set[str] = set()
    for word in _WORD.finditer(text[:MAX_QUERY_CHARS]):
        runs = _RUN.findall(word.group())[:MAX_PHRASE_TOKENS]
        if not runs:
            continue
        phrase = " ".join(runs).lower()
        if phrase in seen:
            continue
        seen.add(phrase)
        phrases.append(f'"{phrase}"')  # runs hold letters and digits only: no quote to escape
        if len(phrases) >= MAX_QUERY_PHRASES:
            break
    return " OR ".join(phrases) if phrases else None


# -- filters as SQL over a file's attributes JSON ------------------------------------------------------


def _compile(flt: Filter, params: list[Any]) -> str:
    """``flt`` as a SQL expression over ``f.attributes`` that is 1 exactly when :func:`matches` is
    true (never NULL: a missing key is 0 for every comparison, and ``ne``/``nin`` negate that)."""
    if isinstance(flt, Compound):
        joiner = " AND " if flt.op == "and" else " OR "
        return "(" + joiner.join(_compile(f, params) for f in flt.filters) + ")"
    if flt.op in ("eq", "ne"):
        assert not isinstance(flt.value, tuple)
        equal = _equal(flt.key, flt.value, params)
        return equal if flt.op == "eq" else f"(NOT {equal})"
    if flt.op in ("in", "nin"):
        assert isinstance(flt.value, tuple)
        inside = "(" + " OR ".join(_equal(flt.key, v, params) for v in flt.value) + ")" if flt.value else "0"
        return inside if flt.op == "in" else f"(NOT {inside})"
    bound = flt.value
    assert isinstance(bound, int | float) and not isinstance(bound, bool)
    op = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}[flt.op]
    kind = _kind(flt.key, params)
    value = _value(flt.key, params)
    params.append(_number(bound))
    return f"COALESCE(({kind} IN ('integer', 'real') AND {value} {op} ?), 0)"


def _equal(key: str, want: AttributeValue, params: list[Any]) -> str:
    if isinstance(want, bool):
        return f"COALESCE(({_kind(key, params)} = '{'true' if want else 'false'}'), 0)"
    kind = _kind(key, params)
    value = _value(key, params)
    if isinstance(want, str):
        params.append(want)
        return f"COALESCE(({kind} = 'text' AND {value} = ?), 0)"
    params.append(_number(want))
    return f"COALESCE(({kind} IN ('integer', 'real') AND {value} = ?), 0)"


# The key is bound as a parameter: a JSON path when it can be quoted as one, else a lookup through
# ``json_each`` (a key with a double quote or a backslash).


def _kind(key: str, params: list[Any]) -> str:
    """SQL for the JSON type of ``key`` in ``f.attributes`` (NULL when missing)."""
    if '"' not in key and "\\" not in key:
        params.append(f'$."{key}"')
        return "json_type(f.attributes, ?)"
    params.append(key)
    return "(SELECT type FROM json_each(f.attributes) WHERE key = ?)"


def _value(key: str, params: list[Any]) -> str:
    """SQL for the value of ``key`` in ``f.attributes``."""
    if '"' not in key and "\\" not in key:
        params.append(f'$."{key}"')
        return "json_extract(f.attributes, ?)"
    params.append(key)
    return "(SELECT value FROM json_each(f.attributes) WHERE key = ?)"


def _number(value: int | float) -> int | float:
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        return float(value)  # SQLite integers are 64-bit
    return value


# -- the index -------------------------------------------------------------------------------------


class _Matrix:
    """One (tenant, store)'s vectors: row ids ascending and the float32 matrix in that order."""

    __slots__ = ("ids", "vectors")

    def __init__(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self.ids = ids
        self.vectors = vectors

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.vectors.nbytes)


class SqliteChunkIndex:
    """:class:`cache.files.index.ChunkIndex` in one SQLite file (or in memory)."""

    def __init__(
        self,
        path: str | Path | None,
        dims: int,
        *,
        cache_bytes: int = 512 * 1024 * 1024,
        timeout: float = 30.0,
    ) -> None:
        if dims <= 0:
            raise ValueError("dims must be positive")
        self.dims = dims
        self._cache_bytes = cache_bytes
        self._timeout = timeout
        self._memory = path is None or str(path) == ":memory:"
        self._path = ":memory:" if self._memory else str(path)
        self._write_lock = threading.Lock()
        self._writer = self._connect()
        self._writer.executescript(_SCHEMA)
        row = self._writer.execute("SELECT value FROM idx_meta WHERE key = 'dims'").fetchone()
        if row is None:
            self._writer.execute("INSERT INTO idx_meta (key, value) VALUES ('dims', ?)", (str(dims),))
        elif int(row[0]) != dims:
            self._writer.close()
            raise ValueError(f"{self._path} holds {row[0]}-dimensional vectors, not {dims}")
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], _Matrix] = OrderedDict()
        self._cache_used = 0
        self._versions: dict[tuple[str, str], int] = {}
        self._cache_lock = threading.Lock()
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None, timeout=self._timeout)
        if not self._memory:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        return db

    # -- running SQLite work off the loop ---------------------------------------------------------

    async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._write_lock:
                self._check_open()
                self._writer.execute("BEGIN IMMEDIATE")
                try:
                    result = work(self._writer)
                except BaseException:
                    self._writer.execute("ROLLBACK")
                    raise
                self._writer.execute("COMMIT")
                return result

        return await asyncio.to_thread(locked)

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            if self._memory:
                with self._write_lock:
                    self._check_open()
                    return work(self._writer)
            self._check_open()
            db: sqlite3.Connection | None = getattr(self._local, "db", None)
            if db is None:
                db = self._connect()
                with self._readers_lock:
                    self._readers.append(db)
                self._local.db = db
            db.execute("BEGIN")  # one snapshot for the whole call
            try:
                return work(db)
            finally:
                db.execute("COMMIT")

        return await asyncio.to_thread(run)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the chunk index is closed")

    def _changed(self, tenant: str, store_ids: Iterable[str]) -> None:
        """After a write commits: the stores' cached matrices are stale."""
        with self._cache_lock:
            for store_id in store_ids:
                key = (tenant, store_id)
                self._versions[key] = self._versions.get(key, 0) + 1
                dropped = self._cache.pop(key, None)
                if dropped is not None:
                    self._cache_used -= dropped.nbytes

    # -- writes ------------------------------------------------------------------------------------

    async def add(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        chunks: Sequence[NewChunk],
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        attrs = _attributes_json(attributes)
        rows = [(c.index, c.text, self._blob(c.vector)) for c in chunks]

        def write(db: sqlite3.Connection) -> None:
            _delete_file(db, tenant, store_id, file_id)
            cur = db.execute(
                "INSERT INTO idx_files (tenant, store_id, file_id, attributes) VALUES (?, ?, ?, ?)",
                (tenant, store_id, file_id, attrs),
            )
            ref = cur.lastrowid
            db.executemany(
                "INSERT INTO idx_chunks (tenant, store_id, file_ref, file_id, idx, text, vector)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(tenant, store_id, ref, file_id, i, t, v) for i, t, v in rows],
            )
            fts = _fts_table(tenant)
            db.execute(_FTS_TABLE.format(name=fts))
            db.execute(
                f"INSERT INTO {fts} (rowid, text) SELECT id, text FROM idx_chunks WHERE tenant = ? AND file_ref = ?",
                (tenant, ref),
            )

        try:
            await self._write(write)
        finally:
            self._changed(tenant, (store_id,))

    async def set_attributes(
        self, tenant: str, store_id: str, file_id: str, attributes: Mapping[str, AttributeValue]
    ) -> None:
        attrs = _attributes_json(attributes)
        await self._write(
            lambda db: db.execute(
                "UPDATE idx_files SET attributes = ? WHERE tenant = ? AND store_id = ? AND file_id = ?",
                (attrs, tenant, store_id, file_id),
            )
        )

    async def remove_file(self, tenant: str, store_id: str | None, file_id: str) -> int:
        def write(db: sqlite3.Connection) -> tuple[int, list[str]]:
            if store_id is not None:
                return _delete_file(db, tenant, store_id, file_id), [store_id]
            stores = [
                r[0]
                for r in db.execute(
                    "SELECT store_id FROM idx_files WHERE tenant = ? AND file_id = ?", (tenant, file_id)
                )
            ]
            return sum(_delete_file(db, tenant, s, file_id) for s in stores), stores

        removed, stores = await self._write(write)
        self._changed(tenant, stores)
        return removed

    async def remove_store(self, tenant: str, store_id: str) -> int:
        def write(db: sqlite3.Connection) -> int:
            _unindex(db, tenant, "store_id = ?", store_id)
            removed = db.execute(
                "DELETE FROM idx_chunks WHERE tenant = ? AND store_id = ?", (tenant, store_id)
            ).rowcount
            db.execute("DELETE FROM idx_files WHERE tenant = ? AND store_id = ?", (tenant, store_id))
            return int(removed)

        try:
            return await self._write(write)
        finally:
            self._changed(tenant, (store_id,))

    # -- reads -------------------------------------------------------------------------------------

    async def count(self, tenant: str, store_id: str | None = None) -> int:
        sql = "SELECT count(*) FROM idx_chunks WHERE tenant = ?"
        args: tuple[str, ...] = (tenant,)
        if store_id is not None:
            sql, args = sql + " AND store_id = ?", (tenant, store_id)
        return int(await self._read(lambda db: db.execute(sql, args).fetchone()[0]))

    async def nearest(
        self, tenant: str, store_ids: Sequence[str], vector: np.ndarray, n: int, flt: Filter | None
    ) -> list[Candidate]:
        n = min(n, MAX_CANDIDATES)
        stores = list(dict.fromkeys(store_ids))
        if n <= 0 or not stores:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != self.dims:
            raise ValueError(f"a query vector has {self.dims} dimensions, not {query.shape[0]}")
        norm = float(np.linalg.norm(query))
        if not math.isfinite(norm) or norm == 0.0:
            return []
        query = query / norm

        def work(db: sqlite3.Connection) -> list[Candidate]:
            best: list[tuple[float, int]] = []  # (similarity, row id), over every store
            for store_id in stores:
                allowed = None if flt is None else self._allowed(db, tenant, store_id, flt)
                if allowed is not None and allowed.size == 0:
                    continue
                matrix = self._matrix(db, tenant, store_id)
                if matrix is None:  # over the cache's budget: scan the rows in batches
                    for ids, vectors in self._batches(db, tenant, store_id):
                        best = _top(best, *_restrict(ids, vectors, allowed), query, n)
                else:
                    best = _top(best, *_restrict(matrix.ids, matrix.vectors, allowed), query, n)
            return self._candidates(db, tenant, best)

        return await self._read(work)

    async def keyword(
        self, tenant: str, store_ids: Sequence[str], text: str, n: int, flt: Filter | None
    ) -> list[Candidate]:
        n = min(n, MAX_CANDIDATES)
        stores = list(dict.fromkeys(store_ids))
        match = fts_query(text)
        if n <= 0 or not stores or match is None:
            return []
        params: list[Any] = [match, tenant, *stores, tenant, *stores]
        where = ""
        if flt is not None:
            where = " AND " + _compile(flt, params)
        params.append(n)
        marks = ", ".join("?" * len(stores))
        fts = _fts_table(tenant)
        sql = (
            f"SELECT c.id, -bm25({fts}) AS relevance FROM {fts} JOIN idx_chunks c ON c.id = {fts}.rowid"
            f" WHERE {fts} MATCH ? AND c.tenant = ? AND c.store_id IN ({marks})"
            f" AND c.file_ref IN (SELECT f.id FROM idx_files f WHERE f.tenant = ? AND f.store_id IN ({marks}){where})"
            " ORDER BY relevance DESC, c.id LIMIT ?"
        )

        def work(db: sqlite3.Connection) -> list[Candidate]:
            if not _has_table(db, fts):
                return []
            rows = db.execute(sql, params).fetchall()
            if not rows:
                return []
            top = max(float(rows[0][1]), 0.0)
            scored = [(float(r) / top if top > 0 else 0.0, int(i)) for i, r in rows]
            return self._candidates(db, tenant, scored)

        return await self._read(work)

    async def aclose(self) -> None:
        def close() -> None:
            with self._write_lock:
                if self._closed:
                    return
                self._closed = True
                with self._readers_lock:
                    for db in self._readers:
                        db.close()
                    self._readers.clear()
                self._writer.close()
            with self._cache_lock:
                self._cache.clear()
                self._cache_used = 0

        await asyncio.to_thread(close)

    # -- helpers -----------------------------------------------------------------------------------

    def _blob(self, vector: np.ndarray) -> bytes:
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        if v.shape[0] != self.dims:
            raise ValueError(f"a chunk's vector has {v.shape[0]} dimensions, not {self.dims}")
        norm = float(np.linalg.norm(v))
        if not math.isfinite(norm):
            raise ValueError("a chunk's vector is not finite")
        if norm > 0:
            v = v / norm
        return v.astype("<f4").tobytes()

    def _allowed(self, db: sqlite3.Connection, tenant: str, store_id: str, flt: Filter) -> np.ndarray:
        """The row ids of one store's chunks the filter lets through, ascending."""
        params: list[Any] = [tenant, store_id, tenant, store_id]
        cond = _compile(flt, params)
        rows = db.execute(
            "SELECT c.id FROM idx_chunks c WHERE c.tenant = ? AND c.store_id = ? AND c.file_ref IN"
            f" (SELECT f.id FROM idx_files f WHERE f.tenant = ? AND f.store_id = ? AND {cond}) ORDER BY c.id",
            params,
        ).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def _matrix(self, db: sqlite3.Connection, tenant: str, store_id: str) -> _Matrix | None:
        key = (tenant, store_id)
        with self._cache_lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
            version = self._versions.get(key, 0)
        (rows,) = db.execute(
            "SELECT count(*) FROM idx_chunks WHERE tenant = ? AND store_id = ?", (tenant, store_id)
        ).fetchone()
        if rows * (self.dims * 4 + 8) > self._cache_bytes:
            return None
        ids = np.empty(rows, dtype=np.int64)
        vectors = np.empty((rows, self.dims), dtype=np.float32)
        at = 0
        for batch_ids, batch in self._batches(db, tenant, store_id):
            ids[at : at + len(batch_ids)] = batch_ids
            vectors[at : at + len(batch_ids)] = batch
            at += len(batch_ids)
        built = _Matrix(ids[:at], vectors[:at])
        with self._cache_lock:
            if self._versions.get(key, 0) == version and key not in self._cache:  # no write since we read
                self._cache[key] = built
                self._cache_used += built.nbytes
                while self._cache_used > self._cache_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cache_used -= old.nbytes
        return built

    def _batches(self, db: sqlite3.Connection, tenant: str, store_id: str) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        cur = db.execute(
            "SELECT id, vector FROM idx_chunks WHERE tenant = ? AND store_id = ? ORDER BY id", (tenant, store_id)
        )
        while rows := cur.fetchmany(SCAN_BATCH):
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), self.dims)
            yield ids, vectors

    def _candidates(self, db: sqlite3.Connection, tenant: str, scored: Sequence[tuple[float, int]]) -> list[Candidate]:
        """The rows of ``scored`` (similarity, row id) as candidates, in that order; rows gone since
        (a write between the ranking and this read) are left out."""
        if not scored:
            return []
        ids = [i for _, i in scored]
        rows: dict[int, tuple[str, str, int, str, str]] = {}
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            for rid, store_id, file_id, idx, text, attrs in db.execute(
                "SELECT c.id, c.store_id, c.file_id, c.idx, c.text, f.attributes FROM idx_chunks c"
                " JOIN idx_files f ON f.id = c.file_ref"
                f" WHERE c.tenant = ? AND f.tenant = ? AND c.id IN ({', '.join('?' * len(part))})",
                [tenant, tenant, *part],
            ):
                rows[rid] = (store_id, file_id, idx, text, attrs)
        parsed: dict[str, Mapping[str, AttributeValue]] = {}
        out: list[Candidate] = []
        for similarity, rid in scored:
            row = rows.get(rid)
            if row is None:
                continue
            store_id, file_id, idx, text, attrs = row
            if attrs not in parsed:
                parsed[attrs] = json.loads(attrs)
            out.append(Candidate(store_id, file_id, idx, text, parsed[attrs], min(1.0, max(0.0, similarity))))
        return out


def _attributes_json(attributes: Mapping[str, AttributeValue]) -> str:
    for key, value in attributes.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float):
            raise ValueError(f"attribute {key!r} is not a string, number or boolean")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"attribute {key!r} is not a finite number")
    return json.dumps(dict(attributes), ensure_ascii=False, allow_nan=False)


def _delete_file(db: sqlite3.Connection, tenant: str, store_id: str, file_id: str) -> int:
    row = db.execute(
        "SELECT id FROM idx_files WHERE tenant = ? AND store_id = ? AND file_id = ?", (tenant, store_id, file_id)
    ).fetchone()
    if row is None:
        return 0
    _unindex(db, tenant, "file_ref = ?", row[0])
    removed = db.execute("DELETE FROM idx_chunks WHERE tenant = ? AND file_ref = ?", (tenant, row[0])).rowcount
    db.execute("DELETE FROM idx_files WHERE tenant = ? AND id = ?", (tenant, row[0]))
    return int(removed)


def _fts_table(tenant: str) -> str:
    return "idx_fts_" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _unindex(db: sqlite3.Connection, tenant: str, where: str, arg: Any) -> None:
    """Take the chunks ``where`` selects out of the tenant's FTS table (before they are deleted)."""
    fts = _fts_table(tenant)
    if _has_table(db, fts):
        db.execute(
            f"INSERT INTO {fts} ({fts}, rowid, text) SELECT 'delete', id, text FROM idx_chunks"
            f" WHERE tenant = ? AND {where}",
            (tenant, arg),
        )


def _restrict(ids: np.ndarray, vectors: np.ndarray, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows of (ids, vectors) whose id is in ``allowed`` (ascending; ``None``: all of them)."""
    if allowed is None or ids.size == 0:
        return ids, vectors
    at = np.searchsorted(ids, allowed)
    inside = at < ids.size
    at = at[inside]
    at = at[ids[at] == allowed[inside]]  # an allowed row the matrix lacks (written since) is left out
    return ids[at], vectors[at]


def _top(
    best: list[tuple[float, int]], ids: np.ndarray, vectors: np.ndarray, query: np.ndarray, n: int
) -> list[tuple[float, int]]:
    """The ``n`` best (similarity, id) of ``best`` and these rows, best first, ties by id."""
    if ids.size == 0:
        return best
    sims = vectors @ query
    if sims.size > n:
        keep = np.argpartition(-sims, n - 1)[:n]
        sims, ids = sims[keep], ids[keep]
    merged = best + [(float(s), int(i)) for s, i in zip(sims, ids, strict=True)]
    return heapq.nsmallest(n, merged, key=lambda si: (-si[0], si[1]))
