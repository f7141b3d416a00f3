"""Prometheus metrics: what operators watch, and how much of each stage's work was new.

Each app gets its own registry so several gateways (tests) can live in one process.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.turns = Counter("respgate_turns", "Turns by transport and final status", ["transport", "status"],
                             registry=r)
        self.render_tokens = Counter("respgate_render_tokens", "Tokens encoded by the renderer per render mode",
                                     ["mode"], registry=r)
        self.render_fallbacks = Counter("respgate_render_full_fallbacks",
                                        "Continuations rendered in full because an append was not provably exact",
                                        ["reason"], registry=r)
        self.items_validated = Counter("respgate_items_validated", "Input items validated", registry=r)
        self.prompt_tokens = Counter("respgate_prompt_tokens", "Prompt tokens handed to engines", registry=r)
        self.cached_tokens = Counter("respgate_cached_tokens", "Prompt tokens served from engine prefix caches",
                                     registry=r)
        self.output_tokens = Counter("respgate_output_tokens", "Tokens generated", registry=r)
        self.aborts = Counter("respgate_generation_aborts", "Generations aborted because nobody listened",
                              ["transport"], registry=r)
        self.errors = Counter("respgate_request_errors", "Requests rejected before a response existed",
                              ["transport", "code"], registry=r)
        self.ws_connections = Gauge("respgate_ws_connections", "Open WebSocket connections", registry=r)
        self.ws_inflight = Gauge("respgate_ws_inflight", "WebSocket responses in flight", registry=r)
        self.parent_resolution = Counter("respgate_parent_resolution", "Where previous_response_id resolved",
                                         ["source"], registry=r)
        self.turn_overhead = Histogram("respgate_turn_prepare_seconds",
                                       "Gateway work before the engine is called (validate..render)",
                                       buckets=(.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1),
                                       registry=r)
        self.cancel_latency = Histogram("respgate_abort_seconds",
                                        "From client disconnect to engine abort",
                                        buckets=(.001, .005, .01, .05, .1, .5, 1, 5), registry=r)

        self._classifier_metrics(r)

    # -- classifiers (security issue): work on new items only, and what was found ------------------
    def _classifier_metrics(self, r: CollectorRegistry) -> None:
        self.classified_items = Counter("respgate_classified_items",
                                        "Input items classified (each turn's new items only)", registry=r)
        self.classified_bytes = Counter("respgate_classified_bytes",
                                        "UTF-8 bytes of item text handed to classifiers", registry=r)
        self.classifier_verdicts = Counter("respgate_classifier_verdicts", "Non-allow classifier verdicts",
                                           ["action", "category"], registry=r)


class FlagCollector:
    """The flag reporter's counters, read at scrape time (security stays free of Prometheus)."""

    def __init__(self, reporter: Any) -> None:
        self.reporter = reporter

    def collect(self) -> Iterator[Any]:
        c = CounterMetricFamily("respgate_flag_records", "Flag records by outcome", labels=["outcome"])
        for outcome in ("reported", "written", "dropped"):
            c.add_metric([outcome], getattr(self.reporter, outcome, 0))
        yield c
        pending = GaugeMetricFamily("respgate_flag_records_pending", "Flag records not yet written")
        pending.add_metric([], getattr(self.reporter, "pending", 0))
        yield pending


class ComponentCollector:
    """Counters that live on components (the usage queue, the response store, shared views) rather
    than in the pipeline, read at scrape time so components stay free of Prometheus."""

    def __init__(self, usage: Any, store: Any) -> None:
        self.usage = usage
        self.store = store

    def collect(self) -> Iterator[Any]:
        from cache.seq import AppendOnlyView

        c = CounterMetricFamily("respgate_usage_records", "Usage records by where they went", labels=["sink"])
        for label, attr in (("ledger", "written"), ("journal", "journaled"), ("journal_sync", "journaled_sync"),
                            ("replayed", "replayed")):
            c.add_metric([label], getattr(self.usage, attr, 0))
        yield c
        pending = GaugeMetricFamily("respgate_usage_pending", "Usage records not yet written to a sink")
        pending.add_metric([], getattr(self.usage, "pending", 0))
        yield pending
        tokens = CounterMetricFamily("respgate_store_token_cache", "Store reads by token-cache outcome",
                                     labels=["outcome"])
        tokens.add_metric(["hit"], getattr(self.store, "token_hits", 0))
        tokens.add_metric(["miss"], getattr(self.store, "token_misses", 0))
        yield tokens
        copies = CounterMetricFamily("respgate_sequence_copies",
                                     "History copies forced by forks or retries (continuations append in place)")
        copies.add_metric([], AppendOnlyView.copies)
        yield copies
