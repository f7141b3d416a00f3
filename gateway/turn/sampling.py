"""Sampling: the engine's parameters for a turn, from the request, the model and the prompt's length.

``max_tokens`` is whatever room the context leaves, capped by ``max_output_tokens``; structured
output (``tool_choice`` required or named, ``text.format`` json_schema/json_object) becomes the
renderer's constraint, because only the renderer knows its tool-call syntax.
"""

from __future__ import annotations

from typing import Any

from gateway.turn.types import Rendered, TurnInput
from gateway.wire.request import CreateRequest
from inference.engine import SamplingParams


def sampling_for(turn: TurnInput, rendered: Rendered) -> SamplingParams | None:
    """None for a ``generate: false`` warm-up (nothing is sampled)."""
    if not turn.generate:
        return None
    req, route = turn.req, turn.route
    room = route.max_context - rendered.prompt_len
    return SamplingParams(
        max_tokens=room if req.max_output_tokens is None else min(room, req.max_output_tokens),
        temperature=1.0 if req.temperature is None else float(req.temperature),
        top_p=1.0 if req.top_p is None else float(req.top_p),
        seed=req.seed,
        stop_token_ids=tuple(route.renderer.stop_token_ids),
        structured=route.renderer.constraint(turn.prelude, text_format(req)),
    )


def text_format(req: CreateRequest) -> dict[str, Any] | None:
    if req.text is None or req.text.format is None or req.text.format.type == "text":
        return None
    return req.text.format.model_dump(by_alias=True, exclude_none=True)
