"""Logprobs of the output text (issue 13.7): ``top_logprobs`` / ``include: message.output_text.logprobs``.

The values are the engine's own (the simulated engine's are synthetic but well formed; the CPU
engine test checks vLLM's); each delta carries the entries of the tokens that wrote its text, so
their bytes spell the delta exactly.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.base.settings import Settings
from gateway.turn.types import TurnContext
from inference.remote_vllm import _logprobs as remote_logprobs
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn, turns_in_order
from tests.conftest import VLLM_MODEL, LiveGateway
from tests.http_helpers import create, stream

TEXT = "Grüße aus Bergen — 中文 too!"


@pytest.fixture
def live(make_gateway) -> LiveGateway:
    script = turns_in_order([], then=lambda view: Turn(reasoning="think first", text=TEXT))
    return make_gateway(Settings(), engine=SimulatedEngine(script=script))


def spelled(entries: list[dict[str, Any]]) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8")


def test_json_response_carries_logprobs_only_when_asked(live):
    plain = create(live, input="hi")
    assert plain["output"][-1]["content"][0]["logprobs"] == [] and plain["top_logprobs"] == 0
    asked = create(live, input="hi", top_logprobs=2, include=["message.output_text.logprobs"])
    part = asked["output"][-1]["content"][0]
    assert part["text"] == TEXT and asked["top_logprobs"] == 2
    entries = part["logprobs"]
    assert spelled(entries) == TEXT  # the message's own tokens, no header or reasoning token
    for e in entries:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["logprob"] == e["logprob"] and e["top_logprobs"][0]["bytes"] == e["bytes"]
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
    # include alone: the sampled tokens' logprobs, no alternatives
    only = create(live, input="hi", include=["message.output_text.logprobs"])
    assert all(e["top_logprobs"] == [] for e in only["output"][-1]["content"][0]["logprobs"])
    assert spelled(only["output"][-1]["content"][0]["logprobs"]) == TEXT


def test_each_streamed_delta_carries_the_tokens_that_wrote_it(live):
    _, _, events = stream(live, input="hi", top_logprobs=1)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all(spelled(d["logprobs"]) == d["delta"] for d in deltas)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert spelled(done["logprobs"]) == TEXT
    assert sum(len(d["logprobs"]) for d in deltas) == len(done["logprobs"])
    final = next(e for e in events if e["type"] == "response.completed")["response"]
    assert final["output"][-1]["content"][0]["logprobs"] == done["logprobs"]


def test_remote_engine_reads_the_generate_protocols_logprobs():
    wire = {
        "content": [
            {
                "token_id": 7,
                "logprob": -0.5,
                "rank": 1,
                "top_logprobs": [
                    {"token_id": 7, "logprob": -0.5},
                    {"token_id": 9, "logprob": -1.5},
                    {"token_id": 3, "logprob": -2.0},
                ],
            }
        ]
    }
    (lp,) = remote_logprobs(wire, 2)
    assert (lp.token_id, lp.logprob, lp.top) == (7, -0.5, ((7, -0.5), (9, -1.5)))
    assert remote_logprobs(wire, None) is None and remote_logprobs(None, 2) is None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_engine_logprobs(vllm_gateway: LiveGateway):
    pipeline = vllm_gateway.gw.pipeline

    async def turn() -> dict[str, Any]:
        prepared = await pipeline.prepare(
            {
                "model": VLLM_MODEL,
                "input": "Say hello to Bergen.",
                "temperature": 0,
                "max_output_tokens": 16,
                "top_logprobs": 3,
                "store": False,
            },
            TurnContext(transport="http"),
        )
        final: dict[str, Any] = {}
        async for ev in pipeline.run(prepared):
            if ev["type"] in ("response.completed", "response.incomplete", "response.failed"):
                final = ev["response"]
        return final

    final = vllm_gateway.call(turn(), timeout=600)
    message = next(o for o in final["output"] if o["type"] == "message")
    part = message["content"][0]
    entries = part["logprobs"]
    assert entries and spelled(entries).strip() == part["text"].strip()
    for e in entries:
        assert e["logprob"] <= 0 and not math.isnan(e["logprob"]) and 1 <= len(e["top_logprobs"]) <= 3
        # temperature 0: the sampled token is the most likely one
        assert e["top_logprobs"][0]["bytes"] == e["bytes"]
