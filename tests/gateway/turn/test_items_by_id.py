"""Items by id across stored responses (issue 13.2): the AI SDK's default tool loop, as it sends it.

With ``store: true`` and no ``previous_response_id`` the AI SDK re-sends the conversation and
replaces the earlier output items (reasoning, function calls) by ``item_reference``s. The gateway
resolves them against the tenant's stored responses (memory and Redis stores), and when the input
begins with a stored response's whole context, continues from that response: the second step is
an append, not a full render.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import assert_error, post
from tests.turn_helpers import render_tokens

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
QUESTION = {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Oslo?"}]}


def engine() -> SimulatedEngine:
    script = turns_in_order(
        [Turn(reasoning="I need the weather.", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),))],
        then=lambda view: Turn(text=f"It is {view.last.text}."),
    )
    return SimulatedEngine(script=script, record_prompts=True)


def create(live: LiveGateway, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    r = post(
        live, {"model": MODEL, "tools": TOOLS, **body}, headers={"authorization": f"Bearer {key}"} if key else None
    )
    assert r.status_code == 200, r.text
    return r.json()


def second_step(first: dict[str, Any]) -> list[dict[str, Any]]:
    """What the AI SDK sends for step 2: the question again, earlier outputs by reference, the tool result."""
    call = next(o for o in first["output"] if o["type"] == "function_call")
    refs = [{"type": "item_reference", "id": o["id"]} for o in first["output"]]
    return [QUESTION, *refs, {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]


def run_tool_loop(live: LiveGateway, key: str | None = None) -> tuple[dict[str, Any], float, float]:
    first = create(live, {"input": [QUESTION]}, key)
    assert [o["type"] for o in first["output"]] == ["reasoning", "function_call"]
    append0, full0 = render_tokens(live)
    second = create(live, {"input": second_step(first)}, key)
    append1, full1 = render_tokens(live)
    assert second["status"] == "completed"
    assert second["output"][-1]["content"][0]["text"] == "It is sunny."
    assert second["previous_response_id"] is None  # the client named none; the gateway found it
    return second, append1 - append0, full1 - full0


def test_ai_sdk_second_step_resolves_references_and_appends(make_gateway):
    live = make_gateway(Settings(), engine=engine())
    second, appended, full = run_tool_loop(live)
    assert full == 0, "the second step re-rendered the history"
    assert 0 < appended < 40  # the tool output and the generation prompt, not the conversation
    assert live.metric("respgate_parent_resolution_total", {"source": "items"}) == 1
    assert live.metric("respgate_render_reused_tokens_total") > 0
    # the engine got the first turn's tokens as the prefix of the second prompt
    p1, p2 = live.engine.stats.prompts[-2:]
    assert p2[: len(p1)] == p1
    # input_items lists the request's items as sent (references resolved), not just the new tail
    listed = httpx.get(f"{live.base_url}/responses/{second['id']}/input_items?order=asc").json()["data"]
    assert [i["type"] for i in listed] == ["message", "reasoning", "function_call", "function_call_output"]


def test_ai_sdk_second_step_over_redis(make_gateway, redis_url):
    live = make_gateway(Settings(redis_url=redis_url, usage_journal=None), engine=engine())
    _, appended, full = run_tool_loop(live)
    assert full == 0 and 0 < appended < 40
    # a fresh gateway process (no connection cache, no token cache) resolves the same ids from Redis
    other = make_gateway(Settings(redis_url=redis_url, usage_journal=None), engine=engine())
    first = create(other, {"input": [QUESTION]})
    second = create(other, {"input": second_step(first)})
    assert second["status"] == "completed"


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_another_tenants_item_is_indistinguishable_from_a_missing_one(make_gateway, request, store):
    extra = {"redis_url": request.getfixturevalue("redis_url"), "usage_journal": None} if store == "redis" else {}
    live = make_gateway(Settings(api_keys=["acme:key-acme", "beta:key-beta"], keys_file=None, **extra), engine=engine())
    first = create(live, {"input": [QUESTION]}, key="key-acme")
    rs_id = first["output"][0]["id"]
    body = {"model": MODEL, "tools": TOOLS, "input": second_step(first)}
    theirs = post(live, body, headers={"authorization": "Bearer key-beta"})
    assert_error(theirs, 400, code="invalid_value", param="input[1].id")
    assert theirs.json()["error"]["message"] == f"Item with id '{rs_id}' not found."
    unknown = post(
        live,
        {**body, "input": [QUESTION, {"type": "item_reference", "id": "rs_nope"}]},
        headers={"authorization": "Bearer key-beta"},
    )
    assert_error(unknown, 400, code="invalid_value", param="input[1].id")
    assert unknown.json()["error"]["message"] == "Item with id 'rs_nope' not found."


def test_a_reference_outside_any_prefix_still_resolves_and_renders_in_full(make_gateway):
    live = make_gateway(Settings(), engine=engine())
    first = create(live, {"input": [QUESTION]})
    call = first["output"][1]
    # the question is not re-sent: the input does not begin with the stored context
    body = {
        "input": [
            {"type": "item_reference", "id": call["id"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "rainy"},
        ]
    }
    _, full0 = render_tokens(live)
    second = create(live, body)
    assert second["output"][-1]["content"][0]["text"] == "It is rainy."
    assert render_tokens(live)[1] > full0
    assert live.metric("respgate_parent_resolution_total", {"source": "items"}) == 0


def test_a_changed_prefix_is_not_taken_for_the_stored_one(make_gateway):
    live = make_gateway(Settings(), engine=engine())
    first = create(live, {"input": [QUESTION]})
    steps = second_step(first)
    steps[0] = {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Bergen?"}]}
    _, full0 = render_tokens(live)
    second = create(live, {"input": steps})
    assert second["status"] == "completed" and render_tokens(live)[1] > full0
    assert live.metric("respgate_parent_resolution_total", {"source": "items"}) == 0


def test_a_call_re_sent_whole_names_its_response_by_the_call_id(make_gateway, request):
    """No reference at all (a model without reasoning items; the AI SDK sends calls back whole, without
    ids, arguments re-serialized): the call id the gateway issued finds the stored response."""
    script = turns_in_order(
        [Turn(tool_calls=(ToolCall("get_weather", '{"city": "Oslo"}'),))],
        then=lambda view: Turn(text=f"It is {view.last.text}."),
    )
    live = make_gateway(Settings(), engine=SimulatedEngine(script=script, record_prompts=True))
    first = create(live, {"input": [QUESTION]})
    (call,) = first["output"]
    assert call["type"] == "function_call" and call["arguments"] == '{"city": "Oslo"}'
    resent = {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": '{"city":"Oslo"}'}
    _, full0 = render_tokens(live)
    second = create(
        live,
        {"input": [QUESTION, resent, {"type": "function_call_output", "call_id": call["call_id"], "output": "windy"}]},
    )
    assert second["output"][-1]["content"][0]["text"] == "It is windy."
    assert render_tokens(live)[1] == full0, "the step was rendered in full"
    assert live.metric("respgate_parent_resolution_total", {"source": "items"}) == 1
    # a call whose arguments really differ is not the stored one
    changed = dict(resent, arguments='{"city":"Bergen"}')
    third = create(
        live,
        {"input": [QUESTION, changed, {"type": "function_call_output", "call_id": call["call_id"], "output": "calm"}]},
    )
    assert third["status"] == "completed"
    assert live.metric("respgate_parent_resolution_total", {"source": "items"}) == 1
    # not appended to the stored step (whose history holds the sampled call): the prompt has the
    # changed call (the prefix before it may come from the tenant's prefix cache, gateway.turn.prefix)
    p2, p3 = live.engine.stats.prompts[-2:]
    assert p3[: len(p2)] != p2
