"""The container registry: a replica's containers for ``code_interpreter`` and the Containers API
(``gateway.containers.model.Containers``), over a sandbox (``security.sandbox``).

**Per replica.** Containers live in this gateway process's memory, each a sandbox container (a
process tree and a folder on this host, or a pod the replica created): like the sandbox process
itself they are not shared. Another replica knows none of them and answers a 404
``container_not_found`` for their ids, exactly as for an unknown id; a deployment that runs several
replicas routes a tenant's container traffic to one replica (session affinity) or accepts that a
container is reachable only where it was created. A restart ends every container.

**Tenants.** Every call names the tenant; another tenant's container is treated as unknown
(``None`` / ``KeyError`` / a 404 naming only the id sent), never revealed.

**Bounds.** ``containers_per_tenant`` running containers per tenant (more: 400 ``quota_exceeded``)
and ``containers_max`` on this replica, every tenant together (more: 503 ``server_is_overloaded``);
a creation in progress holds its slot. The sandbox's limits come from the settings
(:func:`sandbox_limits`): memory, processes, CPU seconds, the folder's bytes
(``container_disk_bytes``: uploads are refused past it, code is stopped past it) and the largest
single file (``container_file_max_bytes``: an upload past it is a 413, code cannot write a bigger
file, so every file a container holds can be read back whole within that bound).

**Expiry.** A container expires ``idle_minutes`` (``expires_after.minutes``, else
``container_idle_minutes``) after its ``last_active_at`` (creation, a run, a file added or deleted;
reads do not count). Expiry is decided on every access and by :meth:`ContainerRegistry.sweep_loop`
(every 30 s): the sandbox container is closed (processes ended, folder removed) and the record stays
retrievable with ``status: "expired"`` and no files for :data:`EXPIRED_KEPT_S` (an hour), then is
gone (404). An expired container cannot run code or take files (404 ``container_not_found``, as
OpenAI's expired containers answer). A container in the middle of a run or an upload is never
expired under it.

**Files.** ``file_ids`` at creation (and ``POST .../files`` with ``file_id``) copy the tenant's Files
API files into ``/mnt/data`` (another tenant's or an unknown id: 404 naming it); uploads stream there.
Both are registered with ``cfile_`` ids, source ``user``. Each run's changes (``RunResult.files``)
update the index: created and modified files are (re)registered as source ``assistant`` (a modified
file keeps its id), deleted ones dropped. Names are a file's last path component only (``../../x``
lands as ``/mnt/data/x``). Every host-side file operation opens the folder without following a link
the code may have planted; reads go through the sandbox's link-safe read (``read_file``).

**Serialized.** Runs, uploads and file deletions on one container take its lock in turn; a delete
of the container does not wait for a run: it ends it (the run reports the kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import importlib
import logging
import os
import secrets
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.base.settings import Settings, default_cache_path
from gateway.containers.model import CodeRun, ContainerFile, ContainerRecord, ContainerStatus, FileSource
from gateway.files.files import Files
from gateway.wire.containers import (
    container_disk_full,
    container_file_too_large,
    containers_full,
    containers_quota,
    sandbox_unavailable,
    source_file_not_found,
)
from gateway.wire.errors import bad_request
from security.sandbox.base import Container, FileChange, Limits, Sandbox
from security.sandbox.folder import folder_bytes, read_beneath

__all__ = [
    "ContainerRegistry",
    "ContainerUpload",
    "build_sandbox",
    "containers_off",
    "containers_root",
    "sandbox_limits",
]

log = logging.getLogger(__name__)

#: seconds an expired container stays retrievable (``status: "expired"``) before it is gone
EXPIRED_KEPT_S = 3600.0
#: seconds between expiry sweeps
SWEEP_INTERVAL_S = 30.0
#: inside the container, where its folder is
DATA = "/mnt/data"
#: characters of a container file's name (the rest cut)
MAX_FILENAME = 255
#: files one container's index holds (the folder scan lists as many)
MAX_INDEXED_FILES = 10_000
_TMP_PREFIX = ".respgate-upload-"


def containers_off(settings: Settings, tenant: str | None) -> str | None:
    """None when containers (and ``code_interpreter``) are on for ``tenant``, else why not, naming
    the setting (the 404's words)."""
    if settings.code_interpreter == "off":
        return "the gateway's setting code_interpreter is 'off'"
    allowed = settings.code_interpreter_tenants
    if allowed is not None and tenant not in allowed:
        return "this tenant is not in the gateway's setting code_interpreter_tenants"
    return None


def containers_root(settings: Settings) -> Path:
    """The local sandbox's folder: ``containers_dir``, else ``$RESPGATE_CACHE_DIR/containers``."""
    return Path(settings.containers_dir or default_cache_path("containers"))


def sandbox_limits(settings: Settings) -> Limits:
    """A container's bounds from the settings (the rest: ``Limits``' defaults)."""
    return Limits(
        memory_bytes=settings.container_memory_bytes,
        cpu_seconds_total=settings.container_cpu_seconds,
        processes=settings.container_processes,
        file_bytes=min(settings.container_file_max_bytes, settings.container_disk_bytes),
        folder_bytes=settings.container_disk_bytes,
        default_timeout_s=settings.container_run_timeout_s,
    )


def build_sandbox(settings: Settings) -> Sandbox:
    """The sandbox ``code_interpreter`` names: ``local`` (bubblewrap on this host, under
    :func:`containers_root`) or ``kubernetes`` (``security.sandbox.kubernetes``, imported only when
    chosen: it needs the Kubernetes client)."""
    limits = sandbox_limits(settings)
    if settings.code_interpreter == "local":
        from security.sandbox.local import LocalSandbox

        return LocalSandbox(containers_root(settings), limits)
    if settings.code_interpreter == "kubernetes":
        module: Any = importlib.import_module("security.sandbox.kubernetes")
        sandbox: Sandbox = module.KubernetesSandbox.from_settings(settings, limits)
        return sandbox
    raise ValueError(f"code_interpreter is {settings.code_interpreter!r}: no sandbox to build")


def clean_filename(name: str | None) -> str:
    """A file's last path component, printable, at most :data:`MAX_FILENAME` characters: an upload
    named ``../../x`` lands as ``/mnt/data/x``; a name with nothing left is ``upload``."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(ch for ch in base if ch.isprintable())[:MAX_FILENAME]
    if base in ("", ".", "..") or base.startswith(_TMP_PREFIX):
        return "upload"
    return base


@dataclass
class _Entry:
    record: ContainerRecord
    container: Container | None
    #: the container's files by id, oldest first
    files: dict[str, ContainerFile] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    expired_at: float | None = None

    def by_path(self, path: str) -> ContainerFile | None:
        return next((f for f in self.files.values() if f.path == path), None)


class ContainerRegistry:
    """This replica's containers (see the module's docstring). ``files``: the Files API's service
    (``file_ids`` are copied from it); ``sandbox``: default :func:`build_sandbox`; ``clock``: seconds
    since the epoch (tests move it to expire containers)."""

    def __init__(
        self,
        settings: Settings,
        files: Files,
        sandbox: Sandbox | None = None,
        *,
        clock: Callable[[], float] = time.time,
        expired_kept_s: float = EXPIRED_KEPT_S,
    ) -> None:
        self.settings = settings
        self.files_api = files
        self.sandbox = build_sandbox(settings) if sandbox is None else sandbox
        self.clock = clock
        self.expired_kept_s = expired_kept_s
        self._entries: dict[str, _Entry] = {}
        self._pending: dict[str | None, int] = {}
        self._closed = False

    # -- containers -----------------------------------------------------------------------------

    async def create(
        self,
        tenant: str | None,
        *,
        name: str,
        file_ids: tuple[str, ...] = (),
        idle_minutes: int | None = None,
        memory_limit: str | None = None,
    ) -> ContainerRecord:
        s = self.settings
        await self._expire_due()
        if self._closed:
            raise sandbox_unavailable("the server is shutting down")
        running = [e for e in self._entries.values() if e.record.status is ContainerStatus.RUNNING]
        if sum(1 for e in running if e.record.tenant == tenant) + self._pending.get(tenant, 0) >= (
            s.containers_per_tenant
        ):
            raise containers_quota(s.containers_per_tenant)
        if len(running) + sum(self._pending.values()) >= s.containers_max:
            raise containers_full(s.containers_max)
        self._pending[tenant] = self._pending.get(tenant, 0) + 1
        try:
            sources = []
            for fid in dict.fromkeys(file_ids):  # each once
                source = await self.files_api.get(tenant, fid)
                if source is None:
                    raise source_file_not_found(fid, "file_ids")
                sources.append(source)
            if sum(r.bytes for r in sources) > s.container_disk_bytes:
                raise container_disk_full(s.container_disk_bytes)
            availability = await asyncio.to_thread(self.sandbox.available)
            if not availability.ok:
                raise sandbox_unavailable(availability.reason)
            cid = f"cntr_{secrets.token_hex(16)}"
            try:
                container = await self.sandbox.create(cid)
            except Exception as exc:
                log.warning("container %s did not start: %s", cid, exc)
                raise sandbox_unavailable("it did not start (see the gateway's log)") from None
            now = int(self.clock())
            entry = _Entry(
                ContainerRecord(
                    id=cid,
                    tenant=tenant,
                    name=name,
                    created_at=now,
                    last_active_at=now,
                    idle_minutes=idle_minutes or s.container_idle_minutes,
                    status=ContainerStatus.RUNNING,
                    memory_limit=memory_limit,
                ),
                container,
            )
            try:
                for source in sources:  # two of one name: the later one is ``<file id>-<name>``
                    name = clean_filename(source.filename)
                    if entry.by_path(f"{DATA}/{name}") is not None:
                        name = clean_filename(f"{source.id}-{name}")
                    await self._copy_in(entry, source.id, name)
            except BaseException:
                await container.close()
                raise
            if self._closed:  # shut down while it started: it must not outlive the gateway
                await container.close()
                raise sandbox_unavailable("the server is shutting down")
            self._entries[cid] = entry
            return entry.record
        finally:
            self._pending[tenant] -= 1
            if not self._pending[tenant]:
                del self._pending[tenant]

    async def get(self, tenant: str | None, container_id: str) -> ContainerRecord | None:
        entry = await self._find(tenant, container_id)
        return entry.record if entry is not None else None

    async def records(self, tenant: str | None, *, name: str | None = None) -> list[ContainerRecord]:
        """The tenant's containers (expired ones while they are kept), oldest first; ``name``: only
        those of that name."""
        await self._expire_due()
        return [
            e.record
            for e in self._entries.values()
            if e.record.tenant == tenant and (name is None or e.record.name == name)
        ]

    async def delete(self, tenant: str | None, container_id: str) -> bool:
        """Forget the container and end it (a run in progress is killed, not waited for)."""
        entry = await self._find(tenant, container_id)
        if entry is None:
            return False
        del self._entries[container_id]
        await self._close(entry)
        return True

    async def run(self, tenant: str | None, container_id: str, code: str, timeout: float | None = None) -> CodeRun:
        entry = await self._running(tenant, container_id)
        async with entry.lock:
            container = entry.container
            if container is None or self._entries.get(container_id) is not entry:
                raise KeyError(container_id)  # deleted or closed while this waited
            self._touch(entry)
            try:
                result = await container.run(
                    code, self.settings.container_run_timeout_s if timeout is None else timeout
                )
            except RuntimeError as exc:  # closed under us (a delete, or shutdown)
                raise KeyError(container_id) from exc
            self._touch(entry)
            now = int(self.clock())
            changed: list[ContainerFile] = []
            for change in result.files:
                path = f"{DATA}/{change.path}"
                known = entry.by_path(path)
                if change.change is FileChange.DELETED:
                    if known is not None:
                        del entry.files[known.id]
                    continue
                if known is not None:
                    updated = dataclasses.replace(known, bytes=change.size, source=FileSource.ASSISTANT)
                elif len(entry.files) < MAX_INDEXED_FILES:
                    updated = ContainerFile(_cfile_id(), container_id, path, change.size, now, FileSource.ASSISTANT)
                else:
                    continue
                entry.files[updated.id] = updated
                changed.append(updated)
            return CodeRun(result, tuple(changed))

    # -- container files ------------------------------------------------------------------------

    async def files(self, tenant: str | None, container_id: str) -> list[ContainerFile]:
        """The container's files, oldest first (none once it expired); ``KeyError`` for an unknown one."""
        entry = await self._find(tenant, container_id)
        if entry is None:
            raise KeyError(container_id)
        return list(entry.files.values())

    async def file(self, tenant: str | None, container_id: str, file_id: str) -> ContainerFile | None:
        """One file's record; ``KeyError`` for an unknown container."""
        entry = await self._find(tenant, container_id)
        if entry is None:
            raise KeyError(container_id)
        return entry.files.get(file_id)

    async def read(self, tenant: str | None, container_id: str, file_id: str) -> bytes | None:
        """A file's bytes (at most ``container_file_max_bytes``: code cannot write a bigger one),
        read without following links; None for an unknown container or file, or one gone from the
        folder."""
        entry = await self._find(tenant, container_id)
        f = entry.files.get(file_id) if entry is not None else None
        if entry is None or f is None or entry.container is None:
            return None
        relpath = f.path.removeprefix(DATA + "/")
        limit = min(self.settings.container_file_max_bytes, self.settings.container_disk_bytes)
        try:
            reader = getattr(entry.container, "read_file", None)
            if reader is not None:
                data: bytes = await reader(relpath, limit)
                return data
            return await asyncio.to_thread(read_beneath, entry.container.folder, relpath, limit)
        except (OSError, ValueError):
            return None

    async def upload(self, tenant: str | None, container_id: str) -> ContainerUpload:
        """An upload into the container (its lock held until :meth:`ContainerUpload.finish` or
        ``abort``); ``KeyError`` for an unknown or expired container."""
        entry = await self._running(tenant, container_id)
        await entry.lock.acquire()
        try:
            if entry.container is None or self._entries.get(container_id) is not entry:
                raise KeyError(container_id)
            return await self._writer(entry)
        except BaseException:
            entry.lock.release()
            raise

    async def add_file(self, tenant: str | None, container_id: str, file_id: str) -> ContainerFile:
        """Copy the tenant's Files API file ``file_id`` in (404 naming it when it is not theirs)."""
        source = await self.files_api.get(tenant, file_id)
        if source is None:
            raise source_file_not_found(file_id, "file_id")
        entry = await self._running(tenant, container_id)
        async with entry.lock:
            if entry.container is None or self._entries.get(container_id) is not entry:
                raise KeyError(container_id)
            added = await self._copy_in(entry, source.id, source.filename)
            self._touch(entry)
            return added

    async def delete_file(self, tenant: str | None, container_id: str, file_id: str) -> bool:
        """Remove a file from the folder and the index; False for an unknown file; ``KeyError`` for
        an unknown or expired container."""
        entry = await self._running(tenant, container_id)
        async with entry.lock:
            f = entry.files.get(file_id)
            if f is None or entry.container is None:
                return False
            relpath = f.path.removeprefix(DATA + "/")
            folder = _host_folder(entry.container)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                if folder is None:
                    await entry.container.delete_file(relpath)  # type: ignore[attr-defined]
                else:
                    await asyncio.to_thread(_unlink_beneath, folder, relpath)
            del entry.files[file_id]
            self._touch(entry)
            return True

    # -- expiry and shutdown --------------------------------------------------------------------

    async def sweep(self) -> int:
        """Expire the containers idle past their minutes, forget those expired long enough; how
        many were expired."""
        expired = await self._expire_due()
        now = self.clock()
        for cid, entry in list(self._entries.items()):
            if entry.expired_at is not None and now >= entry.expired_at + self.expired_kept_s:
                del self._entries[cid]
        return expired

    async def sweep_loop(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """:meth:`sweep` every ``interval_s`` for as long as the gateway runs."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sweep()
                # a backend that can lose containers behind our back (a pod evicted, past its
                # deadline) clears what ended; the local one has nothing to clear
                backend_sweep = getattr(self.sandbox, "sweep", None)
                if backend_sweep is not None:
                    await backend_sweep()
            except Exception:
                log.exception("expiring containers failed; trying again in %g s", interval_s)

    async def aclose(self) -> None:
        """Shutdown: end every container (no new one starts)."""
        self._closed = True
        entries = list(self._entries.values())
        self._entries.clear()
        await asyncio.gather(*(self._close(e) for e in entries), return_exceptions=True)

    # -- inside ---------------------------------------------------------------------------------

    async def _find(self, tenant: str | None, container_id: str) -> _Entry | None:
        entry = self._entries.get(container_id)
        if entry is None or entry.record.tenant != tenant:
            return None
        if self._due(entry, self.clock()):
            await self._expire(entry)
        if entry.expired_at is not None and self.clock() >= entry.expired_at + self.expired_kept_s:
            self._entries.pop(container_id, None)
            return None
        return entry

    async def _running(self, tenant: str | None, container_id: str) -> _Entry:
        entry = await self._find(tenant, container_id)
        if entry is None or entry.record.status is not ContainerStatus.RUNNING:
            raise KeyError(container_id)
        return entry

    def _due(self, entry: _Entry, now: float) -> bool:
        r = entry.record
        return (
            r.status is ContainerStatus.RUNNING
            and now >= r.last_active_at + r.idle_minutes * 60
            and not entry.lock.locked()
        )

    async def _expire_due(self) -> int:
        now = self.clock()
        due = [e for e in self._entries.values() if self._due(e, now)]
        await asyncio.gather(*(self._expire(e) for e in due))
        return len(due)

    async def _expire(self, entry: _Entry) -> None:
        entry.record = dataclasses.replace(entry.record, status=ContainerStatus.EXPIRED)
        entry.expired_at = self.clock()
        entry.files.clear()
        await self._close(entry)

    async def _close(self, entry: _Entry) -> None:
        container, entry.container = entry.container, None
        if container is None:
            return
        try:
            await container.close()
        except Exception:
            log.exception("closing container %s failed", entry.record.id)

    def _touch(self, entry: _Entry) -> None:
        entry.record = dataclasses.replace(
            entry.record, last_active_at=max(entry.record.last_active_at, int(self.clock()))
        )

    async def _writer(self, entry: _Entry) -> ContainerUpload:
        assert entry.container is not None
        folder = _host_folder(entry.container)
        if folder is None:  # a pod: what the index knows of (the sandbox checks the rest after each run)
            used = sum(f.bytes for f in entry.files.values())
        else:
            used = await asyncio.to_thread(folder_bytes, folder)
        s = self.settings
        left = s.container_disk_bytes - used
        if left <= 0:
            raise container_disk_full(s.container_disk_bytes)
        sink: _HostFile | _RemoteFile = _RemoteFile(entry.container) if folder is None else _HostFile.create(folder)
        return ContainerUpload(self, entry, sink, s.container_file_max_bytes, left)

    async def _copy_in(self, entry: _Entry, file_id: str, filename: str) -> ContainerFile:
        """A Files API file streamed into the folder (the caller holds the lock or owns the entry)."""
        upload = await self._writer(entry)
        try:
            async for chunk in self._content(entry.record.tenant, file_id):
                await upload.write(chunk)
            return await upload._commit(filename)
        except FileNotFoundError:  # deleted between its record and its bytes
            raise source_file_not_found(file_id, "file_ids") from None
        finally:
            upload._host.abort()

    def _content(self, tenant: str | None, file_id: str) -> AsyncIterator[bytes]:
        return self.files_api.content(tenant, file_id)

    def _register(self, entry: _Entry, relpath: str, size: int) -> ContainerFile:
        path = f"{DATA}/{relpath}"
        old = entry.by_path(path)
        if old is not None:  # replaced: the old id no longer names these bytes
            del entry.files[old.id]
        elif len(entry.files) >= MAX_INDEXED_FILES:
            raise bad_request(f"A container holds at most {MAX_INDEXED_FILES} files.", code="quota_exceeded")
        f = ContainerFile(_cfile_id(), entry.record.id, path, size, int(self.clock()), FileSource.USER)
        entry.files[f.id] = f
        return f


class ContainerUpload:
    """One upload in progress (the container's lock held): :meth:`write` as the bytes arrive, each
    write checked against ``container_file_max_bytes`` (413) and the room left in the folder (400),
    then :meth:`finish` with the file's name, or :meth:`abort`."""

    def __init__(
        self, registry: ContainerRegistry, entry: _Entry, host: _HostFile | _RemoteFile, per_file: int, left: int
    ) -> None:
        self._registry = registry
        self._entry = entry
        self._host = host
        self._per_file = per_file
        self._left = left
        self.size = 0
        self._done = False

    async def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self._per_file:
            raise container_file_too_large(self._per_file)
        if self.size > self._left:
            raise container_disk_full(self._registry.settings.container_disk_bytes)
        await asyncio.to_thread(self._host.write, data)

    async def _commit(self, filename: str | None) -> ContainerFile:
        name = clean_filename(filename)
        try:
            if isinstance(self._host, _RemoteFile):
                await self._host.commit(name)
            else:
                await asyncio.to_thread(self._host.commit, name)
        except ValueError:  # the remote side: a folder of that name, or no room
            raise bad_request(
                f"'{name}' cannot be written in the container (a folder of that name, or no room).",
                code="invalid_value",
                param="file",
            ) from None
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise bad_request(
                    f"'{name}' is a folder in the container.", code="invalid_value", param="file"
                ) from None
            raise
        return self._registry._register(self._entry, name, self.size)

    async def finish(self, filename: str | None) -> ContainerFile:
        """The file, as ``/mnt/data/<its last name component>`` (replacing a file of that name)."""
        try:
            f = await self._commit(filename)
            self._registry._touch(self._entry)
            return f
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Drop what was written (nothing once finished) and release the container; idempotent."""
        if self._done:
            return
        self._done = True
        self._host.abort()
        self._entry.lock.release()


def _host_folder(container: Any) -> str | None:
    """The container's folder on this host, or None when it has none (a pod: files go through the
    sandbox's ``write_file`` / ``delete_file`` / ``read_file``)."""
    try:
        return str(container.folder)
    except NotImplementedError:
        return None


class _RemoteFile:
    """An upload into a container whose folder is not on this host (``code_interpreter=kubernetes``):
    spooled here (memory up to 1 MiB, then a temporary file; bounded by ``container_file_max_bytes``,
    checked on each write), then handed to the sandbox's ``write_file``, which writes it beside its
    name and renames it into place inside the pod."""

    def __init__(self, container: Any) -> None:
        self._container = container
        self._buf = tempfile.SpooledTemporaryFile(max_size=1 << 20)

    def write(self, data: bytes) -> None:
        self._buf.write(data)

    async def commit(self, name: str) -> None:
        self._buf.seek(0)
        data = await asyncio.to_thread(self._buf.read)
        await self._container.write_file(name, data)

    def abort(self) -> None:
        self._buf.close()


class _HostFile:
    """A new file in a container folder on the host, written beside its final name and renamed into
    place: the folder is opened without following links, the file created exclusively (``O_EXCL``,
    ``O_NOFOLLOW``), and the rename replaces a link the code planted rather than writing through it.
    The file is owned by the folder's owner (the container's uid), mode 0644."""

    def __init__(self, dir_fd: int, tmp: str, fd: int) -> None:
        self._dir_fd: int | None = dir_fd
        self._tmp = tmp
        self._fd: int | None = fd

    @classmethod
    def create(cls, folder: str) -> _HostFile:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            tmp = _TMP_PREFIX + secrets.token_hex(8)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            st = os.fstat(dir_fd)
            with contextlib.suppress(PermissionError):  # unprivileged: it is ours already
                os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, 0o644)
        except BaseException:
            os.close(dir_fd)
            raise
        return cls(dir_fd, tmp, fd)

    def write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def commit(self, name: str) -> None:
        assert self._fd is not None and self._dir_fd is not None
        os.close(self._fd)
        self._fd = None
        os.rename(self._tmp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        self._tmp = ""

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._dir_fd is not None:
            if self._tmp:
                with contextlib.suppress(OSError):
                    os.unlink(self._tmp, dir_fd=self._dir_fd)
            os.close(self._dir_fd)
            self._dir_fd = None


def _unlink_beneath(folder: str, relpath: str) -> None:
    """Remove a regular file (or a link) under ``folder``, walking its folders without following links."""
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise FileNotFoundError(relpath)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            raise FileNotFoundError(relpath)
        os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def _cfile_id() -> str:
    return f"cfile_{secrets.token_hex(16)}"
