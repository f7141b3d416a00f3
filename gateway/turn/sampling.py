"""Sampling: the engine's parameters for a turn, from the request, the model and the prompt's length.

``max_tokens`` is whatever room the context leaves, capped by ``max_output_tokens`` (or, when the
request sets none, the served model's default cap: ``ModelRoute.max_output_tokens``). ``temperature``
and ``top_p`` are the request's, else the served model's defaults (``ModelRoute.default_temperature``
/ ``default_top_p``: the packaged 135M model samples greedily, not at OpenAI's 1.0), else 1.0; the Response echoes
the values used (:func:`echoed_sampling`), as OpenAI's echoes its defaults. Structured
output (``tool_choice`` required or named, ``text.format`` json_schema/json_object) becomes the
renderer's constraint, because only the renderer knows its tool-call syntax.

**Cache salt.** Every engine request carries a salt derived from the tenant, and from the client's
``prompt_cache_key`` / ``cache_salt`` when given. vLLM folds the salt into its prefix-cache block
hashes, so two tenants never share cached KV (a shared block would be a timing signal: one tenant
could probe what another's prompts contain), while one tenant's chains — same salt every turn —
reuse theirs. A client that sends a different key or salt asks for a separate cache.

**Constraints are remembered.** Building one compiles and checks every custom tool's grammar
(xgrammar) and the structural tag: Codex re-sends the same ten tools, ``apply_patch``'s Lark grammar
among them, with every turn, and that build was ~2 ms of a ~3.5 ms continuation turn — the largest
per-turn cost of the gateway's main client, and O(tools) on a turn whose new input is one item.
:class:`ConstraintCache` keeps the last few constraints by a digest of what they are built from —
the tenant, the model, the tools, ``tool_choice`` and ``text.format`` — so a turn whose tools are
its parent's pays one hash of them. Keyed by tenant like the engine's prefix cache, so a tenant
cannot time whether another sent the same tools.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from cache.lru import BoundedLRU, tenant_of
from gateway.turn.types import Rendered, TurnInput
from gateway.wire.request import CreateRequest
from inference.engine import SamplingParams
from inference.registry import ModelRoute


def cache_salt_of(tenant: str | None, req: CreateRequest) -> str:
    """The engine's prefix-cache salt for this tenant and request (hex: safe for any engine)."""
    parts = (
        b"respgate.salt.v1",
        (tenant or "").encode(),
        (req.prompt_cache_key or "").encode(),
        (req.cache_salt or "").encode(),
    )
    return hashlib.blake2b(b"\0".join(parts), digest_size=16).hexdigest()


class ConstraintCache:
    """The renderers' structured-output constraints by what they are built from (see the module
    docstring), in a :class:`~cache.lru.BoundedLRU` keyed by tenant, each held to its share: bounded
    by entries and by bytes (a constraint embeds the tools' schemas and grammars: up to 512 tools of
    128 KiB each), and one bigger than a quarter of the budget is built every time rather than kept.
    Thread-safe: the prepare pool's threads shape turns too (two threads may build the same entry
    once each; both are equal)."""

    def __init__(self, max_entries: int = 128, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.lru: BoundedLRU[tuple[str | None, bytes], Any] = BoundedLRU(max_entries, max_bytes, part=tenant_of)

    @property
    def hits(self) -> int:
        return self.lru.hits

    @property
    def misses(self) -> int:
        return self.lru.misses

    @property
    def nbytes(self) -> int:
        return self.lru.nbytes

    def constraint(
        self,
        route: ModelRoute,
        turn: TurnInput,
        text_format: dict[str, Any] | None,
        tenant: str | None,
        prelude_key: bytes = b"",
    ) -> Any:
        """``prelude_key``: the render's digest of the prelude (model, renderer, tools verbatim,
        ``tool_choice`` …), which the key then uses instead of hashing the tools a second time."""
        prelude = turn.prelude
        if not prelude.tools and text_format is None:
            return route.renderer.constraint(prelude, None)  # nothing to build: no hashing either
        what: Any = prelude_key.hex() if prelude_key else [route.name, prelude.tools, prelude.tool_choice]
        key = (
            tenant,
            hashlib.blake2b(orjson.dumps([what, text_format], option=orjson.OPT_SORT_KEYS), digest_size=16).digest(),
        )
        found = self.lru.get(key, _MISSING)
        if found is not _MISSING:
            return found
        built = route.renderer.constraint(prelude, text_format)
        self.lru.put(key, built, len(orjson.dumps(built)) + 64 if built else 64)  # what vLLM is sent: JSON
        return built


_MISSING = object()


def sampling_for(
    turn: TurnInput, rendered: Rendered, tenant: str | None, constraints: ConstraintCache | None = None
) -> SamplingParams | None:
    """None for a ``generate: false`` warm-up (nothing is sampled)."""
    if not turn.generate:
        return None
    req, route = turn.req, turn.route
    fmt = text_format(req)
    room = route.max_context - rendered.prompt_len
    cap = output_cap(req, route)
    return SamplingParams(
        max_tokens=room if cap is None else min(room, cap),
        temperature=_value(req.temperature, route.default_temperature),
        top_p=_value(req.top_p, route.default_top_p),
        seed=req.seed,
        stop_token_ids=tuple(route.renderer.stop_token_ids),
        structured=(
            constraints.constraint(route, turn, fmt, tenant, rendered.prelude_key)
            if constraints is not None
            else route.renderer.constraint(turn.prelude, fmt)
        ),
        cache_salt=cache_salt_of(tenant, req),
        logprobs=logprobs_wanted(req),
    )


def _value(requested: float | None, model_default: float | None) -> float:
    """The request's value, else the served model's default, else OpenAI's 1.0."""
    if requested is not None:
        return float(requested)
    return 1.0 if model_default is None else float(model_default)


def echoed_sampling(req: CreateRequest, route: ModelRoute) -> dict[str, float]:
    """What the Response says of the sampling settings the request left to the served model's
    defaults (empty when it set both, or the model has none: the skeleton's 1.0 is then right)."""
    out: dict[str, float] = {}
    if req.temperature is None and route.default_temperature is not None:
        out["temperature"] = float(route.default_temperature)
    if req.top_p is None and route.default_top_p is not None:
        out["top_p"] = float(route.default_top_p)
    return out


def output_cap(req: CreateRequest, route: ModelRoute) -> int | None:
    """The request's ``max_output_tokens``, else the model's default cap (None: the context's room)."""
    return req.max_output_tokens if req.max_output_tokens is not None else route.max_output_tokens


def logprobs_wanted(req: CreateRequest) -> int | None:
    """How many alternatives per token the output text's logprobs list (None: no logprobs).

    Asked for by ``include: ["message.output_text.logprobs"]`` or a positive ``top_logprobs``."""
    top = req.top_logprobs or 0
    if top > 0 or "message.output_text.logprobs" in (req.include or ()):
        return top
    return None


def text_format(req: CreateRequest) -> dict[str, Any] | None:
    if req.text is None or req.text.format is None or req.text.format.type == "text":
        return None
    return req.text.format.model_dump(by_alias=True, exclude_none=True)
