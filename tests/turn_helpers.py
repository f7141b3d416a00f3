"""Helpers shared by the tests that drive chains of turns and count the work the turns caused.

* Drivers: :func:`ws_turn` is one ``response.create`` over a raw WebSocket, answered
  ``completed`` (a chain is a loop of them, each naming the last as its parent); :func:`text_of`
  is a history of about N tokens.
* Counters read what the gateway did from its registry (what ``/metrics`` shows): tokens it
  rendered per mode, and its full-render fallbacks of every reason.
* :class:`TokenScriptEngine` is the engine boundary of tests that must say exactly which tokens
  a model samples (a chat-template model writing two calls, a completion cut at the cap).

Counts, not time: a test asserts how many tokens were rendered or read, never how long it took.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from inference.engine import EngineStats, SamplingParams, TokenDelta

TERMINAL_FRAMES = ("response.completed", "response.failed", "response.incomplete", "error")


# -- drivers --------------------------------------------------------------------------------------


def text_of(tokens: int) -> str:
    """About ``tokens`` o200k tokens of words (each ``w<number>`` is ~2 tokens with its space)."""
    return " ".join(f"w{i % 997}" for i in range(tokens // 2))


def ws_turn(ws: Any, model: str, items: str | list[dict], prev: str | None, **fields: Any) -> dict:
    """One ``store: false`` turn on an open socket, after ``prev`` (None: the first); the final
    Response, which must be ``completed``."""
    body = {"type": "response.create", "model": model, "store": False, **fields, "input": items}
    if prev:
        body["previous_response_id"] = prev
    ws.send(orjson.dumps(body).decode())
    while True:
        ev = orjson.loads(ws.recv(timeout=120))
        if ev["type"] in TERMINAL_FRAMES:
            assert ev["type"] == "response.completed", ev
            return ev["response"]


# -- counters -------------------------------------------------------------------------------------


def render_tokens(live: Any) -> tuple[float, float]:
    """Tokens the gateway rendered so far: (appended to a parent's rendering, rendered in full)."""
    return (
        live.metric("respgate_render_tokens_total", {"mode": "append"}),
        live.metric("respgate_render_tokens_total", {"mode": "full"}),
    )


def full_render_fallbacks(live: Any) -> float:
    """Continuations rendered in full instead of appended, whatever the reason."""
    return sum(
        s.value
        for m in live.gw.metrics.registry.collect()
        if m.name == "respgate_render_full_fallbacks"
        for s in m.samples
        if s.name.endswith("_total")
    )


# -- the engine boundary --------------------------------------------------------------------------


class TokenScriptEngine:
    """Samples a fixed token list per turn, token by token, whatever the prompt: turn ``n`` gets
    :meth:`completion` ``(n, params)`` (by default the n-th list, the last one repeated). Keeps every
    prompt in ``stats.prompts`` and counts aborts (the consumer closing the stream early)."""

    name = "token-script"
    #: why the last token ends the turn
    finish_reason = "stop"

    def __init__(self, completions: list[list[int]]) -> None:
        self.completions = completions
        self.stats = EngineStats(prompts=[])

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def ready(self) -> bool:
        return True

    async def prefill(
        self, request_id: str, prompt_ids: Sequence[int], cache_salt: str | None = None, routing: object = None
    ) -> None: ...

    def completion(self, turn: int, params: SamplingParams) -> list[int]:
        return self.completions[min(turn, len(self.completions) - 1)]

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams, routing: object = None
    ) -> AsyncIterator[TokenDelta]:
        self.stats.admit(len(prompt_ids))
        self.stats.prompts.append(list(prompt_ids))
        tokens = self.completion(len(self.stats.prompts) - 1, params)
        finished = False
        try:
            for i, tok in enumerate(tokens):
                last = i == len(tokens) - 1
                stop = last and self.finish_reason == "stop" and tok in params.stop_token_ids
                yield TokenDelta(
                    [tok], finish_reason=self.finish_reason if last else None, stop_token_id=tok if stop else None
                )
            finished = True
        finally:
            self.stats.running -= 1
            if not finished:
                self.stats.aborts += 1
