"""OpenTelemetry traces of turns: a span per turn, a child per stage, exported over OTLP/HTTP.

**Off by default, and then free.** Without ``otel_traces`` no tracer provider exists,
``Metrics.stage_timer`` hands out the plain ``StageTimer`` and nothing here runs: no span object,
no context lookup, no header parsed (``tests/gateway/ops/test_tracing.py`` counts it).

**Spans from the stage clock, after the fact.** The pipeline already times its stages on one
clock (``gateway.base.metrics.StageTimer``: ``lap(stage)``). With tracing on, the clock is a
:class:`TracedTimer` that also keeps each lap's start and end, and the spans are made when the
turn ends, with explicit start and end times: the hot path pays a list append per lap, and no
stage module knows about spans. Two spans have to exist *while* the turn runs, because others
name them: the turn span, and the ``engine`` span (kind CLIENT) opened at the engine request, whose
W3C ``traceparent`` (:func:`current_traceparent`) is what an engine that traces (vLLM's
``--otlp-traces-endpoint``) should be handed, so its own request span lands under ours.

The tree of one turn::

    responses.create (SERVER; parent: the caller's traceparent, if any)
    ├── validate, resolve, classify, render          (prepare)
    ├── engine_submit, compact                       (gateway time up to the engine request)
    ├── engine (CLIENT)                              (the engine request: submit to last token)
    │   ├── engine_ttft                              (submit to first token)
    │   └── streaming                                (first to last token)
    ├── tool_call                                    (each call the gateway ran: tool type, server
    │                                                 label, tool name, output bytes, error type)
    └── store, finalize, billing                     (after generation; store only when awaited)

A create refused before its response existed ends as a turn span with status ERROR, the stages it
went through, and the error code only.

**Whose trace.** HTTP: the ``traceparent`` (and ``tracestate``) header of ``POST /v1/responses``.
WebSocket: each turn is its own span — a connection lives up to an hour and carries hundreds of
turns, and a span that long is useless in every trace viewer and is exported only when it ends. Its
parent is the turn's own ``client_metadata.traceparent`` when the create carries one (Codex sends
one per turn), else the ``traceparent`` of the upgrade request (then all of a connection's turns
are siblings in the caller's trace), else none: each turn starts a trace of its own. An incoming
parent's sampled flag is followed (``ParentBased``); new traces are sampled at ``otel_sample_ratio``.

**Bounded attributes.** Ids, model, transport, status, token counts, cached tokens, render mode,
tenant (an identifier — ``security/keys.py``: a name, or for a bare static key a digest that ledgers
carry too — never a key), an error code. Never content, instructions, tool definitions or
arguments, error messages (they may quote a request), headers or keys.

**Exporter.** OTLP over HTTP/protobuf (``opentelemetry-exporter-otlp-proto-http``) through a
``BatchSpanProcessor``: spans leave in batches from the SDK's own thread, never on the event loop.
``otel_endpoint`` names the collector's traces URL; unset, the SDK's ``OTEL_EXPORTER_OTLP_*``
variables decide (endpoint, headers, timeout, compression), as do ``OTEL_BSP_*`` for the batch
processor; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` feed the resource.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Mapping
from typing import Any

from gateway.base.metrics import Histogram, StageTimer

#: the stages that are children of the ``engine`` span rather than of the turn span
ENGINE_STAGES = frozenset({"engine_ttft", "streaming"})
#: the name of the turn span (low cardinality: the transport is an attribute)
TURN_SPAN = "responses.create"

#: the clock of the turn running in this task (set when a traced turn's clock starts)
_current: contextvars.ContextVar[TracedTimer | None] = contextvars.ContextVar("respgate_trace_turn", default=None)
#: the caller's trace context for the next turn started in this task (set by the transports)
_incoming: contextvars.ContextVar[Any] = contextvars.ContextVar("respgate_trace_parent", default=None)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current turn's engine span (the turn span before the engine
    request began), for a request to an engine that traces; None when tracing is off, outside a
    turn, or for a turn not sampled."""
    timer = _current.get()
    return None if timer is None else timer.traceparent()


class Tracing:
    """The tracer provider, its sampler and OTLP exporter: one per app (``create_app``)."""

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        service_name: str | None = None,
        sample_ratio: float = 1.0,
        exporter: Any = None,
    ) -> None:
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        name = service_name or os.environ.get("OTEL_SERVICE_NAME") or "respgate"
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        # a provider of our own, not the global one: several gateways (tests) live in one process,
        # and a host application's own tracing is left alone
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": name}), sampler=ParentBased(TraceIdRatioBased(sample_ratio))
        )
        self.processor = BatchSpanProcessor(exporter)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("respgate")
        self._propagator = TraceContextTextMapPropagator()
        self._getter = DefaultGetter()

    @classmethod
    def from_settings(cls, settings: Any) -> Tracing | None:
        """None unless ``otel_traces`` is set."""
        if not settings.otel_traces:
            return None
        return cls(
            endpoint=settings.otel_endpoint,
            service_name=settings.otel_service_name,
            sample_ratio=settings.otel_sample_ratio,
        )

    # -- the caller's context ---------------------------------------------------------------------

    def accept(self, carrier: Mapping[str, str] | None) -> None:
        """Take ``traceparent``/``tracestate`` from ``carrier`` (request headers, or a WebSocket
        create's ``client_metadata``) as the parent of the turn this task starts next. A missing
        or malformed header starts a trace of our own (the W3C rule)."""
        ctx = None
        if carrier:
            parent = carrier.get("traceparent")
            if isinstance(parent, str):
                state = carrier.get("tracestate")
                ctx = self._propagator.extract(
                    {"traceparent": parent, "tracestate": state} if isinstance(state, str) else {"traceparent": parent}
                )
        _incoming.set(ctx)

    def parent_of(self, headers: Mapping[str, str]) -> dict[str, str] | None:
        """The trace headers of a request, kept for later turns (a WebSocket upgrade's)."""
        parent = headers.get("traceparent")
        if parent is None:
            return None
        state = headers.get("tracestate")
        return {"traceparent": parent, **({"tracestate": state} if state is not None else {})}

    # -- turns ------------------------------------------------------------------------------------

    def timer(self, hist: Histogram, transport: str) -> TracedTimer:
        timer = TracedTimer(hist, transport, self, _incoming.get())
        _current.set(timer)
        return timer

    # -- lifetime ---------------------------------------------------------------------------------

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Export what is pending (bounded by the exporter's timeout), then stop."""
        self.provider.shutdown()


class TracedTimer(StageTimer):
    """The stage clock of a traced turn: laps are kept with their times; spans are made at ``end``
    (the live turn and engine spans when the engine request starts)."""

    __slots__ = ("_tracing", "_parent", "_marks", "_offset_ns", "_turn", "_engine", "_ended", "_spans")

    def __init__(self, hist: Histogram, transport: str, tracing: Tracing, parent: Any) -> None:
        super().__init__(hist, transport)
        self._tracing = tracing
        self._parent = parent
        #: (stage, start, end) in perf_counter seconds
        self._marks: list[tuple[str, float, float]] = []
        # perf_counter seconds -> epoch nanoseconds (spans carry wall-clock times)
        self._offset_ns = time.time_ns() - int(self.started * 1e9)
        self._turn: Any = None
        self._engine: Any = None
        self._ended = False
        #: (name, start, end, attributes) of spans that are not stages: the gateway's tool calls
        self._spans: list[tuple[str, float, float, Mapping[str, Any]]] = []

    def span(self, name: str, t0: float, t1: float, attributes: Mapping[str, Any]) -> None:
        self._spans.append((name, t0, t1, dict(attributes)))

    def _ns(self, t: float) -> int:
        return self._offset_ns + int(t * 1e9)

    def lap(self, stage: str) -> None:
        t0 = self._t
        super().lap(stage)
        self._marks.append((stage, t0, self._t))
        if stage == "engine_submit" and self._engine is None:
            self._open_engine(self._t)

    def _turn_span(self) -> Any:
        if self._turn is None:
            from opentelemetry.trace import SpanKind

            self._turn = self._tracing.tracer.start_span(
                TURN_SPAN,
                context=self._parent,
                kind=SpanKind.SERVER,
                start_time=self._ns(self.started),
                attributes={"respgate.transport": self._transport},
            )
        return self._turn

    def _open_engine(self, at: float) -> None:
        """The engine request starts: its span must exist now, for its traceparent."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        turn = self._turn_span()
        if turn.is_recording():
            self._engine = self._tracing.tracer.start_span(
                "engine", context=set_span_in_context(turn), kind=SpanKind.CLIENT, start_time=self._ns(at)
            )

    def traceparent(self) -> str | None:
        span = self._engine if self._engine is not None else self._turn
        if span is None:
            return None
        ctx = span.get_span_context()
        if not ctx.is_valid or not ctx.trace_flags.sampled:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def end(
        self,
        status: str,
        *,
        response_id: str,
        model: str,
        usage: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        previous_response_id: str | None = None,
        error_code: str | None = None,
    ) -> None:
        if self._ended:
            return
        self._ended = True
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        turn = self._turn_span()
        if not turn.is_recording():  # not sampled
            turn.end()
            return
        attrs: dict[str, Any] = {
            "gen_ai.response.id": response_id,
            "gen_ai.request.model": model,
            "respgate.status": status,
        }
        if tenant is not None:
            attrs["respgate.tenant"] = tenant
        if previous_response_id is not None:
            attrs["respgate.previous_response_id"] = previous_response_id
        if error_code is not None:
            attrs["error.type"] = error_code
        if usage is not None:
            attrs["gen_ai.usage.input_tokens"] = int(usage.get("input_tokens", 0))
            attrs["gen_ai.usage.output_tokens"] = int(usage.get("output_tokens", 0))
            attrs["respgate.usage.cached_tokens"] = int(
                (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
            )
            attrs["respgate.usage.reasoning_tokens"] = int(
                (usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0)
            )
        turn.set_attributes(attrs)
        if status in ("failed", "rejected"):
            turn.set_status(Status(StatusCode.ERROR))
        tracer = self._tracing.tracer
        in_turn = set_span_in_context(turn)
        in_engine = set_span_in_context(self._engine) if self._engine is not None else in_turn
        engine_end = None
        for stage, t0, t1 in self._marks:
            under = in_engine if stage in ENGINE_STAGES else in_turn
            if stage in ENGINE_STAGES:
                engine_end = t1
            tracer.start_span(stage, context=under, start_time=self._ns(t0)).end(end_time=self._ns(t1))
        for name, t0, t1, span_attrs in self._spans:
            tracer.start_span(name, context=in_turn, start_time=self._ns(t0), attributes=span_attrs).end(
                end_time=self._ns(t1)
            )
        if self._engine is not None:
            self._engine.end(end_time=self._ns(engine_end if engine_end is not None else time.perf_counter()))
        turn.end(end_time=self._ns(time.perf_counter()))
