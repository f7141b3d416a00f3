"""Responses WebSocket mode on ``GET /v1/responses`` (and ``/responses``).

One connection, many turns. The connection owns:

* a **connection cache** (latest response per lane) that continuations resolve against first;
* **lanes**: the default lane plus up to 32 named ``stream_id`` lanes. Each lane is a FIFO worker:
  turns in one lane never overlap, lanes run concurrently, and at most 16 responses are active at
  once across lanes (more are queued, never rejected, up to ``ws_max_queued``);
* its **limits** (gateway/access/limits.py): the key's concurrent connections (429 before the upgrade),
  its requests/tokens per minute (a 429 ``error`` frame, socket kept open), at most
  ``ws_max_queued`` creates queued or running (beyond: 429 frame), frames up to
  ``max_request_bytes`` (beyond: 413 frame); a key revoked while connected ends the connection;
* its **lifetime**: after ``ws_idle_timeout_s`` without frames or turns it closes (error frame +
  1000); after ``ws_max_age_s`` a ``response.create`` gets
  ``websocket_connection_limit_reached`` and the socket closes with 1000 once in-flight responses
  reached their terminal events.

Lifecycle of one connection (read it as a table)::

    OPEN     --age limit reached--> EXPIRED  (in-flight turns finish; new creates are refused)
    EXPIRED  --nothing in flight--> CLOSING  (error frame sent, close 1000)
    any      --client gone--------> CLOSED   (generations aborted, queues dropped, cache discarded)

Stray frames never kill the socket: invalid JSON, unknown event types and bad fields each get one
``error`` frame; ``response.processed`` (Codex) is swallowed silently.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket
from fastapi.responses import Response
from starlette.websockets import WebSocketDisconnect, WebSocketState

from cache.connection import DEFAULT_LANE, ConnectionCache
from gateway.access.auth import Principal
from gateway.wire.errors import ApiError, bad_request, invalid_api_key
from gateway.turn.types import TurnContext
from gateway.transport.services import GatewayState

log = logging.getLogger(__name__)
router = APIRouter()

STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")  # used with fullmatch: "$" would accept a trailing "\n"
SHUTTING_DOWN = ApiError(503, "The server is shutting down. Reconnect to continue.", type="server_error", code=None)
LIMIT_MESSAGE = ("Responses websocket connection limit reached (60 minutes). "
                 "Create a new websocket connection to continue.")


@router.websocket("/v1/responses")
@router.websocket("/responses")
async def responses_ws(websocket: WebSocket) -> None:
    gw: GatewayState = websocket.app.state.gateway
    try:
        principal = await gw.auth.authenticate(websocket.headers)
        gw.access.ws_open(principal)
    except ApiError as err:
        # Reject before the upgrade with an HTTP status and an OpenAI error body (no 101).
        await websocket.send_denial_response(
            Response(orjson.dumps(err.body()), status_code=err.status, media_type="application/json",
                     headers=err.headers))
        return
    try:
        await websocket.accept()
        conn = WsConnection(websocket, gw, principal)
        gw.connections.add(conn)
        gw.metrics.ws_connections.inc()
        try:
            await conn.serve()
        finally:
            gw.connections.discard(conn)
            gw.metrics.ws_connections.dec()
    finally:
        gw.access.ws_close(principal)


@dataclass(slots=True)
class _Lane:
    name: str
    queue: asyncio.Queue
    worker: asyncio.Task | None = None
    busy: bool = False


class WsConnection:
    def __init__(self, websocket: WebSocket, gw: GatewayState, principal: Principal) -> None:
        self.ws = websocket
        self.gw = gw
        self.settings = gw.settings
        self.principal = principal
        self.tenant = principal.tenant
        self.cache = ConnectionCache(gw.settings.ws_cache_bytes)
        self.lanes: dict[str, _Lane] = {}
        self.slots = asyncio.Semaphore(gw.settings.ws_max_inflight)
        self.opened = time.monotonic()
        self.expired = False
        self.closed = False
        self._send_lock = asyncio.Lock()
        self._steer_seq = 0
        #: response id -> lane name of responses in flight (steer targets the active response's lane)
        self._active: dict[str, str] = {}
        self._closing: asyncio.Task | None = None
        self._busy = 0  # turns running now, across lanes
        self._idle = asyncio.Event()
        self._queued = 0  # creates accepted and not finished (queued or running), across lanes
        self._last_active = time.monotonic()

    # -- reading ----------------------------------------------------------------------------------

    async def serve(self) -> None:
        watchdog = asyncio.create_task(self._age_watchdog())
        idle_watchdog = asyncio.create_task(self._idle_watchdog())
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                self._last_active = time.monotonic()
                data = message.get("text")
                if data is None and message.get("bytes") is not None:
                    try:  # some proxies send binary frames: treat them as UTF-8 JSON
                        data = message["bytes"].decode("utf-8")
                    except UnicodeDecodeError:
                        await self._send_error(bad_request("Binary frame is not valid UTF-8 JSON.",
                                                           code="invalid_json"))
                        continue
                if data is None:
                    continue
                await self._on_frame(data)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            watchdog.cancel()
            idle_watchdog.cancel()
            await self._shutdown()

    async def _on_frame(self, data: str) -> None:
        limit = self.settings.max_request_bytes
        if len(data) > limit:
            await self._send_error(ApiError(413, f"Frame too large (limit {limit} bytes).", code="request_too_large"))
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            await self._send_error(bad_request("Invalid JSON in WebSocket frame.", code="invalid_json"))
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self._send_error(bad_request("Each frame must be a JSON object with a string 'type'.",
                                               code="invalid_event", param="type"))
            return
        kind = event["type"]
        if kind == "response.create":
            await self._on_create(event)
        elif kind == "response.processed":
            return  # Codex acknowledges consumed responses; any reply would fail its next turn
        elif kind == "response.steer":
            await self._on_steer(event)
        elif kind == "response.inject":
            await self._send_error(bad_request("response.inject (hosted multi-agent beta) is not supported.",
                                               code="unsupported_event", param="type"))
        else:
            await self._send_error(bad_request(f"Unknown event type: '{kind}'.", code="unknown_event_type",
                                               param="type"))

    async def _on_create(self, event: dict[str, Any]) -> None:
        if self.expired or self._age() >= self.settings.ws_max_age_s:
            self._expire()
            return
        stream_id = event.get("stream_id")
        if stream_id is not None:
            if not isinstance(stream_id, str) or not STREAM_ID.fullmatch(stream_id):
                await self._send_error(bad_request(
                    "Invalid 'stream_id': expected 1-256 characters matching ^[A-Za-z0-9_.-]+$.",
                    code="invalid_stream_id", param="stream_id"))
                return
            if stream_id not in self.lanes and self._named_lanes() >= self.settings.ws_max_lanes:
                await self._send_error(bad_request(
                    f"This WebSocket connection has reached its maximum number of distinct stream IDs "
                    f"({self.settings.ws_max_lanes}). Reuse an existing stream_id or open a new WebSocket connection.",
                    code="websocket_stream_limit_reached", param="stream_id"), stream_id)
                return
        if not await self.gw.auth.still_valid(self.principal):
            self._begin_close(invalid_api_key())  # revoked while connected: no new turns, then close
            return
        if self._queued >= self.settings.ws_max_queued:
            await self._send_error(ApiError(
                429, f"Too many response.create frames queued on this connection (limit "
                     f"{self.settings.ws_max_queued}). Wait for responses to finish or open another connection.",
                type="requests", code="rate_limit_exceeded"), stream_id)
            return
        try:
            await self.gw.access.admit(self.principal)
        except ApiError as err:  # 429: a failed continuation evicts its same-lane parent (spec 5.4)
            self.gw.metrics.errors.labels("ws", err.code or str(err.status)).inc()
            prev = event.get("previous_response_id")
            if isinstance(prev, str) and self.cache.lane_of(prev) == (stream_id or DEFAULT_LANE):
                self.cache.evict(prev)
            await self._send_error(err, stream_id)
            return
        lane = self._lane(stream_id or DEFAULT_LANE)
        self._queued += 1
        lane.queue.put_nowait(event)

    async def _on_steer(self, event: dict[str, Any]) -> None:
        target = event.get("previous_response_id")
        lane_name = (self._active.get(target) or self.cache.lane_of(target)) if isinstance(target, str) else None
        stream_id = lane_name or None
        code, message = "steering_not_supported", "Steering is not supported by this model backend."
        extra = set(event) - {"type", "previous_response_id", "input"}
        inp = event.get("input")
        if extra:
            code, message = "invalid_input", f"response.steer does not accept: {', '.join(sorted(extra))}."
        elif isinstance(inp, list) and any(
                not isinstance(m, dict) or m.get("role") != "user" or m.get("type", "message") != "message"
                for m in inp):
            code, message = "invalid_input", "response.steer input may only contain user messages."
        elif not isinstance(inp, (str, list)) or (isinstance(inp, list) and not inp):
            code, message = "invalid_input", "response.steer input must be a string or a non-empty list."
        frame: dict[str, Any] = {
            "type": "response.steer.failed",
            "sequence_number": self._steer_seq,
            "steer": {"previous_response_id": target, "input": inp},
            "error": {"type": "invalid_request_error", "code": code, "message": message},
        }
        self._steer_seq += 1
        await self._send(frame, stream_id)

    # -- lanes ------------------------------------------------------------------------------------

    def _named_lanes(self) -> int:
        return sum(1 for name in self.lanes if name != DEFAULT_LANE)

    def _lane(self, name: str) -> _Lane:
        lane = self.lanes.get(name)
        if lane is None:
            lane = self.lanes[name] = _Lane(name, asyncio.Queue())
            lane.worker = asyncio.create_task(self._lane_worker(lane), name=f"ws-lane-{name or 'default'}")
        return lane

    async def _lane_worker(self, lane: _Lane) -> None:
        while True:
            event = await lane.queue.get()
            try:
                await self._lane_turn(lane, event)
            except ConnectionGone:
                return
            finally:
                self._queued -= 1
                self._last_active = time.monotonic()

    async def _lane_turn(self, lane: _Lane, event: dict[str, Any]) -> None:
        """One queued create; ``ConnectionGone`` propagates and ends the lane's worker."""
        if self.expired:
            self._expire()
            return
        async with self.slots:
            if self.expired:  # the limit passed while this turn waited for a slot
                self._expire()
                return
            lane.busy = True
            self._busy += 1
            self.gw.metrics.ws_inflight.inc()
            try:
                await self._run_turn(lane, event)
            except ConnectionGone:
                raise
            except Exception:
                log.exception("turn crashed on lane %r", lane.name)
                self._evict_failed_parent(event.get("previous_response_id"), lane)
                await self._send_error(ApiError(500, "The server had an error while processing your request.",
                                                type="server_error", code="server_error"), lane.name or None)
            finally:
                lane.busy = False
                self._busy -= 1
                if self._busy == 0:
                    self._idle.set()
                self.gw.metrics.ws_inflight.dec()

    async def _run_turn(self, lane: _Lane, event: dict[str, Any]) -> None:
        stream_id = lane.name or None
        ctx = TurnContext(transport="ws", tenant=self.tenant, conn_cache=self.cache, lane=lane.name)
        prev = event.get("previous_response_id")
        try:
            turn = await self.gw.pipeline.prepare(event, ctx)
            await self.gw.access.reserve(self.principal, turn.prompt_len, ctx)
        except ApiError as err:
            self.gw.metrics.errors.labels("ws", err.code or str(err.status)).inc()
            self._evict_failed_parent(prev, lane)
            await self._send_error(err, stream_id)
            return
        events = self.gw.pipeline.run(turn)
        self._active[turn.id] = lane.name
        try:
            async for ev in events:
                await self._send(ev, stream_id)
        finally:
            self._active.pop(turn.id, None)
            # Closing the generator aborts the engine request when we stopped early (socket gone).
            await events.aclose()
        if turn.response["status"] == "failed":
            self._evict_failed_parent(prev, lane)

    def _evict_failed_parent(self, prev: Any, lane: _Lane) -> None:
        """A failed same-lane continuation evicts its parent; a failed fork leaves it alone."""
        if isinstance(prev, str) and self.cache.lane_of(prev) == lane.name:
            self.cache.evict(prev)

    # -- lifetime ---------------------------------------------------------------------------------

    def _age(self) -> float:
        return time.monotonic() - self.opened

    async def _idle_watchdog(self) -> None:
        """Close a socket that sent nothing and ran nothing for ``ws_idle_timeout_s``."""
        timeout = self.settings.ws_idle_timeout_s
        if not timeout:
            return
        while not self.expired:
            wait = self._last_active + timeout - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if self._queued:  # a long generation is activity, not idleness
                self._last_active = time.monotonic()
                continue
            self._begin_close(ApiError(
                400, f"Responses websocket connection closed after {timeout:g} seconds without activity. "
                     "Create a new websocket connection to continue.", code="websocket_idle_timeout"))
            return

    async def _age_watchdog(self) -> None:
        await asyncio.sleep(max(0.0, self.settings.ws_max_age_s - self._age()))
        if self.settings.ws_close_idle_at_limit:
            self._expire()

    def _expire(self) -> None:
        self._begin_close(ApiError(400, LIMIT_MESSAGE, code="websocket_connection_limit_reached"))

    def _begin_close(self, farewell: ApiError, code: int = 1000) -> asyncio.Task:
        """Refuse new turns, let in-flight ones reach their terminal events, then say why and
        close. The age limit closes with 1000 (as OpenAI does: SDK auto-reconnect would replay
        frames whose ``store=false`` parents died with this socket); server shutdown closes with
        1001, going away (see ``gateway/ops/server.py``)."""
        self.expired = True
        if self._closing is None:
            self._closing = asyncio.create_task(self._close_when_idle(farewell, code))
        return self._closing

    async def drain(self) -> None:
        """Server shutdown: refuse new turns, finish in-flight responses, then error + close 1001."""
        await asyncio.shield(self._begin_close(SHUTTING_DOWN, 1001))

    async def cut(self) -> int:
        """Shutdown deadline passed: abort the turns still running (each records its usage as a
        cancelled response), then error + close 1001. Returns how many turns were cut."""
        running = self._busy
        self.expired = True
        if self._closing is not None:
            self._closing.cancel()
        workers = [lane.worker for lane in self.lanes.values() if lane.worker is not None]
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await self._send_error(SHUTTING_DOWN)
        self.closed = True
        try:
            await self.ws.close(code=1001)
        except RuntimeError:
            pass
        return running

    async def _close_when_idle(self, farewell: ApiError, code: int) -> None:
        while self._busy:
            self._idle.clear()
            await self._idle.wait()
        await self._send_error(farewell)
        self.closed = True
        try:
            await self.ws.close(code=code)
        except RuntimeError:
            pass

    async def _shutdown(self) -> None:
        """Client gone: abort every generation on this socket, drop queued turns, forget the cache."""
        self.closed = True
        workers = [lane.worker for lane in self.lanes.values() if lane.worker is not None]
        t0 = time.perf_counter()
        for w in workers:
            w.cancel()
        if workers:
            await asyncio.gather(*workers, return_exceptions=True)
            self.gw.metrics.cancel_latency.observe(time.perf_counter() - t0)
        if self._closing is not None:
            self._closing.cancel()
        self.cache.clear()

    # -- writing ----------------------------------------------------------------------------------

    async def _send(self, frame: dict[str, Any], stream_id: str | None = None) -> None:
        if stream_id is not None:
            frame = dict(frame, stream_id=stream_id)
        payload = orjson.dumps(frame).decode()
        async with self._send_lock:
            if self.closed or self.ws.application_state != WebSocketState.CONNECTED:
                raise ConnectionGone()
            try:
                await self.ws.send_text(payload)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise ConnectionGone() from exc

    async def _send_error(self, err: ApiError, stream_id: str | None = None) -> None:
        try:
            await self._send(err.ws_frame(stream_id))
        except ConnectionGone:
            pass


class ConnectionGone(Exception):
    """The client is gone; whatever was being produced for it must stop (and abort its generation)."""
