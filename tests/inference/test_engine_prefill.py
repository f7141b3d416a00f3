"""``inference.engine.prefill_by_generating``: the warm-up the vLLM engines (in-process and remote)
share — a one-token, greedy, discarded generation under the request's cache salt and routing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from inference.engine import EngineStats, RequestRouting, SamplingParams, TokenDelta, prefill_by_generating
from inference.remote_vllm import RemoteVllmEngine, RemoteVllmSettings


class _Recording:
    """Stands in for an engine's ``generate``: records each call and streams two deltas."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], SamplingParams, RequestRouting | None]] = []
        self.drained = 0

    async def generate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        routing: RequestRouting | None = None,
    ) -> AsyncGenerator[TokenDelta, None]:
        self.calls.append((request_id, list(prompt_ids), params, routing))
        for token in (7, 8):
            self.drained += 1
            yield TokenDelta(token_ids=[token])


def test_prefill_generates_one_greedy_token_under_the_salt_and_routing_and_counts_it():
    fake, stats = _Recording(), EngineStats()
    routing = RequestRouting(session_key="s1")
    asyncio.run(prefill_by_generating(fake, stats, "warm-1", [1, 2, 3], "salt-a", routing))
    [(rid, ids, params, got_routing)] = fake.calls
    assert (rid, ids, got_routing) == ("warm-1", [1, 2, 3], routing)
    assert (params.max_tokens, params.temperature, params.cache_salt) == (1, 0.0, "salt-a")
    assert fake.drained == 2  # the stream is read to its end (the request is not aborted)
    assert stats.prefills == 1


def test_prefill_of_an_empty_prompt_does_nothing():
    fake, stats = _Recording(), EngineStats()
    asyncio.run(prefill_by_generating(fake, stats, "warm-2", [], None))
    assert fake.calls == [] and stats.prefills == 0


def test_remote_engine_prefills_through_its_generate_only_when_started():
    engine = RemoteVllmEngine(RemoteVllmSettings())
    fake = _Recording()
    engine.generate = fake.generate
    asyncio.run(engine.prefill("warm-3", [4, 5], "salt-b"))
    assert fake.calls == [] and engine.stats.prefills == 0  # not started: no client, nothing sent
    engine._client = object()  # started (the fake generate never uses it)
    routing = RequestRouting(session_key="s2")
    asyncio.run(engine.prefill("warm-3", [4, 5], "salt-b", routing))
    [(rid, ids, params, got_routing)] = fake.calls
    assert (rid, ids, params.max_tokens, params.cache_salt, got_routing) == ("warm-3", [4, 5], 1, "salt-b", routing)
    assert engine.stats.prefills == 1
