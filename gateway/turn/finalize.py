"""After the turn: new state -> store (store=true), connection cache, usage -> billing queue.

A ``store=true`` response the client may continue from (``completed`` or ``incomplete``) is written
*before* its terminal event (``write``): a client told ``completed`` chains its next request at
once, through any replica, and must not get ``previous_response_not_found``. The wait is one store
round trip, bounded by the store's own timeouts; when the write fails the turn ends ``failed``
instead (``gateway.turn.run``) and is billed so. Everything else stays off the turn's path: it
runs once the terminal event is handed to the transport (``Finalizer.keep``), the cache update is
a dict write, the store write of a response nobody continues from (``failed``,
``cancelled``: kept for retrieval) is a task (a request that arrives before it lands waits for that
one write only), and the usage record goes on the billing queue whose worker overlaps the client's
next turn. The usage record is submitted once the outcome is final — after the store result — so
the ledger bills exactly what the client is told.

A ``conversation`` turn that completes appends its input and output items to the conversation in
the same step, before its terminal event (``store=false`` too: the conversation is its own
storage), so the client's next turn — and its next ``items.list`` — sees them; when the append
fails the turn fails, as for a failed store write (``gateway.turn.conversation``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
import orjson

from billing.usage import UsageQueue, UsageRecord
from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.response_store import ResponseStore, StoreUnavailable
from cache.seq import TokenSeq
from gateway.base.log_limit import RateLimitedLog
from gateway.base.metrics import Metrics
from gateway.turn.conversation import Conversations
from gateway.turn.types import Item, PreparedTurn, UsageHook
from gateway.wire.conversations import CONVERSATION_FAILED_MESSAGE
from gateway.wire.errors import STORE_FAILED_MESSAGE, is_fault
from gateway.wire.kinds import CALL_TYPES, CHAINABLE

log = logging.getLogger(__name__)
#: an outage fails every turn that stores: one line per kind and window, not one per turn
outage_log = RateLimitedLog(log)


class Outcome(msgspec.Struct, frozen=True):
    """How a turn ended, as the run loop hands it over."""

    status: str
    #: the Response's output items (copied into the state)
    output: Sequence[Mapping[str, Any]]
    usage: dict[str, Any]
    #: the whole rendered history after this turn (None: not chainable)
    history: TokenSeq | None
    #: the history ends exactly as the renderer would render the output (an append may follow)
    exact: bool
    #: bytes of a prefix copy the turn made (a fork)
    copied_bytes: int = 0
    #: after a compaction: the pruned context the state continues from
    compacted: ItemLog | None = None
    #: perf_counter of the first output token
    first_token_at: float | None = None
    #: calls the gateway ran for the model, and their seconds summed (``gateway.turn.tool_loop``)
    tool_calls: int = 0
    tool_seconds: float = 0.0


#: told of every chainable state a turn leaves (the prefix cache keeps full-history turns)
StateHook = Callable[[PreparedTurn, "Outcome", ResponseState], None]
#: a chained turn's prefix-cache digest from its parent and new items (``PrefixReuse.extend``)
ChainDigest = Callable[[ResponseState, Sequence[Item]], bytes | None]


class Finalizer:
    def __init__(
        self,
        store: ResponseStore,
        usage: UsageQueue,
        metrics: Metrics,
        conversations: Conversations | None = None,
        on_state: StateHook | None = None,
        chain_digest: ChainDigest | None = None,
    ) -> None:
        self.on_state = on_state
        self.chain_digest = chain_digest
        self.store = store
        self.conversations = conversations
        self.usage = usage
        self.metrics = metrics
        #: store writes in flight, by response id
        self._writes: dict[str, asyncio.Task[None]] = {}

    def must_write(self, turn: PreparedTurn, outcome: Outcome) -> bool:
        """Whether the client may be told about ``outcome`` only once it is stored (see the module doc)."""
        return (turn.input.store or turn.input.conversation is not None) and outcome.status in CHAINABLE

    async def write(self, turn: PreparedTurn, outcome: Outcome) -> ResponseState | None:
        """Write the state of ``outcome`` now, before the client is told; None when the write failed.

        A failure is logged here (an outage as a rate-limited warning, anything else as a fault
        with its traceback) and never raised: the caller ends the turn ``failed`` instead. A
        cancellation (the turn cut while waiting) propagates."""
        state = self._state(turn, outcome)
        try:
            if turn.input.store:
                await self._timed_put(state)
            if turn.input.conversation is not None and self.conversations is not None:
                # after the store write: if the append fails, the failed state overwrites the stored one
                if not await self.conversations.append(turn, state, compacted=outcome.compacted is not None):
                    return None
        except StoreUnavailable as exc:
            outage_log.warning("store_write", "store write failed for %s, the response fails instead: %s", turn.id, exc)
            return None
        except BaseException as exc:
            if not is_fault(exc):
                raise
            log.exception("store write crashed for %s, the response fails instead", turn.id)
            return None
        return state

    def failure_message(self, turn: PreparedTurn) -> str:
        """What a turn whose ``write`` failed tells the client."""
        return CONVERSATION_FAILED_MESSAGE if turn.input.conversation is not None else STORE_FAILED_MESSAGE

    def finish(self, turn: PreparedTurn, outcome: Outcome, on_usage: UsageHook | None = None) -> None:
        """:meth:`settle` and :meth:`keep` at once: for a turn that sends nothing more (a cut).
        No ``stored`` to pass on: a cut turn ends ``cancelled``, a state :meth:`write` never
        wrote, so :meth:`keep` writes it itself."""
        self.settle(turn, outcome)
        self.keep(turn, outcome, on_usage)

    def settle(self, turn: PreparedTurn, outcome: Outcome) -> None:
        """Bill ``outcome``: its usage record goes to the billing queue (and its WAL). The one step
        the terminal event waits for — the ledger must hold every response a client was told
        finished — and the last one that may fail the turn: a fault here leaves it unbilled, for
        the caller to bill as cancelled, never twice. The rest is :meth:`keep`'s, after the send."""
        status, usage = outcome.status, outcome.usage
        duration = time.perf_counter() - turn.started
        record = UsageRecord(
            response_id=turn.id,
            model=turn.route.name,
            tenant=turn.ctx.tenant,
            status=status,
            input_tokens=usage["input_tokens"],
            cached_tokens=usage["input_tokens_details"]["cached_tokens"],
            output_tokens=usage["output_tokens"],
            reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"],
            transport=turn.ctx.transport,
            created_at=turn.created_at,
            finished_at=turn.created_at + duration,
            ttft_s=None if outcome.first_token_at is None else outcome.first_token_at - turn.started,
            duration_s=duration,
            tool_calls=outcome.tool_calls,
            tool_s=outcome.tool_seconds,
        )
        clock = turn.clock
        clock.lap("finalize")
        self.usage.submit(record)
        clock.lap("billing")

    def keep(
        self,
        turn: PreparedTurn,
        outcome: Outcome,
        on_usage: UsageHook | None = None,
        stored: ResponseState | None = None,
    ) -> None:
        """Keep a settled turn's state — the connection cache, the prefix cache (``on_state``), for
        ``store=true`` the store (``stored``: already written by ``write``, else written now, off
        the turn's path) — reconcile the quota and count it. Runs once the terminal event is
        handed to the transport, with no await in between (``gateway.turn.run``): the client reads
        its answer while this runs, and nothing else on the loop — the connection's next create, a
        scrape — runs before it. The turn is billed and answered, so a fault is logged, not raised."""
        t0 = time.perf_counter()
        status, usage = outcome.status, outcome.usage
        # each step on its own: a fault in one leaves the others done (the quota handed back, the
        # turn counted, its span ended)
        if on_usage is not None:
            _guarded(turn, on_usage, usage)
        _guarded(turn, self._observe, turn, status, usage, t0 - turn.started, outcome.first_token_at)
        _guarded(turn, self._keep_state, turn, outcome, stored)
        self.metrics.stage.labels("finalize", turn.ctx.transport).observe(time.perf_counter() - t0)
        _guarded(
            turn,
            turn.clock.end,
            status,
            response_id=turn.id,
            model=turn.route.name,
            usage=usage,
            tenant=turn.ctx.tenant,
            previous_response_id=turn.req.previous_response_id,
        )

    def _keep_state(self, turn: PreparedTurn, outcome: Outcome, stored: ResponseState | None) -> None:
        state = stored if stored is not None else self._state(turn, outcome)
        if outcome.status in CHAINABLE:
            if self.on_state is not None:
                self.on_state(turn, outcome, state)
            cache = turn.ctx.conn_cache
            if cache is not None:
                evicted = cache.evictions
                cache.put(turn.ctx.lane, state)
                evicted = cache.evictions - evicted
                if evicted:  # most turns evict nothing: no inc(0) (the counter's lock and checks) then
                    self.metrics.conn_cache_evictions.inc(evicted)
        if turn.input.store and stored is None:
            self._persist(state)

    def _observe(
        self, turn: PreparedTurn, status: str, usage: dict[str, Any], duration: float, first_token_at: float | None
    ) -> None:
        """Turn counters, latency histograms and the turn's log line (ids come from the log context)."""
        m, model, transport = self.metrics, turn.route.name, turn.ctx.transport
        out, prompt = usage["output_tokens"], usage["input_tokens"]
        cached = usage["input_tokens_details"]["cached_tokens"]
        m.turns.labels(transport, status).inc()
        m.prompt_tokens.labels(model).inc(prompt)
        m.cached_tokens.labels(model).inc(cached)
        m.output_tokens.labels(model).inc(out)
        if m.tenant_tokens is not None:
            tenant = turn.ctx.tenant or "anonymous"
            m.tenant_tokens.labels(tenant, "input").inc(prompt)
            m.tenant_tokens.labels(tenant, "output").inc(out)
        ttft = None if first_token_at is None else first_token_at - turn.started
        if first_token_at is not None and ttft is not None:
            m.ttft.labels(model, transport).observe(ttft)
            if status in CHAINABLE and out > 1:
                decode = time.perf_counter() - first_token_at
                m.itl.labels(model, transport).observe(decode / (out - 1))
            if status in CHAINABLE and duration > 0:
                m.tps.labels(model, transport).observe(out / duration)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "turn finished",
                extra={
                    "model": model,
                    "transport": transport,
                    "status": status,
                    "input_tokens": prompt,
                    "cached_tokens": cached,
                    "output_tokens": out,
                    "render_mode": turn.rendered.stats.mode,
                    "rendered_tokens": turn.rendered.stats.new_tokens,
                    "ttft_s": ttft,
                    "duration_s": round(duration, 6),
                    "previous_response_id": turn.req.previous_response_id,
                },
            )

    def _state(self, turn: PreparedTurn, outcome: Outcome) -> ResponseState:
        ti = turn.input
        output_items: list[Item] = [dict(o) for o in outcome.output]
        history = outcome.history
        chainable = outcome.status in CHAINABLE and history is not None
        compacted = outcome.compacted
        digest = self._digest(turn) if chainable and compacted is None and _prefix_exact(turn) else None
        if chainable:
            assert history is not None
            if compacted is None:
                context = ti.base_context.extend(list(ti.new_items) + output_items)
            else:  # the history was compacted: the state continues from the pruned context
                context = compacted.extend(output_items)
            pending = set(ti.pending_calls)
            for item in output_items:
                if item.get("type") in CALL_TYPES and item.get("status") == "completed":
                    pending.add(item["call_id"])
            parent_len = len(ti.parent.history_ids) if ti.parent is not None and compacted is None else 0
            token_bytes = history.itemsize * (len(history) - parent_len) + outcome.copied_bytes
        else:
            # Failed or cancelled: kept for retrieval only, never chained from, so the shared
            # buffers are left alone (no copy for the parent's next continuation).
            context, history, pending, token_bytes = ti.base_context, TokenSeq(), set(), 0
        delta = _approx_bytes(ti.new_items) + _approx_bytes(output_items) + token_bytes
        inherited = ti.parent.nbytes if ti.parent is not None and compacted is None else 0
        return ResponseState(
            id=turn.id,
            response=turn.response,
            input_items=ti.input_items,
            context=context,
            history_ids=history,
            model=ti.route.name,
            # no key, no append: a history that holds sampled tokens its output does not (a cut-off
            # output is closed by the run stage and appends: ``gateway.turn.render``)
            prelude_key=turn.rendered.prelude_key if (outcome.exact and chainable) else b"",
            store=ti.store,
            parent_id=ti.parent.id if ti.parent is not None else None,
            root_id=turn.root_id,
            pending_calls=frozenset(pending),
            mcp_listed=_listed(ti.parent, output_items),
            verdicts=turn.verdicts,
            flagged=turn.flagged,
            tenant=turn.ctx.tenant,
            nbytes=inherited + delta,
            delta_bytes=delta,
            prefix_digest=digest,
        )

    def _digest(self, turn: PreparedTurn) -> bytes | None:
        """The prefix-cache digest the state is kept under: resolved with the turn, or folded now
        (``TurnInput.digest_later``). A fault costs the entry, never the state: the chain goes on,
        and a full-history re-send of it renders more."""
        ti = turn.input
        if not ti.digest_later or self.chain_digest is None or ti.parent is None:
            return ti.digest
        try:
            return self.chain_digest(ti.parent, ti.new_items)
        except Exception:
            log.exception("prefix digest of response %s failed: it leaves no prefix-cache entry", turn.id)
            return None

    def _persist(self, state: ResponseState) -> None:
        task = asyncio.get_running_loop().create_task(self._timed_put(state))
        self._writes[state.id] = task

        def done(t: asyncio.Task[None], response_id: str = state.id) -> None:
            if self._writes.get(response_id) is t:
                del self._writes[response_id]
            exc = None if t.cancelled() else t.exception()
            if isinstance(exc, StoreUnavailable):  # an outage: no traceback per response
                outage_log.warning("store_write_background", "store write failed for %s: %s", response_id, exc)
            elif exc is not None:
                log.error("store write failed for %s", response_id, exc_info=exc)

        task.add_done_callback(done)

    async def _timed_put(self, state: ResponseState) -> None:
        await timed_put(self.store, self.metrics, state)

    async def wait_for(self, response_id: str) -> None:
        """Wait for that response's pending store write, if any (its failure is logged, not raised)."""
        task = self._writes.get(response_id)
        if task is not None:
            await asyncio.wait({task})

    async def flush(self) -> None:
        """Wait for every pending store write (shutdown)."""
        while self._writes:
            await asyncio.wait(set(self._writes.values()))


def _guarded(turn: PreparedTurn, step: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """One step of ``Finalizer.keep``: a fault is logged (the turn is billed and answered), not raised."""
    try:
        step(*args, **kwargs)
    except BaseException as exc:
        if not is_fault(exc):
            raise
        log.exception(
            "keeping response %s: %s crashed (it is billed and answered)", turn.id, getattr(step, "__qualname__", step)
        )


def _prefix_exact(turn: PreparedTurn) -> bool:
    """The turn's prompt is the exact rendering of its items as a full-history client sends them:
    a parentless request's (a prefix hit or a full render) or an append to an exact parent (the
    render stage appends only to a parent whose history is canonical), never a truncated one."""
    stats = turn.rendered.stats
    return not stats.truncated_items and (turn.input.prefix is not None or stats.mode == "append")


async def timed_put(store: ResponseStore, metrics: Metrics, state: ResponseState) -> None:
    """Write ``state`` to the store, timed in ``respgate_store_seconds{op="put"}`` (failed writes too)."""
    t0 = time.perf_counter()
    try:
        await store.put(state)
    finally:
        metrics.store_latency.labels("put").observe(time.perf_counter() - t0)


def _approx_bytes(items: Sequence[dict[str, Any]]) -> int:
    """What ``items`` weigh in the state caches: their JSON size (the form the store keeps them
    in) plus a fixed overhead per item — one C call, not a walk of every field in Python. Items
    that are not JSON (a model's lone surrogate, which the turn then fails on) are walked instead."""
    if not items:
        return 0
    try:
        return len(orjson.dumps(items)) + 64 * len(items)
    except orjson.JSONEncodeError:
        return _walked_bytes(items)


def _walked_bytes(items: Sequence[dict[str, Any]]) -> int:
    total = 0
    for item in items:
        for v in item.values():
            if isinstance(v, str):
                total += len(v)
            elif isinstance(v, list):
                for p in v:
                    if isinstance(p, dict):
                        total += sum(len(x) for x in p.values() if isinstance(x, str))
        total += 64
    return total


def _listed(parent: ResponseState | None, output: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The MCP labels the chain has listed after this turn: the parent's, plus this turn's listings
    that succeeded (the same set object when there are none: O(1) per turn)."""
    before = parent.mcp_listed if parent is not None else frozenset()
    new = [it["server_label"] for it in output if it.get("type") == "mcp_list_tools" and not it.get("error")]
    return before | frozenset(new) if new else before
