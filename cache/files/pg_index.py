"""The shared chunk index: Postgres with pgvector, for several replicas on one database.

Why this shape (figures in ``benchmarks/results/file_index_pg.md``):

- **One table** of chunks keyed by (tenant, store_id, file_id, idx), each row with its text, its
  file's attributes (``jsonb``, copied into every chunk of the file so a filter never needs a
  join), its vector (``vector(dims)``, L2-normalised) and a generated ``tsvector`` of the text.
  Indexes: HNSW with cosine ops on the vectors, GIN on the ``tsvector``, the primary key for a
  store's rows, (tenant, file_id) for removing a file from every store.
- **Vectors**: a candidate set (the tenant's rows in the asked stores) of at most ``exact_rows``
  rows is ranked exactly (a scan of those rows: the answers are the embedded backend's, and a
  selective filter loses nothing); a larger one goes through HNSW with pgvector's iterative scan
  (``hnsw.iterative_scan``), which keeps walking the graph until enough rows pass the tenant,
  store and attribute conditions, then the few found are put back in exact distance order.
- **Keywords**: the query text is never tsquery syntax. It is cut on whitespace into words (at
  most :data:`MAX_QUERY_WORDS`, from the first :data:`MAX_QUERY_CHARS` characters); each word goes
  to ``phraseto_tsquery`` as a parameter (so ``get_user_by_id`` is the phrase get-user-by-id, as
  the parser cut the chunk's text), and the words are OR-ed: ``websearch_to_tsquery`` and
  ``plainto_tsquery`` AND every word, and a question phrased in other words than the chunk then
  finds nothing (measured: recall in the benchmark). ``ts_rank_cd`` (cover density, normalised by
  the log of the chunk's length) ranks; the similarity is the score over the best candidate's,
  in (0, 1], as in the embedded backend. ``ts_rank_cd`` uses no corpus statistics, so one table
  for every tenant leaks nothing between them through scores (BM25's term rarity would).
- **Filters** compile to parameterised SQL over the ``jsonb`` that is true exactly when
  :func:`cache.files.index.matches` is: equality is ``jsonb`` equality (type-exact: ``1`` is not
  ``"1"`` nor ``true``; ``1`` is ``1.0``), order comparisons check ``jsonb_typeof = 'number'``
  first, every comparison is wrapped so a missing key is false rather than NULL (``ne``/``nin``
  negate that). Numbers travel as JSON text, so both sides are the same decimal.
- **Tenancy**: the tenant is part of the key and in every ``WHERE``; ids from a request never
  reach another tenant's rows.
- **Bounds**: a pool of at most ``pool_size`` connections (a caller waits at most
  ``pool_timeout`` for one; each is checked before it is lent, so a server restart costs no
  request), ``statement_timeout`` and ``lock_timeout`` on every connection,
  at most :data:`MAX_CANDIDATES` rows a call.
- **Replicas**: every write is one transaction; re-adding the same file from two replicas at once
  is serialised by an advisory lock on (tenant, store, file); the schema is created under an
  advisory lock, so replicas starting together do not race on ``CREATE``.

The database wants a UTF-8 locale (``C.UTF-8`` or a language's): under ``C`` the text search parser
does not lower-case non-ASCII letters, so ``Ü`` would not find ``ü`` (a warning says so at start).

Text Postgres cannot hold: a NUL character in chunk text is stored as U+FFFD (one character for
one, so offsets stay right); an id, key or value with a NUL cannot exist here, so it matches
nothing (attributes with one are refused on write).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from cache.files.index import AttributeValue, Candidate, Compound, Filter, NewChunk

__all__ = ["MAX_CANDIDATES", "MAX_QUERY_CHARS", "MAX_QUERY_WORDS", "PgChunkIndex", "query_words"]

#: most candidates one ``nearest``/``keyword`` call returns (``n`` above it is cut)
MAX_CANDIDATES = 1000
#: most whitespace-separated words of a query that reach ``phraseto_tsquery``
MAX_QUERY_WORDS = 32
#: most characters of a query's text read for words, and of one word
MAX_QUERY_CHARS = 16_384
MAX_WORD_CHARS = 256
#: the text search configuration of the ``tsvector`` column and the queries (stemmed English)
TEXT_CONFIG = "english"

_log = logging.getLogger(__name__)

_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,40}")
_WORD = re.compile(r"\S+")
#: one advisory lock key for schema creation, whatever the table (replicas starting together)
_SCHEMA_LOCK = 0x7265_7370_6761_7465  # "respgate"


def query_words(text: str) -> list[str]:
    """The words of ``text`` that become phrase queries: whitespace-separated, each cut to
    :data:`MAX_WORD_CHARS`, deduplicated ignoring case, at most :data:`MAX_QUERY_WORDS`; NULs and
    unpaired surrogates (which Postgres cannot take) dropped."""
    words: list[str] = []
    seen: set[str] = set()
    clean = text[:MAX_QUERY_CHARS].replace("\x00", " ").encode("utf-8", "ignore").decode("utf-8")
    for match in _WORD.finditer(clean):
        word = match.group()[:MAX_WORD_CHARS]
        folded = word.casefold()
        if folded in seen:
            continue
        seen.add(folded)
        words.append(word)
        if len(words) >= MAX_QUERY_WORDS:
            break
    return words


# -- filters as SQL over a chunk's attributes (jsonb) ----------------------------------------------

_FALSE = sql.SQL("false")
_TRUE = sql.SQL("true")


def compile_filter(flt: Filter, params: list[Any]) -> sql.Composable:
    """``flt`` as a SQL expression over ``attributes`` that is true exactly when :func:`matches`
    is (never NULL); values and keys go to ``params``, never into the SQL text."""
    if isinstance(flt, Compound):
        joiner = sql.SQL(" AND " if flt.op == "and" else " OR ")
        return sql.SQL("({})").format(joiner.join(compile_filter(f, params) for f in flt.filters))
    negate = flt.op in ("ne", "nin")
    if "\x00" in flt.key:  # no stored key has one: the key is missing
        return _TRUE if negate else _FALSE
    if flt.op in ("eq", "ne", "in", "nin"):
        values = flt.value if isinstance(flt.value, tuple) else (flt.value,)
        wanted = [Jsonb(v) for v in values if not (isinstance(v, str) and "\x00" in v)]
        if not wanted:
            inside: sql.Composable = _FALSE
        elif len(wanted) == 1:
            params.extend((flt.key, wanted[0]))
            inside = sql.SQL("coalesce((attributes -> %s) = %s::jsonb, false)")
        else:
            params.extend((flt.key, wanted))
            inside = sql.SQL("coalesce((attributes -> %s) = any(%s::jsonb[]), false)")
        return sql.SQL("(NOT {})").format(inside) if negate else inside
    bound = flt.value
    assert isinstance(bound, int | float) and not isinstance(bound, bool)
    op = sql.SQL({"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}[flt.op])
    params.extend((flt.key, flt.key, Jsonb(bound)))
    return sql.SQL(
        "coalesce(jsonb_typeof(attributes -> %s) = 'number' AND (attributes -> %s) {} %s::jsonb, false)"
    ).format(op)


# -- the index -------------------------------------------------------------------------------------


class PgChunkIndex:
    """:class:`cache.files.index.ChunkIndex` in a Postgres database with pgvector. Connects on
    first use (the constructor does no I/O); :meth:`aclose` closes the pool."""

    def __init__(
        self,
        dsn: str,
        dims: int,
        *,
        table: str = "file_chunks",
        pool_size: int = 10,
        pool_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        exact_rows: int = 20_000,
        ef_search: int = 200,
        hnsw_m: int = 16,
        hnsw_ef_construction: int = 64,
    ) -> None:
        if dims <= 0 or dims > 16_000:
            raise ValueError("dims must be between 1 and 16000 (pgvector's vector type)")
        if not _IDENT.fullmatch(table):
            raise ValueError("table must be a lowercase SQL identifier")
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.dims = dims
        self._dsn = dsn
        self._table = table
        self._pool_size = pool_size
        self._pool_timeout = pool_timeout
        self._statement_ms = max(1, int(statement_timeout * 1000))
        self._exact_rows = exact_rows
        self._ef_search = max(1, min(1000, ef_search))
        self._hnsw = (hnsw_m, hnsw_ef_construction)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        t = sql.Identifier(table)
        self._t = t

    # -- connections -------------------------------------------------------------------------------

    async def _ready(self) -> AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]]:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._closed:
                raise RuntimeError("the chunk index is closed")
            if self._pool is None:
                await self._create_schema()
                pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
                    self._dsn,
                    min_size=1,
                    max_size=self._pool_size,
                    timeout=self._pool_timeout,
                    configure=self._configure,
                    check=AsyncConnectionPool.check_connection,  # a connection a restart broke is not lent
                    open=False,
                )
                await pool.open(wait=True, timeout=self._pool_timeout)
                self._pool = pool
        return self._pool

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await register_vector_async(conn)
        await conn.execute(
            "SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
            (f"{self._statement_ms}ms", f"{self._statement_ms}ms"),
        )
        await conn.commit()

    async def _create_schema(self) -> None:
        t = self._t
        name = self._table
        hnsw_m, hnsw_ef = self._hnsw
        statements: list[sql.SQL | sql.Composed] = [
            sql.SQL("CREATE EXTENSION IF NOT EXISTS vector"),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {t} ("
                " tenant text NOT NULL, store_id text NOT NULL, file_id text NOT NULL, idx integer NOT NULL,"
                " text text NOT NULL, attributes jsonb NOT NULL DEFAULT '{{}}'::jsonb,"
                " embedding vector({dims}) NOT NULL,"
                " tsv tsvector GENERATED ALWAYS AS (to_tsvector({cfg}::regconfig, text)) STORED,"
                " PRIMARY KEY (tenant, store_id, file_id, idx))"
            ).format(t=t, dims=sql.Literal(self.dims), cfg=sql.Literal(TEXT_CONFIG)),
            sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (tenant, file_id)").format(
                i=sql.Identifier(f"{name}_file"), t=t
            ),
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {i} ON {t} USING hnsw (embedding vector_cosine_ops)"
                " WITH (m = {m}, ef_construction = {ef})"
            ).format(i=sql.Identifier(f"{name}_hnsw"), t=t, m=sql.Literal(hnsw_m), ef=sql.Literal(hnsw_ef)),
            sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} USING gin (tsv)").format(
                i=sql.Identifier(f"{name}_tsv"), t=t
            ),
        ]
        async with await psycopg.AsyncConnection.connect(
            self._dsn, connect_timeout=max(1, int(self._pool_timeout))
        ) as conn:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in statements:
                    await conn.execute(statement)
                row = await (
                    await conn.execute(
                        "SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'embedding'",
                        (name,),
                    )
                ).fetchone()
            if row is None or int(row[0]) != self.dims:
                raise ValueError(f"table {name} holds {row[0] if row else '?'}-dimensional vectors, not {self.dims}")
            ctype = await (
                await conn.execute(
                    "SELECT coalesce(to_jsonb(d) ->> 'datlocprovider', 'c'), lower(datctype) FROM pg_database d"
                    " WHERE datname = current_database()"
                )
            ).fetchone()
            if ctype and ctype[0] == "c" and ctype[1] in ("c", "posix"):  # libc's C (builtin and ICU fold case)
                _log.warning(
                    "database %s has LC_CTYPE %s: keyword search will not fold the case of non-ASCII letters"
                    " (create it with a UTF-8 locale, e.g. C.UTF-8)",
                    conn.info.dbname,
                    ctype[1],
                )

    # -- writes ------------------------------------------------------------------------------------

    async def add(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        chunks: Sequence[NewChunk],
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        attrs = _attributes(attributes)
        _check_ids(tenant, store_id, file_id)
        rows = [
            (tenant, store_id, file_id, c.index, c.text.replace("\x00", "\ufffd"), attrs, self._vector(c.vector))
            for c in chunks
        ]
        pool = await self._ready()
        async with pool.connection() as conn:
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (json.dumps([tenant, store_id, file_id]),),
                )
                await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE tenant = %s AND store_id = %s AND file_id = %s").format(self._t),
                    (tenant, store_id, file_id),
                )
                if rows:
                    cur = conn.cursor()
                    copy_sql = sql.SQL(
                        "COPY {} (tenant, store_id, file_id, idx, text, attributes, embedding)"
                        " FROM STDIN (FORMAT BINARY)"
                    ).format(self._t)
                    async with cur.copy(copy_sql) as copy:
                        copy.set_types(["text", "text", "text", "int4", "text", "jsonb", "vector"])
                        for row in rows:
                            await copy.write_row(row)

    async def set_attributes(
        self, tenant: str, store_id: str, file_id: str, attributes: Mapping[str, AttributeValue]
    ) -> None:
        attrs = _attributes(attributes)
        if not _storable(tenant, store_id, file_id):
            return
        await self._execute(
            sql.SQL("UPDATE {} SET attributes = %s WHERE tenant = %s AND store_id = %s AND file_id = %s").format(
                self._t
            ),
            (attrs, tenant, store_id, file_id),
        )

    async def remove_file(self, tenant: str, store_id: str | None, file_id: str) -> int:
        if not _storable(tenant, store_id or "", file_id):
            return 0
        if store_id is None:
            query = sql.SQL("DELETE FROM {} WHERE tenant = %s AND file_id = %s").format(self._t)
            return await self._execute(query, (tenant, file_id))
        query = sql.SQL("DELETE FROM {} WHERE tenant = %s AND store_id = %s AND file_id = %s").format(self._t)
        return await self._execute(query, (tenant, store_id, file_id))

    async def remove_store(self, tenant: str, store_id: str) -> int:
        if not _storable(tenant, store_id):
            return 0
        query = sql.SQL("DELETE FROM {} WHERE tenant = %s AND store_id = %s").format(self._t)
        return await self._execute(query, (tenant, store_id))

    async def _execute(self, query: sql.Composed, params: Sequence[Any]) -> int:
        pool = await self._ready()
        async with pool.connection() as conn:
            cur = await conn.execute(query, params)
            return max(0, cur.rowcount)

    # -- reads -------------------------------------------------------------------------------------

    async def count(self, tenant: str, store_id: str | None = None) -> int:
        if not _storable(tenant, store_id or ""):
            return 0
        if store_id is None:
            query = sql.SQL("SELECT count(*) FROM {} WHERE tenant = %s").format(self._t)
            params: tuple[str, ...] = (tenant,)
        else:
            query = sql.SQL("SELECT count(*) FROM {} WHERE tenant = %s AND store_id = %s").format(self._t)
            params = (tenant, store_id)
        pool = await self._ready()
        async with pool.connection() as conn:
            row = await (await conn.execute(query, params)).fetchone()
        return int(row[0]) if row else 0

    async def nearest(
        self, tenant: str, store_ids: Sequence[str], vector: np.ndarray, n: int, flt: Filter | None
    ) -> list[Candidate]:
        n = min(n, MAX_CANDIDATES)
        stores = _stores(store_ids)
        if n <= 0 or not stores or not _storable(tenant):
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != self.dims:
            raise ValueError(f"a query vector has {self.dims} dimensions, not {query.shape[0]}")
        norm = float(np.linalg.norm(query))
        if not math.isfinite(norm) or norm == 0.0:
            return []
        query = query / norm
        params: list[Any] = [tenant, stores]
        where: sql.Composable = sql.SQL("tenant = %s AND store_id = any(%s)")
        if flt is not None:
            where = sql.SQL("{} AND {}").format(where, compile_filter(flt, params))
        pool = await self._ready()
        async with pool.connection() as conn:
            async with conn.transaction():
                large = await self._larger_than(conn, where, params, self._exact_rows)
                if large:
                    # HNSW, walking on until n rows pass the conditions (re-sorted below)
                    await conn.execute(
                        "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),"
                        " set_config('hnsw.ef_search', %s, true)",
                        (str(max(self._ef_search, min(n, 1000))),),
                    )
                    top = sql.SQL(
                        "SELECT store_id, file_id, idx, embedding <=> %s AS distance FROM {t} WHERE {where}"
                        " ORDER BY embedding <=> %s LIMIT %s"
                    ).format(t=self._t, where=where)
                    args = [query, *params, query, n, tenant]
                else:
                    # every row's exact distance, a top-n sort of keys only ("+ 0": not an order HNSW gives)
                    top = sql.SQL(
                        "SELECT store_id, file_id, idx, (embedding <=> %s) + 0 AS distance FROM {t} WHERE {where}"
                        " ORDER BY distance, store_id, file_id, idx LIMIT %s"
                    ).format(t=self._t, where=where)
                    args = [query, *params, n, tenant]
                statement = sql.SQL(
                    "SELECT c.store_id, c.file_id, c.idx, c.text, c.attributes, top.distance FROM ({top}) top"
                    " JOIN {t} c ON c.tenant = %s AND c.store_id = top.store_id AND c.file_id = top.file_id"
                    " AND c.idx = top.idx ORDER BY top.distance, top.store_id, top.file_id, top.idx"
                ).format(top=top, t=self._t)
                rows = await (await conn.execute(statement, args)).fetchall()
        return [Candidate(s, f, i, text, attrs, _similarity(distance)) for s, f, i, text, attrs, distance in rows]

    async def _larger_than(
        self, conn: psycopg.AsyncConnection[Any], where: sql.Composable, params: list[Any], limit: int
    ) -> bool:
        """Whether more than ``limit`` chunks pass ``where`` (counted up to ``limit + 1``)."""
        statement = sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE {} LIMIT %s) s").format(self._t, where)
        row = await (await conn.execute(statement, [*params, limit + 1])).fetchone()
        return bool(row and int(row[0]) > limit)

    async def keyword(
        self, tenant: str, store_ids: Sequence[str], text: str, n: int, flt: Filter | None
    ) -> list[Candidate]:
        n = min(n, MAX_CANDIDATES)
        stores = _stores(store_ids)
        words = query_words(text)
        if n <= 0 or not stores or not words or not _storable(tenant):
            return []
        cfg = sql.Literal(TEXT_CONFIG)
        tsquery = sql.SQL(" || ").join(sql.SQL("phraseto_tsquery({}::regconfig, %s)").format(cfg) for _ in words)
        params: list[Any] = [*words, tenant, stores]
        where: sql.Composable = sql.SQL("tenant = %s AND store_id = any(%s) AND tsv @@ q.query")
        if flt is not None:
            where = sql.SQL("{} AND {}").format(where, compile_filter(flt, params))
        params.append(n)
        statement = sql.SQL(
            "SELECT store_id, file_id, idx, text, attributes, ts_rank_cd(tsv, q.query, 1) AS relevance"
            " FROM (SELECT {tsquery} AS query) q, {t} WHERE {where}"
            " ORDER BY relevance DESC, store_id, file_id, idx LIMIT %s"
        ).format(tsquery=tsquery, t=self._t, where=where)
        pool = await self._ready()
        async with pool.connection() as conn:
            rows = await (await conn.execute(statement, params)).fetchall()
        if not rows:
            return []
        top = max(float(rows[0][5]), 0.0)
        return [
            Candidate(s, f, i, body, attrs, min(1.0, max(0.0, float(r) / top)) if top > 0 else 0.0)
            for s, f, i, body, attrs, r in rows
        ]

    async def aclose(self) -> None:
        async with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # -- helpers -----------------------------------------------------------------------------------

    def _vector(self, vector: np.ndarray) -> np.ndarray:
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        if v.shape[0] != self.dims:
            raise ValueError(f"a chunk's vector has {v.shape[0]} dimensions, not {self.dims}")
        norm = float(np.linalg.norm(v))
        if not math.isfinite(norm):
            raise ValueError("a chunk's vector is not finite")
        return cast(np.ndarray, v / norm) if norm > 0 else v


def _similarity(distance: Any) -> float:
    """Cosine similarity from pgvector's cosine distance, in [0, 1] (NaN, a zero vector's: 0)."""
    value = 1.0 - float(distance) if distance is not None else 0.0
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


def _attributes(attributes: Mapping[str, AttributeValue]) -> Jsonb:
    for key, value in attributes.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float):
            raise ValueError(f"attribute {key!r} is not a string, number or boolean")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"attribute {key!r} is not a finite number")
        if "\x00" in key or (isinstance(value, str) and "\x00" in value):
            raise ValueError(f"attribute {key!r} holds a NUL character")
    return Jsonb(dict(attributes))


def _storable(*ids: str) -> bool:
    """Whether ids can name rows at all (Postgres text holds no NUL: such an id names nothing)."""
    return not any("\x00" in i for i in ids)


def _check_ids(*ids: str) -> None:
    if not _storable(*ids):
        raise ValueError("an id holds a NUL character")


def _stores(store_ids: Sequence[str]) -> list[str]:
    return [s for s in dict.fromkeys(store_ids) if "\x00" not in s]
