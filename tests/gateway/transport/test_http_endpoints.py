"""The other HTTP endpoints, error envelopes, auth, and bad input.

Covers the "Other endpoints" and "Errors" sections of spec/responses-http.md §8 (retrieve, delete,
cancel, input_items, input_tokens, the four-key error body, 401) plus malformed requests: invalid
JSON, wrong field types, missing/unknown model and oversize bodies. Each rejected request must get
an OpenAI-shaped error and leave the server serving.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.conftest import MODEL
from tests.http_helpers import assert_error, assert_still_serving, create, post

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def get(live, path: str, **kw) -> httpx.Response:
    return httpx.get(live.base_url + path, timeout=30, **kw)


# ---------------------------------------------------------------------------------------------
# GET / DELETE / cancel
# ---------------------------------------------------------------------------------------------


def test_retrieve_returns_stored_response(make_gateway):
    live = make_gateway()
    client = live.openai()
    created = client.responses.create(model=MODEL, input="hi", metadata={"run": "7"})
    got = client.responses.retrieve(created.id)
    assert got.id == created.id and got.status == "completed"
    assert got.output_text == created.output_text and got.metadata == {"run": "7"}
    # byte-level: GET returns exactly the Response the create returned
    posted = create(live, input="hello", instructions="Be nice.")
    raw = get(live, f"/responses/{posted['id']}")
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("application/json")
    assert raw.json() == posted


def test_retrieve_unknown_is_404_with_exact_message(make_gateway):
    live = make_gateway()
    with pytest.raises(openai.NotFoundError):
        live.openai().responses.retrieve("resp_missing123")
    assert_error(get(live, "/responses/resp_missing123"), 404, message="Response with id 'resp_missing123' not found.")


def test_retrieve_store_false_is_404(make_gateway):
    live = make_gateway()
    body = create(live, input="hi", store=False)
    assert body["store"] is False
    assert_error(get(live, f"/responses/{body['id']}"), 404, message=f"Response with id '{body['id']}' not found.")


def test_delete_then_retrieve_is_404(make_gateway):
    live = make_gateway()
    client = live.openai()
    created = client.responses.create(model=MODEL, input="hi")
    r = httpx.delete(f"{live.base_url}/responses/{created.id}")
    assert r.status_code == 200
    assert r.json() == {"id": created.id, "object": "response", "deleted": True}
    assert_error(get(live, f"/responses/{created.id}"), 404)
    assert_error(httpx.delete(f"{live.base_url}/responses/{created.id}"), 404)
    # chaining from a deleted response fails like an unknown id
    assert_error(
        post(live, {"model": MODEL, "input": "x", "previous_response_id": created.id}),
        400,
        code="previous_response_not_found",
        param="previous_response_id",
    )
    # the SDK's delete() (Accept: */*, body discarded)
    other = client.responses.create(model=MODEL, input="hi")
    assert client.responses.delete(other.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(other.id)


def test_cancel_foreground_response_is_400_and_unknown_is_404(make_gateway):
    live = make_gateway()
    client = live.openai()
    created = client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.cancel(created.id)
    assert exc.value.param == "response_id"
    assert_error(post(live, {}, path=f"/responses/{created.id}/cancel"), 400, param="response_id")
    assert_error(post(live, {}, path="/responses/resp_missing/cancel"), 404)
    assert client.responses.retrieve(created.id).status == "completed"


def test_a_store_fault_on_retrieve_or_delete_is_a_json_500_logged_with_a_few_tracebacks(
    make_gateway, redis_url, caplog, monkeypatch
):
    """A record that does not decode (or any fault of the store other than an outage) is an
    OpenAI-shaped 500 on every route that reads it, never Starlette's plain-text one; a client
    repeating the request gets a few logged tracebacks, and every one is counted."""

    import redis

    from cache.redis_response_store import RedisStore
    from gateway.base.log_limit import RateLimitedLog
    from gateway.transport import http_routes

    monkeypatch.setattr(http_routes, "store_faults", RateLimitedLog(http_routes.log), raising=False)  # fresh budget
    store = RedisStore.from_url(redis_url)
    live = make_gateway(store=store)
    good, bad = create(live, input="kept"), create(live, input="to be corrupted")
    redis.Redis.from_url(redis_url).hset(store.record_key(bad["id"], bad["id"]), "response", b"\xff not json")
    caplog.set_level("ERROR", logger=http_routes.log.name)
    for _ in range(10):
        assert_error(get(live, f"/responses/{bad['id']}"), 500, code="server_error", type_="server_error")
    assert_error(httpx.delete(f"{live.base_url}/responses/{bad['id']}"), 500, code="server_error", type_="server_error")
    assert_error(get(live, f"/responses/{bad['id']}/input_items"), 500, code="server_error", type_="server_error")
    lines = [r for r in caplog.records if "response store get of" in r.getMessage()]
    assert len(lines) == 5 and all(r.exc_info is not None for r in lines), [r.getMessage() for r in lines]
    assert live.metric("respgate_request_errors_total", {"transport": "http", "code": "server_error"}) == 12
    assert get(live, f"/responses/{good['id']}").json() == good

    def broken_delete(*args, **kwargs):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(store, "delete", broken_delete)
    assert_error(
        httpx.delete(f"{live.base_url}/responses/{good['id']}"), 500, code="server_error", type_="server_error"
    )
    deleted = [r for r in caplog.records if "response store delete of" in r.getMessage()]
    assert len(deleted) == 1 and deleted[0].exc_info[0] is RuntimeError
    assert get(live, f"/responses/{good['id']}").status_code == 200


# ---------------------------------------------------------------------------------------------
# input_items
# ---------------------------------------------------------------------------------------------


def _many_items(n: int) -> list[dict]:
    return [{"role": "user", "content": f"message number {i}"} for i in range(n)]


def test_input_items_default_order_limit_and_paging(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=lambda v: Turn(text="ok")))
    body = create(live, input=_many_items(25))
    rid = body["id"]
    page = get(live, f"/responses/{rid}/input_items").json()
    assert page["object"] == "list"
    assert len(page["data"]) == 20 and page["has_more"] is True
    texts = [i["content"][0]["text"] for i in page["data"]]
    assert texts == [f"message number {i}" for i in range(24, 4, -1)]  # desc by default
    assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
    for item in page["data"]:
        assert item["id"].startswith("msg_") and item["type"] == "message" and item["status"] == "completed"
        assert item["role"] == "user" and item["content"][0]["type"] == "input_text"
    rest = get(live, f"/responses/{rid}/input_items", params={"after": page["last_id"]}).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == [f"message number {i}" for i in range(4, -1, -1)]
    assert rest["has_more"] is False and rest["last_id"] == rest["data"][-1]["id"]
    asc = get(live, f"/responses/{rid}/input_items", params={"order": "asc", "limit": 3}).json()
    assert [i["content"][0]["text"] for i in asc["data"]] == [
        "message number 0",
        "message number 1",
        "message number 2",
    ]
    assert asc["has_more"] is True
    exact = get(live, f"/responses/{rid}/input_items", params={"limit": 25}).json()
    assert len(exact["data"]) == 25 and exact["has_more"] is False
    # the SDK's auto-pagination follows `after` through both pages
    sdk_items = list(live.openai().responses.input_items.list(rid))
    assert [i.id for i in sdk_items] == [i["id"] for i in exact["data"]]


def test_input_items_limit_validation(make_gateway):
    live = make_gateway()
    rid = create(live, input="hi")["id"]
    assert_error(get(live, f"/responses/{rid}/input_items", params={"limit": 101}), 400, param="limit")
    assert_error(get(live, f"/responses/{rid}/input_items", params={"limit": 0}), 400, param="limit")
    assert_error(get(live, f"/responses/{rid}/input_items", params={"limit": "x"}), 400, param="limit")
    assert_error(get(live, f"/responses/{rid}/input_items", params={"order": "sideways"}), 400, param="order")
    assert_error(get(live, f"/responses/{rid}/input_items", params={"after": "msg_nope"}), 400, param="after")
    assert_error(get(live, "/responses/resp_missing/input_items"), 404)
    ok = get(live, f"/responses/{rid}/input_items", params={"limit": 100})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 1


def test_input_items_lists_only_this_requests_items(make_gateway):
    live = make_gateway(
        engine=SimulatedEngine(
            script=turns_in_order([Turn(tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),)), Turn(text="cold")])
        )
    )
    first = create(live, input="Weather in Oslo?", tools=[WEATHER_TOOL])
    call_id = first["output"][-1]["call_id"]
    second = create(
        live,
        previous_response_id=first["id"],
        tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call_id, "output": "cold", "id": "fco_client_1"}],
    )
    items = get(live, f"/responses/{second['id']}/input_items").json()["data"]
    assert [(i["type"], i["id"]) for i in items] == [("function_call_output", "fco_client_1")]
    items = get(live, f"/responses/{first['id']}/input_items").json()["data"]
    assert [i["type"] for i in items] == ["message"] and items[0]["content"][0]["text"] == "Weather in Oslo?"


#: one mistake each in a list query, and the parameter its 400 names
LIST_MISTAKES = [
    ({"limit": "0"}, "limit"),
    ({"limit": "101"}, "limit"),
    ({"limit": "x"}, "limit"),
    ({"order": "sideways"}, "order"),
    ({"after": "msg_nope"}, "after"),
    ({"foo": "1"}, "foo"),
    ([("include[]", "message.output_text.logprobs"), ("include[]", "nope")], "include[1]"),
    ({"include": "nope"}, "include[0]"),
]


@pytest.mark.parametrize("params,param", LIST_MISTAKES)
def test_both_item_lists_answer_the_same_400_for_the_same_mistake(make_gateway, params, param):
    """A response's input items and a conversation's items share one query parser: the same bad
    query is the same error body on either (include values checked on both)."""
    live = make_gateway()
    rid = create(live, input="hi")["id"]
    cid = post(live, {}, path="/conversations").json()["id"]
    on_inputs = assert_error(get(live, f"/responses/{rid}/input_items", params=params), 400, param=param)
    on_items = assert_error(get(live, f"/conversations/{cid}/items", params=params), 400, param=param)
    assert on_inputs == on_items


def test_before_pages_input_items_backwards_and_only_input_items_take_it(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=lambda v: Turn(text="ok")))
    rid = create(live, input=_many_items(7))["id"]
    asc = get(live, f"/responses/{rid}/input_items", params={"order": "asc", "limit": 100}).json()["data"]
    ids = [i["id"] for i in asc]

    def listed(**params) -> dict:
        r = get(live, f"/responses/{rid}/input_items", params=params)
        assert r.status_code == 200, r.text
        return r.json()

    # the page next to the cursor, in the order asked; has_more: more lie before that page
    prev = listed(order="asc", before=ids[5], limit=2)
    assert [i["id"] for i in prev["data"]] == ids[3:5] and prev["has_more"] is True
    assert listed(order="asc", before=ids[2], limit=2)["has_more"] is False
    desc = listed(before=ids[1], limit=3)  # desc: "before" is the newer side
    assert [i["id"] for i in desc["data"]] == ids[4:1:-1] and desc["has_more"] is True
    between = listed(order="asc", after=ids[1], before=ids[5])
    assert [i["id"] for i in between["data"]] == ids[2:5] and between["has_more"] is False
    assert listed(order="asc", after=ids[3], before=ids[2])["data"] == []
    assert_error(
        get(live, f"/responses/{rid}/input_items", params={"before": "msg_nope"}),
        400,
        code="invalid_value",
        param="before",
    )
    cid = post(live, {}, path="/conversations").json()["id"]
    assert_error(get(live, f"/conversations/{cid}/items", params={"before": ids[0]}), 400, param="before")


# ---------------------------------------------------------------------------------------------
# input_tokens
# ---------------------------------------------------------------------------------------------


def test_input_tokens_matches_real_usage(make_gateway):
    live = make_gateway(engine=SimulatedEngine(script=lambda v: Turn(text="ok")))
    client = live.openai()
    cases = [
        {"input": "hi"},
        {"input": "How is the weather?", "instructions": "Be brief.", "tools": [WEATHER_TOOL]},
        {
            "input": [{"role": "developer", "content": "rules"}, {"role": "user", "content": "a b c d e"}],
            "reasoning": {"effort": "high"},
        },
    ]
    for case in cases:
        counted = client.responses.input_tokens.count(model=MODEL, **case)
        assert counted.object == "response.input_tokens"
        real = client.responses.create(model=MODEL, **case)
        assert counted.input_tokens == real.usage.input_tokens, case
    # a continuation counts the whole chain
    first = client.responses.create(model=MODEL, input="one")
    counted = client.responses.input_tokens.count(model=MODEL, input="two", previous_response_id=first.id)
    real = client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert counted.input_tokens == real.usage.input_tokens > first.usage.input_tokens
    raw = post(live, {"model": MODEL, "input": "hi"}, path="/responses/input_tokens")
    assert raw.status_code == 200 and set(raw.json()) == {"object", "input_tokens"}


def test_input_tokens_does_not_generate_or_store(make_gateway):
    live = make_gateway()
    before = live.engine.stats.requests
    r = post(live, {"model": MODEL, "input": "hi"}, path="/responses/input_tokens")
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    assert live.engine.stats.requests == before
    assert_error(
        post(live, {"model": MODEL, "input": "hi", "stream": True}, path="/responses/input_tokens"),
        400,
        code="unknown_parameter",
        param="stream",
    )
    assert_error(
        post(live, {"model": "nope", "input": "hi"}, path="/responses/input_tokens"), 404, code="model_not_found"
    )


# ---------------------------------------------------------------------------------------------
# Errors: envelope, auth
# ---------------------------------------------------------------------------------------------

ERROR_CASES = [
    ("POST", "/responses", b"{not json", 400),
    ("POST", "/responses", {"input": "hi"}, 400),
    ("POST", "/responses", {"model": "nope", "input": "hi"}, 404),
    ("POST", "/responses", {"model": MODEL, "input": "hi", "bogus": 1}, 400),
    ("POST", "/responses", {"model": MODEL, "input": "hi", "previous_response_id": "resp_x"}, 400),
    ("POST", "/responses", {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 1}, 400),
    ("GET", "/responses/resp_x", None, 404),
    ("DELETE", "/responses/resp_x", None, 404),
    ("GET", "/responses/resp_x/input_items", None, 404),
    ("POST", "/responses/resp_x/cancel", {}, 404),
    ("POST", "/responses/input_tokens", {"model": MODEL, "input": 3}, 400),
    ("GET", "/no/such/route", None, 404),
    ("PUT", "/responses", {}, 405),
]


def test_every_error_body_has_four_keys(make_gateway):
    live = make_gateway()
    for method, path, body, status in ERROR_CASES:
        content = body if isinstance(body, bytes) else (None if body is None else json.dumps(body).encode())
        r = httpx.request(
            method, live.base_url + path, content=content, headers={"content-type": "application/json"}, timeout=30
        )
        assert_error(r, status)
    assert live.engine.stats.requests == 0
    assert_still_serving(live)


def test_streaming_request_rejected_before_first_event_is_plain_json_error(make_gateway):
    live = make_gateway()
    with httpx.stream(
        "POST",
        live.base_url + "/responses",
        json={"model": MODEL, "input": "hi", "stream": True, "previous_response_id": "resp_gone"},
    ) as r:
        r.read()
    assert_error(r, 400, code="previous_response_not_found")


def test_bad_or_missing_api_key_is_401(make_gateway):
    live = make_gateway(Settings(api_keys=["sk-good"]))
    for headers in (
        {},
        {"authorization": "Bearer sk-bad"},
        {"authorization": "Basic sk-good"},
        {"authorization": "Bearer"},
    ):
        r = post(live, {"model": MODEL, "input": "hi"}, headers=headers)
        assert_error(r, 401, code="invalid_api_key", param=None)
        assert_error(get(live, "/responses/resp_x", headers=headers), 401, code="invalid_api_key")
    with pytest.raises(openai.AuthenticationError) as exc:
        live.openai(api_key="sk-bad").responses.create(model=MODEL, input="hi")
    assert exc.value.code == "invalid_api_key"
    assert live.engine.stats.requests == 0
    ok = live.openai(api_key="sk-good").responses.create(model=MODEL, input="hi")
    assert ok.status == "completed"


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_invalid_json_body_is_400(make_gateway):
    live = make_gateway()
    for raw in (b"{not json", b"", b'{"model": "x",}', b"\xff\xfe\x00", b'{"model": "gpt-oss-sim", "input": "hi"'):
        assert_error(post(live, raw), 400, code="invalid_json")
    for raw in (b"[1, 2]", b'"just a string"', b"null"):
        assert_error(post(live, raw), 400, code="invalid_type")
    assert live.engine.stats.requests == 0
    assert_still_serving(live)


WRONG_FIELDS = [
    ("model", 5, "model", "Invalid type for 'model': expected a string, but got an integer instead."),
    ("input", 5, "input", "Invalid type for 'input': expected a string or an array of input items."),
    ("temperature", "hot", "temperature", None),
    ("temperature", 3, "temperature", None),
    ("stream", "yes", "stream", "Invalid type for 'stream': expected a boolean, but got a string instead."),
    ("store", "no", "store", None),
    ("tools", {"type": "function"}, "tools", None),
    ("metadata", {"k": 1}, "metadata.k", None),
    ("instructions", ["a"], "instructions", None),
    ("include", ["everything"], "include[0]", None),
    ("truncation", "sometimes", "truncation", None),
]


def test_wrong_field_types_are_400(make_gateway):
    live = make_gateway()
    for field, value, param, message in WRONG_FIELDS:
        err = assert_error(post(live, {"model": MODEL, "input": "hi", field: value}), 400, param=param, message=message)
        assert err["code"] in ("invalid_type", "invalid_value", "decimal_above_max_value", "integer_above_max_value"), (
            field,
            err,
        )
        assert f"'{param}'" in err["message"] or "Invalid value" in err["message"], err
    assert live.engine.stats.requests == 0
    assert_still_serving(live)


def test_wrong_item_shapes_are_400_with_item_path(make_gateway):
    live = make_gateway()
    cases = [
        ([{"role": "user", "content": 5}], "input[0].content"),
        ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
        ([{"type": "no_such_item"}], "input[0]"),
        (["just a string in a list"], "input[0]"),
    ]
    for items, param in cases:
        err = assert_error(post(live, {"model": MODEL, "input": items}), 400)
        assert err["param"] is not None and err["param"].startswith(param), (items, err)
    assert live.engine.stats.requests == 0
    assert_still_serving(live)


def test_oversize_body_is_rejected_and_server_keeps_serving(make_gateway):
    live = make_gateway(Settings(max_request_bytes=4096))
    big = {"model": MODEL, "input": "x" * 10_000}
    r = post(live, big)
    err = assert_error(r, 413, code="request_too_large")
    assert "4096" in err["message"]
    # without a Content-Length (chunked upload) the limit still applies while reading
    payload = json.dumps(big).encode()

    def chunks():
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    r = httpx.post(
        live.base_url + "/responses", content=chunks(), headers={"content-type": "application/json"}, timeout=30
    )
    assert "content-length" not in r.request.headers
    assert_error(r, 413, code="request_too_large")
    with pytest.raises(openai.APIStatusError) as exc:
        live.openai().responses.create(model=MODEL, input="y" * 10_000)
    assert exc.value.status_code == 413
    assert live.engine.stats.requests == 0
    assert_still_serving(live)  # a small request still works
