"""HTTP routes of the Files API (``gateway.files.files``):

    POST   /v1/files                    upload (multipart: ``file``, ``purpose``, ``expires_after``)
    GET    /v1/files                    list: ``after``, ``limit``, ``order``, ``purpose``
    GET    /v1/files/{id}               retrieve
    GET    /v1/files/{id}/content       the bytes
    DELETE /v1/files/{id}               delete (and everything derived from it)

Authenticated and rate-limited like the conversations routes (an upload is admitted as a request,
reads only authenticated). A file is its tenant's: another tenant's id is a 404 indistinguishable
from an unknown one. An upload streams to storage (``gateway.transport.upload_form``), refused with
a 413 as soon as its bytes pass ``files_max_bytes``, whatever ``content-length`` said. A file of a
type the extractor does not read (judged by its name, declared type and first 8 KiB, as soon as
they are in: a zip named ``notes.txt`` is refused before the rest of it streams in) is a 400
``unsupported_file`` naming the type, and nothing of it is kept.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from cache.files.catalog import FileRecord
from gateway.files.files import Files, Upload, clean_filename
from gateway.transport.resource_routes import json_answer, resource_route
from gateway.transport.services import GatewayState
from gateway.transport.upload_form import UploadForm, read_upload_form
from gateway.wire.errors import ApiError, unknown_parameter
from gateway.wire.files import (
    FORM_FIELDS,
    check_purpose,
    expiry_seconds,
    file_deleted,
    file_list,
    file_not_found,
    file_object,
    file_too_large,
    parse_file_list_query,
    unsupported_file,
)

router = APIRouter()

#: bytes of a form's own framing (boundaries, part headers, the text fields) allowed past
#: ``files_max_bytes`` in a declared ``content-length`` before the upload is refused unread
FORM_OVERHEAD = 64 * 1024

#: bytes of an upload's head (``Upload.head`` keeps the first 8 KiB) its type is judged by
HEAD_BYTES = 8192

_route = resource_route(router, "files")


_json = json_answer


def _files(request: Request) -> tuple[GatewayState, Files]:
    gw: GatewayState = request.app.state.gateway
    return gw, gw.files


def _no_query(request: Request) -> None:
    for key in request.query_params:
        raise unknown_parameter(key)


@_route("POST", "/files")
async def upload_file(request: Request) -> Response:
    gw, files = _files(request)
    principal = await gw.auth.authenticate(request.headers)
    admitted = await gw.access.admit(principal)
    _no_query(request)
    limit = gw.settings.files_max_bytes
    declared = request.headers.get("content-length")
    try:
        if declared is not None and declared.isdigit() and int(declared) > limit + FORM_OVERHEAD:
            raise _closing(file_too_large(limit))
        record = await _upload(request, gw, files, principal.tenant)
    except ApiError as err:
        gw.metrics.file_uploads.labels(_UPLOAD_OUTCOMES.get(err.code or "", "refused")).inc()
        raise
    gw.metrics.file_uploads.labels("ok").inc()
    gw.metrics.file_upload_bytes.inc(record.bytes)
    return _json(file_object(record), gw.access.headers(admitted))


#: an upload's refusal as its outcome label (anything else: ``refused``)
_UPLOAD_OUTCOMES = {"file_too_large": "too_large", "quota_exceeded": "quota_exceeded"}


async def _upload(request: Request, gw: GatewayState, files: Files, tenant: str | None) -> FileRecord:
    upload: Upload = await files.begin(tenant)
    form = UploadForm()
    checked = False

    async def sink(data: bytes) -> None:
        nonlocal checked
        await upload.write(data)
        if not checked and len(upload.head) >= HEAD_BYTES:  # refused before the rest streams in
            checked = True
            _check_type(form, upload.head)

    try:
        try:
            await read_upload_form(request, gw, sink, file_field="file", fields=FORM_FIELDS[1:], form=form)
        except ApiError as err:  # refused mid-body: the unread rest is not worth reading
            raise _closing(err) from None
        if not form.file_seen:
            raise ApiError(400, "Missing required parameter: 'file'.", code="missing_required_parameter", param="file")
        if not checked:
            _check_type(form, upload.head)
        purpose = check_purpose(form.fields.get("purpose"))
        expires = expiry_seconds(form.fields.get("expires_after[anchor]"), form.fields.get("expires_after[seconds]"))
        return await upload.finish(form.filename, purpose, expires)
    except BaseException:
        await upload.abort()
        raise


def _check_type(form: UploadForm, head: bytes) -> None:
    """The 400 ``unsupported_file`` naming the type, for a file the extractor would not read (its
    name, declared type and first bytes, as ``gateway.tools.documents.readable_kind`` judges)."""
    from gateway.tools.documents import UnsupportedFile, readable_kind

    try:
        readable_kind(clean_filename(form.filename), form.content_type, head)
    except UnsupportedFile as exc:
        raise unsupported_file(exc.message) from None


def _closing(err: ApiError) -> ApiError:
    """A refusal before the body was read: the connection closes (its unread rest is not worth
    reading)."""
    err.headers = {**err.headers, "connection": "close"}
    return err


@_route("GET", "/files")
async def list_files(request: Request) -> Response:
    gw, files = _files(request)
    tenant = (await gw.auth.authenticate(request.headers)).tenant
    q = parse_file_list_query(request.query_params)
    page = await files.page(tenant, after=q.after, limit=q.limit, order=q.order, purpose=q.purpose)
    return _json(file_list(page.files, page.has_more))


@_route("GET", "/files/{file_id}")
async def retrieve_file(request: Request, file_id: str) -> Response:
    gw, files = _files(request)
    tenant = (await gw.auth.authenticate(request.headers)).tenant
    _no_query(request)
    record = await files.get(tenant, file_id)
    if record is None:
        raise file_not_found(file_id)
    return _json(file_object(record))


@_route("GET", "/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> Response:
    gw, files = _files(request)
    tenant = (await gw.auth.authenticate(request.headers)).tenant
    _no_query(request)
    record = await files.get(tenant, file_id)
    if record is None:
        raise file_not_found(file_id)
    reader = files.content(tenant, file_id)
    try:
        first = await anext(reader, b"")
    except FileNotFoundError:  # deleted between the record and the read
        raise file_not_found(file_id) from None

    async def body() -> Any:
        yield first
        async for chunk in reader:
            yield chunk

    return StreamingResponse(
        body(),
        media_type="application/octet-stream",
        headers={"content-length": str(record.bytes), "content-disposition": _attachment(record.filename)},
    )


def _attachment(filename: str) -> str:
    from urllib.parse import quote

    return f"attachment; filename*=UTF-8''{quote(filename, safe='')}"


@_route("DELETE", "/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> Response:
    gw, files = _files(request)
    tenant = (await gw.auth.authenticate(request.headers)).tenant
    _no_query(request)
    if not await files.delete(tenant, file_id):
        raise file_not_found(file_id)
    return _json(file_deleted(file_id))
