"""App factory and lifespan wiring: engines, stores, queues, routes, error rendering."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from billing.journal import Journal
from billing.usage import MemorySink, UsageQueue, UsageSink
from cache.conversations import ConversationStore, Limits, MemoryConversationStore
from cache.response_store import MemoryStore, ResponseStore
from gateway.access.auth import KeyAuth, build_key_store
from gateway.access.rate_limits import Access
from gateway.base.log_context import RequestIdMiddleware
from gateway.base.metrics import BackgroundCollector, ComponentCollector, FlagCollector, Metrics, PrefixCacheCollector
from gateway.base.settings import Settings
from gateway.base.tracing import Tracing
from gateway.engines import build_registry
from gateway.transport.gzip_answers import GzipAnswers
from gateway.transport.services import GatewayState
from gateway.turn.pipeline import Pipeline
from gateway.wire.errors import ApiError
from inference.embeddings import Embedder
from inference.registry import ModelRegistry
from inference.simulated import SimulatedEngine
from inference.tool_grammar import preload_grammar_library
from security.classifiers import Action, Classifier, Composite
from security.flags import FlagReporter, MemoryFlagSink, RedisFlagSink
from security.keys import KeyStore
from security.token_buckets import RateLimiter

log = logging.getLogger("respgate")


def create_app(
    settings: Settings | None = None,
    *,
    registry: ModelRegistry | None = None,
    store: ResponseStore | None = None,
    classifier: Classifier | None = None,
    usage_sink: UsageSink | None = None,
    flags: FlagReporter | None = None,
    key_store: KeyStore | None = None,
    conversations: ConversationStore | None = None,
    embedder: Embedder | None = None,
) -> FastAPI:
    # `is None`, not `or`: an empty store or registry is falsy (it has a length)
    settings = Settings.from_env() if settings is None else settings
    registry = build_registry(settings) if registry is None else registry
    if store is None and settings.redis_url:
        from cache.redis_response_store import RedisStore

        store = RedisStore.from_url(settings.redis_url, ttl_s=settings.store_ttl_s)
    store = (
        MemoryStore(settings.store_max_bytes, settings.store_ttl_s, settings.store_max_entries)
        if store is None
        else store
    )
    conversations = build_conversation_store(settings) if conversations is None else conversations
    metrics = Metrics(per_tenant=settings.metrics_per_tenant)
    metrics.tracing = Tracing.from_settings(settings)  # None unless otel_traces
    usage = build_usage_queue(settings, usage_sink)
    classifier = build_classifier(settings) if classifier is None else classifier
    flags = build_flag_reporter(settings) if flags is None else flags
    metrics.registry.register(FlagCollector(flags))
    pipeline = Pipeline(settings, registry, store, classifier, usage, metrics, flags, conversations, embedder)
    if pipeline.prefix is not None:
        metrics.registry.register(PrefixCacheCollector(pipeline.prefix.cache))
    auth, access = build_access(settings, key_store, metrics)
    from gateway.sessions.background import BackgroundTurns
    from gateway.transport.inflight import HttpTurn, closing_events

    http_turns: set[HttpTurn] = set()
    background = BackgroundTurns(
        settings,
        store,
        pipeline.finalizer,
        usage,
        metrics,
        launch=lambda turn, events, deliver, settle: HttpTurn.start(http_turns, turn, events, deliver, settle),
        closing=closing_events,
    )
    containers = None
    if settings.code_interpreter != "off":  # the sandbox is built now, a container on first use
        from gateway.containers.registry import ContainerRegistry

        containers = ContainerRegistry(settings, pipeline.files)
        pipeline.use_containers(containers)
    gw = GatewayState(
        settings=settings,
        registry=registry,
        store=store,
        usage=usage,
        metrics=metrics,
        pipeline=pipeline,
        auth=auth,
        access=access,
        background=background,
        files=pipeline.files,
        vector_stores=pipeline.vector_stores,
        http_turns=http_turns,
        containers=containers,
    )
    metrics.registry.register(ComponentCollector(usage, store, registry.engines(), gw.connections))
    metrics.registry.register(BackgroundCollector(background))
    from gateway.sessions.resumable import ResumableStates

    resumable = gw.resumable = ResumableStates.from_settings(settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await auth.check_startup(settings.host)  # before any engine loads: refuse open mode off loopback
        for engine in registry.engines():
            await engine.start()
        if not all(isinstance(e, SimulatedEngine) for e in registry.engines()):
            # in front of a real model custom-tool grammars are the rule (Codex's apply_patch): import
            # xgrammar (~3 s, torch) in the background now, not under the first such turn
            threading.Thread(target=preload_grammar_library, name="respgate-grammar-preload", daemon=True).start()
        usage.start()
        flags.start()
        background.start_loops()
        sweeper = asyncio.get_running_loop().create_task(gw.files.sweep_loop(), name="respgate-files-sweeper")
        expirer = (
            asyncio.get_running_loop().create_task(containers.sweep_loop(), name="respgate-containers-expiry")
            if containers is not None
            else None
        )
        await gw.vector_stores.start()
        gw.accepting = True
        try:
            yield
        finally:
            gw.accepting = False
            await background.close()  # before the store and the billing queue close: it writes to both
            sweeper.cancel()  # before the file stores close (pipeline.close)
            await asyncio.gather(sweeper, return_exceptions=True)
            if containers is not None:  # after the turns: every container ended, none left running
                if expirer is not None:
                    expirer.cancel()
                    await asyncio.gather(expirer, return_exceptions=True)
                await containers.aclose()
            if resumable is not None:  # after the drain: closing connections parked their lanes
                await resumable.close()
            await pipeline.close()
            await usage.drain()
            await flags.drain()
            if hasattr(classifier, "close"):
                await classifier.close()
            for engine in registry.engines():
                await engine.shutdown()
            await store.close()
            await conversations.close()
            await access.flush()
            await access.limiter.close()
            await auth.close()
            if metrics.tracing is not None:
                # the last spans, off the loop (a collector that is down costs the exporter's timeout)
                await asyncio.to_thread(metrics.tracing.shutdown)

    app = FastAPI(title="respgate", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gw
    app.add_middleware(RequestIdMiddleware)
    if settings.gzip_responses:  # JSON answers (gateway/transport/gzip_answers.py): never SSE or WebSockets
        # level 6 (zlib's default), not Starlette's 9: within ~1% of its size on JSON, at a fraction of the CPU
        app.add_middleware(GzipAnswers, minimum_size=500, compresslevel=6)

    from gateway.transport.containers_routes import router as containers_router
    from gateway.transport.conversations_routes import router as conversations_router
    from gateway.transport.files_routes import router as files_router
    from gateway.transport.http_routes import router as http_router
    from gateway.transport.vector_stores_routes import router as vector_stores_router
    from gateway.transport.ws import router as ws_router

    app.include_router(http_router)
    app.include_router(conversations_router)
    app.include_router(files_router)
    app.include_router(containers_router)
    app.include_router(vector_stores_router)
    app.include_router(ws_router)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        headers = dict(exc.headers)
        return Response(
            orjson.dumps(exc.body()), status_code=exc.status, media_type="application/json", headers=headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        body = {"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None, "code": None}}
        return Response(orjson.dumps(body), status_code=exc.status_code, media_type="application/json")

    @app.get("/metrics", include_in_schema=False)
    async def _metrics(request: Request) -> Response:
        # a key like every other route once keys exist; unauthenticated scraping goes to the
        # separate listener (settings.metrics_port, gateway/ops/server.py) on an internal address
        await auth.authenticate(request.headers)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def build_access(
    settings: Settings, key_store: KeyStore | None = None, metrics: Metrics | None = None
) -> tuple[KeyAuth, Access]:
    """Keys (static + the key store: Redis with ``redis_url``, else the key file) and rate limiters
    (atomic in Redis with ``redis_url``, else in memory)."""
    if key_store is None:
        key_store = build_key_store(settings.redis_url, settings.keys_file)
    auth = KeyAuth(settings.api_keys, key_store, open_mode=settings.open_mode, allowed_origins=settings.allowed_origins)
    limiter: RateLimiter
    if settings.redis_url:
        from security.token_buckets import RedisRateLimiter

        limiter = RedisRateLimiter.from_url(settings.redis_url)
    else:
        from security.token_buckets import MemoryRateLimiter

        limiter = MemoryRateLimiter()
    return auth, Access(settings, limiter, metrics)


def build_conversation_store(settings: Settings) -> ConversationStore:
    """Conversations in Redis with ``redis_url`` (every replica sees them), else in this process."""
    limits = Limits(max_items=settings.conversation_max_items, max_bytes=settings.conversation_max_bytes)
    if settings.redis_url:
        from cache.redis_conversations import RedisConversationStore

        return RedisConversationStore.from_url(settings.redis_url, limits, ttl_s=settings.conversation_ttl_s)
    return MemoryConversationStore(
        limits,
        max_total_bytes=settings.conversation_store_max_bytes,
        ttl_s=settings.conversation_ttl_s,
        max_conversations=settings.conversation_store_max_entries,
    )


def build_usage_queue(settings: Settings, sink: UsageSink | None = None) -> UsageQueue:
    """The billing queue: the given sink, else the Redis ledger with ``redis_url``, else memory;
    plus the local journal whenever a path is configured (outages, overflow, start-up replay)."""
    if sink is None and settings.redis_url:
        from billing.ledger import RedisLedger

        sink = RedisLedger(
            settings.redis_url,
            settings.usage_stream,
            shards=settings.usage_stream_shards,
            marker_ttl_s=settings.usage_marker_ttl_s,
            retention_s=settings.usage_stream_retention_s,
        )
    journal = Journal(settings.usage_journal) if settings.usage_journal else None
    return UsageQueue(MemorySink() if sink is None else sink, journal)


def build_classifier(settings: Settings) -> Composite:
    """The classifiers the settings turn on, run concurrently with per-category overrides.

    A policy file that does not load stops start-up (a typo must not silently allow everything)."""
    from security.external import ExternalClassifier
    from security.injection import InjectionHeuristics
    from security.policy import PolicyClassifier
    from security.secrets import SecretDetector

    unknown = set(settings.classifiers) - {"secrets", "injection"}
    if unknown:
        raise ValueError(f"unknown classifiers {sorted(unknown)}; known: secrets, injection")
    parts: list[Classifier] = []
    if "secrets" in settings.classifiers:
        parts.append(SecretDetector())
    if "injection" in settings.classifiers:
        parts.append(InjectionHeuristics(threshold=settings.injection_threshold))
    if settings.classifier_policy_file:
        parts.append(PolicyClassifier.from_file(settings.classifier_policy_file))
    if settings.classifier_url:
        parts.append(
            ExternalClassifier(
                settings.classifier_url,
                timeout_s=settings.classifier_timeout_s,
                fail_mode=settings.classifier_fail_mode,
                wire=settings.classifier_wire,
                api_key=settings.classifier_api_key,
                model=settings.classifier_model,
            )
        )
    overrides: dict[str, Action] = {k: "allow" for k in settings.classifier_allow}
    overrides.update({k: "block" for k in settings.classifier_block})
    return Composite(parts, overrides)


def build_flag_reporter(settings: Settings) -> FlagReporter:
    """Flags go to the Redis Stream with ``redis_url``, else to a bounded in-memory sink."""
    sink = (
        RedisFlagSink(settings.redis_url, settings.flags_stream, settings.flags_stream_maxlen)
        if settings.redis_url
        else MemoryFlagSink(settings.flags_buffer)
    )
    return FlagReporter(sink, buffer=settings.flags_buffer)


#: bytes a WebSocket frame may exceed max_request_bytes by and still be answered with a 413 frame
WS_FRAME_SLACK = 64 * 1024


def uvicorn_config_kwargs(settings: Settings) -> dict[str, Any]:
    """Server options the wire specs need: big frames, deflate, pings answered by the protocol,
    frames of one loop iteration written together, with write backpressure and a send deadline
    (gateway/transport/corked.py), and request heads bounded in size and time whichever HTTP parser
    runs (gateway/transport/http_protocol.py)."""
    from gateway.transport.corked import CorkedWebSocketProtocol
    from gateway.transport.http_protocol import http_protocol

    return {
        "http": http_protocol(settings),
        # pongs and frames written with backpressure; a client that stops reading is closed (1008)
        "ws": CorkedWebSocketProtocol.configured(send_deadline_s=settings.ws_send_deadline_s),
        # A frame is read (and, with permessage-deflate, inflated: websockets bounds decompression by
        # max_size) up to max_request_bytes plus a little slack: within it, an oversized frame gets a
        # 413 error frame and the socket lives; beyond it the protocol closes 1009 without inflating
        # further, so a compression bomb costs a connection at most this much memory.
        "ws_max_size": settings.max_request_bytes + WS_FRAME_SLACK,
        "ws_per_message_deflate": True,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 60.0,
        # h11's own bound sits one byte above ours, so that ours answers first (431, not h11's 400)
        "h11_max_incomplete_event_size": settings.max_header_bytes + 1,
        # HTTP turns in flight at shutdown get the same grace as WebSocket turns (gateway/ops/server.py)
        "timeout_graceful_shutdown": settings.shutdown_grace_s,
    }
