"""The Containers API (``/v1/containers``) from the outside, through the openai SDK against a live
gateway with ``code_interpreter=local``: containers created with Files API files in them, listed,
retrieved and deleted; container files uploaded, listed, read and deleted; code run through the
registry (``gw.containers.run``) whose files come back byte-identical with source ``assistant``;
state kept between runs; idle expiry on an injected clock; tenants that never see each other's
containers; quotas; hostile file names; and the API switched off naming the setting.

The sandbox is the real local one (bubblewrap). Where it cannot start these tests fail with the
reason, unless ``RESPGATE_SANDBOX_OPTIONAL=1`` (as in ``tests/security/sandbox``), when they skip.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import APIStatusError, BadRequestError, NotFoundError
from openai.types import ContainerCreateResponse, ContainerListResponse, ContainerRetrieveResponse
from openai.types.containers import FileCreateResponse, FileListResponse, FileRetrieveResponse

from gateway.base.settings import Settings
from gateway.containers.model import ContainerStatus, FileSource
from gateway.containers.registry import ContainerRegistry
from security.sandbox.local import LocalSandbox
from tests.conftest import LiveGateway

OPTIONAL = os.environ.get("RESPGATE_SANDBOX_OPTIONAL") == "1"
_AVAILABILITY = LocalSandbox(tempfile.gettempdir()).available()


def _require_sandbox() -> None:
    if not _AVAILABILITY.ok:
        if OPTIONAL:
            pytest.skip(f"RESPGATE_SANDBOX_OPTIONAL=1 and the sandbox cannot start: {_AVAILABILITY.reason}")
        pytest.fail(f"the local sandbox cannot start here: {_AVAILABILITY.reason}")


@pytest.fixture
def base_dir() -> Iterator[Path]:
    # not pytest's tmp_path: its parents are 0700 root, and the containers run as other uids
    path = Path(tempfile.mkdtemp(prefix="respgate-containers-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _gateway(make_gateway: Any, base_dir: Path, *, sandbox: bool = True, **kw: Any) -> LiveGateway:
    if sandbox:
        _require_sandbox()
    kw.setdefault("code_interpreter", "local")
    settings = Settings(
        files_dir=str(base_dir / "files"),
        containers_dir=str(base_dir / "containers"),
        container_memory_bytes=512 << 20,
        **kw,
    )
    live: LiveGateway = make_gateway(settings)
    return live


def _registry(live: LiveGateway) -> ContainerRegistry:
    reg = live.gw.containers
    assert isinstance(reg, ContainerRegistry)
    return reg


def _exact(obj: Any, cls: type) -> bool:
    """The SDK parsed ``obj`` as ``cls`` with every field it declares sent and nothing else."""
    return isinstance(obj, cls) and not obj.model_extra and obj.model_fields_set == set(cls.model_fields)


def _folder(live: LiveGateway, container_id: str) -> Path:
    entry = _registry(live)._entries[container_id]
    assert entry.container is not None
    return Path(entry.container.folder)


def test_containers_and_their_files_through_the_sdk(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(make_gateway, base_dir)
    client = live.openai()
    csv = b"city,rain\nOslo,12\nLima,0\n" * 200
    source = client.files.create(file=("rain.csv", io.BytesIO(csv)), purpose="user_data")
    twin = client.files.create(file=("dir/rain.csv", b"a twin"), purpose="user_data")
    created = client.containers.create(
        name="analysis", file_ids=[source.id, twin.id], expires_after={"anchor": "last_active_at", "minutes": 5}
    )
    assert _exact(created, ContainerCreateResponse), created
    assert created.id.startswith("cntr_") and created.name == "analysis" and created.status == "running"
    assert created.expires_after is not None and created.expires_after.minutes == 5
    assert created.last_active_at == created.created_at
    assert created.network_policy is not None and created.network_policy.type == "disabled"
    retrieved = client.containers.retrieve(created.id)
    assert _exact(retrieved, ContainerRetrieveResponse) and retrieved.id == created.id

    copied, twin_copy = client.containers.files.list(created.id, order="asc")
    assert twin_copy.path == f"/mnt/data/{twin.id}-rain.csv"  # the same name twice: both kept
    assert client.containers.files.content.retrieve(twin_copy.id, container_id=created.id).read() == b"a twin"
    client.containers.files.delete(twin_copy.id, container_id=created.id)
    assert _exact(copied, FileListResponse), copied
    assert copied.id.startswith("cfile_") and copied.path == "/mnt/data/rain.csv"
    assert copied.source == "user" and copied.bytes == len(csv) and copied.container_id == created.id
    assert client.containers.files.content.retrieve(copied.id, container_id=created.id).read() == csv
    assert (_folder(live, created.id) / "rain.csv").read_bytes() == csv

    uploaded = client.containers.files.create(created.id, file=("notes.txt", b"hello container"))
    assert _exact(uploaded, FileCreateResponse) and uploaded.path == "/mnt/data/notes.txt" and uploaded.source == "user"
    again = client.containers.files.retrieve(uploaded.id, container_id=created.id)
    assert _exact(again, FileRetrieveResponse) and again.bytes == len(b"hello container")
    by_id = client.containers.files.create(created.id, file_id=source.id)  # JSON {"file_id": ...}
    assert by_id.path == "/mnt/data/rain.csv" and by_id.id != copied.id  # replaces the copy of that name
    listed = [f.id for f in client.containers.files.list(created.id, order="asc")]
    assert listed == [uploaded.id, by_id.id]
    page = client.containers.files.list(created.id, order="asc", limit=1)
    assert [f.id for f in page.data] == [uploaded.id] and page.has_more
    assert [f.id for f in page.get_next_page().data] == [by_id.id]

    client.containers.files.delete(uploaded.id, container_id=created.id)
    assert not (_folder(live, created.id) / "notes.txt").exists()
    for call in (
        lambda: client.containers.files.retrieve(uploaded.id, container_id=created.id),
        lambda: client.containers.files.content.retrieve(uploaded.id, container_id=created.id),
        lambda: client.containers.files.delete(uploaded.id, container_id=created.id),
    ):
        with pytest.raises(NotFoundError):
            call()

    second = client.containers.create(name="other")
    assert second.memory_limit is None and second.expires_after is not None
    assert second.expires_after.minutes == live.gw.settings.container_idle_minutes
    everything = list(client.containers.list())
    assert all(_exact(c, ContainerListResponse) for c in everything)
    assert [c.id for c in everything] == [second.id, created.id]  # newest first
    assert [c.id for c in client.containers.list(order="asc")] == [created.id, second.id]
    assert [c.id for c in client.containers.list(name="analysis")] == [created.id]
    first_page = client.containers.list(limit=1)
    assert [c.id for c in first_page.data] == [second.id] and first_page.has_more
    assert [c.id for c in first_page.get_next_page().data] == [created.id]

    folder = _folder(live, created.id)
    assert client.containers.delete(created.id) is None
    assert not folder.exists()  # the sandbox container is closed, its folder removed
    for call in (
        lambda: client.containers.retrieve(created.id),
        lambda: client.containers.delete(created.id),
        lambda: client.containers.files.list(created.id),
        lambda: client.containers.files.create(created.id, file=("x.txt", b"x")),
    ):
        with pytest.raises(NotFoundError) as caught:
            call()
        assert caught.value.body["message"] == f"No such Container object: {created.id}"
    assert [c.id for c in client.containers.list()] == [second.id]


def test_a_run_writes_files_that_the_api_serves_and_keeps_state(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(make_gateway, base_dir)
    client = live.openai()
    reg = _registry(live)
    c = client.containers.create(name="runs")
    client.containers.files.create(c.id, file=("input.txt", b"seed"))
    payload = bytes(range(256)) * 40  # every byte value: nothing may be decoded on the way
    first = live.call(
        reg.run(
            None,
            c.id,
            "import os\nsecret = 41\nos.makedirs('out', exist_ok=True)\n"
            f"open('out/blob.bin', 'wb').write({payload!r})\nprint('wrote')",
        )
    )
    assert first.result.ok and first.result.stdout == "wrote\n", first.result
    (made,) = first.files
    assert made.path == "/mnt/data/out/blob.bin" and made.source is FileSource.ASSISTANT
    assert made.bytes == len(payload) and made.container_id == c.id
    listed = {f.id: f for f in client.containers.files.list(c.id)}
    assert listed[made.id].source == "assistant" and listed[made.id].path == made.path
    assert client.containers.files.content.retrieve(made.id, container_id=c.id).read() == payload

    # state between runs; a modified file keeps its id, a deleted one leaves the list
    second = live.call(
        reg.run(
            None, c.id, "open('out/blob.bin', 'ab').write(b'!')\nimport os\nos.remove('input.txt')\nprint(secret + 1)"
        )
    )
    assert second.result.stdout == "42\n" and [f.id for f in second.files] == [made.id], second.result
    assert [f.path for f in client.containers.files.list(c.id)] == ["/mnt/data/out/blob.bin"]
    assert client.containers.files.retrieve(made.id, container_id=c.id).bytes == len(payload) + 1
    assert client.containers.files.content.retrieve(made.id, container_id=c.id).read() == payload + b"!"
    assert client.containers.retrieve(c.id).status == "running"


def test_idle_containers_expire_then_are_gone(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(make_gateway, base_dir, containers_per_tenant=1)
    client = live.openai()
    reg = _registry(live)
    now = [1_900_000_000.0]
    reg.clock = lambda: now[0]
    c = client.containers.create(name="idle", expires_after={"anchor": "last_active_at", "minutes": 2})
    assert c.created_at == int(now[0])
    client.containers.files.create(c.id, file=("a.txt", b"a"))
    folder = _folder(live, c.id)
    now[0] += 100  # a run makes it active again
    live.call(reg.run(None, c.id, "x = 1"))
    assert client.containers.retrieve(c.id).last_active_at == int(now[0])
    now[0] += 119
    assert client.containers.retrieve(c.id).status == "running"  # 119 s idle of 120
    now[0] += 1
    assert live.call(reg.sweep()) == 1  # the sweep expires it without anyone asking
    assert not folder.exists()  # the sandbox container closed
    expired = client.containers.retrieve(c.id)
    assert expired.status == ContainerStatus.EXPIRED.value and _exact(expired, ContainerRetrieveResponse)
    assert list(client.containers.files.list(c.id)) == []
    with pytest.raises(KeyError):
        live.call(reg.run(None, c.id, "x"))
    with pytest.raises(NotFoundError):
        client.containers.files.create(c.id, file=("b.txt", b"b"))
    # an expired container holds no slot: the tenant's one may be created again
    fresh = client.containers.create(name="next")
    now[0] += reg.expired_kept_s
    with pytest.raises(NotFoundError):
        client.containers.retrieve(c.id)
    assert [(x.id, x.status) for x in client.containers.list()] == [(fresh.id, "expired")]  # 20 min idle


def test_a_tenant_never_reaches_anothers_containers(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(make_gateway, base_dir, api_keys=["a:key-a", "b:key-b"])
    a, b = live.openai(api_key="key-a"), live.openai(api_key="key-b")
    secret = a.files.create(file=("s.txt", b"tenant a's secret"), purpose="user_data")
    mine = a.containers.create(name="a's", file_ids=[secret.id])
    (f,) = a.containers.files.list(mine.id)
    for call in (
        lambda: b.containers.retrieve(mine.id),
        lambda: b.containers.delete(mine.id),
        lambda: b.containers.files.list(mine.id),
        lambda: b.containers.files.retrieve(f.id, container_id=mine.id),
        lambda: b.containers.files.content.retrieve(f.id, container_id=mine.id),
        lambda: b.containers.files.delete(f.id, container_id=mine.id),
        lambda: b.containers.files.create(mine.id, file=("x.txt", b"x")),
    ):
        with pytest.raises(NotFoundError) as caught:
            call()
        assert caught.value.body["message"] == f"No such Container object: {mine.id}"  # as for an unknown id
    with pytest.raises(NotFoundError) as caught:
        b.containers.create(name="steal", file_ids=[secret.id])
    assert caught.value.body["message"] == f"No such File object: {secret.id}"
    theirs = b.containers.create(name="b's")
    with pytest.raises(NotFoundError) as caught:
        b.containers.files.create(theirs.id, file_id=secret.id)
    assert secret.id in caught.value.body["message"]
    with pytest.raises(KeyError):
        live.call(_registry(live).run("b", mine.id, "print(1)"))
    assert [c.id for c in b.containers.list()] == [theirs.id] and [c.id for c in a.containers.list()] == [mine.id]
    assert a.containers.files.content.retrieve(f.id, container_id=mine.id).read() == b"tenant a's secret"


def test_quotas_and_bounds(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(
        make_gateway,
        base_dir,
        api_keys=["a:key-a", "b:key-b"],
        containers_per_tenant=2,
        containers_max=3,
        container_file_max_bytes=64 * 1024,
        container_disk_bytes=1 << 20,
    )
    a, b = live.openai(api_key="key-a"), live.openai(api_key="key-b")
    first = a.containers.create(name="1")
    a.containers.create(name="2")
    with pytest.raises(BadRequestError) as caught:
        a.containers.create(name="3")
    assert caught.value.code == "quota_exceeded" and "containers_per_tenant" in caught.value.message
    b.containers.create(name="b1")
    with pytest.raises(APIStatusError) as full:
        b.containers.create(name="b2")
    assert full.value.status_code == 503 and "containers_max" in full.value.message
    a.containers.delete(first.id)
    b.containers.create(name="b2")  # the slot is free again

    c = b.containers.list().data[0]
    with pytest.raises(APIStatusError) as big:
        b.containers.files.create(c.id, file=("big.bin", b"x" * (64 * 1024 + 1)))
    assert big.value.status_code == 413 and "container_file_max_bytes" in big.value.message
    assert sorted(os.listdir(_folder(live, c.id))) == []  # nothing of it kept
    kept = 0
    for i in range(20):  # 64 KiB each into 1 MiB: refused at the 16th or 17th, whatever the block sizes
        try:
            b.containers.files.create(c.id, file=(f"f{i}.bin", b"y" * (64 * 1024)))
        except BadRequestError as exc:
            disk = exc
            break
        kept += 1
    assert 14 <= kept <= 16, kept
    assert disk.code == "quota_exceeded" and "container_disk_bytes" in disk.message
    assert len(os.listdir(_folder(live, c.id))) == kept
    with pytest.raises(BadRequestError) as long_name:
        b.containers.create(name="n" * 257)
    assert long_name.value.body["param"] == "name"
    with pytest.raises(BadRequestError) as allow:
        b.containers.create(name="net", network_policy={"type": "allowlist", "allowed_domains": ["x.test"]})
    assert "network_policy" in str(allow.value.body["param"])


def test_hostile_file_names_and_planted_links_stay_inside(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(make_gateway, base_dir)
    client = live.openai()
    c = client.containers.create(name="names")
    folder = _folder(live, c.id)
    outside = base_dir / "outside.txt"
    outside.write_bytes(b"host file")
    outside.chmod(0o666)
    for name in ("../../x", "..\\..\\y", "/etc/z", ".."):
        f = client.containers.files.create(c.id, file=(name, b"inside"))
        assert f.path.count("/") == 3 and f.path.startswith("/mnt/data/") and ".." not in f.path, f.path
        assert (folder / f.path.removeprefix("/mnt/data/")).read_bytes() == b"inside"
    assert sorted(os.listdir(folder)) == ["upload", "x", "y", "z"]
    assert not (base_dir / "x").exists() and not (base_dir / "containers" / "x").exists()
    # the code plants a link to a host path; an upload of that name replaces the link, never
    # writes through it, and a read of a link is refused
    reg = _registry(live)
    planted = live.call(reg.run(None, c.id, f"import os\nos.symlink({str(outside)!r}, 'report.txt')"))
    assert planted.result.ok, planted.result
    f = client.containers.files.create(c.id, file=("report.txt", b"upload"))
    assert outside.read_bytes() == b"host file" and not (folder / "report.txt").is_symlink()
    assert client.containers.files.content.retrieve(f.id, container_id=c.id).read() == b"upload"


def test_off_answers_404_naming_the_setting(make_gateway: Any, base_dir: Path) -> None:
    off = _gateway(make_gateway, base_dir, sandbox=False, code_interpreter="off")
    assert off.gw.containers is None
    with pytest.raises(NotFoundError) as caught:
        off.openai().containers.create(name="x")
    assert caught.value.code == "containers_off" and "code_interpreter" in caught.value.message
    r = httpx.get(f"{off.url}/v1/containers")
    assert r.status_code == 404 and "setting code_interpreter is 'off'" in r.json()["error"]["message"]


def test_tenants_not_listed_get_the_same_404(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(make_gateway, base_dir, api_keys=["a:key-a", "b:key-b"], code_interpreter_tenants=["a"])
    a, b = live.openai(api_key="key-a"), live.openai(api_key="key-b")
    mine = a.containers.create(name="a")
    with pytest.raises(NotFoundError) as caught:
        b.containers.list()
    assert caught.value.code == "containers_off" and "code_interpreter_tenants" in caught.value.message
    with pytest.raises(NotFoundError):
        b.containers.retrieve(mine.id)


def test_shutdown_ends_every_container(base_dir: Path) -> None:
    from tests.conftest import start_gateway, stop_gateway

    _require_sandbox()
    live = start_gateway(
        Settings(
            files_dir=str(base_dir / "files"), containers_dir=str(base_dir / "containers"), code_interpreter="local"
        )
    )
    try:
        c = live.openai().containers.create(name="left running")
        folder = _folder(live, c.id)
        pid = getattr(_registry(live)._entries[c.id].container, "pid", None)
        assert folder.exists() and pid is not None
    finally:
        stop_gateway(live)
    assert not folder.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x", "model": "m"}, "model"),
        ({"name": "x", "expires_after": {"anchor": "created_at", "minutes": 5}}, "expires_after.anchor"),
        ({"name": "x", "expires_after": {"anchor": "last_active_at", "minutes": 0}}, "expires_after.minutes"),
        ({"name": "x", "memory_limit": "2g"}, "memory_limit"),
        ({"name": "x", "file_ids": ["f"] * 101}, "file_ids"),
        ({"name": "x", "skills": []}, "skills"),
    ],
)
def test_bad_create_bodies_are_400s_naming_the_field(
    make_gateway: Any, base_dir: Path, body: dict[str, Any], param: str
) -> None:
    live = _gateway(make_gateway, base_dir, sandbox=False)
    r = httpx.post(f"{live.url}/v1/containers", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert _registry(live)._entries == {}


def test_bad_file_requests_are_clear_4xx(make_gateway: Any, base_dir: Path) -> None:
    live = _gateway(make_gateway, base_dir)
    c = live.openai().containers.create(name="bodies")
    url = f"{live.url}/v1/containers/{c.id}/files"
    for kw, status, param in (
        ({"json": {}}, 400, "file_id"),
        ({"json": {"file_id": 7}}, 400, "file_id"),
        ({"json": {"file_id": "file-x", "path": "/etc"}}, 400, "path"),
        ({"json": {"file_id": "file-nope"}}, 404, "file_id"),
        ({"content": b"x", "headers": {"content-type": "text/plain"}}, 415, None),
        ({"files": {"other": ("a.txt", b"a")}}, 400, "other"),
        ({"data": {"purpose": "x"}, "files": {"file": ("a.txt", b"a")}}, 400, "purpose"),
    ):
        r = httpx.post(url, **kw)
        assert r.status_code == status and r.json()["error"]["param"] == param, (kw, r.text)
    assert os.listdir(_folder(live, c.id)) == []
    r = httpx.get(f"{url}?limit=0")
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
