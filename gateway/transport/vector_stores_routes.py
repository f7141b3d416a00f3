"""HTTP routes of the Vector Stores API (``gateway.files.vector_stores``):

    POST   /v1/vector_stores                                   create (``file_ids`` attached at once)
    GET    /v1/vector_stores                                   list: ``after``, ``before``, ``limit``, ``order``
    GET    /v1/vector_stores/{id}                              retrieve
    POST   /v1/vector_stores/{id}                              modify ``name``, ``metadata``, ``expires_after``
    DELETE /v1/vector_stores/{id}                              delete (its chunks with it)
    POST   /v1/vector_stores/{id}/search                       search (hybrid ranking)
    POST   /v1/vector_stores/{id}/files                        attach a file (ingested in the background)
    GET    /v1/vector_stores/{id}/files                        list: ``filter`` by status too
    GET    /v1/vector_stores/{id}/files/{file_id}              retrieve (the status the SDK polls)
    POST   /v1/vector_stores/{id}/files/{file_id}              modify ``attributes``
    DELETE /v1/vector_stores/{id}/files/{file_id}              detach (the file itself stays)
    GET    /v1/vector_stores/{id}/files/{file_id}/content      the file's text, as ingestion read it
    POST   /v1/vector_stores/{id}/file_batches                 attach several
    GET    /v1/vector_stores/{id}/file_batches/{batch_id}      retrieve
    POST   /v1/vector_stores/{id}/file_batches/{batch_id}/cancel
    GET    /v1/vector_stores/{id}/file_batches/{batch_id}/files

Writes are admitted as requests (rate limits), reads authenticated; another tenant's ids are 404s
like unknown ones. Bodies are read by the same bounded reader as every JSON route.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from cache.files.index import FilterError, parse_filter
from cache.files.store_catalog import FileStatus, StoreRecord
from gateway.files.files import tenant_key
from gateway.files.ingestion import PrepareFailed
from gateway.files.vector_stores import VectorStores
from gateway.transport.http_routes import read_json_body
from gateway.transport.resource_routes import json_answer, resource_route
from gateway.transport.services import GatewayState
from gateway.wire.conversations import parse_body
from gateway.wire.errors import bad_request, unknown_parameter
from gateway.wire.listing import list_object as listing
from gateway.wire.vector_stores import (
    AttachFileBody,
    CreateBatchBody,
    CreateStoreBody,
    SearchBody,
    UpdateFileBody,
    UpdateStoreBody,
    batch_not_found,
    batch_object,
    deleted,
    search_page,
    search_result,
    store_file_not_found,
    store_file_object,
    store_not_found,
    store_object,
)

router = APIRouter()

#: what an object still ``in_progress`` tells a polling client to wait (``openai-poll-after-ms``, which
#: the SDK's ``*_and_poll`` helpers read instead of their one-second default)
POLL_AFTER_MS = 250

_route = resource_route(router, "vector_stores")


def _json(data: Any, headers: dict[str, str] | None = None) -> Response:
    if data.get("status") == "in_progress":
        headers = {**(headers or {}), "openai-poll-after-ms": str(POLL_AFTER_MS)}
    return json_answer(data, headers)


def _stores(request: Request) -> tuple[GatewayState, VectorStores]:
    gw: GatewayState = request.app.state.gateway
    return gw, gw.vector_stores


async def _reader(request: Request) -> tuple[VectorStores, str | None]:
    gw, stores = _stores(request)
    return stores, (await gw.auth.authenticate(request.headers)).tenant


async def _writer(request: Request) -> tuple[VectorStores, str | None, dict[str, str], Any]:
    gw, stores = _stores(request)
    principal = await gw.auth.authenticate(request.headers)
    admitted = await gw.access.admit(principal)
    body = await read_json_body(request, gw, principal.tenant)
    return stores, principal.tenant, gw.access.headers(admitted), body


def _query(request: Request, *allowed: str) -> dict[str, str]:
    for key in request.query_params:
        if key not in allowed:
            raise unknown_parameter(key)
    return dict(request.query_params)


def _list_args(query: dict[str, str]) -> dict[str, Any]:
    """``after``, ``before``, ``limit`` (1..100, default 20), ``order`` (default ``desc``)."""
    raw = query.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise bad_request("Invalid 'limit': expected an integer from 1 to 100.", code="invalid_value", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("Invalid 'order': expected 'asc' or 'desc'.", code="invalid_value", param="order")
    return {"after": query.get("after"), "before": query.get("before"), "limit": int(raw), "order": order}


_STATUSES: dict[str, FileStatus] = {
    "in_progress": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


def _status(query: dict[str, str]) -> FileStatus | None:
    """A files list's ``filter``: one status, or none."""
    raw = query.get("filter")
    if raw is None:
        return None
    if raw not in _STATUSES:
        raise bad_request(
            "Invalid 'filter': expected in_progress, completed, failed or cancelled.",
            code="invalid_value",
            param="filter",
        )
    return _STATUSES[raw]


async def _store(stores: VectorStores, tenant: str | None, store_id: str) -> StoreRecord:
    record = await stores.get(tenant, store_id)
    if record is None:
        raise store_not_found(store_id)
    return record


async def _store_json(stores: VectorStores, record: StoreRecord, headers: dict[str, str] | None = None) -> Response:
    counts, used = await stores.counts(record)
    return _json(store_object(record, counts, used, stores.now()), headers)


# -- stores ----------------------------------------------------------------------------------------------


@_route("POST", "/vector_stores")
async def create_store(request: Request) -> Response:
    stores, tenant, headers, body = await _writer(request)
    req: CreateStoreBody = parse_body(CreateStoreBody, body)
    record = await stores.create(
        tenant,
        name=req.name,
        description=req.description,
        metadata=req.metadata,
        expires_after=req.expires_after,
        file_ids=req.file_ids or [],
        chunking=req.chunking_strategy,
    )
    return await _store_json(stores, record, headers)


@_route("GET", "/vector_stores")
async def list_stores(request: Request) -> Response:
    stores, tenant = await _reader(request)
    page = await stores.page(tenant, **_list_args(_query(request, "after", "before", "limit", "order")))
    data = []
    for record in page.items:
        counts, used = await stores.counts(record)
        data.append(store_object(record, counts, used, stores.now()))
    return _json(listing(data, page.has_more))


@_route("GET", "/vector_stores/{store_id}")
async def retrieve_store(request: Request, store_id: str) -> Response:
    stores, tenant = await _reader(request)
    _query(request)
    return await _store_json(stores, await _store(stores, tenant, store_id))


@_route("POST", "/vector_stores/{store_id}")
async def update_store(request: Request, store_id: str) -> Response:
    stores, tenant, headers, body = await _writer(request)
    req: UpdateStoreBody = parse_body(UpdateStoreBody, body)
    record = await _store(stores, tenant, store_id)
    updated = await stores.update(
        record,
        name=req.name,
        metadata=req.metadata,
        expires_after=req.expires_after,
        expires_given="expires_after" in req.model_fields_set,
    )
    return await _store_json(stores, updated, headers)


@_route("DELETE", "/vector_stores/{store_id}")
async def delete_store(request: Request, store_id: str) -> Response:
    stores, tenant = await _reader(request)
    _query(request)
    if not await stores.delete(tenant, store_id):
        raise store_not_found(store_id)
    return _json(deleted(store_id, "vector_store"))


@_route("POST", "/vector_stores/{store_id}/search")
async def search_store(request: Request, store_id: str) -> Response:
    stores, tenant, headers, body = await _writer(request)
    req: SearchBody = parse_body(SearchBody, body)
    await _store(stores, tenant, store_id)
    try:
        flt = parse_filter(req.filters) if req.filters is not None else None
    except FilterError as exc:
        raise bad_request(str(exc), code="invalid_value", param=exc.param) from None
    ranking = req.ranking_options
    hybrid = ranking.hybrid_search if ranking is not None else None
    hits = await stores.search(
        tenant,
        [store_id],
        req.text(),
        max_results=req.max_num_results,
        flt=flt,
        score_threshold=(ranking.score_threshold or 0.0) if ranking is not None else 0.0,
        ranker=ranking.ranker if ranking is not None else None,
        weights=(hybrid.embedding_weight, hybrid.text_weight) if hybrid is not None else None,
    )
    results = [search_result(h.hit.file_id, h.filename, h.hit.score, h.hit.text, h.hit.attributes) for h in hits]
    return _json(search_page(req.query, results), headers)


# -- files -----------------------------------------------------------------------------------------------


@_route("POST", "/vector_stores/{store_id}/files")
async def attach_file(request: Request, store_id: str) -> Response:
    stores, tenant, headers, body = await _writer(request)
    req: AttachFileBody = parse_body(AttachFileBody, body)
    record = await _store(stores, tenant, store_id)
    row = await stores.attach(record, req.file_id, req.attributes, req.chunking_strategy)
    return _json(store_file_object(row), headers)


@_route("GET", "/vector_stores/{store_id}/files")
async def list_files(request: Request, store_id: str) -> Response:
    stores, tenant = await _reader(request)
    query = _query(request, "after", "before", "limit", "order", "filter")
    record = await _store(stores, tenant, store_id)
    page = await stores.catalog.page_files(record.tenant, record.id, status=_status(query), **_list_args(query))
    return _json(listing([store_file_object(r) for r in page.items], page.has_more))


async def _store_file(stores: VectorStores, tenant: str | None, store_id: str, file_id: str) -> Any:
    row = await stores.catalog.get_file(tenant_key(tenant), store_id, file_id)
    if row is None:
        if await stores.get(tenant, store_id) is None:
            raise store_not_found(store_id)
        raise store_file_not_found(store_id, file_id)
    return row


@_route("GET", "/vector_stores/{store_id}/files/{file_id}")
async def retrieve_file(request: Request, store_id: str, file_id: str) -> Response:
    stores, tenant = await _reader(request)
    _query(request)
    return _json(store_file_object(await _store_file(stores, tenant, store_id, file_id)))


@_route("POST", "/vector_stores/{store_id}/files/{file_id}")
async def update_file(request: Request, store_id: str, file_id: str) -> Response:
    stores, tenant, headers, body = await _writer(request)
    req: UpdateFileBody = parse_body(UpdateFileBody, body)
    row = await _store_file(stores, tenant, store_id, file_id)
    return _json(store_file_object(await stores.set_attributes(row, req.attributes or {})), headers)


@_route("DELETE", "/vector_stores/{store_id}/files/{file_id}")
async def detach_file(request: Request, store_id: str, file_id: str) -> Response:
    stores, tenant = await _reader(request)
    _query(request)
    if not await stores.detach(tenant_key(tenant), store_id, file_id):
        await _store_file(stores, tenant, store_id, file_id)  # the right 404
    return _json(deleted(file_id, "vector_store.file"))


@_route("GET", "/vector_stores/{store_id}/files/{file_id}/content")
async def file_content(request: Request, store_id: str, file_id: str) -> Response:
    """The file's text as ingestion read it, one page (``vector_store.file_content.page``)."""
    stores, tenant = await _reader(request)
    _query(request)
    row = await _store_file(stores, tenant, store_id, file_id)
    try:
        text = await stores.text_of(row)
    except FileNotFoundError:
        raise store_file_not_found(store_id, file_id) from None
    except PrepareFailed as exc:
        raise bad_request(exc.message, code=exc.code, param="file_id") from None
    return _json(
        {
            "object": "vector_store.file_content.page",
            "data": [{"type": "text", "text": text}],
            "has_more": False,
            "next_page": None,
        }
    )


# -- batches ---------------------------------------------------------------------------------------------


@_route("POST", "/vector_stores/{store_id}/file_batches")
async def create_batch(request: Request, store_id: str) -> Response:
    stores, tenant, headers, body = await _writer(request)
    req: CreateBatchBody = parse_body(CreateBatchBody, body)
    record = await _store(stores, tenant, store_id)
    if req.files is not None:
        files = [
            (
                f.file_id,
                f.attributes if f.attributes is not None else req.attributes,
                f.chunking_strategy or req.chunking_strategy,
            )
            for f in req.files
        ]
    else:
        files = [(file_id, req.attributes, req.chunking_strategy) for file_id in dict.fromkeys(req.file_ids or [])]
    batch = await stores.create_batch(record, files)
    counts, _ = await stores.counts(record, batch.id)
    return _json(batch_object(batch, counts), headers)


async def _batch(stores: VectorStores, tenant: str | None, store_id: str, batch_id: str) -> Any:
    batch = await stores.catalog.get_batch(tenant_key(tenant), store_id, batch_id)
    if batch is None:
        if await stores.get(tenant, store_id) is None:
            raise store_not_found(store_id)
        raise batch_not_found(batch_id)
    return batch


@_route("GET", "/vector_stores/{store_id}/file_batches/{batch_id}")
async def retrieve_batch(request: Request, store_id: str, batch_id: str) -> Response:
    stores, tenant = await _reader(request)
    _query(request)
    batch = await _batch(stores, tenant, store_id, batch_id)
    counts, _ = await stores.catalog.counts(batch.tenant, store_id, batch.id)
    return _json(batch_object(batch, counts))


@_route("POST", "/vector_stores/{store_id}/file_batches/{batch_id}/cancel")
async def cancel_batch(request: Request, store_id: str, batch_id: str) -> Response:
    stores, tenant = await _reader(request)
    _query(request)
    batch = await stores.cancel_batch(await _batch(stores, tenant, store_id, batch_id))
    counts, _ = await stores.catalog.counts(batch.tenant, store_id, batch.id)
    return _json(batch_object(batch, counts))


@_route("GET", "/vector_stores/{store_id}/file_batches/{batch_id}/files")
async def list_batch_files(request: Request, store_id: str, batch_id: str) -> Response:
    stores, tenant = await _reader(request)
    query = _query(request, "after", "before", "limit", "order", "filter")
    batch = await _batch(stores, tenant, store_id, batch_id)
    page = await stores.catalog.page_files(
        batch.tenant, store_id, status=_status(query), batch_id=batch.id, **_list_args(query)
    )
    return _json(listing([store_file_object(r) for r in page.items], page.has_more))
