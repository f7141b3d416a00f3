"""The file bytes' backends behind one interface (``cache.files.blobs.Blobs``): the same tests run on
the folder on disk (``DiskBlobs``), on the database pieces over SQLite and over a real Postgres
(``PgBlobs``) — a streamed upload reads back byte for byte in pieces of at most ``READ_CHUNK``,
nothing is readable before ``commit``, an aborted upload leaves nothing, tenants never see each
other's files. Then what only the database backend has: its pieces are bounded, an aborted
upload's rows are gone, a dead replica's half upload is swept.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cache.files.blobs import READ_CHUNK, Blobs, DiskBlobs
from cache.files.pg_blobs import PIECE, PgBlobs
from cache.files.sql import PostgresSql, SqlDb, SqliteSql

pytestmark = pytest.mark.timeout(120)

#: a file of three and a bit pieces, written in request-body-sized parts that straddle them
BODY = os.urandom(3 * PIECE + 12_345)
PART = 64 * 1024 + 7


@pytest.fixture(params=["disk", "sqlite", "postgres"])
async def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Blobs]:
    if request.param == "disk":
        yield DiskBlobs(tmp_path / "blobs")
        return
    db: SqlDb
    if request.param == "sqlite":
        db = SqliteSql(tmp_path / "blobs.sqlite3")
    else:
        db = PostgresSql(request.getfixturevalue("postgres_dsn"))
    pg = PgBlobs(db, temp_dir=tmp_path)
    yield pg
    await pg.aclose()


async def _write(blobs: Blobs, tenant: str, file_id: str, body: bytes, commit: bool = True) -> None:
    writer = blobs.writer(tenant, file_id)
    for at in range(0, len(body), PART):
        await writer.write(body[at : at + PART])
    if commit:
        await writer.commit()
    else:
        await writer.abort()


async def _read(blobs: Blobs, tenant: str, file_id: str) -> list[bytes]:
    return [piece async for piece in blobs.read(tenant, file_id)]


async def test_a_streamed_upload_reads_back_in_bounded_pieces(blobs: Blobs) -> None:
    await _write(blobs, "t1", "file-a", BODY)
    pieces = await _read(blobs, "t1", "file-a")
    assert b"".join(pieces) == BODY
    assert max(len(p) for p in pieces) <= READ_CHUNK and len(pieces) >= 4
    async with blobs.local_path("t1", "file-a") as path:
        assert path.read_bytes() == BODY


async def test_an_empty_file_is_a_file(blobs: Blobs) -> None:
    writer = blobs.writer("t1", "empty")
    await writer.commit()
    assert b"".join(await _read(blobs, "t1", "empty")) == b""


async def test_nothing_is_readable_before_commit_and_an_abort_leaves_nothing(blobs: Blobs) -> None:
    writer = blobs.writer("t1", "file-b")
    await writer.write(BODY[: 2 * PIECE + 1])
    with pytest.raises(FileNotFoundError):
        await _read(blobs, "t1", "file-b")
    await writer.abort()
    await writer.abort()  # idempotent
    with pytest.raises(FileNotFoundError):
        await _read(blobs, "t1", "file-b")
    with pytest.raises(FileNotFoundError):
        async with blobs.local_path("t1", "file-b"):
            pass
    assert await blobs.delete("t1", "file-b") is False


async def test_tenants_are_apart_and_delete_removes(blobs: Blobs) -> None:
    await _write(blobs, "t1", "same-id", b"one's")
    await _write(blobs, "t2", "same-id", b"two's")
    assert await _read(blobs, "t1", "same-id") == [b"one's"]
    assert await _read(blobs, "t2", "same-id") == [b"two's"]
    with pytest.raises(FileNotFoundError):
        await _read(blobs, "t3", "same-id")
    assert await blobs.delete("t1", "same-id") is True
    assert await blobs.delete("t1", "same-id") is False
    with pytest.raises(FileNotFoundError):
        await _read(blobs, "t1", "same-id")
    assert await _read(blobs, "t2", "same-id") == [b"two's"]


async def test_ids_that_are_no_file_are_not_found(blobs: Blobs) -> None:
    for bad in ("../etc", "a\x00b"):
        with pytest.raises(FileNotFoundError):
            await _read(blobs, "t1", bad)


# -- the database backend's own ------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlDb]:
    sql: SqlDb = (
        SqliteSql(tmp_path / "blobs.sqlite3")
        if request.param == "sqlite"
        else PostgresSql(request.getfixturevalue("postgres_dsn"))
    )
    yield sql
    await sql.aclose()


async def _rows(db: SqlDb) -> tuple[int, int]:
    row = await db.one("SELECT count(*), coalesce(max(length(data)), 0) FROM blob_pieces")
    assert row is not None
    return int(row[0]), int(row[1])


async def test_the_writer_holds_at_most_a_piece_and_stores_bounded_pieces(db: SqlDb, tmp_path: Path) -> None:
    blobs = PgBlobs(db, temp_dir=tmp_path)
    writer = blobs.writer("t1", "big")
    for at in range(0, len(BODY), PART):
        await writer.write(BODY[at : at + PART])
        assert len(writer._buffer) < PIECE  # type: ignore[attr-defined]
    await writer.commit()
    count, biggest = await _rows(db)
    assert count == 4 and biggest == PIECE


async def test_an_aborted_upload_leaves_no_row(db: SqlDb, tmp_path: Path) -> None:
    blobs = PgBlobs(db, temp_dir=tmp_path)
    await _write(blobs, "t1", "refused", BODY, commit=False)
    assert await _rows(db) == (0, 0)
    await _write(blobs, "t1", "kept", BODY)
    assert (await _rows(db))[0] == 4
    assert await blobs.delete("t1", "kept")
    assert await _rows(db) == (0, 0)


async def test_local_path_is_a_copy_removed_after(db: SqlDb, tmp_path: Path) -> None:
    blobs = PgBlobs(db, temp_dir=tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    await _write(blobs, "t1", "f", BODY)
    async with blobs.local_path("t1", "f") as path:
        assert path.parent == tmp_path / "tmp" and path.read_bytes() == BODY
    assert list((tmp_path / "tmp").iterdir()) == []


async def test_a_dead_replicas_half_upload_is_swept_and_a_committed_one_kept(db: SqlDb, tmp_path: Path) -> None:
    blobs = PgBlobs(db, temp_dir=tmp_path)
    await _write(blobs, "t1", "kept", BODY[:100])
    half = blobs.writer("t1", "half")  # its replica dies: never committed, never aborted
    await half.write(BODY[: 2 * PIECE])
    assert (await _rows(db))[0] == 3
    assert await blobs.sweep_stale(before=0) == 0  # not stale yet
    assert await blobs.sweep_stale(before=2**40) == 2
    assert (await _rows(db))[0] == 1 and await _read(blobs, "t1", "kept") == [BODY[:100]]


async def test_two_blobs_on_one_postgres_see_each_others_files(postgres_dsn: str, tmp_path: Path) -> None:
    """What replicas rely on: bytes written through one are read through another."""
    a, b = PgBlobs(PostgresSql(postgres_dsn), temp_dir=tmp_path), PgBlobs(PostgresSql(postgres_dsn), temp_dir=tmp_path)
    try:
        await asyncio.gather(_write(a, "t1", "x", BODY), _write(b, "t1", "y", BODY[::-1]))
        assert b"".join(await _read(b, "t1", "x")) == BODY
        assert b"".join(await _read(a, "t1", "y")) == BODY[::-1]
        assert await b.delete("t1", "x")
        with pytest.raises(FileNotFoundError):
            await _read(a, "t1", "x")
    finally:
        await a.aclose()
        await b.aclose()
