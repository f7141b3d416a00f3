"""The Vector Stores API from the outside: the openai SDK creates stores, uploads and attaches files
(``upload_and_poll``, batches), polls their ingestion, searches with filters and ranking options,
and deletes; raw HTTP sends what the SDK would not. The embedding model is the simulated one (its
vectors are hashed words: a search for a document's words finds it); the real model is measured in
the slow tests and the benchmarks.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import BadRequestError, NotFoundError
from openai.types import VectorStore, VectorStoreDeleted
from openai.types.vector_stores import VectorStoreFile, VectorStoreFileBatch

from gateway.base.settings import Settings
from inference.simulated_embeddings import SimulatedEmbedder
from tests.conftest import LiveGateway

HARBOR = b"# Harbor\n\nThe harbor reopened on Monday after the storm. Ferries run every hour again.\n"
WIDGET = b"Widget manual.\nTo configure the widget, set WIDGET_MODE=turbo in the config file and restart it.\n"
COOKING = b"Risotto needs patience: add the stock one ladle at a time and keep stirring.\n"


def _gateway(make_gateway: Any, tmp_path: Path, **kw: Any) -> LiveGateway:
    live: LiveGateway = make_gateway(Settings(files_dir=str(tmp_path / "files"), **kw), embedder=SimulatedEmbedder())
    return live


def _exact(obj: Any, cls: type) -> bool:
    return isinstance(obj, cls) and not obj.model_extra and obj.model_fields_set == set(cls.model_fields)


def _upload(client: Any, name: str, body: bytes) -> str:
    return str(client.files.create(file=(name, io.BytesIO(body)), purpose="assistants").id)


def test_sdk_store_lifecycle_ingest_search_and_delete(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    store = client.vector_stores.create(name="docs", metadata={"team": "infra"})
    assert _exact(store, VectorStore) and store.name == "docs" and store.file_counts.total == 0
    harbor = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=("harbor.md", io.BytesIO(HARBOR)), poll_interval_ms=50
    )
    assert _exact(harbor, VectorStoreFile) and harbor.status == "completed" and harbor.last_error is None
    assert harbor.usage_bytes > 0 and harbor.chunking_strategy.type == "static"
    widget_id = _upload(client, "widget.txt", WIDGET)
    widget = client.vector_stores.files.create_and_poll(
        vector_store_id=store.id, file_id=widget_id, attributes={"kind": "manual", "year": 2024}, poll_interval_ms=50
    )
    assert widget.status == "completed" and widget.attributes == {"kind": "manual", "year": 2024}
    store = client.vector_stores.retrieve(store.id)
    assert store.status == "completed" and store.file_counts.completed == 2 and store.usage_bytes > 0

    page = client.vector_stores.search(store.id, query="harbor ferries storm")
    assert page.data[0].filename == "harbor.md" and page.data[0].file_id == harbor.id
    assert "reopened" in page.data[0].content[0].text and 0 < page.data[0].score <= 1
    found = client.vector_stores.search(
        store.id, query="harbor widget", filters={"type": "eq", "key": "kind", "value": "manual"}
    )
    assert [r.filename for r in found.data] == ["widget.txt"]
    assert client.vector_stores.search(store.id, query="WIDGET_MODE", max_num_results=1).data[0].file_id == widget_id

    updated = client.vector_stores.files.update(file_id=widget_id, vector_store_id=store.id, attributes={"kind": "old"})
    assert updated.attributes == {"kind": "old"}
    assert (
        client.vector_stores.search(
            store.id, query="widget", filters={"type": "eq", "key": "kind", "value": "manual"}
        ).data
        == []
    )
    assert {f.id for f in client.vector_stores.files.list(store.id, filter="completed")} == {harbor.id, widget_id}

    # deleting the file (Files API) takes it out of the store and out of search
    client.files.delete(widget_id)
    assert [f.id for f in client.vector_stores.files.list(store.id)] == [harbor.id]
    assert all(r.file_id != widget_id for r in client.vector_stores.search(store.id, query="widget config").data)
    detached = client.vector_stores.files.delete(file_id=harbor.id, vector_store_id=store.id)
    assert detached.deleted and client.vector_stores.search(store.id, query="harbor").data == []
    assert client.files.retrieve(harbor.id).id == harbor.id  # detaching keeps the file
    gone = client.vector_stores.delete(store.id)
    assert _exact(gone, VectorStoreDeleted) and gone.deleted
    with pytest.raises(NotFoundError):
        client.vector_stores.retrieve(store.id)


def test_sdk_file_batch_upload_and_poll(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    store = client.vector_stores.create(name="batch")
    batch = client.vector_stores.file_batches.upload_and_poll(
        store.id,
        files=[("harbor.md", io.BytesIO(HARBOR)), ("cooking.txt", io.BytesIO(COOKING))],
        poll_interval_ms=50,
    )
    assert _exact(batch, VectorStoreFileBatch) and batch.status == "completed" and batch.file_counts.completed == 2
    listed = client.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id)
    assert len(listed.data) == 2
    assert client.vector_stores.search(store.id, query="risotto stock").data[0].filename == "cooking.txt"


def test_a_tenant_reaches_none_of_anothers_stores(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path, api_keys=["a:key-a", "b:key-b"])
    a, b = live.openai(api_key="key-a"), live.openai(api_key="key-b")
    store = a.vector_stores.create(name="a's")
    a_file = _upload(a, "harbor.md", HARBOR)
    a.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=a_file, poll_interval_ms=50)
    for call in (
        lambda: b.vector_stores.retrieve(store.id),
        lambda: b.vector_stores.search(store.id, query="harbor"),
        lambda: b.vector_stores.files.list(store.id),
        lambda: b.vector_stores.files.retrieve(file_id=a_file, vector_store_id=store.id),
        lambda: b.vector_stores.delete(store.id),
    ):
        with pytest.raises(NotFoundError):
            call()
    mine = b.vector_stores.create(name="b's")
    with pytest.raises(NotFoundError):  # a's file cannot be attached to b's store
        b.vector_stores.files.create(vector_store_id=mine.id, file_id=a_file)
    assert [s.id for s in b.vector_stores.list()] == [mine.id]
    assert a.vector_stores.search(store.id, query="harbor").data[0].file_id == a_file


def test_quota_of_stores(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path, vector_stores_per_tenant=1)
    client = live.openai()
    client.vector_stores.create(name="one")
    with pytest.raises(BadRequestError) as caught:
        client.vector_stores.create(name="two")
    assert caught.value.code == "quota_exceeded" and "vector_stores_per_tenant" in caught.value.message


def test_chunk_quota_fails_the_file_not_the_request(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path, file_search_chunks_per_tenant=3)
    client = live.openai()
    store = client.vector_stores.create(name="small")
    big = b"word " * 5000  # several 800-token chunks
    done = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=("big.txt", io.BytesIO(big)), poll_interval_ms=50
    )
    assert done.status == "failed" and done.last_error is not None
    assert "file_search_chunks_per_tenant" in done.last_error.message
    assert client.vector_stores.retrieve(store.id).file_counts.failed == 1


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/vector_stores", {"name": "x", "colour": "red"}, "colour"),
        ("/v1/vector_stores", {"expires_after": {"anchor": "created_at", "days": 1}}, "expires_after.anchor"),
        ("/v1/vector_stores", {"file_ids": ["file-nope"]}, "file_ids"),
        (
            "/v1/vector_stores",
            {
                "chunking_strategy": {
                    "type": "static",
                    "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 150},
                }
            },
            "chunking_strategy.static",
        ),
        ("{store}/search", {"query": "x", "filters": {"type": "like", "key": "a", "value": 1}}, "filters.type"),
        ("{store}/search", {"query": "x", "max_num_results": 51}, "max_num_results"),
        ("{store}/search", {"query": "x" * 5000}, "query"),
        ("{store}/files", {"file_id": "file-x", "attributes": {"k": {"nested": 1}}}, "attributes"),
    ],
)
def test_bad_bodies_are_4xx_naming_the_param(
    make_gateway: Any, tmp_path: Path, path: str, body: dict[str, Any], param: str
) -> None:
    live = _gateway(make_gateway, tmp_path)
    store = live.openai().vector_stores.create(name="s")
    r = httpx.post(f"{live.url}{path.replace('{store}', f'/v1/vector_stores/{store.id}')}", json=body)
    assert r.status_code in (400, 404) and (r.json()["error"]["param"] or "").startswith(param), r.text


def test_file_content_and_an_unreadable_file(make_gateway: Any, tmp_path: Path) -> None:
    """The content page is the file's text as ingestion read it; a file the extractor cannot read
    (a PNG named .txt) is refused at upload with ``unsupported_file`` naming the type (the
    ingestion-time refusal of a file stored without that check: tests/gateway/files/test_file_limits.py)."""
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    store = client.vector_stores.create(name="s")
    done = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=("harbor.md", io.BytesIO(HARBOR)), poll_interval_ms=50
    )
    page = client.vector_stores.files.content(done.id, vector_store_id=store.id)
    assert [c.type for c in page.data] == ["text"] and "reopened on Monday" in (page.data[0].text or "")
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    with pytest.raises(BadRequestError) as caught:
        client.vector_stores.files.upload_and_poll(
            vector_store_id=store.id, file=("image.txt", io.BytesIO(png)), poll_interval_ms=50
        )
    assert caught.value.code == "unsupported_file" and "image/png" in caught.value.message
    assert client.vector_stores.retrieve(store.id).file_counts.total == 1
    assert live.metric("respgate_file_ingestions_total", {"outcome": "completed"}) == 1
