"""Prefix-cache salts (issue 13.5): tenants never share cached KV; one tenant's chains still do.

Every engine request — generate, the warm-up's prefill, a compaction's summary — carries a salt
derived from the tenant and the client's ``prompt_cache_key`` / ``cache_salt``. The simulated
engine keeps its emulated prefix cache per salt, as vLLM folds the salt into its block hashes; the
CPU engine test checks vLLM itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gateway.base.settings import Settings
from gateway.turn.types import TurnContext
from inference.engine import SamplingParams
from inference.remote_vllm import RemoteVllmEngine, RemoteVllmSettings
from inference.simulated import SimulatedEngine
from tests.conftest import MODEL, VLLM_MODEL, LiveGateway
from tests.http_helpers import post

PROMPT = "Tell me about the history of the city of Bergen. " * 12


class RecordingEngine(SimulatedEngine):
    """Records the salt of every engine request (generate and prefill)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.salts: list[tuple[str, str | None]] = []

    def generate(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams, routing=None):
        self.salts.append(("generate", params.cache_salt))
        return super().generate(request_id, prompt_ids, params, routing)

    async def prefill(
        self, request_id: str, prompt_ids: Sequence[int], cache_salt: str | None = None, routing=None
    ) -> None:
        self.salts.append(("prefill", cache_salt))
        await super().prefill(request_id, prompt_ids, cache_salt, routing)


def create(live: LiveGateway, key: str, **body: Any) -> dict[str, Any]:
    r = post(live, {"model": MODEL, "input": PROMPT, **body}, headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


def cached(response: dict[str, Any]) -> int:
    return response["usage"]["input_tokens_details"]["cached_tokens"]


@pytest.fixture
def two_tenants(make_gateway) -> tuple[LiveGateway, RecordingEngine]:
    engine = RecordingEngine(record_prompts=True)
    live = make_gateway(Settings(api_keys=["acme:key-acme", "beta:key-beta"], keys_file=None), engine=engine)
    return live, engine


def test_tenants_do_not_share_prefix_cache_blocks(two_tenants):
    live, engine = two_tenants
    create(live, "key-acme")
    again = create(live, "key-acme")
    assert cached(again) > 0, "one tenant's repeated prompt reuses its cache"
    other = create(live, "key-beta")
    assert cached(other) == 0, "another tenant's identical prompt must not hit the first tenant's blocks"
    salts = [s for kind, s in engine.salts if kind == "generate"]
    assert salts[0] == salts[1] != salts[2] and all(salts)


def test_client_key_and_salt_separate_caches_within_a_tenant(two_tenants):
    live, engine = two_tenants
    create(live, "key-acme", prompt_cache_key="team-a")
    assert cached(create(live, "key-acme", prompt_cache_key="team-a")) > 0
    assert cached(create(live, "key-acme", prompt_cache_key="team-b")) == 0
    assert cached(create(live, "key-acme", prompt_cache_key="team-a", cache_salt="mine")) == 0
    r = post(live, {"model": MODEL, "input": "x", "cache_salt": ""}, headers={"authorization": "Bearer key-acme"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_warm_up_prefill_and_its_continuation_share_the_salt(two_tenants):
    live, engine = two_tenants
    import json

    from websockets.sync.client import connect

    with connect(live.ws_url, additional_headers={"authorization": "Bearer key-acme"}) as ws:
        ws.send(
            json.dumps({"type": "response.create", "model": MODEL, "input": PROMPT, "generate": False, "store": False})
        )
        warm = _terminal(ws)
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": "go on",
                    "store": False,
                    "previous_response_id": warm["id"],
                }
            )
        )
        done = _terminal(ws)
    assert done["status"] == "completed"
    kinds = [kind for kind, _ in engine.salts]
    assert kinds == ["prefill", "generate"] and len({s for _, s in engine.salts}) == 1 and engine.salts[0][1]


def _terminal(ws: Any) -> dict[str, Any]:
    import json

    while True:
        ev = json.loads(ws.recv(timeout=30))
        if ev["type"] in ("response.completed", "response.failed", "response.incomplete"):
            return ev["response"]
        assert ev["type"] != "error", ev


def test_remote_engine_sends_the_salt():
    engine = RemoteVllmEngine(RemoteVllmSettings(base_url="http://127.0.0.1:9"))
    body = engine.request_body("r1", [1, 2, 3], SamplingParams(max_tokens=4, cache_salt="abc123"))
    assert body["cache_salt"] == "abc123"
    assert "cache_salt" not in engine.request_body("r2", [1, 2, 3], SamplingParams(max_tokens=4))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_engine_keeps_tenants_apart(vllm_gateway: LiveGateway):
    """The real engine: the same prompt from a second tenant is computed afresh (cached_tokens == 0)."""
    pipeline = vllm_gateway.gw.pipeline
    text = "Describe the harbour of Bergen in one sentence. " * 20  # several 32-token blocks

    async def turn(tenant: str) -> dict[str, Any]:
        prepared = await pipeline.prepare(
            {"model": VLLM_MODEL, "input": text, "max_output_tokens": 16, "temperature": 0, "store": False},
            TurnContext(transport="http", tenant=tenant),
        )
        final: dict[str, Any] = {}
        async for ev in pipeline.run(prepared):
            if ev["type"] in ("response.completed", "response.incomplete", "response.failed"):
                final = ev["response"]
        return final

    first = vllm_gateway.call(turn("salt-acme"), timeout=600)
    again = vllm_gateway.call(turn("salt-acme"), timeout=600)
    other = vllm_gateway.call(turn("salt-beta"), timeout=600)
    assert first["status"] in ("completed", "incomplete") and other["status"] in ("completed", "incomplete")
    assert cached(again) > 0
    assert cached(other) == 0
