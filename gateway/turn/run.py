"""Run: a prepared turn -> its events, ending with exactly one terminal event, then finalize.

    engine.generate(ids) -> parser -> ResponseEvents -> [store] -> Finalizer.settle(Outcome) -> terminal
        -> Finalizer.keep (caches, quota, metrics: after the terminal is handed over, before the next turn)

Only now is the parent's shared token buffer extended (at its tip: O(new)). A failure after the
response exists is a response with status ``failed``, not an exception: the client has already
seen ``response.created``. That holds for every fault — an ``EngineError``, output that does not
parse, any other exception, and the ``BaseException`` subclasses native code raises for its own
bugs (pyo3's ``PanicException``), logged once with the traceback — but never for cancellation or
interpreter exit (``gateway.wire.errors.is_fault``).

**What the client is told is what is billed.** The terminal is built, then (``store=true`` and
chainable) held until the store write lands — on failure it is withdrawn and the response fails
("The response could not be stored…") — then the outcome is billed, then the terminal is sent, and
only then is the state kept (``Finalizer.keep``: the client reads while it runs). A turn that
ends before it is billed (its consumer gone, or cut by the shutdown deadline) is billed as
``cancelled``, once, with what it generated.

``parallel_tool_calls: false`` allows one call per response. Harmony models stop at a call by
themselves (``<|call|>`` is a stop token); a chat-template model may write several
``<tool_call>`` blocks, so the turn stops the engine once the first call closed and drops what
followed. Its history is then the canonical rendering of the kept output (what a full render
would produce: exact), not the sampled tokens that ran past the call. When the consumer goes away
mid-turn (socket closed, SSE client gone, task cancelled) the generator is closed: the engine
request is aborted and a ``cancelled`` snapshot with the tokens processed so far is finalized
(and billed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import msgspec
import orjson

from cache.response_state import ResponseState
from cache.response_store import ResponseStore
from cache.seq import TokenSeq
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.containers.model import Containers
from gateway.files.vector_stores import VectorStores
from gateway.tools.browser import Browser
from gateway.tools.calls import CALL_KINDS, CallRunner
from gateway.tools.citations import CitationWriter
from gateway.tools.code_interpreter import CodeInterpreterRunner
from gateway.tools.file_search import FileSearchRunner
from gateway.tools.hosted import HostedTools
from gateway.tools.web import WebRunner, WebSearch
from gateway.turn.classify import ClassifyStage
from gateway.turn.compaction import Compactor, Summary
from gateway.turn.events import Event, ResponseEvents
from gateway.turn.finalize import Finalizer, Outcome
from gateway.turn.logprobs import LogprobAttribution
from gateway.turn.sampling import cache_salt_of, text_format
from gateway.turn.sealing import Sealer
from gateway.turn.tool_loop import ToolLoop, ToolRound
from gateway.turn.types import PreparedTurn, UsageHook
from gateway.wire.errors import is_fault
from gateway.wire.kinds import CALL_TYPES, ResponseStatus
from gateway.wire.response import usage_object
from inference.engine import EngineError, SamplingParams
from inference.hosted_items import call_of
from inference.item_types import ItemType
from inference.parse import ItemEnd, ItemStart, ParseEvent, StreamParser

log = logging.getLogger(__name__)


def _citations(browser: Browser | None, runners: Sequence[CallRunner]) -> Callable[[], CitationWriter] | None:
    """Each message's citation writer, when the response shows the model something to cite: the
    browser's pages (``web_search``), the passages of the files (``file_search``)."""
    files = next((r for r in runners if isinstance(r, FileSearchRunner)), None)
    if browser is None and files is None:
        return None
    return functools.partial(
        CitationWriter,
        browser.source if browser is not None else None,
        resolve_file=files.source if files is not None else None,
        check_titles=True,
    )


class TurnRunner:
    def __init__(
        self,
        settings: Settings,
        store: ResponseStore,
        sealer: Sealer,
        compactor: Compactor,
        finalizer: Finalizer,
        metrics: Metrics,
        hosted: HostedTools | None = None,
        classify: ClassifyStage | None = None,
        web: WebSearch | None = None,
        files: VectorStores | None = None,
    ) -> None:
        self.settings = settings
        #: the ``web_search`` side (``gateway.tools.web``): each response that offers it gets a browser
        self.web = web
        #: the vector stores ``file_search`` searches (``gateway.tools.file_search``)
        self.files = files
        #: the containers ``code_interpreter`` runs code in (``gateway.containers``; set by the pipeline)
        self.containers: Containers | None = None
        #: the MCP side (``gateway.tools.hosted``) and the classifiers tool outputs go through
        self.hosted = hosted
        self.classify = classify
        self.store = store
        self.sealer = sealer
        self.compactor = compactor
        self.finalizer = finalizer
        self.metrics = metrics
        self._background: set[asyncio.Task[None]] = set()

    def _events(self, turn: PreparedTurn, runners: Sequence[CallRunner], browser: Browser | None) -> ResponseEvents:
        reasoning = turn.req.reasoning
        mode = (
            "summary"
            if (reasoning and (reasoning.summary or reasoning.generate_summary))
            else ("raw" if self.settings.reasoning_text == "raw" else "hidden")
        )
        code = next((r for r in runners if isinstance(r, CodeInterpreterRunner)), None)
        return ResponseEvents(
            turn.response,
            reasoning_mode=mode,
            seal=self.sealer.seal if turn.include_encrypted else None,
            hosted=turn.input.hosted,
            citations=_citations(browser, runners),
            calls=[r.kind for r in runners],
            call_fields={code.kind.namespace: code.pending()} if code is not None else None,
            container_files=code.source if code is not None else None,
        )

    async def run(self, turn: PreparedTurn, on_usage: UsageHook | None = None) -> AsyncGenerator[Event, None]:
        """The turn's events one at a time: :meth:`batches`, flattened."""
        batches = self.batches(turn, on_usage)
        try:
            async for batch in batches:
                for ev in batch:
                    yield ev
        finally:
            await batches.aclose()  # a consumer that stopped early: the turn is cancelled and billed

    async def batches(self, turn: PreparedTurn, on_usage: UsageHook | None = None) -> AsyncGenerator[list[Event], None]:
        """The turn's events in the groups they are produced in: ``response.created`` with
        ``in_progress``, then what each engine delta made (an item's opening, a text delta, an
        item's closing), then the terminal group. Never an empty group.

        Why groups: a transport that writes a group at once checks the socket's state and frames
        the group in one call (``gateway.transport.ws``) instead of once per event: a short turn
        is ~15 events in ~6 groups."""
        t_run = time.perf_counter()
        clock = turn.clock  # laps: engine_submit, compact, engine_ttft, streaming (then store, finalize, billing)
        web = turn.input.hosted.web
        browser = self.web.browser(web) if web is not None and self.web is not None and turn.input.generate else None
        runners: list[CallRunner] = []
        if browser is not None and web is not None and self.web is not None:
            runners.append(WebRunner(self.web, browser, web, turn.clock))
        files = turn.input.hosted.files
        if files is not None and self.files is not None and turn.input.generate:
            runners.append(
                FileSearchRunner(self.files, files, turn.ctx.tenant, turn.clock, self.settings.tool_output_bytes)
            )
        code = turn.input.hosted.code
        coder: CodeInterpreterRunner | None = None
        if code is not None and code.container_id is not None and self.containers is not None and turn.input.generate:
            coder = CodeInterpreterRunner(
                self.containers,
                code,
                turn.ctx.tenant,
                turn.clock,
                self.settings.tool_output_bytes,
                self.settings.container_run_timeout_s,
            )
            runners.append(coder)
            await coder.prime()
        events = self._events(turn, runners, browser)
        rendered = turn.rendered
        copied = 0
        if rendered.base_ids is not None:
            if not rendered.base_ids.is_tip():
                copied = rendered.base_ids.itemsize * len(
                    rendered.base_ids
                )  # a fork or retry: the prefix is copied, account it
            turn_ids = rendered.base_ids.extend(rendered.new_ids)
        else:
            turn_ids = TokenSeq(rendered.new_ids)
        if not turn.input.generate:
            # closed with this generator, not left to the garbage collector's task: a consumer that
            # stops at the terminal has the warm-up kept (or cancelled) before its own close returns
            async with contextlib.aclosing(self._warm_up(turn, events, turn_ids, copied, on_usage)) as warm:
                async for batch in warm:
                    yield batch
            return

        assert turn.sampling is not None
        renderer = turn.route.renderer
        sampling, summary, compacted = turn.sampling, None, None
        compact = self.compactor.wanted(turn)
        attribution = LogprobAttribution(renderer) if turn.sampling.logprobs is not None else None
        hosted = turn.input.hosted
        tools = (
            ToolLoop(self.hosted, self.classify, turn, self.settings.max_hosted_calls, runners)
            if hosted.active
            else None
        )
        steer = turn.ctx.steer  # a WebSocket steer: read at each delta (``SteerSignal``)
        gen: _Pass | None = None
        #: every engine pass of the turn (one, unless the gateway ran tools between them)
        passes: list[_Pass] = []
        prompt_ids = turn_ids.extend(rendered.gen_ids)
        #: the history when the turn ended right after running tools (their outputs at its tip)
        tip_history: TokenSeq | None = None
        last_tip: TokenSeq | None = None  # the history after the last round of tools
        first_token_at: float | None = None
        agen = None
        #: the terminal events built and not yet sent (a cut before billing withdraws them)
        pending: list[Event] | None = None
        settled = False  # the outcome is billed
        finish: str | None = None
        stop_token = None

        def spent() -> dict[str, Any]:
            if not passes:  # ended before the engine pass (as a turn always was: its prompt counts)
                return self.compactor.add_usage(usage_object(len(prompt_ids), 0, 0, 0), summary)
            usage = usage_object(
                sum(len(p.prompt_ids) for p in passes),
                sum(p.cached for p in passes),
                sum(len(p.sampled) for p in passes),
                sum(p.reasoning for p in passes),
            )
            return self.compactor.add_usage(usage, summary)

        try:
            created = events.created()
            # gateway time from the accepted turn to the engine request (the engine's own time is TTFT)
            self.metrics.stage.labels("engine_submit", turn.ctx.transport).observe(time.perf_counter() - t_run)
            yield created
            tail: list[Event] = []
            try:
                for listing in hosted.listings:
                    yield events.listing(listing)
                if tools is not None and await tools.listings_blocked(hosted.listings):
                    finish = "content_filter"  # a server's tool descriptions: no pass, no call
                if tools is not None and hosted.approved and finish is None:  # approved last turn: they run first
                    for request in hosted.approved:
                        yield events.open_call(request)
                    ran = ToolRound(events.take_calls())
                    async with contextlib.aclosing(tools.run(ran, events)) as running:
                        async for batch in running:
                            yield batch
                    turn_ids = turn_ids.extend(ran.tokens)  # the tip: O(outputs)
                    prompt_ids = turn_ids.extend(rendered.gen_ids)
                    if ran.blocked:
                        finish, tip_history = "content_filter", turn_ids
                if compact is not None and finish is None:  # summarize first, continue on the pruned context
                    done = await self.compactor.compact_turn(turn, turn_ids, compact)
                    prompt_ids, sampling, summary, compacted = (
                        done.prompt_ids,
                        done.sampling,
                        done.summary,
                        done.context,
                    )
                    yield events.whole_item(done.item)
                    clock.lap("compact")
                while finish is None:
                    gen = _Pass(prompt_ids, renderer.parser(turn.input.prelude), len(events.output))
                    passes.append(gen)
                    room = _room(turn, sampling, passes)
                    if room <= 0:  # max_output_tokens (or the context) spent by earlier passes
                        finish, tip_history = "length", last_tip
                        passes.pop()
                        break
                    if len(passes) == 2:
                        sampling = _after_tools(turn, sampling)
                    clock.lap("engine_submit")
                    # routed now: with tracing on, the engine span has begun and its context goes along
                    agen = turn.route.engine.generate(
                        turn.id if len(passes) == 1 else f"{turn.id}-{len(passes)}",
                        prompt_ids,
                        sampling if room == sampling.max_tokens else msgspec.structs.replace(sampling, max_tokens=room),
                        turn.routing(),
                    )
                    single = _SingleCall() if turn.req.parallel_tool_calls is False else None
                    parser = gen.parser
                    async for delta in agen:
                        if first_token_at is None and delta.token_ids:
                            first_token_at = time.perf_counter()
                            clock.lap("engine_ttft")
                        if delta.num_cached_tokens is not None:
                            gen.cached = delta.num_cached_tokens
                        gen.sampled.extend(delta.token_ids)
                        lps = None
                        if attribution is not None and delta.logprobs:
                            parsed, lps = attribution.feed(parser, delta.token_ids, delta.logprobs)
                        else:
                            parsed = parser.feed(delta.token_ids)
                        if single is not None:
                            parsed = single.keep(parsed)  # a prefix: the logprob indices stay valid
                        if parsed:  # a header token parses to nothing: most deltas of a short turn
                            out = events.feed(parsed, lps)
                            if out:
                                yield out
                        if single is not None and single.done and delta.finish_reason is None:
                            gen.finish = "single_call"
                            await agen.aclose()  # stop the engine now: what follows the call is dropped
                            break
                        if (
                            steer is not None
                            and steer.requested
                            and delta.finish_reason is None
                            and not _calling(events, gen.first_output)
                        ):
                            gen.finish = "steered"  # a token boundary: the history is cut here, as at a cap
                            await agen.aclose()
                            break
                        if delta.finish_reason is not None:
                            gen.finish, gen.stop_token = delta.finish_reason, delta.stop_token_id
                            if gen.finish == "abort":
                                gen.finish = "error"
                    agen = None
                    if gen.finish not in ("error", "single_call"):
                        tail = events.feed(parser.finish())
                    gen.reasoning = parser.reasoning_tokens
                    finish, stop_token = gen.finish, gen.stop_token
                    runnable = events.take_calls() if gen.finish not in ("error", "length", "steered") else []
                    if tools is None or not runnable:
                        break
                    if tail:
                        yield tail
                        tail = []
                    # the model called tools the gateway runs: run them, append their outputs at the
                    # token tip and generate again on the same KV (O(outputs), no re-render)
                    ran = ToolRound(runnable)
                    async with contextlib.aclosing(tools.run(ran, events)) as running:
                        async for batch in running:
                            yield batch
                    clock.lap("tools")
                    items = _pass_items(events.output, gen.first_output)
                    history = self._history(turn, gen.finish, gen.stop_token, prompt_ids, gen.sampled, items)[0]
                    if history is None:  # cannot happen after a clean stop; ends the loop safely
                        finish = "error"
                        break
                    tip = history.extend(ran.tokens) if ran.tokens else history
                    if ran.blocked:
                        finish, tip_history = "content_filter", tip
                        break
                    if ran.ends or _ends_response(events.output, gen.first_output):
                        # the pass also asked the client (a function call, an approval) or ran out
                        # of tool calls: the response ends with the outputs at its tip
                        finish, tip_history = "tools", tip
                        break
                    if steer is not None and steer.requested:
                        # steered while the tools ran: their outputs are at the tip, the successor
                        # appends the steer after them
                        finish, tip_history = "steered", tip
                        break
                    prompt_ids = tip.extend(rendered.gen_ids)
                    finish = None
                    last_tip = tip
            except EngineError as exc:
                log.warning("engine failed response %s: %s", turn.id, exc)
                finish = "error"
                summary = _partial(exc, summary)  # a failed compaction's tokens are billed too
            except ValueError as exc:  # the model's output did not parse (malformed format)
                log.warning("unparseable model output in response %s: %s", turn.id, exc)
                finish = "error"
            except BaseException as exc:  # pyo3's PanicException is a BaseException, not an Exception
                if not is_fault(exc):
                    raise  # cancellation, the generator closed, interpreter exit
                log.exception("engine crashed on response %s", turn.id)
                finish = "error"
            clock.lap("streaming" if first_token_at is not None else "engine_ttft")
            if tail:
                yield tail
            usage = spent()
            try:
                sampled = passes[-1].sampled if passes else []
                if tip_history is not None:
                    history, exact = tip_history, True
                elif not passes:  # nothing generated: a failure before the first pass
                    history, exact = None, False
                else:
                    items = _pass_items(events.output, passes[-1].first_output)
                    history, exact = self._history(turn, finish, stop_token, prompt_ids, sampled, items)
                if finish == "error":
                    pending = events.fail(usage, "server_error", "The model backend failed while generating.")
                elif finish == "length":
                    pending = events.incomplete(usage, "max_output_tokens")
                elif finish == "content_filter":
                    pending = events.incomplete(usage, "content_filter")
                elif finish == "steered":
                    pending = events.incomplete(usage, "steered")
                else:
                    pending = events.complete(usage)
                if tools is not None and tools.inexact:
                    exact = False
                if turn.ctx.transport == "http" and not turn.req.stream:
                    _check_writable(pending[-1])
            except BaseException as exc:
                if not is_fault(exc):
                    raise
                log.exception("finishing response %s crashed", turn.id)
                pending = self._failed(events, pending, usage)
                history, exact = None, False
            outcome = Outcome(
                events.status,
                events.output,
                usage,
                history,
                exact=exact,
                copied_bytes=copied,
                compacted=compacted,
                first_token_at=first_token_at,
                tool_calls=tools.calls if tools is not None else 0,
                tool_seconds=tools.seconds if tools is not None else 0.0,
            )
            pending, outcome, stored = await self._store(turn, events, pending, outcome)
            self.finalizer.settle(turn, outcome)
            settled = True
            try:
                yield pending
            finally:  # the terminal is with the transport (or the consumer left): the rest off its path
                self.finalizer.keep(turn, outcome, on_usage, stored)
        finally:
            if coder is not None and coder.unused:  # made for this response, never run in: not kept
                self._forget_container(turn.ctx.tenant, coder.container_id)
            if not settled:  # the clock's time since its last stage boundary is the cut's, not finalize's
                clock.lap("cancelled")
            if agen is not None:
                await agen.aclose()  # aborts the engine request if it is still running
            if not settled:
                # Nobody listens any more (socket closed, SSE client gone, the shutdown deadline):
                # record what was processed and persist a terminal snapshot.
                ran_tools = (tools.calls, tools.seconds) if tools is not None else (0, 0.0)
                if self._cancel(turn, events, pending, spent(), on_usage, first_token_at, ran_tools):
                    self.metrics.aborts.labels(turn.ctx.transport).inc()

    def _history(
        self,
        turn: PreparedTurn,
        finish: str | None,
        stop_token: int | None,
        prompt_ids: TokenSeq,
        sampled: list[int],
        items: list[dict[str, Any]],
    ) -> tuple[TokenSeq | None, bool]:
        """The rendered history after this turn (None: not chainable), and whether it is exact."""
        if finish == "error":
            return None, False
        if finish == "single_call":
            history = _canonical_history(turn, prompt_ids, items)
            if history is None:  # the renderer cannot say: keep what was sampled, re-render next turn
                return prompt_ids.extend(sampled), False
            return history, True
        if finish == "length" or not (finish == "stop" and stop_token is not None):
            # cut at the cap, or stopped without a stop token (a stop string): closed like a cut
            return _cut_history(turn, prompt_ids, sampled), True
        return prompt_ids.extend(turn.route.renderer.history_tokens(sampled)), True

    async def _store(
        self, turn: PreparedTurn, events: ResponseEvents, pending: list[Event], outcome: Outcome
    ) -> tuple[list[Event], Outcome, ResponseState | None]:
        """A ``store=true`` response the client may continue from is reported only once it is stored;
        when the write fails, the turn fails instead (``STORE_FAILED_MESSAGE``), so no client is told
        ``completed`` about a response it cannot retrieve or chain from. Returns the terminal to
        send, the outcome to bill and the state already written."""
        if not self.finalizer.must_write(turn, outcome):
            return pending, outcome, None
        turn.clock.lap("finalize")
        stored = await self.finalizer.write(turn, outcome)
        turn.clock.lap("store")
        if stored is not None:
            return pending, outcome, stored
        pending = events.withdraw(pending) + events.fail(
            outcome.usage, "server_error", self.finalizer.failure_message(turn)
        )
        return (
            pending,
            msgspec.structs.replace(outcome, status=events.status, output=events.output, history=None, exact=False),
            None,
        )

    @staticmethod
    def _failed(events: ResponseEvents, pending: list[Event] | None, usage: dict[str, Any]) -> list[Event]:
        """The turn fails (a fault after generation): whatever terminal was built is replaced."""
        kept: list[Event] = []
        if events.status != ResponseStatus.IN_PROGRESS and pending is not None:
            kept = events.withdraw(pending)
        return kept + events.fail(usage, "server_error", "The server had an error while finishing the response.")

    def _cancel(
        self,
        turn: PreparedTurn,
        events: ResponseEvents,
        pending: list[Event] | None,
        usage: dict[str, Any],
        on_usage: UsageHook | None,
        first_token_at: float | None = None,
        tools: tuple[int, float] = (0, 0.0),
    ) -> bool:
        """Bill a turn that ends unsent — its consumer went away, or it was cut (a terminal built and
        held for the store write is withdrawn first) — as a ``cancelled`` response. False when
        there was nothing to cancel."""
        if events.status != ResponseStatus.IN_PROGRESS and pending is not None:
            events.withdraw(pending)
        if events.status != ResponseStatus.IN_PROGRESS:
            return False
        events.cancel(usage)
        self.finalizer.finish(
            turn,
            Outcome(
                events.status,
                events.output,
                usage,
                None,
                exact=False,
                first_token_at=first_token_at,
                tool_calls=tools[0],
                tool_seconds=tools[1],
            ),
            on_usage,
        )
        return True

    async def _warm_up(
        self, turn: PreparedTurn, events: ResponseEvents, turn_ids: TokenSeq, copied: int, on_usage: UsageHook | None
    ) -> AsyncGenerator[list[Event], None]:
        """``generate: false``: a chain node with the new context and no output; no engine call."""
        usage = usage_object(len(turn_ids), 0, 0, 0)
        self.metrics.warmups.labels(turn.ctx.transport).inc()
        pending: list[Event] | None = None
        settled = False
        try:
            yield events.created()
            pending = events.complete(usage)
            outcome = Outcome(events.status, events.output, usage, turn_ids, exact=True, copied_bytes=copied)
            pending, outcome, stored = await self._store(turn, events, pending, outcome)
            self.finalizer.settle(turn, outcome)
            settled = True
            try:
                yield pending
            finally:
                self.finalizer.keep(turn, outcome, on_usage, stored)
                if outcome.status == ResponseStatus.COMPLETED:
                    self._prefill_later(turn, turn_ids)
        finally:
            if not settled:
                self._cancel(turn, events, pending, usage, on_usage)

    def _forget_container(self, tenant: str | None, container_id: str) -> None:
        """Delete a container off the turn's path (the turn may be ending by cancellation)."""
        containers = self.containers
        if containers is None:
            return

        async def delete() -> None:
            try:
                await containers.delete(tenant, container_id)
            except Exception:  # it expires on its own
                log.warning("deleting unused container %s failed", container_id, exc_info=True)

        task = asyncio.get_running_loop().create_task(delete(), name=f"container-{container_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _prefill_later(self, turn: PreparedTurn, ids: TokenSeq) -> None:
        """Warm the engine's prefix cache with the warm-up's context, off the critical path."""
        if not len(ids):
            return

        async def prefill() -> None:
            try:
                await turn.route.engine.prefill(
                    turn.id + "-prefill", ids, cache_salt_of(turn.ctx.tenant, turn.req), turn.routing()
                )
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


class _Pass:
    """One engine request of the turn: its prompt and what it sampled."""

    __slots__ = ("prompt_ids", "parser", "first_output", "sampled", "cached", "reasoning", "finish", "stop_token")

    def __init__(self, prompt_ids: TokenSeq, parser: StreamParser, first_output: int) -> None:
        self.prompt_ids = prompt_ids
        self.parser = parser
        #: the response's output length when the pass began (its items come after)
        self.first_output = first_output
        self.sampled: list[int] = []
        self.cached = 0
        self.reasoning = 0
        self.finish: str | None = None
        self.stop_token: int | None = None


def _room(turn: PreparedTurn, sampling: SamplingParams, passes: list[_Pass]) -> int:
    """The tokens the current pass may sample: what ``max_output_tokens`` left after the earlier
    passes, within the context that remains after its prompt."""
    cap = sampling.max_tokens
    spent = sum(len(p.sampled) for p in passes[:-1])
    context = turn.route.max_context - len(passes[-1].prompt_ids)
    if cap is None:
        return context
    return min(cap - spent, context) if len(passes) > 1 else cap


def _after_tools(turn: PreparedTurn, sampling: SamplingParams) -> SamplingParams:
    """The sampling of the passes after a round of tools: a ``tool_choice`` that forced a call
    (``required``, a named tool, an MCP server) forced the first pass only — held on every pass,
    the model could never answer after the tool's output (it called again until a cap). The
    structured-output format (``text.format``) still binds."""
    prelude = turn.input.prelude
    if prelude.tool_choice in ("auto", "none") or sampling.structured is None:
        return sampling
    freed = msgspec.structs.replace(prelude, tool_choice="auto")
    return msgspec.structs.replace(
        sampling, structured=turn.route.renderer.constraint(freed, text_format(turn.req)) or None
    )


def _pass_items(output: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """The output items one engine pass wrote, as its sampled tokens hold them: a call the gateway
    ran is the model's call only (its output follows it at the tip, rendered apart)."""
    items = output[first:]
    if not any(it["type"] == "mcp_call" for it in items):
        return items
    return [call_of(it) or it if it["type"] == "mcp_call" else it for it in items]


def _ends_response(output: list[dict[str, Any]], first: int) -> bool:
    """The pass asked the client something: a call the client runs, or an approval."""
    return any(it["type"] in CALL_TYPES or it["type"] == "mcp_approval_request" for it in output[first:])


def _calling(events: ResponseEvents, first: int) -> bool:
    """The pass has begun a tool call (open or done): a steer then waits for the pass to end —
    a call ends the pass by itself, and a call cut in half is no boundary. Read only once a steer
    is requested."""
    return any(it["type"] in _CALLING for it in events.output[first:])


#: the items a model writes to call a tool: the client's, and the MCP calls the gateway runs (or asks to)
_CALLING = CALL_TYPES | {ItemType.MCP_CALL, ItemType.MCP_APPROVAL_REQUEST} | {k.item_type for k in CALL_KINDS.values()}


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


def _canonical_history(turn: PreparedTurn, prompt_ids: TokenSeq, output: list[dict[str, Any]]) -> TokenSeq | None:
    """The prompt plus the canonical tokens of ``output`` (by the incremental contract, what a full
    render of the conversation would give), or None when the renderer's rendering does not start
    with the generation prompt the turn used."""
    gen = turn.rendered.gen_ids
    try:
        tokens = turn.route.renderer.render_items(output)
    except ValueError:
        return None
    if tokens[: len(gen)] != gen:
        return None
    return prompt_ids.extend(tokens[len(gen) :])


def _check_writable(terminal: Event) -> None:
    """Raise (``orjson.JSONEncodeError``) when the transport could not write ``terminal``.

    The ledger bills what the client is told: a non-streamed response that cannot be encoded must
    fail here, before it is billed, not reach the route as ``completed`` and turn into a 500
    there. Streams need no check: every part of their terminal was encoded before it (the
    skeleton in ``response.created``, each item in its ``output_item.done``), and a failure there
    ends the turn before it is billed. (One encode of the snapshot: 58 µs for a 38 KB response
    with thirty tools, under 1 µs for a small one.)"""
    orjson.dumps(terminal)


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
