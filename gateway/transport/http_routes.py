"""HTTP routes: create (JSON or SSE), retrieve, delete, cancel, input_items, input_tokens, compact, models,
health.

Thin adapters around the pipeline: parse and authenticate, then either collect the events into the
final Response (JSON) or frame each one as SSE. A client that disconnects stops its generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from cache.store import StoreUnavailable
from gateway.transport.http_protocol import log_rejection
from gateway.transport.services import GatewayState
from gateway.transport.sse import sse_frame
from gateway.turn.events import Event
from gateway.turn.types import TurnContext
from gateway.wire.errors import (ApiError, bad_request, model_not_found, response_not_found, store_unavailable,
                                 unknown_parameter)
from gateway.wire.kinds import TERMINAL_EVENT
from gateway.wire.validation import InputRejected, decode_body
from inference.registry import ModelRoute

#: the events that end a response stream
TERMINAL_EVENTS = frozenset(TERMINAL_EVENT.values())

router = APIRouter()


def _gw(request: Request) -> GatewayState:
    return request.app.state.gateway


async def _json_body(request: Request, gw: GatewayState) -> Any:
    """The body, bounded in bytes and in pace (``body_timeout_s`` between chunks), parsed and checked
    for nesting and counts — in the prepare pool when it is big (``gateway.turn.offload``). Each
    refusal is counted and logged (rate-limited); a 413 or 408 closes the connection, whose unread
    rest of the body is not worth reading."""
    s = gw.settings
    limit = s.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _refused(request, gw, InputRejected("size", 413, f"Request body too large (limit {limit} bytes).",
                                                  code="request_too_large", headers={"connection": "close"}))
    chunks: list[bytes] = []
    size = 0
    stream = request.stream()
    while True:
        try:
            async with asyncio.timeout(s.body_timeout_s):
                chunk = await anext(stream)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise _refused(request, gw, InputRejected(
                "body_timeout", 408, f"The request body stalled: no data for {s.body_timeout_s:g} s.",
                code="request_timeout", headers={"connection": "close"})) from None
        size += len(chunk)
        if size > limit:
            raise _refused(request, gw, InputRejected("size", 413, f"Request body too large (limit {limit} bytes).",
                                                      code="request_too_large", headers={"connection": "close"}))
        chunks.append(chunk)
    raw = b"".join(chunks)
    cpu = gw.pipeline.offload.for_size(len(raw))
    try:
        return await cpu(decode_body, raw, max_depth=s.max_json_depth, max_items=s.max_input_items,
                         max_tools=s.max_tools)
    except InputRejected as err:
        raise _refused(request, gw, err) from None


def _refused(request: Request, gw: GatewayState, err: InputRejected) -> InputRejected:
    gw.metrics.input_rejections.labels("http", err.reason).inc()
    log_rejection(err.reason, err.status, request.client, err.message)
    return err


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def create_response(request: Request) -> Response:
    gw = _gw(request)
    principal = await gw.auth.authenticate(request.headers)
    admitted = await gw.access.admit(principal)  # 429 before the body is even read
    body = await _json_body(request, gw)
    ctx = TurnContext(transport="http", tenant=principal.tenant)
    try:
        turn = await gw.pipeline.prepare(body, ctx)
        reserved, on_usage = await gw.access.reserve(principal, turn.prompt_len)
    except ApiError as err:
        gw.metrics.errors.labels("http", err.code or str(err.status)).inc()
        raise
    limit_headers = gw.access.headers(reserved or admitted)
    events = gw.pipeline.run(turn, on_usage)
    if turn.req.stream:
        return StreamingResponse(_sse(events), media_type="text/event-stream; charset=utf-8",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no", **limit_headers})
    response = await _collect(request, events)
    response.headers.update(limit_headers)
    return response


async def _sse(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """Frame the turn's events; the turn itself runs in its own asyncio task.

    Starlette cancels a streaming response through an anyio cancel scope when the client leaves,
    and anyio cancellation is level-triggered: every later ``await`` in the same scope is cancelled
    again — including the engine's own abort (vLLM awaits ``abort()`` on close). Running the turn in
    a separate task and cancelling *that* task (edge-triggered) lets the abort and the cancelled
    snapshot complete.
    """
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)

    async def pump() -> None:
        async with contextlib.aclosing(events) as stream:  # type: ignore[type-var]
            async for ev in stream:
                await queue.put(sse_frame(ev))
        await queue.put(None)

    task = asyncio.ensure_future(pump())
    getter: asyncio.Future[bytes | None] | None = None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done() and task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
            frame = await getter  # the pump put its frames (and the final None) before finishing
            getter = None
            if frame is None:
                return
            yield frame
    finally:
        if getter is not None and not getter.done():
            getter.cancel()
        if not task.done():
            task.cancel()  # the client left: abort in the turn's own task (not awaited here)


async def _collect(request: Request, events: AsyncIterator[Event]) -> Response:
    """Non-streaming create: run to the terminal event, but abort if the client goes away."""
    final: dict[str, Any] | None = None

    async def consume() -> None:
        nonlocal final
        async for ev in events:
            if ev["type"] in TERMINAL_EVENTS:
                final = ev["response"]

    task = asyncio.ensure_future(consume())  # its own task: cancelling it aborts the engine request
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return Response(status_code=499)
    watcher.cancel()
    task.result()
    assert final is not None
    # A failure after the response exists is a Response with status "failed", not an HTTP error
    # (an HTTP 5xx would make SDKs retry: generated and billed again).
    return _json(final)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _stored(request: Request, response_id: str):
    gw = _gw(request)
    tenant = (await gw.auth.authenticate(request.headers)).tenant
    await gw.pipeline.finalizer.wait_for(response_id)
    try:
        state = await gw.store.get(response_id, tenant)
    except StoreUnavailable:
        raise store_unavailable() from None
    if state is None:
        raise response_not_found(response_id)
    return gw, tenant, state


@router.get("/v1/responses/{response_id}")
@router.get("/responses/{response_id}", include_in_schema=False)
async def get_response(request: Request, response_id: str) -> Response:
    if request.query_params.get("stream") in ("true", "1"):
        raise bad_request("Streaming retrieval is only available for background responses.",
                          code="unsupported_parameter", param="stream")
    _, _, state = await _stored(request, response_id)
    return _json(state.response)


@router.delete("/v1/responses/{response_id}")
@router.delete("/responses/{response_id}", include_in_schema=False)
async def delete_response(request: Request, response_id: str) -> Response:
    gw, tenant, _ = await _stored(request, response_id)
    try:
        await gw.store.delete(response_id, tenant)
    except StoreUnavailable:
        raise store_unavailable() from None
    return _json({"id": response_id, "object": "response", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
@router.post("/responses/{response_id}/cancel", include_in_schema=False)
async def cancel_response(request: Request, response_id: str) -> Response:
    await _stored(request, response_id)
    raise bad_request("Only responses created with background=true can be cancelled.", code="invalid_request",
                      param="response_id")


@router.get("/v1/responses/{response_id}/input_items")
@router.get("/responses/{response_id}/input_items", include_in_schema=False)
async def list_input_items(request: Request, response_id: str) -> Response:
    q = request.query_params
    allowed = {"limit", "order", "after", "include", "include[]", "before"}
    for key in q:
        if key not in allowed:
            raise unknown_parameter(key)
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        raise bad_request("Invalid type for 'limit': expected an integer.", code="invalid_type", param="limit") from None
    if not 1 <= limit <= 100:
        raise bad_request(f"Invalid 'limit': expected a value between 1 and 100, but got {limit} instead.",
                          code="invalid_value", param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.", code="invalid_value",
                          param="order")
    _, _, state = await _stored(request, response_id)
    items = list(state.input_items)
    if order == "desc":
        items.reverse()
    after = q.get("after")
    if after is not None:
        ids = [i.get("id") for i in items]
        if after not in ids:
            raise bad_request(f"Item with id '{after}' not found.", code="invalid_value", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return _json({
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(items) > limit,
    })


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens", include_in_schema=False)
async def count_input_tokens(request: Request) -> Response:
    gw = _gw(request)
    principal = await gw.auth.authenticate(request.headers)
    await gw.access.admit(principal)
    body = await _json_body(request, gw)
    n = await gw.pipeline.input_tokens(body, TurnContext(transport="http", tenant=principal.tenant))
    return _json({"object": "response.input_tokens", "input_tokens": n})


@router.post("/v1/responses/compact")
@router.post("/responses/compact", include_in_schema=False)
async def compact_conversation(request: Request) -> Response:
    """The compacted context window of a conversation (``gateway.turn.compaction``)."""
    gw = _gw(request)
    principal = await gw.auth.authenticate(request.headers)
    admitted = await gw.access.admit(principal)
    body = await _json_body(request, gw)
    ctx = TurnContext(transport="http", tenant=principal.tenant)
    try:
        # the summary's tokens are known only at the end: reserve none, charge them all then
        reserved, on_usage = await gw.access.reserve(principal, 0)
        window = await gw.pipeline.compact(body, ctx, on_usage)
    except ApiError as err:
        gw.metrics.errors.labels("http", err.code or str(err.status)).inc()
        raise
    response = _json(window)
    response.headers.update(gw.access.headers(reserved or admitted))
    return response


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> Response:
    gw = _gw(request)
    await gw.auth.authenticate(request.headers)
    data = [_model(gw, route) for route in gw.registry.routes()]
    return _json({"object": "list", "data": data})


@router.get("/v1/models/{model_id}")
async def get_model(request: Request, model_id: str) -> Response:
    gw = _gw(request)
    await gw.auth.authenticate(request.headers)
    route = gw.registry.get(model_id)
    if route is None:
        raise model_not_found(model_id)
    return _json(_model(gw, route))


def _model(gw: GatewayState, route: ModelRoute) -> dict[str, Any]:
    return {"id": route.name, "object": "model", "created": gw.started_at, "owned_by": route.owned_by}


@router.get("/healthz", include_in_schema=False)
async def liveness() -> Response:
    return _json({"status": "ok"})


@router.get("/readyz", include_in_schema=False)
async def readiness(request: Request) -> Response:
    gw = _gw(request)
    engines = {e.name: e.ready() for e in gw.registry.engines()}
    ready = all(engines.values()) and gw.accepting
    return _json({"status": "ready" if ready else "not_ready", "engines": engines,
                  "uptime_s": round(time.time() - gw.started_at, 3)}, 200 if ready else 503)
