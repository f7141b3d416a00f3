"""Two replicas on one Postgres (``file_store=postgres``, issue 33 "Must show"): a store created and
filled through one is retrieved, listed, searched and cited through the other with the same
answers, a file deleted through one is gone from the other's search, and each file is ingested
once across both — a worker claims the file under a lease (``StoreCatalog.claim``), the other
replica skips it while the lease holds and takes it over once it lapses (a replica that died
mid-ingestion).

Each gateway is a live one (uvicorn on a loopback port) driven by the unmodified openai SDK; the
Postgres is a real one with pgvector (``tests.postgres``); the embedder is the simulated one.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from openai import NotFoundError
from openai.types.responses import ResponseFileSearchToolCall, ResponseOutputMessage

from gateway.base.settings import ConfigError, Settings
from gateway.files.ingestion import Job
from inference.simulated import SimulatedEngine
from inference.simulated_embeddings import SimulatedEmbedder
from inference.simulated_script import ToolCall
from tests.conftest import MODEL, LiveGateway
from tests.gateway.tools.test_mcp_turns import _calls
from tests.postgres import PostgresServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

T = TypeVar("T")

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
QUERY = "ERR_CONN_RESET_4412"
ANSWER = "incident_2024_checkout_outage.txt"
DOCUMENTS = [ANSWER, "kimchi_fermentation.md", "rate_limiter.py", "orchard_sync_config.json"]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dsn(postgres: PostgresServer) -> str:
    return postgres.create_database(f"r_{uuid.uuid4().hex[:16]}")


class GatedEmbedder(SimulatedEmbedder):
    """Embeds documents only once ``gate`` is open (``entered`` says a worker is waiting there)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    async def embed(self, texts: Any, kind: Any = "document") -> np.ndarray:
        if kind == "document":
            self.entered.set()
            await asyncio.to_thread(self.gate.wait, 60)
        return await super().embed(texts, kind)


def _replica(
    make_gateway: Any, tmp_path: Path, dsn: str, name: str, embedder: SimulatedEmbedder, **kw: Any
) -> tuple[LiveGateway, list[tuple[str, str]]]:
    """A live gateway on the shared database, and the ingestions it ran (file id, outcome; a claim
    another replica held is not one)."""
    settings = Settings(files_dir=str(tmp_path / name), file_store="postgres", file_store_dsn=dsn)
    live: LiveGateway = make_gateway(settings, embedder=embedder, **kw)
    ingested: list[tuple[str, str]] = []
    ingestion = live.gw.vector_stores.ingestion
    real = ingestion.ingest

    async def counted(job: Job) -> str:
        outcome = await real(job)
        if outcome != "skipped":
            ingested.append((job.file_id, outcome))
        return outcome

    ingestion.ingest = counted  # type: ignore[method-assign]
    return live, ingested


def _on(live: LiveGateway, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the gateway's own event loop (its ingestion's queue lives there)."""
    return asyncio.run_coroutine_threadsafe(coro, live.loop).result(60)


def _hits(client: Any, store_id: str, query: str) -> list[tuple[str, str, float, str]]:
    page = client.vector_stores.search(store_id, query=query, max_num_results=5)
    return [(h.file_id, h.filename, round(h.score, 6), h.content[0].text) for h in page.data]


def test_a_store_made_through_one_replica_is_served_by_the_other(make_gateway: Any, tmp_path: Path, dsn: str) -> None:
    script = _calls([ToolCall("msearch", {"queries": [QUERY]}, "file_search")], f"The cause is known.【0:0†{ANSWER}】")
    a, ingested_a = _replica(make_gateway, tmp_path, dsn, "a", SimulatedEmbedder())
    b, ingested_b = _replica(
        make_gateway, tmp_path, dsn, "b", SimulatedEmbedder(), engine=SimulatedEngine(script=script)
    )
    ca, cb = a.openai(), b.openai()

    store = ca.vector_stores.create(name="shared", metadata={"team": "ops"})
    ids: dict[str, str] = {}
    for name in DOCUMENTS:
        done = ca.vector_stores.files.upload_and_poll(
            vector_store_id=store.id, file=(name, io.BytesIO((CORPUS / name).read_bytes())), poll_interval_ms=50
        )
        assert done.status == "completed", done.last_error
        ids[name] = done.id

    # B knows the store, its files and their bytes as A does
    seen = cb.vector_stores.retrieve(store.id)
    assert seen.name == "shared" and seen.metadata == {"team": "ops"}
    assert seen.file_counts.completed == len(DOCUMENTS) and seen == ca.vector_stores.retrieve(store.id)
    assert [s.id for s in cb.vector_stores.list()] == [store.id]
    listed_b = sorted(f.id for f in cb.vector_stores.files.list(store.id, limit=100))
    assert listed_b == sorted(f.id for f in ca.vector_stores.files.list(store.id, limit=100)) == sorted(ids.values())
    assert sorted(f.id for f in cb.files.list()) == sorted(ids.values())
    assert cb.files.retrieve(ids[ANSWER]).filename == ANSWER
    assert cb.files.content(ids[ANSWER]).read() == (CORPUS / ANSWER).read_bytes()

    # the same search answers through both
    for query in (QUERY, "gochugaru", "harvest_lots upsert_key", "token bucket rate limiter"):
        through_a, through_b = _hits(ca, store.id, query), _hits(cb, store.id, query)
        assert through_b == through_a and through_b
    assert _hits(cb, store.id, QUERY)[0][:2] == (ids[ANSWER], ANSWER)

    # a file_search response through B cites the file A uploaded
    r = cb.responses.create(
        model=MODEL,
        input="What caused the checkout outage?",
        tools=[{"type": "file_search", "vector_store_ids": [store.id], "max_num_results": 5}],
        include=["file_search_call.results"],
    )
    (call,) = [o for o in r.output if isinstance(o, ResponseFileSearchToolCall)]
    assert call.results and call.results[0].file_id == ids[ANSWER]
    message = r.output[-1]
    assert isinstance(message, ResponseOutputMessage)
    part: Any = message.content[0]
    (ann,) = part.annotations
    assert ann.type == "file_citation" and ann.file_id == ids[ANSWER] and ann.filename == ANSWER

    # each file ingested exactly once across the two replicas
    runs = ingested_a + ingested_b
    assert sorted(runs) == sorted((fid, "completed") for fid in ids.values())

    # deleted through B: gone from A's search, A's listing, A's reads
    assert cb.files.delete(ids[ANSWER]).deleted
    assert all(hit[0] != ids[ANSWER] for hit in _hits(ca, store.id, QUERY))
    assert ids[ANSWER] not in {f.id for f in ca.vector_stores.files.list(store.id)}
    with pytest.raises(NotFoundError):
        ca.files.retrieve(ids[ANSWER])
    with pytest.raises(NotFoundError):
        ca.files.content(ids[ANSWER])

    # nothing went to either replica's own disk
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_file_is_ingested_once_and_taken_over_when_its_lease_lapses(
    make_gateway: Any, tmp_path: Path, dsn: str
) -> None:
    """A claims the file and stalls mid-ingestion: B, asked to ingest it too, skips it while A's
    lease holds (and its rescan does not even queue it). Then A dies; once the lease has lapsed (B's
    clock moved past it) B's rescan takes the file over and completes it."""
    gated = GatedEmbedder()
    a, ingested_a = _replica(make_gateway, tmp_path, dsn, "a", gated)
    b, ingested_b = _replica(make_gateway, tmp_path, dsn, "b", SimulatedEmbedder())
    ca, cb = a.openai(), b.openai()
    store = ca.vector_stores.create(name="one")
    file_id = ca.files.create(file=(ANSWER, (CORPUS / ANSWER).read_bytes()), purpose="assistants").id
    ca.vector_stores.files.create(vector_store_id=store.id, file_id=file_id)
    assert gated.entered.wait(30)  # A has claimed it and is embedding
    try:
        ingestion_b = b.gw.vector_stores.ingestion

        async def b_takes_it_up() -> int:
            found = await ingestion_b.resume()
            ingestion_b.submit("", store.id, file_id)  # as if B had been asked to ingest it too
            await ingestion_b.idle()
            return found

        assert _on(b, b_takes_it_up()) == 0
        assert ingested_b == [] and cb.vector_stores.files.retrieve(file_id, vector_store_id=store.id).status == (
            "in_progress"
        )

        # A dies mid-ingestion: its workers stop, its lease is left to lapse
        _on(a, a.gw.vector_stores.ingestion.close())
        assert ingested_a == []
        lease_s = ingestion_b.lease_s
        ingestion_b.clock = lambda: time.time() + lease_s + 1

        async def b_rescans() -> int:
            found = await ingestion_b.resume()
            await ingestion_b.idle()
            return found

        assert _on(b, b_rescans()) == 1
    finally:
        gated.gate.set()
    assert ingested_b == [(file_id, "completed")] and ingested_a == []
    done = ca.vector_stores.files.retrieve(file_id, vector_store_id=store.id)
    assert done.status == "completed" and done.last_error is None
    assert _hits(ca, store.id, QUERY)[0][0] == file_id


def test_the_postgres_store_needs_a_dsn_and_never_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``file_store=postgres`` without a DSN, or with one that is not Postgres', is refused at start
    naming the setting; the DSN's password is in no error and not in the settings' repr."""
    monkeypatch.setenv("RESPGATE_FILE_STORE", "postgres")
    with pytest.raises(ConfigError, match=r"file_store=postgres needs file_store_dsn \(RESPGATE_FILE_STORE_DSN\)"):
        Settings.from_env()
    monkeypatch.setenv("RESPGATE_FILE_STORE_DSN", "mysql://app:hunter2@db:3306/files")
    with pytest.raises(ConfigError, match="file_store_dsn") as refused:
        Settings.from_env()
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ConfigError, match="file_store_dsn") as wrong_type:
        Settings.load(None, file_store_dsn=12345)
    assert "12345" not in str(wrong_type.value)
    monkeypatch.setenv("RESPGATE_FILE_STORE_DSN", "postgresql://app:hunter2@db:5432/files")
    settings = Settings.from_env()
    assert settings.file_store == "postgres" and settings.file_store_dsn == "postgresql://app:hunter2@db:5432/files"
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings)
    assert Settings().file_store == "embedded" and Settings().file_store_dsn is None


# -- the lease itself, on both catalogs' databases ---------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from cache.files.sql import PostgresSql, SqlDb, SqliteSql
    from cache.files.store_catalog import SqlStoreCatalog

    db: SqlDb = (
        SqliteSql(tmp_path / "stores.sqlite3")
        if request.param == "sqlite"
        else PostgresSql(request.getfixturevalue("dsn"))
    )
    cat = SqlStoreCatalog(db)
    yield cat
    await cat.aclose()


def _attached(file_id: str = "file-1") -> Any:
    from cache.files.store_catalog import StoreFileRecord

    return StoreFileRecord("vs_1", file_id, "t", 1, "in_progress")


async def test_a_claim_is_one_owners_until_it_lapses(catalog: Any) -> None:
    await catalog.attach(_attached())
    assert [r.file_id for r in await catalog.in_progress(10, now_ms=1000)] == ["file-1"]
    assert (await catalog.claim("t", "vs_1", "file-1", "a", 1000, 5000)).file_id == "file-1"
    assert await catalog.in_progress(10, now_ms=1000) == []  # held: a rescan leaves it
    assert [r.file_id for r in await catalog.in_progress(10)] == ["file-1"]  # still in progress
    assert await catalog.claim("t", "vs_1", "file-1", "b", 4999, 9000) is None
    assert await catalog.renew("t", "vs_1", "file-1", "a", 8000)
    assert not await catalog.renew("t", "vs_1", "file-1", "b", 9000)
    assert await catalog.claim("t", "vs_1", "file-1", "b", 7999, 12000) is None
    # a: dead; its lease lapses and b takes over; a's late finish is refused
    assert (await catalog.claim("t", "vs_1", "file-1", "b", 8000, 12000)) is not None
    assert not await catalog.renew("t", "vs_1", "file-1", "a", 20000)
    assert not await catalog.finish_file("t", "vs_1", "file-1", "completed", 10, owner="a")
    assert await catalog.finish_file("t", "vs_1", "file-1", "completed", 10, owner="b")
    assert (await catalog.get_file("t", "vs_1", "file-1")).status == "completed"
    assert await catalog.claim("t", "vs_1", "file-1", "c", 10**12, 10**12 + 1) is None  # finished
    # attached again: a new claim, whoever held the old one
    await catalog.attach(_attached())
    assert (await catalog.claim("t", "vs_1", "file-1", "c", 0, 5000)) is not None


async def test_claims_racing_for_one_file_give_it_to_one(catalog: Any) -> None:
    await catalog.attach(_attached())
    won = await asyncio.gather(*(catalog.claim("t", "vs_1", "file-1", f"o{i}", 1000, 60_000) for i in range(16)))
    assert sum(r is not None for r in won) == 1


async def test_a_catalog_from_before_leases_gets_its_columns(tmp_path: Path) -> None:
    import sqlite3

    from cache.files.sql import SqliteSql
    from cache.files.store_catalog import SqlStoreCatalog

    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as old:
        old.execute(
            "CREATE TABLE store_files (seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, "
            "store_id TEXT NOT NULL, file_id TEXT NOT NULL, created_at BIGINT NOT NULL, status TEXT NOT NULL, "
            "attributes TEXT NOT NULL, chunking TEXT NOT NULL, usage_bytes BIGINT NOT NULL DEFAULT 0, "
            "last_error_code TEXT, last_error_message TEXT, batch_id TEXT, UNIQUE (tenant, store_id, file_id))"
        )
        old.execute(
            "INSERT INTO store_files (tenant, store_id, file_id, created_at, status, attributes, chunking) "
            "VALUES ('t', 'vs_1', 'file-1', 1, 'in_progress', '{}', '{}')"
        )
    cat = SqlStoreCatalog(SqliteSql(path))
    try:
        assert [r.file_id for r in await cat.in_progress(10, now_ms=1)] == ["file-1"]
        assert await cat.claim("t", "vs_1", "file-1", "a", 1, 2) is not None
    finally:
        await cat.aclose()
