"""A simulated gpt-oss engine: the real :class:`~inference.engine.Engine` protocol, scripted outputs.

Why it exists: tests exercise the whole pipeline quickly and deterministically, and benchmarks
isolate gateway overhead from GPU time. So it must behave like the real thing at the boundary —
token ids in, canonical harmony token deltas out, prefix-cache reporting, stop tokens,
``max_tokens``, aborts on cancellation — while costing almost nothing itself. In particular a
turn's cost must not grow with the history (benchmarks send 128k-token prompts): the prompt is
read through :class:`~inference.simulated_prompt.PromptView` (the newest message; the prelude once
per sequence), the prefix cache (:mod:`inference.simulated_cache`) hashes each block of a sequence
once, and nothing copies the prompt (but ``record_prompts``). ``stats`` counts that work.

Per delta it must cost almost nothing too: the zero-latency benchmarks count this process's
bytecodes, and the stand-in's share is not the gateway's. So a turn whose answer is finite and
can neither fail nor wait (nearly all: no pacing, no decode delay, no logprobs) is cut into its
deltas at once, in C (:func:`_plan`), and each delta then costs a count, a hand-over and one bare
yield to the loop; the rest (endless answers, failures, pacing, logprobs) walk the plan a token at
a time (:func:`_chunks`). Both give the same deltas, stats and cache state.

Timing model (all optional): ``ttft_s`` + uncached prompt tokens / ``prefill_tps`` before the
first delta, then ``len(delta) / decode_tps`` before each delta. Between deltas the engine always
yields to the event loop (``asyncio.sleep(0)``) so a fast simulated model never starves the
gateway's other connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference.engine import (
    EngineError,
    EngineStats,
    FinishReason,
    RequestRouting,
    SamplingParams,
    TokenDelta,
    TokenLogprob,
)
from inference.harmony_core import harmony_encoding, harmony_tokens
from inference.simulated_cache import Admission, BlockPrefixCache, CacheWork, Known, KnownSequences
from inference.simulated_prompt import PromptView
from inference.simulated_script import Script, Turn, completion_tokens, default_script, turn_tokens

__all__ = ["SimulatedEngine", "SimulatedStats"]


def synthetic_logprob(token_id: int, position: int, top: int) -> TokenLogprob:
    """The simulated model's logprobs: made up but deterministic and well formed (the sampled
    token is the most likely, alternatives are neighbouring ids), so the gateway's logprob path
    is exercised without weights. Real values come from the real engines."""
    sampled = -0.05 * (1 + position % 5)
    alts = tuple((token_id + k, sampled - 1.5 * k) for k in range(1, top))
    return TokenLogprob(token_id, sampled, ((token_id, sampled), *alts) if top else ())


def _chunks(
    tokens: Iterator[int],
    *,
    stops: frozenset[int],
    max_tokens: int | None,
    per_delta: int,
    fail_after: int | None,
) -> Iterator[tuple[list[int], FinishReason | None, int | None, bool]]:
    """Cut the token plan into deltas: ``(tokens, finish_reason, stop_token_id, fail_now)``.

    A plan ends with its own stop token (``<|return|>``/``<|call|>``), reported as the stop even
    when it is not in ``stops``; one token of look-ahead finds that end without materialising an
    endless plan.
    """
    sent = 0
    chunk: list[int] = []
    it = iter(tokens)
    nxt = next(it, None)
    while nxt is not None:
        tok, nxt = nxt, next(it, None)
        if fail_after is not None and sent + len(chunk) >= fail_after:
            yield chunk, None, None, True
            return
        chunk.append(tok)
        if tok in stops or nxt is None:
            yield chunk, "stop", tok, False
            return
        if max_tokens is not None and sent + len(chunk) >= max_tokens:
            yield chunk, "length", None, False
            return
        if len(chunk) >= per_delta:
            sent += len(chunk)
            yield chunk, None, None, False
            chunk = []


def _plan(
    tokens: Sequence[int],
    stops: frozenset[int],
    max_tokens: int | None,
    per_delta: int,
) -> tuple[list[list[int]], int, FinishReason | None, int | None]:
    """The deltas of a finite plan that cannot fail, cut at once: ``(chunks, end, finish_reason,
    stop_token_id)``, where ``end`` is how many tokens the chunks hold.

    The same cut as :func:`_chunks` (the first stop token or the plan's last token ends it with
    ``"stop"``; ``max_tokens``, at least one token, ends it earlier with ``"length"``), found with
    C-level searches instead of a Python step and a look-ahead per token: a zero-latency turn's
    deltas are what the benchmarks count, and this is the plan of nearly every turn.
    """
    n = len(tokens)
    if not n:
        return [], 0, None, None
    hit = stops.intersection(tokens)
    end = min(map(tokens.index, hit)) + 1 if hit else n
    finish: FinishReason
    if max_tokens is not None and (max_tokens if max_tokens > 1 else 1) < end:
        end, finish, stop_id = (max_tokens if max_tokens > 1 else 1), "length", None
    else:
        finish, stop_id = "stop", tokens[end - 1]
    cut = tokens[:end] if end < n else tokens
    b = per_delta
    if b == 1:
        return list(map(list, zip(cut))), end, finish, stop_id
    return (
        list(map(list, map(cut.__getitem__, map(slice, range(0, end, b), range(b, end + b, b))))),
        end,
        finish,
        stop_id,
    )


class _YieldNow:
    """``await _yield_now`` is ``await asyncio.sleep(0)`` at the least cost per delta: one bare
    ``yield`` to the task, which reschedules itself behind the loop's other ready callbacks (what
    ``asyncio.sleep(0)`` does through two Python frames). ``__await__`` is a C-level one-item
    iterator, fresh per await, so waiting costs no Python frame; a cancellation or ``aclose``
    lands at the ``await`` as at any other."""

    __slots__ = ()
    if TYPE_CHECKING:  # what the iterator is, to the checker: a generator that yields once

        def __await__(self) -> Generator[None, None, None]: ...
    else:
        __await__ = (None,).__iter__


_yield_now = _YieldNow()


@dataclass
class SimulatedStats(EngineStats):
    """:class:`EngineStats` plus the emulation's own work, counted in operations (not time), so
    tests can assert that a turn's work does not grow with its history."""

    #: the prefix cache's hashing and lookups
    cache: CacheWork = field(default_factory=CacheWork)
    #: prompt tokens the prompt view read for the script (the newest message, a prelude once)
    prompt_tokens_read: int = 0
    #: prompt tokens copied whole (only ``record_prompts`` does)
    prompt_tokens_copied: int = 0


class SimulatedEngine:
    """:class:`inference.engine.Engine` that samples from a script instead of weights.

    Args:
        script: ``script(view) -> Turn | None``; ``None`` (or a ``None`` result) uses
            :func:`~inference.simulated_script.default_script`.
        ttft_s: fixed delay before the first delta.
        prefill_tps: prompt tokens per second for the *uncached* part of the prompt (0 = free).
        decode_tps: output tokens per second (0/None = no delay).
        tokens_per_delta: tokens per :class:`TokenDelta`.
        prefix_cache: emulate vLLM's automatic prefix caching and report ``num_cached_tokens``
            (:mod:`inference.simulated_cache`: whole blocks, never the whole prompt).
        cache_block_size: its block size in tokens (vLLM's default is 16).
        cache_tokens: its capacity in tokens (the KV space), evicted least recently used.
        cache_entries: how many append-only sequences (conversations) the engine remembers, so
            a continuation of one hashes only its new blocks and re-reads none of its prelude.
        record_prompts: append every prompt (as a list) to ``stats.prompts`` — the one whole-prompt
            copy the engine makes, and only when asked.
        eos_token_ids: tokens that end a generation regardless of ``params`` — by default
            harmony's ``<|return|>`` and ``<|call|>``, like gpt-oss's generation config.
        paced: keep to a wall clock: token *i* is due ``ttft + prefill + i / decode_tps`` after
            the request, however long the consumer took with the previous delta — like a real
            engine decoding in its own process while the gateway streams; tokens that fell due
            while the consumer was busy come as one delta, as vLLM's output collector merges the
            outputs a slow consumer has not taken. Off (the default), each delta's delay starts
            when the consumer asks for it, so consumer time adds up.
    """

    #: ``inference.engine.can_steer``: an aclose stops it at the last delta handed over, and the
    #: successor's prompt hits its prefix cache
    steerable = True

    def __init__(
        self,
        *,
        script: Script | None = None,
        ttft_s: float = 0.0,
        prefill_tps: float | None = None,
        decode_tps: float | None = None,
        tokens_per_delta: int = 1,
        prefix_cache: bool = True,
        cache_entries: int = 32,
        cache_block_size: int = 16,
        cache_tokens: int = 1 << 20,
        record_prompts: bool = False,
        eos_token_ids: Sequence[int] | None = None,
        name: str = "simulated",
        paced: bool = False,
    ) -> None:
        self.name = name
        self.script = script
        self.ttft_s = ttft_s
        self.prefill_tps = prefill_tps
        self.decode_tps = decode_tps
        self.tokens_per_delta = max(1, tokens_per_delta)
        self.record_prompts = record_prompts
        self.paced = paced
        self.stats = SimulatedStats()
        self._cache = BlockPrefixCache(cache_block_size, cache_tokens, self.stats.cache) if prefix_cache else None
        self._known = KnownSequences(cache_entries)
        self._eos = eos_token_ids
        #: the stop tokens every request has (``params.stop_token_ids`` add to them), set once
        self._stops: frozenset[int] = frozenset(eos_token_ids or ())
        self._started = False

    async def start(self) -> None:
        # load the encoding now, not inside the first request's latency
        harmony_encoding()
        tok = harmony_tokens()
        if self._eos is None:
            self._eos = (tok.return_, tok.call)
        self._stops = frozenset(self._eos)
        self._started = True

    async def shutdown(self) -> None:
        self._started = False

    def ready(self) -> bool:
        return self._started

    async def prefill(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        cache_salt: str | None = None,
        routing: RequestRouting | None = None,
    ) -> None:
        """Warm the emulated prefix cache (and pay the emulated prefill time)."""
        if self._cache is None:
            return
        adm = self._cache.admit(prompt_ids, cache_salt, self._known.find(prompt_ids))
        try:
            if self.prefill_tps:
                await asyncio.sleep((len(prompt_ids) - adm.cached) / self.prefill_tps)
        finally:
            self._cache.finish(adm)
        self.stats.prefills += 1

    def _turn(self, prompt: Sequence[int], known: Known | None) -> Turn:
        """Run the script on a view of the prompt; a remembered sequence lends its prelude, and
        learns it when the view read it."""
        view = PromptView(prompt, known.notes if known is not None else None)
        script = self.script
        try:
            turn = script(view) if script is not None else None
            return turn if turn is not None else default_script(view)
        finally:
            self.stats.prompt_tokens_read += view.tokens_read
            if known is not None and known.notes is None:
                known.notes = view.known_prelude

    async def generate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        routing: RequestRouting | None = None,  # in-process: nothing to route
    ) -> AsyncGenerator[TokenDelta, None]:
        if not self._started:
            raise EngineError("simulated engine is not started")
        paced = self.paced
        if paced:  # the emulation's own work (cache lookup, script) is inside the budget
            clock = asyncio.get_running_loop().time
            t_request = clock()
        # The prompt is never copied or scanned whole (a continuation costs O(new tokens)): the
        # cache hashes only blocks it has not seen for this sequence, the script reads the tail.
        prompt = prompt_ids
        n_prompt = len(prompt)
        if not n_prompt:
            raise EngineError("empty prompt")
        stats = self.stats
        stats.admit(n_prompt)
        if self.record_prompts:
            stats.prompts.append(list(prompt))
            stats.prompt_tokens_copied += n_prompt
        output: list[int] = []
        planned: Sequence[int] | None = None  # the fast path's plan: its first ``sent`` tokens went out
        sent = 0
        cache = self._cache
        adm: Admission | None = None
        outcome = "aborted"
        try:
            known = self._known.find(prompt)
            if cache is not None:
                adm = cache.admit(prompt, params.cache_salt, known)
                cached = adm.cached
                stats.cached_tokens += cached
            else:
                cached = 0
            turn = self._turn(prompt, known)
            delay = self.ttft_s
            if self.prefill_tps:
                delay += (n_prompt - cached) / self.prefill_tps
            if paced:
                due = t_request + delay
                await asyncio.sleep(max(0.0, due - clock()))
            elif delay > 0:
                await asyncio.sleep(delay)
            else:
                await _yield_now
            per_token = turn.delay_per_token_s
            if per_token is None:
                per_token = 1.0 / self.decode_tps if self.decode_tps else 0.0
            stops = self._stops
            if params.stop_token_ids:
                stops = stops.union(params.stop_token_ids)
            top = params.logprobs
            if not (paced or per_token or top is not None or turn.endless or turn.fail_after_tokens is not None):
                # Nearly every turn (and every zero-latency benchmark turn): a finite plan that
                # cannot fail, with nothing to time and no logprobs. Cut once, then per delta only
                # count, hand over and yield to the loop — the same deltas as the general path.
                planned = completion_tokens(turn)
                b = self.tokens_per_delta
                chunks, end, finish, stop_id = _plan(planned, stops, params.max_tokens, b)
                await _yield_now  # the first delta's own (zero) decode time, as below
                if len(chunks) == 1:
                    sent = end
                    stats.generated_tokens += end
                    yield TokenDelta(chunks[0], finish, cached, stop_id, None)
                elif chunks:
                    sent = b
                    stats.generated_tokens += b
                    yield TokenDelta(chunks[0], None, cached, None, None)
                    await _yield_now
                    # ``sent`` moves with the delta handed over: an abort at the yield, or at the
                    # wait after it, finds it counted, as the general path's ``output``
                    for sent, chunk in zip(range(b + b, end, b), chunks[1:-1]):  # noqa: B007 (read after the loop)
                        stats.generated_tokens += b
                        yield TokenDelta(chunk, None, None, None, None)
                        await _yield_now
                    stats.generated_tokens += end - sent
                    sent = end
                    yield TokenDelta(chunks[-1], finish, None, stop_id, None)
                outcome = "finished"
                return
            deltas = _chunks(
                turn_tokens(turn),
                stops=stops,
                max_tokens=params.max_tokens,
                per_delta=self.tokens_per_delta,
                fail_after=turn.fail_after_tokens,
            )
            first = True
            # the loop runs once a delta: what it reads is local (the stand-in's own cost is what
            # the zero-latency benchmarks must not measure)
            sleep = asyncio.sleep
            ahead = next(deltas, None)
            while ahead is not None:
                chunk, finish, stop_id, fail = ahead
                ahead = None
                if fail and not chunk:
                    raise EngineError(f"simulated failure after {len(output)} tokens")
                if paced:
                    due += per_token * len(chunk)
                    await sleep(max(0.0, due - clock()))
                    # The engine kept decoding while the consumer was busy: like vLLM's output
                    # collector, hand over what was already produced (due by now) as one delta.
                    # Only a paced engine with a decode rate has a "by now"; one clock read, so
                    # merging cannot chase a clock that moves while it merges.
                    now = clock()
                    merged = False
                    while per_token and finish is None and not fail:
                        ahead = next(deltas, None)
                        if ahead is None or ahead[3] or due + per_token * len(ahead[0]) > now:
                            break
                        if not merged:
                            chunk, merged = list(chunk), True
                        due += per_token * len(ahead[0])
                        chunk.extend(ahead[0])
                        _, finish, stop_id, fail = ahead
                        ahead = None
                else:
                    await sleep(per_token * len(chunk))
                output += chunk
                stats.generated_tokens += len(chunk)
                yield TokenDelta(
                    chunk,
                    finish,
                    cached if first else None,
                    stop_id,
                    None
                    if top is None
                    else [synthetic_logprob(tok, len(output) - len(chunk) + i, top) for i, tok in enumerate(chunk)],
                )
                first = False
                if fail:
                    raise EngineError(f"simulated failure after {len(output)} tokens")
                if ahead is None and finish is None:
                    ahead = next(deltas, None)
            outcome = "finished"
        except EngineError:
            outcome = "failed"
            raise
        except Exception as e:  # a broken script is an engine failure, not an abort
            outcome = "failed"
            raise EngineError(f"simulated engine failed: {e!r}") from e
        finally:
            stats.running -= 1
            if outcome == "aborted":
                stats.aborts += 1
            if adm is not None and cache is not None:  # (an admission is only made with a cache)
                # the last sampled token is never fed back, so a real engine holds no KV for it;
                # this is also what makes a harmony chain (<|return|> -> <|end|>) hit the cache
                cache.finish(adm, output[:-1] if planned is None else planned[: sent - 1] if sent > 1 else ())
