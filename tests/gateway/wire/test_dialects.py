"""The two event dialects (``gateway.wire.dialects``; issue 31 item 2), from the outside.

The same streaming conversation — a reasoning model, a function tool, a ``generate: false``
warm-up, continuations by ``previous_response_id``, a reasoning summary — runs over SSE and over
WebSocket in OpenAI's dialect and in OpenResponses', and every event is validated against the
matching schema: OpenAI's against the openai SDK's types (``ResponseStreamEvent``, and on WebSocket
``ResponsesServerEvent``), OpenResponses' against the document in ``tests/schemas/`` *strictly* —
the event's own ``type`` must be one the document lists (``OpenResponses.event_errors(strict=True)``),
no renamed fallback. Then: each way of choosing the dialect chooses it, an unknown value is a 400,
the default stream is unchanged, a background stream's log is read in each reader's dialect, and
error events and frames are translated.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from gateway.base.settings import Settings
from gateway.sessions.background import OWNER_LOST_MESSAGE
from gateway.sessions.replay import _truncated
from gateway.wire.dialects import (
    OPENRESPONSES_EVENT_TYPES,
    EventDialect,
    asked_dialect,
    served_dialect,
    translate,
    translate_encoded,
)
from gateway.wire.errors import ApiError, bad_request, server_error, shutting_down, store_unavailable
from tests.conftest import MODEL, LiveGateway
from tests.gateway.wire.test_schemas import ws_turn as schema_ws_turn
from tests.http_helpers import parse_sse
from tests.schema_check import OpenResponses, sdk_check_event

pytestmark = pytest.mark.timeout(120)

OR = OpenResponses()
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
OR_HEADER = {"OpenResponses-Version": "latest"}
DONE = b"data: [DONE]\n\n"


# -- reading and checking streams ------------------------------------------------------------------


def parse_stream(raw: bytes, dialect: EventDialect) -> list[dict[str, Any]]:
    """An SSE body in ``dialect``: OpenResponses' ends with exactly one ``data: [DONE]`` frame after
    the terminal event, OpenAI's never has one (``parse_sse`` asserts that)."""
    if dialect is EventDialect.OPENRESPONSES:
        assert raw.endswith(b"\n\n" + DONE) and raw.count(b"[DONE]") == 1, raw[-200:]
        raw = raw[: -len(DONE)]
    return parse_sse(raw)


def check(events: list[dict[str, Any]], dialect: EventDialect, *, ws: bool) -> None:
    """Every event against the schema of its dialect."""
    gaps = sum(OR.gaps.values())
    for ev in events:
        if dialect is EventDialect.OPENAI:
            problems = sdk_check_event(ev, ws=ws)
        else:
            problems = OR.event_errors(ev, ws=ws, strict=True)
        assert not problems, f"{dialect} {'ws' if ws else 'sse'} {ev['type']} #{ev.get('sequence_number')}: {problems}"
    # nothing was left unchecked: every event (and item, and tool) had a schema in the document
    assert sum(OR.gaps.values()) == gaps or dialect is EventDialect.OPENAI, dict(OR.gaps)


def sse(live: LiveGateway, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    with httpx.stream(
        "POST", live.base_url + "/responses", json={"model": MODEL, **body, "stream": True}, headers=headers, timeout=30
    ) as r:
        raw = r.read()
    assert r.status_code == 200, raw[:500]
    return raw


def ws_connect(live: LiveGateway, headers: dict[str, str] | None = None, query: str = "") -> ClientConnection:
    return connect(live.ws_url + query, open_timeout=10, max_size=None, additional_headers=headers or {})


def ws_turn(ws: ClientConnection, body: dict[str, Any]) -> list[dict[str, Any]]:
    """One create on ``ws`` (the schema tests' driver), the model defaulted; its events."""
    return schema_ws_turn(ws, {"model": MODEL, **body})


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def in_openresponses(openai_types: list[str]) -> list[str]:
    return [OPENRESPONSES_EVENT_TYPES.get(t, t) for t in openai_types]


# -- the conversation --------------------------------------------------------------------------------

#: (the create's body, given the previous response) for each turn; the simulated gpt-oss engine's
#: default script reasons, calls the first tool after a user message and reports a tool's output
CONVERSATION = [
    lambda prev: {
        "generate": False,
        "instructions": "You answer weather questions.",
        "tools": [WEATHER],
        "input": [{"type": "message", "role": "developer", "content": "Be brief."}],
    },
    lambda prev: {
        **({"previous_response_id": prev["id"]} if prev else {"instructions": "You answer weather questions."}),
        "tools": [WEATHER],
        "input": "Weather in Paris?",
    },
    lambda prev: {
        "previous_response_id": prev["id"],
        "tools": [WEATHER],
        "input": [
            {
                "type": "function_call_output",
                "call_id": next(o for o in prev["output"] if o["type"] == "function_call")["call_id"],
                "output": '{"sky": "clear", "celsius": 21}',
            }
        ],
    },
    lambda prev: {
        "previous_response_id": prev["id"],
        "tools": [WEATHER],
        "reasoning": {"summary": "auto"},
        "input": "And what should I wear?",
    },
]


def converse_sse(live: LiveGateway, dialect: EventDialect, headers: dict[str, str]) -> list[list[dict[str, Any]]]:
    turns: list[list[dict[str, Any]]] = []
    prev: dict[str, Any] = {}
    for body in CONVERSATION[1:]:  # ``generate: false`` is WebSocket mode's (HTTP: unknown_parameter)
        events = parse_stream(sse(live, body(prev), headers), dialect)
        check(events, dialect, ws=False)
        assert events[-1]["type"] == "response.completed", events[-1]
        prev = events[-1]["response"]
        turns.append(events)
    return turns


def converse_ws(live: LiveGateway, dialect: EventDialect, headers: dict[str, str]) -> list[list[dict[str, Any]]]:
    turns: list[list[dict[str, Any]]] = []
    prev: dict[str, Any] = {}
    with ws_connect(live, headers) as ws:
        for body in CONVERSATION:
            events = ws_turn(ws, {**body(prev), "store": False})  # continued from the connection's cache
            check(events, dialect, ws=True)
            assert events[-1]["type"] == "response.completed", events[-1]
            prev = events[-1]["response"]
            turns.append(events)
    return turns


def test_the_same_conversation_in_both_dialects_every_event_validated(make_gateway):
    live = make_gateway()
    runs = {
        (dialect, transport): converse(live, dialect, headers)
        for dialect, headers in ((EventDialect.OPENAI, {}), (EventDialect.OPENRESPONSES, OR_HEADER))
        for transport, converse in (("sse", converse_sse), ("ws", converse_ws))
    }
    for transport in ("sse", "ws"):
        ours, theirs = runs[EventDialect.OPENAI, transport], runs[EventDialect.OPENRESPONSES, transport]
        # the same events, one for one, each under its dialect's name
        assert [in_openresponses(types(t)) for t in ours] == [types(t) for t in theirs]
        assert len(ours) == (4 if transport == "ws" else 3)
        flat = [t for turn in ours for t in types(turn)]
        assert {"response.reasoning_text.delta", "response.reasoning_text.done"} <= set(flat)
        assert {"response.function_call_arguments.delta", "response.reasoning_summary_text.delta"} <= set(flat)
        their_flat = {t for turn in theirs for t in types(turn)}
        assert {"response.reasoning.delta", "response.reasoning.done"} <= their_flat
        assert not their_flat & set(OPENRESPONSES_EVENT_TYPES)
    # the warm-up streamed its lifecycle, and nothing of a generation
    assert types(runs[EventDialect.OPENRESPONSES, "ws"][0]) == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]


# -- choosing the dialect -------------------------------------------------------------------------

#: a reasoning turn: its raw reasoning is the one event the dialects name differently
REASON = {"input": "Why is the sky blue?"}


def reasoning_names(live: LiveGateway, headers: dict[str, str] | None = None, query: str = "") -> set[str]:
    """The raw-reasoning event names of one SSE and one WebSocket turn (they must agree)."""
    raw = sse(live, REASON, headers)
    sse_names = {e["type"] for e in parse_sse(raw.removesuffix(DONE)) if ".reasoning" in e["type"]}
    assert raw.endswith(DONE) == ("response.reasoning.delta" in sse_names)
    with ws_connect(live, headers, query) as ws:
        ws_names = {e["type"] for e in ws_turn(ws, REASON) if ".reasoning" in e["type"]}
    assert sse_names == ws_names
    return sse_names


OURS = {"response.reasoning_text.delta", "response.reasoning_text.done"}
THEIRS = {"response.reasoning.delta", "response.reasoning.done"}


@pytest.mark.parametrize(
    ("settings", "headers", "expected"),
    [
        ({}, {}, OURS),
        ({}, {"OpenResponses-Version": "latest"}, THEIRS),
        ({}, {"OpenResponses-Version": "2026-04-24"}, THEIRS),
        ({}, {"Respgate-Event-Dialect": "openresponses"}, THEIRS),
        ({}, {"Respgate-Event-Dialect": "OpenAI"}, OURS),
        ({"event_dialect": "openresponses"}, {}, THEIRS),
        ({"model_event_dialects": {MODEL: "openresponses"}}, {}, THEIRS),
        ({"model_event_dialects": {"another-model": "openresponses"}}, {}, OURS),
        # the explicit header wins over the operator's setting and over OpenResponses-Version
        ({"event_dialect": "openresponses"}, {"Respgate-Event-Dialect": "openai"}, OURS),
        ({}, {"Respgate-Event-Dialect": "openai", "OpenResponses-Version": "latest"}, OURS),
    ],
    ids=[
        "default",
        "or-version-latest",
        "or-version-date",
        "respgate-header",
        "respgate-header-openai",
        "operator-default",
        "operator-model",
        "operator-other-model",
        "header-over-operator",
        "explicit-over-or-version",
    ],
)
def test_each_way_of_choosing_the_dialect(make_gateway, settings, headers, expected):
    live = make_gateway(Settings(**settings))
    assert reasoning_names(live, headers) == expected


def test_a_browser_chooses_by_the_websocket_query(make_gateway):
    live = make_gateway()
    with ws_connect(live, query="?event_dialect=openresponses") as ws:
        assert {e["type"] for e in ws_turn(ws, REASON) if ".reasoning" in e["type"]} == THEIRS


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"OpenResponses-Version": "2099-01-01"}, "OpenResponses-Version"),
        ({"OpenResponses-Version": ""}, "OpenResponses-Version"),
        ({"Respgate-Event-Dialect": "anthropic"}, "Respgate-Event-Dialect"),
    ],
)
def test_an_unknown_value_is_a_400_naming_the_header(make_gateway, headers, param):
    live = make_gateway()
    r = httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "hi", "stream": True}, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_value", param)
    assert list(headers.values())[0][:10] in err["message"] or not list(headers.values())[0]
    # the WebSocket upgrade is refused before the 101, with the same answer
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(live, headers)
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body)["error"]["param"] == param
    with pytest.raises(InvalidStatus):
        ws_connect(live, query="?event_dialect=nope")
    # and so is a stream's replay
    created = httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "hi", "background": True})
    assert created.status_code == 200, created.text
    got = httpx.get(f"{live.base_url}/responses/{created.json()['id']}?stream=true", headers=headers)
    assert got.status_code == 400 and got.json()["error"]["param"] == param


# -- the default is unchanged -----------------------------------------------------------------------

#: what differs between two runs of the same turn: ids, clocks, and the prefix cache's hits
_VOLATILE = re.compile(rb'"(?:(?:resp|rs|msg|fc|call)_[0-9A-Za-z]+)"|"(?:created_at|completed_at|cached_tokens)":\d+')


def normalized(raw: bytes) -> bytes:
    return _VOLATILE.sub(b'"*"', raw)


def test_the_default_stream_is_byte_for_byte_openais(make_gateway):
    """With nothing chosen, the stream's bytes — ids and clocks aside — are those a client asking for
    OpenAI's dialect explicitly gets, and those of OpenResponses' stream with the translation undone
    (``Pipeline.run``/``batches`` hand out the runner's own generators then: no layer in between)."""
    live = make_gateway()
    default = sse(live, REASON)
    explicit = sse(live, REASON, {"Respgate-Event-Dialect": "openai"})
    theirs = sse(live, REASON, OR_HEADER)
    assert b"[DONE]" not in default and parse_sse(default)
    assert normalized(default) == normalized(explicit)
    undone = theirs.removesuffix(DONE)
    for ours, their in OPENRESPONSES_EVENT_TYPES.items():
        undone = undone.replace(their.encode(), ours.encode())
    assert normalized(default) == normalized(undone)
    assert normalized(default) != normalized(theirs)


# -- background streams: logged in OpenAI's dialect, read in the reader's -----------------------------


@pytest.mark.parametrize("log", ["memory", "redis"])
def test_a_background_stream_is_read_in_each_readers_dialect(make_gateway, request, log):
    """The event log (this process's, or Redis's) keeps OpenAI's dialect; the create's stream and
    each replay come out in the dialect their reader asked for."""
    live = make_gateway(Settings(redis_url=request.getfixturevalue("redis_url")) if log == "redis" else None)
    body = {"model": MODEL, "input": "Why is the sky blue?", "background": True, "stream": True}
    with httpx.stream("POST", live.base_url + "/responses", json=body, headers=OR_HEADER, timeout=30) as r:
        created_raw = r.read()
    assert r.status_code == 200, created_raw[:300]
    created = parse_stream(created_raw, EventDialect.OPENRESPONSES)
    check(created, EventDialect.OPENRESPONSES, ws=False)
    assert "response.reasoning.delta" in types(created) and "response.queued" in types(created)
    rid = created[0]["response"]["id"]

    def replay(headers: dict[str, str]) -> bytes:
        r = httpx.get(f"{live.base_url}/responses/{rid}?stream=true&starting_after=1", headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        return r.content

    ours = parse_stream(replay({}), EventDialect.OPENAI)
    check(ours, EventDialect.OPENAI, ws=False)
    theirs = parse_stream(replay(OR_HEADER), EventDialect.OPENRESPONSES)
    check(theirs, EventDialect.OPENRESPONSES, ws=False)
    assert in_openresponses(types(ours)) == types(theirs) == types(created)[2:]


# -- errors ---------------------------------------------------------------------------------------

#: creates refused before their response exists: WebSocket ``error`` frames (the last has no code)
BAD = [
    {"input": "hi", "previous_response_id": "resp_missing"},
    {"input": "hi", "temperature": 9},
    {"input": "hi", "no_such_field": 1},
    {"model": "no-such-model", "input": "hi"},
    {"input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}]},
]


def test_websocket_error_frames_in_both_dialects(make_gateway):
    live = make_gateway()
    codes = {}
    for dialect, headers in ((EventDialect.OPENAI, {}), (EventDialect.OPENRESPONSES, OR_HEADER)):
        with ws_connect(live, headers) as ws:
            frames = [ws_turn(ws, body) for body in BAD]
            ws.send("not json")
            frames.append([json.loads(ws.recv(timeout=20))])
        for events in frames:
            assert types(events) == ["error"], events
            check(events, dialect, ws=True)
        codes[dialect] = [f[0]["error"]["code"] for f in frames]
    # a code-less error (OpenAI sends null) gets its type as its code, which OpenResponses requires
    assert codes[EventDialect.OPENAI][4] is None
    assert codes[EventDialect.OPENRESPONSES][4] == "invalid_request_error"
    assert codes[EventDialect.OPENAI][:4] == codes[EventDialect.OPENRESPONSES][:4]


@pytest.mark.parametrize(
    "err",
    [
        server_error(),
        shutting_down(),
        store_unavailable(),
        _truncated("resp_x", 7),
        ApiError(500, OWNER_LOST_MESSAGE, type="server_error", code="server_error"),
        bad_request("no code"),
    ],
    ids=["server_error", "shutting_down", "store_unavailable", "truncated", "owner_lost", "no_code"],
)
def test_sse_error_events_are_nested_with_their_type(err):
    """Every error event a stream of ours can carry (``ApiError.sse_event``: faults, the shutdown,
    a replay's truncation or store outage, a lost owner): flat in OpenAI's dialect (the SDK's
    ``ResponseErrorEvent``), nested in OpenResponses' (``ErrorStreamingEvent``) with the error's own
    type, which the flat event does not carry — live and from a log alike."""
    flat = err.sse_event(5)
    assert not sdk_check_event(flat)
    nested = translate(flat)
    assert not OR.event_errors(nested, strict=True), OR.event_errors(nested, strict=True)
    assert nested["error"] == {"type": err.type, "code": err.code, "message": err.message, "param": err.param}
    assert nested["sequence_number"] == 5
    kind, data = translate_encoded("error", json.dumps(flat).encode(), EventDialect.OPENRESPONSES)
    assert (kind, json.loads(data)) == ("error", nested)
    assert translate_encoded("error", b"{}", EventDialect.OPENAI) == ("error", b"{}")


# -- the table and the choice, as values ---------------------------------------------------------------


def test_the_table_names_only_events_the_document_lists_and_the_sdk_does_not():
    from tests.schema_check import SDK_EVENTS

    for ours, theirs in OPENRESPONSES_EVENT_TYPES.items():
        assert ours in SDK_EVENTS and ours not in OR.event_schemas
        assert theirs in OR.event_schemas and theirs not in SDK_EVENTS
        # same fields: the document's required ones are the SDK event's fields
        required = set(OR.schemas[OR.event_schemas[theirs]]["required"])
        assert required <= set(SDK_EVENTS[ours].model_fields)


def test_an_event_that_needs_no_change_is_not_copied():
    ev = {"type": "response.output_text.delta", "sequence_number": 3, "delta": "x"}
    assert translate(ev) is ev
    renamed = translate({"type": "response.reasoning_text.delta", "sequence_number": 4, "delta": "y"})
    assert list(renamed) == ["type", "sequence_number", "delta"] and renamed["type"] == "response.reasoning.delta"


def test_choice_precedence_as_values():
    s = Settings(event_dialect="openresponses", model_event_dialects={"m": "openai"})
    assert served_dialect(s, None, "m") is EventDialect.OPENAI
    assert served_dialect(s, None, "other") is EventDialect.OPENRESPONSES
    assert served_dialect(s, EventDialect.OPENAI, "other") is EventDialect.OPENAI
    assert asked_dialect({}) is None
    assert asked_dialect({"openresponses-version": "2026-01-15"}) is EventDialect.OPENRESPONSES
    assert asked_dialect({}, {"event_dialect": "openresponses"}) is EventDialect.OPENRESPONSES
    with pytest.raises(ApiError) as bad:
        asked_dialect({"openresponses-version": "v2" * 100})
    assert bad.value.status == 400 and len(bad.value.message) < 300  # a long value is not echoed whole
