"""OpenTelemetry traces: spans exported over OTLP/HTTP to a collector the test runs on loopback.

The collector is a plain HTTP server that accepts ``POST /v1/traces`` and decodes each body as an
``ExportTraceServiceRequest`` (``opentelemetry-proto``, the exporter's own dependency), so what is
checked is what the wire carries: the tree (the caller's ``traceparent`` honoured, a child span
per stage), the attributes (present, bounded, never content: a marker word in every piece of
input, instructions, tool definitions and so in tool arguments and output, never in any byte the
exporter sent), and that with tracing off no span object is ever made (counted, not timed).
"""

from __future__ import annotations

import gzip
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from websockets.sync.client import connect

from gateway.base import tracing
from gateway.base.settings import Settings
from inference.engine import RequestRouting, SamplingParams, TokenDelta
from inference.simulated import SimulatedEngine
from tests.conftest import MODEL

MARKER = "quokkaverbatim"  # in every piece of content the tests send; never in an exported span
KEY = "acme:sk-" + "k" * 40  # tenant "acme": the tenant may be exported, the key never
STAGES = {"validate", "resolve", "classify", "render", "engine_submit", "finalize", "billing"}
ALLOWED_ATTRS = {
    "respgate.transport",
    "respgate.status",
    "respgate.tenant",
    "respgate.previous_response_id",
    "gen_ai.response.id",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "respgate.usage.cached_tokens",
    "respgate.usage.reasoning_tokens",
    "error.type",
    # a tool call the gateway ran (gateway.turn.tool_loop): bounded, never arguments or output
    "respgate.tool.type",
    "respgate.tool.server",
    "respgate.tool.name",
    "respgate.tool.output_bytes",
}


class Collector:
    """A minimal OTLP/HTTP traces receiver: keeps every body and every decoded span."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    collector.bodies.append(body)
                    for rs in request.resource_spans:
                        collector.resources.append({a.key: _value(a.value) for a in rs.resource.attributes})
                        for ss in rs.scope_spans:
                            collector.spans.extend(ss.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                return None

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(span: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    try:
        yield c
    finally:
        c.close()


class TraceparentEngine(SimulatedEngine):
    """The simulated engine, noting the ``traceparent`` the gateway routed its request with (what
    the remote engine sends as the header: tests/inference/test_session_routing.py)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.traceparents: list[str | None] = []

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams, routing: RequestRouting | None = None
    ) -> AsyncIterator[TokenDelta]:
        self.traceparents.append(routing.traceparent if routing is not None else None)
        async for delta in super().generate(request_id, prompt_ids, params, routing):
            yield delta


def traced(make_gateway: Any, collector: Collector, **kw: Any) -> Any:
    engine = TraceparentEngine()
    settings = Settings(
        api_keys=[KEY], otel_traces=True, otel_endpoint=collector.url, otel_service_name="respgate-test", **kw
    )
    return make_gateway(settings, engine=engine)


def parent_header() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


WEATHER = {
    "type": "function",
    "name": "lookup",
    "description": f"Looks up {MARKER} facts.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": MARKER}}, "required": ["q"]},
}


def tree(spans: list[Any], turn: Any) -> dict[str, Any]:
    """Span name -> span, for the turn span's children and the engine span's children."""
    children = {s.name: s for s in spans if s.parent_span_id == turn.span_id and s.trace_id == turn.trace_id}
    engine = children.get("engine")
    under_engine = {s.name: s for s in spans if s.parent_span_id == engine.span_id} if engine is not None else {}
    return {**children, **{f"engine/{k}": v for k, v in under_engine.items()}}


def turn_of(spans: list[Any], response_id: str) -> Any:
    found = [s for s in spans if s.name == tracing.TURN_SPAN and attrs(s).get("gen_ai.response.id") == response_id]
    assert len(found) == 1, [attrs(s) for s in spans if s.name == tracing.TURN_SPAN]
    return found[0]


def check_bounded(collector: Collector) -> None:
    """Every exported attribute is a known key with a short scalar; no content, no key anywhere."""
    for body in collector.bodies:
        assert MARKER.encode() not in body
        assert KEY.split(":", 1)[1].encode() not in body
    for span in collector.spans:
        for key, value in attrs(span).items():
            assert key in ALLOWED_ATTRS, key
            assert isinstance(value, (int, str)) and (not isinstance(value, str) or len(value) <= 128), (key, value)


def test_http_turn_joins_the_callers_trace_with_a_span_per_stage(collector, make_gateway):
    live = traced(make_gateway, collector)
    header, trace_id, parent_id = parent_header()
    r = httpx.post(
        f"{live.base_url}/responses",
        headers={"authorization": f"Bearer {KEY.split(':', 1)[1]}", "traceparent": header},
        json={
            "model": MODEL,
            "input": f"Please look up {MARKER}.",
            "instructions": f"Be {MARKER}.",
            "tools": [WEATHER],
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert MARKER in json.dumps(body["output"])  # the marker did reach the output (tool arguments)
    assert live.gw.metrics.tracing.force_flush()

    turn = turn_of(collector.spans, body["id"])
    assert turn.trace_id.hex() == trace_id and turn.parent_span_id.hex() == parent_id
    assert turn.kind == turn.SPAN_KIND_SERVER
    a = attrs(turn)
    assert a["respgate.transport"] == "http" and a["respgate.status"] == "completed"
    assert a["gen_ai.request.model"] == MODEL and a["respgate.tenant"] == "acme"
    assert a["gen_ai.usage.input_tokens"] == body["usage"]["input_tokens"]
    assert a["gen_ai.usage.output_tokens"] == body["usage"]["output_tokens"]
    assert a["respgate.usage.cached_tokens"] == body["usage"]["input_tokens_details"]["cached_tokens"]

    t = tree(collector.spans, turn)
    assert STAGES | {"store", "engine"} <= set(t), sorted(t)
    assert {"engine/engine_ttft", "engine/streaming"} <= set(t), sorted(t)
    engine = t["engine"]
    assert engine.kind == engine.SPAN_KIND_CLIENT
    for name, span in t.items():  # every stage lies within the turn, in time
        assert turn.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
        assert span.end_time_unix_nano <= turn.end_time_unix_nano, name
    assert t["engine/engine_ttft"].end_time_unix_nano <= t["engine/streaming"].start_time_unix_nano + 1
    # the engine was handed the engine span's traceparent (for vLLM's own spans to land under it)
    assert live.engine.traceparents == [f"00-{trace_id}-{engine.span_id.hex()}-01"]
    assert collector.resources[0]["service.name"] == "respgate-test"
    check_bounded(collector)


def test_websocket_turns_are_spans_under_the_create_or_the_upgrade_traceparent(collector, make_gateway):
    live = traced(make_gateway, collector)
    upgrade, up_trace, up_span = parent_header()
    per_turn, turn_trace, turn_span = parent_header()
    auth = {"authorization": f"Bearer {KEY.split(':', 1)[1]}", "traceparent": upgrade}
    with connect(live.ws_url, additional_headers=auth) as ws:
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "store": False,
                    "tools": [WEATHER],
                    "input": f"Look up {MARKER} please.",
                }
            )
        )
        first = _terminal(ws)
        call = next(o for o in first["response"]["output"] if o["type"] == "function_call")
        assert MARKER in call["arguments"]
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "store": False,
                    "tools": [WEATHER],
                    "previous_response_id": first["response"]["id"],
                    "client_metadata": {"traceparent": per_turn, "x-codex-turn": "1"},
                    "input": [
                        {"type": "function_call_output", "call_id": call["call_id"], "output": f"{MARKER} facts: none"}
                    ],
                }
            )
        )
        second = _terminal(ws)
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "store": False,
                    "previous_response_id": "resp_missing",
                    "input": f"{MARKER} again",
                }
            )
        )
        refused = json.loads(ws.recv(timeout=30))
    assert first["type"] == second["type"] == "response.completed"
    assert refused["type"] == "error" and refused["error"]["code"] == "previous_response_not_found"
    assert live.gw.metrics.tracing.force_flush()

    one, two = turn_of(collector.spans, first["response"]["id"]), turn_of(collector.spans, second["response"]["id"])
    assert (one.trace_id.hex(), one.parent_span_id.hex()) == (up_trace, up_span)
    assert (two.trace_id.hex(), two.parent_span_id.hex()) == (turn_trace, turn_span)
    assert attrs(two)["respgate.previous_response_id"] == first["response"]["id"]
    for turn in (one, two):
        assert attrs(turn)["respgate.transport"] == "ws"
        t = tree(collector.spans, turn)
        assert STAGES | {"engine", "engine/engine_ttft", "engine/streaming"} <= set(t), sorted(t)
        assert "store" not in t  # store=false: no write awaited
    # the refused create: a turn span of its own (the upgrade's trace), status ERROR, the code only
    rejected = [
        s for s in collector.spans if s.name == tracing.TURN_SPAN and attrs(s).get("respgate.status") == "rejected"
    ]
    assert len(rejected) == 1
    assert attrs(rejected[0])["error.type"] == "previous_response_not_found"
    assert rejected[0].status.code == rejected[0].status.STATUS_CODE_ERROR
    assert rejected[0].trace_id.hex() == up_trace
    # the stages it went through (the parent lookup failed inside resolve: that lap never closed)
    assert {s.name for s in collector.spans if s.parent_span_id == rejected[0].span_id} == {"validate"}
    check_bounded(collector)


def test_a_turn_without_traceparent_starts_its_own_trace_and_ratio_zero_exports_none(collector, make_gateway):
    live = traced(make_gateway, collector)
    key = KEY.split(":", 1)[1]
    r = live.openai(api_key=key).responses.create(model=MODEL, input="hi")
    assert live.gw.metrics.tracing.force_flush()
    turn = turn_of(collector.spans, r.id)
    assert turn.parent_span_id == b""

    quiet = traced(make_gateway, collector, otel_sample_ratio=0.0)
    before = len(collector.spans)
    quiet.openai(api_key=key).responses.create(model=MODEL, input="hi")
    assert quiet.gw.metrics.tracing.force_flush()
    assert len(collector.spans) == before and quiet.engine.traceparents == [None]


class Counts:
    """Calls into the OpenTelemetry API and SDK that make or look for spans, counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import opentelemetry.sdk.trace as sdk
        import opentelemetry.trace as api
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.n: dict[str, int] = {}
        for owner, name in (
            (sdk.Tracer, "start_span"),
            (api.NoOpTracer, "start_span"),
            (api.ProxyTracer, "start_span"),
            (TraceContextTextMapPropagator, "extract"),
            (tracing.TracedTimer, "__init__"),
            (sdk.Span, "__init__"),
            (api.NonRecordingSpan, "__init__"),
        ):
            self._count(monkeypatch, owner, name)

    def _count(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        label = f"{owner.__name__}.{name}"
        self.n[label] = 0

        def counted(*args: Any, **kw: Any) -> Any:
            self.n[label] += 1
            return original(*args, **kw)

        monkeypatch.setattr(owner, name, counted)

    def total(self) -> int:
        return sum(self.n.values())


def _turns(live: Any, headers: dict[str, str]) -> None:
    """An HTTP turn, a streamed one and a WebSocket turn, each with a caller's traceparent."""
    header, _, _ = parent_header()
    client = live.openai(api_key=KEY.split(":", 1)[1])
    client.responses.create(model=MODEL, input="hi", extra_headers={"traceparent": header})
    for _ in client.responses.create(model=MODEL, input="hi", stream=True, extra_headers={"traceparent": header}):
        pass
    with connect(live.ws_url, additional_headers={**headers, "traceparent": header}) as ws:
        ws.send(
            json.dumps(
                {"type": "response.create", "model": MODEL, "input": "hi", "client_metadata": {"traceparent": header}}
            )
        )
        assert _terminal(ws)["type"] == "response.completed"


def test_with_tracing_off_no_span_object_is_made(collector, make_gateway, monkeypatch):
    counts = Counts(monkeypatch)
    auth = {"authorization": f"Bearer {KEY.split(':', 1)[1]}"}
    off = make_gateway(Settings(api_keys=[KEY]), engine=TraceparentEngine())
    assert off.gw.metrics.tracing is None
    _turns(off, auth)
    assert counts.total() == 0, counts.n
    assert off.engine.traceparents == [None, None, None]

    on = traced(make_gateway, collector)  # the same turns traced: the counters do count
    _turns(on, auth)
    assert counts.n["TracedTimer.__init__"] == 3 and counts.n["Tracer.start_span"] >= 3 * 10, counts.n
    assert all(tp is not None for tp in on.engine.traceparents)


def _terminal(ws: Any) -> dict[str, Any]:
    while True:
        ev = json.loads(ws.recv(timeout=30))
        if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return ev


def test_the_sdks_otel_variables_choose_the_endpoint_and_service_name(collector, make_gateway, monkeypatch):
    monkeypatch.setenv("RESPGATE_OTEL_TRACES", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    settings = Settings.from_env(api_keys=[KEY])
    assert settings.otel_traces and settings.otel_endpoint is None
    live = make_gateway(settings)
    r = live.openai(api_key=KEY.split(":", 1)[1]).responses.create(model=MODEL, input="hi")
    assert live.gw.metrics.tracing.force_flush()
    turn_of(collector.spans, r.id)
    assert {res["service.name"] for res in collector.resources} == {"from-env"}


def test_a_turn_whose_client_leaves_ends_cancelled_with_the_cut_as_its_own_stage(collector, make_gateway):
    live = traced(make_gateway, collector)
    live.engine.decode_tps = 20  # slow enough to leave mid-stream
    with connect(live.ws_url, additional_headers={"authorization": f"Bearer {KEY.split(':', 1)[1]}"}) as ws:
        ws.send(
            json.dumps(
                {"type": "response.create", "model": MODEL, "input": "hi", "store": False, "max_output_tokens": 400}
            )
        )
        while json.loads(ws.recv(timeout=30))["type"] != "response.output_text.delta":
            pass  # leave mid-stream
    deadline = time.monotonic() + 30
    while not (turns := [s for s in collector.spans if s.name == tracing.TURN_SPAN]):  # the turn ends after the close
        assert time.monotonic() < deadline, "the cut turn was never exported"
        assert live.gw.metrics.tracing.force_flush()
        time.sleep(0.05)
    turn = turns[0]
    assert attrs(turn)["respgate.status"] == "cancelled"
    t = tree(collector.spans, turn)
    assert "cancelled" in t and {"finalize", "billing"} <= set(t), sorted(t)
    assert "engine/engine_ttft" in t and "engine/streaming" not in t  # cut before the last token


def test_each_mcp_call_is_a_span_under_its_turn(collector, make_gateway):
    """A call the gateway ran for the model: a ``tool_call`` span under the turn span, in time
    within it, naming the tool type, server (``request``: a URL the request gave) and tool, never
    its arguments, output or credentials; the turn's ``tools`` stage holds it."""
    from tests.mcp_servers.running import running_app
    from tests.mcp_servers.tools_server import ToolsServer

    server = ToolsServer()
    with running_app(server.app()) as base:
        live = traced(
            make_gateway,
            collector,
            mcp_allowed_urls={"*": ["http://127.0.0.1:"]},
            outbound_allow_networks=["127.0.0.1/32"],
        )
        tool = {
            "type": "mcp",
            "server_label": "tools",
            "server_url": base + "/mcp",
            "require_approval": "never",
            "allowed_tools": ["echo"],
            "headers": {"X-Api-Key": KEY},
        }
        r = httpx.post(
            f"{live.base_url}/responses",
            headers={"authorization": f"Bearer {KEY.split(':', 1)[1]}"},
            json={"model": MODEL, "input": f"Please echo {MARKER}.", "tools": [tool]},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert server.calls["echo"] == 1
        assert live.gw.metrics.tracing.force_flush()
    turn = turn_of(collector.spans, body["id"])
    t = tree(collector.spans, turn)
    call = t["tool_call"]
    assert attrs(call) == {
        "respgate.tool.type": "mcp",
        "respgate.tool.server": "request",
        "respgate.tool.name": "echo",
        "respgate.tool.output_bytes": len(next(it for it in body["output"] if it["type"] == "mcp_call")["output"]),
    }
    assert turn.start_time_unix_nano <= call.start_time_unix_nano <= call.end_time_unix_nano <= turn.end_time_unix_nano
    assert "tools" in t  # the stage between the engine passes
    check_bounded(collector)
