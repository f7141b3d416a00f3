"""Server-side compaction (responses-http spec §2.8, §4.6, §5.6; ws-mode spec §8).

Real gateway on loopback, real clients (the openai SDK over HTTP and ``responses.connect()``,
raw httpx for exact SSE framing), the simulated engine recording every prompt: what the engine
was handed is how a test proves what the model saw after a compaction — the summary, the kept user
messages, and none of the dropped items. The simulated model answers the summarization request
deterministically (``inference.simulated_script.summary_turn``).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import pytest

from billing.usage import MemorySink
from inference.harmony_core import harmony_encoding
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import Turn
from inference.summary import SUMMARY_PREFIX, SUMMARY_REQUEST, is_summary_request
from tests.billing.test_ledger_faults import CountingSink, NativePanic, billed
from tests.conftest import MODEL
from tests.http_helpers import assert_error, create, post, stream

pytestmark = pytest.mark.timeout(120)

#: a first message long enough (~1,600 tokens) to cross the minimum compact_threshold (1000)
LONG = "Background for the task, codeword ZEBRA-DROPPED-7731: " + " ".join(
    f"line {i} of the build log says the linker failed on object{i}.o." for i in range(110)
)
THRESHOLD = [{"type": "compaction", "compact_threshold": 1000}]


def decoded(ids: list[int]) -> str:
    return harmony_encoding().decode(ids)


def text_of(resp: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for it in resp["output"] if it["type"] == "message" for p in it["content"])


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def _counter(live: Any, name: str, labels: dict[str, str]) -> float:
    return live.metric(name + "_total", labels)


# -- POST /v1/responses/compact ------------------------------------------------------------------


def test_compact_endpoint_with_sdk_and_output_continues_the_conversation(gateway):
    client = gateway.openai()
    r1 = client.responses.create(model=MODEL, input="Please remember the codeword PINEAPPLE-ALPHA-4471 for later.")
    history: list[Any] = [user("Please remember the codeword PINEAPPLE-ALPHA-4471 for later.")]
    history += [o.model_dump(exclude_none=True) for o in r1.output]
    history.append(user("Also note that the deadline is Friday."))
    assistant_text = r1.output_text
    assert assistant_text

    compacted = client.responses.compact(model=MODEL, input=history)
    summarize_prompt = decoded(gateway.engine.stats.prompts[-1])
    assert SUMMARY_REQUEST in summarize_prompt and assistant_text in summarize_prompt
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    kinds = [o.type for o in compacted.output]
    assert kinds == ["message", "message", "compaction"]  # all (recent) user messages, then the item
    assert [o.content[0].text for o in compacted.output[:2]] == [
        "Please remember the codeword PINEAPPLE-ALPHA-4471 for later.",
        "Also note that the deadline is Friday.",
    ]
    item = compacted.output[-1]
    assert item.id.startswith("cmp_")
    assert "Compacted" not in item.encrypted_content and "Compacted" not in base64.urlsafe_b64decode(
        item.encrypted_content
    ).decode("latin-1")  # opaque
    # usage: the summarization prompt and the summary, billed
    assert compacted.usage.input_tokens == len(gateway.engine.stats.prompts[-1])
    assert compacted.usage.output_tokens > 0
    assert compacted.usage.total_tokens == compacted.usage.input_tokens + compacted.usage.output_tokens

    window = [o.model_dump(exclude_none=True, warnings=False) for o in compacted.output]
    r2 = client.responses.create(model=MODEL, input=window + [user("What was the deadline?")])
    assert r2.status == "completed"
    prompt = decoded(gateway.engine.stats.prompts[-1])
    assert SUMMARY_PREFIX + "Compacted 4 messages." in prompt  # the model's own summary
    assert "PINEAPPLE-ALPHA-4471" in prompt and "What was the deadline?" in prompt  # kept user messages
    assert assistant_text not in prompt  # the dropped assistant turn
    # the window kept exactly what it returned: summary after the kept user messages, new input last
    assert prompt.index("deadline is Friday") < prompt.index(SUMMARY_PREFIX) < prompt.index("What was the deadline")


def test_compact_with_previous_response_id_and_usage_is_billed(make_gateway):
    sink = MemorySink()
    live = make_gateway(usage_sink=sink)
    r1 = create(live, input="Remember: the port is 8443.")
    r = post(
        live,
        {"model": MODEL, "previous_response_id": r1["id"], "input": [user("And the host is db1.")]},
        path="/responses/compact",
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "object", "created_at", "output", "usage", "image"}
    assert body["object"] == "response.compaction"
    assert body["output"][-1]["type"] == "compaction"
    prompt = decoded(live.engine.stats.prompts[-1])
    assert "the port is 8443" in prompt and "the host is db1" in prompt and SUMMARY_REQUEST in prompt
    assert body["usage"]["input_tokens"] == len(live.engine.stats.prompts[-1])
    assert _counter(live, "respgate_compactions", {"trigger": "endpoint"}) == 1
    # the summarization is billed under the window's id, like any response
    deadline = time.monotonic() + 10
    while body["id"] not in sink.records and time.monotonic() < deadline:
        time.sleep(0.02)
    record = sink.records[body["id"]]
    assert (record.input_tokens, record.output_tokens) == (
        body["usage"]["input_tokens"],
        body["usage"]["output_tokens"],
    )
    assert record.status == "completed" and record.model == MODEL


def test_compact_endpoint_rejects_bad_bodies(gateway):
    assert_error(post(gateway, {"input": "hi"}, path="/responses/compact"), 400, param="model")
    assert_error(
        post(gateway, {"model": MODEL, "input": "hi", "stream": True}, path="/responses/compact"),
        400,
        code="unknown_parameter",
        param="stream",
    )
    assert_error(post(gateway, {"model": MODEL, "input": []}, path="/responses/compact"), 400, param="input")
    assert_error(post(gateway, {"model": "nope", "input": "hi"}, path="/responses/compact"), 404)
    assert_error(
        post(
            gateway, {"model": MODEL, "previous_response_id": "resp_missing", "input": "hi"}, path="/responses/compact"
        ),
        400,
        code="previous_response_not_found",
    )
    # the unversioned alias answers too
    r = httpx.post(gateway.url + "/responses/compact", json={"model": MODEL, "input": "compact me"}, timeout=30)
    assert r.status_code == 200 and r.json()["output"][-1]["type"] == "compaction"


def _fails_to_summarize(view: PromptView) -> Turn | None:
    last = view.last
    if last is not None and is_summary_request(last.text):
        return Turn(text="never finished", fail_after_tokens=2)
    return None


def test_summarization_failure_is_a_500_or_a_failed_response_and_billed(make_gateway):
    sink = MemorySink()
    live = make_gateway(engine=SimulatedEngine(script=_fails_to_summarize, record_prompts=True), usage_sink=sink)
    assert_error(
        post(live, {"model": MODEL, "input": "hi"}, path="/responses/compact"),
        500,
        code="server_error",
        type_="server_error",
    )
    _, _, events = stream(live, input=[user("hello"), {"type": "compaction_trigger"}])
    final = events[-1]
    assert final["type"] == "response.failed" and final["response"]["error"]["code"] == "server_error"
    assert not any(e["type"] == "response.output_item.added" for e in events)
    # a failed compacting turn is not a chain parent
    r = post(live, {"model": MODEL, "previous_response_id": final["response"]["id"], "input": "again"})
    assert_error(r, 400, code="previous_response_not_found")
    deadline = time.monotonic() + 10
    while final["response"]["id"] not in sink.records and time.monotonic() < deadline:
        time.sleep(0.02)
    failed = sink.records[final["response"]["id"]]
    assert failed.status == "failed" and failed.output_tokens == 2  # the summary's tokens, billed
    # the failed /compact call was billed too (its id never reached the client)
    compact_prompt = live.engine.stats.prompts[0]
    assert any(
        r.status == "failed" and r.input_tokens == len(compact_prompt) and r.output_tokens == 2
        for r in sink.records.values()
    )
    # the server is fine afterwards
    assert create(live, input="still alive")["status"] == "completed"


class PanicsWhileSummarizing(SimulatedEngine):
    """A summarization that panics mid-stream: two tokens out, then a ``BaseException`` like pyo3's
    ``PanicException`` (``except Exception`` does not see it). Keeps what it had yielded."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.summary_tokens: list[int] = []

    async def generate(self, request_id, prompt_ids, params, routing=None):
        n = 0
        async for delta in super().generate(request_id, prompt_ids, params, routing):
            yield delta
            n += len(delta.token_ids)
            if request_id.endswith("-compact") and n >= 2:
                self.summary_tokens.append(n)
                raise NativePanic("called `Result::unwrap()` on an `Err` value")


def test_an_engine_panic_while_summarizing_is_billed_failed_exactly_once(make_gateway):
    sink = CountingSink()
    engine = PanicsWhileSummarizing(record_prompts=True)
    live = make_gateway(engine=engine, usage_sink=sink)
    r = post(live, {"model": MODEL, "input": "hi"}, path="/responses/compact")
    assert_error(r, 500, code="server_error", type_="server_error")
    assert "Traceback" not in r.text and "unwrap" not in r.text
    compact_prompt = len(engine.stats.prompts[0])
    _, _, events = stream(live, input=[user("hello"), {"type": "compaction_trigger"}])
    final = events[-1]
    assert final["type"] == "response.failed" and final["response"]["error"]["code"] == "server_error"
    records = billed(live, sink, 2)
    assert len(records) == 2 and all(rec.status == "failed" for rec in records), records
    endpoint, turn = records if records[1].response_id == final["response"]["id"] else records[::-1]
    assert (endpoint.input_tokens, endpoint.output_tokens) == (compact_prompt, engine.summary_tokens[0])
    # the compacting turn: what its response says, the summary's prompt and the tokens it wrote included
    usage = final["response"]["usage"]
    assert turn.response_id == final["response"]["id"]
    assert (turn.input_tokens, turn.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
    assert turn.input_tokens > len(engine.stats.prompts[1]) and turn.output_tokens == engine.summary_tokens[1]
    assert create(live, input="still alive")["status"] == "completed"
    records = billed(live, sink, 3)
    assert len({rec.response_id for rec in records}) == len(records) == 3  # nothing billed twice


# -- the compaction input item -------------------------------------------------------------------


def _window(gateway: Any) -> list[dict[str, Any]]:
    r = post(gateway, {"model": MODEL, "input": [user("alpha"), user("beta")]}, path="/responses/compact")
    assert r.status_code == 200, r.text
    return r.json()["output"]


def test_tampered_or_forged_compaction_item_is_rejected(gateway):
    window = _window(gateway)
    blob = window[-1]["encrypted_content"]
    raw = bytearray(base64.urlsafe_b64decode(blob))
    raw[-1] ^= 1
    tampered = dict(window[-1], encrypted_content=base64.urlsafe_b64encode(bytes(raw)).decode())
    r = post(gateway, {"model": MODEL, "input": window[:-1] + [tampered, user("go on")]})
    assert_error(r, 400, code="invalid_encrypted_content", param="input[2].encrypted_content")
    forged = {"type": "compaction", "encrypted_content": "bm90IGEgcmVhbCBibG9i"}
    assert_error(post(gateway, {"model": MODEL, "input": [forged]}), 400, param="input[0].encrypted_content")
    # a reasoning blob is sealed by the same key but is not a compaction
    r1 = create(gateway, input="hello", include=["reasoning.encrypted_content"], store=False)
    rs_blob = next(o for o in r1["output"] if o["type"] == "reasoning")["encrypted_content"]
    r = post(gateway, {"model": MODEL, "input": [{"type": "compaction", "encrypted_content": rs_blob}]})
    assert_error(r, 400, code="invalid_encrypted_content", param="input[0].encrypted_content")
    # the compact endpoint checks its input the same way
    assert_error(
        post(gateway, {"model": MODEL, "input": [tampered]}, path="/responses/compact"),
        400,
        param="input[0].encrypted_content",
    )
    # a blob from another gateway (another secret) does not open either: the server never crashed
    assert create(gateway, input=window + [user("still fine")])["status"] == "completed"


def test_items_before_the_latest_compaction_item_are_dropped(gateway):
    window = _window(gateway)
    stale = [
        user("STALE-ITEM-XYZ should be dropped"),
        {"type": "message", "role": "assistant", "content": "STALE-ANSWER-XYZ"},
    ]
    r = create(gateway, input=stale + window + [user("next")])
    assert r["status"] == "completed"
    prompt = decoded(gateway.engine.stats.prompts[-1])
    assert "STALE" not in prompt
    assert "alpha" in prompt and "beta" in prompt and SUMMARY_PREFIX in prompt


def test_codex_shaped_compact_body_and_input_tokens_of_a_window(gateway):
    """Codex's remote compaction sends tools, reasoning, text and cache fields along."""
    tool = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
    body = {
        "model": MODEL,
        "instructions": "You are a coding agent.",
        "tools": [tool],
        "parallel_tool_calls": True,
        "reasoning": {"effort": "low", "summary": "auto"},
        "service_tier": "priority",
        "prompt_cache_key": "conv-1",
        "text": {"verbosity": "low"},
        "input": [
            user("fix the build"),
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
        ],
    }
    r = post(gateway, body, path="/responses/compact")
    assert r.status_code == 200, r.text
    window = r.json()["output"]
    assert [o["type"] for o in window] == ["message", "compaction"]
    assert "You are a coding agent." in decoded(gateway.engine.stats.prompts[-1])  # instructions render
    stale = [user("STALE " * 50)]
    counted = [
        post(gateway, {"model": MODEL, "input": pre + window + [user("next")]}, path="/responses/input_tokens").json()[
            "input_tokens"
        ]
        for pre in ([], stale)
    ]
    assert counted[0] == counted[1]  # items before the compaction item do not count


# -- context_management: compaction inside a create -------------------------------------------


def _sse_compacting_turn(gateway: Any) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Turn 1 (long, no compaction), then turn 2 over SSE with a threshold it crosses."""
    r1 = create(gateway, input=LONG)
    assert r1["usage"]["input_tokens"] > 1000
    _, _, events = stream(
        gateway, previous_response_id=r1["id"], input=[user("What is the codeword?")], context_management=THRESHOLD
    )
    return r1, events[-1]["response"], events


def test_context_management_over_sse_emits_compaction_item_and_prunes(gateway):
    r1, r2, events = _sse_compacting_turn(gateway)
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert types[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added, done = events[2], events[3]
    assert added["output_index"] == done["output_index"] == 0
    item = done["item"]
    assert item["type"] == "compaction" and item["id"].startswith("cmp_") and item["encrypted_content"]
    assert added["item"] == item
    # the generated items follow at dense output indexes
    later = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert later == list(range(len(later)))
    assert r2["output"][0] == item and len(r2["output"]) == len(later)

    summarize, generate = (decoded(p) for p in gateway.engine.stats.prompts[-2:])
    assert SUMMARY_REQUEST in summarize and "ZEBRA-DROPPED-7731" in summarize
    # generation continued on the pruned context: prelude + kept user message + summary
    assert "ZEBRA-DROPPED-7731" not in generate and "linker failed" not in generate
    assert "What is the codeword?" in generate and SUMMARY_PREFIX + "Compacted 4 messages" in generate
    assert generate.index("What is the codeword?") < generate.index(SUMMARY_PREFIX)
    # usage includes the summarization (documented in gateway/turn/compaction.py)
    p_sum, p_gen = gateway.engine.stats.prompts[-2:]
    assert r2["usage"]["input_tokens"] == len(p_sum) + len(p_gen)
    assert r2["usage"]["output_tokens"] > 0
    assert _counter(gateway, "respgate_compactions", {"trigger": "threshold"}) == 1


def test_continuation_after_compaction_is_incremental_and_small(gateway):
    _, r2, _ = _sse_compacting_turn(gateway)
    p_gen = gateway.engine.stats.prompts[-1]
    append0 = gateway.metric("respgate_render_tokens_total", {"mode": "append"})
    full0 = gateway.metric("respgate_render_tokens_total", {"mode": "full"})
    r3 = create(
        gateway, previous_response_id=r2["id"], input=[user("Thanks, and the next step?")], context_management=THRESHOLD
    )
    assert r3["status"] == "completed"
    assert all(o["type"] != "compaction" for o in r3["output"])  # small again: no second compaction
    p3 = gateway.engine.stats.prompts[-1]
    # the engine got the pruned history + turn 2's output + only the new item
    assert p3[: len(p_gen)] == p_gen and len(p3) < 1000
    assert "ZEBRA" not in decoded(p3)
    # and the gateway rendered only the new item (an append, no full render)
    appended = gateway.metric("respgate_render_tokens_total", {"mode": "append"}) - append0
    assert gateway.metric("respgate_render_tokens_total", {"mode": "full"}) == full0
    assert 0 < appended < 40
    assert r3["usage"]["input_tokens"] == len(p3)


def test_stateless_client_replaying_outputs_gets_the_same_pruned_prompt(gateway):
    """Codex-style: no previous_response_id, the whole history including the compaction item."""
    r1, r2, _ = _sse_compacting_turn(gateway)
    r3 = create(gateway, previous_response_id=r2["id"], input=[user("next step?")])
    chained = gateway.engine.stats.prompts[-1]
    full = [user(LONG)] + r1["output"] + [user("What is the codeword?")] + r2["output"] + [user("next step?")]
    r3b = create(gateway, input=full, store=False)
    assert r3b["status"] == r3["status"] == "completed"
    assert decoded(gateway.engine.stats.prompts[-1]) == decoded(chained)


def test_compaction_trigger_item_forces_compaction(gateway):
    r1 = create(gateway, input="short question one")
    r2 = create(
        gateway, previous_response_id=r1["id"], input=[user("short question two"), {"type": "compaction_trigger"}]
    )
    assert r2["output"][0]["type"] == "compaction"
    generate = decoded(gateway.engine.stats.prompts[-1])
    assert "short question one" not in generate.split(SUMMARY_PREFIX)[0]
    assert "short question two" in generate
    assert _counter(gateway, "respgate_compactions", {"trigger": "trigger"}) == 1


def test_compact_threshold_below_minimum_is_rejected(gateway):
    r = post(
        gateway,
        {"model": MODEL, "input": "hi", "context_management": [{"type": "compaction", "compact_threshold": 999}]},
    )
    assert_error(r, 400, param="context_management[0].compact_threshold")


def test_context_management_over_websocket(gateway):
    client = gateway.openai()
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=LONG, store=False)
        r1 = _ws_turn(conn)[-1]["response"]
        conn.response.create(
            model=MODEL,
            previous_response_id=r1["id"],
            store=False,
            input=[user("What is the codeword?")],
            context_management=THRESHOLD,
        )
        events = _ws_turn(conn)
        assert [e["type"] for e in events[2:4]] == ["response.output_item.added", "response.output_item.done"]
        assert events[3]["item"]["type"] == "compaction" and events[3]["output_index"] == 0
        r2 = events[-1]["response"]
        assert r2["status"] == "completed" and r2["output"][0]["type"] == "compaction"
        p2 = gateway.engine.stats.prompts[-1]
        # the connection cache holds the pruned state: the next turn continues from it
        conn.response.create(
            model=MODEL,
            previous_response_id=r2["id"],
            store=False,
            input=[user("And then?")],
            context_management=THRESHOLD,
        )
        r3 = _ws_turn(conn)[-1]["response"]
        assert r3["status"] == "completed"
        p3 = gateway.engine.stats.prompts[-1]
        assert p3[: len(p2)] == p2 and len(p3) < 1000 and "ZEBRA" not in decoded(p3)

        # a new chain seeded with a /compact window (no previous_response_id) works over WS too
        window = _window(gateway)
        conn.response.create(model=MODEL, store=False, input=window + [user("continue")])
        r4 = _ws_turn(conn)[-1]["response"]
        assert r4["status"] == "completed"
        assert SUMMARY_PREFIX in decoded(gateway.engine.stats.prompts[-1])

        # below the minimum threshold: one error frame, the socket stays usable
        conn.response.create(
            model=MODEL, input="hi", context_management=[{"type": "compaction", "compact_threshold": 10}]
        )
        err = _ws_turn(conn)
        assert [e["type"] for e in err] == ["error"] and err[0]["status"] == 400


def _ws_turn(conn: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        ev = json.loads(conn.recv_bytes())
        out.append(ev)
        if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return out


# -- the real engine ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # the session's vLLM engine may load first
def test_real_vllm_compacts_and_continues(vllm_gateway):
    """SmolLM2 through the chat-template renderer: the model writes the summary, the window
    continues the conversation, and a compaction_trigger compacts inside a create."""
    from tests.conftest import VLLM_MODEL

    compactor = vllm_gateway.gw.pipeline.compactor
    bound, compactor.max_summary_tokens = compactor.max_summary_tokens, 48  # CPU: keep the summary short
    try:
        client = vllm_gateway.openai()
        first = "My name is Ada and I live in Lisbon."
        r1 = client.responses.create(model=VLLM_MODEL, input=first, temperature=0, max_output_tokens=24)
        history = [user(first)] + [o.model_dump(exclude_none=True) for o in r1.output]
        compacted = client.responses.compact(model=VLLM_MODEL, input=history)
        assert compacted.output[-1].type == "compaction" and compacted.output[-1].id.startswith("cmp_")
        assert compacted.output[0].type == "message"  # the user message, kept verbatim
        assert 0 < compacted.usage.output_tokens <= 48 and compacted.usage.input_tokens > 0

        window = [o.model_dump(exclude_none=True, warnings=False) for o in compacted.output]
        r2 = client.responses.create(
            model=VLLM_MODEL, input=window + [user("Where do I live?")], temperature=0, max_output_tokens=16
        )
        assert r2.status in ("completed", "incomplete") and r2.output_text

        r3 = client.responses.create(
            model=VLLM_MODEL,
            previous_response_id=r2.id,
            temperature=0,
            max_output_tokens=16,
            input=[user("Thanks."), {"type": "compaction_trigger"}],
        )  # type: ignore[list-item]
        assert r3.output[0].type == "compaction"
        assert r3.status in ("completed", "incomplete")
        # billed: the summarization's prompt is in the usage on top of the (short) pruned prompt
        assert r3.usage is not None and r3.usage.input_tokens > r2.usage.input_tokens
        # the pruned state chains
        r4 = client.responses.create(
            model=VLLM_MODEL, previous_response_id=r3.id, temperature=0, max_output_tokens=16, input="Bye."
        )
        assert r4.status in ("completed", "incomplete")
    finally:
        compactor.max_summary_tokens = bound
