"""Tool lists checked once per tenant and exact JSON (``gateway.turn.checks.ToolChecks``).

A turn whose tools are byte-identical to an earlier turn's takes that turn's checked tools instead
of validating them again. What must not change: the request, the tools and every refusal are what
a fresh check gives; tools that differ in any byte (``1`` / ``1.0`` / ``true``, key order) are
checked as new; a failed check is never kept; another tenant's entries are never read; and the
shared tools are never changed by the turns that use them.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from gateway.transport.services import GatewayState
from gateway.turn.checks import ToolChecks
from gateway.turn.resolve import Resolver
from gateway.wire.errors import ApiError
from gateway.wire.response import echoed_tool
from tests.conftest import MODEL, LiveGateway
from tests.gateway.turn.test_custom_tool_grammar import CODEX_TOOLS, codex_tools
from tests.ws_helpers import create, send, until_terminal, ws_open


def _body(tools: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    # a parsed frame: fresh objects each turn, as the transport hands them over
    return orjson.loads(
        orjson.dumps(
            {
                "type": "response.create",
                "model": MODEL,
                "store": False,
                "input": [{"role": "user", "content": "hi"}],
                "tools": tools,
                **kw,
            }
        )
    )


def _fresh(resolver: Resolver, hosted: str = "strip") -> Resolver:
    resolver.tool_checks = ToolChecks(hosted)  # type: ignore[arg-type]
    return resolver


def _validated(resolver: Resolver, body: dict[str, Any], tenant: str | None = None) -> tuple[Any, ...]:
    req, raw_items, route, checked, _ = resolver._validate(body, "ws", tenant)
    dumped = [r.model_dump() if hasattr(r, "model_dump") else r for r in raw_items]
    return req.model_dump(), dumped, route.name, checked.tools


def _tool_lists(rng: random.Random) -> list[list[dict[str, Any]]]:
    """Codex's tools (hosted ones included), shuffled, cut, and with a changed description or default."""
    out = []
    for _ in range(25):
        tools = list(copy.deepcopy(CODEX_TOOLS))
        rng.shuffle(tools)
        tools = tools[: rng.randint(1, len(tools))]
        t = rng.choice(tools)
        if rng.random() < 0.5 and t["type"] == "function":
            t["description"] = f"variant {rng.randint(0, 3)}"
        out.append(tools)
    return out


def test_a_known_tool_list_checks_as_a_fresh_one(gw: GatewayState):
    """Second sight of a tool list: the same request, items, route and tools as the first check
    gave, and the tools are the first check's own objects."""
    resolver = _fresh(gw.pipeline.resolver)
    rng = random.Random(11)
    for tools in _tool_lists(rng):
        choice = rng.choice(["auto", "none", "required", None])
        kw = {"tool_choice": choice} if choice else {}
        first = _validated(resolver, _body(tools, **kw))
        hits = resolver.tool_checks.lru.hits
        second = _validated(resolver, _body(tools, **kw))
        assert resolver.tool_checks.lru.hits == hits + 1
        assert second == first
        assert second[3] is first[3]  # the same tuple: nothing rebuilt
        assert first[3] == _validated(_fresh(_other_resolver(gw)), _body(tools))[3]


def _other_resolver(gw: GatewayState) -> Resolver:
    """Another resolver on the same registry (its own, empty tool checks)."""
    p = gw.pipeline
    return Resolver(p.registry, p.resolver.store, p.metrics, p.resolver.sealer, p.compactor, p.finalizer.wait_for)


def test_tools_that_differ_in_any_byte_are_checked_as_new(gw: GatewayState):
    """``1``, ``1.0`` and ``true`` are equal to Python's ``==``, and so are two key orders; their JSON
    is not, and each list is checked and echoed as it was sent."""
    resolver = _fresh(gw.pipeline.resolver)

    def tool(default: Any, flip: bool = False) -> list[dict[str, Any]]:
        props = {"n": {"type": "integer", "default": default}}
        params = {"properties": props, "type": "object"} if flip else {"type": "object", "properties": props}
        return [{"type": "function", "name": "count", "parameters": params}]

    lists = [tool(1), tool(1.0), tool(True), tool(1, flip=True)]
    assert all(t == lists[0] for t in lists)  # what == would have kept as one entry
    seen = []
    for tools in lists:
        misses = resolver.tool_checks.lru.misses
        _, _, _, checked = _validated(resolver, _body(tools))
        assert resolver.tool_checks.lru.misses == misses + 1
        assert orjson.dumps(checked[0]["parameters"]) == orjson.dumps(tools[0]["parameters"])
        seen.append(checked)
    assert len(resolver.tool_checks.lru) == 4
    for tools, checked in zip(lists, seen):  # and each is found again under its own bytes
        assert _validated(resolver, _body(tools))[3] is checked


def test_a_failed_check_is_never_kept_and_tool_choice_is_checked_every_turn(gw: GatewayState):
    resolver = _fresh(gw.pipeline.resolver)
    async_tool = [{"type": "function", "name": "later", "async": True, "parameters": {"type": "object"}}]
    bad_name = [{"type": "function", "name": "no spaces allowed"}]
    for tools, param in ((async_tool, "tools[0].async"), (bad_name, "tools[0].name")):
        for _ in range(2):
            with pytest.raises(ApiError) as caught:
                _validated(resolver, _body(tools))
            assert caught.value.param == param
    assert len(resolver.tool_checks.lru) == 0
    tools = codex_tools()
    _validated(resolver, _body(tools, tool_choice={"type": "function", "name": tools[0]["name"]}))
    with pytest.raises(ApiError) as caught:  # known tools, a tool_choice naming none of them
        _validated(resolver, _body(tools, tool_choice={"type": "function", "name": "absent"}))
    assert caught.value.param == "tool_choice" and resolver.tool_checks.lru.hits == 1


def test_hosted_tools_refused_by_policy_are_refused_every_time(gw: GatewayState):
    resolver = _fresh(_other_resolver(gw), hosted="reject")
    for _ in range(2):
        with pytest.raises(ApiError) as caught:
            _validated(resolver, _body(list(CODEX_TOOLS)))
        assert caught.value.code == "unsupported_value"
    assert len(resolver.tool_checks.lru) == 0


def test_another_tenants_tools_are_never_read(gw: GatewayState):
    resolver = _fresh(gw.pipeline.resolver)
    tools = codex_tools()
    a = _validated(resolver, _body(tools), tenant="a")
    b = _validated(resolver, _body(tools), tenant="b")
    assert resolver.tool_checks.lru.hits == 0 and len(resolver.tool_checks.lru) == 2
    assert a == b and a[3] is not b[3]


def test_a_tenant_flooding_tool_lists_does_not_evict_another_tenants(gw: GatewayState):
    """64 entries in all: a tenant sending a new tool list every turn takes the room nobody uses and
    then churns its own entries, so another tenant's checked tools (within its share) stay found."""
    resolver = _fresh(gw.pipeline.resolver)
    victim = [
        [dict(t, description=f"victim {i}") if t["type"] == "function" else t for t in codex_tools()] for i in range(8)
    ]
    for tools in victim:
        _validated(resolver, _body(tools), tenant="victim")
    for i in range(300):
        _validated(
            resolver,
            _body([{"type": "function", "name": f"f{i}", "parameters": {"type": "object"}}]),
            tenant="attacker",
        )
    assert resolver.tool_checks.lru.part_usage("attacker")[0] == 64 - len(victim)  # the room nobody used
    hits = resolver.tool_checks.lru.hits
    for tools in victim:
        _validated(resolver, _body(tools), tenant="victim")
    assert resolver.tool_checks.lru.hits == hits + len(victim)


def test_turns_that_share_checked_tools_leave_them_as_checked(gateway: LiveGateway):
    """A WebSocket chain re-sending Codex's tools: every turn after the first takes the checked
    tools, every frame echoes them as sent, and after the turns (rendered, parsed, echoed, stored)
    the shared tools still equal a fresh check of the same JSON."""
    resolver = _fresh(gateway.gw.pipeline.resolver)
    tools = codex_tools()
    prev = None
    with ws_open(gateway) as ws:
        for i in range(4):
            extra = {"previous_response_id": prev} if prev else {}
            send(ws, create(input=f"turn {i}", tools=tools, tool_choice="none", store=False, **extra))
            frames = until_terminal(ws)
            assert frames[-1]["type"] == "response.completed"
            for f in frames:
                if f["type"] in ("response.created", "response.in_progress", "response.completed"):
                    assert f["response"]["tools"] == [echoed_tool(t) for t in tools]
            prev = frames[-1]["response"]["id"]
    assert resolver.tool_checks.lru.hits == 3
    (shared,) = list(resolver.tool_checks.lru.values())
    assert shared.tools == _validated(_fresh(_other_resolver(gateway.gw)), _body(tools))[3]


def _nested(depth: int) -> Any:
    value: Any = {"type": "string"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"x": value}}
    return value


def test_the_bounds_checks_skip_only_tools_that_passed_them(gw: GatewayState):
    """A frame's depth and schema-size checks leave out tools this tenant offered and passed
    before (``ToolChecks.known_for``): never tools that differ by a byte, another tenant's, or a
    list that failed; and the rest of the frame is still checked."""
    from gateway.wire.validation import InputRejected, check_counts, decode_json

    resolver = _fresh(gw.pipeline.resolver)
    checks = resolver.tool_checks
    limit = gw.settings.max_json_depth
    tools = codex_tools()
    assert not checks.known_for("a")(orjson.loads(orjson.dumps(tools)))
    _validated(resolver, _body(tools), tenant="a")
    assert checks.known_for("a")(orjson.loads(orjson.dumps(tools)))
    assert not checks.known_for("b")(orjson.loads(orjson.dumps(tools)))
    assert not checks.known_for("a")(orjson.loads(orjson.dumps(tools[:-1])))
    assert checks.lru.hits == 0  # asking is not a use

    deep_tool = [{"type": "function", "name": "deep", "parameters": _nested(limit)}]
    for tenant in ("a", "b"):
        for _ in range(2):  # refused, so never known: refused again
            raw = orjson.dumps(_body(deep_tool))
            with pytest.raises(InputRejected) as caught:
                decode_json(raw, limit, checks.known_for(tenant))
            assert caught.value.param == "tools"
    raw = orjson.dumps(
        _body(
            tools, metadata={"k": "v"}, text={"format": {"type": "json_schema", "name": "o", "schema": _nested(limit)}}
        )
    )
    with pytest.raises(InputRejected) as caught:  # known tools, a deep schema elsewhere
        decode_json(raw, limit, checks.known_for("a"))
    assert caught.value.param == "text"
    big = _body(tools, text={"format": {"type": "json_schema", "name": "o", "schema": {"description": "x" * 70_000}}})
    with pytest.raises(InputRejected) as caught:
        check_counts(big, max_items=100, max_tools=128, max_schema_bytes=65_536, known_tools=checks.known_for("a"))
    assert caught.value.param == "text.format.schema"


def test_the_known_answer_is_serialized_once_per_frame(gw: GatewayState, monkeypatch: pytest.MonkeyPatch):
    resolver = _fresh(gw.pipeline.resolver)
    tools = codex_tools()
    _validated(resolver, _body(tools))
    calls = []
    real = ToolChecks.key
    monkeypatch.setattr(ToolChecks, "key", staticmethod(lambda body: calls.append(1) or real(body)))
    known = resolver.tool_checks.known_for(None)
    frame = _body(tools)
    assert known(frame["tools"]) and known(frame["tools"]) and len(calls) == 1
    assert not known(frame["tools"][:-1]) and len(calls) == 2


def test_a_deep_frame_after_known_tools_is_refused_over_the_socket(gateway: LiveGateway):
    tools = codex_tools()
    limit = gateway.gw.settings.max_json_depth
    with ws_open(gateway) as ws:
        send(ws, create(input="hi", tools=tools, tool_choice="none", store=False))
        prev = until_terminal(ws)[-1]["response"]["id"]
        send(
            ws,
            create(
                input="again",
                tools=tools,
                tool_choice="none",
                store=False,
                previous_response_id=prev,
                metadata=None,
                text={"format": {"type": "json_schema", "name": "o", "schema": _nested(limit)}},
            ),
        )
        err = until_terminal(ws)[-1]
        assert err["type"] == "error" and err["error"]["param"] == "text", err
        deeper = [dict(tools[0], parameters=_nested(limit))] + tools[1:]
        send(ws, create(input="again", tools=deeper, tool_choice="none", store=False, previous_response_id=prev))
        err = until_terminal(ws)[-1]
        assert err["type"] == "error" and err["error"]["param"] == "tools", err


def test_known_tools_are_not_walked_again(gw: GatewayState, monkeypatch: pytest.MonkeyPatch):
    from gateway.wire import validation

    resolver = _fresh(gw.pipeline.resolver)
    tools = codex_tools()
    walked: list[set[str]] = []  # the top-level parameters each walk starts from
    real = validation._check_depth_of
    monkeypatch.setattr(
        validation,
        "_check_depth_of",
        lambda stack, limit: walked.append({top or "<body>" for _, _, top in stack}) or real(stack, limit),
    )
    raw = orjson.dumps(_body(tools))
    limit = gw.settings.max_json_depth
    validation.decode_json(raw, limit, resolver.tool_checks.known_for(None))
    assert walked[-1] == {"<body>"}  # not known yet: walked whole, tools included
    _validated(resolver, _body(tools))
    validation.decode_json(raw, limit, resolver.tool_checks.known_for(None))
    assert "input" in walked[-1] and "tools" not in walked[-1]  # known: the rest is walked, the tools are not
