"""The Files API (``/v1/files``) from the outside: the openai SDK uploads, lists, retrieves, reads
and deletes; raw HTTP sends what the SDK would not (oversized, truncated and hostile forms); tenants
never see each other's files; quotas and the per-file cap answer before the bytes are kept.
"""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import BadRequestError, NotFoundError
from openai.types import FileDeleted, FileObject

from gateway.base.settings import Settings
from tests.conftest import LiveGateway


def _gateway(make_gateway: Any, tmp_path: Path, **kw: Any) -> LiveGateway:
    live: LiveGateway = make_gateway(Settings(files_dir=str(tmp_path / "files"), **kw))
    return live


def _exact(obj: Any, cls: type) -> bool:
    """The SDK parsed ``obj`` as ``cls`` with every field it declares sent and nothing else."""
    return isinstance(obj, cls) and not obj.model_extra and obj.model_fields_set == set(cls.model_fields)


def _stored(tmp_path: Path) -> list[Path]:
    """Every uploaded file's bytes on disk (temporary ones included)."""
    return [p for p in (tmp_path / "files" / "blobs").rglob("*") if p.is_file()]


def test_sdk_upload_list_retrieve_content_delete(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    body = b"The harbor reopened on Monday.\n" * 100
    created = client.files.create(file=("notes.md", io.BytesIO(body), "text/markdown"), purpose="assistants")
    assert _exact(created, FileObject) and created.bytes == len(body) and created.filename == "notes.md"
    assert created.id.startswith("file-") and created.purpose == "assistants" and created.status == "processed"
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).read() == body
    second = client.files.create(
        file=("b.txt", b"second"), purpose="user_data", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert second.expires_at == second.created_at + 3600
    listed = list(client.files.list())
    assert [f.id for f in listed] == [second.id, created.id]  # newest first
    assert [f.id for f in client.files.list(order="asc")] == [created.id, second.id]
    assert [f.id for f in client.files.list(purpose="user_data")] == [second.id]
    page = client.files.list(limit=1, order="asc")
    assert [f.id for f in page.data] == [created.id] and page.has_more
    assert [f.id for f in page.get_next_page().data] == [second.id]
    deleted = client.files.delete(created.id)
    assert _exact(deleted, FileDeleted) and deleted.deleted
    with pytest.raises(NotFoundError):
        client.files.retrieve(created.id)
    with pytest.raises(NotFoundError):
        client.files.content(created.id)
    assert len(_stored(tmp_path)) == 1  # only the second file's bytes are left


def test_a_tenant_sees_none_of_anothers_files(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path, api_keys=["a:key-a", "b:key-b"])
    a, b = live.openai(api_key="key-a"), live.openai(api_key="key-b")
    mine = a.files.create(file=("a.txt", b"tenant a's secret"), purpose="assistants")
    for call in (
        lambda: b.files.retrieve(mine.id),
        lambda: b.files.content(mine.id),
        lambda: b.files.delete(mine.id),
    ):
        with pytest.raises(NotFoundError) as caught:
            call()
        assert caught.value.body["message"] == f"No such File object: {mine.id}"  # as for an unknown id
    assert list(b.files.list()) == [] and [f.id for f in a.files.list()] == [mine.id]
    assert a.files.content(mine.id).read() == b"tenant a's secret"


def test_a_file_over_the_cap_is_refused_as_it_streams(make_gateway: Any, tmp_path: Path) -> None:
    """No content-length to go by (a chunked body): the bytes stop being kept at the cap; the
    client gets a 413 and nothing stays on disk."""
    live = _gateway(make_gateway, tmp_path, files_max_bytes=64 * 1024)
    boundary = "b0undary"

    def chunks() -> Any:
        yield (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n').encode()
        yield (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n').encode()
        for _ in range(64):  # 4 MiB, far past the cap
            yield b"x" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    r = httpx.post(
        f"{live.url}/v1/files",
        content=chunks(),
        headers={"content-type": f"multipart/form-data; boundary={boundary}", "authorization": "Bearer k"},
        timeout=30,
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large", r.text
    assert _stored(tmp_path) == []
    # declared up front: refused before a byte of it is read
    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-length: {10**9}\r\n"
            f"content-type: multipart/form-data; boundary={boundary}\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):  # the gateway closes after its answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and b"file_too_large" in answer, answer


def test_quotas_refuse_the_file_that_would_pass_them(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path, files_per_tenant=2, files_bytes_per_tenant=4096)
    client = live.openai()
    client.files.create(file=("a.txt", b"a" * 1000), purpose="assistants")
    with pytest.raises(BadRequestError) as caught:
        client.files.create(file=("b.txt", b"b" * 3500), purpose="assistants")
    assert caught.value.code == "quota_exceeded" and "files_bytes_per_tenant" in caught.value.message
    client.files.create(file=("c.txt", b"c" * 100), purpose="assistants")
    with pytest.raises(BadRequestError) as caught:
        client.files.create(file=("d.txt", b"d"), purpose="assistants")
    assert caught.value.code == "quota_exceeded" and "files_per_tenant" in caught.value.message
    assert len(_stored(tmp_path)) == 2


@pytest.mark.parametrize(
    ("parts", "status", "param"),
    [
        ([("purpose", "fine-tune"), ("file", "a.txt")], 400, "purpose"),
        ([("file", "a.txt")], 400, "purpose"),
        ([("purpose", "assistants")], 400, "file"),
        ([("purpose", "assistants"), ("file", "a.txt"), ("file", "b.txt")], 400, "file"),
        ([("purpose", "assistants"), ("model", "x"), ("file", "a.txt")], 400, "model"),
        (
            [("purpose", "assistants"), ("expires_after[anchor]", "last_active_at"), ("file", "a.txt")],
            400,
            "expires_after.anchor",
        ),
        (
            [
                ("purpose", "assistants"),
                ("expires_after[anchor]", "created_at"),
                ("expires_after[seconds]", "60"),
                ("file", "a.txt"),
            ],
            400,
            "expires_after.seconds",
        ),
        ([("purpose", "assistants" * 200), ("file", "a.txt")], 400, "purpose"),
    ],
)
def test_bad_forms_are_400s_naming_the_field(
    make_gateway: Any, tmp_path: Path, parts: list[tuple[str, str]], status: int, param: str
) -> None:
    live = _gateway(make_gateway, tmp_path)
    boundary = "xyz"
    body = b""
    for name, value in parts:
        if name == "file":
            disposition = f'form-data; name="file"; filename="{value}"'
            body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\nhello\r\n".encode()
        else:
            body += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    body += f"--{boundary}--\r\n".encode()
    r = httpx.post(
        f"{live.url}/v1/files", content=body, headers={"content-type": f"multipart/form-data; boundary={boundary}"}
    )
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert _stored(tmp_path) == []


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b'--x\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\ncut short', {}),
        (b"not a form", {}),
        (b"", {}),
        (b"{}", {"content-type": "application/json"}),
        (b"--x--\r\n", {"content-encoding": "gzip"}),
    ],
)
def test_truncated_or_odd_bodies_are_clear_4xx(
    make_gateway: Any, tmp_path: Path, body: bytes, headers: dict[str, str]
) -> None:
    live = _gateway(make_gateway, tmp_path)
    r = httpx.post(
        f"{live.url}/v1/files",
        content=body,
        headers={"content-type": "multipart/form-data; boundary=x", **headers},
    )
    assert 400 <= r.status_code < 500 and r.json()["error"]["message"], r.text
    assert _stored(tmp_path) == []


def test_filenames_are_kept_safe(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path)
    client = live.openai()
    f = client.files.create(file=("../../etc/passwd\x00\n.txt", b"x"), purpose="assistants")
    # the path is cut (httpx percent-encodes the control characters; raw ones are dropped)
    assert f.filename.startswith("passwd") and "/" not in f.filename and f.filename.isprintable()
    raw = (
        b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n'
        b'--x\r\nContent-Disposition: form-data; name="file"; filename="..\\a\x01b\x7f.txt"\r\n\r\nhi\r\n--x--\r\n'
    )
    r = httpx.post(f"{live.url}/v1/files", content=raw, headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 200 and r.json()["filename"] == "ab.txt", r.text
    assert all(str(tmp_path / "files") in str(p.resolve()) for p in _stored(tmp_path))
    r = httpx.get(f"{live.url}/v1/files/..%2F..%2Fcatalog.sqlite3/content")
    assert r.status_code == 404


def test_list_query_is_checked(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path)
    for query, param in (("limit=0", "limit"), ("limit=x", "limit"), ("order=up", "order"), ("bogus=1", "bogus")):
        r = httpx.get(f"{live.url}/v1/files?{query}")
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert httpx.get(f"{live.url}/v1/files?after=file-unknown").json()["data"] == []


def test_nothing_is_created_on_disk_until_a_file_is_uploaded(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path)
    assert httpx.get(f"{live.url}/v1/models").status_code == 200
    assert not os.path.exists(tmp_path / "files")


async def test_expired_files_are_swept(tmp_path: Path) -> None:
    """``expires_after`` passes: the sweep deletes the record and the bytes (everything derived
    from the file is told through ``on_delete``); unexpired files stay."""
    from gateway.files.files import Files

    now = [1_000_000.0]
    files = Files.embedded(Settings(files_dir=str(tmp_path / "files")))
    files.clock = lambda: now[0]
    told: list[tuple[str, str]] = []

    async def hook(tenant: str, file_id: str) -> None:
        told.append((tenant, file_id))

    files.on_delete.append(hook)

    async def upload(expires: int | None) -> str:
        up = await files.begin("t")
        await up.write(b"bytes")
        return (await up.finish("a.txt", "assistants", expires)).id

    short, kept = await upload(3600), await upload(None)
    assert await files.sweep_expired() == 0
    now[0] += 3601
    assert await files.sweep_expired() == 1 and told == [("t", short)]
    assert await files.get("t", short) is None and await files.get("t", kept) is not None
    assert len(_stored(tmp_path)) == 1
    await files.aclose()


def test_uploads_are_counted_by_outcome(make_gateway: Any, tmp_path: Path) -> None:
    live = _gateway(make_gateway, tmp_path, files_max_bytes=2048, files_per_tenant=1)
    client = live.openai()
    with pytest.raises(BadRequestError):
        client.files.create(file=("c.txt", b"c"), purpose="batch")
    r = httpx.post(
        f"{live.url}/v1/files",
        content=b"x" * 10,
        headers={"content-type": "multipart/form-data; boundary=x", "content-length": "10"},
    )
    assert r.status_code == 400
    big = b'--x\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n' + b"x" * 4096
    r = httpx.post(
        f"{live.url}/v1/files", content=iter([big]), headers={"content-type": "multipart/form-data; boundary=x"}
    )
    assert r.status_code == 413
    client.files.create(file=("a.txt", b"a" * 100), purpose="assistants")
    with pytest.raises(BadRequestError):
        client.files.create(file=("b.txt", b"b"), purpose="assistants")
    assert live.metric("respgate_file_uploads_total", {"outcome": "ok"}) == 1
    assert live.metric("respgate_file_uploads_total", {"outcome": "quota_exceeded"}) == 1
    assert live.metric("respgate_file_uploads_total", {"outcome": "too_large"}) == 1
    assert live.metric("respgate_file_uploads_total", {"outcome": "refused"}) == 2
    assert live.metric("respgate_file_upload_bytes_total") == 100
