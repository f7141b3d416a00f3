"""HTTP routes of the Containers API (``gateway.containers.registry``), as the openai SDK calls them:

    POST   /v1/containers                               create: ``name``, ``expires_after``, ``file_ids``...
    GET    /v1/containers                               list: ``after``, ``limit``, ``order``, ``name``
    GET    /v1/containers/{id}                          retrieve (``status`` ``running`` or ``expired``)
    DELETE /v1/containers/{id}                          delete (a run in progress is ended)
    POST   /v1/containers/{id}/files                    add a file: multipart ``file``, or JSON ``{"file_id"}``
    GET    /v1/containers/{id}/files                    list: ``after``, ``limit``, ``order``
    GET    /v1/containers/{id}/files/{file_id}          retrieve
    GET    /v1/containers/{id}/files/{file_id}/content  the bytes
    DELETE /v1/containers/{id}/files/{file_id}          delete

Authenticated and rate-limited like the files routes (a create or an upload is admitted as a
request; reads only authenticated). Where ``code_interpreter`` does not run for the tenant (the
setting ``off``, or the tenant not in ``code_interpreter_tenants``) every route is a 404
``containers_off`` whose message names the setting. A container is its tenant's: another tenant's
id is a 404 indistinguishable from an unknown one. Containers are per replica (see the registry).
An upload streams into the container folder, refused with a 413 as soon as its bytes pass
``container_file_max_bytes`` (whatever ``content-length`` said), or a 400 once they would pass the
room ``container_disk_bytes`` leaves; its name is its last path component (``../../x`` is ``x``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.containers.model import ContainerRecord
from gateway.containers.registry import ContainerRegistry, containers_off
from gateway.transport.http_routes import read_json_body
from gateway.transport.resource_routes import json_answer, resource_route
from gateway.transport.services import GatewayState
from gateway.transport.upload_form import read_upload_form
from gateway.wire.containers import (
    container_deleted,
    container_file_deleted,
    container_file_not_found,
    container_file_object,
    container_file_too_large,
    container_not_found,
    container_object,
    containers_off_error,
    parse_container_create,
    parse_container_list_query,
)
from gateway.wire.errors import ApiError, bad_request, missing_parameter, unknown_parameter
from gateway.wire.listing import ListQuery, cursor_page, list_object

router = APIRouter()

#: bytes of a form's own framing allowed past ``container_file_max_bytes`` in a declared
#: ``content-length`` before the upload is refused unread
FORM_OVERHEAD = 64 * 1024

_route = resource_route(router, "containers")


async def _open(
    request: Request, *, admit: bool = False
) -> tuple[GatewayState, ContainerRegistry, str | None, dict[str, str]]:
    """The gateway, its registry and the caller's tenant (and rate-limit headers when ``admit``);
    the 404 naming the setting where containers are off for the tenant."""
    gw: GatewayState = request.app.state.gateway
    principal = await gw.auth.authenticate(request.headers)
    headers: dict[str, str] = {}
    if admit:
        admitted = await gw.access.admit(principal)
        headers = gw.access.headers(admitted)
    reason = containers_off(gw.settings, principal.tenant)
    if reason is None and gw.containers is None:
        reason = "the gateway's setting code_interpreter has no sandbox here"
    if reason is not None:
        raise containers_off_error(reason)
    assert gw.containers is not None
    return gw, gw.containers, principal.tenant, headers


def _no_query(request: Request) -> None:
    for key in request.query_params:
        raise unknown_parameter(key)


def _page(objects: list[dict[str, Any]], after: str | None, limit: int, order: str) -> dict[str, Any]:
    q = ListQuery(after, None, limit, "asc" if order == "asc" else "desc", ())
    page, more = cursor_page(objects, q)
    return list_object([dict(o) for o in page], more)


# -- containers ---------------------------------------------------------------------------------------


@_route("POST", "/containers")
async def create_container(request: Request) -> Response:
    gw, reg, tenant, headers = await _open(request, admit=True)
    _no_query(request)
    body = parse_container_create(await read_json_body(request, gw, tenant))
    record = await reg.create(
        tenant,
        name=body.name,
        file_ids=tuple(body.file_ids),
        idle_minutes=body.expires_after.minutes if body.expires_after is not None else None,
        memory_limit=body.memory_limit,
    )
    return json_answer(container_object(record), headers)


@_route("GET", "/containers")
async def list_containers(request: Request) -> Response:
    _, reg, tenant, _ = await _open(request)
    q = parse_container_list_query(request.query_params, name=True)
    records = await reg.records(tenant, name=q.name)
    return json_answer(_page([container_object(r) for r in records], q.after, q.limit, q.order))


async def _container(reg: ContainerRegistry, tenant: str | None, container_id: str) -> ContainerRecord:
    record = await reg.get(tenant, container_id)
    if record is None:
        raise container_not_found(container_id)
    return record


@_route("GET", "/containers/{container_id}")
async def retrieve_container(request: Request, container_id: str) -> Response:
    _, reg, tenant, _ = await _open(request)
    _no_query(request)
    return json_answer(container_object(await _container(reg, tenant, container_id)))


@_route("DELETE", "/containers/{container_id}")
async def delete_container(request: Request, container_id: str) -> Response:
    _, reg, tenant, _ = await _open(request)
    _no_query(request)
    if not await reg.delete(tenant, container_id):
        raise container_not_found(container_id)
    return json_answer(container_deleted(container_id))


# -- container files ----------------------------------------------------------------------------------


@_route("POST", "/containers/{container_id}/files")
async def create_container_file(request: Request, container_id: str) -> Response:
    gw, reg, tenant, headers = await _open(request, admit=True)
    _no_query(request)
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    try:
        if kind == "multipart/form-data":
            f = await _upload(request, gw, reg, tenant, container_id)
        elif kind in ("application/json", ""):
            body = await read_json_body(request, gw, tenant)
            if not isinstance(body, dict):
                raise bad_request("The request body must be a JSON object.", code="invalid_type")
            for key in body:
                if key != "file_id":
                    raise unknown_parameter(str(key)[:64])
            file_id = body.get("file_id")
            if file_id is None:
                raise missing_parameter("file_id")
            if not isinstance(file_id, str):
                raise bad_request(
                    "Invalid type for 'file_id': expected a string.", code="invalid_type", param="file_id"
                )
            f = await reg.add_file(tenant, container_id, file_id)
        else:
            raise ApiError(
                415,
                "A container file is sent as multipart/form-data ('file') or as JSON ('file_id').",
                code="invalid_content_type",
            )
    except KeyError:
        raise container_not_found(container_id) from None
    return json_answer(container_file_object(f), headers)


async def _upload(request: Request, gw: GatewayState, reg: ContainerRegistry, tenant: str | None, cid: str) -> Any:
    limit = gw.settings.container_file_max_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + FORM_OVERHEAD:
        raise _closing(container_file_too_large(limit))
    upload = await reg.upload(tenant, cid)
    try:
        try:
            form = await read_upload_form(request, gw, upload.write, file_field="file", fields=())
        except ApiError as err:  # refused mid-body: the unread rest is not worth reading
            raise _closing(err) from None
        if not form.file_seen:
            raise missing_parameter("file")
        return await upload.finish(form.filename)
    finally:
        await upload.abort()


def _closing(err: ApiError) -> ApiError:
    err.headers = {**err.headers, "connection": "close"}
    return err


@_route("GET", "/containers/{container_id}/files")
async def list_container_files(request: Request, container_id: str) -> Response:
    _, reg, tenant, _ = await _open(request)
    q = parse_container_list_query(request.query_params, name=False)
    try:
        files = await reg.files(tenant, container_id)
    except KeyError:
        raise container_not_found(container_id) from None
    return json_answer(_page([container_file_object(f) for f in files], q.after, q.limit, q.order))


@_route("GET", "/containers/{container_id}/files/{file_id}")
async def retrieve_container_file(request: Request, container_id: str, file_id: str) -> Response:
    _, reg, tenant, _ = await _open(request)
    _no_query(request)
    try:
        f = await reg.file(tenant, container_id, file_id)
    except KeyError:
        raise container_not_found(container_id) from None
    if f is None:
        raise container_file_not_found(file_id)
    return json_answer(container_file_object(f))


@_route("GET", "/containers/{container_id}/files/{file_id}/content")
async def container_file_content(request: Request, container_id: str, file_id: str) -> Response:
    _, reg, tenant, _ = await _open(request)
    _no_query(request)
    await _container(reg, tenant, container_id)
    data = await reg.read(tenant, container_id, file_id)
    if data is None:
        raise container_file_not_found(file_id)
    return Response(data, media_type="application/octet-stream")


@_route("DELETE", "/containers/{container_id}/files/{file_id}")
async def delete_container_file(request: Request, container_id: str, file_id: str) -> Response:
    _, reg, tenant, _ = await _open(request)
    _no_query(request)
    try:
        gone = await reg.delete_file(tenant, container_id, file_id)
    except KeyError:
        raise container_not_found(container_id) from None
    if not gone:
        raise container_file_not_found(file_id)
    return json_answer(container_file_deleted(file_id))
