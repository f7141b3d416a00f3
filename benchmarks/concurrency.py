"""(d) Concurrency: N WebSocket sessions at once, M chained turns each; and idle-connection memory.

The gateway runs in its own process (:mod:`benchmarks.sim_server`, simulated engine at zero
latency, terse ``short`` turns) so its CPU time and resident memory can be read from /proc
without the load generator's. Per N (sessions open at once, all driving turns back to back):

* per-turn latency as each client sees it (send -> ``response.completed``): p50 and p99 over
  every chained turn of every session (the first, unchained turn is excluded);
* gateway CPU seconds per turn (process CPU delta over the phase / turns).

One more one-session phase sends **Codex-shaped** continuations: every create carries what the
real Codex CLI sends with each turn (recorded frame: its ten tools — ``apply_patch``'s Lark grammar
among them — ``include``, ``reasoning``, ``text``, ``tool_choice``, ``prompt_cache_key``), so the
gateway's per-turn cost for its main client is measured, not only for a bare message. And the
short one-session turns run once more with the client waiting 3 ms before each: the CPU a turn
costs a server that was idle just before (on these VMs a vCPU halts when idle, and a process runs
the first fraction of a millisecond after it wakes at a fraction of its speed: caches and TLB
refilled), beside the same turns back to back and the 16-session row, whose server never idles.

Memory: K sessions each create one response from a ~32k-token input (``store=false``, so the
state lives only in the connection cache), then stay open and idle; (RSS after - RSS before) / K
is the memory one idle connection with a 32k-token state holds (again with ~128k-token states).
RSS says what the process costs, not what it holds: :func:`idle_state` runs the gateway in this
process under ``tracemalloc`` and splits what idle connections keep alive into the token ids
(allocated by the renderer or the shared ``cache.seq`` buffers, wherever a representation puts
them) and the rest of the server's heap, per state token.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from typing import Any

import orjson
from websockets.asyncio.client import connect

from benchmarks.common import ChildGateway, filler, pct

#: the recorded Codex CLI continuation whose fields the Codex-shaped phase sends
CODEX_FRAME = "fixtures/codex/ws-gpt-5.5/004-ws_message.json"
#: what a Codex continuation re-sends every turn, beside its new input and previous_response_id
CODEX_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "reasoning", "include", "text", "prompt_cache_key")

MODEL = "gpt-oss-sim"


async def create(ws, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    frame = orjson.dumps({"type": "response.create", "model": MODEL, "store": False, **body}).decode()
    t0 = time.perf_counter()
    await ws.send(frame)
    while True:
        msg = await ws.recv()
        if '"response.completed"' in msg[:40]:
            return time.perf_counter() - t0, orjson.loads(msg)["response"]
        if '"type":"error"' in msg[:40] or '"response.failed"' in msg[:40] or '"response.incomplete"' in msg[:40]:
            raise RuntimeError(msg[:500])


def codex_fields() -> dict[str, Any]:
    """The fields a recorded Codex CLI continuation re-sends with every turn."""
    from tests.conftest import SHARED

    body = orjson.loads((SHARED / CODEX_FRAME).read_bytes())["body"]
    return {k: body[k] for k in CODEX_FIELDS if k in body}


async def session(
    url: str,
    turns: int,
    start: asyncio.Event,
    history: str,
    ready: list[int],
    extra: dict[str, Any] | None = None,
    warmup: int = 0,
    gap_s: float = 0.0,
) -> list[float]:
    extra = extra or {}
    async with connect(url, max_size=None, compression=None, open_timeout=300, ping_interval=None) as ws:
        _, resp = await create(ws, {"input": history, **extra})
        for i in range(warmup):  # untimed, and before the CPU clock starts
            _, resp = await create(
                ws, {"previous_response_id": resp["id"], **extra, "input": [{"role": "user", "content": f"warm {i}"}]}
            )
        ready.append(1)
        await start.wait()
        times = []
        for i in range(turns):
            if gap_s:
                await asyncio.sleep(gap_s)
            dt, resp = await create(
                ws,
                {
                    "previous_response_id": resp["id"],
                    **extra,
                    "input": [{"role": "user", "content": f"step {i}: continue"}],
                },
            )
            times.append(dt)
        return times


async def phase(
    url: str,
    sessions: int,
    turns: int,
    gw: ChildGateway,
    extra: dict[str, Any] | None = None,
    warmup: int = 0,
    gap_s: float = 0.0,
) -> dict[str, Any]:
    """``warmup`` untimed turns per session first: the figures are the steady state's, not the first
    turns' one-time work in a fresh process (imports, caches filling, the interpreter specializing).
    ``gap_s``: each session waits that long before each turn, so the server is idle before every
    turn (the CPU a turn costs on a server that was asleep)."""
    start = asyncio.Event()
    history = filler(1000)
    ready: list[int] = []
    tasks = [
        asyncio.create_task(session(url, turns, start, history, ready, extra, warmup, gap_s)) for _ in range(sessions)
    ]
    # every session has connected and made its first turn before the clock starts
    deadline = time.monotonic() + 300
    while len(ready) < sessions:
        if time.monotonic() > deadline or any(t.done() for t in tasks):
            raise RuntimeError(f"only {len(ready)}/{sessions} sessions ready")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    cpu0, t0 = gw.cpu_seconds(), time.perf_counter()
    start.set()
    results = await asyncio.gather(*tasks)
    wall, cpu = time.perf_counter() - t0, gw.cpu_seconds() - cpu0
    times = [t for r in results for t in r]
    return {
        "sessions": sessions,
        "turns_each": turns,
        "turns": len(times),
        "gap_s": gap_s,
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": pct(times, 99) * 1e3,
        "p99_over_p50": pct(times, 99) / statistics.median(times),
        "max_ms": max(times) * 1e3,
        "wall_s": wall,
        "turns_per_s": len(times) / wall,
        "server_cpu_s_per_turn": cpu / len(times),
        "server_cpu_util": cpu / wall,
    }


async def idle_memory(url: str, conns: int, history_tokens: int, gw: ChildGateway) -> dict[str, Any]:
    history = filler(history_tokens)
    # one throwaway connection first, so one-time allocations (encoders, caches) are not counted
    async with connect(url, max_size=None, compression=None) as ws:
        await create(ws, {"input": history})
    await asyncio.sleep(0.5)
    rss0 = gw.rss()
    sockets = []
    input_tokens = 0
    for i in range(conns):
        ws = await connect(url, max_size=None, compression=None, ping_interval=None)
        _, resp = await create(ws, {"input": history + f" session {i}"})
        input_tokens = resp["usage"]["input_tokens"]
        sockets.append(ws)
    await asyncio.sleep(1.0)
    rss1 = gw.rss()
    for ws in sockets:
        await ws.close()
    return {
        "connections": conns,
        "state_tokens": input_tokens,
        "rss_before_mb": rss0 / 2**20,
        "rss_after_mb": rss1 / 2**20,
        "bytes_per_idle_connection": (rss1 - rss0) / conns,
        "bytes_per_state_token": (rss1 - rss0) / conns / input_tokens,
    }


def _traced(snapshot: Any) -> tuple[int, int]:
    """(token-id bytes, server-side bytes) of a tracemalloc snapshot. Token ids: allocations made
    by the renderer/tokenizer (``inference/``) or the shared buffers (``cache/seq.py``), not by the
    simulated engine's bookkeeping. Server-side: everything but the in-process load generator's
    client library."""
    tokens = server = 0
    for stat in snapshot.statistics("traceback"):
        files = [frame.filename for frame in stat.traceback]
        if any("/websockets/sync/" in f for f in files):
            continue
        server += stat.size
        if not any("/inference/simulated" in f for f in files) and any(
            f.endswith("/cache/seq.py") or "/inference/" in f for f in files
        ):
            tokens += stat.size
    return tokens, server


def idle_state(conns: int, history_tokens: int) -> dict[str, Any]:
    """In this process, traced: ``conns`` WebSocket connections each make a ``history_tokens``
    state (a full render, then one appended turn) and stay idle; bytes they hold per state token."""
    import tracemalloc

    from websockets.sync.client import connect as sync_connect

    from gateway.base.settings import Settings
    from inference.simulated import SimulatedEngine
    from inference.simulated_script import Turn
    from tests.conftest import start_gateway, stop_gateway

    def turn(ws: Any, body: dict[str, Any]) -> dict[str, Any]:
        ws.send(orjson.dumps({"type": "response.create", "model": MODEL, "store": False, **body}).decode())
        while True:
            msg = ws.recv(timeout=300)
            if '"response.completed"' in msg[:40]:
                return orjson.loads(msg)["response"]
            if '"type":"error"' in msg[:40] or '"response.failed"' in msg[:40]:
                raise RuntimeError(msg[:500])

    engine = SimulatedEngine(script=lambda view: Turn(reasoning="ok", text="done"), prefix_cache=False)
    live = start_gateway(
        Settings(max_context=300_000, max_request_bytes=64 * 1024 * 1024, ws_max_connections_per_key=100_000),
        engine=engine,
    )
    history = filler(history_tokens)
    sockets: list[Any] = []
    try:
        with sync_connect(live.ws_url, max_size=None, compression=None) as ws:  # one-time allocations
            turn(ws, {"input": history + " warm"})
        gc.collect()
        tracemalloc.start(12)
        tokens0, server0 = _traced(tracemalloc.take_snapshot())
        state_tokens = 0
        for i in range(conns):
            ws = sync_connect(live.ws_url, max_size=None, compression=None)
            sockets.append(ws)
            resp = turn(ws, {"input": f"{history} session {i}"})
            resp = turn(ws, {"previous_response_id": resp["id"], "input": [{"role": "user", "content": "go on"}]})
            state_tokens += resp["usage"]["input_tokens"] + resp["usage"]["output_tokens"]
        gc.collect()
        tokens1, server1 = _traced(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
        for ws in sockets:
            ws.close()
        stop_gateway(live)
    return {
        "connections": conns,
        "state_tokens": state_tokens // conns,
        "token_bytes_per_token": (tokens1 - tokens0) / state_tokens,
        "server_bytes_per_token": (server1 - server0) / state_tokens,
        # the conversation's own text, one byte a character (ASCII), which the state must keep
        "text_bytes_per_token": conns * len(history) / state_tokens,
    }


def run(quick: bool) -> dict[str, Any]:
    levels = [1, 16, 64, 256]
    turns = 4 if quick else 20
    rows = []
    with ChildGateway("--script", "short") as gw:
        for n in levels:
            # CPU comes from /proc in clock ticks (10 ms): the one-session row, whose CPU per turn is
            # the "gateway CPU per short turn" figure, runs enough turns for ticks to be 1% of it, and
            # the 16-session row (the same turns on a server that is never idle) for 2%
            each = turns * 50 if n == 1 else turns * 5 if n == 16 else turns
            rows.append(asyncio.run(phase(gw.ws_url, n, each, gw, warmup=each // 5 if n == 1 else 2)))
            gc.collect()
        codex = asyncio.run(phase(gw.ws_url, 1, turns * 25, gw, codex_fields(), warmup=turns * 5))
        # the one-session turns again, each after 3 ms with nothing to do (what an interleaved
        # benchmark, or a quiet server, asks of a process whose vCPU halted in between)
        idle_gap = asyncio.run(phase(gw.ws_url, 1, turns * 25, gw, warmup=turns, gap_s=0.003))
    with ChildGateway("--script", "short") as gw:
        memory = asyncio.run(idle_memory(gw.ws_url, 8 if quick else 32, 32_768, gw))
    with ChildGateway("--script", "short") as gw:
        memory_128k = asyncio.run(idle_memory(gw.ws_url, 2 if quick else 8, 131_072, gw))
    traced = [idle_state(2 if quick else 4, n) for n in (32_768, 131_072)]
    return {
        "benchmark": "concurrency",
        "engine": "simulated, zero latency, short turns",
        "rows": rows,
        "codex_one_session": codex,
        "idle_gap_one_session": idle_gap,
        "idle_memory": memory,
        "idle_memory_128k": memory_128k,
        "idle_state": traced,
    }


def plot(result: dict[str, Any], path) -> None:
    from benchmarks.common import plt

    pyplot = plt()
    rows = result["rows"]
    n = [r["sessions"] for r in rows]
    fig, (a, b) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    a.plot(n, [r["p50_ms"] for r in rows], "o-", label="p50")
    a.plot(n, [r["p99_ms"] for r in rows], "s-", label="p99")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("concurrent WS sessions")
    a.set_ylabel("ms per chained turn (client)")
    a.set_title("Per-turn latency under concurrency")
    a.legend()
    b.plot(n, [r["server_cpu_s_per_turn"] * 1e3 for r in rows], "o-", color="tab:purple")
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent WS sessions")
    b.set_ylabel("gateway CPU ms per turn")
    b.set_title("Gateway CPU per turn")
    b.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)
