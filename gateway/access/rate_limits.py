"""Per-key limits as the transports see them: rate-limit steps, 429 errors and headers, WS connection counts.

The buckets themselves are ``security/token_buckets.py``; this module turns a principal into a quota
(its key's overrides, else the settings' defaults), raises the OpenAI rate-limit error, renders
``x-ratelimit-*`` headers, and hands the pipeline a callback that reconciles a turn's token cost
once its usage is known. A limiter that cannot be reached (Redis down) lets requests through and
logs it: a rate-limit outage must not become a service outage (keys still fail closed).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.access.auth import Principal
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.wire.errors import ApiError
from security.token_buckets import Decision, Kind, Quota, RateLimiter, RateLimiterUnavailable

log = logging.getLogger(__name__)

_LABEL = {"requests": ("requests", "RPM"), "tokens": ("tokens", "TPM")}


def rate_limit_error(message: str, kind: Kind, headers: dict[str, str] | None = None) -> ApiError:
    return ApiError(429, message, type=kind, code="rate_limit_exceeded", headers=headers)


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``17ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(seconds // 60)}m{int(seconds % 60)}s"


class Access:
    def __init__(self, settings: Settings, limiter: RateLimiter, metrics: Metrics | None = None) -> None:
        """``metrics``: every refusal counts in ``respgate_rate_limit_rejections_total{transport, limit}``."""
        self.settings = settings
        self.limiter = limiter
        self.metrics = metrics
        self._ws: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._warned = 0.0

    def quota(self, principal: Principal) -> Quota:
        lim = principal.limits
        return Quota(
            rpm=lim.rpm if lim.rpm is not None else self.settings.rate_limit_rpm,
            tpm=lim.tpm if lim.tpm is not None else self.settings.rate_limit_tpm,
        )

    # -- rate limits --------------------------------------------------------------------------------

    async def admit(self, principal: Principal, transport: str = "http") -> Decision | None:
        """Take one request; 429 when the request or token bucket is empty. None = unlimited."""
        return await self._step(principal, requests=1, tokens=0, transport=transport)

    async def reserve(
        self, principal: Principal, prompt_tokens: int, transport: str = "http"
    ) -> tuple[Decision | None, Callable[[Mapping[str, Any]], None] | None]:
        """Take the rendered prompt's tokens. Returns the decision and, when the key is limited, the
        hook that charges the rest once the turn's usage is known (``Pipeline.run(on_usage=...)``)."""
        decision = await self._step(principal, requests=0, tokens=prompt_tokens, transport=transport)
        return decision, (self._settler(principal, prompt_tokens) if decision is not None else None)

    def rejected(self, transport: str, limit: str) -> None:
        """Count a refusal by a limit (``requests``, ``tokens``, ``connections``, ``queue``)."""
        if self.metrics is not None:
            self.metrics.rate_limited.labels(transport, limit).inc()

    async def _step(self, principal: Principal, *, requests: int, tokens: int, transport: str) -> Decision | None:
        quota = self.quota(principal)
        if quota.unlimited:
            return None
        try:
            decision = await self.limiter.acquire(principal.subject, quota, requests=requests, tokens=tokens)
        except RateLimiterUnavailable as exc:
            self._warn(f"rate limiter unavailable, request allowed: {exc}")
            return None
        if not decision.allowed:
            self.rejected(transport, decision.refused or "requests")
            raise rate_limit_error(
                self._message(principal, decision), decision.refused or "requests", self.headers(decision)
            )
        return decision

    def _settler(self, principal: Principal, reserved: int) -> Callable[[Mapping[str, Any]], None]:
        quota = self.quota(principal)

        def on_usage(usage: Mapping[str, Any]) -> None:
            delta = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0)) - reserved
            if not quota.tpm or delta == 0:
                return
            task = asyncio.get_running_loop().create_task(self._adjust(principal.subject, quota, delta))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return on_usage

    async def _adjust(self, subject: str, quota: Quota, delta: int) -> None:
        try:
            await self.limiter.adjust(subject, quota, delta)
        except RateLimiterUnavailable as exc:
            self._warn(f"rate limiter unavailable, {delta} tokens not charged: {exc}")

    async def flush(self) -> None:
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned > 10:
            self._warned = now
            log.warning(message)

    @staticmethod
    def _message(principal: Principal, d: Decision) -> str:
        kind = d.refused or "requests"
        word, abbr = _LABEL[kind]
        cap = d.quota.rpm if kind == "requests" else d.quota.tpm
        who = f"key {principal.key_id}" if principal.key_id else "this gateway"
        wait = d.retry_after_s
        if math.isinf(wait):
            return (
                f"Request too large for {word} per min ({abbr}) on {who}: Limit {cap}, Requested {d.needed}. "
                f"The input or output tokens must be reduced in order to run successfully."
            )
        return (
            f"Rate limit reached for {word} per min ({abbr}) on {who}: Limit {cap}, "
            f"Remaining {d.remaining(kind)}, Requested {d.needed}. Please try again in {duration(wait)}."
        )

    @staticmethod
    def headers(d: Decision | None) -> dict[str, str]:
        if d is None:
            return {}
        h: dict[str, str] = {}
        for kind, cap in (("requests", d.quota.rpm), ("tokens", d.quota.tpm)):
            if cap:
                h[f"x-ratelimit-limit-{kind}"] = str(cap)
                h[f"x-ratelimit-remaining-{kind}"] = str(d.remaining(kind))  # type: ignore[arg-type]
                h[f"x-ratelimit-reset-{kind}"] = duration(d.reset_s(kind))  # type: ignore[arg-type]
        if d.refused is not None and not math.isinf(d.retry_after_s):
            h["retry-after"] = str(max(1, math.ceil(d.retry_after_s)))
            h["retry-after-ms"] = str(max(1, math.ceil(d.retry_after_s * 1000)))
        return h

    # -- WebSocket connections per key (per replica) -------------------------------------------------

    def ws_open(self, principal: Principal) -> None:
        limit = principal.limits.ws_connections or self.settings.ws_max_connections_per_key
        n = self._ws.get(principal.subject, 0)
        if limit is not None and n >= limit:
            self.rejected("ws", "connections")
            raise rate_limit_error(
                f"Too many concurrent WebSocket connections for this API key (limit {limit}). "
                "Close a connection or retry later.",
                "requests",
            )
        self._ws[principal.subject] = n + 1

    def ws_close(self, principal: Principal) -> None:
        n = self._ws.get(principal.subject, 0) - 1
        if n > 0:
            self._ws[principal.subject] = n
        else:
            self._ws.pop(principal.subject, None)
