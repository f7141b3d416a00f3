"""The simulated engine's work per turn does not grow with the history (issue 15, item 2).

Benchmarks run the simulated engine at zero latency to measure the gateway; if the stand-in's own
work grew with the prompt (re-hashing or comparing the whole history, scanning it for the newest
message) the benchmarks would measure the stand-in. So the engine counts its work in operations —
tokens hashed into cache blocks, cache probes, prompt tokens read for the script, prompt tokens
copied — and these tests compare a continuation turn after a 1k-token history with one after a
128k-token history, through the gateway's WebSocket path (``previous_response_id``: the real
append-only views) and at the engine API. Counts, not time.

The history is one large item (the shape that used to make the prompt view scan it whole), with
a tool declared (so the script reads the prelude as well as the newest message).
"""

from __future__ import annotations

import dataclasses

import pytest
from websockets.sync.client import connect

from cache.seq import TokenSeq
from gateway.base.settings import Settings
from inference.engine import SamplingParams
from inference.harmony import HarmonyRenderer
from inference.renderer import Prelude
from inference.simulated import SimulatedEngine
from tests.turn_helpers import text_of, ws_turn

pytestmark = pytest.mark.timeout(180)

MODEL = "gpt-oss-sim"
BLOCK = 16
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SMALL, LARGE = 1_000, 128_000


def work(engine: SimulatedEngine) -> dict[str, int]:
    s = engine.stats
    return {
        **dataclasses.asdict(s.cache),
        "prompt_tokens_read": s.prompt_tokens_read,
        "prompt_tokens_copied": s.prompt_tokens_copied,
    }


def spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def assert_flat(small: dict[str, int], large: dict[str, int]) -> None:
    print("work per turn after", SMALL, "and", LARGE, "tokens:", small, large)
    """The same work after 1k and after 128k tokens of history, up to block alignment: where the
    new tokens start inside a block moves the hashed span by less than a block at either end, in
    the prompt and again in the output."""
    assert large["fresh_sequences"] == small["fresh_sequences"] == 0, (small, large)  # nothing re-hashed
    assert large["prompt_tokens_copied"] == small["prompt_tokens_copied"] == 0
    assert large["prompt_tokens_read"] == small["prompt_tokens_read"], (small, large)
    assert abs(large["tokens_hashed"] - small["tokens_hashed"]) <= 4 * BLOCK, (small, large)
    assert abs(large["blocks_hashed"] - small["blocks_hashed"]) <= 4, (small, large)
    assert abs(large["blocks_probed"] - small["blocks_probed"]) <= 2, (small, large)
    # and small in absolute terms: a short turn, not a history
    assert large["tokens_hashed"] < 40 * BLOCK and large["prompt_tokens_read"] < 500, large


# -- through the gateway: WebSocket continuations ------------------------------------------------


def answer_call(resp: dict) -> list[dict]:
    """The client's side of the agent loop: the output of the tool the model called."""
    call = resp["output"][-1]
    assert call["type"] == "function_call", resp["output"]
    return [{"type": "function_call_output", "call_id": call["call_id"], "output": "21C and sunny"}]


def ws_continuation_work(live, history_tokens: int) -> tuple[dict[str, int], dict, dict]:
    """An agent loop after a history of one large item (user asks, model calls the tool, the
    tool answers, the model reports); the work of a later user turn. (work, parent, turn)."""
    engine = live.engine
    with connect(live.ws_url, max_size=None) as ws:
        resp = ws_turn(ws, MODEL, text_of(history_tokens), None, tools=[TOOL])
        resp = ws_turn(ws, MODEL, answer_call(resp), resp["id"], tools=[TOOL])
        resp = ws_turn(ws, MODEL, "And tomorrow?", resp["id"], tools=[TOOL])
        resp = ws_turn(ws, MODEL, answer_call(resp), resp["id"], tools=[TOOL])
        before = work(engine)
        parent, resp = resp, ws_turn(ws, MODEL, "Weather in Oslo, please?", resp["id"], tools=[TOOL])
        return spent(before, work(engine)), parent, resp


def test_ws_continuation_work_is_independent_of_history(make_gateway) -> None:
    engine = SimulatedEngine(cache_block_size=BLOCK)
    live = make_gateway(Settings(max_context=300_000), engine=engine)
    small, _, _ = ws_continuation_work(live, SMALL)
    large, parent, turn = ws_continuation_work(live, LARGE)
    assert turn["usage"]["input_tokens"] > LARGE  # the history really is that long
    assert [o["type"] for o in turn["output"]] == ["reasoning", "function_call"]  # the script read the tools
    assert_flat(small, large)
    # what vLLM would report: the parent's prompt and output but its last token, in whole blocks
    held = parent["usage"]["input_tokens"] + parent["usage"]["output_tokens"] - 1
    assert turn["usage"]["input_tokens_details"]["cached_tokens"] == held // BLOCK * BLOCK


# -- at the engine API ---------------------------------------------------------------------------


async def engine_continuation_work(
    engine: SimulatedEngine, renderer: HarmonyRenderer, history_tokens: int, views: bool = True
) -> dict[str, int]:
    """A conversation driven the way the gateway drives it (prompt = history + new items +
    generation prompt, history = prompt + the sampled tokens as rendered); the work of its third
    continuation. ``views=False`` passes each prompt as a fresh list instead."""
    prelude = Prelude(tools=(TOOL,))

    def user(text: str) -> dict:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    history = TokenSeq(renderer.render_prelude(prelude))
    before: dict[str, int] = {}
    calls: dict[str, dict] = {}
    new: list[dict] = [user(text_of(history_tokens))]
    for i in range(5):  # ask, tool output, ask, tool output, ask (measured)
        prompt = history.extend(renderer.render_items(new, calls=calls)).extend(renderer.generation_prompt())
        if i == 4:
            before = work(engine)
        deltas = [d async for d in engine.generate(f"r{i}", prompt if views else prompt.tolist(), SamplingParams())]
        sampled = [t for d in deltas for t in d.token_ids]
        history = prompt.extend(renderer.history_tokens(sampled))
        if i % 2 == 0:  # the model called get_weather; the renderer names an output by its call
            call_id = f"c{i}"
            calls[call_id] = {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": "{}"}
            new = [{"type": "function_call_output", "call_id": call_id, "output": "21C and sunny"}]
        else:
            new = [user("And tomorrow?" if i == 1 else "Weather in Oslo, please?")]
    return spent(before, work(engine))


async def test_engine_api_continuation_work_is_independent_of_history() -> None:
    renderer = HarmonyRenderer()
    engine = SimulatedEngine(cache_block_size=BLOCK)
    await engine.start()
    small = await engine_continuation_work(engine, renderer, SMALL)
    large = await engine_continuation_work(engine, renderer, LARGE)
    assert_flat(small, large)


async def test_a_prompt_in_a_fresh_list_is_hashed_whole() -> None:
    """The counters see O(history) work where it is done: a prompt that arrives as a fresh list
    (no append-only view to extend) has every block hashed — the fallback, and what the WS
    path above avoids."""
    renderer = HarmonyRenderer()
    engine = SimulatedEngine(cache_block_size=BLOCK)
    await engine.start()
    large = await engine_continuation_work(engine, renderer, LARGE, views=False)
    assert large["fresh_sequences"] == 1 and large["tokens_hashed"] > LARGE


async def test_recorded_prompts_are_the_only_copy() -> None:
    renderer = HarmonyRenderer()
    engine = SimulatedEngine(cache_block_size=BLOCK, record_prompts=True)
    await engine.start()
    large = await engine_continuation_work(engine, renderer, LARGE)
    assert large["prompt_tokens_copied"] == engine.stats.last_prompt_len == len(engine.stats.prompts[-1]) > LARGE
