"""The turn pipeline: the stages composed, one implementation for both transports.

    prepare():       resolve -> classify NEW items -> render NEW items -> sampling  (a PreparedTurn)
    run():           engine -> parse -> events -> finalize                         (gateway.turn.run)
    input_tokens():  resolve -> render, counted only
    compact():       resolve -> classify -> render -> summarize                    (gateway.turn.compact_request)

A continuation turn costs O(new input): only the new items are validated, classified and
tokenized; the engine gets ``parent.history_ids + new_ids`` (an append-only view, no copy) so its
prefix cache reuses the history's KV (``gateway.turn.render`` says when an append is not exact).

The pipeline knows nothing of SSE or WebSocket framing: it raises ``ApiError`` before a response
exists and yields event dicts after. Transports decide how to frame them. The events leave in the
turn's dialect (``gateway.wire.dialects``: OpenAI's, or the OpenResponses spec's, which the client or
the operator chose): built in OpenAI's, translated here, at the one place every turn's events pass.

A request bigger than ``inline_prepare_bytes`` is prepared in the prepare pool
(``gateway.turn.offload``): its validation, item building, classification texts and render run in a
worker thread, its store and connection-cache lookups on the event loop, so one large request does
not stall every other connection. Smaller requests (every agent continuation) pay no thread hop.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from billing.usage import UsageQueue
from cache.conversations import ConversationStore, MemoryConversationStore
from cache.lru import BoundedLRU, tenant_of
from cache.prefix_cache import PrefixCache
from cache.response_store import ResponseStore
from gateway.base import log_context
from gateway.base.metrics import Metrics, StageTimer
from gateway.base.settings import Settings
from gateway.containers.model import Containers
from gateway.files.build import build_file_stores
from gateway.tools.hosted import HostedTools
from gateway.tools.web import WebSearch
from gateway.turn import render as render_stage
from gateway.turn.checks import check_params, code_interpreter_off
from gateway.turn.classify import ClassifyStage
from gateway.turn.compact_request import WindowCompaction
from gateway.turn.compaction import Compactor
from gateway.turn.conversation import Conversations
from gateway.turn.events import Event
from gateway.turn.finalize import Finalizer
from gateway.turn.offload import PrepareOffload
from gateway.turn.prefix import PrefixReuse
from gateway.turn.resolve import Resolver
from gateway.turn.run import TurnRunner
from gateway.turn.sampling import ConstraintCache, echoed_sampling, sampling_for
from gateway.turn.sealing import Sealer
from gateway.turn.types import PreparedTurn, Rendered, TurnContext, TurnInput, UsageHook
from gateway.wire.dialects import EventDialect, served_dialect, translate
from gateway.wire.errors import bad_request
from gateway.wire.items import new_id
from gateway.wire.response import EchoedTools, response_skeleton
from gateway.wire.validation import KnownTools
from inference.embeddings import Embedder
from inference.engine import SamplingParams
from inference.registry import ModelRegistry
from inference.renderer import Constraint
from inference.tool_grammar import grammar_library_ready, needs_grammar_library
from security.classifiers import Classifier
from security.flags import FlagReporter

#: what ``/responses/input_tokens`` accepts (a create's prompt-shaping fields)
INPUT_TOKENS_PARAMS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "conversation",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "truncation",
        "personality",
    }
)


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
        conversations: ConversationStore | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        """``embedder``: the vectors of files and searches, instead of the model the settings name."""
        self.settings = settings
        self.registry = registry
        self.metrics = metrics
        self.flags = flags
        sealer = Sealer(settings.seal_secret.encode() if settings.seal_secret else None)
        #: full-history requests: rendered prefixes per tenant (``gateway.turn.prefix``); None when off
        self.prefix = (
            PrefixReuse(PrefixCache(settings.prefix_cache_bytes, settings.prefix_cache_tenant_bytes), metrics)
            if settings.prefix_cache_bytes
            else None
        )
        self.compactor = Compactor(sealer, metrics, max_summary_tokens=settings.compact_summary_tokens)
        self.conversations = Conversations(
            MemoryConversationStore() if conversations is None else conversations,
            store,
            metrics,
            sealer,
            self.compactor,
            tips_bytes=settings.conversation_tips_bytes,
        )
        self.finalizer = Finalizer(
            store,
            usage,
            metrics,
            self.conversations,
            on_state=self.prefix.record if self.prefix is not None else None,
            chain_digest=self.prefix.extend if self.prefix is not None else None,
        )
        self.offload = PrepareOffload(settings.inline_prepare_bytes, settings.prepare_threads)
        #: structured-output constraints by tenant, model and tools (``gateway.turn.sampling``)
        self.constraints = ConstraintCache()
        #: the echoed tool lists and their JSON, by tenant and prelude (``gateway.wire.response.EchoedTools``)
        self.tool_echoes: BoundedLRU[tuple[str | None, bytes], EchoedTools] = BoundedLRU(
            64, 16 * 1024 * 1024, part=tenant_of
        )
        #: the MCP servers the gateway calls for the model (``gateway.tools.hosted``)
        self.hosted = HostedTools(settings, metrics)
        #: the ``web_search`` backends and page reader (``gateway.tools.web``); pages are read in the pool
        self.web = WebSearch(settings, metrics, cpu=self.offload.pool)
        #: uploaded files and the vector stores ``file_search`` searches (``gateway.files``)
        self.files, self.vector_stores = build_file_stores(settings, metrics, embedder)
        self.resolver = Resolver(
            registry,
            store,
            metrics,
            sealer,
            self.compactor,
            self.finalizer.wait_for,
            hosted_tools=settings.hosted_tools,
            offload=self.offload,
            conversations=self.conversations,
            prefix=self.prefix,
            item_checks_bytes=settings.item_checks_bytes,
            hosted=self.hosted,
            web=self.web,
            files=self.vector_stores,
            code_interpreter=functools.partial(code_interpreter_off, settings),
        )
        self.classify = ClassifyStage(classifier, metrics, flags)
        self.runner = TurnRunner(
            settings,
            store,
            sealer,
            self.compactor,
            self.finalizer,
            metrics,
            self.hosted,
            self.classify,
            self.web,
            self.vector_stores,
        )
        self.window = WindowCompaction(self.resolver, self.classify, self.compactor, usage, metrics)

    def use_containers(self, containers: Containers | None) -> None:
        """The containers ``code_interpreter`` runs code in (``gateway.containers``: the registry the
        Containers API shares); until set, a request naming the tool where it is on is a 503."""
        self.resolver.containers = self.runner.containers = containers

    async def prepare(self, body: Any, ctx: TurnContext) -> PreparedTurn:
        """Everything before the response exists; raises ``ApiError``."""
        lap = self.metrics.stage_timer(ctx.transport)
        try:
            return await self._prepare(body, ctx, lap)
        except BaseException as exc:  # the clock hears of a refused create (a traced one ends its span)
            model = body.get("model") if isinstance(body, dict) else None
            served = model if isinstance(model, str) and self.registry.get(model) is not None else ""  # bounded
            code = getattr(exc, "code", None)  # an ApiError's code: one of a fixed set
            lap.end(
                "rejected",
                response_id="",
                model=served,
                tenant=ctx.tenant,
                error_code=code if isinstance(code, str) else type(exc).__name__,
            )
            raise

    async def _prepare(self, body: Any, ctx: TurnContext, lap: StageTimer) -> PreparedTurn:
        t0 = lap.started
        log_context.response_id.set(None)
        cpu = self.offload.for_body(body, ctx.body_bytes)
        turn = await self.resolver.resolve(body, ctx, lap=lap.lap, cpu=cpu)
        self.metrics.items_validated.inc(len(turn.new_items))
        verdicts = await self.classify.classify(turn, ctx, cpu)
        lap.lap("classify")
        shape_cpu = cpu
        if cpu.inline and not grammar_library_ready() and needs_grammar_library(turn.prelude.tools):
            shape_cpu = self.offload.pooled()  # the first grammar imports xgrammar (seconds): not on the loop
        rendered, sampling, response, echo = (
            _shape(turn, ctx.tenant, self.constraints, self.tool_echoes)
            if shape_cpu.inline
            else await shape_cpu(_shape, turn, ctx.tenant, self.constraints, self.tool_echoes)
        )
        render_stage.observe(self.metrics, rendered)
        if sampling is not None and isinstance(sampling.structured, Constraint):  # grammars left to prose
            for syntax in sampling.structured.fallbacks:
                self.metrics.grammar_fallbacks.labels(syntax).inc()
        log_context.response_id.set(response["id"])
        lap.lap("render")
        lap.observe()  # accepted turns only: a rejected create is counted in respgate_request_errors
        prepared = PreparedTurn(
            input=turn,
            ctx=ctx,
            rendered=rendered,
            sampling=sampling,
            response=response,
            verdicts=verdicts,
            flagged=turn.flagged_before or any(v.action == "flag" for v in verdicts),
            include_encrypted="reasoning.encrypted_content" in (turn.req.include or []),
            started=t0,
            created_at=time.time() - (time.perf_counter() - t0),
            clock=lap,
            tools_json=echo.json if echo is not None else None,
        )
        self.classify.report(verdicts, turn, ctx, response_id=prepared.id)
        self.metrics.turn_overhead.observe(time.perf_counter() - t0)
        return prepared

    def known_tools(self, tenant: str | None) -> KnownTools:
        """For a body's bounds checks (``gateway.wire.validation``): tools this tenant offered and
        passed before are not walked again (``gateway.turn.checks.ToolChecks.known_for``)."""
        return self.resolver.tool_checks.known_for(tenant)

    def run(self, turn: PreparedTurn, on_usage: UsageHook | None = None) -> AsyncIterator[Event]:
        """The turn's events, ending with exactly one terminal event (``gateway.turn.run``), in its
        dialect (:meth:`dialect_of`)."""
        events = self.runner.run(turn, on_usage)
        return events if self.dialect_of(turn) is EventDialect.OPENAI else _translated(events)

    def batches(self, turn: PreparedTurn, on_usage: UsageHook | None = None) -> AsyncIterator[list[Event]]:
        """The same events in the groups they are produced in (``TurnRunner.batches``)."""
        batches = self.runner.batches(turn, on_usage)
        return batches if self.dialect_of(turn) is EventDialect.OPENAI else _translated_batches(batches)

    def dialect_of(self, turn: PreparedTurn) -> EventDialect:
        """The dialect the turn's events leave in: its client's ask (``TurnContext.dialect``), else
        the operator's setting for its model."""
        return served_dialect(self.settings, turn.ctx.dialect, turn.route.name)

    async def input_tokens(self, body: Any, ctx: TurnContext) -> int:
        """``POST /v1/responses/input_tokens``: the prompt length the same create would have.

        Count only: no classifiers, no metrics, and the parent's shared buffers are not touched.
        """
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.", code="invalid_type")
        check_params(body, INPUT_TOKENS_PARAMS)
        body = {k: v for k, v in body.items() if k != "personality"}
        body.setdefault("model", self.registry.names()[0])
        cpu = self.offload.for_body(body)
        turn = await self.resolver.resolve(body, ctx, generate=True, cpu=cpu)
        return (await cpu(render_stage.render, turn)).prompt_len

    async def compact(self, body: Any, ctx: TurnContext, on_usage: UsageHook | None = None) -> dict[str, Any]:
        """``POST /v1/responses/compact``: the compacted window (``gateway.turn.compact_request``)."""
        return await self.window.compact(body, ctx, on_usage)

    async def flush(self) -> None:
        await self.finalizer.flush()

    async def close(self) -> None:
        """Shutdown: stop background prefills, wait for pending store writes."""
        await self.runner.close()
        await self.finalizer.flush()
        await self.web.aclose()
        await self.vector_stores.aclose()
        await self.files.aclose()
        self.offload.close()


async def _translated(events: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
    """``events`` in OpenResponses' dialect; closing this closes them (a consumer that stops early
    aborts the turn, as it would without the translation)."""
    async with contextlib.aclosing(events):
        async for ev in events:
            yield translate(ev)


async def _translated_batches(batches: AsyncGenerator[list[Event], None]) -> AsyncGenerator[list[Event], None]:
    """:func:`_translated`, a group of events at a time."""
    async with contextlib.aclosing(batches):
        async for batch in batches:
            yield [translate(ev) for ev in batch]


def _shape(
    turn: TurnInput,
    tenant: str | None,
    constraints: ConstraintCache,
    echoes: BoundedLRU[tuple[str | None, bytes], EchoedTools],
) -> tuple[Rendered, SamplingParams | None, dict[str, Any], EchoedTools | None]:
    """The prompt, the sampling parameters, the Response skeleton and its echoed tools: CPU only
    (may run in the pool). A turn whose tools an earlier one offered (a coding agent re-sends the
    same tools every turn) takes that turn's echoed tools: found by the prelude's digest (of the
    tools' JSON: ``Renderer.prelude_key``), used only when the tools also compare equal."""
    rendered = render_stage.render(turn)
    sampling = sampling_for(turn, rendered, tenant, constraints)
    echo = None
    if turn.tools:
        key = (tenant, rendered.prelude_key)
        echo = echoes.get(key)
        if echo is None or not echo.echoes(turn.tools):
            echo = EchoedTools(turn.tools)
            echoes.put(key, echo, echo.nbytes)
    response = response_skeleton(
        turn.req, response_id=new_id("resp"), model=turn.route.name, tools=echo, store=turn.store
    )
    response.update(echoed_sampling(turn.req, turn.route))  # the model's defaults, where the request set none
    return rendered, sampling, response, echo
