"""Per-model sampling defaults (issue 28 item 6): a request that sets no ``temperature`` / ``top_p``
samples with the served model's defaults — the packaged 135M SmolLM2 greedily, not at OpenAI's 1.0
(at which, and even at 0.2, it often rambles to the output cap) — set per model (models file entries) or
for all (settings); the request's own values always win, and the Response echoes what was used.

The engine here is the simulated one with its sampling parameters recorded (what the engine was
asked for is the claim); the real SmolLM2 runs the README's examples in ``test_readme_examples.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from gateway.base.settings import Settings
from gateway.engines import PACKAGED_SAMPLING, SamplingDefaults, build_registry, packaged_name, sampling_defaults
from inference.engine import SamplingParams
from inference.harmony import HarmonyRenderer
from inference.registry import ModelRegistry, ModelRoute
from inference.simulated import SimulatedEngine
from tests.conftest import LiveGateway


class RecordingEngine(SimulatedEngine):
    """The simulated engine, keeping the sampling parameters of every request it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[SamplingParams] = []

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams, routing: Any = None
    ) -> AsyncIterator[Any]:
        self.params.append(params)
        async for delta in super().generate(request_id, prompt_ids, params, routing):
            yield delta


def test_the_default_server_samples_the_packaged_smollm2_greedily():
    default = Settings()
    assert packaged_name(default) == "smollm2"  # what `make serve` serves
    assert sampling_defaults(default, packaged_name(default)) == SamplingDefaults(temperature=0.0)
    assert sampling_defaults(default, "qwen2.5-coder-0.5b").temperature == 0.2
    assert set(PACKAGED_SAMPLING) >= {"smollm2", "qwen2.5-coder-0.5b"}
    assert sampling_defaults(default, None) == SamplingDefaults()  # any other model: OpenAI's 1.0
    # a setting beats the model's own default, each parameter on its own
    assert sampling_defaults(Settings(default_temperature=0.7), "smollm2") == SamplingDefaults(0.7, None)
    assert sampling_defaults(Settings(default_top_p=0.9), "smollm2") == SamplingDefaults(0.0, 0.9)
    assert sampling_defaults(Settings(default_top_p=0.5), None) == SamplingDefaults(None, 0.5)
    for bad in (
        {"default_temperature": -0.1},
        {"default_temperature": 2.5},
        {"default_top_p": 0},
        {"default_top_p": 1.5},
    ):
        with pytest.raises(ValueError):
            Settings(**bad)


def test_settings_and_models_file_entries_set_each_routes_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("RESPGATE_DEFAULT_TEMPERATURE", "0.4")
    env = Settings.load(None, engine="simulated")
    assert [(r.default_temperature, r.default_top_p) for r in build_registry(env).routes()] == [(0.4, None)]
    models = tmp_path / "models.json"
    models.write_text(
        json.dumps(
            [
                {"name": "cool", "engine": "simulated", "default_temperature": 0.1, "default_top_p": 0.8},
                {"name": "inherits", "engine": "simulated"},
            ]
        )
    )
    registry = build_registry(Settings.load(None, models_file=str(models)))
    assert (registry.get("cool").default_temperature, registry.get("cool").default_top_p) == (0.1, 0.8)
    assert registry.get("inherits").default_temperature == 0.4  # the top-level setting (environment)


def _gateway(make_gateway) -> tuple[LiveGateway, RecordingEngine]:
    engine = RecordingEngine()
    renderer = HarmonyRenderer()
    registry = ModelRegistry(
        [
            ModelRoute(name="small", engine=engine, renderer=renderer, default_temperature=0.2, default_top_p=0.9),
            ModelRoute(name="plain", engine=engine, renderer=renderer),
        ]
    )
    return make_gateway(Settings(models=["small", "plain"]), engine=engine, registry=registry), engine


def test_a_request_without_sampling_gets_the_models_defaults_and_its_own_values_win(make_gateway):
    live, engine = _gateway(make_gateway)
    cases = [
        ("small", {}, (0.2, 0.9)),
        ("small", {"temperature": 0.7}, (0.7, 0.9)),
        ("small", {"temperature": 0, "top_p": 1}, (0.0, 1.0)),  # 0 is a value, not "unset"
        ("small", {"temperature": None}, (0.2, 0.9)),  # null is unset
        ("plain", {}, (1.0, 1.0)),
    ]  # no model default: OpenAI's
    for model, sampling, expected in cases:
        r = httpx.post(live.base_url + "/responses", json={"model": model, "input": "hi", **sampling}, timeout=30)
        assert r.status_code == 200, r.text
        used = engine.params[-1]
        assert (used.temperature, used.top_p) == expected, (model, sampling)
        assert (r.json()["temperature"], r.json()["top_p"]) == expected  # the Response says what was used
    # WebSocket mode and the SDK's streaming HTTP take the same path
    with connect(live.ws_url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "small", "input": "hi"}))
        while (ev := json.loads(ws.recv(timeout=20)))["type"] != "response.completed":
            assert ev["type"] != "error", ev
    assert (engine.params[-1].temperature, ev["response"]["temperature"]) == (0.2, 0.2)
    events = list(live.openai().responses.create(model="small", input="hi", top_p=0.5, stream=True))
    assert events[-1].response.top_p == 0.5 and events[-1].response.temperature == 0.2
    assert (engine.params[-1].temperature, engine.params[-1].top_p) == (0.2, 0.5)


@pytest.mark.slow
def test_serve_flags_set_the_defaults(tmp_path):
    """``respgate serve --default-temperature/--default-top-p``; an out-of-range value stops it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import free_port, terminate, wait_until_ready

    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")}
    env.update(PYTHONPATH=str(root), RESPGATE_KEYS_FILE=str(tmp_path / "keys.json"), RESPGATE_USAGE_JOURNAL="")
    cmd = [sys.executable, "-m", "gateway", "serve", "--engine", "simulated"]
    bad = subprocess.run([*cmd, "--default-temperature", "3"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "default_temperature" in bad.stderr, bad.stderr[-2000:]
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), "--default-temperature", "0.3", "--default-top-p", "0.6"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_ready(proc, port, log_path, 120)
            body = httpx.post(
                f"http://127.0.0.1:{port}/v1/responses", json={"model": "gpt-oss-sim", "input": "hi"}, timeout=30
            ).json()
            assert (body["temperature"], body["top_p"]) == (0.3, 0.6), body
        finally:
            terminate(proc)
