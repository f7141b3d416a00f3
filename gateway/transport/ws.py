"""Responses WebSocket mode on ``GET /v1/responses`` (and ``/responses``).

One connection, many turns. The connection owns:

* a **connection cache** (latest response per lane) that continuations resolve against first; with
  ``ws_resume_window_s`` its ``store=false`` states outlive the socket for that window
  (gateway/sessions/resumable.py: parked at close, claimed by a later turn of the same tenant that
  names one — the only two places this module touches them);
* **lanes**: the default lane plus up to 32 named ``stream_id`` lanes: turns in one lane never
  overlap, lanes run concurrently, and at most 16 responses are active at once across lanes (more
  are queued, never rejected, up to ``ws_max_queued``);
* its **limits** (gateway/access/rate_limits.py): the key's concurrent connections (429 before the upgrade),
  its requests/tokens per minute (a 429 ``error`` frame, socket kept open), at most
  ``ws_max_queued`` creates queued or running (beyond: 429 frame), frames up to
  ``max_request_bytes`` (beyond: 413 frame); a key revoked while connected ends the connection;
* its **lifetime**: after ``ws_idle_timeout_s`` without frames or turns it closes (error frame +
  1000); after ``ws_max_age_s`` a ``response.create`` gets
  ``websocket_connection_limit_reached`` and the socket closes with 1000 once in-flight responses
  reached their terminal events; a client that stops reading is closed with 1008 when writes made
  no progress for ``ws_send_deadline_s`` (gateway/transport/corked.py), its turns aborted and billed
  as cancelled.

**Backpressure.** Nothing here queues frames: a turn's events are pulled from its generator one at a
time and each is awaited through ``_send`` (one frame at a time per connection, ``_send_lock``), and
uvicorn's ``send()`` waits while the transport's write buffer is above its high-water mark. A client
that reads slowly therefore slows its turns' producers (and the engine requests they pull from);
one that stops reading holds at most the buffer, one pending frame per running turn and the
kernel's socket buffers, until the send deadline ends it.

The lifecycle (lanes, queueing, limits, closing) is decided by the sans-I/O machine in
``gateway/transport/lanes.py``, read as a table there; this module is its adapter: it parses frames,
runs the admission checks that need I/O (key still valid, rate limits), runs turns as tasks, and
performs the machine's actions (send, start, evict, close).

Stray frames never kill the socket: invalid JSON, unknown event types and bad fields each get one
``error`` frame; ``response.processed`` (Codex) is swallowed silently.

**Server-Timing and traces.** A connection opened with ``Respgate-Server-Timing: 1`` on the upgrade
(or ``?server_timing=1``, for browsers, whose WebSocket API sets no headers) gets each turn's
stage times as a ``server_timing`` string (the ``Server-Timing`` header's syntax) on the turn's
terminal event. A field on an existing event, not an event of its own: the spec's events carry
``sequence_number``s a client may check for gaps, a client reading "until the terminal" would find
a trailing frame at the start of its next turn, and clients already meet extra fields there (our
``stream_id``); the SDKs' models keep unknown fields, Codex's serde ignores them. Never sent
unasked. Each turn is its own trace span (``gateway.base.tracing``), under the create's
``client_metadata.traceparent``, else the upgrade's ``traceparent``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import msgspec
import orjson
from fastapi import APIRouter, WebSocket
from fastapi.responses import Response
from starlette.websockets import WebSocketDisconnect, WebSocketState

from cache.connection_state import ConnectionCache
from gateway.access.auth import Principal
from gateway.transport.corked import SEND_STALLED_CODE, SEND_STALLED_REASON, TEXT_FRAMES, SendStalled, TextFrames
from gateway.transport.http_protocol import log_rejection
from gateway.transport.lanes import DEFAULT_LANE, Act, Action, Ev, Event, Farewell, LaneMachine, Refusal, State
from gateway.transport.services import GatewayState
from gateway.transport.sse import wants_server_timing
from gateway.transport.steering import Plan, Refused, Steer, SteerBook, steered_input, successor_frame
from gateway.turn.events import wire_event
from gateway.turn.types import PreparedTurn, SteerSignal, TurnContext
from gateway.wire import steer as steer_wire
from gateway.wire.dialects import EventDialect, asked_dialect, served_dialect, ws_error_frame
from gateway.wire.errors import SHUTTING_DOWN, ApiError, bad_request, invalid_api_key, is_fault
from gateway.wire.kinds import TERMINAL_EVENT, ResponseStatus
from gateway.wire.steer import SteerCode, SteerRejected, steer_items, steer_target
from gateway.wire.validation import InputRejected, check_counts, decode_json
from inference.engine import can_steer

log = logging.getLogger(__name__)
router = APIRouter()

STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")  # used with fullmatch: "$" would accept a trailing "\n"
TERMINAL_EVENTS = frozenset(TERMINAL_EVENT.values())
LIMIT_MESSAGE = (
    "Responses websocket connection limit reached (60 minutes). Create a new websocket connection to continue."
)


@router.websocket("/v1/responses")
@router.websocket("/responses")
async def responses_ws(websocket: WebSocket) -> None:
    gw: GatewayState = websocket.app.state.gateway
    try:
        principal = await gw.auth.authenticate(websocket.headers)
        # the events' dialect for the whole connection (gateway/wire/dialects.py); a bad value: 400, no 101
        dialect = asked_dialect(websocket.headers, websocket.query_params)
        gw.access.ws_open(principal)
    except ApiError as err:
        # Reject before the upgrade with an HTTP status and an OpenAI error body (no 101).
        await websocket.send_denial_response(
            Response(
                orjson.dumps(err.body()), status_code=err.status, media_type="application/json", headers=err.headers
            )
        )
        return
    try:
        await websocket.accept()
        conn = WsConnection(websocket, gw, principal, dialect)
        gw.connections.add(conn)
        gw.metrics.ws_connections.inc()
        try:
            await conn.serve()
        finally:
            gw.connections.discard(conn)
            gw.metrics.ws_connections.dec()
    finally:
        gw.access.ws_close(principal)


class WsConnection:
    def __init__(
        self, websocket: WebSocket, gw: GatewayState, principal: Principal, dialect: EventDialect | None = None
    ) -> None:
        self.ws = websocket
        self.gw = gw
        self.settings = gw.settings
        self.principal = principal
        self.tenant = principal.tenant
        #: the events' dialect the upgrade asked for; None: the operator's setting (per model for turns)
        self.dialect = dialect
        self.cache = ConnectionCache(gw.settings.ws_cache_bytes)
        self.machine = LaneMachine(
            max_inflight=gw.settings.ws_max_inflight,
            max_queued=gw.settings.ws_max_queued,
            max_lanes=gw.settings.ws_max_lanes,
        )
        self.opened = time.monotonic()
        self.closed = False
        self._send_lock = asyncio.Lock()
        #: sends waiting for or holding the lock: while any is, no frame is written past them
        self._queued_sends = 0
        #: the protocol's direct text-frame writer (gateway/transport/corked.py); None under another server
        ext = websocket.scope.get("extensions") or {}
        self._frames: TextFrames | None = (ext.get(TEXT_FRAMES) or {}).get("frames")
        #: ``response.steer`` events' own sequence (they belong to no response's stream)
        self._steer_seq = 0
        #: what was steered, and where it goes (gateway/transport/steering.py)
        self.steers = SteerBook(
            max_pending=gw.settings.ws_max_pending_steers,
            max_bytes=gw.settings.max_request_bytes,
            max_items=gw.settings.max_input_items,
        )
        #: running turn tasks -> their lane
        self._turns: dict[asyncio.Task[None], str] = {}
        self._done = asyncio.Event()  # the machine reached CLOSED
        self._last_active = time.monotonic()
        self._parked = False  # the lanes were handed to ``gw.resumable`` (once, at close)
        #: opted in to Server-Timing on terminal events (module docstring)
        self.server_timing = wants_server_timing(websocket.headers) or websocket.query_params.get(
            "server_timing", ""
        ).lower() in ("1", "true", "on")
        tracing = gw.metrics.tracing
        #: the upgrade's trace headers: the parent of turns whose create names none
        self._trace_parent = tracing.parent_of(websocket.headers) if tracing is not None else None

    @property
    def expired(self) -> bool:
        """No new turns are accepted (the connection drains or is closed)."""
        return self.machine.state is not State.OPEN

    # -- reading ----------------------------------------------------------------------------------

    async def serve(self) -> None:
        watchdog = asyncio.create_task(self._age_watchdog())
        idle_watchdog = asyncio.create_task(self._idle_watchdog())
        stalled = False
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    stalled = (message.get("code"), message.get("reason")) == (SEND_STALLED_CODE, SEND_STALLED_REASON)
                    break
                self._last_active = time.monotonic()
                data = message.get("text")
                if data is None and message.get("bytes") is not None:
                    try:  # some proxies send binary frames: treat them as UTF-8 JSON
                        data = message["bytes"].decode("utf-8")
                    except UnicodeDecodeError:
                        await self._send_error(
                            bad_request("Binary frame is not valid UTF-8 JSON.", code="invalid_json")
                        )
                        continue
                if data is None:
                    continue
                await self._on_frame(data)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            watchdog.cancel()
            idle_watchdog.cancel()
            await self._gone(stalled)

    async def _on_frame(self, data: str) -> None:
        limit = self.settings.max_request_bytes
        # bytes, not characters: a frame of "中" is three bytes a character (encoded only when it can matter)
        if len(data) > limit or (
            len(data) * 4 > limit and not data.isascii() and len(data.encode("utf-8", "surrogatepass")) > limit
        ):
            self.gw.metrics.input_rejections.labels("ws", "size").inc()
            err = ApiError(413, f"Frame too large (limit {limit} bytes).", code="request_too_large")
            log_rejection("size", 413, self.ws.client, err.message, "ws")
            await self._send_error(err)
            return
        cpu = self.gw.pipeline.offload.for_size(len(data))  # a big frame is parsed off the loop
        known_tools = self.gw.pipeline.known_tools(self.tenant)
        try:
            event = await cpu(decode_json, data, self.settings.max_json_depth, known_tools)
        except InputRejected as err:
            self.gw.metrics.input_rejections.labels("ws", err.reason).inc()
            log_rejection(err.reason, err.status, self.ws.client, err.message, "ws")
            await self._send_error(err)
            return
        except ApiError:
            await self._send_error(bad_request("Invalid JSON in WebSocket frame.", code="invalid_json"))
            return
        try:
            check_counts(
                event,
                max_items=self.settings.max_input_items,
                max_tools=self.settings.max_tools,
                max_schema_bytes=self.settings.max_schema_bytes,
                known_tools=known_tools,
            )
        except InputRejected as err:
            self.gw.metrics.input_rejections.labels("ws", err.reason).inc()
            log_rejection(err.reason, err.status, self.ws.client, err.message, "ws")
            if event.get("type") == "response.steer":  # a steer is answered by a failed steer, never an error
                target = event.get("previous_response_id")
                await self._steer_failed(None, target, event.get("input"), SteerCode.INVALID_INPUT, err.message)
                return
            stream_id = event.get("stream_id") if isinstance(event.get("stream_id"), str) else None
            await self._send_error(err, stream_id, event.get("model"))
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self._send_error(
                bad_request(
                    "Each frame must be a JSON object with a string 'type'.", code="invalid_event", param="type"
                )
            )
            return
        kind = event["type"]
        if kind == "response.create":
            stream_id = event.get("stream_id")
            valid = stream_id is None or (isinstance(stream_id, str) and STREAM_ID.fullmatch(stream_id) is not None)
            await self._feed(
                Event(
                    Ev.CREATE,
                    lane=stream_id if valid and stream_id is not None else DEFAULT_LANE,
                    frame=Create(event, len(data)),
                    previous_response_id=_prev(event),
                    valid_lane=valid,
                    aged=self._age() >= self.settings.ws_max_age_s,
                )
            )
        elif kind == "response.processed":
            return  # Codex acknowledges consumed responses; any reply would fail its next turn
        elif kind == "response.steer":
            # bytes, not characters: the steer budget is in bytes (encoded only when it can differ)
            await self._on_steer(event, len(data) if data.isascii() else len(data.encode("utf-8", "surrogatepass")))
        elif kind == "response.inject":
            await self._send_error(
                bad_request(
                    "response.inject (hosted multi-agent beta) is not supported.",
                    code="unsupported_event",
                    param="type",
                )
            )
        else:
            await self._send_error(
                bad_request(f"Unknown event type: '{kind}'.", code="unknown_event_type", param="type")
            )

    async def _on_steer(self, event: dict[str, Any], nbytes: int) -> None:
        """Queue a steer on the active response it names (``response.steer.accepted``) or hand it
        back (``response.steer.failed``): what becomes of it is decided when that response ends
        (:meth:`_settle_steers`). Never an ``error`` frame: clients read a failed steer as "apply
        it yourself with response.create"."""
        target = event.get("previous_response_id")
        try:
            target_id = steer_target(event)  # the shape: cheap, on the loop
        except SteerRejected as err:
            await self._steer_failed(None, target, event.get("input"), SteerCode.INVALID_INPUT, err.message)
            return
        # a steer no response takes costs a lookup, not a walk of its input
        verdict: Steer | Refused | None = self.steers.refusal(target_id, nbytes)
        if verdict is None:
            try:  # the contents: in the prepare pool when the frame is big, as a create's are
                items = await self.gw.pipeline.offload.for_size(nbytes)(steer_items, event)
            except SteerRejected as err:
                await self._steer_failed(None, target, event["input"], SteerCode.INVALID_INPUT, err.message)
                return
            verdict = self.steers.submit(target_id, event["input"], items, nbytes)
        if isinstance(verdict, Refused):
            await self._steer_failed(None, target, event["input"], verdict.code, verdict.message)
            return
        self.gw.metrics.ws_steers.labels("accepted").inc()
        await self._steer_frame(steer_wire.accepted(self._next_steer_seq(), verdict.id, verdict.target), target)

    def _next_steer_seq(self) -> int:
        seq = self._steer_seq
        self._steer_seq += 1
        return seq

    async def _steer_frame(self, frame: dict[str, Any], target: Any) -> None:
        """A steer event, on the target response's lane (``stream_id`` when it has one)."""
        try:
            await self._send(frame, self.steers.lane_of(target) or None)
        except ConnectionGone as gone:
            await self._feed(Event(gone.event))

    async def _steer_failed(
        self, steer_id: str | None, target: Any, steer_input: Any, code: SteerCode, message: str
    ) -> None:
        self.gw.metrics.ws_steers.labels(f"failed_{code.value}").inc()
        frame = steer_wire.failed(self._next_steer_seq(), steer_id, target, steer_input, code, message)
        await self._steer_frame(frame, target)

    async def _fail_steers(self, steers: list[Steer], code: SteerCode, message: str) -> None:
        for s in steers:
            await self._steer_failed(s.id, s.target, s.input, code, message)

    # -- the machine's actions --------------------------------------------------------------------

    async def _feed(self, event: Event) -> None:
        if event.kind is Ev.SEND_STALLED and self.machine.state is not State.CLOSED:
            self.gw.metrics.ws_send_stalls.inc()  # once: the machine is CLOSED after the first
        for action in self.machine.handle(event):
            await self._perform(action)

    async def _perform(self, a: Action) -> None:
        stream_id = a.lane or None
        if a.kind is Act.CHECK:
            await self._admission(a)
        elif a.kind is Act.START:
            task = asyncio.create_task(self._turn(a.lane, a.frame), name=f"ws-turn-{a.lane or 'default'}")
            self._turns[task] = a.lane
            task.add_done_callback(self._turns.pop)
        elif a.kind is Act.REFUSE:
            assert a.refusal is not None
            if a.refusal is Refusal.QUEUE_FULL:
                self.gw.access.rejected("ws", "queue")
            model = a.frame.body.get("model") if isinstance(a.frame, Create) else None
            lane = None if a.refusal is Refusal.BAD_LANE else stream_id
            await self._send_error(self._refusal(a.refusal), lane, model)
        elif a.kind is Act.ERROR:
            await self._send_error(a.error, stream_id)
        elif a.kind is Act.EVICT:
            self.cache.discard_failed_parent(a.previous_response_id, a.lane)
        elif a.kind is Act.FAREWELL:
            assert a.farewell is not None
            await self._send_error(self._farewell(a.farewell))
        elif a.kind is Act.CLOSE:
            assert a.farewell is not None
            self.closed = True
            try:
                await self.ws.close(code=a.farewell.code)
            except (RuntimeError, WebSocketDisconnect):  # already closed (SendStalled: by the send deadline)
                pass
            await self._park()  # before the drain hears of the close: a 1001's records are written first
            self._done.set()
        elif a.kind is Act.ABORT:
            await self._abort()
        # QUEUE and DROP: the create waits in its lane, or is gone; nothing to send

    async def _admission(self, a: Action) -> None:
        """The checks that need I/O: the key still valid (a revocation ends the connection), then
        the key's rate limit (a 429 frame; a failed continuation evicts its same-lane parent)."""
        if not await self.gw.auth.still_valid(self.principal):
            await self._feed(Event(Ev.REVOKED))
            return
        try:
            await self.gw.access.admit(self.principal, "ws")
        except ApiError as err:
            self.gw.metrics.errors.labels("ws", err.code or str(err.status)).inc()
            await self._feed(Event(Ev.REFUSED, lane=a.lane, previous_response_id=a.previous_response_id, error=err))
            return
        await self._feed(Event(Ev.ADMITTED, lane=a.lane, frame=a.frame, previous_response_id=a.previous_response_id))

    async def _abort(self) -> None:
        """Cancel the running turns (each records its usage as a cancelled response) and wait for them."""
        me = asyncio.current_task()
        tasks = [t for t in self._turns if t is not me]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _refusal(self, why: Refusal) -> ApiError:
        s = self.settings
        if why is Refusal.BAD_LANE:
            return bad_request(
                "Invalid 'stream_id': expected 1-256 characters matching ^[A-Za-z0-9_.-]+$.",
                code="invalid_stream_id",
                param="stream_id",
            )
        if why is Refusal.LANE_LIMIT:
            return bad_request(
                f"This WebSocket connection has reached its maximum number of distinct stream IDs "
                f"({s.ws_max_lanes}). Reuse an existing stream_id or open a new WebSocket connection.",
                code="websocket_stream_limit_reached",
                param="stream_id",
            )
        return ApiError(
            429,
            f"Too many response.create frames queued on this connection (limit {s.ws_max_queued}). "
            "Wait for responses to finish or open another connection.",
            type="requests",
            code="rate_limit_exceeded",
        )

    def _farewell(self, why: Farewell) -> ApiError:
        if why is Farewell.AGE_LIMIT:
            return ApiError(400, LIMIT_MESSAGE, code="websocket_connection_limit_reached")
        if why is Farewell.IDLE:
            return ApiError(
                400,
                f"Responses websocket connection closed after {self.settings.ws_idle_timeout_s:g} "
                "seconds without activity. Create a new websocket connection to continue.",
                code="websocket_idle_timeout",
            )
        if why is Farewell.REVOKED:
            return invalid_api_key()
        return SHUTTING_DOWN

    # -- turns ------------------------------------------------------------------------------------

    async def _turn(self, lane: str, create: Create) -> None:
        """One create, start to terminal event; then the machine hears how it ended."""
        self.gw.metrics.ws_inflight.inc()
        gone: Ev | None = None  # how the machine hears that the socket went (client_gone, send_stalled)
        failed = False
        try:
            failed = await self._run_turn(lane, create)
        except ConnectionGone as exc:
            gone = exc.event
        except BaseException as exc:  # a Rust panic (pyo3's PanicException) too: the lane must hear of it
            if not is_fault(exc):
                raise
            log.exception("turn crashed on lane %r", lane)
            failed = True
            await self._send_error(
                ApiError(
                    500,
                    "The server had an error while processing your request.",
                    type="server_error",
                    code="server_error",
                ),
                lane or None,
            )
        finally:
            self.gw.metrics.ws_inflight.dec()
            self._last_active = time.monotonic()
        if gone is not None:
            await self._feed(Event(gone))
        else:
            await self._feed(
                Event(Ev.TURN_FAILED if failed else Ev.TURN_DONE, lane=lane, previous_response_id=_prev(create.body))
            )

    async def _run_turn(self, lane: str, create: Create) -> bool:
        """Prepare and stream one create — and the successors its steers make — ; True when the
        create's own response failed (its parent is then evicted)."""
        frame, nbytes = create.body, create.nbytes
        # the steers waiting for this continuation, and those it leaves behind on its lane
        steers, orphaned = self.steers.claim(_prev(frame), lane)
        if orphaned:
            why = "The lane went on without continuing the response: the steer input was not applied."
            await self._fail_steers(orphaned, SteerCode.SUCCESSOR_FAILED, why)
        if steers:
            merged = steered_input(steers, frame.get("input"))
            if len(merged) > self.settings.max_input_items:  # the create alone fits: it runs alone
                why = f"The create and the steer input together exceed {self.settings.max_input_items} input items."
                await self._fail_steers(steers, SteerCode.SUCCESSOR_FAILED, why)
                steers = []
            else:
                frame = dict(frame, input=merged)
                nbytes += sum(s.nbytes for s in steers)
        turn = await self._stream_turn(lane, frame, nbytes, steers)
        first_failed = turn is None or turn.response["status"] == ResponseStatus.FAILED
        while turn is not None:
            settled = self.steers.close(turn.id, lane, turn.response)
            if settled.plan is Plan.PENDING:
                for s in settled.steers:
                    self.gw.metrics.ws_steers.labels("pending").inc()
                    pend = steer_wire.pending(self._next_steer_seq(), s.id, turn.id, settled.required)
                    await self._send(pend, lane or None)
                break
            if settled.plan is Plan.FAIL:
                await self._fail_steers(settled.steers, SteerCode.SUCCESSOR_FAILED, settled.message)
                break
            if settled.plan is Plan.DROP:
                break
            # the successor: same lane, the original create's settings, the steers as its input
            steered, steers = turn, settled.steers
            if not await self._admit_successor(steers):
                break
            successor = successor_frame(create.body, steered.id, steers)
            nbytes = create.nbytes + sum(s.nbytes for s in steers)
            turn = await self._stream_turn(lane, successor, nbytes, steers, automatic=True)
            if turn is not None and turn.response["status"] == ResponseStatus.FAILED:
                self.cache.discard_failed_parent(steered.id, lane)
        return first_failed

    async def _admit_successor(self, steers: list[Steer]) -> bool:
        """A successor is a request like any other: none starts on a connection that is closing
        (a shutdown, the age limit: its creates are dropped too) and the key's rate limit applies;
        a key revoked meanwhile ends the connection, as it does for a create; refused, the steers
        fail and are handed back."""
        if self.expired or not self.gw.accepting or self._age() >= self.settings.ws_max_age_s:
            await self._fail_steers(
                steers, SteerCode.SUCCESSOR_FAILED, "The connection is closing: no successor response was created."
            )
            return False
        if not await self.gw.auth.still_valid(self.principal):  # as every create is checked
            await self._fail_steers(steers, SteerCode.SUCCESSOR_FAILED, "The API key is no longer valid.")
            await self._feed(Event(Ev.REVOKED))
            return False
        try:
            await self.gw.access.admit(self.principal, "ws")
        except ApiError as err:
            self.gw.metrics.errors.labels("ws", err.code or str(err.status)).inc()
            await self._fail_steers(
                steers, SteerCode.SUCCESSOR_FAILED, f"The successor response was refused: {err.message}"
            )
            return False
        return True

    async def _stream_turn(
        self, lane: str, frame: dict[str, Any], nbytes: int, steers: list[Steer], *, automatic: bool = False
    ) -> PreparedTurn | None:
        """Prepare and stream one response; None when it was refused at prepare: ``steers`` it was
        to commit fail, and the client's create gets its error frame — an ``automatic`` successor
        none (a steer is answered by steer events only: an error frame reads as the failure of
        whatever the client sent last)."""
        stream_id = lane or None
        prev = frame.get("previous_response_id")
        if self.gw.resumable is not None and isinstance(prev, str) and self.cache.lane_of(prev) is None:
            await self._resume(lane, prev)
        signal = SteerSignal()  # the turn reads it only when steering is on (none is set otherwise)
        ctx = TurnContext(
            transport="ws",
            tenant=self.tenant,
            conn_cache=self.cache,
            lane=lane,
            body_bytes=nbytes,
            steer=signal if self.settings.ws_steering else None,
            dialect=self.dialect,
        )
        tracing = self.gw.metrics.tracing
        if tracing is not None:  # this turn's parent: its create's client_metadata, else the upgrade's
            meta = frame.get("client_metadata")
            tracing.accept(meta if isinstance(meta, dict) and "traceparent" in meta else self._trace_parent)
        try:
            turn = await self.gw.pipeline.prepare(frame, ctx)
            _, on_usage = await self.gw.access.reserve(self.principal, turn.prompt_len, "ws")
        except ApiError as err:
            self.gw.metrics.errors.labels("ws", err.code or str(err.status)).inc()
            if not automatic:
                await self._send_error(err, stream_id, frame.get("model"))
            if steers:
                await self._fail_steers(steers, SteerCode.SUCCESSOR_FAILED, f"The response was refused: {err.message}")
            return None
        events = self.gw.pipeline.batches(turn, on_usage)
        if turn.input.generate:  # a warm-up is over as soon as it starts
            self.steers.open(turn.id, lane, signal, _unsteerable(turn, self.settings.ws_steering))
        if steers:
            self.gw.metrics.ws_steers.labels("committed").inc(len(steers))
        dumps, timing, tools_json = orjson.dumps, self.server_timing, turn.tools_json
        plain = stream_id is None and not timing and tools_json is None
        try_send = self._frames.try_send_many if self._frames is not None else None
        try:
            async for batch in events:  # the hot loop: a group of events, framed and written at once
                if plain:
                    payloads = [dumps(ev) for ev in batch]
                else:
                    payloads = []
                    for ev in batch:
                        if timing and ev["type"] in TERMINAL_EVENTS:
                            ev = dict(ev, server_timing=turn.clock.server_timing())
                        if tools_json is not None:
                            ev = wire_event(ev, tools_json)
                        payloads.append(dumps(ev if stream_id is None else dict(ev, stream_id=stream_id)))
                # at once when no frame waits ahead of them and the protocol takes them (``_write_now``,
                # inlined); else one by one in turn — ``_write`` raises once the socket closed
                if self.closed or self._queued_sends or try_send is None or not try_send(payloads):
                    for payload in payloads:
                        await self._write(payload)
        except BaseException:
            self.steers.close(turn.id, lane, {"status": ResponseStatus.CANCELLED})  # the socket is gone
            raise
        finally:
            # Closing the generator aborts the engine request when we stopped early (socket gone).
            await events.aclose()  # type: ignore[attr-defined]
        return turn

    # -- lifetime ---------------------------------------------------------------------------------

    def _age(self) -> float:
        return time.monotonic() - self.opened

    async def _idle_watchdog(self) -> None:
        """Feed ``idle_limit`` after ``ws_idle_timeout_s`` without frames or turns."""
        timeout = self.settings.ws_idle_timeout_s
        if not timeout:
            return
        while not self._done.is_set():
            wait = self._last_active + timeout - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            await self._feed(Event(Ev.IDLE_LIMIT))
            if self.machine.queued == 0:
                return  # the machine is closing the connection
            self._last_active = time.monotonic()  # a long generation is activity, not idleness

    async def _age_watchdog(self) -> None:
        await asyncio.sleep(max(0.0, self.settings.ws_max_age_s - self._age()))
        if self.settings.ws_close_idle_at_limit:
            await self._feed(Event(Ev.AGE_LIMIT))

    async def drain(self) -> None:
        """Server shutdown: refuse new turns, finish in-flight responses, then error + close 1001."""
        await self._feed(Event(Ev.SHUTDOWN))
        await self._done.wait()

    async def cut(self) -> int:
        """Shutdown deadline passed: abort the turns still running (each records its usage as a
        cancelled response), then error + close 1001. Returns how many turns were cut."""
        running = self.machine.running
        await self._feed(Event(Ev.DEADLINE))
        return running

    async def _gone(self, stalled: bool = False) -> None:
        """Client gone (or the socket closed; ``stalled``: by the send deadline): abort every
        generation, drop queued turns, forget the cache."""
        self.closed = True
        t0 = time.perf_counter()
        aborting = bool(self._turns)
        await self._feed(Event(Ev.SEND_STALLED if stalled else Ev.CLIENT_GONE))
        await self._abort()  # whatever still runs once the machine is closed (nothing, normally)
        if aborting:
            self.gw.metrics.cancel_latency.observe(time.perf_counter() - t0)
        await self._park()
        self._done.set()
        self.cache.clear()

    # -- resuming across reconnects (gateway/sessions/resumable.py) --------------------------------

    async def _park(self) -> None:
        """The connection closes (nothing runs any more): its lanes' latest ``store=false``
        states stay claimable for ``ws_resume_window_s`` — not when its key was revoked."""
        if self._parked:
            return
        self._parked = True
        resumable = self.gw.resumable
        if resumable is not None and self.machine.farewell is not Farewell.REVOKED and len(self.cache):
            await resumable.park(self.tenant, self.cache.states())

    async def _resume(self, lane: str, previous_response_id: str) -> None:
        """A turn names a parent this connection does not hold: a closed connection of the same
        tenant may have left it resumable. Claimed, it becomes this lane's state and the turn
        resolves it like any connection-cache parent; not claimed, the resolver answers as ever."""
        resumable = self.gw.resumable  # set: only called when it is (``_run_turn``)
        state = None if resumable is None else await resumable.claim(previous_response_id, self.tenant)
        if state is not None:
            self.cache.put(lane, state)

    # -- writing ----------------------------------------------------------------------------------

    async def _send(self, frame: dict[str, Any], stream_id: str | None = None) -> None:
        """One frame, awaited until the protocol took it: while the socket's write buffer is above
        the high-water mark this waits (the caller — a turn's event loop, the frame reader — with
        it), so a slow reader never makes frames pile up here (see "Backpressure" above)."""
        if stream_id is not None:
            frame = dict(frame, stream_id=stream_id)
        await self._write(orjson.dumps(frame))

    async def _write(self, payload: bytes) -> None:
        """``payload`` (JSON) as one text frame: at once when :meth:`_write_now` can, else it
        waits its turn under the send lock (uvicorn's ``send``: backpressure, closing states)."""
        if self._write_now(payload):
            return
        self._queued_sends += 1
        try:
            async with self._send_lock:
                if self.closed or self.ws.application_state != WebSocketState.CONNECTED:
                    raise ConnectionGone()
                try:
                    if self._frames is not None:
                        await self._frames.send(payload)
                    else:
                        await self.ws.send_text(payload.decode())
                except SendStalled as exc:
                    raise ConnectionGone(Ev.SEND_STALLED) from exc
                except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                    raise ConnectionGone() from exc
        finally:
            self._queued_sends -= 1

    def _write_now(self, payload: bytes) -> bool:
        """Write ``payload`` without awaiting anything — no other frame waits to be sent (none
        queued for or holding the send lock, so none is overtaken) and the protocol's writer takes
        it now (``TextFrames.try_send``) — or return False. Raises ``ConnectionGone`` once the
        connection is closed."""
        if self.closed or self.ws.application_state != WebSocketState.CONNECTED:
            raise ConnectionGone()
        frames = self._frames
        return frames is not None and not self._queued_sends and frames.try_send(payload)

    async def _send_error(self, err: ApiError, stream_id: str | None = None, model: Any = None) -> None:
        """An ``error`` frame in the dialect served: the connection's ask, else the operator's for
        ``model`` (a refused create's), else the operator's default."""
        dialect = served_dialect(self.settings, self.dialect, model if isinstance(model, str) else None)
        try:
            await self._send(ws_error_frame(err, stream_id, dialect))
        except ConnectionGone:
            pass


class Create(msgspec.Struct, frozen=True):
    """A ``response.create`` frame as the lanes carry it: the parsed body and the length of the text
    it was parsed from (which sizes its prepare work without a walk: ``TurnContext.body_bytes``)."""

    body: dict[str, Any]
    nbytes: int


def _unsteerable(turn: PreparedTurn, enabled: bool) -> Refused | None:
    """Why ``turn`` cannot be steered (None: it can): the operator turned steering off
    (``ws_steering``); OpenAI's exclusions — a response bound to a conversation, or with automatic
    compaction; an engine that cannot stop at a token and go on from there."""
    if not enabled:
        return Refused(SteerCode.NOT_SUPPORTED, "Steering is disabled on this server.")
    if turn.req.conversation is not None:
        return Refused(SteerCode.NOT_SUPPORTED, "Steering is not supported for responses bound to a conversation.")
    if turn.req.context_management:
        return Refused(SteerCode.NOT_SUPPORTED, "Steering is not supported for responses with automatic compaction.")
    if not can_steer(turn.route.engine):
        return Refused(SteerCode.NOT_SUPPORTED, "Steering is not supported by this model backend.")
    return None


def _prev(frame: dict[str, Any]) -> str | None:
    prev = frame.get("previous_response_id")
    return prev if isinstance(prev, str) else None


class ConnectionGone(Exception):
    """The client is gone; whatever was being produced for it must stop (and abort its generation).

    ``event`` says how the machine hears of it: ``client_gone``, or ``send_stalled`` when the send
    deadline closed the socket on a client that stopped reading."""

    def __init__(self, event: Ev = Ev.CLIENT_GONE) -> None:
        super().__init__(event.value)
        self.event = event
