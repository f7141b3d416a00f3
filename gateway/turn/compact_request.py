"""``POST /v1/responses/compact``: the compacted context window of a conversation (stateless).

The same stages as a create (resolve, classify, render; ``generate`` off), then the model's summary
(:meth:`Compactor.summarize`) sealed into one ``compaction`` item after the user messages the
window keeps verbatim. The summarization is model work the client caused: it is billed under the
window's own ``resp_…`` id, also when it fails.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from billing.usage import UsageQueue, UsageRecord
from gateway.base.metrics import Metrics
from gateway.turn.checks import check_params
from gateway.turn.classify import ClassifyStage
from gateway.turn.compaction import Compactor, Summary, SummaryFailed, SummaryTooLong
from gateway.turn.render import render
from gateway.turn.resolve import Resolver
from gateway.turn.sampling import cache_salt_of
from gateway.turn.types import TurnContext, UsageHook
from gateway.wire.errors import ApiError, bad_request, missing_parameter, server_error
from gateway.wire.items import new_id
from gateway.wire.kinds import ItemType, ResponseStatus
from gateway.wire.response import usage_object
from inference.engine import RequestRouting
from inference.registry import ModelRoute

log = logging.getLogger(__name__)

COMPACT_PARAMS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "service_tier",
        "image",
        "cache_salt",
        # create fields that shape the rendered prompt; clients (Codex) may send them along
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
    }
)


class WindowCompaction:
    def __init__(
        self, resolver: Resolver, classify: ClassifyStage, compactor: Compactor, usage: UsageQueue, metrics: Metrics
    ) -> None:
        self.resolver = resolver
        self.classify = classify
        self.compactor = compactor
        self.usage = usage
        self.metrics = metrics

    async def compact(self, body: Any, ctx: TurnContext, on_usage: UsageHook | None = None) -> dict[str, Any]:
        t0, created = time.perf_counter(), time.time()
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.", code="invalid_type")
        check_params(body, COMPACT_PARAMS)
        if "model" not in body:
            raise missing_parameter("model")
        turn = await self.resolver.resolve({k: v for k, v in body.items() if k != "image"}, ctx, generate=False)
        if not len(turn.base_context) and not turn.new_items:
            raise bad_request("There is nothing to compact: 'input' is empty.", code="invalid_value", param="input")
        verdicts = await self.classify.classify(turn, ctx)  # a block raises
        rendered = render(turn)
        self.metrics.render_tokens.labels(rendered.stats.mode).inc(rendered.stats.new_tokens)
        history = (rendered.base_ids.tolist() if rendered.base_ids is not None else []) + rendered.new_ids
        response_id = new_id("resp")
        self.classify.report(verdicts, turn, ctx, response_id=response_id)
        route = turn.route
        try:
            summary = await self.compactor.summarize(
                route,
                turn.prelude,
                history,
                f"{response_id}-compact",
                cache_salt_of(ctx.tenant, turn.req),
                RequestRouting.for_chain(ctx.tenant, turn.root_id or response_id),
            )
        except SummaryTooLong as exc:
            raise ApiError(400, str(exc), code="context_length_exceeded", param="input") from None
        except SummaryFailed as exc:
            log.warning("compaction %s failed: %s", response_id, exc)
            self._bill(route, ctx, response_id, ResponseStatus.FAILED, exc.partial, created, t0, on_usage)
            raise server_error("The model backend failed while compacting the conversation.") from None
        kept = self.compactor.kept_users(
            route.renderer, list(turn.base_context) + list(turn.new_items), contiguous=False
        )
        item = {
            "id": new_id("cmp"),
            "type": ItemType.COMPACTION,
            "encrypted_content": self.compactor.seal(summary.text, len(kept)),
        }
        usage = self.compactor.add_usage(usage_object(0, 0, 0, 0), summary)
        self.compactor.compactions.labels("endpoint").inc()
        self._bill(route, ctx, response_id, ResponseStatus.COMPLETED, summary, created, t0, on_usage)
        return {
            "id": response_id,
            "object": "response.compaction",
            "created_at": int(created),
            "output": kept + [item],
            "usage": usage,
            "image": None,
        }  # image: declared by the SDK's type

    def _bill(
        self,
        route: ModelRoute,
        ctx: TurnContext,
        response_id: str,
        status: str,
        summary: Summary,
        created: float,
        t0: float,
        on_usage: UsageHook | None,
    ) -> None:
        """The call's usage record and token counters (it is model work too)."""
        m = self.metrics
        m.prompt_tokens.labels(route.name).inc(summary.prompt_tokens)
        m.cached_tokens.labels(route.name).inc(summary.cached_tokens)
        m.output_tokens.labels(route.name).inc(summary.output_tokens)
        duration = time.perf_counter() - t0
        self.usage.submit(
            UsageRecord(
                response_id=response_id,
                model=route.name,
                tenant=ctx.tenant,
                status=status,
                input_tokens=summary.prompt_tokens,
                cached_tokens=summary.cached_tokens,
                output_tokens=summary.output_tokens,
                reasoning_tokens=summary.reasoning_tokens,
                transport=ctx.transport,
                created_at=created,
                finished_at=created + duration,
                ttft_s=None,
                duration_s=duration,
            )
        )
        if on_usage is not None:  # the rate limiter's token bucket is charged for the summary too
            on_usage({"input_tokens": summary.prompt_tokens, "output_tokens": summary.output_tokens})
