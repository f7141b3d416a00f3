"""HTTP full-history turns with and without the prefix cache (issue 15 item 6; ``gateway.turn.prefix``).

A Codex-HTTP-like rollout: 40 turns, each posting the whole conversation (``store: false``,
reasoning replayed with ``encrypted_content``, every earlier output re-sent as received); the model
reasons (~100 tokens) and calls a tool each turn, the tool's output is sized so that the history
reaches the target (32k or 128k tokens) at the last turn. Two gateways, each in its own process with
the simulated engine at zero latency, differ only in ``prefix_cache_bytes`` (256 MiB vs 0); their
conversations are driven turn for turn, alternately, so machine noise hits both alike.

Per turn, from each gateway's ``/metrics`` (turns are serial, so deltas are per turn): the tokens
the renderer encoded, the tokens the prefix-cache lookup rendered to compare re-sent output with
the sampled tokens, and the prepare time (``respgate_turn_prepare_seconds``: validate .. render);
and the client's time from the first byte sent to the last byte of the response.

    python -m benchmarks.http_prefix [--turns 40] [--history 32768 131072]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.common import MODEL, ChildGateway, filler, metric_value

RESULTS = Path(__file__).parent / "results"
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
]


def serve(argv: list[str]) -> None:
    """The gateway under test (``--serve PORT CACHE_BYTES``): a reasoning tool-calling simulated model."""
    import uvicorn

    from gateway.app import create_app, uvicorn_config_kwargs
    from gateway.base.settings import Settings
    from gateway.ops.server import GatewayServer
    from inference.harmony import HarmonyRenderer
    from inference.registry import ModelRegistry, ModelRoute
    from inference.simulated import SimulatedEngine
    from inference.simulated_script import ToolCall, Turn

    port, cache_bytes = int(argv[0]), int(argv[1])

    def script(view: Any) -> Turn:
        last = view.last
        step = last.text[:24] if last is not None else ""
        return Turn(
            reasoning="Looking at the output of the last command, " + filler(90, seed=len(step)),
            tool_calls=(ToolCall("shell", {"cmd": f"pytest -q -x  # after {step!r}"}),),
        )

    settings = Settings(
        port=port,
        max_context=300_000,
        max_request_bytes=64 * 1024 * 1024,
        log_level="warning",
        usage_journal="",
        prefix_cache_bytes=cache_bytes,
        prefix_cache_tenant_bytes=cache_bytes,
    )
    engine = SimulatedEngine(script=script)
    registry = ModelRegistry([ModelRoute(name=MODEL, engine=engine, renderer=HarmonyRenderer(), max_context=300_000)])
    app = create_app(settings, registry=registry)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **uvicorn_config_kwargs(settings)
    )
    GatewayServer(config).run()


class Gateway(ChildGateway):
    def __init__(self, cache_bytes: int) -> None:
        import os
        import subprocess

        from benchmarks.common import ROOT, wait_healthy
        from tests.conftest import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._client = None
        cmd = [sys.executable, "-m", "benchmarks.http_prefix", "--serve", str(self.port), str(cache_bytes)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), start_new_session=True)
        wait_healthy(self.proc, self.url, what="http_prefix gateway", path="/readyz", timeout_s=120, poll_s=0.1)


class Conversation:
    def __init__(self, live: Gateway, label: str, out_tokens: int) -> None:
        self.live, self.label, self.out_tokens = live, label, out_tokens
        self.http = httpx.Client(base_url=live.url + "/v1", timeout=600)
        self.history: list[dict[str, Any]] = [
            {"role": "developer", "content": "You are a coding agent."},  # the same on both gateways
            {"role": "user", "content": "Fix the failing tests in this repository."},
        ]
        self.rows: list[dict[str, float]] = []

    def counters(self) -> tuple[float, float, float]:
        text = self.live.metrics_text()
        return (
            metric_value(text, "respgate_render_tokens_total", '{mode="append"}')
            + metric_value(text, "respgate_render_tokens_total", '{mode="full"}'),
            metric_value(text, "respgate_prefix_cache_checked_tokens_total"),
            metric_value(text, "respgate_turn_prepare_seconds_sum"),
        )

    def turn(self, n: int) -> None:
        body = orjson.dumps(
            {
                "model": MODEL,
                "input": self.history,
                "store": False,
                "tools": TOOLS,
                "include": ["reasoning.encrypted_content"],
            }
        )
        r0, c0, p0 = self.counters()
        t0 = time.perf_counter()
        r = self.http.post("/responses", content=body, headers={"content-type": "application/json"})
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"{self.label}: HTTP {r.status_code} {r.text[:300]}")
        resp = r.json()
        r1, c1, p1 = self.counters()
        self.rows.append(
            {
                "prompt": resp["usage"]["input_tokens"],
                "rendered": r1 - r0,
                "checked": c1 - c0,
                "prepare_ms": (p1 - p0) * 1e3,
                "client_ms": dt * 1e3,
            }
        )
        call = next(o for o in resp["output"] if o["type"] == "function_call")
        self.history += resp["output"]
        self.history.append(
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": f"[turn {n}] " + filler(self.out_tokens, seed=n),
            }
        )


def run(turns: int, histories: list[int]) -> dict[str, Any]:
    import os

    from benchmarks.common import machine

    load0, t_start = os.getloadavg()[0], time.perf_counter()
    gws = {"cache": Gateway(256 * 1024 * 1024), "no_cache": Gateway(0)}
    out: dict[str, Any] = {"benchmark": "http_prefix", "turns": turns, "runs": {}}
    try:
        for target in histories:
            per_out = max(50, (target - 2_000) // turns - 150)
            convs = {k: Conversation(g, f"{k} {target}", per_out) for k, g in gws.items()}
            for n in range(turns):
                for k in ("cache", "no_cache") if n % 2 else ("no_cache", "cache"):
                    convs[k].turn(n)
            # the same conversation on both: the same prompt lengths turn for turn (the tests compare tokens)
            assert [r["prompt"] for r in convs["cache"].rows] == [r["prompt"] for r in convs["no_cache"].rows]
            run_ = {}
            for k, c in convs.items():
                last = c.rows[len(c.rows) * 3 // 4 :]  # the last quarter: the long-history end
                run_[k] = {
                    "final_prompt": c.rows[-1]["prompt"],
                    "rendered_per_turn": [r["rendered"] for r in c.rows],
                    "checked_per_turn": [r["checked"] for r in c.rows],
                    "prepare_ms_per_turn": [round(r["prepare_ms"], 3) for r in c.rows],
                    "client_ms_per_turn": [round(r["client_ms"], 3) for r in c.rows],
                    "median_rendered_last_quarter": statistics.median(r["rendered"] for r in last),
                    "median_prepare_ms_last_quarter": statistics.median(r["prepare_ms"] for r in last),
                    "median_client_ms_last_quarter": statistics.median(r["client_ms"] for r in last),
                    "rendered_total": sum(r["rendered"] for r in c.rows),
                }
                c.http.close()
            out["runs"][str(target)] = run_
    finally:
        for g in gws.values():
            g.close()
    out["machine"] = machine(load0, time.perf_counter() - t_start)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve":
        serve(argv[1:])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--history", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--out", type=Path, default=RESULTS / "http_prefix.json")
    args = ap.parse_args(argv)
    result = run(args.turns, args.history)
    args.out.write_text(json.dumps(result, indent=1))
    for target, r in result["runs"].items():
        for k, row in r.items():
            print(
                f"{target:>7} {k:>9}: final prompt {row['final_prompt']:,}; last quarter medians: rendered "
                f"{row['median_rendered_last_quarter']:,.0f} tok, prepare {row['median_prepare_ms_last_quarter']:.2f} ms, "
                f"client {row['median_client_ms_last_quarter']:.2f} ms; rendered in all {row['rendered_total']:,.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
