"""Hostile inputs of issue 28 (items 11, 12, 13 and 15), each over real uvicorn.

* 11 — an orphan tool output (its call absent) is refused as a conversation item, as it is as a
  create's ``input``; a conversation that holds one anyway (stored before the check, or its call
  deleted through the API) still serves turns, on both stores and both transports.
* 12 — a body that is JSON but not an object is a 400 on every JSON endpoint whatever its size
  (a long one used to reach the inline-or-pool weighing, which assumed an object: a 500).
* 13 — ``tool_choice.type`` must be a known string (an object or list there was unhashable: a 500;
  an unknown string was accepted).
* 15 — one unexpected fault repeated a thousand times is a bounded number of log lines.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.base.log_limit import FaultLogLimit, LineBudget
from gateway.base.settings import Settings
from gateway.wire.items import new_id
from inference.simulated_prompt import PromptView
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import assert_error, assert_still_serving, post
from tests.ws_helpers import create as ws_create
from tests.ws_helpers import recv, send, until_terminal, ws_open

pytestmark = pytest.mark.timeout(300)

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]


def call(call_id: str, kind: str = "function_call") -> dict[str, Any]:
    if kind == "custom_tool_call":
        return {"type": kind, "call_id": call_id, "name": "get_weather", "input": "x"}
    return {"type": kind, "call_id": call_id, "name": "get_weather", "arguments": "{}"}


def output(call_id: str, kind: str = "function_call_output", text: str = "sunny") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": text}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def req(live: LiveGateway, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, live.base_url + path, json=body, timeout=30)


@pytest.fixture(params=["memory", "redis"])
def store_gateway(request, make_gateway, tmp_path) -> LiveGateway:
    """A gateway on each conversation store."""
    if request.param == "memory":
        return make_gateway()
    url = request.getfixturevalue("redis_url")
    return make_gateway(Settings(redis_url=url, usage_journal=str(tmp_path / "journal")))


def stored(live: LiveGateway, conversation_id: str) -> list[dict[str, Any]]:
    store = live.gw.pipeline.conversations.store
    return live.call(store.items(conversation_id, None))[1]


def http_turn(live: LiveGateway, conversation_id: str) -> dict[str, Any]:
    r = post(live, {"model": MODEL, "input": "and now?", "conversation": conversation_id})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed", r.text
    return r.json()


def ws_turn(live: LiveGateway, conversation_id: str) -> dict[str, Any]:
    with ws_open(live) as ws:
        send(ws, ws_create(input="and now?", conversation=conversation_id))
        frames = until_terminal(ws)
    assert frames[-1]["type"] == "response.completed", frames[-1]
    return frames[-1]["response"]


def last_prompt(live: LiveGateway) -> str:
    return "\n".join(m.text for m in PromptView(live.engine.stats.prompts[-1]).messages())


# ---------------------------------------------------------------------------------------------
# 11: orphan tool outputs in conversations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["function_call_output", "custom_tool_call_output"])
def test_an_orphan_output_is_refused_when_a_conversation_is_created(store_gateway, kind):
    live = store_gateway
    r = req(live, "POST", "/conversations", {"items": [output("call_orphan", kind)]})
    err = assert_error(r, 400, param="items[0]")
    assert "call_orphan" in err["message"]
    # an output before its call is an orphan too (renderers look calls up among earlier items)
    call_kind = kind.replace("_output", "")
    r = req(live, "POST", "/conversations", {"items": [user("hi"), output("c1", kind), call("c1", call_kind)]})
    assert_error(r, 400, param="items[1]")
    # the same as a create's input: refused there too (as it always was)
    assert_error(post(live, {"model": MODEL, "input": [output("call_orphan", kind)]}), 400)
    # a call with its output is a conversation, and turns on it work
    r = req(live, "POST", "/conversations", {"items": [user("hi"), call("c1", call_kind), output("c1", kind)]})
    assert r.status_code == 200, r.text
    http_turn(live, r.json()["id"])
    ws_turn(live, r.json()["id"])


def test_an_orphan_output_is_refused_when_items_are_added(store_gateway):
    live = store_gateway
    conv = req(live, "POST", "/conversations", {"items": [user("hi"), call("c_open")]}).json()["id"]
    before = stored(live, conv)
    r = req(live, "POST", f"/conversations/{conv}/items", {"items": [user("x"), output("c_nowhere")]})
    err = assert_error(r, 400, param="items[1]")
    assert "c_nowhere" in err["message"]
    assert stored(live, conv) == before  # nothing was added
    # an output answering a call the conversation holds, or one among the same items, is fine
    r = req(live, "POST", f"/conversations/{conv}/items", {"items": [output("c_open")]})
    assert r.status_code == 200, r.text
    r = req(live, "POST", f"/conversations/{conv}/items", {"items": [call("c2"), output("c2")]})
    assert r.status_code == 200, r.text
    assert len(stored(live, conv)) == len(before) + 3
    http_turn(live, conv)
    ws_turn(live, conv)
    # a missing conversation is still a 404 (the check reads the conversation only when it must)
    assert_error(req(live, "POST", "/conversations/conv_missing/items", {"items": [output("zz")]}), 404)


def test_a_conversation_holding_an_orphan_output_still_serves_every_turn(store_gateway):
    """Defence in depth: stored state the checks would refuse (a conversation stored before them)
    leaves the orphan out of the model's context instead of failing each turn with a 500."""
    live = store_gateway
    store = live.gw.pipeline.conversations.store
    conv = new_id("conv")
    items = [
        dict(
            user("remember PLUM"),
            id=new_id("msg"),
            content=[{"type": "input_text", "text": "remember PLUM"}],
            status="completed",
        ),
        dict(output("call_gone", text="ORPHAN-OUTPUT"), id=new_id("fco"), status="completed"),
    ]
    live.call(store.create(conv, None, {}, items))
    for _ in range(2):  # every later turn, not just the first
        http_turn(live, conv)
        prompt = last_prompt(live)
        assert "PLUM" in prompt and "ORPHAN-OUTPUT" not in prompt
        ws_turn(live, conv)
    # the orphan is still stored and listed: it is only left out of what the model is shown
    listed = req(live, "GET", f"/conversations/{conv}/items", None).json()["data"]
    assert any(it.get("call_id") == "call_gone" for it in listed)


def test_deleting_a_call_whose_output_remains_does_not_poison_the_conversation(store_gateway):
    live = store_gateway
    r = req(live, "POST", "/conversations", {"items": [user("hi"), call("c1"), output("c1", text="RAINY")]})
    conv = r.json()["id"]
    call_item = next(it for it in stored(live, conv) if it["type"] == "function_call")
    http_turn(live, conv)  # a turn before the delete: this process now holds a tip for it
    r = req(live, "DELETE", f"/conversations/{conv}/items/{call_item['id']}")
    assert r.status_code == 200, r.text
    for _ in range(2):
        http_turn(live, conv)
        assert "RAINY" not in last_prompt(live)
        ws_turn(live, conv)


# ---------------------------------------------------------------------------------------------
# 12: bodies that are JSON but not objects
# ---------------------------------------------------------------------------------------------

JSON_ENDPOINTS = [
    "/responses",
    "/responses/input_tokens",
    "/responses/compact",
    "/conversations",
    "/conversations/{conv}",
    "/conversations/{conv}/items",
]


def _not_objects(n: int) -> Iterator[str]:
    """JSON texts of about ``n`` bytes that are not objects: a string, arrays, a number."""
    yield json.dumps("x" * n)
    yield json.dumps(["x" * n])
    yield json.dumps(["x"] * (n // 4))
    yield "0." + "1" * n


def test_a_body_that_is_not_an_object_is_a_400_at_any_size(gateway, caplog):
    conv = req(gateway, "POST", "/conversations", {}).json()["id"]
    # 475 bytes and up were weighed for the prepare pool (69 x 475 > the 32 KiB inline limit)
    sizes = [1, 100, 474, 475, 476, 1000, 40_000, 300_000]
    with caplog.at_level(logging.ERROR):
        for path in JSON_ENDPOINTS:
            for n in sizes:
                for text in _not_objects(n):
                    r = post(gateway, text.encode(), path=path.format(conv=conv))
                    assert_error(r, 400, code="invalid_type", param="body")
            for value in (None, True, 1.5):
                assert_error(
                    post(gateway, json.dumps(value).encode(), path=path.format(conv=conv)),
                    400,
                    code="invalid_type",
                    param="body",
                )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a refusal logged as an error"
    with ws_open(gateway) as ws:
        for n in (10, 475, 40_000):
            for text in _not_objects(n):
                send(ws, text)
                ev = recv(ws)
                assert ev["type"] == "error" and ev["status"] == 400, ev
                assert ev["error"]["param"] is not None
    assert_still_serving(gateway)


# ---------------------------------------------------------------------------------------------
# 13: tool_choice.type
# ---------------------------------------------------------------------------------------------

BAD_TOOL_CHOICES = [
    ({"type": {}}, "invalid_type"),
    ({"type": []}, "invalid_type"),
    ({"type": 5}, "invalid_type"),
    ({"type": "bogus"}, "invalid_value"),
    ({"type": {"a": [1]}, "name": "get_weather"}, "invalid_type"),
    ({"name": "get_weather"}, "missing_required_parameter"),
    ({"type": None}, "missing_required_parameter"),
]


@pytest.mark.parametrize("with_tools", [True, False])
def test_tool_choice_type_must_be_a_known_string(gateway, with_tools):
    extra = {"tools": TOOLS} if with_tools else {}
    for choice, code in BAD_TOOL_CHOICES:
        r = post(gateway, {"model": MODEL, "input": "hi", "tool_choice": choice, **extra})
        assert_error(r, 400, code=code, param="tool_choice.type")
    with ws_open(gateway) as ws:
        for choice, code in BAD_TOOL_CHOICES:
            send(ws, ws_create(tool_choice=choice, **extra))
            ev = recv(ws)
            assert ev["type"] == "error" and ev["status"] == 400, ev
            assert ev["error"]["param"] == "tool_choice.type" and ev["error"]["code"] == code, ev
    # what a type names is checked as well, naming the param it is about
    if with_tools:
        for choice, param in (
            ({"type": "function", "name": {}}, "tool_choice.name"),
            ({"type": "custom", "name": ["a"]}, "tool_choice.name"),
            ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": {}}]}, "tool_choice.tools[0]"),
            ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function"}, "x"]}, "tool_choice.tools[1]"),
        ):
            assert_error(
                post(gateway, {"model": MODEL, "input": "hi", "tool_choice": choice, **extra}),
                400,
                code="invalid_type",
                param=param,
            )
    # the ones a client means still work
    for choice in (
        "auto",
        "none",
        {"type": "function", "name": "get_weather"},
        {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]},
    ):
        if isinstance(choice, dict) and not with_tools:
            continue
        r = post(gateway, {"model": MODEL, "input": "hi", "tool_choice": choice, **extra})
        assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------------------------
# 15: unexpected faults, logged rate-limited
# ---------------------------------------------------------------------------------------------


def test_a_line_budget_counts_what_it_suppressed_and_says_so_when_it_resumes():
    now = [0.0]
    budget = LineBudget(period=10, burst=3, clock=lambda: now[0])
    assert [budget.take("k") for _ in range(1000)].count(0) == 3
    assert budget.take("other") == 0  # keys are independent
    now[0] = 10.0
    assert budget.take("k") == 997  # the first line of the next window says how many were left out
    assert budget.take("k") == 0


def test_a_line_budget_full_of_keys_forgets_the_least_recently_logged_one():
    """Its key cap is a BoundedLRU: a place that keeps logging keeps its suppressed count while
    one-off keys come and go (a first-in-first-out cap forgot it, and its count, first)."""
    now = [0.0]
    budget = LineBudget(period=10, burst=1, clock=lambda: now[0], max_keys=4)
    assert budget.take("busy") == 0
    assert budget.take("busy") is None  # suppressed: counted
    for i in range(10):
        budget.take(("one-off", i))
        assert budget.take("busy") is None  # still logging: stays
    now[0] = 10.0
    assert budget.take("busy") == 11  # the next window's first line says how many were left out


def test_the_fault_filter_keys_by_place_and_exception_type():
    now = [0.0]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(FaultLogLimit(period=10, burst=2, clock=lambda: now[0]))
    logger = logging.getLogger("tests.hostile.faults")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)

    def fault(exc_type: type[Exception]) -> None:  # one place in the code
        try:
            raise exc_type("boom")
        except Exception:
            logger.exception("site A crashed")

    try:
        for exc_type in (ValueError, KeyError):
            for _ in range(100):
                fault(exc_type)
        for _ in range(100):
            logger.info("plain info lines are never limited")
        now[0] = 11.0
        fault(ValueError)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    lines = [ln for ln in stream.getvalue().splitlines() if "site A crashed" in ln]
    assert len(lines) == 2 + 2 + 1, lines
    assert lines[-1] == "site A crashed (98 similar line(s) suppressed)"
    assert stream.getvalue().count("plain info lines") == 100


@pytest.fixture
def process_logging(monkeypatch) -> Iterator[io.StringIO]:
    """The process's logging as ``respgate serve`` sets it up (``setup_logging``), into a buffer;
    the test run's own logging put back after."""
    from gateway.ops.logging_setup import setup_logging

    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")  # no vLLM config file written
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    setup_logging("info", "text", stream=buf)
    try:
        yield buf
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


def test_a_thousand_requests_that_crash_the_same_way_log_a_bounded_number_of_lines(
    gateway, process_logging, monkeypatch
):
    async def crash(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("an unexpected fault")

    monkeypatch.setattr(gateway.gw.pipeline, "prepare", crash)
    n = 1000
    t0 = time.monotonic()
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            r = client.post(gateway.base_url + "/responses", json={"model": MODEL, "input": "hi"})
            assert r.status_code == 500 and r.json()["error"]["code"] == "server_error"
    with ws_open(gateway) as ws:
        for _ in range(n):
            send(ws, ws_create())
            ev = recv(ws)
            assert ev["type"] == "error" and ev["status"] == 500, ev
    # a conversation route's fault (a store record that does not decode): OpenAI's 500, not Starlette's
    monkeypatch.setattr(gateway.gw.pipeline.conversations.store, "get", crash)
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            r = client.get(gateway.base_url + "/conversations/conv_x")
            assert r.status_code == 500 and r.json()["error"]["code"] == "server_error", r.text
    elapsed = time.monotonic() - t0
    text = process_logging.getvalue()
    http_lines = text.count("create crashed")
    ws_lines = text.count("turn crashed on lane")
    conv_lines = text.count("conversations get_conversation crashed")
    assert 1 <= conv_lines <= 5 * (int(elapsed // 10) + 2), text[-3000:]
    tracebacks = text.count("Traceback (most recent call last)")
    # 5 lines a 10 s window per place and kind (the setting's defaults); both loops ran within elapsed
    bound = 5 * (int(elapsed // 10) + 2)
    assert 1 <= http_lines <= bound and 1 <= ws_lines <= bound, (http_lines, ws_lines, elapsed)
    assert tracebacks <= 3 * bound, tracebacks
    assert len(text.splitlines()) < n // 2  # from ~19 lines a request before


def test_line_budget_is_safe_from_many_threads_past_its_key_cap():
    """A logging filter runs outside its handler's lock, from the loop and worker threads: the
    budget's bookkeeping (forgetting its oldest key once full) must hold under them."""
    budget = LineBudget(max_keys=8)
    errors: list[BaseException] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def hammer(n: int) -> None:
        try:
            for i in range(20_000):
                budget.take((n, i))
        except BaseException as exc:  # what would escape from log.error()
            errors.append(exc)

    try:
        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert len(budget._buckets) <= 8
