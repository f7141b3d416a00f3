"""Gateway time of a tool round trip, three ways, side by side over WebSocket mode.

* ``plain``    a continuation turn with no tool: user message in, answer out (one engine pass);
* ``function`` a client-run function call: turn A (user -> ``function_call``, the response ends),
               then turn B (``function_call_output`` -> answer): two requests, two passes;
* ``mcp``      a gateway-run MCP call: user -> ``mcp_call`` (the gateway calls a real MCP server on
               loopback) -> answer, in one response: two engine passes, the tool's output appended
               at the token tip.

The gateway runs in its own process (``benchmarks.sim_server --script agent``: the simulated model
calls the first tool offered after a user message, at zero latency), the MCP server (the tests'
``ToolsServer``, its ``echo`` tool) in a thread of this one. Every chain continues with
``previous_response_id`` (``store: false``) on its own connection; the three are driven turn for
turn in a rotating order, so machine noise hits them alike. ``mcp`` is reported with the tool's
own time taken out: the server's ``respgate_hosted_tool_seconds`` sum for that turn (connect,
session, call, close — the part a faster or pooled MCP client would shrink).

    python -m benchmarks.tool_round_trip [--turns 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.sync.client import connect

from benchmarks.common import MODEL, ChildGateway

RESULTS = Path(__file__).parent / "results"
PATHS = ("plain", "function", "mcp")
TOOL_LABELS = '{server="request",tool="mcp"}'


def _turn(ws: Any, frame: dict[str, Any]) -> dict[str, Any]:
    ws.send(orjson.dumps(frame))
    while True:
        ev = orjson.loads(ws.recv(timeout=60))
        if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            if ev["type"] != "response.completed":
                raise RuntimeError(f"turn failed: {str(ev)[:300]}")
            response: dict[str, Any] = ev["response"]
            return response


def _create(prev: str | None, items: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": items, "store": False}
    if prev is not None:
        frame["previous_response_id"] = prev
    if tools:
        frame["tools"] = tools
    return frame


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def run(turns: int) -> dict[str, Any]:
    from tests.mcp_servers.running import running_app
    from tests.mcp_servers.tools_server import ToolsServer

    server = ToolsServer()
    with running_app(server.app()) as base:
        mcp = [
            {
                "type": "mcp",
                "server_label": "tools",
                "server_url": base + "/mcp",
                "require_approval": "never",
                "allowed_tools": ["echo"],
            }
        ]
        function = [
            {
                "type": "function",
                "name": "echo",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            }
        ]
        gw = ChildGateway("--script", "agent", "--mcp-loopback")
        times: dict[str, list[float]] = {p: [] for p in PATHS}
        tool_s: list[float] = []
        try:
            sockets = {p: connect(gw.ws_url, max_size=None) for p in PATHS}
            prev: dict[str, str | None] = dict.fromkeys(PATHS)
            for i in range(turns + 5):  # the first 5: warm-up (imports, the catalog's first listing)
                order = PATHS[i % 3 :] + PATHS[: i % 3]
                for path in order:
                    ws = sockets[path]
                    if path == "plain":
                        t0 = time.perf_counter()
                        r = _turn(ws, _create(prev[path], [_user(f"turn {i}")], []))
                        dt = time.perf_counter() - t0
                    elif path == "function":
                        t0 = time.perf_counter()
                        a = _turn(ws, _create(prev[path], [_user(f"turn {i}")], function))
                        call = next(it for it in a["output"] if it["type"] == "function_call")
                        out = {"type": "function_call_output", "call_id": call["call_id"], "output": "ping"}
                        r = _turn(ws, _create(a["id"], [out], function))
                        dt = time.perf_counter() - t0
                    else:
                        before = gw.metric_value("respgate_hosted_tool_seconds_sum", TOOL_LABELS)
                        t0 = time.perf_counter()
                        r = _turn(ws, _create(prev[path], [_user(f"turn {i}")], mcp))
                        dt = time.perf_counter() - t0
                        spent = gw.metric_value("respgate_hosted_tool_seconds_sum", TOOL_LABELS) - before
                        assert any(it["type"] == "mcp_call" and it["status"] == "completed" for it in r["output"])
                        if i >= 5:
                            tool_s.append(spent)
                    prev[path] = r["id"]
                    if i >= 5:
                        times[path].append(dt)
            for ws in sockets.values():
                ws.close()
        finally:
            gw.close()
    med = {p: statistics.median(v) * 1000 for p, v in times.items()}
    tool_ms = statistics.median(tool_s) * 1000
    mcp_wo_tool = statistics.median([t - s for t, s in zip(times["mcp"], tool_s, strict=True)]) * 1000
    return {
        "turns": turns,
        "median_ms": med,
        "mcp_tool_median_ms": tool_ms,
        "mcp_without_tool_median_ms": mcp_wo_tool,
        # what a round trip adds over a plain turn, the tool's own time excluded
        "round_trip_added_ms": {"mcp": mcp_wo_tool - med["plain"], "function": med["function"] - med["plain"]},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    result = run(args.turns)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tool_round_trip.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
