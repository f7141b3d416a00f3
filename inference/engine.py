"""The engine boundary: token ids in, token deltas out, abort by cancellation.

Why token ids: the gateway renders conversations incrementally and hands the engine
``parent_ids + new_ids``; the engine's prefix cache then reuses the history's KV. No engine
re-tokenizes text, and no HTTP hop sits between the gateway and an in-process engine.

Cancellation contract: ``generate`` is an async generator. When the consumer stops iterating
(``aclose()``, task cancellation, or garbage collection of the generator) the engine must abort
the request and free its slot. Engines count aborts so tests and metrics can observe them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import msgspec

FinishReason = Literal["stop", "length", "abort", "error"]


class SamplingParams(msgspec.Struct, frozen=True):
    """Engine-level sampling settings, already resolved from the request."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    #: Optional JSON schema / grammar constraint (engines that cannot honour it ignore it).
    structured: dict | None = None
    #: keeps prefix-cache blocks apart: prompts under different salts never share cached KV
    #: (vLLM folds it into its block hashes); the gateway derives it from the tenant
    cache_salt: str | None = None
    #: report each sampled token's log probability and this many most likely alternatives
    #: (None: no logprobs; 0: the sampled token's only)
    logprobs: int | None = None


class RequestRouting(msgspec.Struct, frozen=True):
    """Where an engine request should run, for engines behind a router (``inference.remote_vllm``).

    Why a session key: a router that scores pods by load alone sends a chain's next turn to a
    random pod, which holds none of its history's KV. llm-d's session-affinity scorer keeps
    requests with the same header value on one pod. The key hashes the tenant and the chain's
    *root* response id, so every turn of a chain, its forks, and both transports (an HTTP chain
    and a WebSocket lane) share it, while tenants never do. In-process engines ignore it.
    """

    #: hex digest naming the chain; sent in the configured session header
    session_key: str
    #: the W3C trace context of the turn, forwarded as the ``traceparent`` header when set
    traceparent: str | None = None

    @classmethod
    def for_chain(cls, tenant: str | None, root_id: str, traceparent: str | None = None) -> RequestRouting:
        """The routing of a request on the chain rooted at ``root_id`` of ``tenant``."""
        return cls(session_key=_session_key(tenant, root_id), traceparent=traceparent)


@functools.lru_cache(maxsize=4096)
def _session_key(tenant: str | None, root_id: str) -> str:
    """Remembered per chain: every turn of a chain asks for the same key (a bounded memo, in C)."""
    h = hashlib.blake2b(digest_size=16, person=b"respgate-sess")
    h.update((tenant or "").encode("utf-8", "surrogatepass"))
    h.update(b"\x00")
    h.update(root_id.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class TokenLogprob(msgspec.Struct, frozen=True):
    """The engine's log probability of one sampled token, and its most likely alternatives."""

    token_id: int
    logprob: float
    #: (token id, logprob), most likely first
    top: tuple[tuple[int, float], ...] = ()


class TokenDelta(msgspec.Struct):
    """New tokens of one request since the previous delta.

    ``finish_reason`` is set on the last delta only. ``num_cached_tokens`` is the number of
    prompt tokens served from the engine's prefix cache; engines report it on the first delta.
    """

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    num_cached_tokens: int | None = None
    #: which stop token ended the request (it is included in ``token_ids`` when the engine emits it)
    stop_token_id: int | None = None
    #: one per token of ``token_ids`` when the request asked for logprobs
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class EngineStats:
    requests: int = 0
    aborts: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    running: int = 0
    prefills: int = 0
    #: the engine's own time from queueing a request to its first token, summed over the requests
    #: whose engine reports it (vLLM's request metrics), and their count: a client's TTFT minus it
    #: is the gateway's share
    engine_ttft_s: float = 0.0
    engine_ttft_count: int = 0
    last_prompt_len: int = 0
    prompts: list = field(default_factory=list)  # only filled when an engine is asked to record

    def admit(self, prompt_len: int) -> None:
        """Count a request that starts running (every engine; ``running`` drops when it ends)."""
        self.requests += 1
        self.running += 1
        self.prompt_tokens += prompt_len
        self.last_prompt_len = prompt_len


class EngineError(RuntimeError):
    """The engine failed a request (crash, bad state). The pipeline ends the turn with response.failed."""


@runtime_checkable
class Engine(Protocol):
    """Token-level generation backend."""

    name: str

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def ready(self) -> bool: ...

    def generate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        routing: RequestRouting | None = None,
    ) -> AsyncGenerator[TokenDelta, None]:
        """Stream the request's tokens. ``routing`` says which chain it belongs to; engines behind a
        router send it along, in-process ones ignore it. A generator, not any iterator: the turn
        closes it (``aclose``) to abort the request."""
        ...

    async def prefill(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        cache_salt: str | None = None,
        routing: RequestRouting | None = None,
    ) -> None:
        """Compute and cache the KV of ``prompt_ids`` (under ``cache_salt``) without producing output.

        A ``generate: false`` warm-up calls it in the background, so the first real turn after
        the warm-up prefills only its own delta. Engines without a prefix cache do nothing.
        """


def can_steer(engine: Engine) -> bool:
    """Whether a response on ``engine`` may be steered: the engine declares ``steerable = True``
    when closing a request's stream stops it at the token last handed over and a new request
    with the prompt plus what was sampled goes on from there (its prefix cache keeps the KV).
    An engine that does not say so is not steered: a steer fails ``steering_not_supported``."""
    return getattr(engine, "steerable", False) is True


async def prefill_by_generating(
    engine: Engine,
    stats: EngineStats,
    request_id: str,
    prompt_ids: Sequence[int],
    cache_salt: str | None = None,
    routing: RequestRouting | None = None,
) -> None:
    """:meth:`Engine.prefill` for an engine whose prefix cache is filled by running a request: a
    one-token generation whose output is discarded (vLLM keeps the prompt's KV blocks, so the
    turn after a warm-up prefills only its delta). Written once for the in-process and the remote
    vLLM engines, which both warm this way; ``routing`` goes along so a router sends the warm-up to
    the pod the chain's next turn goes to (an in-process engine ignores it)."""
    if not len(prompt_ids):
        return
    params = SamplingParams(max_tokens=1, temperature=0.0, cache_salt=cache_salt)
    async for _ in engine.generate(request_id, prompt_ids, params, routing):
        pass
    stats.prefills += 1
