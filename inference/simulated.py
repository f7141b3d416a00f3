"""A simulated gpt-oss engine: the real :class:`~inference.engine.Engine` protocol, scripted outputs.

Why it exists: tests exercise the whole pipeline quickly and deterministically, and benchmarks
isolate gateway overhead from GPU time. So it must behave like the real thing at the boundary —
token ids in, canonical harmony token deltas out, prefix-cache reporting, stop tokens,
``max_tokens``, aborts on cancellation — while costing almost nothing itself. In particular a
turn's cost must not grow with the history (benchmarks send 128k-token prompts): the prompt is
read through :class:`~inference.simulated_prompt.PromptView` (tail + prelude only) and the prefix
cache compares list slices in C.

Timing model (all optional): ``ttft_s`` + uncached prompt tokens / ``prefill_tps`` before the
first delta, then ``len(delta) / decode_tps`` before each delta. Between deltas the engine always
yields to the event loop (``asyncio.sleep(0)``) so a fast simulated model never starves the
gateway's other connections.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Sequence

from inference.engine import EngineError, EngineStats, FinishReason, SamplingParams, TokenDelta, TokenLogprob
from inference.harmony_core import harmony_encoding, harmony_tokens
from inference.simulated_prompt import PromptView
from inference.simulated_script import Script, Turn, default_script, turn_tokens

__all__ = ["CacheMatch", "PrefixCache", "SimulatedEngine", "common_prefix_len"]


def common_prefix_len(a: Sequence[int], b: Sequence[int], first_chunk: int = 2048) -> int:
    """Length of the common prefix of two lists, with every comparison a C-level slice compare.

    The common case — ``a`` continues ``b``, a turn extending a served sequence — is checked
    first: a 64-token probe at the end of the shorter list, then one whole-prefix compare.
    Otherwise chunks grow geometrically (galloping), so a mismatch costs O(common prefix + one
    chunk): sequences of other conversations, which share only the prelude, are rejected after a
    few thousand tokens. The mismatching chunk is then bisected.
    """
    n = min(len(a), len(b))
    k = max(0, n - 64)
    if a[k:n] == b[k:n]:
        short, other = (a, b) if len(a) == n else (b, a)
        if other[:n] == short:
            return n
    lo, step = 0, first_chunk
    while lo < n:
        hi = min(lo + step, n)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, step = hi, step * 2
    else:
        return n
    # a[:lo] == b[:lo] and a[lo:hi] != b[lo:hi]: bisect for the first difference
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class CacheMatch:
    """Result of :meth:`PrefixCache.lookup`."""

    #: prompt tokens served from cache (what the engine reports as ``num_cached_tokens``)
    cached: int
    #: entries that are whole prefixes of the prompt: the request's sequence supersedes them
    covered: tuple[list[int], ...] = ()


def synthetic_logprob(token_id: int, position: int, top: int) -> TokenLogprob:
    """The simulated model's logprobs: made up but deterministic and well formed (the sampled
    token is the most likely, alternatives are neighbouring ids), so the gateway's logprob path
    is exercised without weights. Real values come from the real engines."""
    sampled = -0.05 * (1 + position % 5)
    alts = tuple((token_id + k, sampled - 1.5 * k) for k in range(1, top))
    return TokenLogprob(token_id, sampled, ((token_id, sampled), *alts) if top else ())


class PrefixCache:
    """A small LRU of served sequences (prompt + output but its last token), like the KV blocks
    a real engine keeps.

    ``lookup`` reports how many prompt tokens a paged-attention engine would serve from cache:
    the longest common prefix with any entry, rounded down to whole blocks, and never the whole
    prompt (the last prompt token is always recomputed to produce logits, as in vLLM). ``add``
    drops the entries the new sequence extends, so an agent loop holds one entry per
    conversation and a turn costs about one pass over its prompt, in C. Entries are kept per
    ``cache_salt``, as vLLM folds the salt into its block hashes: a prompt never hits a sequence
    served under another salt.
    """

    def __init__(self, entries: int = 8, block_size: int = 16) -> None:
        self._entries: list[list[int]] = []
        self._salts: dict[int, str | None] = {}
        self._max = max(1, entries)
        self._block = max(1, block_size)

    def lookup(self, prompt: list[int], salt: str | None = None) -> CacheMatch:
        best = 0
        covered = []
        for seq in self._entries:
            if self._salts.get(id(seq)) != salt:
                continue
            n = common_prefix_len(prompt, seq)
            best = max(best, n)
            if n == len(seq):
                covered.append(seq)
        best = min(best, len(prompt) - 1)
        return CacheMatch(max(0, best - best % self._block), tuple(covered))

    def add(self, seq: list[int], supersedes: Sequence[list[int]] = (), salt: str | None = None) -> None:
        gone = {id(s) for s in supersedes}
        self._entries = [s for s in self._entries if id(s) not in gone]
        self._entries.append(seq)
        del self._entries[: -self._max]
        self._salts = {id(s): self._salts.get(id(s)) for s in self._entries}
        self._salts[id(seq)] = salt


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


def _as_list(ids: Sequence[int]) -> list[int]:
    """The prompt as a list, copied in C when it is a list-backed view (``AppendOnlyView``
    slices its buffer): iterating a 128k-token view in Python would cost milliseconds."""
    if isinstance(ids, list):
        return ids
    got = ids[0 : len(ids)]
    return got if isinstance(got, list) else list(got)


class SimulatedEngine:
    """:class:`inference.engine.Engine` that samples from a script instead of weights.

    Args:
        script: ``script(view) -> Turn | None``; ``None`` (or a ``None`` result) uses
            :func:`~inference.simulated_script.default_script`.
        ttft_s: fixed delay before the first delta.
        prefill_tps: prompt tokens per second for the *uncached* part of the prompt (0 = free).
        decode_tps: output tokens per second (0/None = no delay).
        tokens_per_delta: tokens per :class:`TokenDelta`.
        prefix_cache: emulate a prefix cache and report ``num_cached_tokens``.
        cache_entries, cache_block_size: size of that cache and its block granularity.
        record_prompts: append every prompt (as a list) to ``stats.prompts``.
        eos_token_ids: tokens that end a generation regardless of ``params`` — by default
            harmony's ``<|return|>`` and ``<|call|>``, like gpt-oss's generation config.
        paced: keep to a wall clock: token *i* is due ``ttft + prefill + i / decode_tps`` after
            the request, however long the consumer took with the previous delta — like a real
            engine decoding in its own process while the gateway streams; tokens that fell due
            while the consumer was busy come as one delta, as vLLM's output collector merges the
            outputs a slow consumer has not taken. Off (the default), each delta's delay starts
            when the consumer asks for it, so consumer time adds up.
    """

    def __init__(
        self,
        *,
        script: Script | None = None,
        ttft_s: float = 0.0,
        prefill_tps: float | None = None,
        decode_tps: float | None = None,
        tokens_per_delta: int = 1,
        prefix_cache: bool = True,
        cache_entries: int = 8,
        cache_block_size: int = 16,
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
        self.stats = EngineStats()
        self._cache = PrefixCache(cache_entries, cache_block_size) if prefix_cache else None
        self._eos = eos_token_ids
        self._started = False

    async def start(self) -> None:
        # load the encoding now, not inside the first request's latency
        harmony_encoding()
        tok = harmony_tokens()
        if self._eos is None:
            self._eos = (tok.return_, tok.call)
        self._started = True

    async def shutdown(self) -> None:
        self._started = False

    def ready(self) -> bool:
        return self._started

    async def prefill(self, request_id: str, prompt_ids: Sequence[int], cache_salt: str | None = None) -> None:
        """Warm the emulated prefix cache (and pay the emulated prefill time)."""
        if self._cache is None:
            return
        prompt = _as_list(prompt_ids)
        cached = self._cache.lookup(prompt, cache_salt)
        if self.prefill_tps:
            await asyncio.sleep((len(prompt) - cached.cached) / self.prefill_tps)
        self._cache.add(list(prompt), supersedes=cached.covered, salt=cache_salt)
        self.stats.prefills += 1

    def _turn(self, prompt: list[int]) -> Turn:
        view = PromptView(prompt)
        turn = self.script(view) if self.script is not None else None
        return turn if turn is not None else default_script(view)

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        if not self._started:
            raise EngineError("simulated engine is not started")
        clock = asyncio.get_running_loop().time
        t_request = clock()  # paced: the emulation's own work (cache lookup, script) is inside the budget
        # The script only reads the prompt's tail and prelude, so a list copy (O(history)) is made
        # only for what needs the whole prompt: prefix-cache emulation and prompt recording.
        needs_copy = self._cache is not None or self.record_prompts
        prompt = _as_list(prompt_ids) if needs_copy else prompt_ids
        if not len(prompt):
            raise EngineError("empty prompt")
        stats = self.stats
        stats.admit(len(prompt))
        if self.record_prompts:
            stats.prompts.append(list(prompt))
        output: list[int] = []
        match = CacheMatch(0)
        outcome = "aborted"
        try:
            match = self._cache.lookup(prompt, params.cache_salt) if self._cache is not None else CacheMatch(0)
            cached = match.cached
            stats.cached_tokens += cached
            turn = self._turn(prompt)
            delay = self.ttft_s
            if self.prefill_tps:
                delay += (len(prompt) - cached) / self.prefill_tps
            if self.paced:
                due = t_request + delay
                await asyncio.sleep(max(0.0, due - clock()))
            else:
                await asyncio.sleep(delay)
            per_token = turn.delay_per_token_s
            if per_token is None:
                per_token = 1.0 / self.decode_tps if self.decode_tps else 0.0
            deltas = _chunks(
                turn_tokens(turn),
                stops=frozenset(params.stop_token_ids) | frozenset(self._eos or ()),
                max_tokens=params.max_tokens,
                per_delta=self.tokens_per_delta,
                fail_after=turn.fail_after_tokens,
            )
            first = True
            ahead = next(deltas, None)
            while ahead is not None:
                chunk, finish, stop_id, fail = ahead
                ahead = None
                if fail and not chunk:
                    raise EngineError(f"simulated failure after {len(output)} tokens")
                if self.paced:
                    due += per_token * len(chunk)
                    await asyncio.sleep(max(0.0, due - clock()))
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
                    await asyncio.sleep(per_token * len(chunk))
                output += chunk
                stats.generated_tokens += len(chunk)
                yield TokenDelta(
                    token_ids=chunk,
                    finish_reason=finish,
                    num_cached_tokens=cached if first else None,
                    stop_token_id=stop_id,
                    logprobs=None if params.logprobs is None else [
                        synthetic_logprob(tok, len(output) - len(chunk) + i, params.logprobs)
                        for i, tok in enumerate(chunk)],
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
            if self._cache is not None:
                # the last sampled token is never fed back, so a real engine holds no KV for it;
                # this is also what makes a harmony chain (<|return|> -> <|end|>) hit the cache
                self._cache.add(list(prompt) + output[:-1], supersedes=match.covered, salt=params.cache_salt)
