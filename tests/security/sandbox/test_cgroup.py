"""security.sandbox.cgroup against fake cgroup trees (issue 34): the v2 layout (this project's hosts have
cgroup v1, so the v2 files are checked here by name and content), the fallbacks' reasons, the wrapper
that joins a cgroup before exec, and the sweep of a dead gateway's leftovers. The real hierarchy is
exercised by the escape suite (tests/security/sandbox/test_escapes.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from security.sandbox import cgroup as cgroups


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def creating_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """In cgroupfs the kernel makes a new cgroup's files; a plain folder needs the write to create them."""
    monkeypatch.setattr(cgroups, "_write", lambda path, value: Path(path).write_text(value))


def test_v2_delegated_cgroup_is_used_and_limits_are_written(tmp_path: Path, creating_writes: None) -> None:
    _tree(
        tmp_path,
        {
            "cgroup.controllers": "cpu memory pids",
            "app/cgroup.controllers": "memory pids",
            "app/cgroup.subtree_control": "",
            "app/cgroup.procs": "",
            "app/respgate-sandbox/cgroup.subtree_control": "memory pids",
        },
    )
    (tmp_path / "self").write_text("0::/app\n")
    setup, why = cgroups.detect(tmp_path, str(tmp_path / "self"))
    assert setup is not None, why
    assert setup.version == 2 and setup.memory_parent == setup.pids_parent == tmp_path / "app/respgate-sandbox"
    assert (tmp_path / "app/cgroup.subtree_control").read_text() == "+memory +pids"
    tree = cgroups.TreeCgroup(setup, "g1-c", 256 << 20, 16)
    assert (tree.memory_dir / "memory.max").read_text() == str(256 << 20)
    assert (tree.pids_dir / "pids.max").read_text() == "16"
    assert tree.procs_files == [str(tmp_path / "app/respgate-sandbox/g1-c/cgroup.procs")]
    (tree.memory_dir / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    (tree.pids_dir / "pids.events").write_text("max 5\n")
    assert tree.oom_kills() == 2 and tree.pids_max_hits() == 5


def test_v2_without_the_controllers_falls_to_v1_then_reports_both(tmp_path: Path) -> None:
    """This project's hosts: an empty cgroup2 at /sys/fs/cgroup/unified (the controllers are v1's)."""
    _tree(tmp_path, {"unified/cgroup.controllers": "", "memory/cgroup.procs": "", "memory/a/cgroup.procs": ""})
    (tmp_path / "self").write_text("4:memory:/a\n8:pids:/\n0::/\n")
    setup, why = cgroups.detect(tmp_path, str(tmp_path / "self"))  # and v1 lacks its pids hierarchy
    assert setup is None
    assert "memory/pids controllers not available" in why and "no pids hierarchy" in why, why


def test_v1_uses_the_gateways_own_cgroup_in_each_hierarchy(tmp_path: Path, creating_writes: None) -> None:
    _tree(tmp_path, {"memory/cgroup.procs": "", "memory/a/b/cgroup.procs": "", "pids/cgroup.procs": ""})
    (tmp_path / "self").write_text("4:memory:/a/b\n8:pids:/\n0::/\n")
    setup, why = cgroups.detect(tmp_path, str(tmp_path / "self"))
    assert setup is not None and setup.version == 1, why
    assert setup.memory_parent == tmp_path / "memory/a/b/respgate-sandbox"
    assert setup.pids_parent == tmp_path / "pids/respgate-sandbox"
    tree = cgroups.TreeCgroup(setup, "g1-c", 1 << 30, 64)
    assert (tree.memory_dir / "memory.limit_in_bytes").read_text() == str(1 << 30)
    assert not (tree.memory_dir / "memory.memsw.limit_in_bytes").exists()  # only set where swap accounting is
    assert (tree.pids_dir / "pids.max").read_text() == "64"
    (tree.memory_dir / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert tree.oom_kills() == 3


def test_a_failed_limit_write_leaves_no_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup = cgroups.CgroupSetup(1, tmp_path / "m", tmp_path / "p")
    setup.memory_parent.mkdir()
    setup.pids_parent.mkdir()

    def refuse(path: Path, value: str) -> None:
        raise PermissionError(13, "read-only", str(path))

    monkeypatch.setattr(cgroups, "_write", refuse)
    with pytest.raises(PermissionError):
        cgroups.TreeCgroup(setup, "g1-c", 1 << 30, 64)
    assert list(setup.memory_parent.iterdir()) == [] and list(setup.pids_parent.iterdir()) == []


def test_the_wrapper_joins_before_it_execs(tmp_path: Path) -> None:
    """The pid written to every cgroup.procs is the one the command then runs as (exec, not fork)."""
    procs = [tmp_path / "m.procs", tmp_path / "p.procs"]
    done = subprocess.run(
        cgroups.join_argv([str(p) for p in procs], ["/bin/sh", "-c", "echo $$"]),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert [p.read_text().strip() for p in procs] == [done.stdout.strip()] * 2
    refused = subprocess.run(
        cgroups.join_argv([str(tmp_path / "missing" / "cgroup.procs")], ["/bin/echo", "ran"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == cgroups.JOIN_FAILED and "ran" not in refused.stdout


def test_sweep_removes_only_a_dead_gateways_cgroups(tmp_path: Path) -> None:
    setup = cgroups.CgroupSetup(2, tmp_path, tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"g{dead.pid}-cntr_a", cgroups.container_name("cntr_b"), f"g{os.getppid()}-cntr_c", "other"):
        (tmp_path / name).mkdir()
    removed = cgroups.sweep_stale(setup)
    assert removed == [str(tmp_path / f"g{dead.pid}-cntr_a")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [cgroups.container_name("cntr_b"), f"g{os.getppid()}-cntr_c", "other"]
    )


async def test_remove_reports_a_cgroup_it_could_not_remove(tmp_path: Path, creating_writes: None) -> None:
    setup = cgroups.CgroupSetup(2, tmp_path, tmp_path)
    gone = cgroups.TreeCgroup(setup, "g1-a", 1 << 30, 64)
    for f in gone.memory_dir.iterdir():  # a real cgroup's files go with it; a plain folder's must go first
        f.unlink()
    assert await gone.remove() and not gone.memory_dir.exists()
    stays = cgroups.TreeCgroup(setup, "g1-b", 1 << 30, 64)  # its files keep the plain folder non-empty
    assert not await stays.remove(wait_s=0.1) and stays.memory_dir.exists()
