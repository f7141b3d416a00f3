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
