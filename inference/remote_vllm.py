"""vLLM in another process or container, spoken to in token ids over HTTP.

Why tokens in/tokens out: the gateway already holds the rendered ids of the whole conversation
(``parent_ids + new_ids``), so the split deployment keeps the in-process contract: vLLM never
re-renders or re-tokenizes, and its prefix cache reuses the history's KV. The endpoint is vLLM's
scale-out ``POST /inference/v1/generate`` (``GenerateRequest``: ``request_id``, ``token_ids``,
``sampling_params``, ``stream``, ``stream_options``), streamed as SSE ``data:`` lines of
``GenerateTokensStreamResponse`` (``choices[0].token_ids`` is the delta, ``finish_reason`` and
``stop_reason`` ride on the last token chunk), then an optional usage chunk, then ``[DONE]``.

Server flags this engine relies on:

* ``--enable-scale-out`` (or ``--tokens-only``): without it ``/inference/v1/*`` answers 403.
  ``--tokens-only`` also skips the tokenizer, which structured outputs (xgrammar) need, so
  prefer ``--enable-scale-out``.
* ``--enable-prompt-tokens-details``: the only place the endpoint reports prefix-cache hits is
  ``usage.prompt_tokens_details.cached_tokens`` of the final usage chunk (sent because we ask for
  ``stream_options.include_usage``). It arrives *after* the chunk carrying ``finish_reason``, so
  this engine holds the terminal delta back until the usage chunk (or ``[DONE]``) and reports
  ``num_cached_tokens`` on that last delta; without the flag it stays ``None``.

Abort: closing the generator (``aclose()``, task cancellation, garbage collection) closes the
HTTP stream and posts ``/inference/v1/abort_requests`` from a detached task, so the abort still
goes out while the consumer's task is being cancelled. vLLM registers the request under
``generate-tokens-<our id>`` (echoed as ``request_id`` in every chunk); that is the id it aborts.
Closing the stream alone already aborts it: vLLM's streaming response stops its generator when
the client disconnects (``tests/inference/test_session_routing.py`` checks this on a real server), so behind
a router the abort reaches the pod that runs the request even when the posted abort lands on
another pod, where an unknown id is ignored.

Routing (llm-d and other routers in front of several vLLM pods): every request kind — generate,
the warm-up prefill, the abort — carries the turn's :class:`inference.engine.RequestRouting`:
its session key in ``RemoteVllmSettings.session_header`` (``x-session-id``: llm-d's default
session-id header, and what ``deploy/k8s/overlays/split-llm-d`` configures its session-affinity
scorer to read), so a chain's turns and its abort go to the pod that holds its KV,
and its ``traceparent`` when set. The tenant's ``cache_salt`` rides in the body of each generate
(the prefill is a one-token generate).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from inference.engine import (
    EngineError,
    EngineStats,
    FinishReason,
    RequestRouting,
    SamplingParams,
    TokenDelta,
    TokenLogprob,
    prefill_by_generating,
)

log = logging.getLogger(__name__)

GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"
HEALTH_PATH = "/health"
#: vLLM 0.32's ServingTokens prefixes the caller's request id; used until a chunk echoes the real one
SERVER_ID_PREFIX = "generate-tokens-"
_JSON = {"content-type": "application/json"}


@dataclass
class RemoteVllmSettings:
    """Where the vLLM server is and how patiently to talk to it."""

    base_url: str = "http://127.0.0.1:8000"
    #: vLLM's ``--api-key`` (it guards ``/inference/*``); sent as ``Authorization: Bearer``
    api_key: str | None = None
    #: served model name to put in each request (vLLM checks it when given); None = server default
    model: str | None = None
    connect_timeout_s: float = 5.0
    #: longest silence between two stream chunks: covers the prefill of a long prompt on a busy server
    read_timeout_s: float | None = 300.0
    write_timeout_s: float = 30.0
    #: waiting for a free pooled connection (all busy streaming)
    pool_timeout_s: float = 30.0
    #: concurrent streams = connections (HTTP/1.1); idle ones are kept alive for reuse
    max_connections: int = 256
    #: ``start()`` waits this long for ``/health`` before failing the gateway's startup
    start_timeout_s: float = 300.0
    #: period of the background ``/health`` probe behind ``ready()``; 0 disables it
    health_interval_s: float = 5.0
    abort_timeout_s: float = 5.0
    #: the header carrying ``RequestRouting.session_key`` (the router's session-affinity scorer must
    #: read the same one: ``deploy/k8s/overlays/split-llm-d``); empty: not sent
    session_header: str = "x-session-id"


class RemoteVllmEngine:
    """:class:`inference.engine.Engine` over a remote vLLM's tokens-in/tokens-out endpoint."""

    #: ``inference.engine.can_steer``: closing the stream aborts the request, and the successor goes
    #: to the same pod (its chain's routing) and its prefix cache
    steerable = True

    def __init__(
        self,
        settings: RemoteVllmSettings,
        *,
        name: str = "remote-vllm",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        self.stats = EngineStats()
        #: abort requests the server acknowledged (HTTP 2xx); ``stats.aborts`` counts the decisions
        self.aborts_delivered = 0
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._healthy = False
        self._last_probe = "no answer"
        self._monitor: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def _make_client(self) -> httpx.AsyncClient:
        s = self.settings
        headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
        return httpx.AsyncClient(
            base_url=s.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(
                connect=s.connect_timeout_s, read=s.read_timeout_s, write=s.write_timeout_s, pool=s.pool_timeout_s
            ),
            limits=httpx.Limits(max_connections=s.max_connections, max_keepalive_connections=s.max_connections),
            http1=True,
            http2=False,
            transport=self._transport,
        )

    async def start(self) -> None:
        if self._client is None:
            self._client = self._make_client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.start_timeout_s
        while not await self._probe():
            if loop.time() >= deadline:
                raise EngineError(
                    f"vLLM at {self.settings.base_url} not healthy after "
                    f"{self.settings.start_timeout_s:g} s ({self._last_probe})"
                )
            await asyncio.sleep(0.5)
        if self.settings.health_interval_s > 0 and self._monitor is None:
            self._monitor = asyncio.create_task(self._watch_health(), name=f"{self.name}-health")
        log.info("remote vLLM ready at %s", self.settings.base_url)

    async def shutdown(self) -> None:
        self._healthy = False
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
            self._monitor = None
        if self._background:  # let in-flight aborts go out (each bounded by abort_timeout_s)
            await asyncio.wait(set(self._background), timeout=self.settings.abort_timeout_s)
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def ready(self) -> bool:
        return self._client is not None and self._healthy

    async def _probe(self) -> bool:
        assert self._client is not None
        try:
            r = await self._client.get(HEALTH_PATH, timeout=self.settings.connect_timeout_s)
            self._healthy = r.status_code == 200
            self._last_probe = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            self._healthy = False
            self._last_probe = f"{type(exc).__name__}: {exc}"
        return self._healthy

    async def _watch_health(self) -> None:
        while self._client is not None:
            await asyncio.sleep(self.settings.health_interval_s)
            if self._client is not None:
                await self._probe()

    # -- generation --------------------------------------------------------------------------

    async def prefill(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        cache_salt: str | None = None,
        routing: RequestRouting | None = None,
    ) -> None:
        """One-token generation whose output is discarded: the server keeps the prompt's KV blocks
        in its prefix cache, so the turn after a warm-up prefills only its delta. It is routed
        like the chain's turns, so the warmed pod is the one the next turn goes to."""
        if self._client is not None:
            await prefill_by_generating(self, self.stats, request_id, prompt_ids, cache_salt, routing)

    def request_body(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        """The ``GenerateRequest`` JSON for one turn."""
        sampling: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "detokenize": False,  # the gateway parses token ids itself
        }
        # Omitted max_tokens lets the server fill the context (max_model_len - prompt), as in-process.
        if params.max_tokens is not None:
            sampling["max_tokens"] = params.max_tokens
        if params.seed is not None:
            sampling["seed"] = params.seed
        if params.structured:
            sampling["structured_outputs"] = params.structured
        if params.logprobs is not None:
            sampling["logprobs"] = params.logprobs
        body: dict[str, Any] = {
            "request_id": request_id,
            "token_ids": prompt_ids,
            "sampling_params": sampling,
            "stream": True,
            "stream_options": {"include_usage": True},
            "output_mode": "tokens",
        }
        if params.cache_salt:
            body["cache_salt"] = params.cache_salt
        if self.settings.model:
            body["model"] = self.settings.model
        return body

    def headers(self, routing: RequestRouting | None) -> dict[str, str]:
        """The headers of one request of ``routing``'s chain (the abort's too)."""
        if routing is None:
            return _JSON
        headers = dict(_JSON)
        if self.settings.session_header:
            headers[self.settings.session_header] = routing.session_key
        if routing.traceparent:
            headers["traceparent"] = routing.traceparent
        return headers

    async def generate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        routing: RequestRouting | None = None,
    ) -> AsyncGenerator[TokenDelta, None]:
        client = self._client
        if client is None:
            raise EngineError("remote vLLM engine is not started")
        # The endpoint takes the whole prompt as a JSON list: unpacking the gateway's packed history
        # (``TokenSeq.tolist``) and encoding it are O(history) by this API, so both are done in C
        # (at 128k tokens ~3 ms and ~1.5 ms; httpx's ``json=`` would spend ~13 ms in json.dumps).
        ids = prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else list(prompt_ids)
        payload = orjson.dumps(self.request_body(request_id, ids, params))
        stats = self.stats
        stats.admit(len(ids))
        server_id = SERVER_ID_PREFIX + request_id
        headers = self.headers(routing)
        finished = False  # the server is done with the request: nothing to abort
        failed = False  # we gave up on it (error): abort it, but it is not a consumer abort
        try:
            async with client.stream("POST", GENERATE_PATH, content=payload, headers=headers) as resp:
                if resp.status_code != 200:
                    finished = True  # rejected before it was scheduled
                    raise EngineError(
                        f"vLLM rejected request {request_id}: HTTP {resp.status_code} "
                        f"{_error_message(await resp.aread())}"
                    )
                self._healthy = True
                last: TokenDelta | None = None  # the terminal delta, held back for the usage chunk
                cached: int | None = None
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        finished = True
                        raise EngineError(f"vLLM failed request {request_id}: {_error_message(chunk)}")
                    server_id = chunk.get("request_id") or server_id
                    usage = chunk.get("usage")
                    if usage and usage.get("prompt_tokens_details"):
                        cached = usage["prompt_tokens_details"].get("cached_tokens")
                    for choice in chunk.get("choices") or ():
                        toks = list(choice.get("token_ids") or ())
                        stats.generated_tokens += len(toks)
                        reason = choice.get("finish_reason")
                        lps = _logprobs(choice.get("logprobs"), params.logprobs)
                        if reason is None:
                            if toks:
                                yield TokenDelta(token_ids=toks, logprobs=lps)
                            continue
                        finished = True
                        stop = choice.get("stop_reason")
                        stop_id = stop if isinstance(stop, int) and not isinstance(stop, bool) else None
                        if reason == "stop" and stop_id is None and toks and toks[-1] in params.stop_token_ids:
                            stop_id = toks[-1]
                        last = TokenDelta(
                            token_ids=toks, finish_reason=_finish(reason), stop_token_id=stop_id, logprobs=lps
                        )
                if last is None:
                    failed = True
                    raise EngineError(f"vLLM stream for {request_id} ended without a finish reason")
                if cached is not None:
                    last.num_cached_tokens = cached
                    stats.cached_tokens += cached
                yield last
        except httpx.HTTPError as exc:  # refused, reset, timed out, cut mid-stream
            failed = True
            if isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.TimeoutException):
                self._healthy = False
            raise EngineError(f"vLLM connection failed for {request_id}: {type(exc).__name__}: {exc}") from exc
        except json.JSONDecodeError as exc:
            failed = True
            raise EngineError(f"vLLM sent a malformed stream chunk for {request_id}: {exc}") from exc
        finally:
            stats.running -= 1
            if not finished:
                if not failed:
                    stats.aborts += 1
                self._abort_soon(server_id, headers)

    def _abort_soon(self, server_id: str, headers: dict[str, str]) -> None:
        """Post the abort from its own task: the caller may be mid-cancellation or being GC'd."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # finalized outside a loop: the closed stream is all we can do
            return
        task = loop.create_task(self._abort([server_id], headers), name=f"{self.name}-abort")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, server_ids: list[str], headers: dict[str, str] = _JSON) -> None:
        client = self._client
        if client is None:
            return
        try:
            r = await client.post(
                ABORT_PATH,
                content=orjson.dumps({"request_ids": server_ids}),
                headers=headers,
                timeout=self.settings.abort_timeout_s,
            )
            if r.is_success:
                self.aborts_delivered += 1
            else:
                log.warning("vLLM refused abort of %s: HTTP %s", server_ids, r.status_code)
        except httpx.HTTPError as exc:  # server gone: nothing left to abort
            log.debug("abort of %s not delivered: %s", server_ids, exc)


def _error_message(payload: bytes | dict[str, Any]) -> str:
    """vLLM's ``{"error": {"message": ...}}`` (or FastAPI's ``{"detail": ...}``) as one line."""
    try:
        data = json.loads(payload) if isinstance(payload, (bytes, str)) else payload
    except ValueError:
        return payload[:200].decode("utf-8", "replace") if isinstance(payload, bytes) else str(payload)[:200]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        return str(err)[:500]
    return str(data)[:500]


def _finish(reason: str) -> FinishReason:
    if reason in ("stop", "length", "abort"):
        return reason  # type: ignore[return-value]
    return "error"


def _logprobs(wire: Any, top: int | None) -> list[TokenLogprob] | None:
    """``GenerateLogProbs`` (``{"content": [{token_id, logprob, top_logprobs: [...]}]}``) -> ours."""
    if top is None or not isinstance(wire, dict) or not isinstance(wire.get("content"), list):
        return None
    return [
        TokenLogprob(
            int(c["token_id"]),
            float(c["logprob"]),
            tuple((int(t["token_id"]), float(t["logprob"])) for t in (c.get("top_logprobs") or ())[:top]),
        )
        for c in wire["content"]
    ]
