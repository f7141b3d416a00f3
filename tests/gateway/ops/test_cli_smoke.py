"""``respgate smoke BASE_URL --api-key KEY`` against a live gateway: a pass/fail table of an HTTP
turn, an SSE turn, a WebSocket chain that must report cached tokens, and a tool call. Each check
is also shown failing, on a gateway that misbehaves in exactly that way."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

from gateway.base.settings import Settings
from gateway.ops.smoke import Smoke, _api_base, _ws_url, run_smoke
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn

REPO = Path(__file__).resolve().parents[3]


def smoke(url: str, key: str | None, **kw) -> tuple[int, str]:
    out = io.StringIO()
    code = run_smoke(Namespace(base_url=url, api_key=key, model=None, max_output_tokens=64, timeout=30, **kw), out)
    return code, out.getvalue()


def rows(table: str) -> dict[str, str]:
    return {
        line.split()[0]: line
        for line in table.splitlines()
        if line.split() and line.split()[0] in ("http", "sse", "websocket", "tool")
    }


def test_smoke_passes_against_a_healthy_gateway_through_the_real_command(make_gateway):
    live = make_gateway(Settings(api_keys=["team:sekrit"]))
    env = {k: v for k, v in os.environ.items() if k != "RESPGATE_API_KEY"}
    r = subprocess.run(
        [sys.executable, "-m", "gateway", "smoke", live.url, "--api-key", "sekrit"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    table = rows(r.stdout)
    assert set(table) == {"http", "sse", "websocket", "tool"}
    assert all(" pass " in row for row in table.values()), r.stdout
    assert "cached_tokens" in table["websocket"] and "get_weather(" in table["tool"]
    assert "smoke: 4 passed, 0 failed" in r.stdout
    # the chain really ran on the gateway: two WebSocket turns, the second from the connection cache
    assert live.metric("respgate_connection_cache_lookups_total", {"outcome": "hit"}) >= 1


def test_smoke_reads_the_key_from_the_environment_and_accepts_v1_urls(make_gateway, monkeypatch):
    live = make_gateway(Settings(api_keys=["team:sekrit"]))
    monkeypatch.setenv("RESPGATE_API_KEY", "sekrit")
    code, table = smoke(live.base_url + "/", None)
    assert code == 0, table
    assert _api_base("h:8000") == "http://h:8000/v1" and _api_base("https://h/v1/") == "https://h/v1"
    assert _ws_url("https://h/v1") == "wss://h/v1/responses"


def test_a_wrong_key_fails_every_check_with_the_reason(make_gateway):
    live = make_gateway(Settings(api_keys=["team:sekrit"]))
    code, table = smoke(live.url, "wrong")
    assert code == 1
    assert all("FAIL" in row and "401" in row for row in rows(table).values()), table
    assert "0 passed, 4 failed" in table


def test_an_engine_that_reports_no_cache_hits_fails_the_websocket_check(make_gateway):
    """What a split deployment shows when vLLM runs without --enable-prompt-tokens-details."""
    live = make_gateway(Settings(), engine=SimulatedEngine(prefix_cache=False))
    code, table = smoke(live.url, None)
    assert code == 1
    checks = rows(table)
    assert "FAIL" in checks["websocket"] and "--enable-prompt-tokens-details" in checks["websocket"]
    assert all(" pass " in checks[c] for c in ("http", "sse", "tool")), table


def test_a_model_that_never_calls_the_tool_fails_the_tool_check(make_gateway):
    live = make_gateway(Settings(), engine=SimulatedEngine(script=lambda view: Turn(text="I will not.")))
    code, table = smoke(live.url, None)
    assert code == 1
    checks = rows(table)
    assert "FAIL" in checks["tool"] and "no function_call" in checks["tool"], table
    assert " pass " in checks["http"] and " pass " in checks["sse"]


def test_a_failing_engine_fails_http_and_sse(make_gateway):
    live = make_gateway(
        Settings(), engine=SimulatedEngine(script=lambda view: Turn(text="x" * 50, fail_after_tokens=3))
    )
    code, table = smoke(live.url, None)
    checks = rows(table)
    assert code == 1 and "FAIL" in checks["http"] and "FAIL" in checks["sse"], table


def test_nothing_listening_fails_fast():
    from tests.conftest import free_port

    s = Smoke(f"http://127.0.0.1:{free_port()}", None, timeout=5)
    checks = s.run()
    assert [c.ok for c in checks] == [False] * 4 and "cannot reach" in checks[0].detail
