"""Issue 33's bounds, from the outside (HTTP to a live gateway, the openai SDK or httpx): every
hostile upload or query gets a clear 4xx or a ``failed`` file status with ``last_error``, memory
stays bounded, other clients are not stalled, a deleted file leaves every store, and a tenant
cannot tell another tenant's files and stores from ids that never existed (byte for byte).

* **Types** the extractor does not read are refused at upload with a 400 ``unsupported_file``
  naming the type (a zip or gzip named ``notes.txt``: the zip bomb disguised as text, refused by
  its first 8 KiB before the rest streams in); nothing of them is kept.
* **Malformed PDFs** (truncated, garbage after ``%PDF-``, a million-deep nesting, a stream that
  inflates past the reader's cap) upload fine and fail their ingestion with ``last_error``.
* **A 2 GB upload** streamed from a generator is a 413 after at most the cap's bytes; this
  process's resident memory (the gateway runs in it) grows by far less than the body.
* **Many tiny files**: the tenant's file quota is a 400 ``quota_exceeded``; a batch attaches them all.
* **A 1 MB query**: ``vector_stores.search`` answers a 400; the ``file_search`` tool cuts the
  model's query to its cap and the turn completes.

The embedder is the simulated one (hashed words), so a search for a document's words finds it.
"""

from __future__ import annotations

import gzip
import io
import json
import threading
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import pytest
from openai import BadRequestError
from openai.types.responses import ResponseFileSearchToolCall

from gateway.base.settings import Settings
from gateway.tools.file_search import MAX_QUERY_CHARS as TOOL_QUERY_CHARS
from gateway.wire.vector_stores import MAX_QUERY_CHARS
from inference.simulated import SimulatedEngine
from inference.simulated_embeddings import SimulatedEmbedder
from inference.simulated_script import ToolCall
from tests.conftest import MODEL, LiveGateway
from tests.corpus.make_pdfs import pdf_bytes, text_pdf
from tests.gateway.tools.test_mcp_turns import _calls

pytestmark = pytest.mark.timeout(300)

MIB = 1024 * 1024
HARBOR = b"# Harbor\n\nThe harbor reopened on Monday after the storm. Ferries run every hour again.\n"
WIDGET = b"Widget manual.\nTo configure the widget, set WIDGET_MODE=turbo in the config file and restart it.\n"


def _gateway(make_gateway: Any, tmp_path: Path, embedder: Any = None, **kw: Any) -> LiveGateway:
    live: LiveGateway = make_gateway(
        Settings(files_dir=str(tmp_path / "files"), **kw), embedder=embedder or SimulatedEmbedder()
    )
    return live


def _stored(tmp_path: Path) -> list[Path]:
    """Every uploaded file's bytes on disk (temporary ones included)."""
    root = tmp_path / "files" / "blobs"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def _form_head(name: str, boundary: str = "b0undary") -> bytes:
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory figure of this process (the gateway runs in it, on a thread), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak() -> str:
    """Start the peak resident memory (``VmHWM``) afresh (Linux: ``clear_refs`` 5); the figure to
    read after: ``VmHWM`` if it could be reset, else ``VmRSS`` (the end, not the peak)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return "VmRSS"
    return "VmHWM"


# --- types the extractor does not read ------------------------------------------------------------


def _zip_bomb() -> bytes:
    """64 MiB of zeros deflated into a ~64 KiB zip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z, z.open("zeros.txt", "w") as f:
        for _ in range(64):
            f.write(b"\0" * MIB)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "ctype", "type_name"),
    [
        ("notes.txt", _zip_bomb(), "text/plain", "application/zip"),
        ("notes.txt", gzip.compress(b"\0" * (8 * MIB)), None, "application/gzip"),
        ("notes.txt", b"PK\x03\x04" + b"\0" * 40, None, "application/zip"),  # shorter than the sniffed head
        ("photo.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png", "image/png"),
        ("setup.exe", b"just words, named as a program", None, ".exe"),
        ("picture", b"words", "image/png", "image/png"),
        ("report.docx", b"PK\x03\x04" + b"\0" * 100, None, "application/zip"),
    ],
    ids=["zip-bomb-as-txt", "gzip-as-txt", "tiny-zip-as-txt", "png", "exe-name", "declared-png", "docx"],
)
def test_a_type_the_extractor_cannot_read_is_a_400_naming_it_and_nothing_is_kept(
    make_gateway: Any, tmp_path: Path, name: str, data: bytes, ctype: str | None, type_name: str
) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    file: Any = (name, io.BytesIO(data), ctype) if ctype else (name, io.BytesIO(data))
    with pytest.raises(BadRequestError) as caught:
        client.files.create(file=file, purpose="assistants")
    assert caught.value.code == "unsupported_file" and caught.value.param == "file"
    assert type_name in caught.value.message and repr(name) in caught.value.message, caught.value.message
    assert list(client.files.list()) == [] and _stored(tmp_path) == []
    assert client.files.create(file=("ok.md", HARBOR), purpose="assistants").bytes == len(HARBOR)


def test_an_archive_disguised_as_text_is_refused_by_its_head_not_read_to_the_end(
    make_gateway: Any, tmp_path: Path
) -> None:
    """A zip named ``notes.txt`` whose body would go on for 2 GB: refused once its first 8 KiB are
    in, with the connection closed; a few MiB at most of it were sent."""
    live = _gateway(make_gateway, tmp_path, files_max_bytes=4 * 1024 * MIB)
    sent = [0]

    def body() -> Iterator[bytes]:
        head = _form_head("notes.txt")
        sent[0] += len(head)
        yield head
        piece = b"PK\x03\x04" + b"\0" * (64 * 1024 - 4)
        for _ in range(2 * 1024 * 16):  # 2 GiB of "zip"
            sent[0] += len(piece)
            yield piece

    r = httpx.post(
        f"{live.url}/v1/files",
        content=body(),
        headers={"content-type": "multipart/form-data; boundary=b0undary"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_file", r.text
    assert "application/zip" in r.json()["error"]["message"]
    assert r.headers["connection"] == "close"
    assert sent[0] < 64 * MIB, sent[0]
    assert _stored(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("notes.dat", "Plain words, caf\u00e9 and \u2603.\n".encode() * 2000),  # past the 8 KiB head
        ("NOTES", b"no extension at all\n"),
        ("config.unknownext", b"key = value\n"),
    ],
    ids=["dat", "no-extension", "unknown-extension"],
)
def test_text_under_a_name_that_says_nothing_is_kept_and_ingested_as_text(
    make_gateway: Any, tmp_path: Path, name: str, data: bytes
) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    store = client.vector_stores.create(name="s")
    done = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=(name, io.BytesIO(data)), poll_interval_ms=50
    )
    assert done.status == "completed", done.last_error
    assert client.files.content(done.id).read() == data


def test_a_file_stored_before_the_upload_check_still_fails_its_ingestion_naming_the_type(
    make_gateway: Any, tmp_path: Path
) -> None:
    """A file kept without the upload's check (stored by an older release, or written straight
    through ``Files``): ingestion refuses it with ``unsupported_file`` naming the type, counted."""
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()

    async def plant() -> str:
        upload = await live.gw.files.begin(None)
        await upload.write(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
        return (await upload.finish("image.txt", "assistants", None)).id

    file_id = live.call(plant())
    store = client.vector_stores.create(name="s")
    bad = client.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=file_id, poll_interval_ms=50)
    assert bad.status == "failed" and bad.last_error is not None and bad.last_error.code == "unsupported_file"
    assert "image/png" in bad.last_error.message
    assert live.metric("respgate_file_ingestions_total", {"outcome": "unsupported_file"}) == 1


# --- malformed PDFs -------------------------------------------------------------------------------


def _deflated_zeros(n: int) -> bytes:
    import zlib

    c = zlib.compressobj(9)
    return b"".join([*(c.compress(b"\0" * MIB) for _ in range(n // MIB)), c.flush()])


_PAGE = b"BT /F1 10 Tf 50 700 Td (hi) Tj ET"
MALFORMED_PDFS = {
    "truncated.pdf": text_pdf("The harbor reopened on Monday. " * 200)[:400],
    "garbage.pdf": b"%PDF-1.7\n" + bytes(range(256)) * 400,
    "header-only.pdf": b"%PDF-",
    "deep-array.pdf": pdf_bytes([_PAGE]).replace(
        b"/MediaBox [0 0 595 842]", b"/MediaBox [0 0 595 842] /Deep " + b"[" * 10**6 + b"]" * 10**6
    ),
    "deep-dict.pdf": pdf_bytes([_PAGE]).replace(
        b"/MediaBox [0 0 595 842]", b"/MediaBox [0 0 595 842] /Deep " + b"<< /A " * 10**6 + b">> " * 10**6
    ),
    "bomb.pdf": pdf_bytes([_deflated_zeros(200 * MIB)], deflated=True),
    "no-header.pdf": b"this is not a PDF at all",
}


def test_malformed_pdfs_fail_their_ingestion_with_last_error_and_the_gateway_keeps_serving(
    make_gateway: Any, tmp_path: Path
) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai(timeout=120)
    store = client.vector_stores.create(name="pdfs")
    ids = {
        name: client.files.create(file=(name, data), purpose="assistants").id for name, data in MALFORMED_PDFS.items()
    }
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id, file_ids=list(ids.values()), poll_interval_ms=100
    )
    assert batch.file_counts.failed == len(ids) and batch.file_counts.completed == 0, batch
    for name, file_id in ids.items():
        got = client.vector_stores.files.retrieve(file_id=file_id, vector_store_id=store.id)
        assert got.status == "failed" and got.last_error is not None, (name, got)
        assert got.last_error.code == "invalid_file" and "PDF" in got.last_error.message, (name, got.last_error)
    # the gateway still serves, and still ingests a good file after the bad ones
    assert httpx.get(f"{live.url}/v1/models").status_code == 200
    good = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=("harbor.pdf", text_pdf(HARBOR.decode())), poll_interval_ms=50
    )
    assert good.status == "completed", good.last_error
    assert client.vector_stores.search(store.id, query="harbor ferries").data[0].file_id == good.id


# --- a 2 GB upload ----------------------------------------------------------------------------------


def test_a_2_gb_upload_is_a_413_early_with_bounded_memory(make_gateway: Any, tmp_path: Path) -> None:
    """Streamed chunked (no ``content-length`` to refuse it by), never materialised: the gateway
    stops at ``files_max_bytes`` (1 MiB), answers 413 and closes; what was sent is a small part of
    2 GB, and this process's peak resident memory (client and gateway) rose by far less than the
    body."""
    live = _gateway(make_gateway, tmp_path, files_max_bytes=MIB)
    piece = b"All work and no play makes Jack a dull boy.\n" * 1489  # ~64 KiB of text
    sent = [0]

    def body() -> Iterator[bytes]:
        yield _form_head("big.txt")
        while sent[0] < 2 * 1024 * MIB:
            sent[0] += len(piece)
            yield piece

    httpx.get(f"{live.url}/v1/models")  # warm: the first request's imports are not the upload's
    before = _status("VmRSS")
    field = _reset_peak()
    r = httpx.post(
        f"{live.url}/v1/files",
        content=body(),
        headers={"content-type": "multipart/form-data; boundary=b0undary"},
        timeout=120,
    )
    grown = _status(field) - before
    print(f"2 GB upload refused after {sent[0] / MIB:.1f} MiB sent; {field} - VmRSS before: {grown / MIB:.1f} MiB")
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large", r.text
    assert sent[0] < 256 * MIB, sent[0]
    assert grown < 64 * MIB, grown
    assert _stored(tmp_path) == []
    assert httpx.get(f"{live.url}/v1/models").status_code == 200


# --- many tiny files -----------------------------------------------------------------------------


def test_many_tiny_files_hit_the_quota_then_attach_in_one_batch_and_page(make_gateway: Any, tmp_path: Path) -> None:
    n = 50
    live = _gateway(make_gateway, tmp_path, files_per_tenant=n)
    client = live.openai()
    ids = [
        client.files.create(file=(f"tiny{i}.txt", f"tiny file {i}\n".encode()), purpose="assistants").id
        for i in range(n)
    ]
    with pytest.raises(BadRequestError) as caught:
        client.files.create(file=("one-more.txt", b"x"), purpose="assistants")
    assert caught.value.code == "quota_exceeded" and "files_per_tenant" in caught.value.message
    assert len(_stored(tmp_path)) == n
    # every file once, in upload order, across pages
    paged, after = [], None
    while True:
        page = client.files.list(limit=7, order="asc", **({"after": after} if after else {}))
        paged += [f.id for f in page.data]
        if not page.has_more:
            break
        after = page.data[-1].id
    assert paged == ids
    store = client.vector_stores.create(name="tiny")
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id, file_ids=ids, poll_interval_ms=50
    )
    assert batch.status == "completed" and batch.file_counts.completed == n, batch
    assert client.vector_stores.search(store.id, query="tiny file 37").data


# --- a 1 MB query ----------------------------------------------------------------------------------


def test_a_1_mb_query_is_a_400_for_search_and_cut_for_the_tool(make_gateway: Any, tmp_path: Path) -> None:
    huge = "harbor " * (MIB // 7)
    script = _calls([ToolCall("msearch", {"queries": [huge]}, "file_search")], "Done.")
    live: LiveGateway = make_gateway(
        # a context the 1 MB of arguments fits in, so the model can write the call whole
        Settings(files_dir=str(tmp_path / "files"), max_context=4 * MIB),
        engine=SimulatedEngine(script=script),
        embedder=SimulatedEmbedder(),
    )
    client = live.openai()
    store = client.vector_stores.create(name="s")
    client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=("harbor.md", io.BytesIO(HARBOR)), poll_interval_ms=50
    )
    r = httpx.post(f"{live.url}/v1/vector_stores/{store.id}/search", json={"query": huge}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "query", r.text[:500]
    assert str(MAX_QUERY_CHARS) in r.json()["error"]["message"]
    r = httpx.post(f"{live.url}/v1/vector_stores/{store.id}/search", json={"query": [huge[:4000]] * 64}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "query", r.text[:500]
    # the model asks the tool a 1 MB query: it searches the first TOOL_QUERY_CHARS characters
    resp = client.responses.create(
        model=MODEL,
        input="where?",
        tools=[{"type": "file_search", "vector_store_ids": [store.id]}],
        include=["file_search_call.results"],
        max_output_tokens=3 * MIB,
    )
    assert resp.status == "completed", resp.incomplete_details
    (call,) = [o for o in resp.output if isinstance(o, ResponseFileSearchToolCall)]
    assert call.status == "completed" and [len(q) for q in call.queries] == [len(huge[:TOOL_QUERY_CHARS].strip())]
    assert call.results and call.results[0].filename == "harbor.md"
    assert client.vector_stores.search(store.id, query="harbor").data


# --- no stall of other clients ---------------------------------------------------------------------


class GatedEmbedder(SimulatedEmbedder):
    """The simulated embedder, whose document embedding waits (off the event loop) for ``gate``:
    an ingestion held mid-way for as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    async def embed(self, texts: Sequence[str], kind: Literal["document", "query"] = "document") -> np.ndarray:
        if kind == "document":
            import asyncio

            self.entered.set()
            await asyncio.to_thread(self.gate.wait, 120)
        return await super().embed(texts, kind)


def test_a_slow_upload_and_a_running_ingestion_stall_no_other_client(make_gateway: Any, tmp_path: Path) -> None:
    """By ordering, not timing: an upload is held mid-body and an ingestion of a 4 MiB document is
    held mid-embedding; a models list, a file list and a search are answered meanwhile; then both
    are let go and finish."""
    embedder = GatedEmbedder()
    live = _gateway(make_gateway, tmp_path, embedder=embedder, body_timeout_s=120)
    client = live.openai(timeout=120)
    store = client.vector_stores.create(name="s")
    big = client.files.create(
        file=("big.txt", b"The harbor reopened on Monday. " * (4 * MIB // 31)), purpose="assistants"
    )
    client.vector_stores.files.create(vector_store_id=store.id, file_id=big.id)

    upload_started, upload_go = threading.Event(), threading.Event()
    answers: dict[str, Any] = {}

    def slow_body() -> Iterator[bytes]:
        yield _form_head("slow.txt")
        yield b"first half of the slow file; "
        upload_started.set()
        upload_go.wait(120)
        yield b"second half.\r\n--b0undary--\r\n"

    def upload() -> None:
        answers["upload"] = httpx.post(
            f"{live.url}/v1/files",
            content=slow_body(),
            headers={"content-type": "multipart/form-data; boundary=b0undary"},
            timeout=120,
        )

    thread = threading.Thread(target=upload)
    thread.start()
    try:
        assert upload_started.wait(60) and embedder.entered.wait(60)
        assert httpx.get(f"{live.url}/v1/models", timeout=60).status_code == 200
        assert [f.id for f in client.files.list()] == [big.id]  # the slow upload is not a file yet
        assert client.vector_stores.files.retrieve(file_id=big.id, vector_store_id=store.id).status == "in_progress"
        assert "upload" not in answers and not embedder.gate.is_set()  # both still held
    finally:
        upload_go.set()
        embedder.gate.set()
        thread.join(120)
    assert answers["upload"].status_code == 200, answers["upload"].text
    done = client.vector_stores.files.poll(big.id, vector_store_id=store.id, poll_interval_ms=50)
    assert done.status == "completed", done.last_error


# --- delete removes chunks from every store ----------------------------------------------------------


def test_deleting_a_file_removes_its_chunks_from_every_store(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    one, two = client.vector_stores.create(name="one"), client.vector_stores.create(name="two")
    harbor = client.files.create(file=("harbor.md", HARBOR), purpose="assistants").id
    widget = client.files.create(file=("widget.txt", WIDGET), purpose="assistants").id
    for store in (one, two):
        for fid in (harbor, widget):
            assert (
                client.vector_stores.files.create_and_poll(
                    vector_store_id=store.id, file_id=fid, poll_interval_ms=50
                ).status
                == "completed"
            )
        assert harbor in {h.file_id for h in client.vector_stores.search(store.id, query="harbor ferries storm").data}
    chunks_before = live.call(live.gw.vector_stores._index().count(""))
    client.files.delete(harbor)
    for store in (one, two):
        hits = client.vector_stores.search(store.id, query="harbor ferries storm", max_num_results=50).data
        assert harbor not in {h.file_id for h in hits}
        assert [f.id for f in client.vector_stores.files.list(store.id)] == [widget]
        assert client.vector_stores.retrieve(store.id).file_counts.completed == 1
    chunks_after = live.call(live.gw.vector_stores._index().count(""))
    assert chunks_before > chunks_after > 0  # widget's chunks stay, harbor's are gone


# --- tenant isolation, byte for byte ---------------------------------------------------------------


def _raw(live: LiveGateway, method: str, path: str, body: Any, key: str) -> httpx.Response:
    return httpx.request(
        method,
        f"{live.base_url}{path}",
        headers={"authorization": f"Bearer {key}"},
        content=None if body is None else json.dumps(body).encode(),
        timeout=60,
    )


def test_another_tenants_files_and_stores_are_byte_for_byte_unknown_ids(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path, api_keys=["a:key-a", "b:key-b"])
    a, b = live.openai(api_key="key-a"), live.openai(api_key="key-b")
    store = a.vector_stores.create(name="a's")
    fid = a.files.create(file=("harbor.md", HARBOR), purpose="assistants").id
    a.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=fid, poll_interval_ms=50)
    batch = a.vector_stores.file_batches.create_and_poll(vector_store_id=store.id, file_ids=[fid], poll_interval_ms=50)
    b_store = b.vector_stores.create(name="b's")
    missing_file = "file-" + "0" * (len(fid) - 5)
    missing_store = "vs_" + "0" * (len(store.id) - 3)
    missing_batch = "vsfb_" + "0" * (len(batch.id) - 5)
    assert (len(missing_file), len(missing_store), len(missing_batch)) == (len(fid), len(store.id), len(batch.id))
    swap = {fid: missing_file, store.id: missing_store, batch.id: missing_batch}

    def unknown(path: str) -> str:
        for real, fake in swap.items():
            path = path.replace(real, fake)
        return path

    S, F, B = store.id, fid, batch.id
    calls: list[tuple[str, str, Any]] = [
        ("GET", f"/files/{F}", None),
        ("GET", f"/files/{F}/content", None),
        ("DELETE", f"/files/{F}", None),
        ("GET", f"/vector_stores/{S}", None),
        ("POST", f"/vector_stores/{S}", {"name": "mine now"}),
        ("POST", f"/vector_stores/{S}/search", {"query": "harbor"}),
        ("GET", f"/vector_stores/{S}/files", None),
        ("POST", f"/vector_stores/{S}/files", {"file_id": F}),
        ("GET", f"/vector_stores/{S}/files/{F}", None),
        ("POST", f"/vector_stores/{S}/files/{F}", {"attributes": {"k": "v"}}),
        ("GET", f"/vector_stores/{S}/files/{F}/content", None),
        ("DELETE", f"/vector_stores/{S}/files/{F}", None),
        ("POST", f"/vector_stores/{S}/file_batches", {"file_ids": [F]}),
        ("GET", f"/vector_stores/{S}/file_batches/{B}", None),
        ("POST", f"/vector_stores/{S}/file_batches/{B}/cancel", None),
        ("GET", f"/vector_stores/{S}/file_batches/{B}/files", None),
        ("DELETE", f"/vector_stores/{S}", None),
        # a's file through b's own store
        ("POST", f"/vector_stores/{b_store.id}/files", {"file_id": F}),
        ("POST", f"/vector_stores/{b_store.id}/file_batches", {"file_ids": [F]}),
        ("POST", "/vector_stores", {"name": "x", "file_ids": [F]}),
    ]
    for method, path, body in calls:
        theirs = _raw(live, method, path, body, "key-b")
        never = _raw(
            live, method, unknown(path), None if body is None else json.loads(unknown(json.dumps(body))), "key-b"
        )
        assert theirs.status_code == never.status_code and 400 <= theirs.status_code < 500, (method, path, theirs.text)
        assert theirs.content == unknown_bytes(never.content, swap), (method, path, theirs.text, never.text)
    assert [f.id for f in b.files.list()] == [] and [s.id for s in b.vector_stores.list()] == [b_store.id]
    # a's things are untouched
    assert a.files.content(fid).read() == HARBOR
    assert a.vector_stores.retrieve(store.id).name == "a's"
    assert a.vector_stores.search(store.id, query="harbor").data[0].file_id == fid


def unknown_bytes(body: bytes, swap: dict[str, str]) -> bytes:
    """``body`` with each never-existing id put back as the real one it stood for."""
    for real, fake in swap.items():
        body = body.replace(fake.encode(), real.encode())
    return body
