"""WebSocket mode, "Continuation and cache" (ws-mode spec §5, checklist §14).

Every test drives a real gateway on loopback with the official ``openai`` SDK
(``client.responses.connect()``); frames are read raw (``recv_bytes``) so the exact wire shape is
asserted, not the SDK's parsed view of it. The simulated engine is scripted: the "echo" script
answers with the decoded conversation it was prompted with, which is how a test proves what the
model saw (recall), independently of the gateway's own bookkeeping.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn, turns_in_order

pytestmark = pytest.mark.timeout(60)

MODEL = "gpt-oss-sim"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# -- helpers -------------------------------------------------------------------------------------


def transcript(view: PromptView) -> str:
    """The conversation the model was prompted with, one ``role/channel: text`` line per message
    (system message left out: it only carries harmony metadata)."""
    return "\n".join(f"{m.role}/{m.channel or '-'}: {m.text}" for m in view.messages() if m.role != "system")


def echo_on_recall(view: PromptView) -> Turn:
    """Answer ``RECALL`` with the whole transcript; answer anything else with a fixed marker that
    names what was said (so a later recall can tell the turn's output from its input)."""
    last = view.last
    said = last.text if last is not None else ""
    if "RECALL" in said:
        return Turn(text=transcript(view))
    return Turn(text=f"ack<{said}>")


def recv(conn: Any) -> dict[str, Any]:
    raw = conn.recv_bytes()
    ev = json.loads(raw)
    assert isinstance(ev, dict)
    return ev


def turn_events(conn: Any) -> list[dict[str, Any]]:
    """Frames of one default-lane turn: through its terminal event, or a single ``error`` frame."""
    out: list[dict[str, Any]] = []
    while True:
        ev = recv(conn)
        out.append(ev)
        if ev["type"] in TERMINAL or ev["type"] == "error":
            return out


def completed(conn: Any) -> dict[str, Any]:
    """Run one turn that must complete; returns the final Response object."""
    evs = turn_events(conn)
    assert evs[-1]["type"] == "response.completed", evs[-1]
    assert evs[0]["type"] == "response.created"
    assert not any("stream_id" in e for e in evs), "default-lane events carry no stream_id"
    return evs[-1]["response"]


def error_frame(conn: Any) -> dict[str, Any]:
    """The next turn must be rejected before it exists: exactly one ``error`` frame."""
    evs = turn_events(conn)
    assert [e["type"] for e in evs] == ["error"], evs
    return evs[0]


def output_text(resp: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "") for item in resp["output"] if item["type"] == "message" for part in item["content"]
    )


def not_found_frame(response_id: str) -> dict[str, Any]:
    return {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": f"Previous response with id '{response_id}' not found.",
            "param": "previous_response_id",
        },
    }


@pytest.fixture
def echo_gw(make_gateway):
    return make_gateway(Settings(), engine=SimulatedEngine(script=echo_on_recall, record_prompts=True))


# -- turn 2 sees turn 1 --------------------------------------------------------------------------


def test_continuation_sees_parent_input_and_output_store_false(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="the code word is PELICAN", store=False)
        r1 = completed(conn)
        assert output_text(r1) == "ack<the code word is PELICAN>"

        conn.response.create(
            model=MODEL,
            previous_response_id=r1["id"],
            store=False,
            input=[{"type": "message", "role": "user", "content": "RECALL"}],
        )
        r2 = completed(conn)
    assert r2["previous_response_id"] == r1["id"]
    seen = output_text(r2).splitlines()
    # exactly: turn-1 input, turn-1 output, turn-2 input -- in order, nothing repeated
    assert seen == [
        "user/-: the code word is PELICAN",
        "assistant/final: ack<the code word is PELICAN>",
        "user/-: RECALL",
    ]
    # the gateway sent only the new items on turn 2 (same prompt prefix as turn 1 + its output)
    p1, p2 = echo_gw.engine.stats.prompts[-2:]
    assert p2[: len(p1)] == p1


def test_instructions_not_inherited(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", instructions="Always answer in FRENCH.", store=False)
        r1 = completed(conn)
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        r2 = completed(conn)
        conn.response.create(
            model=MODEL, input="three", previous_response_id=r2["id"], store=False, instructions="Answer in GERMAN."
        )
        r3 = completed(conn)
    assert (r1["instructions"], r2["instructions"], r3["instructions"]) == (
        "Always answer in FRENCH.",
        None,
        "Answer in GERMAN.",
    )
    # what the model was actually prompted with, turn by turn
    p1, p2, p3 = (PromptView(p).messages() for p in echo_gw.engine.stats.prompts[-3:])
    dev1 = [m.text for m in p1 if m.role == "developer"]
    assert len(dev1) == 1 and "Always answer in FRENCH." in dev1[0]
    assert [m.role for m in p2 if m.role != "system"] == ["user", "assistant", "user"]
    assert not any("FRENCH" in m.text for m in p2)
    assert [(m.role, m.text) for m in p2 if m.role != "system"][-1] == ("user", "two")
    dev3 = [m.text for m in p3 if m.role == "developer"]
    assert len(dev3) == 1 and "Answer in GERMAN." in dev3[0] and "FRENCH" not in dev3[0]
    # turn 3 still carries the chain (turn-1 and turn-2 messages), under the new instructions
    assert [m.text for m in p3 if m.role == "user"] == ["one", "two", "three"]


def test_function_call_output_for_parent_call_accepted(make_gateway):
    call = ToolCall("get_weather", {"city": "Oslo"})
    script = turns_in_order(
        [Turn(reasoning="Need the weather.", tool_calls=(call,))],
        then=lambda view: Turn(text=f"tool said: {view.last.text} ({view.last.tool_name})"),
    )
    gw = make_gateway(Settings(), engine=SimulatedEngine(script=script, record_prompts=True))
    client = gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER_TOOL], store=False)
        r1 = completed(conn)
        calls = [o for o in r1["output"] if o["type"] == "function_call"]
        assert len(calls) == 1 and calls[0]["name"] == "get_weather"
        call_id = calls[0]["call_id"]

        conn.response.create(
            model=MODEL,
            previous_response_id=r1["id"],
            tools=[WEATHER_TOOL],
            store=False,
            input=[{"type": "function_call_output", "call_id": call_id, "output": "sunny, 21C"}],
        )
        r2 = completed(conn)
    assert output_text(r2) == "tool said: sunny, 21C (get_weather)"


def test_function_call_output_for_unknown_call_rejected(make_gateway):
    script = turns_in_order([Turn(tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),))])
    gw = make_gateway(Settings(), engine=SimulatedEngine(script=script))
    client = gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER_TOOL], store=False)
        r1 = completed(conn)
        conn.response.create(
            model=MODEL,
            previous_response_id=r1["id"],
            tools=[WEATHER_TOOL],
            store=False,
            input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}],
        )
        err = error_frame(conn)
    assert err["status"] == 400
    assert err["error"]["param"] == "input"
    assert "call_nope" in err["error"]["message"]


# -- what the cache holds -----------------------------------------------------------------------


def test_older_id_store_false_is_not_found(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False)
        r1 = completed(conn)
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        completed(conn)
        conn.response.create(model=MODEL, input="three", previous_response_id=r1["id"], store=False)
        err = error_frame(conn)
        assert err == not_found_frame(r1["id"])
        # the SDK parses it as its error event
        assert conn.parse_event(json.dumps(err)).type == "error"
        # a request-scoped error: the socket stays usable
        conn.response.create(model=MODEL, input="fresh", store=False)
        completed(conn)


def test_older_id_store_true_resolves_from_store(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="first fact ALPHA", store=True)
        r1 = completed(conn)
        conn.response.create(model=MODEL, input="second fact BETA", previous_response_id=r1["id"], store=True)
        completed(conn)
        before = echo_gw.metric("respgate_parent_resolution_total", {"source": "store"})
        conn.response.create(model=MODEL, input="RECALL", previous_response_id=r1["id"], store=True)
        r3 = completed(conn)
    assert echo_gw.metric("respgate_parent_resolution_total", {"source": "store"}) == before + 1
    # r3 continues r1, not r2: it sees r1's turn but nothing of the (newer) sibling turn
    assert output_text(r3).splitlines() == [
        "user/-: first fact ALPHA",
        "assistant/final: ack<first fact ALPHA>",
        "user/-: RECALL",
    ]


# -- eviction after a failed continuation -------------------------------------------------------


def test_4xx_continuation_evicts_parent(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False)
        r1 = completed(conn)
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False, temperature=5)
        err = error_frame(conn)
        assert err["status"] == 400 and err["error"]["param"] == "temperature"
        assert "stream_id" not in err
        # same request, now valid: the parent is gone
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        assert error_frame(conn) == not_found_frame(r1["id"])
        # recovery as the docs prescribe: full context, no previous_response_id
        conn.response.create(
            model=MODEL,
            store=False,
            input=[
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": output_text(r1)},
                {"role": "user", "content": "two"},
            ],
        )
        completed(conn)


def test_4xx_continuation_with_store_true_parent_still_resolves_from_store(echo_gw):
    """Eviction only drops the connection copy: a stored parent is still found (spec §5.3 step 2)."""
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=True)
        r1 = completed(conn)
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], temperature=5)
        assert error_frame(conn)["error"]["param"] == "temperature"
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"])
        completed(conn)


def test_response_failed_continuation_evicts_parent(make_gateway):
    script = turns_in_order([Turn(text="fine"), Turn(text="this will break midway", fail_after_tokens=3)])
    gw = make_gateway(Settings(), engine=SimulatedEngine(script=script))
    client = gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False)
        r1 = completed(conn)
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        evs = turn_events(conn)
        assert evs[0]["type"] == "response.created"
        assert evs[-1]["type"] == "response.failed"
        assert [e["type"] for e in evs].count("error") == 0
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        assert error_frame(conn) == not_found_frame(r1["id"])


# -- fresh chains and HTTP isolation -----------------------------------------------------------


def test_full_context_request_on_socket_holding_a_chain(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False)
        r1 = completed(conn)
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        r2 = completed(conn)
        # Codex-style unchained request: the whole history, with the server's output items replayed
        # verbatim (ids included); ids already in the cached chain are no duplicates here
        history = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
            *r1["output"],
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]},
            *r2["output"],
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "RECALL"}]},
        ]
        conn.response.create(model=MODEL, input=history, store=False)
        r3 = completed(conn)
        assert r3["previous_response_id"] is None
        assert output_text(r3).splitlines() == [
            "user/-: one",
            "assistant/final: ack<one>",
            "user/-: two",
            "assistant/final: ack<two>",
            "user/-: RECALL",
        ]
        # and the fresh chain continues incrementally
        conn.response.create(model=MODEL, input="RECALL again", previous_response_id=r3["id"], store=False)
        r4 = completed(conn)
    assert output_text(r4).splitlines()[:5] == output_text(r3).splitlines()


def test_store_false_ws_id_invisible_to_http(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False)
        r1 = completed(conn)
        # while the socket (and its cache) is still alive
        with pytest.raises(openai.BadRequestError) as exc:
            client.responses.create(model=MODEL, input="two", previous_response_id=r1["id"])
        assert exc.value.status_code == 400
        assert exc.value.body["code"] == "previous_response_not_found"
        assert exc.value.body["param"] == "previous_response_id"
        assert exc.value.body["message"] == f"Previous response with id '{r1['id']}' not found."
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(r1["id"])
        # the WS chain itself was not disturbed by the HTTP attempts
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        completed(conn)


def test_store_true_ws_id_visible_to_http(echo_gw):
    """Control for the test above: the same flow with store=true works over HTTP."""
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=True)
        r1 = completed(conn)
    got = httpx.get(f"{echo_gw.base_url}/responses/{r1['id']}", headers={"Authorization": "Bearer test-key"})
    assert got.status_code == 200 and got.json()["id"] == r1["id"]
    r2 = client.responses.create(model=MODEL, input="RECALL", previous_response_id=r1["id"])
    assert r2.output_text.splitlines()[:2] == ["user/-: one", "assistant/final: ack<one>"]


def test_store_false_id_from_closed_connection_not_found(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False)
        r1 = completed(conn)
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="two", previous_response_id=r1["id"], store=False)
        assert error_frame(conn) == not_found_frame(r1["id"])


def test_store_true_id_from_closed_connection_resolves(echo_gw):
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=True)
        r1 = completed(conn)
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="RECALL", previous_response_id=r1["id"], store=False)
        r2 = completed(conn)
    assert output_text(r2).splitlines()[:2] == ["user/-: one", "assistant/final: ack<one>"]


# -- duplicate items ----------------------------------------------------------------------------


def test_duplicate_input_item_id_rejected(echo_gw):
    client = echo_gw.openai()
    first = {"type": "message", "id": "msg_client_1", "role": "user", "content": "one"}
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=[first], store=False)
        r1 = completed(conn)
        conn.response.create(
            model=MODEL,
            previous_response_id=r1["id"],
            store=False,
            input=[dict(first), {"role": "user", "content": "two"}],
        )
        err = error_frame(conn)
    assert err["status"] == 400
    assert err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith("Duplicate item found with id msg_client_1")
    assert "stream_id" not in err


def test_duplicate_output_item_id_rejected(echo_gw):
    """Replaying the parent's own output item (server id) in an incremental turn is a duplicate."""
    client = echo_gw.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False)
        r1 = completed(conn)
        out_id = r1["output"][0]["id"]
        conn.response.create(
            model=MODEL,
            previous_response_id=r1["id"],
            store=False,
            input=[*r1["output"], {"role": "user", "content": "two"}],
        )
        err = error_frame(conn)
    assert err["status"] == 400
    assert err["error"]["message"].startswith(f"Duplicate item found with id {out_id}")
