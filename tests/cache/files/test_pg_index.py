"""``cache.files.pg_index``: the conformance suite on a real Postgres with pgvector (both of its
vector paths), then what only the shared backend has: two replicas on one database, the schema
made once whatever starts first, tsquery syntax in query text, filters with hostile keys."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import psycopg
import pytest

from cache.files.index import SearchQuery, parse_filter, search
from cache.files.pg_index import MAX_QUERY_WORDS, PgChunkIndex, query_words
from tests.cache.files.conformance import ChunkIndexConformance, chunks_of, unit

DIMS = 16


class TestExactVectors(ChunkIndexConformance):
    """Candidate sets under ``exact_rows`` (every one here): an exact scan of their rows."""

    @pytest.fixture
    async def index(self, postgres_dsn: str) -> AsyncIterator[PgChunkIndex]:
        ix = PgChunkIndex(postgres_dsn, DIMS, pool_size=4)
        yield ix
        await ix.aclose()


#: the planner's choice taken away: a table this small would be scanned and sorted, never HNSW
_HNSW_ONLY = "?options=-c%20enable_seqscan%3Doff%20-c%20enable_sort%3Doff"


class TestHnswVectors(ChunkIndexConformance):
    """``exact_rows=0``: every nearest search goes through HNSW with iterative scan."""

    @pytest.fixture
    async def index(self, postgres_dsn: str) -> AsyncIterator[PgChunkIndex]:
        ix = PgChunkIndex(postgres_dsn + _HNSW_ONLY, DIMS, pool_size=4, exact_rows=0)
        yield ix
        await ix.aclose()


async def test_the_large_path_is_hnsw(postgres_dsn: str) -> None:
    ix = PgChunkIndex(postgres_dsn + _HNSW_ONLY, DIMS, exact_rows=0)
    try:
        await ix.add("t", "vs", "f", chunks_of([f"c{i}" for i in range(50)], _vectors(9, 50)), {})
        pool = await ix._ready()
        async with pool.connection() as conn:
            cur = await conn.execute(
                "EXPLAIN SELECT idx FROM file_chunks WHERE tenant = 't' AND store_id = any('{vs}')"
                " ORDER BY embedding <=> %s LIMIT 5",
                (unit(np.ones(DIMS)),),
            )
            plan = " ".join(str(r[0]) for r in await cur.fetchall())
        assert "file_chunks_hnsw" in plan, plan
    finally:
        await ix.aclose()


def _vectors(seed: int, count: int, dims: int = DIMS) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [unit(rng.standard_normal(dims)) for _ in range(count)]


async def test_two_replicas_on_one_database_see_each_others_writes(postgres_dsn: str) -> None:
    one, two = PgChunkIndex(postgres_dsn, DIMS), PgChunkIndex(postgres_dsn, DIMS)
    try:
        # both make the schema at once: the advisory lock keeps CREATE from racing
        await asyncio.gather(one.count("t"), two.count("t"))
        vectors = _vectors(1, 3)
        await one.add("t", "vs_1", "f", chunks_of(["kangaroo facts", "wombat facts", "koala facts"], vectors), {"k": 1})
        found = await two.keyword("t", ["vs_1"], "wombat", 5, None)
        assert [(c.file_id, c.index, dict(c.attributes)) for c in found] == [("f", 1, {"k": 1})]
        assert [c.index for c in await two.nearest("t", ["vs_1"], vectors[2], 1, None)] == [2]
        hits = await search(two, "t", SearchQuery(("vs_1",), "koala", vectors[2], max_results=1))
        assert [(h.file_id, h.index) for h in hits] == [("f", 2)]
        await two.set_attributes("t", "vs_1", "f", {"k": 2})
        flt = parse_filter({"type": "eq", "key": "k", "value": 2})
        assert len(await one.nearest("t", ["vs_1"], vectors[0], 10, flt)) == 3
        assert await two.remove_file("t", None, "f") == 3
        assert await one.count("t") == 0
    finally:
        await one.aclose()
        await two.aclose()


async def test_the_same_file_added_from_two_replicas_at_once_is_one_copy(postgres_dsn: str) -> None:
    one, two = PgChunkIndex(postgres_dsn, DIMS), PgChunkIndex(postgres_dsn, DIMS)
    try:
        vectors = _vectors(2, 40)
        texts = [f"chunk {i}" for i in range(40)]
        for _ in range(5):
            await asyncio.gather(
                one.add("t", "vs", "f", chunks_of(texts, vectors), {"from": "one"}),
                two.add("t", "vs", "f", chunks_of(texts, vectors), {"from": "two"}),
            )
            assert await one.count("t", "vs") == 40
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_table_of_other_dims_is_refused(postgres_dsn: str) -> None:
    ix = PgChunkIndex(postgres_dsn, DIMS)
    await ix.count("t")
    await ix.aclose()
    other = PgChunkIndex(postgres_dsn, DIMS * 2)
    with pytest.raises(ValueError, match="16-dimensional"):
        await other.count("t")
    await other.aclose()
    wide = PgChunkIndex(postgres_dsn, DIMS * 2, table="wide_chunks")  # another table may hold others
    assert await wide.count("t") == 0
    await wide.aclose()


@pytest.mark.parametrize(
    "query",
    [
        "a & b",
        "a | b",
        "!a",
        "a:*",
        "a:* & !b | (c <-> d)",
        "'a' & 'b'",
        "a <2> b",
        "a:A",
        "''",
        "\\",
        "a\\:b",
        "&|!():*<->",
        "a" * 3000,  # over Postgres's 2047-byte word
        "x " * 500_000,  # a megabyte of short words
    ],
)
async def test_tsquery_syntax_is_plain_words(postgres_dsn: str, query: str) -> None:
    ix = PgChunkIndex(postgres_dsn, DIMS)
    try:
        texts = ["a b c d", "b only here", "nothing to see"]
        await ix.add("t", "vs", "f", chunks_of(texts, _vectors(3, 3)), {})
        found = await ix.keyword("t", ["vs"], query, 10, None)
        assert all(0.0 <= c.similarity <= 1.0 for c in found)
        if query == "a:* & !b | (c <-> d)":
            # read as the words a, b, c, d: the chunk with all of them first, "!b" negates nothing
            assert [c.index for c in found] == [0, 1]
    finally:
        await ix.aclose()


async def test_filter_keys_and_values_are_parameters(postgres_dsn: str) -> None:
    ix = PgChunkIndex(postgres_dsn, DIMS)
    try:
        weird = "k'); DROP TABLE file_chunks; --"
        await ix.add("t", "vs", "f", chunks_of(["some text"], _vectors(4, 1)), {weird: "v'--", "n": 3})
        for raw, found in [
            ({"type": "eq", "key": weird, "value": "v'--"}, 1),
            ({"type": "gt", "key": weird, "value": 1}, 0),
            ({"type": "in", "key": "n", "value": [3.0, "x"]}, 1),  # 3 is 3.0
            ({"type": "eq", "key": "n\x00", "value": 3}, 0),  # a NUL: no such key
            ({"type": "ne", "key": "n\x00", "value": 3}, 1),
            ({"type": "nin", "key": "n", "value": ["a\x00"]}, 1),
        ]:
            assert len(await ix.keyword("t", ["vs"], "text", 5, parse_filter(raw))) == found, raw
        assert await ix.count("t") == 1
        assert await ix.count("t\x00") == 0
        assert await ix.keyword("t", ["vs\x00"], "text", 5, None) == []
        with pytest.raises(ValueError, match="NUL"):
            await ix.add("t", "vs", "g", chunks_of(["x"], _vectors(5, 1)), {"a": "b\x00"})
    finally:
        await ix.aclose()


async def test_nul_in_chunk_text_is_stored_as_a_replacement_character(postgres_dsn: str) -> None:
    ix = PgChunkIndex(postgres_dsn, DIMS)
    try:
        await ix.add("t", "vs", "f", chunks_of(["wombat\x00 kangaroo"], _vectors(6, 1)), {})
        (found,) = await ix.keyword("t", ["vs"], "kangaroo", 5, None)
        assert found.text == "wombat\ufffd kangaroo"
    finally:
        await ix.aclose()


async def test_keywords_fold_case_beyond_ascii(postgres_dsn: str) -> None:
    """Needs a UTF-8 locale on the database (under ``C``, ``Ü`` stays ``Ü``): the index warns without one."""
    ix = PgChunkIndex(postgres_dsn, DIMS)
    try:
        await ix.add("t", "vs", "f", chunks_of(["ünïcödé Ωmega text", "plain"], _vectors(7, 2)), {})
        assert [c.index for c in await ix.keyword("t", ["vs"], "ÜNÏCÖDÉ", 5, None)] == [0]
        assert [c.index for c in await ix.keyword("t", ["vs"], "ωMEGA", 5, None)] == [0]
    finally:
        await ix.aclose()


async def test_queries_are_bounded_and_statements_time_out(postgres_dsn: str) -> None:
    words = query_words(" ".join(f"w{i}" for i in range(1000)) + " W0 w0")
    assert len(words) == MAX_QUERY_WORDS and words[0] == "w0"
    assert query_words("A a \x00 \ud800x") == ["A", "x"]
    ix = PgChunkIndex(postgres_dsn, DIMS, statement_timeout=0.05)
    try:
        await ix.count("t")
        pool = await ix._ready()
        async with pool.connection() as conn:
            with pytest.raises(psycopg.errors.QueryCanceled):
                await conn.execute("SELECT pg_sleep(1)")
    finally:
        await ix.aclose()
