"""The gateway with a scripted simulated engine, as its own process (for CPU and memory figures).

Scripts (``--script``):

* ``short``  — a terse agent turn (``ok`` / ``done``): the engine costs the same for every prompt.
* ``stream`` — an answer that never ends on its own: the request's ``max_output_tokens`` sets its
  length. With ``--decode-tps 0`` the engine emits tokens as fast as the gateway takes them.
* ``rollout`` — the coding-agent trajectory of :mod:`benchmarks.rollout` (``--calls`` tool calls),
  on a paced engine with a prefix cache (``--decode-tps`` / ``--prefill-tps``).

    python -m benchmarks.sim_server --port P [--script short|stream] [--tokens-per-delta 1] [--count-bytecodes F]
                                    [--stream-model NAME]

``--stream-model NAME`` serves the ``stream`` script too, under that model name, from the same
process (the peer benchmark's short and capped chains then share one gateway, as they share one
agentic-api).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import uvicorn

from benchmarks.common import MODEL
from gateway.app import create_app, uvicorn_config_kwargs
from gateway.base.settings import Settings
from gateway.ops.server import GatewayServer
from inference.harmony import HarmonyRenderer
from inference.registry import ModelRegistry, ModelRoute
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn


def _agent(view: Any) -> Turn:
    """After a user message, call the first tool offered (a function or an MCP server's); after a
    tool's output (or with no tools), answer: one round trip per user turn."""
    last = view.last
    if last is not None and last.role == "user" and view.tools:
        tool = view.tools[0]
        return Turn(reasoning="ok", tool_calls=(ToolCall(tool.name, {"text": "ping"}, tool.namespace),))
    return Turn(reasoning="ok", text="done")


def _steer(view: Any) -> Turn:
    """A user message that says STOP gets ``ok``; anything else endless filler, a token a
    millisecond (``benchmarks.steer``: a generation to steer)."""
    last = view.last
    if last is not None and last.role == "user" and "STOP" in last.text:
        return Turn(text="ok")
    return Turn(text="x", endless=True, delay_per_token_s=0.001)


SCRIPTS = {
    "short": lambda view: Turn(reasoning="ok", text="done"),
    "agent": _agent,
    "steer": _steer,
    "stream": lambda view: Turn(endless=True),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--script", choices=[*SCRIPTS, "rollout"], default="short")
    ap.add_argument("--tokens-per-delta", type=int, default=1)
    ap.add_argument("--decode-tps", type=float, default=0.0)
    ap.add_argument("--prefill-tps", type=float, default=0.0)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--prefix-cache", action="store_true")
    ap.add_argument(
        "--paced",
        action="store_true",
        help="decode on a wall clock; deltas that fall due while the gateway is busy merge (as vLLM's)",
    )
    ap.add_argument("--max-context", type=int, default=300_000)
    ap.add_argument(
        "--stream-model",
        metavar="NAME",
        help="also serve the stream script under this model name (one process for both scripts)",
    )
    ap.add_argument("--redis-url", help="shared store, conversations and usage ledger in this Redis (default: memory)")
    ap.add_argument(
        "--count-bytecodes",
        metavar="FILE",
        help="count bytecodes between SIGUSR1 and SIGUSR2, then write them to FILE (benchmarks.work_count)",
    )
    ap.add_argument(
        "--mcp-loopback", action="store_true", help="requests may name MCP servers on 127.0.0.1 (benchmarks only)"
    )
    args = ap.parse_args(argv)
    if args.count_bytecodes:
        from benchmarks.work_count import install_counter

        install_counter(args.count_bytecodes)

    # a load-test deployment: one key drives hundreds of sessions
    settings = Settings(
        port=args.port,
        max_context=args.max_context,
        max_request_bytes=64 * 1024 * 1024,
        log_level="warning",
        usage_journal="",
        ws_max_inflight=16,
        ws_max_connections_per_key=100_000,
        redis_url=args.redis_url,
        **(
            {"mcp_allowed_urls": {"*": ["http://127.0.0.1:"]}, "outbound_allow_networks": ["127.0.0.1/32"]}
            if args.mcp_loopback
            else {}
        ),
    )
    if args.script == "rollout":
        from benchmarks.rollout import planned, trajectory

        script = planned(trajectory(args.calls))
    else:
        script = SCRIPTS[args.script]

    def route(name: str, script: Callable[[Any], Turn | None]) -> ModelRoute:
        engine = SimulatedEngine(
            script=script,
            prefix_cache=args.prefix_cache,
            cache_entries=16,
            tokens_per_delta=args.tokens_per_delta,
            decode_tps=args.decode_tps or None,
            prefill_tps=args.prefill_tps or None,
            paced=args.paced or args.script == "rollout",
        )
        return ModelRoute(name=name, engine=engine, renderer=HarmonyRenderer(), max_context=args.max_context)

    routes = [route(MODEL, script)]
    if args.stream_model:
        routes.append(route(args.stream_model, SCRIPTS["stream"]))
    registry = ModelRegistry(routes)
    app = create_app(settings, registry=registry)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        lifespan="on",
        backlog=4096,
        **uvicorn_config_kwargs(settings),
    )
    GatewayServer(config).run()  # uvicorn's loop choice (uvloop when installed), as `respgate serve`


if __name__ == "__main__":
    main()
