"""Where an uploaded file's bytes live: the embedded backend writes them to a folder; a shared one
(Postgres) serves several replicas behind the same :class:`Blobs` interface.

An upload streams in: :meth:`Blobs.writer` takes it piece by piece as the request body arrives
(never the whole file in memory) under a temporary name, and only ``commit`` gives it its file's
name, so a refused or broken upload leaves nothing behind and nothing half-written is ever read.
Tenants' files are kept in separate folders named by a digest of the tenant (a tenant name is not
a safe path), and a file id is checked to be one of ours before it becomes a path.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = ["BlobWriter", "Blobs", "DiskBlobs", "READ_CHUNK"]

#: bytes a read hands on at a time
READ_CHUNK = 256 * 1024
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class BlobWriter(Protocol):
    async def write(self, data: bytes) -> None: ...

    async def commit(self) -> None:
        """Make the bytes written the file's."""
        ...

    async def abort(self) -> None:
        """Drop what was written (idempotent; after ``commit`` it does nothing)."""
        ...


class Blobs(Protocol):
    def writer(self, tenant: str, file_id: str) -> BlobWriter: ...

    def read(self, tenant: str, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes in pieces of at most :data:`READ_CHUNK` (FileNotFoundError when absent)."""
        ...

    async def delete(self, tenant: str, file_id: str) -> bool: ...

    def local_path(self, tenant: str, file_id: str) -> AbstractAsyncContextManager[Path]:
        """A path to the file's bytes on this machine for as long as the context lasts (ingestion
        reads it in bounded pieces; a remote backend copies it to a temporary file)."""
        ...


class DiskBlobs:
    """Files under ``root/<digest of tenant>/<file id>``; temporary ones under ``root/.incoming``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._incoming = self.root / ".incoming"
        self._incoming.mkdir(parents=True, exist_ok=True)
        for stale in self._incoming.iterdir():  # uploads a crash cut short
            stale.unlink(missing_ok=True)

    def path(self, tenant: str, file_id: str) -> Path:
        if not _SAFE_ID.fullmatch(file_id):
            raise FileNotFoundError(file_id)
        return self.root / hashlib.sha256(tenant.encode()).hexdigest()[:32] / file_id

    def writer(self, tenant: str, file_id: str) -> BlobWriter:
        return _DiskWriter(self._incoming, self.path(tenant, file_id))

    async def read(self, tenant: str, file_id: str) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(open, self.path(tenant, file_id), "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, READ_CHUNK):
                yield chunk
        finally:
            handle.close()

    @asynccontextmanager
    async def local_path(self, tenant: str, file_id: str) -> AsyncIterator[Path]:
        path = self.path(tenant, file_id)
        if not await asyncio.to_thread(path.is_file):
            raise FileNotFoundError(file_id)
        yield path

    async def delete(self, tenant: str, file_id: str) -> bool:
        def unlink() -> bool:
            try:
                self.path(tenant, file_id).unlink()
            except FileNotFoundError:
                return False
            return True

        return await asyncio.to_thread(unlink)


class _DiskWriter:
    def __init__(self, incoming: Path, final: Path) -> None:
        self._final = final
        fd, name = tempfile.mkstemp(dir=incoming)
        self._temp = Path(name)
        self._handle: BinaryIO | None = os.fdopen(fd, "wb")

    async def write(self, data: bytes) -> None:
        assert self._handle is not None, "written after commit or abort"
        await asyncio.to_thread(self._handle.write, data)

    async def commit(self) -> None:
        handle, self._handle = self._handle, None
        assert handle is not None, "committed twice or after abort"

        def place() -> None:
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            self._final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._temp, self._final)

        await asyncio.to_thread(place)

    async def abort(self) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return

        def drop() -> None:
            handle.close()
            self._temp.unlink(missing_ok=True)

        await asyncio.to_thread(drop)
