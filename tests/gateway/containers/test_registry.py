"""The container registry over a fake sandbox (no bubblewrap needed): runs on one container never
overlap, a container is never expired in the middle of a run, and a container that finishes
starting after shutdown began is closed, not left running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.base.settings import Settings
from gateway.containers.registry import ContainerRegistry
from gateway.files.files import Files
from gateway.wire.errors import ApiError
from security.sandbox.base import Availability, RunResult


class FakeContainer:
    def __init__(self, cid: str, folder: str) -> None:
        self._id, self._folder = cid, folder
        self.running = 0
        self.overlapped = False
        self.closed = False
        self.release = asyncio.Event()
        self.release.set()

    @property
    def id(self) -> str:
        return self._id

    @property
    def folder(self) -> str:
        return self._folder

    async def run(self, code: str, timeout: float | None = None) -> RunResult:
        if self.closed:
            raise RuntimeError("closed")
        self.running += 1
        self.overlapped |= self.running > 1
        await asyncio.sleep(0)
        await self.release.wait()
        await asyncio.sleep(0)
        self.running -= 1
        return RunResult(code, "", 0)

    async def close(self) -> None:
        self.closed = True


class FakeSandbox:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.made: list[FakeContainer] = []
        self.gate = asyncio.Event()
        self.gate.set()

    def available(self) -> Availability:
        return Availability(True)

    async def create(self, container_id: str | None = None) -> FakeContainer:
        await self.gate.wait()
        folder = self.base / str(container_id)
        folder.mkdir(parents=True)
        c = FakeContainer(str(container_id), str(folder))
        self.made.append(c)
        return c


def _registry(tmp_path: Path) -> tuple[ContainerRegistry, FakeSandbox, list[float]]:
    settings = Settings(code_interpreter="local", files_dir=str(tmp_path / "files"))
    sandbox = FakeSandbox(tmp_path / "containers")
    now = [1_900_000_000.0]
    reg = ContainerRegistry(settings, Files.embedded(settings), sandbox, clock=lambda: now[0])
    return reg, sandbox, now


async def test_runs_on_one_container_take_turns(tmp_path: Path) -> None:
    reg, sandbox, _ = _registry(tmp_path)
    record = await reg.create(None, name="turns")
    runs = [asyncio.create_task(reg.run(None, record.id, f"print({i})")) for i in range(5)]
    done = await asyncio.gather(*runs)
    assert [d.result.stdout for d in done] == [f"print({i})" for i in range(5)]  # in arrival order
    assert not sandbox.made[0].overlapped


async def test_a_container_is_not_expired_under_a_run(tmp_path: Path) -> None:
    reg, sandbox, now = _registry(tmp_path)
    record = await reg.create(None, name="long", idle_minutes=1)
    container = sandbox.made[0]
    container.release.clear()
    run = asyncio.create_task(reg.run(None, record.id, "slow"))
    while container.running == 0:
        await asyncio.sleep(0)
    now[0] += 3600
    assert await reg.sweep() == 0 and not container.closed
    assert (await reg.get(None, record.id)) is not None
    container.release.set()
    assert (await run).result.exit_status == 0
    assert await reg.sweep() == 0  # active again at the end of the run
    now[0] += 60
    assert await reg.sweep() == 1 and container.closed


async def test_a_container_started_during_shutdown_is_closed(tmp_path: Path) -> None:
    reg, sandbox, _ = _registry(tmp_path)
    sandbox.gate.clear()
    create = asyncio.create_task(reg.create(None, name="late"))
    await asyncio.sleep(0.01)
    await reg.aclose()
    sandbox.gate.set()
    with pytest.raises(ApiError) as caught:
        await create
    assert caught.value.status == 503
    assert [c.closed for c in sandbox.made] == [True]


class RemoteContainer(FakeContainer):
    """A container whose folder is not on this host (a pod): files only through the sandbox."""

    def __init__(self, cid: str) -> None:
        super().__init__(cid, "")
        self.stored: dict[str, bytes] = {}

    @property
    def folder(self) -> str:
        raise NotImplementedError("a pod's folder is not on this host")

    async def write_file(self, path: str, data: bytes) -> None:
        if path in ("a-folder",):
            raise ValueError("a folder there")
        self.stored[path] = data

    async def delete_file(self, path: str) -> None:
        if path not in self.stored:
            raise FileNotFoundError(path)
        del self.stored[path]

    async def read_file(self, path: str, max_bytes: int = 64 << 20) -> bytes:
        return self.stored[path][:max_bytes]


class RemoteSandbox(FakeSandbox):
    async def create(self, container_id: str | None = None) -> FakeContainer:
        c = RemoteContainer(str(container_id))
        self.made.append(c)
        return c


async def test_a_container_without_a_host_folder_takes_files_through_the_sandbox(tmp_path: Path) -> None:
    """code_interpreter=kubernetes: uploads, reads and deletes go through the sandbox's file calls
    (never a host path), and the room left is what the index holds."""
    settings = Settings(code_interpreter="kubernetes", files_dir=str(tmp_path / "files"), container_disk_bytes=2 << 20)
    sandbox = RemoteSandbox(tmp_path / "unused")
    reg = ContainerRegistry(settings, Files.embedded(settings), sandbox)
    record = await reg.create(None, name="pod")
    pod = sandbox.made[0]
    assert isinstance(pod, RemoteContainer)

    upload = await reg.upload(None, record.id)
    await upload.write(b"a,b\n1,2\n")
    f = await upload.finish("../../data.csv")
    assert f.path == "/mnt/data/data.csv" and pod.stored == {"data.csv": b"a,b\n1,2\n"}
    assert await reg.read(None, record.id, f.id) == b"a,b\n1,2\n"

    big = await reg.upload(None, record.id)
    await big.write(b"x" * (1 << 20))
    await big.finish("one.bin")
    over = await reg.upload(None, record.id)
    with pytest.raises(ApiError) as full:
        await over.write(b"y" * (1 << 20))  # 1 MiB + 8 bytes held: no room for another MiB
    await over.abort()
    assert full.value.status == 400 and set(pod.stored) == {"data.csv", "one.bin"}

    bad = await reg.upload(None, record.id)
    await bad.write(b"z")
    with pytest.raises(ApiError) as folder:
        await bad.finish("a-folder")
    assert folder.value.status == 400

    assert await reg.delete_file(None, record.id, f.id)
    assert "data.csv" not in pod.stored
    await reg.aclose()
