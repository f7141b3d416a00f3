"""The turn pipeline, one implementation for both transports.

    prepare():  validate -> resolve the parent -> classify NEW items -> render NEW items
    run():      engine -> parse -> events -> finalize (connection cache, store, usage queue)

A continuation turn costs O(new input): only the new items are validated, classified and
tokenized; the engine gets ``parent.history_ids + new_ids`` (an append-only view, no copy) so its
prefix cache reuses the history's KV. When an append is not provably exact (the prelude changed,
the model changed, the parent's output was cut off) the turn falls back to a full render, counted
in ``respgate_render_full_fallbacks``. With ``truncation: "auto"`` an over-long full render drops
the oldest items until the prompt fits.

The pipeline knows nothing of SSE or WebSocket framing: it raises ``ApiError`` before a response
exists and yields event dicts after. Transports decide how to frame them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any, AsyncIterator

from billing.usage import UsageQueue
from cache.items import CALL_TYPES, OUTPUT_TYPES, ItemLog
from cache.seq import TokenSeq
from cache.state import ResponseState
from cache.store import ResponseStore, StoreUnavailable
from gateway.turn.compaction import Compactor
from gateway.wire.errors import ApiError, bad_request, model_not_found, previous_response_not_found, store_unavailable
from gateway.turn.events import Event, ResponseEvents
from gateway.base import log_context
from gateway.turn.finalize import Finalizer
from gateway.base.metrics import Metrics
from gateway.turn.sealing import SealError, Sealer
from gateway.base.settings import Settings
from gateway.turn.types import CallLookup, PreparedTurn, RenderStats, TurnContext
from gateway.wire.items import Compaction, HostedItem, ItemReference, Message, Reasoning, canonical_item, new_id
from gateway.wire.request import CreateRequest, parse_create
from gateway.wire.response import response_skeleton, usage_object
from gateway.wire.tools import HostedTool, canonical_tool, tool_names
from inference.engine import EngineError, SamplingParams
from inference.registry import ModelRegistry, ModelRoute
from inference.render import Prelude
from security.classify import Classifier, ClassifierUnavailable, Verdict, block_message, texts_of
from security.flags import FlagRecord, FlagReporter

log = logging.getLogger(__name__)

#: output tokens a prompt must leave room for (OpenAI's minimum max_output_tokens)
MIN_OUTPUT_ROOM = 16


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        store: ResponseStore,
        classifier: Classifier,
        usage: UsageQueue,
        metrics: Metrics,
        flags: FlagReporter | None = None,
    ) -> None:
        self.settings = settings
        self.flags = flags
        self.registry = registry
        self.store = store
        self.classifier = classifier
        self.metrics = metrics
        self.sealer = Sealer(settings.seal_secret.encode() if settings.seal_secret else None)
        self.finalizer = Finalizer(store, usage, metrics)
        self.compactor = Compactor(self.sealer, metrics, max_summary_tokens=settings.compact_summary_tokens)
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------------------
    # prepare: everything before the response exists; raises ApiError
    # ------------------------------------------------------------------------------------------

    async def prepare(self, body: Any, ctx: TurnContext) -> PreparedTurn:
        t0 = time.perf_counter()
        lap = self.metrics.stage_timer(ctx.transport)
        log_context.response_id.set(None)
        req, raw_items = parse_create(body, transport=ctx.transport)
        self._check_unsupported(req, ctx)
        route, tools = self._route_and_tools(req)
        generate = req.generate is not False
        store = True if req.store is None else req.store
        lap.lap("validate")

        parent = await self._resolve_parent(req, ctx)
        lap.lap("resolve")
        parent, base_context, new_items, new_calls, compact_trigger = self._new_input(raw_items, parent)
        self.metrics.items_validated.inc(len(new_items))
        pending = self._check_pairing(new_items, base_context, parent, generate)
        lap.lap("validate")  # the new items are validated against the resolved parent

        verdicts = await self._classify(req, route, new_items, base_context, parent, ctx)
        lap.lap("classify")

        prelude = self._prelude(req, tools)
        prelude_key, base_ids, new_ids, gen_ids, stats = self._render_checked(
            req, route, prelude, parent, base_context, new_items, new_calls, generate)
        self.metrics.render_tokens.labels(stats.mode).inc(stats.new_tokens)
        self.metrics.reused_tokens.inc(len(base_ids) if base_ids is not None else 0)
        if stats.fallback_reason:
            self.metrics.render_fallbacks.labels(stats.fallback_reason).inc()

        sampling: SamplingParams | None = None
        if generate:
            room = route.max_context - (len(base_ids) if base_ids is not None else 0) - len(new_ids) - len(gen_ids)
            max_tokens = room if req.max_output_tokens is None else min(room, req.max_output_tokens)
            sampling = SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else float(req.temperature),
                top_p=1.0 if req.top_p is None else float(req.top_p),
                seed=req.seed,
                stop_token_ids=tuple(route.renderer.stop_token_ids),
                structured=route.renderer.constraint(prelude, _text_format(req)),
            )

        response = response_skeleton(req, response_id=new_id("resp"), model=route.name, tools=tools, store=store)
        log_context.response_id.set(response["id"])
        lap.lap("render")
        lap.observe()  # accepted turns only: a rejected create is counted in respgate_request_errors
        turn = PreparedTurn(
            req=req, ctx=ctx, route=route, response=response, prelude=prelude, prelude_key=prelude_key,
            new_items=new_items, parent=parent, base_context=base_context, base_ids=base_ids, new_ids=new_ids,
            gen_ids=gen_ids, sampling=sampling, pending_calls=pending, verdicts=tuple(verdicts),
            flagged=(parent.flagged if parent is not None else False) or any(v.action == "flag" for v in verdicts),
            render=stats, generate=generate, store=store,
            include_encrypted="reasoning.encrypted_content" in (req.include or []), compact_trigger=compact_trigger,
            started=t0, created_at=time.time() - (time.perf_counter() - t0),
        )
        self._report_flags(verdicts, new_items, req, route, parent, ctx, response_id=turn.id)
        self.metrics.turn_overhead.observe(time.perf_counter() - t0)
        return turn

    # -- classify (security/): the NEW items only, each once per conversation -------------------------

    async def _classify(self, req: CreateRequest, route: ModelRoute, new_items: list[dict[str, Any]],
                        context: ItemLog, parent: ResponseState | None, ctx: TurnContext) -> list[Verdict]:
        """Classify the text of the new items (references to items already in the conversation were
        classified when they entered it); count items and bytes; a block raises a 400 that names
        the category and the item, never the matched value."""
        texts = texts_of(new_items, known=context.has_id)
        try:
            verdicts = [v for v in await self.classifier.classify(texts) if v.action != "allow"]
        except ClassifierUnavailable:
            raise ApiError(503, "The content classifier is temporarily unavailable. Please retry your request.",
                           type="server_error", code="classifier_unavailable") from None
        self.metrics.classified_items.inc(len(texts))
        self.metrics.classified_bytes.inc(sum(t.nbytes for t in texts))
        for v in verdicts:
            self.metrics.classifier_verdicts.labels(v.action, (v.category or "")[:64]).inc()
        blocks = [v for v in verdicts if v.action == "block"]
        if blocks:
            self._report_flags(blocks, new_items, req, route, parent, ctx, response_id=None)
            first = blocks[0]
            raise ApiError(400, block_message(first), code="content_policy_violation",
                           param=f"input[{first.index}]" if first.index is not None else "input")
        return verdicts

    def _report_flags(self, verdicts: list[Verdict], new_items: list[dict[str, Any]], req: CreateRequest,
                      route: ModelRoute, parent: ResponseState | None, ctx: TurnContext,
                      response_id: str | None) -> None:
        if self.flags is None or not verdicts:
            return
        self.flags.report([FlagRecord.of(
            v, item_type=new_items[v.index].get("type") if v.index is not None else None, response_id=response_id,
            previous_response_id=req.previous_response_id, tenant=ctx.tenant, model=route.name,
            transport=ctx.transport, flagged_before=parent.flagged if parent is not None else False,
        ) for v in verdicts])

    async def input_tokens(self, body: Any, ctx: TurnContext) -> int:
        """``POST /v1/responses/input_tokens``: the prompt length the same create would have.

        Count only: no classifiers, no metrics, and the parent's shared buffers are not touched.
        """
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.", code="invalid_type")
        allowed = {"model", "input", "instructions", "previous_response_id", "conversation", "tools", "tool_choice",
                   "parallel_tool_calls", "reasoning", "text", "truncation", "personality"}
        for k in body:
            if k not in allowed:
                raise ApiError(400, f"Unknown parameter: '{k}'.", code="unknown_parameter", param=k)
        body = {k: v for k, v in body.items() if k != "personality"}
        body.setdefault("model", self.registry.names()[0])
        req, raw_items = parse_create(body, transport=ctx.transport)
        self._check_unsupported(req, ctx)
        route, tools = self._route_and_tools(req)
        parent = await self._resolve_parent(req, ctx)
        parent, base_context, new_items, new_calls, _ = self._new_input(raw_items, parent)
        self._check_pairing(new_items, base_context, parent, generate=True)
        prelude = self._prelude(req, tools)
        _, base_ids, new_ids, gen_ids, _ = self._render_checked(req, route, prelude, parent, base_context,
                                                                new_items, new_calls, generate=True)
        return (len(base_ids) if base_ids is not None else 0) + len(new_ids) + len(gen_ids)

    def _new_input(self, raw_items: list[Any], parent: ResponseState | None
                   ) -> tuple[ResponseState | None, ItemLog, list[dict[str, Any]], dict[str, dict], bool]:
        """The turn's new items, validated against the parent's context, then windowed: a compaction
        item in the input summarizes everything before it, the parent included (which is dropped).
        Returns (parent, base context, new items, new calls, whether a ``compaction_trigger`` asked)."""
        base_context = parent.context if parent is not None else ItemLog()
        new_items, new_calls = self._new_items(raw_items, base_context)
        new_items, compacted, trigger = self.compactor.window(new_items)
        if compacted and parent is not None:
            parent, base_context = None, ItemLog()
        return parent, base_context, new_items, new_calls, trigger

    def _route_and_tools(self, req: CreateRequest) -> tuple[ModelRoute, list[dict[str, Any]]]:
        route = self.registry.get(req.model)
        if route is None:
            raise model_not_found(req.model)
        tools = self._tools(req)
        self._check_tool_choice(req, tools)
        return route, tools

    @staticmethod
    def _prelude(req: CreateRequest, tools: list[dict[str, Any]]) -> Prelude:
        return Prelude(
            instructions=req.instructions,
            tools=tuple(tools),
            tool_choice="auto" if req.tool_choice is None else req.tool_choice,
            reasoning_effort=req.reasoning.effort if req.reasoning else None,
        )

    @staticmethod
    def _prelude_key(route: ModelRoute, prelude: Prelude) -> bytes:
        r = route.renderer
        return hashlib.blake2b(route.name.encode() + b"\0" + r.family.encode() + b"\0" + r.prelude_key(prelude),
                               digest_size=16).digest()

    def _render_checked(self, req: CreateRequest, route: ModelRoute, prelude: Prelude,
                        parent: ResponseState | None, base_context: ItemLog, new_items: list[dict[str, Any]],
                        new_calls: dict[str, dict], generate: bool
                        ) -> tuple[bytes, TokenSeq | None, list[int], list[int], RenderStats]:
        """The prelude key and ``_render``, with request-shaped renderer errors (e.g. two tools
        whose flattened names collide, or a tool output whose call the renderer cannot name)
        answered as a 400 instead of a crash."""
        try:
            prelude_key = self._prelude_key(route, prelude)
            return (prelude_key,
                    *self._render(req, route, prelude, prelude_key, parent, base_context, new_items, new_calls,
                                  generate))
        except ApiError:
            raise
        except ValueError as exc:
            raise bad_request(f"Invalid request for this model's prompt format: {exc}", code="invalid_value",
                              param="tools" if "tool" in type(exc).__name__.lower() else "input") from None

    def _render(self, req: CreateRequest, route: ModelRoute, prelude: Prelude, prelude_key: bytes,
                parent: ResponseState | None, base_context: ItemLog, new_items: list[dict[str, Any]],
                new_calls: dict[str, dict], generate: bool
                ) -> tuple[TokenSeq | None, list[int], list[int], RenderStats]:
        """Append the new items to the parent's tokens when provably exact, else render in full.

        Never extends a shared buffer: that happens when the turn runs (see ``gateway.turn.types``).
        """
        renderer = route.renderer
        calls = CallLookup(base_context, new_calls)
        gen_ids = renderer.generation_prompt() if generate else []
        budget = route.max_context - (MIN_OUTPUT_ROOM if generate else 0)
        reason = None
        if parent is not None:
            # A renderer that knows appends it cannot do exactly (e.g. a template that merges
            # consecutive tool results) says why; the check looks at the boundary only: O(1).
            broken = renderer.append_break(base_context, new_items)
            if parent.prelude_key == b"" and not parent.history_ids:
                reason = "tokens_missing"  # hydrated from a shared store by a process without its tokens
            elif parent.prelude_key != prelude_key:
                reason = "cut_off" if parent.prelude_key == b"" else "prelude_changed"
            elif broken:
                reason = broken
            else:
                new_ids = renderer.render_items(new_items, calls=calls)
                if len(parent.history_ids) + len(new_ids) + len(gen_ids) <= budget or req.truncation != "auto":
                    self._check_length(len(parent.history_ids) + len(new_ids) + len(gen_ids), route, generate)
                    return parent.history_ids, new_ids, gen_ids, RenderStats("append", len(new_ids))
                reason = "truncation"
        # Full render (first turn, fallback, or truncation): O(history) by nature, counted.
        items = list(base_context) + new_items
        prelude_ids = renderer.render_prelude(prelude)
        ids = prelude_ids + renderer.render_items(items, calls=calls)
        dropped = 0
        if len(ids) + len(gen_ids) > budget and req.truncation == "auto":
            ids, dropped = self._truncate(renderer, prelude_ids, items, calls, budget - len(gen_ids))
        self._check_length(len(ids) + len(gen_ids), route, generate)
        return None, ids, gen_ids, RenderStats("full", len(ids), reason, dropped)

    @staticmethod
    def _truncate(renderer: Any, prelude_ids: list[int], items: list[dict[str, Any]], calls: CallLookup,
                  budget: int) -> tuple[list[int], int]:
        """Drop the oldest items (keeping tool outputs with their calls) until the prompt fits."""
        parts = [renderer.render_items([item], calls=calls) for item in items]
        total = len(prelude_ids) + sum(len(p) for p in parts)
        start = 0
        while total > budget and start < len(items):
            total -= len(parts[start])
            start += 1
            # an output whose call was dropped cannot stand alone
            while start < len(items) and items[start].get("type") in OUTPUT_TYPES:
                total -= len(parts[start])
                start += 1
        # Render the kept items once more as a whole: per-item renders may differ at item
        # boundaries (templates join assistant turns and consecutive tool results).
        return prelude_ids + renderer.render_items(items[start:], calls=calls), start

    @staticmethod
    def _check_length(prompt_len: int, route: ModelRoute, generate: bool) -> None:
        limit = route.max_context - (MIN_OUTPUT_ROOM if generate else 0)
        if prompt_len > limit:
            raise ApiError(
                400,
                f"Your input exceeds the context window of this model ({prompt_len} tokens; the limit is "
                f"{route.max_context} including at least {MIN_OUTPUT_ROOM} output tokens). Shorten the input "
                "or set truncation to 'auto'.",
                code="context_length_exceeded", param="input",
            )

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
            self.metrics.conn_cache.labels("miss" if state is None else "hit").inc()
            if state is not None:
                self.metrics.parent_resolution.labels("connection").inc()
                return state
        await self.finalizer.wait_for(prev)
        t0 = time.perf_counter()
        try:
            state = await self.store.get(prev, ctx.tenant)
        except StoreUnavailable:
            self.metrics.parent_resolution.labels("unavailable").inc()
            raise store_unavailable() from None
        finally:
            self.metrics.store_latency.labels("get").observe(time.perf_counter() - t0)
        if state is not None and state.status in ("completed", "incomplete"):
            self.metrics.parent_resolution.labels("store").inc()
            return state
        self.metrics.parent_resolution.labels("not_found").inc()
        self.metrics.not_found.labels(ctx.transport).inc()
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
                elif isinstance(raw, Compaction):
                    item = self.compactor.input_item(item, i)
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
        reasoning = turn.req.reasoning
        reasoning_mode = "summary" if (reasoning and (reasoning.summary or reasoning.generate_summary)) else (
            "raw" if self.settings.reasoning_text == "raw" else "hidden")
        t_run = time.perf_counter()
        events = ResponseEvents(turn.response, reasoning_mode=reasoning_mode,
                                seal=self.sealer.seal if turn.include_encrypted else None)
        # The turn is accepted: only now extend the shared buffer (at its tip: O(new)).
        copied = 0
        if turn.base_ids is not None:
            if not turn.base_ids.is_tip():
                copied = 8 * len(turn.base_ids)  # a fork or retry: the prefix is copied, account it
            turn_ids = turn.base_ids.extend(turn.new_ids)
        else:
            turn_ids = TokenSeq(turn.new_ids)
        if not turn.generate:
            async for ev in self._warm_up(turn, events, turn_ids, copied):
                yield ev
            return

        assert turn.sampling is not None
        prompt_ids = turn_ids.extend(turn.gen_ids)
        parser = turn.route.renderer.parser(turn.prelude)
        sampled: list[int] = []
        cached = 0
        finish = None
        stop_token = None
        sampling, summary = turn.sampling, None
        compact = self.compactor.wanted(turn)
        agen = None
        finished_cleanly = False
        try:
            created = events.created()
            # gateway time from the accepted turn to the engine request (the engine's own time is TTFT)
            self.metrics.stage.labels("engine_submit", turn.ctx.transport).observe(time.perf_counter() - t_run)
            for ev in created:
                yield ev
            try:
                if compact is not None:  # summarize first, continue on the pruned context
                    done = await self.compactor.compact_turn(turn, turn_ids, compact)
                    prompt_ids, sampling, summary = done.prompt_ids, done.sampling, done.summary
                    for ev in events.whole_item(done.item):
                        yield ev
                agen = turn.route.engine.generate(turn.id, prompt_ids, sampling)
                async for delta in agen:
                    if turn.first_token_at is None and delta.token_ids:
                        turn.first_token_at = time.perf_counter()
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
                summary = getattr(exc, "partial", summary)  # a failed compaction's tokens are billed too
            except ValueError as exc:  # the model's output did not parse (malformed format)
                log.warning("unparseable model output in response %s: %s", turn.id, exc)
                finish = "error"
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine crashed on response %s", turn.id)
                finish = "error"
            for ev in (events.feed(parser.finish()) if finish != "error" else []):
                yield ev
            usage = self.compactor.add_usage(
                usage_object(len(prompt_ids), cached, len(sampled), parser.reasoning_tokens), summary)
            history: TokenSeq | None = None
            if finish == "error":
                terminal = events.fail(usage, "server_error", "The model backend failed while generating.")
            elif finish == "length":
                terminal = events.incomplete(usage, "max_output_tokens")
                history = prompt_ids.extend(sampled)
            else:
                terminal = events.complete(usage)
                history = prompt_ids.extend(turn.route.renderer.history_tokens(sampled))
            self.finalizer.finish(turn, events, history, exact=finish == "stop" and stop_token is not None,
                                  usage=usage, copied_bytes=copied)
            finished_cleanly = True
            if turn.store and turn.ctx.transport == "http" and getattr(self.store, "shared", False):
                # An HTTP client may chain its next request through another replica: make the
                # write land before the client sees the end (one store round trip; WebSocket
                # continuations resolve from the connection cache and do not wait).
                await self.finalizer.wait_for(turn.id)
            for ev in terminal:
                yield ev
        finally:
            if agen is not None:
                await agen.aclose()  # aborts the engine request if it is still running
            if not finished_cleanly and events.status == "in_progress":
                # Nobody listens any more (socket closed, SSE client gone): record what was
                # processed and persist a terminal snapshot.
                self.metrics.aborts.labels(turn.ctx.transport).inc()
                usage = self.compactor.add_usage(
                    usage_object(len(prompt_ids), cached, len(sampled), parser.reasoning_tokens), summary)
                events.cancel(usage)
                self.finalizer.finish(turn, events, None, exact=False, usage=usage)

    async def _warm_up(self, turn: PreparedTurn, events: ResponseEvents, turn_ids: TokenSeq,
                       copied: int) -> AsyncIterator[Event]:
        """``generate: false``: a chain node with the new context and no output; no engine call."""
        usage = usage_object(len(turn_ids), 0, 0, 0)
        self.metrics.warmups.labels(turn.ctx.transport).inc()
        done = False
        try:
            for ev in events.created():
                yield ev
            terminal = events.complete(usage)
            self.finalizer.finish(turn, events, turn_ids, exact=True, usage=usage, copied_bytes=copied)
            done = True
            self._prefill_later(turn, turn_ids)
            for ev in terminal:
                yield ev
        finally:
            if not done and events.status == "in_progress":
                events.cancel(usage)
                self.finalizer.finish(turn, events, None, exact=False, usage=usage)

    def _prefill_later(self, turn: PreparedTurn, ids: TokenSeq) -> None:
        """Warm the engine's prefix cache with the warm-up's context, off the critical path."""
        if not len(ids):
            return

        async def prefill() -> None:
            try:
                await turn.route.engine.prefill(turn.id + "-prefill", ids)
            except Exception:  # a failed warm-up prefill only costs the next turn a longer prefill
                log.warning("prefill after warm-up %s failed", turn.id, exc_info=True)

        task = asyncio.get_running_loop().create_task(prefill(), name=f"prefill-{turn.id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def flush(self) -> None:
        await self.finalizer.flush()

    async def close(self) -> None:
        """Shutdown: stop background prefills, wait for pending store writes."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.finalizer.flush()


def _text_format(req: CreateRequest) -> dict[str, Any] | None:
    if req.text is None or req.text.format is None or req.text.format.type == "text":
        return None
    return req.text.format.model_dump(by_alias=True, exclude_none=True)
