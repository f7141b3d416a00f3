"""The Containers API on the wire: the objects returned, the create body, the list query and the
errors, shaped as the openai SDK's types (``openai.types.ContainerCreateResponse`` and the list and
retrieve twins, ``openai.types.containers.FileCreateResponse`` and its twins).

A container of another tenant, like an unknown one, is a 404 naming only the id the client sent.
With ``code_interpreter`` off (or on for other tenants only: ``code_interpreter_tenants``) every
route answers a 404 ``containers_off`` whose message names the setting: the API does not exist here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from gateway.containers.model import ContainerFile, ContainerRecord
from gateway.wire.conversations import parse_body
from gateway.wire.errors import ApiError, bad_request, unknown_parameter

__all__ = [
    "ContainerCreate",
    "ContainerListQuery",
    "container_deleted",
    "container_file_object",
    "container_object",
    "parse_container_list_query",
]

#: characters of a container's name
MAX_NAME = 256
#: ``file_ids`` of one create
MAX_FILE_IDS = 100
#: ``expires_after.minutes`` bounds (the setting ``container_idle_minutes`` has the same)
MAX_IDLE_MINUTES = 24 * 60
#: the list bounds (OpenAI's: 1..100, default 20)
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100
MEMORY_LIMITS = ("1g", "4g", "16g", "64g")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExpiresAfter(_Strict):
    anchor: Literal["last_active_at"]
    minutes: StrictInt = Field(ge=1, le=MAX_IDLE_MINUTES)


class NetworkPolicy(_Strict):
    #: containers never reach the network: ``disabled`` only (an ``allowlist`` is refused)
    type: Literal["disabled"]


class ContainerCreate(_Strict):
    """``POST /v1/containers``. ``skills`` and a network ``allowlist`` are refused (400): the
    sandbox has neither."""

    name: StrictStr = Field(min_length=1, max_length=MAX_NAME)
    expires_after: ExpiresAfter | None = None
    file_ids: list[StrictStr] = Field(default_factory=list, max_length=MAX_FILE_IDS)
    memory_limit: Literal["1g", "4g", "16g", "64g"] | None = None
    network_policy: NetworkPolicy | None = None


def parse_container_create(body: Any) -> ContainerCreate:
    parsed: ContainerCreate = parse_body(ContainerCreate, body)
    return parsed


def container_object(record: ContainerRecord) -> dict[str, Any]:
    """Every field the SDK's container types declare."""
    return {
        "id": record.id,
        "object": "container",
        "created_at": record.created_at,
        "status": record.status.value,
        "expires_after": {"anchor": "last_active_at", "minutes": record.idle_minutes},
        "last_active_at": record.last_active_at,
        "memory_limit": record.memory_limit,
        "name": record.name,
        "network_policy": {"type": "disabled", "allowed_domains": None},
    }


def container_deleted(container_id: str) -> dict[str, Any]:
    return {"id": container_id, "object": "container.deleted", "deleted": True}


def container_file_object(f: ContainerFile) -> dict[str, Any]:
    """Every field the SDK's container file types declare."""
    return {
        "id": f.id,
        "object": "container.file",
        "bytes": f.bytes,
        "container_id": f.container_id,
        "created_at": f.created_at,
        "path": f.path,
        "source": f.source.value,
    }


def container_file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "container.file.deleted", "deleted": True}


class ContainerListQuery(NamedTuple):
    after: str | None
    limit: int
    order: Literal["asc", "desc"]
    name: str | None


def parse_container_list_query(query: Mapping[str, str], *, name: bool) -> ContainerListQuery:
    """``after``, ``limit`` (1..100, default 20), ``order`` (default ``desc``), and ``name`` where the
    list has it (containers, not their files); any other parameter is a 400 naming it."""
    allowed = ("after", "limit", "order", "name") if name else ("after", "limit", "order")
    for key in query:
        if key not in allowed:
            raise unknown_parameter(key)
    raw = query.get("limit", str(DEFAULT_LIST_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise bad_request(
            f"Invalid 'limit': expected an integer from 1 to {MAX_LIST_LIMIT}.", code="invalid_value", param="limit"
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(
            f"Invalid value: '{order[:64]}'. Supported values are: 'asc' and 'desc'.",
            code="invalid_value",
            param="order",
        )
    return ContainerListQuery(query.get("after"), int(raw), "asc" if order == "asc" else "desc", query.get("name"))


# -- errors ------------------------------------------------------------------------------------------


def containers_off_error(reason: str) -> ApiError:
    """The Containers API where ``code_interpreter`` does not run for this tenant: a 404 naming the
    setting (``reason``: the gateway's words, e.g. "the gateway's setting code_interpreter is 'off'")."""
    return ApiError(404, f"Containers are not available: {reason}.", code="containers_off", param=None)


def container_not_found(container_id: str) -> ApiError:
    return ApiError(
        404, f"No such Container object: {container_id[:128]}", code="container_not_found", param="container_id"
    )


def container_file_not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such Container File object: {file_id[:128]}", code="file_not_found", param="file_id")


def source_file_not_found(file_id: str, param: str) -> ApiError:
    """A ``file_ids`` entry (or an upload's ``file_id``) that is not one of the tenant's Files API files."""
    return ApiError(404, f"No such File object: {file_id[:128]}", code="file_not_found", param=param)


def containers_quota(limit: int) -> ApiError:
    return ApiError(
        400,
        f"This tenant already holds the {limit} containers it may (setting containers_per_tenant). "
        "Delete a container to make room.",
        code="quota_exceeded",
        param=None,
    )


def containers_full(limit: int) -> ApiError:
    """Every container slot of this replica taken (all tenants): retryable."""
    return ApiError(
        503,
        f"This server already runs the {limit} containers it may (setting containers_max). Please retry later.",
        type="server_error",
        code="server_is_overloaded",
    )


def sandbox_unavailable(reason: str) -> ApiError:
    return ApiError(
        503, f"The code sandbox could not start a container: {reason}", type="server_error", code="sandbox_unavailable"
    )


def container_file_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The file is larger than a container file may be ({limit} bytes; setting container_file_max_bytes).",
        code="file_too_large",
        param="file",
    )


def container_disk_full(limit: int) -> ApiError:
    return ApiError(
        400,
        f"The container's files would pass the {limit} bytes it may hold (setting container_disk_bytes). "
        "Delete files to make room.",
        code="quota_exceeded",
        param="file",
    )
