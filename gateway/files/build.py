"""The files side as a deployment runs it: the Files service, the vector stores over the embedded
stores (a SQLite catalog, the SQLite chunk index, the bytes on disk, all under ``files_dir``) or,
with ``file_store=postgres``, over one Postgres database shared by every replica (the file catalog,
the store catalog and the bytes through one pool, ``cache.files.sql.PostgresSql``; the chunks and
vectors in ``cache.files.pg_index.PgChunkIndex``, whose connections carry pgvector's types, through
a second), the embedding model the settings name, and ingestion's workers.

Nothing is opened, loaded or created until it is first used: a gateway nobody uploads to creates no
file, connects to no database and loads no embedding model (the model's first load is seconds of CPU, paid by the first
ingestion or search, not by every start).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from cache.files.index import ChunkIndex
from cache.files.sql import PostgresSql, SqlDb, SqliteSql
from cache.files.store_catalog import SqlStoreCatalog, StoreCatalog
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.files.files import Files, files_root
from gateway.files.ingestion import Ingestion, Prepared
from gateway.files.vector_stores import VectorStores
from inference.embeddings import Embedder, build_embedder

__all__ = ["build_file_stores", "build_vector_stores"]

T = TypeVar("T")


class Lazy(Generic[T]):
    """``make()`` on the first call, the same object after (threads: one builds); ``made`` is it,
    or None while nobody asked."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self.made: T | None = None

    def __call__(self) -> T:
        if self.made is None:
            with self._lock:
                if self.made is None:
                    self.made = self._make()
        return self.made


def _sqlite_index(path: Path, dims: int) -> ChunkIndex:
    from cache.files.sqlite_index import SqliteChunkIndex  # its vector code loads when first used

    return SqliteChunkIndex(str(path), dims=dims)


def _pg_index(dsn: str, dims: int) -> ChunkIndex:
    from cache.files.pg_index import PgChunkIndex  # connects on first use

    return PgChunkIndex(dsn, dims=dims)


def _dsn(settings: Settings) -> str:
    assert settings.file_store_dsn, "file_store=postgres without file_store_dsn (the settings refuse it)"
    return settings.file_store_dsn


def build_file_stores(
    settings: Settings, metrics: Metrics, embedder: Embedder | None = None
) -> tuple[Files, VectorStores]:
    """The Files service and the vector stores on the store ``file_store`` names."""
    if settings.file_store == "postgres":
        shared: Lazy[SqlDb] = Lazy(lambda: PostgresSql(_dsn(settings)))
        files = Files.postgres(settings, shared)
        return files, build_vector_stores(settings, files, metrics, embedder, db=shared)
    files = Files.embedded(settings)
    return files, build_vector_stores(settings, files, metrics, embedder)


async def _prepare(path: Path, filename: str, max_tokens: int, overlap_tokens: int) -> list[Prepared]:
    from gateway.files.documents import prepare_file  # the extraction libraries load when first used

    return await prepare_file(path, filename, max_tokens, overlap_tokens)


def build_vector_stores(
    settings: Settings,
    files: Files,
    metrics: Metrics,
    embedder: Embedder | None = None,
    *,
    db: Callable[[], SqlDb] | None = None,
) -> VectorStores:
    """``embedder``: instead of the one the settings name (tests pass the simulated one); ``db``:
    the shared Postgres database when ``file_store=postgres`` (the Files service's)."""
    if settings.file_store == "postgres" and db is None:
        db = Lazy(lambda: PostgresSql(_dsn(settings)))

    def root() -> Path:
        path = files_root(settings)
        os.makedirs(path, exist_ok=True)
        return path

    model = Lazy(
        lambda: (
            embedder
            if embedder is not None
            else build_embedder(
                settings.embeddings,
                url=settings.embeddings_url,
                api_key=settings.embeddings_api_key,
                model=settings.embeddings_model,
            )
        )
    )
    catalog: Lazy[StoreCatalog]
    index: Lazy[ChunkIndex]
    if db is not None:
        shared = db
        catalog = Lazy(lambda: SqlStoreCatalog(shared()))
        index = Lazy(lambda: _pg_index(_dsn(settings), model().dims))
    else:
        catalog = Lazy(lambda: SqlStoreCatalog(SqliteSql(root() / "stores.sqlite3")))
        index = Lazy(lambda: _sqlite_index(root() / "chunks.sqlite3", model().dims))

    async def embed_documents(texts: Sequence[str]) -> np.ndarray:
        return await model().embed(texts, "document")

    async def embed_query(texts: Sequence[str]) -> np.ndarray:
        return await model().embed(texts, "query")

    ingestion = Ingestion(
        files,
        catalog,
        index,
        _prepare,
        embed_documents,
        workers=settings.file_ingest_workers,
        max_chunks_per_tenant=settings.file_search_chunks_per_tenant,
        metrics=metrics,
        opened=lambda: catalog.made is not None,
    )
    return VectorStores(
        files,
        catalog,
        index,
        ingestion,
        embed_query,
        max_stores=settings.vector_stores_per_tenant,
        metrics=metrics,
        opened=lambda: [store for store in (catalog.made, index.made) if store is not None],
        # Postgres: the rescan takes up pending files once this replica has opened the stores
        on_disk=(lambda: False) if db is not None else (lambda: (files_root(settings) / "stores.sqlite3").exists()),
    )
