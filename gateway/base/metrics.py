"""Prometheus metrics: what operators watch, and how much of each stage's work was new.

Each app gets its own registry so several gateways (tests) can live in one process.

**One process per replica.** A gateway process owns its WebSocket connections' state (the
connection cache holds the rendered token ids of every lane) and, with the in-process engine, the
model on the GPU. Several uvicorn workers would each load the model and split one replica's
connections across caches that cannot see each other, so ``respgate serve`` runs exactly one
process and refuses ``--workers N>1``; scale out with replicas (+ Redis), and scale the engine with
vLLM's tensor/data parallelism. That is also why these metrics can live in a plain per-app
registry and read component state at scrape time: there is no multiprocess aggregation to do.

**Bounded labels.** Labels are model, transport, status, stage and small fixed enums. Nothing is
labelled per key or tenant unless ``metrics_per_tenant`` is set (then one tenant-labelled token
counter, for deployments with a handful of tenants).

**Scrape-time collectors** read component state as families built on the spot; a family of one
unlabelled sample is one expression (``GaugeMetricFamily(name, doc, value=...)``), so each number
a component keeps costs one line here.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge
from prometheus_client import Histogram as _Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.values import MutexValue

if TYPE_CHECKING:  # gateway.base.tracing imports this module
    from gateway.base.tracing import Tracing

#: gateway work per stage: tens of microseconds (append) to tens of milliseconds (a 128k full render)
STAGE_BUCKETS = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1,
)
#: pipeline stages timed in ``respgate_stage_seconds`` (the dashboard and tests rely on these names)
STAGES = ("validate", "resolve", "classify", "render", "engine_submit", "finalize")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
TPS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


class _MemoLabels:
    """``labels(...)`` remembered per label values: prometheus_client builds the values' string tuple
    and takes the metric's lock on every call (~1.7 us; a short turn made 16 such calls). The memo
    is filled only with values that are their own string (``str``, ``StrEnum``), so a hit is the
    child prometheus_client would have returned; anything else takes its way each time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._memo: dict[tuple[Any, ...], Any] = {}
        super().__init__(*args, **kwargs)

    def labels(self, *values: Any, **kwargs: Any) -> Any:
        child = self._memo.get(values)
        if child is not None and not kwargs:
            return child
        child = super().labels(*values, **kwargs)  # type: ignore[misc]
        if not kwargs and all(isinstance(v, str) and str(v) == v for v in values):
            self._memo[values] = child
        return child


class Counter(_MemoLabels, _Counter):
    #: the value :meth:`inc` updates in place: set by ``_metric_init`` (an observable metric: a
    #: child, or one without labels) when it is prometheus_client's single-process ``MutexValue``;
    #: None on a labelled parent and for any other value class
    _lean: MutexValue | None = None

    def _metric_init(self) -> None:
        super()._metric_init()
        value = self._value
        self._lean = value if _LEAN_VALUES and type(value) is MutexValue else None

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        """prometheus_client's ``inc`` in fewer Python steps (a turn makes ~30 of them): the value
        to update was found once (``_lean``), and only prometheus_client's single-process value
        (``MutexValue``) is updated in place."""
        value = self._lean
        if value is None or exemplar or not amount >= 0:
            return super().inc(amount, exemplar)  # its errors, its exemplars, another value class
        with value._lock:  # MutexValue.inc, inlined: one Python frame less
            value._value += amount
        return None


class Gauge(_MemoLabels, _Gauge):
    pass


class Histogram(_MemoLabels, _Histogram):
    #: the sum :meth:`observe` updates in place (set by ``_metric_init`` when the sum and every
    #: bucket are ``MutexValue``s; None on a labelled parent and for any other value class)
    _lean_sum: MutexValue | None = None

    def _metric_init(self) -> None:
        super()._metric_init()
        lean = _LEAN_VALUES and type(self._sum) is MutexValue and all(type(b) is MutexValue for b in self._buckets)
        self._lean_sum = self._sum if lean else None

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """prometheus_client's ``observe`` finds the bucket by walking every bound in Python (~76
        steps, a dozen observations a turn); the first bound ``>= amount`` by bisection is the same
        bucket (the bounds are sorted and end in +Inf). NaN, exemplars and a labelled parent take
        its way."""
        total = self._lean_sum
        if total is None or exemplar or amount != amount:
            return super().observe(amount, exemplar)
        bucket = self._buckets[bisect_left(self._upper_bounds, amount)]
        with total._lock:
            total._value += amount
        with bucket._lock:
            bucket._value += 1
        return None


def _lean_values() -> bool:
    """Whether this prometheus_client keeps its values as :meth:`Counter.inc` and
    :meth:`Histogram.observe` read them (a ``MutexValue``'s ``_lock`` and ``_value``; sorted
    ``_upper_bounds``, one value per bucket and the sum); another release takes its own way."""
    h = _Histogram("probe", "probe", registry=None, buckets=(1.0,))
    value = getattr(h, "_sum", None)
    return (
        type(value) is MutexValue
        and hasattr(value, "_lock")
        and isinstance(getattr(value, "_value", None), float)
        and isinstance(getattr(h, "_upper_bounds", None), list)
        and [type(b) for b in getattr(h, "_buckets", ())] == [MutexValue, MutexValue]
    )


_LEAN_VALUES = _lean_values()


class Metrics:
    def __init__(self, *, per_tenant: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        self.turns = Counter(
            "respgate_turns", "Turns by transport and final status", ["transport", "status"], registry=r
        )
        self.render_tokens = Counter(
            "respgate_render_tokens", "Tokens encoded by the renderer per render mode", ["mode"], registry=r
        )
        self.reused_tokens = Counter(
            "respgate_render_reused_tokens",
            "History tokens reused from the parent's rendering (not re-rendered)",
            registry=r,
        )
        self.render_fallbacks = Counter(
            "respgate_render_full_fallbacks",
            "Continuations rendered in full because an append was not provably exact",
            ["reason"],
            registry=r,
        )
        self.grammar_fallbacks = Counter(
            "respgate_grammar_fallbacks",
            "Custom-tool grammars the engine could not enforce (described in prose only)",
            ["syntax"],
            registry=r,
        )
        self.items_validated = Counter("respgate_items_validated", "Input items validated", registry=r)
        self.rate_limited = Counter(
            "respgate_rate_limit_rejections",
            "Requests or connections refused by a limit (requests, tokens, connections, queue, background)",
            ["transport", "limit"],
            registry=r,
        )
        self.input_rejections = Counter(
            "respgate_input_rejections",
            "Bodies and frames refused before any work (size, depth, count)",
            ["transport", "reason"],
            registry=r,
        )
        self.prompt_tokens = Counter("respgate_prompt_tokens", "Prompt tokens handed to engines", ["model"], registry=r)
        self.cached_tokens = Counter(
            "respgate_cached_tokens", "Prompt tokens served from engine prefix caches", ["model"], registry=r
        )
        self.output_tokens = Counter("respgate_output_tokens", "Tokens generated", ["model"], registry=r)
        self.tenant_tokens = (
            Counter("respgate_tenant_tokens", "Tokens per tenant (metrics_per_tenant)", ["tenant", "kind"], registry=r)
            if per_tenant
            else None
        )
        self.ttft = Histogram(
            "respgate_time_to_first_token_seconds",
            "From request arrival to the first output token",
            ["model", "transport"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "respgate_inter_token_latency_seconds",
            "Mean time between output tokens of one response",
            ["model", "transport"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.tps = Histogram(
            "respgate_output_tokens_per_second",
            "Output tokens per second of one response, from arrival to the last token",
            ["model", "transport"],
            buckets=TPS_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "respgate_stage_seconds",
            "Gateway time per pipeline stage",
            ["stage", "transport"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.store_latency = Histogram(
            "respgate_store_seconds", "Response store operation latency", ["op"], buckets=STAGE_BUCKETS, registry=r
        )
        self.conversation_latency = Histogram(
            "respgate_conversation_store_seconds",
            "Conversation store operation latency",
            ["op"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.conversation_turns = Counter(
            "respgate_conversation_turns",
            "Conversation turns by where their context came from: this process's "
            "last response on it (tip: an append) or the stored items (a full render)",
            ["context"],
            registry=r,
        )
        self.conversation_append_failures = Counter(
            "respgate_conversation_append_failures",
            "Finished conversation turns whose items could not be appended "
            "(conversation deleted meanwhile, or the store unavailable)",
            registry=r,
        )
        self.conn_cache = Counter(
            "respgate_connection_cache_lookups",
            "previous_response_id lookups in a WebSocket connection cache",
            ["outcome"],
            registry=r,
        )
        self.conn_cache_evictions = Counter(
            "respgate_connection_cache_evictions", "Lanes evicted from connection caches by the byte budget", registry=r
        )
        self.not_found = Counter(
            "respgate_previous_response_not_found",
            "Creates refused because previous_response_id did not resolve",
            ["transport"],
            registry=r,
        )
        self.warmups = Counter("respgate_warmups", "generate:false warm-up turns", ["transport"], registry=r)
        # tools the gateway runs (gateway/tools/): ``server`` is an operator's label, or ``request``
        # for a server a request named by URL (its label is the client's: unbounded)
        self.hosted_calls = Counter(
            "respgate_hosted_tool_calls",
            "Tool calls the gateway ran for the model, by tool type, server and outcome (ok, error)",
            ["tool", "server", "outcome"],
            registry=r,
        )
        self.hosted_call_seconds = Histogram(
            "respgate_hosted_tool_seconds",
            "Seconds one gateway-run tool call took",
            ["tool", "server"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.hosted_output_bytes = Counter(
            "respgate_hosted_tool_output_bytes",
            "Bytes of tool output the gateway's tool calls returned (before the model's cut)",
            ["tool", "server"],
            registry=r,
        )
        self.hosted_listings = Counter(
            "respgate_hosted_tool_listings",
            "Tool listings of MCP servers (from the catalog or the server), by outcome (ok, error)",
            ["tool", "server", "outcome"],
            registry=r,
        )
        self.hosted_list_seconds = Histogram(
            "respgate_hosted_tool_list_seconds",
            "Seconds to have a server's tool list (a catalog hit is ~0)",
            ["tool", "server"],
            registry=r,
            buckets=(0.0001, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15),
        )
        self.aborts = Counter(
            "respgate_generation_aborts", "Generations aborted because nobody listened", ["transport"], registry=r
        )
        self.errors = Counter(
            "respgate_request_errors", "Requests rejected before a response existed", ["transport", "code"], registry=r
        )
        self.ws_connections = Gauge("respgate_ws_connections", "Open WebSocket connections", registry=r)
        self.ws_inflight = Gauge("respgate_ws_inflight", "WebSocket responses in flight", registry=r)
        self.parent_resolution = Counter(
            "respgate_parent_resolution", "Where previous_response_id resolved", ["source"], registry=r
        )
        self.turn_overhead = Histogram(
            "respgate_turn_prepare_seconds",
            "Gateway work before the engine is called (validate..render)",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=r,
        )
        self.cancel_latency = Histogram(
            "respgate_abort_seconds",
            "From client disconnect to engine abort",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.ws_send_stalls = Counter(
            "respgate_ws_send_stalls",
            "WebSocket connections closed 1008 because the client stopped reading (ws_send_deadline_s)",
            registry=r,
        )
        self.web_actions = Counter(
            "respgate_web_search_actions",
            "web_search actions the gateway ran (search, open_page, find_in_page) by backend (the search "
            "backend's kind; pages for open and find) and outcome (ok, or why it failed: unavailable, "
            "timeout, rate_limited, bad_response, refused, too_large, http_error, unsupported_type, "
            "unreadable, invalid_call)",
            ["backend", "action", "outcome"],
            registry=r,
        )
        self.web_action_seconds = Histogram(
            "respgate_web_search_action_seconds",
            "Seconds one web_search action took (a search on its backend, a page fetched and read)",
            ["backend", "action"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60),
        )
        self.file_uploads = Counter(
            "respgate_file_uploads",
            "/v1/files uploads by outcome: ok, too_large (files_max_bytes), quota_exceeded, refused (a bad form, "
            "purpose or body)",
            ["outcome"],
            registry=r,
        )
        self.file_upload_bytes = Counter(
            "respgate_file_upload_bytes", "Bytes of the files uploaded and kept (/v1/files)", registry=r
        )
        self.file_ingestions = Counter(
            "respgate_file_ingestions",
            "Files a vector store ingested, by outcome: completed, cancelled, or failed with last_error's code "
            "(unsupported_file, invalid_file, server_error)",
            ["outcome"],
            registry=r,
        )
        self.file_ingestion_seconds = Histogram(
            "respgate_file_ingestion_seconds",
            "Seconds one file's ingestion took (text and chunks, vectors, index), whatever its outcome",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )
        self.file_ingestion_chunks = Counter(
            "respgate_file_ingestion_chunks", "Chunks added to vector stores (embedded and indexed)", registry=r
        )
        self.vector_store_search_seconds = Histogram(
            "respgate_vector_store_search_seconds",
            "Seconds one vector store search took (the query embedded, both rankings, fused), by where it came "
            "from: api (POST /v1/vector_stores/{id}/search) or tool (file_search)",
            ["via"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.hosted_tools_stripped = Counter(
            "respgate_hosted_tools_stripped",
            "Hosted tools a request sent that the gateway does not run, left out (hosted_tools=strip): "
            "the model was not shown them (Codex sends web_search in every frame)",
            ["type"],
            registry=r,
        )
        self.ws_steers = Counter(
            "respgate_ws_steers",
            "response.steer submissions by outcome: accepted, committed (a successor's or the "
            "client's next create took the input), pending (waiting for the client's tool "
            "output), failed_<code> (handed back)",
            ["outcome"],
            registry=r,
        )
        self.ws_resumable = Counter(
            "respgate_ws_resumable_states",
            "store=false lane states of closed WebSockets kept for a reconnect "
            "(ws_resume_window_s) and what became of them: kept, claimed, expired, "
            "evicted (byte caps), lost (claimed on another replica first), failed (Redis)",
            ["outcome", "where"],
            registry=r,
        )
        self.ws_resumable_bytes = Gauge(
            "respgate_ws_resumable_bytes", "Bytes of resumable lane states this replica holds in memory", registry=r
        )
        self.shutdown_cut = Counter(
            "respgate_shutdown_cut_turns",
            "Turns still running at the shutdown deadline (aborted, socket closed 1001)",
            registry=r,
        )
        self.background_cancels = Counter(
            "respgate_background_cancels",
            "Cancels of running background responses, by where the turn ran "
            "(local: this replica; remote: asked of its owner through Redis)",
            ["where"],
            registry=r,
        )
        self.background_reaped = Counter(
            "respgate_background_reaped",
            "Background responses whose replica died (lease lapsed), marked failed and billed by this replica",
            registry=r,
        )
        self._classifier_metrics(r)
        self._prefix_metrics(r)
        #: ``gateway.base.tracing.Tracing`` when traces are exported (set by the app factory), else None
        self.tracing: Tracing | None = None

    # -- full-history reuse (gateway/turn/prefix.py): what requests without a parent did not redo --
    def _prefix_metrics(self, r: CollectorRegistry) -> None:
        self.prefix_lookups = Counter(
            "respgate_prefix_cache_lookups",
            "Requests without a parent looked up in the prefix cache (hit, miss, ineligible)",
            ["outcome"],
            registry=r,
        )
        self.prefix_reused_tokens = Counter(
            "respgate_prefix_cache_reused_tokens",
            "Prompt tokens of requests without a parent taken from the prefix cache instead of rendered",
            registry=r,
        )
        self.prefix_checked_tokens = Counter(
            "respgate_prefix_cache_checked_tokens",
            "Tokens of re-sent output items the lookup rendered to compare them with the model's sampled tokens",
            registry=r,
        )
        self.prefix_copied_tokens = Counter(
            "respgate_prefix_cache_copied_tokens",
            "Cached prompt tokens copied to a new buffer because the sampled "
            "tokens after them differ from the canonical rendering",
            registry=r,
        )
        self.prefix_skipped_items = Counter(
            "respgate_prefix_cache_skipped_items",
            "Input items not classified again: the tenant's earlier turn sent them (or they are the model's output)",
            registry=r,
        )

    # -- classifiers (security issue): work on new items only, and what was found ------------------
    def _classifier_metrics(self, r: CollectorRegistry) -> None:
        self.classified_items = Counter(
            "respgate_classified_items", "Input items classified (each turn's new items only)", registry=r
        )
        self.classified_bytes = Counter(
            "respgate_classified_bytes", "UTF-8 bytes of item text handed to classifiers", registry=r
        )
        self.classifier_verdicts = Counter(
            "respgate_classifier_verdicts", "Non-allow classifier verdicts", ["action", "category"], registry=r
        )

    def stage_timer(self, transport: str) -> StageTimer:
        """One turn's clock; with tracing on (``gateway.base.tracing``) one that also records spans."""
        if self.tracing is not None:
            return self.tracing.timer(self.stage, transport)
        return StageTimer(self.stage, transport)


class StageTimer:
    """One turn's stage clock: ``lap(stage)`` adds the time since the previous lap to ``stage``
    (a stage may be entered twice, e.g. validation before and after the parent resolves);
    ``observe()`` records one sample per stage lapped so far, so histogram counts equal accepted
    turns. The clock runs on through the turn (``PreparedTurn.clock``): the run and finalize laps
    (``RUN_STAGES``) feed the ``Server-Timing`` a client may see and, with tracing on, the turn's
    spans — not ``respgate_stage_seconds``, whose ``engine_submit`` and ``finalize`` samples the
    run and finalize stages take themselves. ``end`` is told how the turn ended (tracing exports
    then); a plain timer does nothing with it, so with tracing off a turn creates no span object."""

    __slots__ = ("_hist", "_transport", "_t", "_acc", "started")

    def __init__(self, hist: Histogram, transport: str) -> None:
        self._hist = hist
        self._transport = transport
        self._t = self.started = time.perf_counter()
        self._acc: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self._acc[stage] = self._acc.get(stage, 0.0) + (now - self._t)
        self._t = now

    def observe(self) -> None:
        for stage, seconds in self._acc.items():
            self._hist.labels(stage, self._transport).observe(seconds)

    def durations(self) -> dict[str, float]:
        """Seconds per stage lapped so far, in the order first entered."""
        return dict(self._acc)

    def server_timing(self) -> str:
        """The stages as a ``Server-Timing`` header value (W3C Server Timing: ``name;dur=ms``),
        ending with ``total``: from the start of the clock to now. Stages are contiguous laps of
        one clock, so their sum never exceeds the total."""
        total = (time.perf_counter() - self.started) * 1000.0
        parts = [f"{stage};dur={seconds * 1000.0:.3f}" for stage, seconds in self._acc.items()]
        parts.append(f"total;dur={total:.3f}")
        return ", ".join(parts)

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
        """The turn ended (``status``: the Response's, or ``rejected`` before one existed)."""
        return None

    def span(self, name: str, t0: float, t1: float, attributes: Mapping[str, Any]) -> None:
        """A span of the turn that is not a stage (a tool call: they overlap); traced timers keep it."""
        return None


#: stages the clock laps after ``prepare``: in the run (``gateway.turn.run``) and finalize
#: (``gateway.turn.finalize``); ``engine_ttft`` ends at the first token, ``streaming`` at the last;
#: ``cancelled``: a turn cut or left by its client, from its last stage boundary to the cut;
#: ``tools``: the calls the gateway ran between engine passes (``gateway.turn.tool_loop``)
RUN_STAGES = (
    "engine_submit",
    "compact",
    "engine_ttft",
    "streaming",
    "tools",
    "store",
    "finalize",
    "billing",
    "cancelled",
)


class FlagCollector:
    """The flag reporter's counters, read at scrape time (security stays free of Prometheus)."""

    def __init__(self, reporter: Any) -> None:
        self.reporter = reporter

    def collect(self) -> Iterator[Any]:
        c = CounterMetricFamily("respgate_flag_records", "Flag records by outcome", labels=["outcome"])
        for outcome in ("reported", "written", "dropped"):
            c.add_metric([outcome], getattr(self.reporter, outcome, 0))
        yield c
        yield GaugeMetricFamily(
            "respgate_flag_records_pending", "Flag records not yet written", value=getattr(self.reporter, "pending", 0)
        )


class PrefixCacheCollector:
    """The prefix cache's size and evictions, read at scrape time (``cache.prefix_cache``)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "respgate_prefix_cache_bytes",
            "Bytes the prefix cache charges (token views)",
            value=getattr(self.cache, "nbytes", 0),
        )
        yield GaugeMetricFamily(
            "respgate_prefix_cache_entries", "Turns the prefix cache holds", value=getattr(self.cache, "entries", 0)
        )
        yield CounterMetricFamily(
            "respgate_prefix_cache_evictions",
            "Conversations dropped from the prefix cache by its byte bounds",
            value=getattr(self.cache, "evictions", 0),
        )


class ComponentCollector:
    """Counters that live on components (the usage queue, the response store, shared views, engines,
    open WebSocket connections) rather than in the pipeline, read at scrape time so components stay
    free of Prometheus."""

    def __init__(self, usage: Any, store: Any, engines: Iterable[Any] = (), connections: Any = ()) -> None:
        self.usage = usage
        self.store = store
        self.engines = list(engines)
        self.connections = connections

    def collect(self) -> Iterator[Any]:
        from cache.seq import AppendOnlyView

        c = CounterMetricFamily("respgate_usage_records", "Usage records by where they went", labels=["sink"])
        for label, attr in (
            ("ledger", "written"),
            ("journal", "journaled"),
            ("journal_sync", "journaled_sync"),
            ("replayed", "replayed"),
        ):
            c.add_metric([label], getattr(self.usage, attr, 0))
        yield c
        yield GaugeMetricFamily(
            "respgate_usage_pending", "Usage records not yet written to a sink", value=getattr(self.usage, "pending", 0)
        )
        yield from self._billing()
        tokens = CounterMetricFamily(
            "respgate_store_token_cache", "Store reads by token-cache outcome", labels=["outcome"]
        )
        tokens.add_metric(["hit"], getattr(self.store, "token_hits", 0))
        tokens.add_metric(["miss"], getattr(self.store, "token_misses", 0))
        yield tokens
        chains = CounterMetricFamily(
            "respgate_store_chain_cache",
            "Store reads of a response whose context this process holds (hit: one "
            "round trip, no ancestor reads) or not",
            labels=["outcome"],
        )
        chains.add_metric(["hit"], getattr(self.store, "chain_hits", 0))
        chains.add_metric(["miss"], getattr(self.store, "chain_misses", 0))
        yield chains
        yield CounterMetricFamily(
            "respgate_store_rerooted",
            "Responses stored as the root of a new chain because their parent's chain was "
            "gone when they were written (evicted, expired or deleted mid-turn)",
            value=getattr(self.store, "rerooted", 0),
        )
        yield CounterMetricFamily(
            "respgate_sequence_copies",
            "History copies forced by forks or retries (continuations append in place)",
            value=AppendOnlyView.copies,
        )
        yield from self._engines()
        yield from self._websockets()

    def _billing(self) -> Iterator[Any]:
        """Queue lag (age of the oldest record not yet acknowledged) and the journal's size on disk."""
        oldest = getattr(self.usage, "oldest_pending_at", None)
        yield GaugeMetricFamily(
            "respgate_billing_lag_seconds",
            "Age of the oldest usage record not yet written to a sink (0 when none)",
            value=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
        )
        journal = getattr(self.usage, "journal", None)
        yield GaugeMetricFamily(
            "respgate_billing_journal_bytes",
            "Bytes in the local usage journal waiting for replay (live file + segments)",
            value=journal.size_bytes() if journal is not None else 0,
        )
        wal = getattr(self.usage, "wal", None)
        if wal is not None:
            yield CounterMetricFamily(
                "respgate_billing_wal_appends",
                "Usage records written ahead to the WAL at submit (SIGKILL safety)",
                value=wal.appended,
            )
            yield CounterMetricFamily(
                "respgate_billing_wal_failures",
                "WAL appends that failed (those records relied on the queue alone)",
                value=wal.failures,
            )
            yield GaugeMetricFamily(
                "respgate_billing_wal_unacked",
                "Records in the WAL not yet acknowledged by the ledger or the journal",
                value=wal.unacked,
            )

    def _engines(self) -> Iterator[Any]:
        names = CounterMetricFamily("respgate_engine_requests", "Requests submitted to each engine", labels=["engine"])
        aborts = CounterMetricFamily("respgate_engine_aborts", "Requests each engine aborted", labels=["engine"])
        running = GaugeMetricFamily("respgate_engine_running", "Requests running in each engine", labels=["engine"])
        cached = CounterMetricFamily(
            "respgate_engine_cached_tokens", "Prompt tokens each engine served from its prefix cache", labels=["engine"]
        )
        ttft = SummaryMetricFamily(
            "respgate_engine_time_to_first_token_seconds",
            "Engine's own time from queueing a request to its first token (vLLM's request metrics)",
            labels=["engine"],
        )
        for engine in self.engines:
            stats = getattr(engine, "stats", None)
            if stats is None:
                continue
            label = [str(getattr(engine, "name", type(engine).__name__))]
            names.add_metric(label, stats.requests)
            aborts.add_metric(label, stats.aborts)
            running.add_metric(label, stats.running)
            cached.add_metric(label, stats.cached_tokens)
            ttft.add_metric(label, stats.engine_ttft_count, stats.engine_ttft_s)
        yield from (names, aborts, running, cached, ttft)

    def _websockets(self) -> Iterator[Any]:
        n_lanes = n_queued = 0
        for conn in list(self.connections):
            machine = getattr(conn, "machine", None)  # gateway.transport.lanes.LaneMachine
            if machine is not None:
                n_lanes += machine.lanes
                n_queued += machine.waiting
        yield GaugeMetricFamily(
            "respgate_ws_lanes", "Lanes (default + stream_id) open on WebSocket connections", value=n_lanes
        )
        yield GaugeMetricFamily(
            "respgate_ws_queued_creates", "response.create frames waiting in a lane or for a slot", value=n_queued
        )


class BackgroundCollector:
    """Background responses this replica runs, by phase, and the bytes their event logs keep, read
    at scrape time from ``gateway.sessions.background.BackgroundTurns``."""

    def __init__(self, background: Any) -> None:
        self.background = background

    def collect(self) -> Iterator[Any]:
        turns = GaugeMetricFamily(
            "respgate_background_turns", "Background responses queued or running on this replica", labels=["state"]
        )
        turns.add_metric(["queued"], self.background.queued)
        turns.add_metric(["running"], self.background.running)
        yield turns
        yield GaugeMetricFamily(
            "respgate_background_event_log_bytes",
            "Bytes of background stream events this replica keeps for resuming",
            value=self.background.logs.nbytes,
        )
