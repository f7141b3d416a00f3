"""Run: a prepared turn -> its events, ending with exactly one terminal event, then finalize.

    engine.generate(ids) -> parser -> ResponseEvents -> Finalizer.finish(Outcome)

Only now is the parent's shared token buffer extended (at its tip: O(new)). A failure after the
response exists is a response with status ``failed``, not an exception: the client has already
seen ``response.created``.

``parallel_tool_calls: false`` allows one call per response. Harmony models stop at a call by
themselves (``<|call|>`` is a stop token); a chat-template model may write several
``<tool_call>`` blocks, so the turn stops the engine once the first call closed and drops what
followed. Its history is then the canonical rendering of the kept output (what a full render
would produce: exact), not the sampled tokens that ran past the call. When the consumer goes away mid-turn (socket closed, SSE client gone,
task cancelled) the generator is closed: the engine request is aborted and a ``cancelled``
snapshot with the tokens processed so far is finalized (and billed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from cache.seq import TokenSeq
from cache.store import ResponseStore
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.turn.compaction import Compactor, Summary
from gateway.turn.events import Event, ResponseEvents
from gateway.turn.finalize import Finalizer, Outcome
from gateway.turn.logprobs import LogprobAttribution
from gateway.turn.sampling import cache_salt_of
from gateway.turn.sealing import Sealer
from gateway.turn.types import PreparedTurn, UsageHook
from gateway.wire.kinds import CALL_TYPES, ResponseStatus
from gateway.wire.response import usage_object
from inference.engine import EngineError
from inference.parse import ItemEnd, ItemStart, ParseEvent

log = logging.getLogger(__name__)


class TurnRunner:
    def __init__(self, settings: Settings, store: ResponseStore, sealer: Sealer, compactor: Compactor,
                 finalizer: Finalizer, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.sealer = sealer
        self.compactor = compactor
        self.finalizer = finalizer
        self.metrics = metrics
        self._background: set[asyncio.Task[None]] = set()

    def _events(self, turn: PreparedTurn) -> ResponseEvents:
        reasoning = turn.req.reasoning
        mode = "summary" if (reasoning and (reasoning.summary or reasoning.generate_summary)) else (
            "raw" if self.settings.reasoning_text == "raw" else "hidden")
        return ResponseEvents(turn.response, reasoning_mode=mode,
                              seal=self.sealer.seal if turn.include_encrypted else None)

    async def run(self, turn: PreparedTurn, on_usage: UsageHook | None = None) -> AsyncIterator[Event]:
        t_run = time.perf_counter()
        events = self._events(turn)
        rendered = turn.rendered
        copied = 0
        if rendered.base_ids is not None:
            if not rendered.base_ids.is_tip():
                copied = 8 * len(rendered.base_ids)  # a fork or retry: the prefix is copied, account it
            turn_ids = rendered.base_ids.extend(rendered.new_ids)
        else:
            turn_ids = TokenSeq(rendered.new_ids)
        if not turn.input.generate:
            async for ev in self._warm_up(turn, events, turn_ids, copied, on_usage):
                yield ev
            return

        assert turn.sampling is not None
        prompt_ids = turn_ids.extend(rendered.gen_ids)
        parser = turn.route.renderer.parser(turn.input.prelude)
        sampled: list[int] = []
        cached = 0
        finish = None
        stop_token = None
        first_token_at: float | None = None
        sampling, summary, compacted = turn.sampling, None, None
        compact = self.compactor.wanted(turn)
        single = _SingleCall() if turn.req.parallel_tool_calls is False else None
        attribution = LogprobAttribution(turn.route.renderer) if turn.sampling.logprobs is not None else None
        agen = None
        finished_cleanly = False

        def spent() -> dict:
            usage = usage_object(len(prompt_ids), cached, len(sampled), parser.reasoning_tokens)
            return self.compactor.add_usage(usage, summary)

        try:
            created = events.created()
            # gateway time from the accepted turn to the engine request (the engine's own time is TTFT)
            self.metrics.stage.labels("engine_submit", turn.ctx.transport).observe(time.perf_counter() - t_run)
            for ev in created:
                yield ev
            try:
                if compact is not None:  # summarize first, continue on the pruned context
                    done = await self.compactor.compact_turn(turn, turn_ids, compact)
                    prompt_ids, sampling, summary, compacted = done.prompt_ids, done.sampling, done.summary, done.context
                    for ev in events.whole_item(done.item):
                        yield ev
                agen = turn.route.engine.generate(turn.id, prompt_ids, sampling)
                async for delta in agen:
                    if first_token_at is None and delta.token_ids:
                        first_token_at = time.perf_counter()
                    if delta.num_cached_tokens is not None:
                        cached = delta.num_cached_tokens
                    sampled.extend(delta.token_ids)
                    lps = None
                    if attribution is not None and delta.logprobs:
                        parsed, lps = attribution.feed(parser, delta.token_ids, delta.logprobs)
                    else:
                        parsed = parser.feed(delta.token_ids)
                    if single is not None:
                        parsed = single.keep(parsed)  # a prefix: the logprob indices stay valid
                    for ev in events.feed(parsed, lps):
                        yield ev
                    if single is not None and single.done and delta.finish_reason is None:
                        finish = "single_call"
                        await agen.aclose()  # stop the engine now: what follows the call is dropped
                        break
                    if delta.finish_reason is not None:
                        finish, stop_token = delta.finish_reason, delta.stop_token_id
                        if finish == "abort":
                            finish = "error"
            except EngineError as exc:
                log.warning("engine failed response %s: %s", turn.id, exc)
                finish = "error"
                summary = _partial(exc, summary)  # a failed compaction's tokens are billed too
            except ValueError as exc:  # the model's output did not parse (malformed format)
                log.warning("unparseable model output in response %s: %s", turn.id, exc)
                finish = "error"
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine crashed on response %s", turn.id)
                finish = "error"
            for ev in (events.feed(parser.finish()) if finish not in ("error", "single_call") else []):
                yield ev
            usage = spent()
            history: TokenSeq | None = None
            exact = finish == "stop" and stop_token is not None
            if finish == "single_call":
                history = _canonical_history(turn, prompt_ids, events.output)
                exact = history is not None
                if history is None:  # the renderer cannot say: keep what was sampled, re-render next turn
                    history = prompt_ids.extend(sampled)
                terminal = events.complete(usage)
            elif finish == "error":
                terminal = events.fail(usage, "server_error", "The model backend failed while generating.")
            elif finish == "length":
                terminal = events.incomplete(usage, "max_output_tokens")
                history, exact = _cut_history(turn, prompt_ids, sampled), True
            else:
                terminal = events.complete(usage)
                if exact:
                    history = prompt_ids.extend(turn.route.renderer.history_tokens(sampled))
                else:  # stopped without a stop token (a stop string): closed like a cut
                    history, exact = _cut_history(turn, prompt_ids, sampled), True
            self.finalizer.finish(turn, Outcome(
                events.status, events.output, usage, history, exact=exact,
                copied_bytes=copied, compacted=compacted, first_token_at=first_token_at), on_usage)
            finished_cleanly = True
            if turn.input.store and turn.ctx.transport == "http" and getattr(self.store, "shared", False):
                # An HTTP client may chain its next request through another replica: make the
                # write land before the client sees the end (one store round trip; WebSocket
                # continuations resolve from the connection cache and do not wait).
                await self.finalizer.wait_for(turn.id)
            for ev in terminal:
                yield ev
        finally:
            if agen is not None:
                await agen.aclose()  # aborts the engine request if it is still running
            if not finished_cleanly and events.status == ResponseStatus.IN_PROGRESS:
                # Nobody listens any more (socket closed, SSE client gone): record what was
                # processed and persist a terminal snapshot.
                self.metrics.aborts.labels(turn.ctx.transport).inc()
                usage = spent()
                events.cancel(usage)
                self.finalizer.finish(turn, Outcome(events.status, events.output, usage, None, exact=False,
                                                    first_token_at=first_token_at), on_usage)

    async def _warm_up(self, turn: PreparedTurn, events: ResponseEvents, turn_ids: TokenSeq, copied: int,
                       on_usage: UsageHook | None) -> AsyncIterator[Event]:
        """``generate: false``: a chain node with the new context and no output; no engine call."""
        usage = usage_object(len(turn_ids), 0, 0, 0)
        self.metrics.warmups.labels(turn.ctx.transport).inc()
        done = False
        try:
            for ev in events.created():
                yield ev
            terminal = events.complete(usage)
            self.finalizer.finish(turn, Outcome(events.status, events.output, usage, turn_ids, exact=True,
                                                copied_bytes=copied), on_usage)
            done = True
            self._prefill_later(turn, turn_ids)
            for ev in terminal:
                yield ev
        finally:
            if not done and events.status == ResponseStatus.IN_PROGRESS:
                events.cancel(usage)
                self.finalizer.finish(turn, Outcome(events.status, events.output, usage, None, exact=False),
                                      on_usage)

    def _prefill_later(self, turn: PreparedTurn, ids: TokenSeq) -> None:
        """Warm the engine's prefix cache with the warm-up's context, off the critical path."""
        if not len(ids):
            return

        async def prefill() -> None:
            try:
                await turn.route.engine.prefill(turn.id + "-prefill", ids, cache_salt_of(turn.ctx.tenant, turn.req))
            except Exception:  # a failed warm-up prefill only costs the next turn a longer prefill
                log.warning("prefill after warm-up %s failed", turn.id, exc_info=True)

        task = asyncio.get_running_loop().create_task(prefill(), name=f"prefill-{turn.id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Shutdown: stop background prefills."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


class _SingleCall:
    """``parallel_tool_calls: false``: passes parse events up to the end of the first tool call."""

    __slots__ = ("_in_call", "done")

    def __init__(self) -> None:
        self._in_call = False
        self.done = False

    def keep(self, events: list[ParseEvent]) -> list[ParseEvent]:
        for i, ev in enumerate(events):
            if isinstance(ev, ItemStart):
                if self._in_call:  # a new item closes the call implicitly
                    self.done = True
                    return events[:i]
                self._in_call = ev.kind in CALL_TYPES
            elif isinstance(ev, ItemEnd) and self._in_call:
                self.done = True
                return events[: i + 1]
        return events


def _canonical_history(turn: PreparedTurn, prompt_ids: TokenSeq, output: list[dict]) -> TokenSeq | None:
    """The prompt plus the canonical tokens of ``output`` (by the incremental contract, what a full
    render of the conversation would give), or None when the renderer's rendering does not start
    with the generation prompt the turn used."""
    gen = turn.rendered.gen_ids
    try:
        tokens = turn.route.renderer.render_items(output)
    except ValueError:
        return None
    if tokens[:len(gen)] != gen:
        return None
    return prompt_ids.extend(tokens[len(gen):])


def _cut_history(turn: PreparedTurn, prompt_ids: TokenSeq, sampled: list[int]) -> TokenSeq:
    """The history after a generation that ended without its stop token: the sampled tokens
    verbatim, the cut message closed as the format closes one (``Renderer.cut_history``), so the
    next turn appends to it (``gateway.turn.render``: equal to, or deliberately unlike, a full render)."""
    kept = turn.route.renderer.cut_history(sampled)
    if kept is not None:
        return prompt_ids.extend(kept)
    # cut inside the generation prompt's own header (harmony, a header longer than the cap):
    # nothing was said, so the history ends before the generation prompt (a copy: rare)
    return TokenSeq(prompt_ids[: len(prompt_ids) - len(turn.rendered.gen_ids)])


def _partial(exc: EngineError, summary: Summary | None) -> Summary | None:
    """What a failed compaction spent (``SummaryFailed.partial``), else what was spent before."""
    partial = getattr(exc, "partial", None)
    return partial if isinstance(partial, Summary) else summary
