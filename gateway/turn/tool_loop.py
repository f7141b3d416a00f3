"""The calls the gateway runs between two engine passes of one response (``gateway.turn.run``).

    pass k ends with calls into MCP namespaces or a hosted tool's (``web_search``'s browser:
    ``gateway.tools.calls``)
        -> run them at once (each bounded: ``mcp_call_timeout_s``, ``tool_output_bytes``)
        -> each call's events as it finishes (``response.mcp_call.completed|failed``)
        -> their outputs rendered once, in output order: the tokens appended at the token tip
        -> the outputs classified as new input (a block ends the response: ``content_filter``)
    pass k+1 generates on ``history + outputs + generation prompt``: the same KV, no re-render

A server's new tool listing (names, descriptions, schemas: text the server chose, read by the
model) is classified like an output before the first pass; a block ends the response there.

``max_tool_calls`` (else ``max_hosted_calls``) bounds the calls one response runs: a call past it
is reported as an ``mcp_call`` with ``error`` and not run, and the response ends after that pass
(the client may continue it; the model then sees the error as the call's output). The consumer
going away (or a background cancel) cancels every call still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import orjson

from gateway.tools.calls import CallKind, CallResult, CallRunner
from gateway.tools.hosted import HostedTools, error_object
from gateway.tools.mcp_client import ToolResult
from gateway.turn.classify import ClassifyStage
from gateway.turn.events import Event, ResponseEvents, gateway_error
from gateway.turn.types import PreparedTurn
from inference.hosted_items import ERROR_PREFIX, output_of


def _call_output(item: Mapping[str, Any], kind: CallKind, function: str, text: str) -> dict[str, Any]:
    """What the model reads after its call into a hosted tool's namespace: the tool's message
    (harmony's ``browser.<fn>`` author, a chat template's ``browser__<fn>`` tool result), appended
    at the token tip."""
    return {
        "type": "function_call_output",
        "call_id": str(item["id"]),
        "output": text,
        "name": function or "search",
        "namespace": kind.namespace,
    }


class ToolRound:
    """One batch of calls, and what running it left: the tokens to append, whether it ends the loop."""

    __slots__ = ("indices", "tokens", "blocked", "ends")

    def __init__(self, indices: list[int]) -> None:
        #: the calls' output indices in the response
        self.indices = indices
        #: the calls' outputs rendered, to append at the token tip
        self.tokens: list[int] = []
        #: a classifier blocked an output: the response ends (``content_filter``)
        self.blocked = False
        #: a call was past ``max_tool_calls``: the response ends after this round
        self.ends = False


class ToolLoop:
    """One response's gateway-run calls: the budget, the counts the ledger gets, running a round."""

    def __init__(
        self,
        hosted: HostedTools | None,
        classify: ClassifyStage | None,
        turn: PreparedTurn,
        default_max: int,
        runners: Sequence[CallRunner] = (),
    ) -> None:
        """``runners``: the response's hosted tools called through a namespace (``web_search``'s
        browser), each running its kind's calls (``gateway.tools.calls``)."""
        self.hosted = hosted
        self.runners = {r.kind.item_type.value: r for r in runners}
        self.classify = classify
        self.turn = turn
        self.limit = turn.req.max_tool_calls if turn.req.max_tool_calls is not None else default_max
        #: calls run so far, and their seconds summed (billed: ``UsageRecord.tool_calls``/``tool_s``)
        self.calls = 0
        self.seconds = 0.0
        #: a round's history is not token-exact with a full render (``Outcome.exact``)
        self.inexact = False

    async def run(self, rnd: ToolRound, events: ResponseEvents) -> AsyncGenerator[list[Event], None]:
        """Run ``rnd``'s calls; yields each call's events as it finishes."""
        budget = max(0, self.limit - self.calls)
        allowed, over = rnd.indices[:budget], rnd.indices[budget:]
        #: what the model reads of each namespace call (its item carries no output)
        read: dict[int, dict[str, Any]] = {}
        not_run = f"Not run: this response reached its limit of {self.limit} tool calls (max_tool_calls)."
        for idx in over:
            rnd.ends = True
            runner = self.runners.get(events.output[idx]["type"])
            if runner is not None:
                function, _ = events.call_of(idx)
                result = runner.not_run(function, ERROR_PREFIX + not_run)
                read[idx] = _call_output(events.output[idx], runner.kind, function, result.text)
                yield events.ran(idx, runner.kind, result)
            else:
                yield events.call_done(idx, None, gateway_error(not_run))
        self.calls += len(allowed)
        tasks: list[asyncio.Future[tuple[int, Any]]] = []
        starting: list[Event] = []
        for idx in allowed:
            runner = self.runners.get(events.output[idx]["type"])
            if runner is not None:
                starting += events.running(idx, runner.kind)
                tasks.append(asyncio.ensure_future(self._call(idx, runner, *events.call_of(idx))))
            else:
                tasks.append(asyncio.ensure_future(self._one(idx, events.output[idx])))
        if starting:
            yield starting
        try:
            for fut in asyncio.as_completed(tasks):
                idx, result = await fut
                if isinstance(result, CallResult):
                    runner = self.runners[events.output[idx]["type"]]
                    function, _ = events.call_of(idx)
                    read[idx] = _call_output(events.output[idx], runner.kind, function, result.text)
                    yield events.ran(idx, runner.kind, result)
                    continue
                self.seconds += result.elapsed
                yield events.call_done(idx, result.output, error_object(result))
        finally:  # the consumer left, or the turn was cancelled: no call outlives it
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
        outputs = [
            out
            for idx in rnd.indices
            if (out := read.get(idx) if idx in read else output_of(events.output[idx])) is not None
        ]
        rnd.tokens = self.turn.route.renderer.render_items(outputs)
        if len(outputs) > 1 and self.turn.route.renderer.family != "harmony":
            # a chat template groups the calls of one assistant message, and a full render of the
            # MCP items does not (``inference.hosted_items``): the history stays the sampled tokens,
            # but it is no longer what a full render gives
            self.inexact = True
        if self.classify is not None:
            rnd.blocked = await self.classify.tool_outputs(outputs, self.turn)

    async def listings_blocked(self, listings: Sequence[Mapping[str, Any]]) -> bool:
        """A server's new tool listing classified like a tool's output: its names, descriptions and
        schemas reach the model's prompt as text the server chose (where "tool poisoning" puts
        its instructions). True when a classifier blocks it: the response ends before any pass
        (``content_filter``). Only new listings (first use in the chain): a reused one was
        classified when it was new."""
        if self.classify is None:
            return False
        described = [
            {
                "type": "function_call_output",
                "call_id": str(it.get("id")),
                "output": orjson.dumps(it["tools"]).decode(),
            }
            for it in listings
            if it.get("tools")
        ]
        return bool(described) and await self.classify.tool_outputs(described, self.turn)

    async def _call(self, idx: int, runner: CallRunner, function: str, arguments: str) -> tuple[int, CallResult]:
        t0 = time.perf_counter()
        result = await runner.run(function, arguments)
        self.seconds += time.perf_counter() - t0
        return idx, result

    async def _one(self, idx: int, call: Mapping[str, Any]) -> tuple[int, ToolResult]:
        assert self.hosted is not None
        server = self.turn.input.hosted.servers[call["server_label"]]
        t0 = time.perf_counter()
        result = await self.hosted.call(server, call["name"], call["arguments"])
        t1 = time.perf_counter()
        self.hosted.observe(server, result, t1 - t0)
        self.turn.clock.span(
            "tool_call",
            t0,
            t1,
            {
                "respgate.tool.type": "mcp",
                "respgate.tool.server": server.metric_label,
                "respgate.tool.name": call["name"][:64],
                "respgate.tool.output_bytes": result.output_bytes,
                **({"error.type": "tool_error"} if result.error is not None else {}),
            },
        )
        return idx, result
