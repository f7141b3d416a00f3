"""The ``local`` sandbox: each container a process tree under bubblewrap on this host (issue 34).

One container = one ``bwrap`` with every namespace of its own (user, pid, net, mount, ipc, uts,
cgroup; no further user namespaces inside), ``--die-with-parent`` and a new session, running the
REPL server (:mod:`security.sandbox.repl_server`) on the host's ``/usr/bin/python3`` with a clean
environment. Inside it sees: ``/usr`` (and the merged-usr links) and a few files of ``/etc``
read-only; a fresh ``/proc`` of its own pid namespace; a minimal read-only ``/dev``; three sized
tmpfs (``/tmp``: ``Limits.tmp_bytes``, ``/dev/shm``: ``Limits.shm_bytes``, ``/run/out``: the
captured output); ``/mnt/data``, its container folder on the host, writable; nothing else — not
the gateway's checkout, venv, ``/root``, keys or environment. Root is a read-only tmpfs. A small
seccomp filter (:mod:`security.sandbox.seccomp`) denies ptrace, mounts, namespaces, bpf, io_uring
and the like. Run as root, the gateway first drops to the container's own uid (below; ``host_uid``,
nobody, with ``uid_range=None``) with ``setpriv``, so even an escape lands as an unprivileged user.
bwrap gets a parent-death signal (``setpriv --pdeathsig``) and its sandbox ``--die-with-parent``: a
gateway that dies leaves no container running.

Bounds: a cgroup per container (:mod:`security.sandbox.cgroup`: v2 or v1, detected) bounds the whole
tree — ``Limits.memory_bytes`` of memory (memory.max / memory.limit_in_bytes, no swap) and
``Limits.processes`` processes and threads (pids.max) for all its processes together; every process is
born inside it (a ``/bin/sh`` wrapper joins it, then execs setpriv/bwrap). The OOM killer ending a
process is reported as ``Failure.MEMORY``; a fork at pids.max fails inside with ``BlockingIOError``.
Where no cgroup is writable (an unprivileged gateway without a delegated cgroup), the container keeps
only the per-process rlimits and ``available().details["cgroup"]`` says so. Those rlimits are set by
the server on itself in any case before any code runs (address space, processes — counted per user
namespace on Linux >= 5.14 —, open files, file size, CPU: a per-run soft limit under a whole-life
hard one); wall time enforced here (the whole tree is killed: bwrap's process
group, and with it the pid namespace); the folder's total size polled while code runs (killed past
``Limits.folder_bytes``); stdout/stderr capped inside and every reply frame size-checked here, so a
container cannot make the gateway hold unbounded memory. Everything is asyncio: a runaway container
never blocks the event loop. Files are listed, and read for the files API (:meth:`read_file`), on
the host without following links.

**Per-container uid.** Run as root, each container gets a host uid of its own from ``uid_range``
(default 0x70000000 + 0..65535, a range no distribution allocates: systemd leaves it unused), held by
an ``flock`` on ``<uid_lock_dir>/<uid>`` for the container's life (released by the kernel if the
gateway dies, shared by every gateway process on the host), and its folder is owned by that uid, 0700.
So even code that escaped the namespaces cannot signal, ptrace or read another container's processes or
folder (different uids), nor the gateway's (root). Unprivileged, a gateway cannot change uid: all its
containers run as the gateway's own uid (``details["uid"]`` says which).

**Runtime.** The sandbox runs the host's ``/usr/bin/python3`` (``/usr`` read-only), so its packages are
the host's: ``make test`` and ``deploy/Dockerfile`` install Debian's python3-numpy, python3-pandas and
python3-matplotlib; ``details["python_modules"]`` lists which of them the sandbox python has. BLAS and
OpenMP run one thread (``OPENBLAS_NUM_THREADS`` and the like): threads count against ``pids.max``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from security.sandbox import cgroup as cgroups
from security.sandbox import seccomp
from security.sandbox.base import Availability, Failure, Limits, RunResult
from security.sandbox.folder import diff, folder_bytes, read_beneath, rmtree, scan
from security.sandbox.reply import result_of

SERVER_SOURCE = (Path(__file__).parent / "repl_server.py").read_text()
DATA = "/mnt/data"
OUT_DIR = "/run/out"
NOBODY = 65534
_ETC = ("ld.so.cache", "localtime", "alternatives", "fonts", "mime.types", "matplotlibrc")
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "MPLBACKEND": "Agg",
    # one BLAS/OpenMP thread: threads count against pids.max, and a shared host gets no CPU from more
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
UID_RANGE = (0x70000000, 1 << 16)  # per-container host uids (as root): start, count
UID_LOCK_DIR = "/run/lock/respgate-sandbox-uids"
MODULES = ("numpy", "pandas", "matplotlib")  # reported in available().details, not required
MAX_FILES = 10_000  # the most entries a folder scan lists (the quota still counts every file)
_POLL_S = 0.2  # how often the folder size is checked while code runs


class LocalSandbox:
    """Creates local containers under ``base_dir`` (one folder each: ``<id>/data`` is ``/mnt/data``)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        limits: Limits | None = None,
        *,
        bwrap: str = "bwrap",
        python: str = "/usr/bin/python3",
        host_uid: int = NOBODY,
        uid_range: tuple[int, int] | None = UID_RANGE,
        uid_lock_dir: str | os.PathLike[str] = UID_LOCK_DIR,
        cgroup: str = "auto",
    ) -> None:
        """``host_uid``: the uid containers run as when ``uid_range`` is ``None`` (as root only).
        ``cgroup``: ``"auto"`` (detect v2, then v1; rlimits only when neither is writable) or ``"off"``."""
        self.base_dir = Path(base_dir)
        self.limits = limits or Limits()
        self.bwrap = shutil.which(bwrap) or bwrap
        self.python = python
        self.drop_to: int | None = host_uid if os.geteuid() == 0 else None
        self.uid_range = uid_range if os.geteuid() == 0 else None
        self.uid_lock_dir = Path(uid_lock_dir)
        self.seccomp_filter = seccomp.build()
        self.cgroup_setup: cgroups.CgroupSetup | None = None
        self.cgroup_reason = "off (cgroup='off')"
        if cgroup == "auto":
            self.cgroup_setup, self.cgroup_reason = cgroups.detect()
            if self.cgroup_setup is not None:
                cgroups.sweep_stale(self.cgroup_setup)
        elif cgroup != "off":
            raise ValueError(f"cgroup must be 'auto' or 'off', not {cgroup!r}")
        self._availability: Availability | None = None

    # -- can it start here ------------------------------------------------------------------------

    def available(self) -> Availability:
        """Whether a container can start on this host: bwrap, the system python and the namespaces
        (probed once by starting one); ``reason`` says what is missing, for the operator."""
        if self._availability is None:
            self._availability = self._probe()
        return self._availability

    def _probe(self) -> Availability:
        details = {
            "bwrap": self.bwrap,
            "python": self.python,
            "seccomp": "on" if self.seccomp_filter else "off",
            "cgroup": self._cgroup_detail(),
            "uid": self._uid_detail(),
        }
        if not os.path.isfile(self.bwrap) or not os.access(self.bwrap, os.X_OK):
            return Availability(False, "bwrap (bubblewrap) not found: apt-get install bubblewrap", details)
        if not os.access(self.python, os.X_OK):
            return Availability(False, f"{self.python} not found: the sandbox runs the system python", details)
        if not shutil.which("setpriv"):
            return Availability(False, "setpriv (util-linux) not found", details)
        with _SeccompFd(self.seccomp_filter) as fd:
            argv = self._argv(str(self.base_dir), fd, [self.python, "-I", "-c", _PROBE])
            argv = self._without_data_bind(argv)
            try:
                done = subprocess.run(argv, capture_output=True, timeout=30, env=dict(_ENV), pass_fds=_fds(fd), cwd="/")
            except (OSError, subprocess.TimeoutExpired) as e:
                return Availability(False, f"bwrap did not start: {e}", details)
        words = done.stdout.decode("utf-8", "replace").split()
        if done.returncode != 0 or words[:1] != ["sandbox-ok"]:
            err = done.stderr.decode("utf-8", "replace").strip()[-300:]
            hint = " (no user namespaces? e.g. inside a container without them)" if "namespace" in err else ""
            return Availability(False, f"bwrap failed{hint}: {err or done.returncode}", details)
        details["python_modules"] = " ".join(words[1:]) or "none"
        missing = [m for m in MODULES if m not in words[1:]]
        if missing:
            details["python_modules_missing"] = " ".join(missing) + f" (apt-get install {_debs(missing)})"
        return Availability(True, "", details)

    def _cgroup_detail(self) -> str:
        if self.cgroup_setup is None:
            return (
                f"none: {self.cgroup_reason}; memory and process limits are per process only "
                "(RLIMIT_AS, RLIMIT_NPROC), not for a container's processes together"
            )
        try:  # a real one: create, limit and remove a probe cgroup
            probe = cgroups.TreeCgroup(
                self.cgroup_setup, cgroups.container_name(f"probe-{uuid.uuid4().hex}"), 64 << 20, 8
            )
        except OSError as e:
            self.cgroup_setup = None
            self.cgroup_reason = f"cannot create a container cgroup: {e}"
            return self._cgroup_detail()
        for d in probe.dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        return self.cgroup_setup.describe()

    def _uid_detail(self) -> str:
        if self.uid_range is not None:
            start, count = self.uid_range
            return f"one per container: {start}..{start + count - 1} (locks in {self.uid_lock_dir})"
        if self.drop_to is not None:
            return f"{self.drop_to} for every container (uid_range=None)"
        return f"{os.geteuid()} (the gateway's own: not root, so no uid change)"

    @staticmethod
    def _without_data_bind(argv: list[str]) -> list[str]:
        out: list[str] = []
        skip = 0
        for i, a in enumerate(argv):
            if skip:
                skip -= 1
                continue
            if a == "--bind" and i + 2 < len(argv) and argv[i + 2] == DATA:
                skip = 2
                continue
            if a == "--chdir":
                skip = 1
                continue
            out.append(a)
        return out

    # -- the command line -------------------------------------------------------------------------

    def _argv(self, folder: str, seccomp_fd: int | None, command: list[str], *, uid: int | None = None) -> list[str]:
        lim = self.limits
        # setpriv: the tree dies with the gateway (the parent-death signal on bwrap itself, set after
        # the uid change that would clear it); as root, first drop to an unprivileged user
        argv: list[str] = ["setpriv", "--pdeathsig=KILL", "--no-new-privs"]
        run_as = uid if uid is not None else self.drop_to
        if run_as is not None:
            uid = run_as
            argv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        argv += ["--"]
        argv += [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / top
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), f"/{top}"]
            elif host.is_dir():
                argv += ["--ro-bind", str(host), f"/{top}"]
        for name in _ETC:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        # bwrap's /dev is a tmpfs without a size: read-only, and a sized one for /dev/shm (multiprocessing)
        argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
        argv += ["--size", str(lim.shm_bytes), "--tmpfs", "/dev/shm"]
        argv += ["--size", str(lim.tmp_bytes), "--tmpfs", "/tmp"]
        argv += ["--size", str(4 * lim.output_bytes + (64 << 10)), "--perms", "0700", "--tmpfs", OUT_DIR]
        argv += ["--bind", folder, DATA, "--chdir", DATA, "--remount-ro", "/"]
        argv += ["--clearenv"]
        for k, v in _ENV.items():
            argv += ["--setenv", k, v]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return [*argv, "--", *command]

    def server_command(self) -> list[str]:
        cfg = {
            k: v
            for k, v in asdict(self.limits).items()
            if k in ("memory_bytes", "processes", "open_files", "file_bytes", "cpu_seconds_total", "output_bytes")
        }
        return [self.python, "-I", "-c", SERVER_SOURCE, json.dumps(cfg)]

    # -- containers -------------------------------------------------------------------------------

    async def create(self, container_id: str | None = None) -> LocalContainer:
        cid = container_id or f"cntr_{uuid.uuid4().hex}"
        if not cid.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"bad container id {cid!r}")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o711)
        home = self.base_dir / cid
        home.mkdir(mode=0o711)
        container = LocalContainer(self, cid, str(home), str(home / "data"))
        try:
            if self.uid_range is not None:
                container._uid_lease = _UidLease.take(self.uid_lock_dir, *self.uid_range)
            uid = container.uid
            data = home / "data"
            data.mkdir(mode=0o700)
            if uid is not None:
                os.chown(data, uid, uid)
            if self.cgroup_setup is not None:
                lim = self.limits
                name = cgroups.container_name(cid)
                container.cgroup = cgroups.TreeCgroup(self.cgroup_setup, name, lim.memory_bytes, lim.processes)
            await container.start()
        except BaseException:
            await container.close()
            raise
        return container


def _debs(modules: list[str]) -> str:
    return " ".join(f"python3-{m}" for m in modules)


_PROBE = f"import importlib.util as u; print('sandbox-ok', *[m for m in {MODULES!r} if u.find_spec(m) is not None])"


class _UidLease:
    """A host uid of ``[start, start + count)`` held by an exclusive ``flock`` on ``<dir>/<uid>``: every
    gateway process on the host that uses the same lock folder gets a different one; the kernel drops
    the lock when the holder dies, so a crash leaves nothing to clean up."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd

    @classmethod
    def take(cls, lock_dir: Path, start: int, count: int) -> _UidLease:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for uid in _uid_order(start, count):
            fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(uid, fd)
        raise RuntimeError(f"all {count} container uids from {start} are in use")

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the lock goes with it; the file stays (unlinking would race another taker)


def _uid_order(start: int, count: int) -> Iterator[int]:
    """Lowest free first: the lock files stay as many as containers ever ran at once. A uid is released
    only once its container's processes are all gone (close), so reuse never shares a uid with a live one."""
    yield from range(start, start + count)


class _SeccompFd:
    """The filter in a memfd, inheritable for the child to read (bwrap reads it to EOF)."""

    def __init__(self, program: bytes | None) -> None:
        self.program = program
        self.fd: int | None = None

    def __enter__(self) -> int | None:
        if self.program is None:
            return None
        self.fd = os.memfd_create("respgate-seccomp", 0)
        os.write(self.fd, self.program)
        os.lseek(self.fd, 0, os.SEEK_SET)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _fds(fd: int | None) -> tuple[int, ...]:
    return () if fd is None else (fd,)


class LocalContainer:
    """A running container; ``run`` calls are serialized; ``close`` ends the process tree."""

    def __init__(self, sandbox: LocalSandbox, cid: str, home: str, folder: str) -> None:
        self._sandbox = sandbox
        self._id = cid
        self._home = home
        self._folder = folder
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr_tail = b""
        self._stderr_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._lost = False  # the last interpreter ended: its globals are gone
        self.python_version = ""
        self.cgroup: cgroups.TreeCgroup | None = None  # the whole tree's memory and pids bounds
        self._uid_lease: _UidLease | None = None

    @property
    def uid(self) -> int | None:
        """The host uid the container's processes run as (``None``: the gateway's own)."""
        return self._uid_lease.uid if self._uid_lease is not None else self._sandbox.drop_to

    @property
    def id(self) -> str:
        return self._id

    @property
    def folder(self) -> str:
        return self._folder

    @property
    def pid(self) -> int | None:
        """The host pid of the outer bwrap (the process group leader), while running."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    @property
    def _max_frame(self) -> int:
        return 12 * self._sandbox.limits.output_bytes + (64 << 10)

    async def start(self) -> None:
        sb = self._sandbox
        with _SeccompFd(sb.seccomp_filter) as fd:
            argv = sb._argv(self._folder, fd, sb.server_command(), uid=self.uid)
            if self.cgroup is not None:  # joined before exec: every process of the tree is born inside
                argv = self.cgroup.join_argv(argv)
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(_ENV),
                cwd="/",
                pass_fds=_fds(fd),
                start_new_session=True,
            )
        self._stderr_task = asyncio.create_task(self._drain_stderr(self._proc))
        try:
            hello = await asyncio.wait_for(self._read_frame(), 30)
        except (TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            proc = self._proc
            await self._kill()
            why = self._stderr_tail.decode("utf-8", "replace")
            if proc is not None and proc.returncode == cgroups.JOIN_FAILED:
                why = f"could not join the container cgroup: {why}"
            raise RuntimeError(f"sandbox did not start: {why!r}") from e
        self.python_version = str(hello.get("python", ""))

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(4096):
            self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    async def _read_frame(self) -> dict[str, object]:
        assert self._proc is not None and self._proc.stdout is not None
        header = await self._proc.stdout.readexactly(4)
        (n,) = struct.unpack(">I", header)
        if n > self._max_frame:
            raise ValueError(f"reply frame of {n} bytes")
        body = await self._proc.stdout.readexactly(n)
        reply = json.loads(body)
        if not isinstance(reply, dict):
            raise ValueError("reply is not an object")
        return reply

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._lost = True
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self.cgroup is not None:  # anything that left the process group (setsid) is still in here
            self.cgroup.kill()
        await proc.wait()
        if self._stderr_task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._stderr_task, 5)

    async def _watch_folder(self) -> None:
        quota = self._sandbox.limits.folder_bytes
        while True:  # the scan before the run has just been made: first wait
            await asyncio.sleep(_POLL_S)
            if await asyncio.to_thread(folder_bytes, self._folder) > quota:
                return

    async def run(self, code: str, timeout: float | None = None) -> RunResult:
        if self._closed:
            raise RuntimeError(f"container {self._id} is closed")
        async with self._lock:
            return await self._run(code, self._sandbox.limits.default_timeout_s if timeout is None else timeout)

    async def _run(self, code: str, timeout: float) -> RunResult:
        started = time.monotonic()
        state_lost = self._lost
        if self._proc is None or self._proc.returncode is not None:
            await self._kill()
            await self.start()
            self._lost = False
        before, _ = await asyncio.to_thread(scan, self._folder)
        oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
        pids_before = self.cgroup.pids_max_hits() if self.cgroup is not None else 0
        assert self._proc is not None and self._proc.stdin is not None
        body = json.dumps({"code": code, "cpu_s": max(1, int(timeout) + 1)}).encode()
        reply: dict[str, object] | None = None
        failure: Failure | None = None
        error = ""
        try:
            self._proc.stdin.write(struct.pack(">I", len(body)) + body)
            await asyncio.wait_for(self._proc.stdin.drain(), timeout)
            reader = asyncio.ensure_future(self._read_frame())
            watcher = asyncio.ensure_future(self._watch_folder())
            try:
                done, _ = await asyncio.wait({reader, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watcher.cancel()
                if reader not in done:
                    reader.cancel()
            if reader in done:
                reply = reader.result()
            elif watcher in done:
                failure, error = (
                    Failure.DISK_FULL,
                    f"the container folder passed {self._sandbox.limits.folder_bytes} bytes",
                )
            else:
                failure, error = Failure.TIMEOUT, f"wall time limit of {timeout:g} s reached"
        except TimeoutError:  # the request itself could not be written in time
            failure, error = Failure.TIMEOUT, f"wall time limit of {timeout:g} s reached"
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
            proc = self._proc
            rc = await proc.wait() if proc is not None else None
            failure, error = _exit_failure(rc)
        except (ValueError, UnicodeDecodeError) as e:
            failure, error = Failure.CRASHED, f"the interpreter broke the protocol: {e}"
        oom_killed = self.cgroup.oom_kills() - oom_before if self.cgroup is not None else 0
        if reply is None:
            await self._kill()
            state_lost = True
            if oom_killed > 0 and failure is not Failure.DISK_FULL:
                failure, error = Failure.MEMORY, self._oom_message(oom_killed, interpreter=True)
        after, total = await asyncio.to_thread(scan, self._folder)
        files = diff(before, after)
        if reply is None:
            return RunResult(
                "", "", None, failure, error, files, state_lost=state_lost, duration_s=time.monotonic() - started
            )
        result = result_of(
            reply, files, total, self._sandbox.limits, state_lost=state_lost, took=time.monotonic() - started
        )
        if oom_killed > 0 and result.failure in (None, Failure.MEMORY):
            # the interpreter lived; a process it started did not (or a MemoryError came with it)
            result = dataclasses.replace(
                result, failure=Failure.MEMORY, error=self._oom_message(oom_killed, interpreter=False)
            )
        elif (
            self.cgroup is not None
            and result.error is not None
            and result.error.startswith("BlockingIOError")
            and self.cgroup.pids_max_hits() > pids_before
        ):
            limit = self._sandbox.limits.processes
            result = dataclasses.replace(
                result, error=f"{result.error} (the container's limit of {limit} processes and threads)"
            )
        return result

    def _oom_message(self, killed: int, *, interpreter: bool) -> str:
        mib = self._sandbox.limits.memory_bytes / (1 << 20)
        what = (
            "the interpreter (its variables are lost)"
            if interpreter
            else f"{killed} process{'es' if killed > 1 else ''} the code started"
        )
        return (
            f"MemoryError: out of memory: the container's processes together reached its limit of {mib:g} MiB "
            f"and the kernel ended {what}"
        )

    async def read_file(self, path: str, max_bytes: int = 64 << 20) -> bytes:
        """A file of the container folder (``path`` relative to ``/mnt/data``), for the container
        files API: regular files only, no link followed anywhere on the way, at most ``max_bytes``."""
        return await asyncio.to_thread(read_beneath, self._folder, path, max_bytes)

    async def close(self) -> None:
        self._closed = True
        await self._kill()
        if self.cgroup is not None:
            await self.cgroup.remove()
        if os.path.isdir(self._home):
            await asyncio.to_thread(rmtree, self._home)
        if self._uid_lease is not None:  # only once nothing of the container runs as that uid
            self._uid_lease.release()


def _exit_failure(rc: int | None) -> tuple[Failure, str]:
    """The interpreter ended on its own: why, from bwrap's exit status (128+n for signal n)."""
    sig = rc - 128 if rc is not None and rc > 128 else (-rc if rc is not None and rc < 0 else 0)
    if sig == signal.SIGXCPU:
        return Failure.TIMEOUT, "CPU time limit reached"
    if sig == signal.SIGKILL:
        return Failure.KILLED, "the interpreter was killed (SIGKILL: memory or CPU hard limit)"
    if sig:
        return Failure.CRASHED, f"the interpreter died of signal {sig}"
    return Failure.CRASHED, f"the interpreter exited with status {rc}"
