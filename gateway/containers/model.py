"""What the Containers API and the ``code_interpreter`` tool share: a tenant's containers and the
files in them, as records, and the registry that creates, finds, runs and expires them.

The registry (``gateway.containers.registry``) is the one place that maps the API's container ids
to sandbox containers (``security.sandbox``): the routes (``gateway.transport.containers_routes``)
and the tool (``gateway.tools.code_interpreter``) both go through it, so a tenant reaches only its
own containers on either path, and expiry, quotas and file ids are decided once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from security.sandbox.base import RunResult

__all__ = ["CodeRun", "ContainerFile", "ContainerRecord", "ContainerStatus", "Containers", "FileSource"]


class ContainerStatus(enum.StrEnum):
    RUNNING = "running"
    EXPIRED = "expired"


class FileSource(enum.StrEnum):
    """Who put a file in the container (the API's ``source``)."""

    USER = "user"  # uploaded through the API, or copied in from the Files API (``file_ids``)
    ASSISTANT = "assistant"  # written by the model's code


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    id: str  # ``cntr_...``
    tenant: str | None
    name: str
    created_at: int
    last_active_at: int
    #: minutes after ``last_active_at`` it expires (``expires_after: {"anchor": "last_active_at", "minutes": n}``)
    idle_minutes: int
    status: ContainerStatus
    memory_limit: str | None = None  # as the request spelled it ("1g" ...), echoed


@dataclass(frozen=True, slots=True)
class ContainerFile:
    id: str  # ``cfile_...``
    container_id: str
    path: str  # absolute inside the container: ``/mnt/data/<relative path>``
    bytes: int
    created_at: int
    source: FileSource


@dataclass(frozen=True, slots=True)
class CodeRun:
    """One run of the model's code: the sandbox's result and the container files it created or
    changed, registered (with ids) so the response can cite them and the client can fetch them."""

    result: RunResult
    files: tuple[ContainerFile, ...]


class Containers(Protocol):
    """A replica's containers, per tenant. ``tenant`` scopes every call: another tenant's id is
    treated as unknown (``None`` / ``KeyError``), never revealed."""

    async def create(
        self,
        tenant: str | None,
        *,
        name: str,
        file_ids: tuple[str, ...] = (),
        idle_minutes: int | None = None,
        memory_limit: str | None = None,
    ) -> ContainerRecord:
        """A new container, with the tenant's Files API files copied into ``/mnt/data``. Raises
        ``gateway.wire.errors.ApiError`` for a quota (400), an unknown file (404), or a sandbox that
        cannot start (503)."""
        ...

    async def get(self, tenant: str | None, container_id: str) -> ContainerRecord | None: ...

    async def run(self, tenant: str | None, container_id: str, code: str, timeout: float | None = None) -> CodeRun:
        """Run ``code`` in the container (calls on one container are serialized); it becomes active
        again. Never raises for what the code did (see ``RunResult``); ``KeyError`` for an unknown or
        expired container."""
        ...

    async def delete(self, tenant: str | None, container_id: str) -> bool: ...

    async def files(self, tenant: str | None, container_id: str) -> list[ContainerFile]: ...

    async def read(self, tenant: str | None, container_id: str, file_id: str) -> bytes | None: ...
