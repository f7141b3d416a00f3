"""``cache.files.sqlite_index``: the conformance suite on a file and in memory, then what only the
embedded backend has (a file that outlives the process, reads beside writes, the matrix cache)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from cache.files.index import parse_filter
from cache.files.sqlite_index import MAX_QUERY_PHRASES, SqliteChunkIndex, fts_query
from tests.cache.files.conformance import ChunkIndexConformance, chunks_of, unit

DIMS = 16


class TestOnAFile(ChunkIndexConformance):
    @pytest.fixture
    async def index(self, tmp_path: Path) -> AsyncIterator[SqliteChunkIndex]:
        ix = SqliteChunkIndex(tmp_path / "chunks.db", DIMS)
        yield ix
        await ix.aclose()


class TestInMemory(ChunkIndexConformance):
    @pytest.fixture
    async def index(self) -> AsyncIterator[SqliteChunkIndex]:
        ix = SqliteChunkIndex(None, DIMS)
        yield ix
        await ix.aclose()


class TestWithoutTheMatrixCache(ChunkIndexConformance):
    """Stores over the cache's budget are scanned from SQLite in batches: the same answers."""

    @pytest.fixture
    async def index(self, tmp_path: Path) -> AsyncIterator[SqliteChunkIndex]:
        ix = SqliteChunkIndex(tmp_path / "chunks.db", DIMS, cache_bytes=0)
        yield ix
        await ix.aclose()


def _vectors(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [unit(rng.standard_normal(DIMS)) for _ in range(count)]


async def test_the_file_keeps_everything_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "chunks.db"
    vectors = _vectors(1, 3)
    ix = SqliteChunkIndex(path, DIMS)
    await ix.add("t1", "vs", "f", chunks_of(["kept alpha", "kept beta", "kept gamma"], vectors), {"k": "v"})
    await ix.add("t2", "vs", "f", chunks_of(["other"], vectors[:1]), {})
    before = (await ix.nearest("t1", ["vs"], vectors[1], 5, None), await ix.keyword("t1", ["vs"], "beta", 5, None))
    await ix.aclose()

    again = SqliteChunkIndex(path, DIMS)
    try:
        after = (
            await again.nearest("t1", ["vs"], vectors[1], 5, None),
            await again.keyword("t1", ["vs"], "beta", 5, None),
        )
        assert after == before
        assert (await again.count("t1"), await again.count("t2")) == (3, 1)
        assert await again.remove_file("t1", None, "f") == 3
    finally:
        await again.aclose()
    with pytest.raises(ValueError, match="16-dimensional"):
        SqliteChunkIndex(path, DIMS * 2)


async def test_searches_run_while_files_are_added(tmp_path: Path) -> None:
    """Readers on their own connections see whole files only (a file's chunks commit together),
    never an error, while a writer adds and replaces files."""
    ix = SqliteChunkIndex(tmp_path / "chunks.db", DIMS)
    vectors = _vectors(2, 20)
    probe = vectors[0]
    done = asyncio.Event()
    seen: list[int] = []

    async def write() -> None:
        try:
            for round_ in range(15):
                for f in range(4):
                    texts = [f"busy word round{round_} file{f} chunk{i}" for i in range(20)]
                    await ix.add("t", "vs", f"file_{f}", chunks_of(texts, vectors), {"round": round_})
        finally:
            done.set()

    async def read() -> None:
        while not done.is_set():
            near, words = await asyncio.gather(
                ix.nearest("t", ["vs"], probe, 200, None), ix.keyword("t", ["vs"], "busy", 200, None)
            )
            for found in (near, words):
                per_file: dict[str, int] = {}
                for c in found:
                    per_file[c.file_id] = per_file.get(c.file_id, 0) + 1
                assert all(count == 20 for count in per_file.values()), per_file
                seen.append(len(found))

    try:
        await asyncio.gather(write(), read(), read())
        assert seen, "the readers ran"
        assert await ix.count("t") == 80
        assert len(await ix.nearest("t", ["vs"], probe, 200, None)) == 80
    finally:
        await ix.aclose()


async def test_a_write_drops_the_cached_matrix(tmp_path: Path) -> None:
    ix = SqliteChunkIndex(tmp_path / "chunks.db", DIMS)
    vectors = _vectors(3, 2)
    try:
        await ix.add("t", "vs", "f1", chunks_of(["one"], vectors[:1]), {})
        assert [c.file_id for c in await ix.nearest("t", ["vs"], vectors[1], 5, None)] == ["f1"]  # cached now
        await ix.add("t", "vs", "f2", chunks_of(["two"], vectors[1:]), {})
        assert [c.file_id for c in await ix.nearest("t", ["vs"], vectors[1], 5, None)][0] == "f2"
        await ix.remove_file("t", None, "f2")
        assert [c.file_id for c in await ix.nearest("t", ["vs"], vectors[1], 5, None)] == ["f1"]
    finally:
        await ix.aclose()


async def test_a_selective_filter_on_a_large_store_finds_every_match(tmp_path: Path) -> None:
    """Filter first, rank second: 3 matching chunks among 3000 closer ones are all found."""
    ix = SqliteChunkIndex(tmp_path / "chunks.db", DIMS)
    rng = np.random.default_rng(4)
    probe = unit(rng.standard_normal(DIMS))
    try:
        for f in range(30):
            close = [unit(probe + 0.1 * rng.standard_normal(DIMS)) for _ in range(100)]
            await ix.add("t", "vs", f"crowd_{f}", chunks_of([f"crowd {i}" for i in range(100)], close), {"n": f})
        far = [unit(rng.standard_normal(DIMS)) for _ in range(3)]
        await ix.add("t", "vs", "wanted", chunks_of(["w0", "w1", "w2"], far), {"n": 1000})
        flt = parse_filter({"type": "gte", "key": "n", "value": 1000})
        found = await ix.nearest("t", ["vs"], probe, 10, flt)
        assert sorted(c.key for c in found) == [("vs", "wanted", i) for i in range(3)]
    finally:
        await ix.aclose()


def test_fts_queries_are_quoted_phrases() -> None:
    assert fts_query('get_user_by_id "NEAR(x*) -y') == '"get user by id" OR "near x" OR "y"'
    assert fts_query("ERR-4021 err-4021") == '"err 4021"'
    assert fts_query('" * - ( ) ^ :') is None
    assert fts_query(" ".join(f"w{i}" for i in range(100))) == " OR ".join(f'"w{i}"' for i in range(MAX_QUERY_PHRASES))


def test_each_tenant_has_its_own_keyword_statistics(tmp_path: Path) -> None:
    """A term's rarity is counted in the tenant's own text: another tenant's chunks are not in its
    FTS table (checked on the file itself)."""
    path = tmp_path / "chunks.db"

    async def fill() -> None:
        ix = SqliteChunkIndex(path, DIMS)
        await ix.add("t1", "vs", "f", chunks_of(["a b"], _vectors(5, 1)), {})
        await ix.add("t2", "vs", "f", chunks_of(["c d", "e f"], _vectors(6, 2)), {})
        await ix.aclose()

    asyncio.run(fill())
    db = sqlite3.connect(path)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'idx_fts_%_docsize'")]
        sizes = sorted(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)
        assert sizes == [1, 2]
    finally:
        db.close()


async def test_bad_vectors_and_attributes_are_refused(tmp_path: Path) -> None:
    ix = SqliteChunkIndex(None, DIMS)
    try:
        with pytest.raises(ValueError, match="dimensions"):
            await ix.add("t", "vs", "f", chunks_of(["x"], [np.ones(DIMS + 1, dtype=np.float32)]), {})
        with pytest.raises(ValueError, match="finite"):
            await ix.add("t", "vs", "f", chunks_of(["x"], _vectors(7, 1)), {"x": float("inf")})
        with pytest.raises(ValueError, match="dimensions"):
            await ix.nearest("t", ["vs"], np.ones(3, dtype=np.float32), 5, None)
        assert await ix.count("t") == 0
        assert await ix.nearest("t", ["vs"], np.zeros(DIMS, dtype=np.float32), 5, None) == []
    finally:
        await ix.aclose()
