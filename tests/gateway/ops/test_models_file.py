"""Several models in one gateway, declared in a file: each routes to its own engine and format."""

from __future__ import annotations

import json

import pytest

from gateway.base.settings import Settings
from gateway.engines import build_registry
from tests.conftest import start_gateway, stop_gateway


def test_models_file_declares_several_models_with_their_own_engines(tmp_path):
    from inference.model_assets import prepare_model

    folder = prepare_model("smollm2")
    spec = [
        {"names": ["gpt-oss-sim", "agent-sim"], "engine": "simulated"},
        {
            "name": "small-remote",
            "engine": "remote-vllm",
            "model_path": str(folder),
            "remote_url": "http://127.0.0.1:9",
            "max_model_len": 2048,
        },
    ]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(spec))
    registry = build_registry(Settings(models_file=str(path)))
    assert registry.names() == ["gpt-oss-sim", "agent-sim", "small-remote"]
    sim, remote = registry.get("agent-sim"), registry.get("small-remote")
    assert sim.engine is registry.get("gpt-oss-sim").engine and sim.engine.name == "simulated"
    assert sim.renderer.family == "harmony"
    assert remote.engine.name == "remote-vllm" and remote.renderer.family == "chat_template"
    assert remote.max_context == 2048


def test_models_file_errors_are_clear(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps([{"name": "a", "engine": "simulated"}, {"name": "a", "engine": "simulated"}]))
    with pytest.raises(ValueError, match="declared twice"):
        build_registry(Settings(models_file=str(path)))
    path.write_text("{}")
    with pytest.raises(ValueError, match="non-empty JSON list"):
        build_registry(Settings(models_file=str(path)))


def test_models_file_models_are_served(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps([{"names": ["alpha", "beta"], "engine": "simulated"}]))
    settings = Settings(models_file=str(path))
    live = start_gateway(settings, registry=build_registry(settings))
    try:
        client = live.openai()
        assert sorted(m.id for m in client.models.list()) == ["alpha", "beta"]
        assert client.responses.create(model="beta", input="hi").status == "completed"
    finally:
        stop_gateway(live)
