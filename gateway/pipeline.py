"""The turn pipeline, one implementation for both transports.

    prepare():  validate -> resolve the parent -> classify NEW items -> render NEW items
    run():      engine -> parse -> events -> finalize (connection cache, store, usage queue)

A continuation turn costs O(new input): only the new items are validated, classified and
tokenized; the engine gets ``parent.history_ids + new_ids`` (an append-only view, no copy) so its
prefix cache reuses the history's KV. When an append is not provably exact (the prelude changed,
the model changed, the parent's output was cut off) the turn falls back to a full render, counted
in ``respgate_render_full_fallbacks``.

The pipeline knows nothing of SSE or WebSocket framing: it raises ``ApiError`` before a response
exists and yields event dicts after. Transports decide how to frame them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Mapping, Sequence

from billing.usage import UsageQueue, UsageRecord
from cache.connection import ConnectionCache
from cache.items import CALL_TYPES, OUTPUT_TYPES, ItemLog
from cache.seq import TokenSeq
from cache.state import ResponseState
from cache.store import ResponseStore
from gateway.errors import ApiError, bad_request, model_not_found, previous_response_not_found
from gateway.events import Event, ResponseEvents
from gateway.metrics import Metrics
from gateway.sealing import SealError, Sealer
from gateway.settings import Settings
from gateway.wire.items import HostedItem, ItemReference, Message, Reasoning, canonical_item, new_id
from gateway.wire.request import CreateRequest, parse_create
from gateway.wire.response import response_skeleton, usage_object
from gateway.wire.tools import HostedTool, canonical_tool, tool_names
from inference.engine import EngineError, SamplingParams
from inference.registry import ModelRegistry, ModelRoute
from inference.render import Prelude
from security.classify import Classifier, Verdict

log = logging.getLogger(__name__)

Transport = Literal["http", "ws"]


@dataclass(slots=True)
class TurnContext:
    """Who is asking and where the answer goes; transports fill it in."""

    transport: Transport
    tenant: str | None = None
    conn_cache: ConnectionCache | None = None
    lane: str = ""


@dataclass(slots=True)
class RenderStats:
    mode: Literal["append", "full", "none"]
    new_tokens: int
    fallback_reason: str | None = None


@dataclass(slots=True)
class PreparedTurn:
    req: CreateRequest
    ctx: TurnContext
    route: ModelRoute
    response: dict[str, Any]
    prelude: Prelude
    prelude_key: bytes
    new_items: list[dict[str, Any]]
    parent: ResponseState | None
    base_context: ItemLog
    #: rendered history before this turn's generation prompt (parent history + new items)
    turn_ids: TokenSeq
    prompt_ids: TokenSeq | None
    sampling: SamplingParams | None
    pending_calls: frozenset[str]
    verdicts: tuple[Verdict, ...]
    render: RenderStats
    generate: bool
    store: bool
    include_encrypted: bool
    started: float = field(default_factory=time.perf_counter)

    @property
    def id(self) -> str:
        return self.response["id"]


class _CallLookup(Mapping[str, dict]):
    """call_id -> call item, over the chain's context and this turn's new items (no copying)."""

    def __init__(self, context: ItemLog, new_calls: dict[str, dict]) -> None:
        self._context = context
        self._new = new_calls

    def __getitem__(self, call_id: str) -> dict:
        item = self._new.get(call_id) or self._context.call(call_id)
        if item is None:
            raise KeyError(call_id)
        return item

    def __iter__(self):  # pragma: no cover - renderers only look up
        return iter(self._new)

    def __len__(self) -> int:  # pragma: no cover
        return len(self._new)


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        store: ResponseStore,
        classifier: Classifier,
        usage: UsageQueue,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.store = store
        self.classifier = classifier
        self.usage = usage
        self.metrics = metrics
        self.sealer = Sealer(settings.seal_secret.encode() if settings.seal_secret else None)
        #: store writes in flight, by response id: a chained request arriving right after the
        #: terminal event waits for its parent's write instead of missing it
        self._store_tasks: dict[str, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------------------------------
    # prepare: everything before the response exists; raises ApiError
    # ------------------------------------------------------------------------------------------

    async def prepare(self, body: Any, ctx: TurnContext, req_items: tuple[CreateRequest, list[Any]] | None = None
                      ) -> PreparedTurn:
        t0 = time.perf_counter()
        req, raw_items = req_items or parse_create(body, transport=ctx.transport)
        self._check_unsupported(req, ctx)
        route = self.registry.get(req.model)
        if route is None:
            raise model_not_found(req.model)
        renderer = route.renderer
        tools = self._tools(req)
        self._check_tool_choice(req, tools)
        generate = req.generate is not False
        store = True if req.store is None else req.store

        parent = await self._resolve_parent(req, ctx)
        base_context = parent.context if parent is not None else ItemLog()
        new_items, new_calls = self._new_items(raw_items, base_context)
        self.metrics.items_validated.inc(len(new_items))
        pending = self._check_pairing(new_items, base_context, parent, generate)

        verdicts = await self.classifier.classify(new_items)
        self.metrics.items_classified.inc(len(new_items))
        for v in verdicts:
            if v.action == "block":
                raise ApiError(400, "Your request was flagged by the gateway's content policy.",
                               code="content_policy_violation", param="input")

        prelude = Prelude(
            instructions=req.instructions,
            tools=tuple(tools),
            tool_choice="auto" if req.tool_choice is None else req.tool_choice,
            reasoning_effort=req.reasoning.effort if req.reasoning else None,
        )
        prelude_key = hashlib.blake2b(
            route.name.encode() + b"\0" + renderer.family.encode() + b"\0" + renderer.prelude_key(prelude),
            digest_size=16,
        ).digest()
        calls = _CallLookup(base_context, new_calls)
        if parent is not None and parent.prelude_key == prelude_key:
            new_ids = renderer.render_items(new_items, calls=calls)
            turn_ids = parent.history_ids.extend(new_ids)
            stats = RenderStats("append", len(new_ids))
        else:
            reason = None
            if parent is not None:
                reason = "cut_off" if parent.prelude_key == b"" else "prelude_changed"
                self.metrics.render_fallbacks.labels(reason).inc()
            all_items = list(base_context) + new_items
            ids = renderer.render_prelude(prelude) + renderer.render_items(all_items, calls=calls)
            turn_ids = TokenSeq(ids)
            stats = RenderStats("full", len(ids), reason)
        self.metrics.render_tokens.labels(stats.mode).inc(stats.new_tokens)

        prompt_ids: TokenSeq | None = None
        sampling: SamplingParams | None = None
        if generate:
            prompt_ids = turn_ids.extend(renderer.generation_prompt())
            room = route.max_context - len(prompt_ids)
            if room <= 0 or (req.max_output_tokens is not None and req.truncation != "auto" and room < 1):
                raise ApiError(
                    400,
                    f"Your input exceeds the context window of this model ({len(prompt_ids)} tokens, "
                    f"limit {route.max_context}).",
                    code="context_length_exceeded",
                    param="input",
                )
            max_tokens = room if req.max_output_tokens is None else min(room, req.max_output_tokens)
            sampling = SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else float(req.temperature),
                top_p=1.0 if req.top_p is None else float(req.top_p),
                seed=req.seed,
                stop_token_ids=tuple(renderer.stop_token_ids),
                structured=_structured(req),
            )

        response = response_skeleton(req, response_id=new_id("resp"), model=route.name, tools=tools, store=store)
        turn = PreparedTurn(
            req=req, ctx=ctx, route=route, response=response, prelude=prelude, prelude_key=prelude_key,
            new_items=new_items, parent=parent, base_context=base_context, turn_ids=turn_ids,
            prompt_ids=prompt_ids, sampling=sampling, pending_calls=pending,
            verdicts=(parent.verdicts if parent else ()) + tuple(verdicts), render=stats, generate=generate,
            store=store, include_encrypted="reasoning.encrypted_content" in (req.include or []),
        )
        self.metrics.turn_overhead.observe(time.perf_counter() - t0)
        return turn

    def _check_unsupported(self, req: CreateRequest, ctx: TurnContext) -> None:
        if req.background:
            msg = ("background mode is not supported over WebSocket." if ctx.transport == "ws"
                   else "background mode is not supported by this gateway.")
            raise ApiError(400, msg, code="unsupported_parameter", param="background")
        if req.conversation is not None:
            if req.previous_response_id is not None:
                raise bad_request("'previous_response_id' and 'conversation' cannot be used together.",
                                  code="invalid_request", param="conversation")
            raise ApiError(400, "The Conversations API is not supported by this gateway.",
                           code="unsupported_parameter", param="conversation")
        if req.prompt is not None:
            raise ApiError(400, "Stored prompts are not supported by this gateway.", code="unsupported_parameter",
                           param="prompt")
        if ctx.transport == "ws" and req.stream_options is not None:
            pass  # accepted and ignored: WebSocket responses always stream

    def _tools(self, req: CreateRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, tool in enumerate(req.tools or []):
            if isinstance(tool, HostedTool):
                if self.settings.hosted_tools == "reject":
                    raise ApiError(400, f"Tool type '{tool.type}' is not supported by this gateway.",
                                   code="unsupported_value", param=f"tools[{i}].type")
                continue
            d = canonical_tool(tool)
            if d.get("async"):
                raise ApiError(400, "Asynchronous tools are not supported by this gateway.",
                               code="unsupported_value", param=f"tools[{i}].async")
            out.append(d)
        return out

    def _check_tool_choice(self, req: CreateRequest, tools: list[dict[str, Any]]) -> None:
        tc = req.tool_choice
        if not isinstance(tc, dict):
            return
        kind = tc.get("type")
        names = tool_names(tuple(tools))
        if kind in ("function", "custom"):
            name = tc.get("name")
            if not isinstance(name, str) or not any(n == name for (_, n) in names):
                raise bad_request(f"Tool choice '{name}' not found in 'tools' parameter.", code="invalid_value",
                                  param="tool_choice")
        elif kind == "allowed_tools":
            if tc.get("mode") not in ("auto", "required") or not isinstance(tc.get("tools"), list):
                raise bad_request("Invalid 'tool_choice': allowed_tools needs a mode and a tools list.",
                                  code="invalid_value", param="tool_choice")
        elif kind is None:
            raise bad_request("Invalid 'tool_choice': missing 'type'.", code="invalid_value", param="tool_choice")

    async def _resolve_parent(self, req: CreateRequest, ctx: TurnContext) -> ResponseState | None:
        prev = req.previous_response_id
        if prev is None:
            return None
        if ctx.conn_cache is not None:
            state = ctx.conn_cache.get(prev)
            if state is not None:
                self.metrics.parent_resolution.labels("connection").inc()
                return state
        pending_write = self._store_tasks.get(prev)
        if pending_write is not None:
            await asyncio.shield(pending_write)
        state = await self.store.get(prev, ctx.tenant)
        if state is not None and state.status in ("completed", "incomplete"):
            self.metrics.parent_resolution.labels("store").inc()
            return state
        self.metrics.parent_resolution.labels("not_found").inc()
        raise previous_response_not_found(prev)

    def _new_items(self, raw_items: list[Any], context: ItemLog) -> tuple[list[dict[str, Any]], dict[str, dict]]:
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        calls: dict[str, dict] = {}
        for i, raw in enumerate(raw_items):
            if isinstance(raw, str):
                item = canonical_item(Message(role="user", content=raw))
            elif isinstance(raw, ItemReference):
                ref = context.get(raw.id)
                if ref is None:
                    raise bad_request(f"Item with id '{raw.id}' not found.", code="invalid_value",
                                      param=f"input[{i}].id")
                item = ref
            elif isinstance(raw, HostedItem):
                item = raw.model_dump(exclude_none=True)
            else:
                item = canonical_item(raw)
                if isinstance(raw, Reasoning):
                    item = self._unseal(item, i)
            item_id = item.get("id")
            if item_id and not isinstance(raw, ItemReference):
                if item_id in seen or context.has_id(item_id):
                    raise bad_request(
                        f"Duplicate item found with id {item_id}. Remove duplicate items from your input and try again.",
                        code="invalid_value", param="input",
                    )
                seen.add(item_id)
            if item.get("type") in CALL_TYPES:
                calls[item["call_id"]] = item
            items.append(item)
        return items, calls

    def _unseal(self, item: dict[str, Any], i: int) -> dict[str, Any]:
        blob = item.get("encrypted_content")
        if not blob or item.get("content"):
            return item
        try:
            text = self.sealer.open(blob)
        except SealError as exc:
            raise bad_request(f"Invalid 'input[{i}].encrypted_content': {exc}.", code="invalid_encrypted_content",
                              param=f"input[{i}].encrypted_content") from None
        return dict(item, content=[{"type": "reasoning_text", "text": text}])

    def _check_pairing(self, items: list[dict[str, Any]], context: ItemLog, parent: ResponseState | None,
                       generate: bool) -> frozenset[str]:
        pending = set(parent.pending_calls) if parent is not None else set()
        local_calls: set[str] = set()
        for item in items:
            t = item.get("type")
            if t in CALL_TYPES:
                pending.add(item["call_id"])
                local_calls.add(item["call_id"])
            elif t in OUTPUT_TYPES:
                call_id = item["call_id"]
                if call_id not in local_calls and context.call(call_id) is None:
                    raise bad_request(f"No tool call found for function call output with call_id {call_id}.",
                                      param="input")
                pending.discard(call_id)
        if generate and pending:
            call_id = next(iter(sorted(pending)))
            raise bad_request(f"No tool output found for function call {call_id}.", param="input")
        return frozenset(pending)

    # ------------------------------------------------------------------------------------------
    # run: the response exists; yields events, ends with exactly one terminal event
    # ------------------------------------------------------------------------------------------

    async def run(self, turn: PreparedTurn) -> AsyncIterator[Event]:
        reasoning_mode = "summary" if (turn.req.reasoning and (turn.req.reasoning.summary or
                                                                turn.req.reasoning.generate_summary)) else (
            "raw" if self.settings.reasoning_text == "raw" else "hidden")
        events = ResponseEvents(turn.response, reasoning_mode=reasoning_mode,
                                seal=self.sealer.seal if turn.include_encrypted else None)
        for ev in events.created():
            yield ev
        if not turn.generate:
            usage = usage_object(len(turn.turn_ids), 0, 0, 0)
            terminal = events.complete(usage)
            self._finalize(turn, events, turn.turn_ids, exact=True, usage=usage)
            for ev in terminal:
                yield ev
            return

        assert turn.prompt_ids is not None and turn.sampling is not None
        engine = turn.route.engine
        parser = turn.route.renderer.parser(turn.prelude)
        sampled: list[int] = []
        cached = 0
        finish = None
        stop_token = None
        agen = engine.generate(turn.id, turn.prompt_ids, turn.sampling)
        finished_cleanly = False
        try:
            try:
                async for delta in agen:
                    if delta.num_cached_tokens is not None:
                        cached = delta.num_cached_tokens
                    sampled.extend(delta.token_ids)
                    for ev in events.feed(parser.feed(delta.token_ids)):
                        yield ev
                    if delta.finish_reason is not None:
                        finish, stop_token = delta.finish_reason, delta.stop_token_id
                        if finish == "abort":
                            finish = "error"
            except EngineError as exc:
                log.warning("engine failed response %s: %s", turn.id, exc)
                finish = "error"
            except ValueError as exc:  # the model's output did not parse (malformed format)
                log.warning("unparseable model output in response %s: %s", turn.id, exc)
                finish = "error"
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine crashed on response %s", turn.id)
                finish = "error"
            tail = events.feed(parser.finish()) if finish != "error" else []
            for ev in tail:
                yield ev
            usage = usage_object(len(turn.prompt_ids), cached, len(sampled), parser.reasoning_tokens)
            if finish == "error":
                terminal = events.fail(usage, "server_error", "The model backend failed while generating.")
                self._finalize(turn, events, None, exact=False, usage=usage)
            elif finish == "length":
                terminal = events.incomplete(usage, "max_output_tokens")
                history = turn.prompt_ids.extend(sampled)
                self._finalize(turn, events, history, exact=False, usage=usage)
            else:
                terminal = events.complete(usage)
                history = turn.prompt_ids.extend(turn.route.renderer.history_tokens(sampled))
                self._finalize(turn, events, history, exact=stop_token is not None, usage=usage)
            finished_cleanly = True
            for ev in terminal:
                yield ev
        finally:
            await agen.aclose()
            if not finished_cleanly and events.status == "in_progress":
                # Nobody listens any more (socket closed, SSE client gone): the engine was aborted
                # above; record what was processed and persist a terminal snapshot.
                self.metrics.aborts.labels(turn.ctx.transport).inc()
                usage = usage_object(len(turn.prompt_ids), cached, len(sampled), parser.reasoning_tokens)
                events.cancel(usage)
                self._finalize(turn, events, None, exact=False, usage=usage)

    def _finalize(self, turn: PreparedTurn, events: ResponseEvents, history: TokenSeq | None, *, exact: bool,
                  usage: dict[str, Any]) -> None:
        """New state -> connection cache; store=true -> store; usage -> billing queue. Never blocks."""
        status = events.status
        response = turn.response
        output_items = [dict(o) for o in events.output]
        self.metrics.turns.labels(turn.ctx.transport, status).inc()
        self.metrics.prompt_tokens.inc(usage["input_tokens"])
        self.metrics.cached_tokens.inc(usage["input_tokens_details"]["cached_tokens"])
        self.metrics.output_tokens.inc(usage["output_tokens"])
        self.usage.submit(UsageRecord(
            response_id=turn.id, model=turn.route.name, tenant=turn.ctx.tenant, status=status,
            input_tokens=usage["input_tokens"], cached_tokens=usage["input_tokens_details"]["cached_tokens"],
            output_tokens=usage["output_tokens"], reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"],
            transport=turn.ctx.transport,
        ))
        if status not in ("completed", "incomplete", "cancelled"):
            if turn.store:  # failed responses are retrievable but never chained from
                self._persist(self._state(turn, response, output_items, turn.turn_ids, exact=False))
            return
        pending = set(turn.pending_calls)
        for item in output_items:
            if item.get("type") in CALL_TYPES and item.get("status") == "completed":
                pending.add(item["call_id"])
        state = self._state(turn, response, output_items, history if history is not None else turn.turn_ids,
                            exact=exact and history is not None, pending=frozenset(pending))
        if turn.ctx.conn_cache is not None and status != "cancelled":
            turn.ctx.conn_cache.put(turn.ctx.lane, state)
        if turn.store:
            self._persist(state)

    def _state(self, turn: PreparedTurn, response: dict[str, Any], output_items: list[dict[str, Any]],
               history: TokenSeq, *, exact: bool, pending: frozenset[str] = frozenset()) -> ResponseState:
        context = turn.base_context.extend(turn.new_items + output_items)
        delta_bytes = _approx_bytes(turn.new_items) + _approx_bytes(output_items) + 8 * (
            len(history) - (len(turn.parent.history_ids) if turn.parent else 0))
        return ResponseState(
            id=turn.id, response=response, input_items=tuple(turn.new_items), context=context,
            history_ids=history, model=turn.route.name,
            # a cut-off or failed output has no exact rendering to append to: force a full render
            prelude_key=turn.prelude_key if exact else b"",
            store=turn.store, parent_id=turn.req.previous_response_id, pending_calls=pending,
            verdicts=turn.verdicts, tenant=turn.ctx.tenant,
            nbytes=(turn.parent.nbytes if turn.parent else 0) + delta_bytes, delta_bytes=delta_bytes,
        )

    def _persist(self, state: ResponseState) -> None:
        task = asyncio.get_running_loop().create_task(self.store.put(state))
        self._store_tasks[state.id] = task

        def done(t: asyncio.Task[None], response_id: str = state.id) -> None:
            if self._store_tasks.get(response_id) is t:
                del self._store_tasks[response_id]
            if not t.cancelled() and t.exception() is not None:
                log.error("store write failed for %s", response_id, exc_info=t.exception())

        task.add_done_callback(done)

    async def flush(self) -> None:
        """Wait for pending store writes (retrieval endpoints, shutdown)."""
        while self._store_tasks:
            await asyncio.gather(*list(self._store_tasks.values()), return_exceptions=True)

    async def input_tokens(self, body: Any, ctx: TurnContext) -> int:
        """``POST /v1/responses/input_tokens``: the prompt length the same create would have."""
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.", code="invalid_type")
        allowed = {"model", "input", "instructions", "previous_response_id", "conversation", "tools", "tool_choice",
                   "parallel_tool_calls", "reasoning", "text", "truncation", "personality"}
        for k in body:
            if k not in allowed:
                raise ApiError(400, f"Unknown parameter: '{k}'.", code="unknown_parameter", param=k)
        body = {k: v for k, v in body.items() if k != "personality"}
        if "model" not in body:
            body["model"] = self.registry.names()[0]
        turn = await self.prepare(body, ctx)
        assert turn.prompt_ids is not None
        return len(turn.prompt_ids)


def _structured(req: CreateRequest) -> dict | None:
    """Constraints for engines that support structured outputs (the vLLM engine honours them)."""
    out: dict[str, Any] = {}
    if req.text is not None and req.text.format is not None and req.text.format.type != "text":
        out["text_format"] = req.text.format.model_dump(by_alias=True, exclude_none=True)
    if req.tool_choice not in (None, "auto"):
        out["tool_choice"] = req.tool_choice
    return out or None


def _approx_bytes(items: Sequence[dict[str, Any]]) -> int:
    total = 0
    for item in items:
        for v in item.values():
            if isinstance(v, str):
                total += len(v)
            elif isinstance(v, list):
                for p in v:
                    if isinstance(p, dict):
                        total += sum(len(x) for x in p.values() if isinstance(x, str))
        total += 64
    return total
