"""The sandbox interface the ``code_interpreter`` tool runs code through (issue 34).

A backend creates **containers**: each one a private writable folder (``/mnt/data`` inside, OpenAI's
code-interpreter convention) plus a persistent interpreter, so variables and files survive from one
``run`` to the next. ``run(code, timeout)`` never raises for what the code did: a runaway, a crash or
a quota hit comes back as a :class:`RunResult` whose ``failure`` says which (the model sees that),
with logs capped in bytes. Only a misuse of the handle (a closed container) raises.

Backends: ``local`` (:mod:`security.sandbox.local`, bubblewrap namespaces on this host, a cgroup per
container where one is writable: :mod:`security.sandbox.cgroup`); a
Kubernetes one (a pod per container) is to come behind the same protocol.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol


class Failure(enum.StrEnum):
    """Why a run did not complete normally. An exception raised by the code itself is not a
    failure of the sandbox: it is ``failure=None`` with ``error`` set and ``exit_status=1``."""

    TIMEOUT = "timeout"  # wall time (parent) or CPU time (RLIMIT_CPU) ran out
    MEMORY = "memory"  # the address-space limit (MemoryError), or the container's cgroup limit (OOM killer)
    OUTPUT_TOO_LARGE = "output_too_large"  # stdout/stderr past the cap (what fit is returned)
    DISK_FULL = "disk_full"  # per-file size (RLIMIT_FSIZE), the folder quota or /tmp's size
    KILLED = "killed"  # ended by a signal that was not ours (or by close() during the run)
    CRASHED = "crashed"  # the interpreter exited or broke the protocol


class FileChange(enum.StrEnum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A file under the container folder that a run created, modified or deleted; ``path`` is
    relative to the folder (``/mnt/data`` inside), computed on the host, never reported by the
    sandbox itself."""

    path: str
    change: FileChange
    size: int


@dataclass(frozen=True, slots=True)
class RunResult:
    stdout: str
    stderr: str
    exit_status: int | None  # 0 ran through, 1 raised, n for sys.exit(n); None when it never finished
    failure: Failure | None = None
    error: str | None = None  # the exception's last line, or what the failure was, model-visible
    files: tuple[FileEntry, ...] = ()
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    state_lost: bool = False  # the interpreter was ended: the next run starts with empty globals
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None and self.exit_status == 0


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-container bounds. Defaults suit data analysis on a shared host; tests shrink them."""

    memory_bytes: int = 1 << 30  # the container's processes together (cgroup), and RLIMIT_AS of each
    cpu_seconds_total: int = 600  # RLIMIT_CPU hard: the container's whole life
    processes: int = 64  # processes and threads together (cgroup pids.max), and RLIMIT_NPROC inside
    open_files: int = 256  # RLIMIT_NOFILE
    file_bytes: int = 256 << 20  # RLIMIT_FSIZE: the largest single file
    folder_bytes: int = 1 << 30  # the container folder as a whole (checked while the code runs)
    tmp_bytes: int = 64 << 20  # /tmp, a tmpfs of this size (memory)
    shm_bytes: int = 16 << 20  # /dev/shm, a tmpfs of this size (memory; the rest of /dev is read-only)
    output_bytes: int = 64 << 10  # each of stdout and stderr, per run
    default_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Availability:
    ok: bool
    reason: str = ""  # why not, for the operator (e.g. "bwrap not found", "no user namespaces")
    details: dict[str, str] = field(default_factory=dict)


class Container(Protocol):
    """One container: a folder and an interpreter; ``run`` calls are serialized per container."""

    @property
    def id(self) -> str: ...

    @property
    def folder(self) -> str:
        """The container folder on the host (``/mnt/data`` inside)."""
        ...

    async def run(self, code: str, timeout: float | None = None) -> RunResult: ...

    async def close(self) -> None:
        """End every process of the container; idempotent. The folder is removed too."""
        ...


class Sandbox(Protocol):
    def available(self) -> Availability: ...

    async def create(self, container_id: str | None = None) -> Container: ...
