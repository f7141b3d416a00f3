"""Whole-tree memory and process bounds for local sandbox containers: one cgroup each (issue 34).

rlimits are per process: ``RLIMIT_AS`` lets each of a container's processes have ``memory_bytes``, so 64
processes could hold 64 of them. A cgroup bounds the tree as a whole: every process of a container is born
into its own cgroup, whose memory limit (anonymous memory, and the tmpfs pages and page cache it writes)
and pids limit (processes and threads) count all of them together.

**Detection** (:func:`detect`), in order:

- **cgroup v2** (the unified hierarchy at ``/sys/fs/cgroup`` or ``/sys/fs/cgroup/unified``) when the
  ``memory`` and ``pids`` controllers are available to the gateway's own cgroup: containers go under
  ``<own cgroup>/respgate-sandbox/``. Enabling the controllers for children needs a cgroup without
  processes of its own (the kernel's "no internal processes" rule), so when the gateway's cgroup holds
  processes they are first moved to a leaf ``<own cgroup>/respgate-gateway`` — what a container's init
  does with a delegated cgroup (systemd ``Delegate=yes``, Docker/Kubernetes with a private cgroup
  namespace and a writable ``/sys/fs/cgroup``).
- **cgroup v1** (``memory`` and ``pids`` hierarchies mounted separately, as on this project's CI hosts):
  ``<mount>/<own cgroup>/respgate-sandbox/<id>`` in each; needs root (or a writable hierarchy).
- **neither writable** (an unprivileged gateway without delegation, a container with a read-only
  ``/sys/fs/cgroup``): ``None`` with the reason; the sandbox then keeps only the per-process rlimits and
  says so in ``available().details["cgroup"]``.

The container cgroup is created before the container starts and removed at close. Processes join it
race-free: the container's command line starts with a tiny ``/bin/sh`` wrapper (:func:`join_argv`) that
writes its own pid into the cgroup's ``cgroup.procs`` files and only then ``exec``s ``setpriv``/``bwrap``:
the pid is the same through the exec, so bwrap, its init and the interpreter are all forked from a
process already inside — no descendant is ever created outside, which moving a pid after spawn (bwrap
forks at once) could not promise. A wrapper that cannot join exits 125 before anything else runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

GROUP = "respgate-sandbox"
GATEWAY_LEAF = "respgate-gateway"
JOIN_FAILED = 125  # the wrapper's exit status when it could not join the cgroup
_JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True, slots=True)
class CgroupSetup:
    """Where container cgroups go: ``version`` 2 (one ``parent`` for both controllers) or 1 (one each)."""

    version: int
    memory_parent: Path
    pids_parent: Path

    def describe(self) -> str:
        if self.version == 2:
            return f"v2 (memory.max, pids.max) under {self.memory_parent}"
        return f"v1 (memory.limit_in_bytes, pids.max) under {self.memory_parent} and {self.pids_parent}"


def _own_paths(self_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup``: controller (``""`` for v2) -> the gateway's cgroup path."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in self_cgroup.read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                for ctrl in parts[1].split(",") if parts[1] else [""]:
                    out[ctrl] = parts[2]
    return out


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)  # one write(2) of the whole value, as cgroupfs wants
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _v2(root: Path, own: str) -> tuple[CgroupSetup | None, str]:
    mount = next((m for m in (root, root / "unified") if (m / "cgroup.controllers").is_file()), None)
    if mount is None:
        return None, "no cgroup v2 mount"
    here = mount / own.lstrip("/")
    try:
        available = set((here / "cgroup.controllers").read_text().split())
    except OSError as e:
        return None, f"cgroup v2: {e}"
    if not {"memory", "pids"} <= available:
        have = " ".join(sorted(available)) or "none"
        return None, f"cgroup v2 at {mount}: memory/pids controllers not available here ({have})"
    try:
        enabled = set((here / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            try:
                _write(here / "cgroup.subtree_control", "+memory +pids")
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                # processes in this cgroup: move them all to a leaf, then enable (no internal processes)
                leaf = here / GATEWAY_LEAF
                leaf.mkdir(exist_ok=True)
                for _ in range(10):
                    pids = (here / "cgroup.procs").read_text().split()
                    if not pids:
                        break
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError, OSError):
                            _write(leaf / "cgroup.procs", pid)
                _write(here / "cgroup.subtree_control", "+memory +pids")
        group = here / GROUP
        group.mkdir(exist_ok=True)
        if not {"memory", "pids"} <= set((group / "cgroup.subtree_control").read_text().split()):
            _write(group / "cgroup.subtree_control", "+memory +pids")
    except OSError as e:
        return None, f"cgroup v2 at {here} not writable (no delegation?): {e}"
    return CgroupSetup(2, group, group), ""


def _v1(root: Path, own: dict[str, str]) -> tuple[CgroupSetup | None, str]:
    parents: dict[str, Path] = {}
    for ctrl in ("memory", "pids"):
        mount = root / ctrl
        if not (mount / "cgroup.procs").is_file() or ctrl not in own:
            return None, f"cgroup v1: no {ctrl} hierarchy at {mount}"
        group = mount / own[ctrl].lstrip("/") / GROUP
        try:
            group.mkdir(exist_ok=True)
        except OSError as e:
            return None, f"cgroup v1 {ctrl} at {group.parent} not writable: {e}"
        parents[ctrl] = group
    return CgroupSetup(1, parents["memory"], parents["pids"]), ""


def detect(
    root: str | os.PathLike[str] = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup"
) -> tuple[CgroupSetup | None, str]:
    """The cgroup setup for container cgroups on this host, or ``None`` and why not (for the operator)."""
    base = Path(root)
    own = _own_paths(Path(self_cgroup))
    setup, why2 = _v2(base, own.get("", "/"))
    if setup is not None:
        return setup, ""
    setup, why1 = _v1(base, own)
    if setup is not None:
        return setup, ""
    return None, f"{why2}; {why1}"


def container_name(cid: str) -> str:
    """A container's cgroup name: the gateway's pid first, so a later gateway can tell a dead one's."""
    return f"g{os.getpid()}-{cid}"


def sweep_stale(setup: CgroupSetup) -> list[str]:
    """Remove the cgroups that gateways which have since died left behind (a gateway killed without
    closing its containers: the kernel ended the processes, the empty cgroups stay). Only those whose
    gateway pid is gone, and only if empty (the kernel refuses to remove one with a process in it)."""
    removed: list[str] = []
    for parent in {setup.memory_parent, setup.pids_parent}:
        with contextlib.suppress(OSError):
            for d in parent.iterdir():
                gateway = d.name[1:].split("-", 1)[0]
                if not d.is_dir() or not d.name.startswith("g") or not gateway.isdigit():
                    continue
                if int(gateway) == os.getpid() or _alive(int(gateway)):
                    continue
                with contextlib.suppress(OSError):
                    d.rmdir()
                    removed.append(str(d))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TreeCgroup:
    """One container's cgroup(s): limits written at creation, counters read per run, removed at close."""

    def __init__(self, setup: CgroupSetup, name: str, memory_bytes: int, processes: int) -> None:
        self.setup = setup
        self.memory_bytes = memory_bytes
        self.processes = processes
        if setup.version == 2:
            self.dirs: tuple[Path, ...] = (setup.memory_parent / name,)
        else:
            self.dirs = (setup.memory_parent / name, setup.pids_parent / name)
        self.memory_dir = self.dirs[0]
        self.pids_dir = self.dirs[-1]
        made: list[Path] = []
        try:
            for d in self.dirs:
                d.mkdir()
                made.append(d)
            if setup.version == 2:
                _write(self.memory_dir / "memory.max", str(memory_bytes))
                if (self.memory_dir / "memory.swap.max").exists():
                    _write(self.memory_dir / "memory.swap.max", "0")
            else:
                _write(self.memory_dir / "memory.limit_in_bytes", str(memory_bytes))
                if (self.memory_dir / "memory.memsw.limit_in_bytes").exists():  # swap accounting on: no swap
                    _write(self.memory_dir / "memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(self.pids_dir / "pids.max", str(processes))
        except BaseException:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def join_argv(self, argv: list[str]) -> list[str]:
        return join_argv(self.procs_files, argv)

    def _counter(self, path: Path, key: str) -> int:
        try:
            for line in path.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def oom_kills(self) -> int:
        """Processes of the container the kernel's OOM killer ended so far (at the memory limit)."""
        if self.setup.version == 2:
            return self._counter(self.memory_dir / "memory.events", "oom_kill")
        return self._counter(self.memory_dir / "memory.oom_control", "oom_kill")

    def pids_max_hits(self) -> int:
        """Forks (or thread creations) refused so far because the container was at ``pids.max``."""
        return self._counter(self.pids_dir / "pids.events", "max")

    def memory_peak(self) -> int | None:
        name = "memory.peak" if self.setup.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.memory_dir / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (``cgroup.kill`` where the kernel has it)."""
        if self.setup.version == 2 and (self.memory_dir / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.memory_dir / "cgroup.kill", "1")
                return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def remove(self, wait_s: float = 5.0) -> bool:
        """Kill what is left and remove the cgroup(s); the kernel refuses (EBUSY) while a process, even a
        dying one, is inside, so retry briefly without blocking the event loop. False if one stayed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        left, stuck = list(self.dirs), []
        while left:
            self.kill()
            for d in list(left):
                try:
                    d.rmdir()
                    left.remove(d)
                except FileNotFoundError:
                    left.remove(d)
                except OSError as e:
                    if e.errno != errno.EBUSY:  # not a process still leaving: retrying will not help
                        left.remove(d)
                        stuck.append(d)
            if not left or loop.time() > deadline:
                break
            await asyncio.sleep(0.005)  # the kernel releases a dying process within ms
        return not left and not stuck


def join_argv(procs_files: list[str], argv: list[str]) -> list[str]:
    """``argv`` run by a ``/bin/sh`` that first writes its own pid into each ``cgroup.procs``, then
    ``exec``s it (same pid): everything the command forks is born inside the cgroup(s)."""
    return ["/bin/sh", "-c", _JOIN_SCRIPT, "sh", *procs_files, "--", *argv]
