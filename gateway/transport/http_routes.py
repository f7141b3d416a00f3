"""HTTP routes: create (JSON or SSE), retrieve, delete, cancel, input_items, input_tokens, compact, models,
health.

Thin adapters around the pipeline: parse and authenticate, then either collect the events into the
final Response (JSON) or frame each one as SSE. A client that disconnects stops its generation —
except a ``background`` one's, which runs detached (``gateway.sessions.background``): its create
answers ``queued`` at once (or streams from its event log), and retrieve, cancel and
``?stream=true&starting_after=N`` reach it by id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from cache.event_log import LoggedEvent
from cache.response_state import ResponseState
from cache.response_store import StoreUnavailable
from gateway.access.rate_limits import rate_limit_error
from gateway.base.log_limit import RateLimitedLog
from gateway.sessions.background import limit_message
from gateway.sessions.background_turn import ACTIVE, Slot
from gateway.transport.body_encoding import BodyDecoder, DecodedTooLarge
from gateway.transport.http_protocol import log_rejection
from gateway.transport.inflight import HttpTurn, closing_events
from gateway.transport.services import GatewayState
from gateway.transport.sse import SSE_DONE, sse_encoded, sse_frame, timing_comment, wants_server_timing
from gateway.turn.events import Event, wire_event
from gateway.turn.types import PreparedTurn, TurnContext
from gateway.wire.dialects import EventDialect, asked_dialect, served_dialect, translate, translate_encoded
from gateway.wire.errors import (
    ApiError,
    bad_request,
    is_fault,
    model_not_found,
    response_not_found,
    server_error,
    shutting_down,
    store_unavailable,
)
from gateway.wire.kinds import TERMINAL_EVENT
from gateway.wire.listing import cursor_page, parse_list_query
from gateway.wire.response import usage_object
from gateway.wire.validation import InputRejected, decode_body
from inference.registry import ModelRoute

#: the events that end a response stream
TERMINAL_EVENTS = frozenset(TERMINAL_EVENT.values())

router = APIRouter()
log = logging.getLogger(__name__)


def _gw(request: Request) -> GatewayState:
    gw: GatewayState = request.app.state.gateway
    return gw


async def _json_body(request: Request, gw: GatewayState, tenant: str | None) -> Any:
    """The body (:func:`_sized_json_body` without its size)."""
    return (await _sized_json_body(request, gw, tenant))[0]


async def _sized_json_body(request: Request, gw: GatewayState, tenant: str | None) -> tuple[Any, int]:
    """The body, bounded in bytes and in pace (``body_timeout_s`` between chunks), parsed and checked
    for nesting and counts — in the prepare pool when it is big (``gateway.turn.offload``) — and
    the bytes it was parsed from, which bound the prepare work without a walk
    (``TurnContext.body_bytes``, as a WebSocket frame's length does). A ``Content-Encoding`` is
    decoded once the body is whole, a bounded step at a time, bounded in decoded bytes too
    (``gateway.transport.body_encoding``).
    Each refusal is counted and logged (rate-limited); a 413, 415, 408 or undecodable body's 400
    closes the connection, whose unread rest of the body is not worth reading."""
    s = gw.settings
    limit = s.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(request, gw, limit)
    try:  # Content-Encoding: the limit on the decoded bytes too (415 for a coding it cannot)
        body = BodyDecoder.for_headers(request.headers.getlist("content-encoding"), limit)
    except InputRejected as err:
        raise _refused(request, gw, err) from None
    size = 0
    wire: list[bytes] = []
    async for chunk in paced_body(request, gw):
        size += len(chunk)
        if size > limit:
            raise _too_large(request, gw, limit)
        wire.append(chunk)
    # decoded once the body is whole: a body that stalls holds the bytes it sent, not what they
    # inflate to (49 bytes of brotli can be 32 MiB), however many such bodies wait at once
    try:
        for chunk in wire:
            for _ in body.feed(chunk):
                await asyncio.sleep(0)  # a chunk may inflate to the whole limit: others run between its steps
        del wire
        raw = body.body()
    except DecodedTooLarge:
        raise _too_large(request, gw, limit) from None
    except InputRejected as err:
        raise _refused(request, gw, err) from None
    cpu = gw.pipeline.offload.for_size(len(raw))
    try:
        return await cpu(
            decode_body,
            raw,
            max_depth=s.max_json_depth,
            max_items=s.max_input_items,
            max_tools=s.max_tools,
            max_schema_bytes=s.max_schema_bytes,
            known_tools=gw.pipeline.known_tools(tenant),
        ), len(raw)
    except InputRejected as err:
        raise _refused(request, gw, err) from None


async def paced_body(request: Request, gw: GatewayState) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive, each within ``body_timeout_s`` of the one before: a body
    that stalls is a 408 and a client that leaves mid-body a 400, both counted and logged and both
    closing the connection (its unread rest is not worth reading). Every route that reads a body
    reads it through here, so none can be held open by a trickle."""
    timeout = gw.settings.body_timeout_s
    stream = request.stream()
    while True:
        try:
            async with asyncio.timeout(timeout):
                chunk = await anext(stream)
        except StopAsyncIteration:
            return
        except ClientDisconnect:
            # the client left mid-body: nobody to answer, and no fault of ours (not a 500 with a traceback)
            raise _refused(
                request,
                gw,
                InputRejected(
                    "disconnected",
                    400,
                    "The client disconnected before the request body was complete.",
                    code="client_disconnected",
                    headers={"connection": "close"},
                ),
            ) from None
        except TimeoutError:
            raise _refused(
                request,
                gw,
                InputRejected(
                    "body_timeout",
                    408,
                    f"The request body stalled: no data for {timeout:g} s.",
                    code="request_timeout",
                    headers={"connection": "close"},
                ),
            ) from None
        yield chunk


def _too_large(request: Request, gw: GatewayState, limit: int) -> InputRejected:
    """The 413 for a body above ``limit`` bytes: one answer whether the declared ``content-length``
    says so up front or the bytes read so far pass it (a body sent without a length, or a
    length that lied)."""
    return _refused(
        request,
        gw,
        InputRejected(
            "size",
            413,
            f"Request body too large (limit {limit} bytes).",
            code="request_too_large",
            headers={"connection": "close"},
        ),
    )


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
    if not gw.accepting:  # draining: SDKs retry a 503, on a replica that is still in rotation
        gw.metrics.errors.labels("http", "server_shutting_down").inc()
        raise shutting_down()
    asked = asked_dialect(request.headers)  # the events' dialect (gateway/wire/dialects.py); a bad value: 400
    admitted = await gw.access.admit(principal)  # 429 before the body is even read
    body, nbytes = await _sized_json_body(request, gw, principal.tenant)
    # a background response's events are logged in OpenAI's dialect; each reader gets its own
    background = isinstance(body, dict) and body.get("background") is True
    dialect = EventDialect.OPENAI if background else asked
    ctx = TurnContext(transport="http", tenant=principal.tenant, body_bytes=nbytes, dialect=dialect)
    if gw.metrics.tracing is not None:  # the caller's trace (W3C traceparent), for the turn span
        gw.metrics.tracing.accept(request.headers)
    slot: Slot | None = None
    try:
        if isinstance(body, dict) and body.get("background") is True:
            slot = gw.background.admit(principal.tenant)
            if slot is None:  # 429 before the create is prepared
                gw.access.rejected("http", "background")
                raise rate_limit_error(limit_message(gw.settings.background_max_per_tenant), "requests")
        turn = await gw.pipeline.prepare(body, ctx)
        reserved, on_usage = await gw.access.reserve(principal, turn.prompt_len)
    except ApiError as err:
        if slot is not None:
            slot.release()
        gw.metrics.errors.labels("http", err.code or str(err.status)).inc()
        raise
    except BaseException as exc:
        if slot is not None:
            slot.release()
        if not is_fault(exc):
            raise
        raise _fault(gw, "create") from None  # before the response exists: nothing generated or billed
    if not gw.accepting:  # the shutdown began while this turn was prepared: it never starts
        if slot is not None:
            slot.release()
        if on_usage is not None:
            on_usage(usage_object(0, 0, 0, 0))  # hand the reserved prompt tokens back
        gw.metrics.errors.labels("http", "server_shutting_down").inc()
        raise shutting_down()
    limit_headers = gw.access.headers(reserved or admitted)
    events = gw.pipeline.run(turn, on_usage)
    if slot is not None:
        reader = served_dialect(gw.settings, asked, turn.route.name)
        return await _background(gw, turn, events, slot, on_usage, limit_headers, reader)
    if turn.req.stream:
        queue: asyncio.Queue[tuple[Event, bytes]] = asyncio.Queue(maxsize=64)
        timing = wants_server_timing(request.headers)

        async def deliver(ev: Event) -> None:
            # framed in the turn's task: an event that cannot be encoded ends the turn there,
            # before it is billed, not after it was billed completed
            frame = sse_frame(wire_event(ev, turn.tools_json))
            if timing and ev["type"] in TERMINAL_EVENTS:  # opted in: a comment line, in the same write
                frame = timing_comment(turn.clock.server_timing()) + frame
            await queue.put((ev, frame))

        running = HttpTurn.start(gw.http_turns, turn, events, deliver)
        return TurnStream(
            running,
            _sse(running, queue, gw.pipeline.dialect_of(turn)),
            media_type="text/event-stream; charset=utf-8",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **limit_headers},
        )
    response = await _collect(request, gw, turn, events)
    response.headers.update(limit_headers)
    if response.status_code == 200:
        response.headers["server-timing"] = turn.clock.server_timing()
    return response


async def _background(
    gw: GatewayState,
    turn: PreparedTurn,
    events: AsyncIterator[Event],
    slot: Slot,
    on_usage: Any,
    headers: dict[str, str],
    dialect: EventDialect,
) -> Response:
    """A background create: the turn starts detached; the answer is its ``queued`` Response, or
    (``stream: true``) its event log followed from the start, in ``dialect`` — leaving it stops
    the reading only."""
    bg = await gw.background.start(turn, events, slot, on_usage)
    if bg.log is None:
        response = _json(bg.created)
        response.headers.update(headers)
        return response
    logged = await gw.background.open_events(bg.state, turn.ctx.tenant, -1)
    return StreamingResponse(
        _sse_logged(logged, dialect),
        media_type="text/event-stream; charset=utf-8",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers},
    )


#: faults on the create, input_tokens and compaction routes: whatever made one, a client can repeat
#: it, so its traceback is logged a few times per window for each route and exception type
route_faults = RateLimitedLog(log)


def _fault(gw: GatewayState, what: str) -> ApiError:
    """A fault of the gateway (or of native code under it) on a route: logged with its traceback,
    rate-limited (call it from the ``except``), counted, and answered as an OpenAI-shaped 500 —
    never a plain-text 500 or a traceback on the wire."""
    # ``what`` in the message's template, not its arguments: the log handler's own limit
    # (``FaultLogLimit``) tells this helper's callers apart by it
    route_faults.log(logging.ERROR, f"{what}:{type(sys.exc_info()[1]).__qualname__}", f"{what} crashed", exc_info=True)
    gw.metrics.errors.labels("http", "server_error").inc()
    return server_error()


class TurnStream(StreamingResponse):
    """An SSE response that stops its turn however it ends: Starlette may cancel it before the
    body iterator ever started (the client left first), and then no ``finally`` of the iterator
    runs."""

    def __init__(self, running: HttpTurn, content: AsyncIterator[bytes], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.running = running

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.running.stop()


async def _sse(
    running: HttpTurn, queue: asyncio.Queue[tuple[Event, bytes]], dialect: EventDialect
) -> AsyncIterator[bytes]:
    """Send the turn's frames as they come (``HttpTurn`` runs the turn in its own task), and end
    the stream with a terminal event whatever happened to the turn (see ``_closing``) — in
    OpenResponses' dialect followed by its ``[DONE]``."""
    last, ended = -1, False
    getter: asyncio.Future[tuple[Event, bytes]] | None = None
    try:
        while not (queue.empty() and running.task.done()):
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, running.task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()  # the turn ended: take what it queued (a cancelled get loses nothing)
                getter = None
                continue
            ev, frame = getter.result()
            getter = None
            last, ended = ev["sequence_number"], ev["type"] in TERMINAL_EVENTS
            yield frame
        if not ended:  # the turn ended without its terminal (``closing_events``)
            task = running.task
            for ev in closing_events(running, last, not task.cancelled() and task.exception() is not None):
                try:
                    frame = sse_frame(ev if dialect is EventDialect.OPENAI else translate(ev))
                except orjson.JSONEncodeError:  # what made the turn fail is in the snapshot: the error event says it
                    continue
                yield frame
        if dialect is EventDialect.OPENRESPONSES:
            yield SSE_DONE
    finally:
        if getter is not None and not getter.done():
            getter.cancel()
        running.stop()  # the client left: abort in the turn's own task (not awaited here)


async def _collect(request: Request, gw: GatewayState, turn: PreparedTurn, events: AsyncIterator[Event]) -> Response:
    """Non-streaming create: run to the terminal event, but abort if the client goes away.

    A failure after the response exists is a Response with status ``failed``, not an HTTP error
    (an HTTP 5xx would make SDKs retry: generated and billed again). The two exceptions bill
    nothing as ``completed``: the shutdown deadline (503, the turn billed ``cancelled``) and a
    fault of the gateway itself (500, the turn billed ``cancelled`` or ``failed``)."""
    final: dict[str, Any] | None = None

    async def keep(ev: Event) -> None:
        nonlocal final
        if ev["type"] in TERMINAL_EVENTS:
            final = ev["response"]

    running = HttpTurn.start(gw.http_turns, turn, events, keep)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({running.task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not running.task.done():  # the client left
            running.stop()
            await asyncio.wait({running.task})
            return Response(status_code=499)
    finally:
        watcher.cancel()
        running.stop()  # this request's task was cancelled: the turn stops in its own task
    if final is not None:
        try:
            return _json(final)
        except orjson.JSONEncodeError as exc:
            # the turn found its terminal unencodable and was billed failed (logged there, with the
            # traceback); what it could not encode is still in the failed snapshot
            log.error("could not encode response %s: %s", turn.id, exc)
            raise server_error() from None
    if running.cut_short:
        raise shutting_down()
    raise server_error()  # a fault escaped the turn (logged by HttpTurn); it was billed cancelled


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


#: store faults on retrieve/delete/cancel/input_items: a client can repeat the request that reads a
#: corrupt record as often as it likes, so the traceback is logged a few times per window, not each time
store_faults = RateLimitedLog(log)


def _store_fault(gw: GatewayState, op: str, response_id: str) -> ApiError:
    """A store fault other than an outage (a record that does not decode, a bug): logged with its
    traceback (call it from the ``except``), counted, and answered as an OpenAI-shaped 500 —
    never Starlette's plain-text one."""
    store_faults.log(logging.ERROR, f"store_{op}", f"response store {op} of %s crashed", response_id, exc_info=True)
    gw.metrics.errors.labels("http", "server_error").inc()
    return server_error()


async def _stored(request: Request, response_id: str) -> tuple[GatewayState, str | None, ResponseState]:
    gw = _gw(request)
    tenant = (await gw.auth.authenticate(request.headers)).tenant
    await gw.pipeline.finalizer.wait_for(response_id)
    try:
        state = await gw.store.get(response_id, tenant)
    except StoreUnavailable:
        raise store_unavailable() from None
    except BaseException as exc:
        if not is_fault(exc):
            raise
        raise _store_fault(gw, "get", response_id) from None
    if state is None:
        raise response_not_found(response_id)
    return gw, tenant, state


@router.get("/v1/responses/{response_id}")
@router.get("/responses/{response_id}", include_in_schema=False)
async def get_response(request: Request, response_id: str) -> Response:
    """The stored Response; a background one as it stands (queued, in_progress, then final). With
    ``stream=true`` a background stream's events after ``starting_after`` (default: all), then
    the live ones."""
    q = request.query_params
    stream = q.get("stream", "false").lower()
    if stream not in ("true", "false", "1", "0"):
        raise bad_request(
            f"Invalid value for 'stream': expected a boolean, but got '{q['stream']}' instead.",
            code="invalid_type",
            param="stream",
        )
    after = _starting_after(q.get("starting_after"))
    gw, tenant, state = await _stored(request, response_id)
    if stream in ("false", "0"):
        return _json(state.response)
    # in the reader's dialect, whichever the stream was created in (gateway/wire/dialects.py)
    dialect = served_dialect(gw.settings, asked_dialect(request.headers), state.response.get("model"))
    events = await gw.background.open_events(state, tenant, after)
    return StreamingResponse(
        _sse_logged(events, dialect),
        media_type="text/event-stream; charset=utf-8",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def _sse_logged(events: AsyncGenerator[LoggedEvent, None], dialect: EventDialect) -> AsyncIterator[bytes]:
    """A background stream's events (``gateway.sessions.replay``; logged in OpenAI's dialect),
    framed as SSE in ``dialect``."""
    async with contextlib.aclosing(events) as source:
        async for event in source:
            yield sse_encoded(*translate_encoded(event.type, event.data, dialect))
    if dialect is EventDialect.OPENRESPONSES:
        yield SSE_DONE


def _starting_after(raw: str | None) -> int:
    """``starting_after``: the sequence number after which to stream (absent: from the first event)."""
    if raw is None:
        return -1
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(
            "Invalid type for 'starting_after': expected an integer.", code="invalid_type", param="starting_after"
        ) from None
    if value < 0:
        raise bad_request(
            f"Invalid 'starting_after': expected a value >= 0, but got {value} instead.",
            code="integer_below_min_value",
            param="starting_after",
        )
    return value


@router.delete("/v1/responses/{response_id}")
@router.delete("/responses/{response_id}", include_in_schema=False)
async def delete_response(request: Request, response_id: str) -> Response:
    gw, tenant, state = await _stored(request, response_id)
    if state.response.get("background") and state.status in ACTIVE:
        # its owner writes the final state when it ends: deleting now would be undone then
        raise bad_request(
            f"Response '{response_id}' is still {state.status}; cancel it before deleting it.",
            code="invalid_request",
            param="response_id",
        )
    try:
        await gw.store.delete(response_id, tenant)
    except StoreUnavailable:
        raise store_unavailable() from None
    except BaseException as exc:
        if not is_fault(exc):
            raise
        raise _store_fault(gw, "delete", response_id) from None
    return _json({"id": response_id, "object": "response", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
@router.post("/responses/{response_id}/cancel", include_in_schema=False)
async def cancel_response(request: Request, response_id: str) -> Response:
    """Cancel a background response: the Response as it ended (one that already ended, unchanged)."""
    gw, tenant, state = await _stored(request, response_id)
    return _json(await gw.background.cancel(state, tenant))


@router.get("/v1/responses/{response_id}/input_items")
@router.get("/responses/{response_id}/input_items", include_in_schema=False)
async def list_input_items(request: Request, response_id: str) -> Response:
    """The items that were this response's input, cursor-paginated like every list
    (``gateway.wire.listing``); ``before`` too, which this endpoint has in OpenAI's API."""
    q = parse_list_query(request.query_params, request.query_params.multi_items(), before=True)
    _, _, state = await _stored(request, response_id)
    page, has_more = cursor_page(state.input_items, q)
    return _json(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": has_more,
        }
    )


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens", include_in_schema=False)
async def count_input_tokens(request: Request) -> Response:
    gw = _gw(request)
    principal = await gw.auth.authenticate(request.headers)
    await gw.access.admit(principal)
    body = await _json_body(request, gw, principal.tenant)
    try:
        n = await gw.pipeline.input_tokens(body, TurnContext(transport="http", tenant=principal.tenant))
    except BaseException as exc:
        if isinstance(exc, ApiError) or not is_fault(exc):
            raise
        raise _fault(gw, "input_tokens") from None
    return _json({"object": "response.input_tokens", "input_tokens": n})


@router.post("/v1/responses/compact")
@router.post("/responses/compact", include_in_schema=False)
async def compact_conversation(request: Request) -> Response:
    """The compacted context window of a conversation (``gateway.turn.compaction``)."""
    gw = _gw(request)
    principal = await gw.auth.authenticate(request.headers)
    admitted = await gw.access.admit(principal)
    body = await _json_body(request, gw, principal.tenant)
    ctx = TurnContext(transport="http", tenant=principal.tenant)
    try:
        # the summary's tokens are known only at the end: reserve none, charge them all then
        reserved, on_usage = await gw.access.reserve(principal, 0)
        window = await gw.pipeline.compact(body, ctx, on_usage)
    except ApiError as err:
        gw.metrics.errors.labels("http", err.code or str(err.status)).inc()
        raise
    except BaseException as exc:
        if not is_fault(exc):
            raise
        raise _fault(gw, "compaction") from None
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
    return _json(
        {
            "status": "ready" if ready else "not_ready",
            "engines": engines,
            "uptime_s": round(time.time() - gw.started_at, 3),
        },
        200 if ready else 503,
    )


#: the bounded JSON body reader and the fault answer, shared with the other HTTP route modules
#: (conversations_routes)
read_json_body = _json_body
route_fault = _fault
