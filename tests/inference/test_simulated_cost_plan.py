"""The simulated engine's cheap path behaves exactly like its general one.

Why: nearly every turn (a finite answer that cannot fail, no pacing, no decode delay, no logprobs)
takes a shortcut that cuts the whole delta plan at once and then only hands deltas over, because
the zero-latency benchmarks count the stand-in's per-delta work in the gateway's CPU figures. The
shortcut must be invisible at the engine boundary, so these tests run the same turn down both
paths (a ``fail_after_tokens`` beyond the answer sends it down the general one without changing
what it samples) and compare everything observable: deltas, stats, the prefix cache's state and
work, aborts, and where a cancellation lands between the engine's yields to the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.seq import TokenSeq
from inference.engine import SamplingParams, TokenDelta
from inference.harmony import HarmonyRenderer, harmony_tokens
from inference.harmony_render import render_completion
from inference.renderer import Prelude
from inference.simulated import SimulatedEngine, _chunks, _plan
from inference.simulated_script import ToolCall, Turn, _completion, _messages, completion_tokens, turn_tokens

NEVER = 10**9  # a failure point no answer reaches: the general path, the same tokens

TURNS = [
    Turn(reasoning="ok", text="done"),
    Turn(reasoning="a few more words of thought", commentary="pre", text="a longer final answer"),
    Turn(reasoning="call", tool_calls=(ToolCall("f", '{"a":1}'), ToolCall("g", {"b": [1, 2]}))),
    Turn(text=""),
]


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def prompt(renderer: HarmonyRenderer, n: int) -> list[int]:
    items = [user(f"message {i}") for i in range(n)]
    return renderer.render_prelude(Prelude()) + renderer.render_items(items) + renderer.generation_prompt()


def general(turn: Turn) -> Turn:
    return dataclasses.replace(turn, fail_after_tokens=NEVER)


def observed(engine: SimulatedEngine) -> dict:
    s = engine.stats
    return {
        "stats": (
            s.requests,
            s.aborts,
            s.prompt_tokens,
            s.cached_tokens,
            s.generated_tokens,
            s.running,
            s.prompt_tokens_read,
            s.prompt_tokens_copied,
            s.last_prompt_len,
        ),
        "cache_work": dataclasses.asdict(s.cache),
        "blocks": len(engine._cache) if engine._cache else None,
    }


def as_tuple(d: TokenDelta) -> tuple:
    return (list(d.token_ids), d.finish_reason, d.num_cached_tokens, d.stop_token_id, d.logprobs)


async def play(
    engine: SimulatedEngine, ids, params: SamplingParams, take: int | None = None, cancel_after_steps: int | None = None
) -> tuple[list[tuple], str]:
    """Run one request; stop after ``take`` deltas (``aclose``) or cancel the consuming task after
    that many event-loop steps. Returns the deltas seen and how it ended."""
    seen: list[tuple] = []
    agen = engine.generate("r", ids, params)

    async def consume() -> str:
        async for d in agen:
            seen.append(as_tuple(d))
            if take is not None and len(seen) >= take:
                await agen.aclose()
                return "closed"
        return "done"

    task = asyncio.ensure_future(consume())
    if cancel_after_steps is not None:
        for _ in range(cancel_after_steps):
            await asyncio.sleep(0)
        task.cancel()
    try:
        how = await task
    except asyncio.CancelledError:
        await agen.aclose()
        how = "cancelled"
    return seen, how


async def both(
    turn: Turn,
    params: SamplingParams,
    renderer: HarmonyRenderer,
    *,
    views: bool = True,
    take: int | None = None,
    cancel_after_steps: int | None = None,
    **config,
) -> tuple:
    """The same three-turn conversation on a fast-path engine and a general-path one."""
    results = []
    for t in (turn, general(turn)):
        engine = SimulatedEngine(script=lambda v, t=t: t, **config)
        await engine.start()
        runs = []
        for n in range(1, 4):  # later turns hit what the earlier ones cached (their output included)
            ids = prompt(renderer, n)
            runs.append(await play(engine, TokenSeq(ids) if views else ids, params, take, cancel_after_steps))
            runs.append(observed(engine))
        results.append(runs)
    return results[0], results[1]


@pytest.fixture(scope="module")
def renderer() -> HarmonyRenderer:
    return HarmonyRenderer()


@pytest.mark.parametrize("turn", TURNS)
@pytest.mark.parametrize("per_delta", [1, 2, 3, 7])
@pytest.mark.parametrize("max_tokens", [None, 0, 1, 2, 5, 11, 10**6])
async def test_fast_path_deltas_stats_and_cache_match_the_general_path(renderer, turn, per_delta, max_tokens) -> None:
    fast, slow = await both(
        turn, SamplingParams(max_tokens=max_tokens), renderer, tokens_per_delta=per_delta, cache_block_size=4
    )
    assert fast == slow
    deltas = fast[0][0]
    assert deltas[0][2] is not None and all(d[2] is None for d in deltas[1:])  # cached: first delta only


@pytest.mark.parametrize("turn", TURNS)
@pytest.mark.parametrize("eos", [None, ()])
async def test_request_stop_tokens_and_engine_stops_match(renderer, turn, eos) -> None:
    tokens = list(completion_tokens(turn))
    for stop in {tokens[1], tokens[len(tokens) // 2], tokens[-1]}:
        for per_delta in (1, 4):
            params = SamplingParams(stop_token_ids=(stop, 999_999))
            fast, slow = await both(
                turn, params, renderer, tokens_per_delta=per_delta, eos_token_ids=eos, prefix_cache=False, views=False
            )
            assert fast == slow


@pytest.mark.parametrize("per_delta", [1, 3])
@pytest.mark.parametrize("take", [1, 2, 5])
async def test_aclose_mid_stream_counts_and_caches_alike(renderer, per_delta, take) -> None:
    turn = TURNS[1]
    fast, slow = await both(turn, SamplingParams(), renderer, take=take, tokens_per_delta=per_delta, cache_block_size=1)
    assert fast == slow
    assert fast[-1]["stats"][1] == 3  # three aborts, none finished


@pytest.mark.parametrize("steps", range(0, 12))
async def test_a_cancellation_lands_at_the_same_point(renderer, steps) -> None:
    """Both paths yield to the event loop at the same points (before the first delta, between
    deltas), so a task cancelled after the same number of loop steps saw the same deltas, and the
    engine cached and counted the same output."""
    fast, slow = await both(TURNS[1], SamplingParams(), renderer, cancel_after_steps=steps, cache_block_size=1)
    assert fast == slow


async def test_the_fast_path_yields_to_the_loop_between_deltas(renderer) -> None:
    engine = SimulatedEngine(script=lambda v: Turn(reasoning="think " * 10, text="answer " * 10))
    await engine.start()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    seen = []
    async for _ in engine.generate("r", prompt(renderer, 1), SamplingParams()):
        seen.append(ticks)
    task.cancel()
    assert len(seen) > 10
    assert all(b > a for a, b in zip(seen, seen[1:]))  # the other task ran between every two deltas


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 6), max_size=30),
    stops=st.frozensets(st.integers(0, 6), max_size=3),
    max_tokens=st.none() | st.integers(-1, 35),
    per_delta=st.integers(1, 6),
)
def test_plan_cuts_like_chunks(tokens, stops, max_tokens, per_delta) -> None:
    expected = [
        (list(c), f, s)
        for c, f, s, _ in _chunks(
            iter(tokens), stops=stops, max_tokens=max_tokens, per_delta=per_delta, fail_after=None
        )
    ]
    for seq in (tokens, tuple(tokens)):
        chunks, end, finish, stop_id = _plan(seq, stops, max_tokens, per_delta)
        got = [(c, None, None) for c in chunks[:-1]] + ([(chunks[-1], finish, stop_id)] if chunks else [])
        assert got == expected
        assert end == sum(map(len, chunks)) and all(type(c) is list for c in chunks)


def test_completions_are_cached_bounded_and_equal_to_a_fresh_render() -> None:
    assert _completion.cache_info().maxsize == 1024
    for turn in TURNS + [Turn(endless=True, reasoning="r")]:
        fresh = render_completion(_messages(turn))
        assert list(completion_tokens(turn)) == fresh
        assert list(completion_tokens(dataclasses.replace(turn))) == fresh  # an equal turn, another object
    # the fields that do not change the answer do not split the cache
    _completion.cache_clear()
    completion_tokens(Turn(text="x"))
    completion_tokens(Turn(text="x", fail_after_tokens=3, delay_per_token_s=0.5))
    assert _completion.cache_info().currsize == 1
    # unhashable arguments render without the cache, the same tokens
    call = Turn(tool_calls=(ToolCall("f", {"a": [1]}),))
    assert list(completion_tokens(call)) == render_completion(_messages(call))
    # an endless answer is the completion without its terminator, then filler that never ends
    whole = list(completion_tokens(Turn(endless=True)))
    it = turn_tokens(Turn(endless=True))
    head = [next(it) for _ in range(len(whole) + 50)]
    assert head[: len(whole) - 1] == whole[:-1] and harmony_tokens().return_ not in head
