"""``/metrics`` after real sessions: stage histograms, token counters and gauges agree with what the
client did; every metric the Grafana dashboard queries is exported; logs carry the turn's ids."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.base.metrics import STAGES
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import wait_for
from tests.ws_helpers import create, fixed, recv, send, until_terminal, ws_open

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "dashboards" / "respgate.json"


class Scrape:
    """One ``GET /metrics``, parsed with prometheus-client's own text parser."""

    def __init__(self, live: LiveGateway) -> None:
        r = httpx.get(live.url + "/metrics", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        self.families = {f.name: f for f in text_string_to_metric_families(r.text)}
        self.samples: dict[str, list[Any]] = {}
        for fam in self.families.values():
            for s in fam.samples:
                self.samples.setdefault(s.name, []).append(s)

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return sum(s.value for s in self.samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))

    def has(self, name: str) -> bool:
        """Exported: as a sample, or as a declared family (a labelled counter with no child yet)."""
        if name in self.samples:
            return True
        base = re.sub(r"_(bucket|sum|count|total|created)$", "", name)
        return base in self.families


def _session(live: LiveGateway) -> dict[str, Any]:
    """First turn, a continuation, a warm-up, a fork on a named lane and one bad previous_response_id."""
    with ws_open(live) as ws:
        send(ws, create(input="first question", store=False))
        first = until_terminal(ws)[-1]["response"]
        send(ws, create(input="a follow-up", previous_response_id=first["id"], store=False))
        second = until_terminal(ws)[-1]["response"]
        send(ws, create(input="warm only", previous_response_id=second["id"], generate=False))
        warm = until_terminal(ws)[-1]["response"]
        send(ws, create(input="on a lane", previous_response_id=warm["id"], stream_id="side"))
        lane = until_terminal(ws)[-1]["response"]
        send(ws, create(input="dangling", previous_response_id="resp_does_not_exist"))
        err = recv(ws)
        assert err["type"] == "error" and err["error"]["code"] == "previous_response_not_found"
        # a scrape while the socket is open sees it and its two lanes
        open_scrape = Scrape(live)
    return {"responses": [first, second, warm, lane], "open": open_scrape}


def test_ws_session_then_scrape_agrees_with_the_session(make_gateway):
    engine = SimulatedEngine(script=fixed(Turn(text="alpha beta gamma delta epsilon")))
    live = make_gateway(engine=engine)
    session = _session(live)
    first, second, warm, lane = session["responses"]
    assert [r["status"] for r in session["responses"]] == ["completed"] * 4
    generated = 3  # first, second, lane (the warm-up does not call the engine)
    wait_for(lambda: live.metric("respgate_usage_records_total", {"sink": "ledger"}) == 4, what="usage records")
    m = Scrape(live)

    # stage histograms: one sample per accepted turn for each stage run before the engine ...
    for stage in ("validate", "resolve", "classify", "render"):
        assert m.value("respgate_stage_seconds_count", stage=stage, transport="ws") == 4, stage
        assert m.value("respgate_stage_seconds_sum", stage=stage, transport="ws") > 0, stage
        assert m.value("respgate_stage_seconds_bucket", stage=stage, transport="ws", le="+Inf") == 4
    # ... the engine submit for generating turns only, and finalize for every turn
    assert m.value("respgate_stage_seconds_count", stage="engine_submit", transport="ws") == generated
    assert m.value("respgate_stage_seconds_count", stage="finalize", transport="ws") == 4
    assert set(STAGES) == {s.labels["stage"] for s in m.samples["respgate_stage_seconds_count"]}

    # tokens: turn 1 renders in full, every continuation appends and reuses the parent's tokens
    assert m.value("respgate_render_tokens_total", mode="full") > 0
    assert m.value("respgate_render_tokens_total", mode="append") > 0
    reused = m.value("respgate_render_reused_tokens_total")
    assert reused >= first["usage"]["input_tokens"] + first["usage"]["output_tokens"] - 1 > 0
    assert (
        m.value("respgate_prompt_tokens_total", model=MODEL)
        == sum(r["usage"]["input_tokens"] for r in (first, second, lane)) + warm["usage"]["input_tokens"]
    )
    assert (
        m.value("respgate_cached_tokens_total", model=MODEL)
        == sum(r["usage"]["input_tokens_details"]["cached_tokens"] for r in (first, second, lane))
        > 0
    )
    assert m.value("respgate_output_tokens_total", model=MODEL) == sum(
        r["usage"]["output_tokens"] for r in (first, second, lane)
    )
    assert m.value("respgate_engine_cached_tokens_total", engine="simulated") == engine.stats.cached_tokens > 0
    assert m.value("respgate_engine_requests_total", engine="simulated") == engine.stats.requests == generated

    # latency histograms: one observation per generating turn
    for name in (
        "respgate_time_to_first_token_seconds",
        "respgate_inter_token_latency_seconds",
        "respgate_output_tokens_per_second",
    ):
        assert m.value(name + "_count", model=MODEL, transport="ws") == generated, name

    # connection cache: 3 continuations resolved on the connection, 1 miss -> not found
    assert m.value("respgate_connection_cache_lookups_total", outcome="hit") == 3
    assert m.value("respgate_connection_cache_lookups_total", outcome="miss") == 1
    assert m.value("respgate_previous_response_not_found_total", transport="ws") == 1
    assert m.value("respgate_connection_cache_evictions_total") == 0
    assert m.value("respgate_warmups_total", transport="ws") == 1
    assert m.value("respgate_turns_total", transport="ws", status="completed") == 4
    assert m.value("respgate_classified_items_total") == 4  # one new message per turn, none of the history
    assert m.value("respgate_store_seconds_count", op="get") == 1  # the dangling id
    assert m.value("respgate_store_seconds_count", op="put") == 2  # warm-up and lane turn stored

    # gauges: the open socket had 2 lanes; after close everything is back to zero
    o = session["open"]
    assert o.value("respgate_ws_connections") == 1 and o.value("respgate_ws_lanes") == 2
    wait_for(lambda: live.metric("respgate_ws_connections") == 0, what="socket closed")
    m = Scrape(live)
    assert m.value("respgate_ws_lanes") == 0 and m.value("respgate_ws_queued_creates") == 0
    assert m.value("respgate_usage_pending") == 0 and m.value("respgate_billing_lag_seconds") == 0
    assert m.value("respgate_generation_aborts_total") == 0


def test_connection_cache_evictions_are_counted(make_gateway):
    from gateway.base.settings import Settings

    # a budget smaller than one response: every new lane evicts the least recently used one
    live = make_gateway(Settings(ws_cache_bytes=1))
    with ws_open(live) as ws:
        for lane in ("a", "b", "c"):
            send(ws, create(input=f"lane {lane}", stream_id=lane, store=False))
            assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert Scrape(live).value("respgate_connection_cache_evictions_total") == 2


def test_queued_creates_are_visible_while_a_lane_is_busy(make_gateway):
    engine = SimulatedEngine(script=fixed(Turn(text="x", endless=True, delay_per_token_s=0.002)))
    live = make_gateway(engine=engine)
    with ws_open(live) as ws:
        send(ws, create(input="endless", max_output_tokens=4000))
        assert recv(ws)["type"] == "response.created"
        send(ws, create(input="behind it"))
        send(ws, create(input="and behind that"))
        wait_for(lambda: Scrape(live).value("respgate_ws_queued_creates") == 2, what="two queued creates")
        m = Scrape(live)
        assert m.value("respgate_ws_inflight") == 1 and m.value("respgate_engine_running", engine="simulated") == 1


# -- the dashboard ---------------------------------------------------------------------------------

PROMQL_WORDS = {
    # functions
    "rate",
    "irate",
    "increase",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "topk",
    "bottomk",
    "abs",
    "delta",
    "deriv",
    "vector",
    "scalar",
    "time",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "sum_over_time",
    "label_replace",
    "absent",
    "round",
    "ceil",
    "floor",
    # keywords
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
}


def dashboard_exprs() -> list[str]:
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text()))
    return exprs


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label
    names in ``{...}`` / ``by (...)``, durations, or Grafana variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors
    e = re.sub(r"\$\{?\w+\}?", "", e)  # Grafana variables
    names = set(re.findall(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", e))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d+\w*", n)}


def test_metric_name_extraction():
    assert metric_names(
        "histogram_quantile(0.95, sum by (le, stage) (rate(respgate_stage_seconds_bucket"
        '{transport=~"$transport"}[5m])))'
    ) == {"respgate_stage_seconds_bucket"}
    assert metric_names("sum(rate(a_total[1m])) / clamp_min(sum(rate(b_total[1m])), 1)") == {"a_total", "b_total"}


#: metrics the dashboard shows that a default gateway does not export: they exist with their feature
EXPORTED_WITH = {
    "respgate_billing_wal_appends_total": "a durable ledger with a journal (billing.wal)",
    "respgate_billing_wal_failures_total": "a durable ledger with a journal (billing.wal)",
    "respgate_billing_wal_unacked": "a durable ledger with a journal (billing.wal)",
}
#: metrics the gateway declares that are deliberately not on the dashboard, and why
NOT_ON_DASHBOARD = {
    "respgate_tenant_tokens": "opt-in (metrics_per_tenant) and labelled per tenant: for ad-hoc queries, not a "
    "shared board",
}
GATEWAY = DASHBOARD.parents[3] / "gateway"


def declared_metrics() -> set[str]:
    """Every metric the gateway declares: the name given to a metric or metric-family constructor."""
    pattern = re.compile(r'(?:Counter|Gauge|Histogram|Summary|MetricFamily)\(\s*"(respgate_\w+)"')
    return {name for path in GATEWAY.rglob("*.py") for name in pattern.findall(path.read_text())}


def base_name(sample: str) -> str:
    return re.sub(r"_(bucket|sum|count|total|created)$", "", sample)


def test_every_declared_metric_is_on_the_dashboard_or_deliberately_not():
    declared = declared_metrics()
    assert {
        "respgate_turns",
        "respgate_conversation_store_seconds",
        "respgate_background_event_log_bytes",
        "respgate_engine_time_to_first_token_seconds",
        "respgate_compactions",
    } <= declared, declared
    shown = {base_name(n) for e in dashboard_exprs() for n in metric_names(e)}
    absent = sorted(declared - shown - set(NOT_ON_DASHBOARD))
    assert not absent, f"metrics neither on the dashboard nor listed in NOT_ON_DASHBOARD: {absent}"
    assert set(NOT_ON_DASHBOARD) <= declared - shown, "NOT_ON_DASHBOARD names a metric that is gone or shown"
    assert {base_name(n) for n in EXPORTED_WITH} <= declared


def test_every_metric_the_dashboard_queries_is_exported(make_gateway):
    exprs = dashboard_exprs()
    assert len(exprs) >= 20, "the dashboard lost its panels"
    wanted = set().union(*(metric_names(e) for e in exprs))
    live = make_gateway()
    _session(live)
    m = Scrape(live)
    missing = sorted(n for n in wanted if not m.has(n) and n not in EXPORTED_WITH)
    assert not missing, f"dashboard queries metrics /metrics does not export: {missing}"
    # and the dashboard covers what operators asked for
    for must in (
        "respgate_stage_seconds_bucket",
        "respgate_time_to_first_token_seconds_bucket",
        "respgate_inter_token_latency_seconds_bucket",
        "respgate_render_reused_tokens_total",
        "respgate_connection_cache_lookups_total",
        "respgate_previous_response_not_found_total",
        "respgate_ws_connections",
        "respgate_ws_queued_creates",
        "respgate_billing_lag_seconds",
        "respgate_billing_journal_bytes",
        "respgate_classifier_verdicts_total",
        "respgate_rate_limit_rejections_total",
        "respgate_store_seconds_bucket",
        "respgate_engine_aborts_total",
        "respgate_warmups_total",
    ):
        assert must in wanted, must


# -- logs ------------------------------------------------------------------------------------------


def test_json_log_lines_carry_request_and_response_ids(make_gateway):
    from gateway.ops.logging_setup import ContextFilter, json_formatter

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(ContextFilter())
    handler.setFormatter(json_formatter())
    logger = logging.getLogger("gateway.turn.finalize")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        live = make_gateway()
        r = httpx.post(
            live.base_url + "/responses",
            json={"model": MODEL, "input": "hi"},
            headers={"Authorization": "Bearer k", "X-Request-Id": "req-from-client-1"},
            timeout=30,
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "req-from-client-1"
        rid = r.json()["id"]
        with ws_open(live) as ws:
            send(ws, create(input="over ws"))
            ws_id = until_terminal(ws)[-1]["response"]["id"]
        wait_for(lambda: ws_id in buf.getvalue(), what="ws turn log line")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    http_line = next(x for x in lines if x["response_id"] == rid)
    assert http_line["request_id"] == "req-from-client-1" and http_line["message"] == "turn finished"
    assert http_line["status"] == "completed" and http_line["transport"] == "http" and http_line["level"] == "INFO"
    ws_line = next(x for x in lines if x["response_id"] == ws_id)
    assert ws_line["request_id"].startswith("req_") and ws_line["transport"] == "ws"
    # a header that could forge log fields is replaced, not echoed
    bad = httpx.get(live.url + "/healthz", headers={"X-Request-Id": 'x", "level": "ERROR'})
    assert bad.headers["x-request-id"].startswith("req_")


def test_remembered_label_children_are_the_ones_prometheus_client_gives():
    """``labels`` is memoized per label values (gateway/base/metrics.py): a remembered child is the
    very child prometheus_client returns for those values, a StrEnum member finds its value's child,
    and values that are not their own string (an int) are never remembered yet still counted."""
    from prometheus_client import generate_latest
    from prometheus_client.metrics import MetricWrapperBase

    from gateway.base.metrics import Metrics
    from gateway.wire.kinds import ResponseStatus

    m = Metrics()
    child = m.turns.labels("ws", "completed")
    assert m.turns.labels("ws", "completed") is child
    assert m.turns.labels("ws", ResponseStatus.COMPLETED) is child
    assert MetricWrapperBase.labels(m.turns, "ws", "completed") is child  # prometheus_client's own lookup
    assert m.turns.labels(transport="ws", status="completed") is child
    child.inc()
    m.turns.labels("ws", ResponseStatus.COMPLETED).inc()
    m.errors.labels("ws", 429).inc()
    m.errors.labels("ws", 429).inc()
    assert ("ws", 429) not in m.errors._memo
    text = generate_latest(m.registry).decode()
    assert 'respgate_turns_total{status="completed",transport="ws"} 2.0' in text
    assert 'respgate_request_errors_total{code="429",transport="ws"} 2.0' in text


def test_the_lean_inc_and_observe_export_what_prometheus_client_would():
    """``Counter.inc`` and ``Histogram.observe`` take a shorter way (gateway/base/metrics.py): the
    same values go in the exposition as through prometheus_client's own methods, for every bucket
    edge, +Inf, negatives and NaN; a labelled parent and a negative increment still raise."""
    import math
    import random

    import pytest
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client import Counter as PlainCounter
    from prometheus_client import Histogram as PlainHistogram

    from gateway.base import metrics
    from gateway.base.metrics import STAGE_BUCKETS, Counter, Histogram

    assert metrics._LEAN_VALUES  # the installed prometheus_client takes the short way: it is what is compared

    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hist = Histogram("h", "h", ["k"], buckets=STAGE_BUCKETS, registry=ours)
    plain_hist = PlainHistogram("h", "h", ["k"], buckets=STAGE_BUCKETS, registry=theirs)
    count = Counter("c", "c", ["k"], registry=ours)
    plain_count = PlainCounter("c", "c", ["k"], registry=theirs)
    bare, plain_bare = Counter("b", "b", registry=ours), PlainCounter("b", "b", registry=theirs)
    rng = random.Random(7)
    values = [*STAGE_BUCKETS, 0.0, -1.0, math.inf, math.nan, 2.0, 1e-9]
    values += [b * f for b in STAGE_BUCKETS for f in (0.999999, 1.000001)]
    values += [rng.expovariate(1000) for _ in range(500)]
    for i, v in enumerate(values):
        key = "ab"[i % 2]
        hist.labels(key).observe(v)
        plain_hist.labels(key).observe(v)
        if v >= 0 and not math.isinf(v):
            count.labels(key).inc(v)
            plain_count.labels(key).inc(v)
            bare.inc(v)
            plain_bare.inc(v)

    def lines(registry):  # creation times differ between the two registries
        return sorted(x for x in generate_latest(registry).decode().splitlines() if "_created" not in x)

    assert lines(ours) == lines(theirs)
    with pytest.raises(ValueError):
        count.inc()  # a labelled parent is not observable
    with pytest.raises(ValueError):
        hist.observe(1.0)
    with pytest.raises(ValueError):
        count.labels("a").inc(-1)
