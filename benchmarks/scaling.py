"""Capacity on paper: per-unit costs measured in one run, and ``deploy/SCALING.md`` computed from them.

What a deployment for many agent sessions needs is a handful of unit costs, each measured here
with the parts that pay it running for real:

* **gateway, per turn** — CPU seconds (``/proc/<pid>/task/*/schedstat``) and RSS growth per chained turn at 32k and 128k
  tokens of state, WebSocket ``store=false`` and HTTP ``store=true`` (previous_response_id), the
  gateway in its own process (:mod:`benchmarks.sim_server`, simulated engine at zero latency, terse
  answers) backed by a real Valkey for the store, conversations and the usage ledger. Each measured
  turn adds one user item of ``NEW_TOKENS`` tokens (an agent's tool output), so a turn pays for
  new input as a real one does. No ``/metrics`` scrape between turns: its CPU would count as the
  turn's.
* **gateway, per idle connection** — RSS of idle WebSocket connections holding a 32k- and a
  128k-token state (:func:`benchmarks.concurrency.idle_memory`), and the CPU an idle connection
  costs per second (server pings included: the measurement spans two ping intervals).
* **Redis, per turn** — for HTTP ``store=true`` chained turns (32k and 128k), WS ``store=true``
  turns, a conversation turn and a streamed background turn: ``CONFIG RESETSTAT``, N turns, then
  ``INFO commandstats`` (calls per command; commands a Lua script or ``MULTI`` runs are counted
  too), ``INFO stats`` (``total_net_input_bytes`` / ``total_net_output_bytes``), the server's
  CPU (``INFO cpu``), divided by N; and the data the turns added, ``MEMORY USAGE`` summed over
  every key before and after (the usage ledger's keys apart). What the gateway does to Redis while idle (background sweeps, blocking reads) is measured first
  on its own and subtracted at its rate; what the probe's own ``INFO`` costs is calibrated and
  subtracted too.
* **ledger** — usage records per second one replica's billing queue sustains into Redis
  (:class:`billing.usage.UsageQueue` + :class:`billing.ledger.RedisLedger`, one batch in flight),
  into one stream and into ``LEDGER_SHARDS`` stream shards (the batch split per shard), the Redis
  CPU per record in such batches and in single-record calls from many clients (a fleet's shape:
  each replica's share of the turns is a few hundred a second), with one and with several shards,
  the memory per record (stream entry vs dedup marker, ``MEMORY USAGE`` of the stream), and the
  WAL's cost per record on the turn's path (:func:`benchmarks.usage_submit.run`). The plan sizes
  the ledger's shard count like the store's, from these units.

Results go to ``results/scaling.json``; :func:`write_doc` (the runner calls it after the benchmark
and on ``--report-only``) renders ``deploy/SCALING.md`` from that JSON alone — the workload model
and the sizing assumptions are constants here, every figure is computed — so a rerun rewrites the
document and ``tests/deploy/test_scaling_doc.py`` fails when the committed document and JSON disagree.

    python -m benchmarks --only scaling [--quick]
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "deploy" / "SCALING.md"
RESULTS = Path(__file__).parent / "results"
#: tokens of the user item each measured turn adds (an agent's tool output: a command's output, a
#: small file); the state grows by it every turn, which the JSON records (start and end)
NEW_TOKENS = 256
#: the usage stream the ledger phase writes (not the gateway's, so its figures are its own)
LEDGER_STREAM = "respgate-bench:usage"
#: stream shards of the ledger phase's sharded runs (all on the one server: what they show is that a
#: shard costs Redis what one stream does, per record, so shards add capacity in proportion)
LEDGER_SHARDS = 8

# -- measuring ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """On-CPU time of every thread of ``pid`` in nanosecond resolution (``/proc/<pid>/task/*/schedstat``):
    ``/proc/<pid>/stat`` counts in 10 ms ticks, too coarse for a few dozen turns of a few ms."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended in between
            continue
    return total / 1e9


class RedisProbe:
    """Snapshots of one Valkey's counters; deltas are what happened in between, less the probe's
    own ``INFO`` (calibrated) — see the module docstring. CPU is the server's own ``getrusage``
    (``INFO cpu``, microseconds, all its threads)."""

    def __init__(self, url: str) -> None:
        import redis

        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.r.config_resetstat()
        a = self.snap()
        b = self.snap()
        self.info_in = b["net_in"] - a["net_in"]
        self.info_out = b["net_out"] - a["net_out"]

    def reset(self) -> None:
        self.r.config_resetstat()

    def snap(self) -> dict[str, Any]:
        info = self.r.info("commandstats", "stats", "memory", "cpu")
        stats = {
            k[len("cmdstat_") :]: v
            for k, v in info.items()
            if k.startswith("cmdstat_") and k not in ("cmdstat_info", "cmdstat_config")
        }
        return {
            "t": time.perf_counter(),
            "cpu": info["used_cpu_sys"] + info["used_cpu_user"],
            "calls": {k: v["calls"] for k, v in stats.items()},
            "usec": sum(v["usec"] for v in stats.values()),
            "net_in": info["total_net_input_bytes"],
            "net_out": info["total_net_output_bytes"],
            "used_memory": info["used_memory"],
        }

    def data_bytes(self, ledger_stream: str = "respgate:usage", shards: int = 1) -> dict[str, int]:
        """``MEMORY USAGE`` summed over every key, split into the usage ledger's (its streams and
        dedup markers) and the rest: what the data takes, without the allocator's and the keyspace
        table's steps that make ``used_memory`` deltas of a few dozen turns noisy."""
        from billing.ledger import shard_streams, slot_tag

        keys = list(self.r.scan_iter(count=1000))
        sizes: list[int] = []
        for start in range(0, len(keys), 1000):
            pipe = self.r.pipeline(transaction=False)
            for k in keys[start : start + 1000]:
                pipe.memory_usage(k, samples=0)
            sizes += [int(x or 0) for x in pipe.execute()]
        streams = shard_streams(ledger_stream, shards)
        markers = tuple(slot_tag(s) + ":seen:" for s in streams)
        ledger = sum(n for k, n in zip(keys, sizes) if k in streams or k.startswith(markers))
        return {"ledger": ledger, "other": sum(sizes) - ledger, "keys": len(keys)}

    def delta(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        names = set(a["calls"]) | set(b["calls"])
        return {
            "wall_s": b["t"] - a["t"],
            "cpu_s": b["cpu"] - a["cpu"],
            "cmd_usec": b["usec"] - a["usec"],
            "calls": {n: b["calls"].get(n, 0) - a["calls"].get(n, 0) for n in sorted(names)},
            "net_in": b["net_in"] - a["net_in"] - self.info_in,
            "net_out": b["net_out"] - a["net_out"] - self.info_out,
            "used_memory": b["used_memory"] - a["used_memory"],
        }


def _per_unit(d: dict[str, Any], idle: dict[str, Any] | None, units: int) -> dict[str, Any]:
    """A delta per unit (turn, record), less ``idle``'s rates over the delta's wall time."""
    w = d["wall_s"]

    def net(x: float, rate: float) -> float:
        return (x - rate * w) / units

    rate = (lambda k: idle[k] / idle["wall_s"]) if idle else (lambda k: 0.0)
    idle_calls = idle["calls"] if idle else {}
    commands = {
        n: round(max(0.0, net(c, idle_calls.get(n, 0) / idle["wall_s"] if idle else 0.0)), 3)
        for n, c in d["calls"].items()
    }
    return {
        "commands_per_unit": {n: c for n, c in commands.items() if c > 0},
        "calls_per_unit": round(sum(commands.values()), 3),
        "net_in_bytes_per_unit": net(d["net_in"], rate("net_in")),
        "net_out_bytes_per_unit": net(d["net_out"], rate("net_out")),
        "cpu_s_per_unit": net(d["cpu_s"], rate("cpu_s")),
        "cmd_usec_per_unit": net(d["cmd_usec"], rate("cmd_usec")),
        "used_memory_bytes_per_unit": d["used_memory"] / units,
        "raw": d,
    }


def _chain_class():
    from benchmarks.ws_overhead import Chain

    class UnitChain(Chain):
        """:class:`benchmarks.ws_overhead.Chain` in one of this benchmark's modes, without the
        per-turn ``/metrics`` reads (their CPU would count as the turn's)."""

        def __init__(self, live: Any, mode: str, history_tokens: int) -> None:
            import httpx

            self.mode = mode
            self.conversation: str | None = None
            if mode == "conversation":
                r = httpx.post(live.url + "/v1/conversations", json={}, timeout=60)
                r.raise_for_status()
                self.conversation = r.json()["id"]
            self.depth = 0  # responses in the chain so far
            super().__init__(live, "ws" if mode.startswith("ws") else "http_chained", history_tokens)

        def _body(self, item: dict[str, Any]) -> dict[str, Any]:
            body = super()._body(item)
            if self.mode == "ws_store":
                body["store"] = True
            elif self.mode == "conversation":
                body.pop("previous_response_id", None)
                body["conversation"] = self.conversation
            elif self.mode == "background":
                body["background"] = True
            self.depth += 1
            return body

        def _server_counters(self) -> tuple[float, float]:
            return 0.0, 0.0

    return UnitChain


#: (mode, label, transport, store) of the per-turn scenarios
MODES = {
    "ws": ("WS, store=false", "ws", False),
    "ws_store": ("WS, store=true", "ws", True),
    "http_chained": ("HTTP, store=true, previous_response_id", "http", True),
    "conversation": ("HTTP, conversation", "http", True),
    "background": ("HTTP, background + stream, store=true", "http", True),
}


def turn_scenario(
    gw: Any, probe: RedisProbe, idle: dict[str, Any], mode: str, state_tokens: int, turns: int
) -> dict[str, Any]:
    from benchmarks.common import filler

    mem0 = probe.data_bytes()["other"]
    chain = _chain_class()(gw, mode, state_tokens)
    build = probe.data_bytes()["other"] - mem0
    start_tokens, start_depth = chain.input_tokens, chain.depth
    for i in range(2):  # the first turns after the build settle caches
        chain.turn({"role": "user", "content": filler(NEW_TOKENS, seed=1000 + i)})
    items = [{"role": "user", "content": filler(NEW_TOKENS, seed=i)} for i in range(turns)]
    gc.collect()
    time.sleep(0.3)
    data0 = probe.data_bytes()
    probe.reset()
    rss0, cpu0 = gw.rss(), cpu_seconds(gw.proc.pid)
    a = probe.snap()
    for item in items:
        chain.turn(item)
    time.sleep(0.3)  # the usage worker writes the last turn's record
    b = probe.snap()
    cpu, rss1 = cpu_seconds(gw.proc.pid) - cpu0, gw.rss()
    data1 = probe.data_bytes()
    chain.close()
    d = probe.delta(a, b)
    label, transport, store = MODES[mode]
    return {
        "mode": mode,
        "label": label,
        "transport": transport,
        "store": store,
        "turns": turns,
        "new_tokens_per_turn": NEW_TOKENS,
        "state_tokens_start": start_tokens,
        "state_tokens_end": chain.input_tokens,
        "chain_depth_start": start_depth,
        "chain_depth_end": chain.depth,
        "wall_s": d["wall_s"],
        "gateway_cpu_s_per_turn": (cpu - idle["gateway_cpu_s"] / idle["wall_s"] * d["wall_s"]) / turns,
        "gateway_rss_growth_bytes_per_turn": (rss1 - rss0) / turns,
        "redis_build_data_bytes": build,
        "redis_build_data_bytes_per_state_token": build / start_tokens,
        "redis": _per_unit(d, idle, turns),
        # what the turns' data takes in Redis: their usage records, and everything else (the
        # stored responses and item index; a conversation's items; a background turn's event log)
        "redis_ledger_bytes_per_turn": (data1["ledger"] - data0["ledger"]) / turns,
        "redis_data_bytes_per_turn": (data1["other"] - data0["other"]) / turns,
    }


async def idle_cpu(url: str, conns: int, seconds: float, gw: Any) -> dict[str, Any]:
    """Gateway CPU per idle WebSocket connection per second: ``conns`` connections that made one
    short turn each, then idle for ``seconds`` (answering the server's pings), against the same
    span with none open."""
    from websockets.asyncio.client import connect

    from benchmarks.concurrency import create

    pid = gw.proc.pid
    c0 = cpu_seconds(pid)
    await asyncio.sleep(seconds)
    base = cpu_seconds(pid) - c0
    sockets = []
    for i in range(conns):
        ws = await connect(url, max_size=None, compression=None, ping_interval=None)
        await create(ws, {"input": f"session {i}: hello"})
        sockets.append(ws)
    await asyncio.sleep(1.0)
    rss0 = gw.rss()
    c0 = cpu_seconds(pid)
    await asyncio.sleep(seconds)
    busy = cpu_seconds(pid) - c0
    for ws in sockets:
        await ws.close()
    return {
        "connections": conns,
        "seconds": seconds,
        "gateway_cpu_s_none": base,
        "gateway_cpu_s_open": busy,
        "rss_mb_open": rss0 / 2**20,
        "cpu_s_per_connection_second": max(0.0, busy - base) / conns / seconds,
    }


async def ledger(url: str, probe: RedisProbe, records: int, shards: int = 1, *, sharded: bool = True) -> dict[str, Any]:
    """Records per second one billing queue sustains into the Redis ledger (``shards`` streams), and
    what each costs Redis; with ``sharded``, the same into ``LEDGER_SHARDS`` shards too."""
    from benchmarks.usage_submit import make_record
    from billing.journal import Journal
    from billing.ledger import RedisLedger, marker_key, shard_of, shard_streams
    from billing.usage import UsageQueue

    probe.r.flushdb()  # each run's memory figures are its own records'
    with tempfile.TemporaryDirectory() as tmp:
        sink = RedisLedger(url, LEDGER_STREAM, shards=shards)
        queue = UsageQueue(sink, Journal(Path(tmp) / "usage-journal.jsonl"), maxsize=records, wal=False)
        batch = [make_record(i) for i in range(records)]
        probe.reset()
        a = probe.snap()
        t0 = time.perf_counter()
        queue.start()
        for r in batch:
            queue.submit(r)
        while queue.written < records:
            if queue.sink_down:
                raise RuntimeError("the ledger failed during the run")
            await asyncio.sleep(0.002)
        wall = time.perf_counter() - t0
        b = probe.snap()
        stream_bytes = sum(int(probe.r.memory_usage(s, samples=0) or 0) for s in sink.streams)
        sample = [
            marker_key(sink.streams[shard_of(r.response_id, shards)], r.response_id)
            for r in batch[:: max(1, records // 200)]
        ]
        marker_bytes = sum(int(probe.r.memory_usage(k, samples=0) or 0) for k in sample) / len(sample)
        await queue.drain()
    d = probe.delta(a, b)
    unit = _per_unit(d, None, records)
    single = await ledger_single(url, probe, records // 5, writers=32, shards=shards)
    more: dict[str, Any] = {}
    if sharded:
        more["sharded"] = await ledger(url, probe, records, LEDGER_SHARDS, sharded=False)
    return {
        **more,
        "single": single,
        "shards": shards,
        "streams": shard_streams(LEDGER_STREAM, shards),
        "records": records,
        "batch_max": queue.batch_max,
        "wall_s": wall,
        "records_per_s": records / wall,
        "appended": sink.appended,
        "redis": unit,
        "redis_records_per_cpu_s": 1 / unit["cpu_s_per_unit"] if unit["cpu_s_per_unit"] > 0 else None,
        "stream_bytes_per_record": stream_bytes / records,
        # what the markers take with the keyspace's own tables (main and expires dicts), and the key alone
        "marker_bytes_per_record": (d["used_memory"] - stream_bytes) / records,
        "marker_key_bytes": marker_bytes,
        "used_memory_bytes_per_record": d["used_memory"] / records,
    }


async def ledger_single(url: str, probe: RedisProbe, records: int, writers: int, shards: int = 1) -> dict[str, Any]:
    """A fleet's shape: many replicas, each with a few records per second, so each batch holds one
    record; ``writers`` concurrent clients keep Redis busy, so its CPU per call is that of a loaded
    shard (an idle one also pays a wake-up per call)."""
    from benchmarks.usage_submit import make_record
    from billing.ledger import RedisLedger

    sinks = [RedisLedger(url, LEDGER_STREAM, shards=shards) for _ in range(writers)]
    batch = [make_record(10_000_000 + i) for i in range(records)]
    for i, s in enumerate(sinks):  # connections made (HELLO, CLIENT SETINFO) and the script loaded first
        await s.write_batch([make_record(20_000_000 + i)])

    async def write(sink: Any, mine: list[Any]) -> None:
        for r in mine:
            await sink.write_batch([r])

    probe.reset()
    a = probe.snap()
    t0 = time.perf_counter()
    await asyncio.gather(*(write(s, batch[i::writers]) for i, s in enumerate(sinks)))
    wall = time.perf_counter() - t0
    d = probe.delta(a, probe.snap())
    for s in sinks:
        await s.close()
    unit = _per_unit(d, None, records)
    return {
        "records": records,
        "writers": writers,
        "shards": shards,
        "wall_s": wall,
        "records_per_s": records / wall,
        "appended": sum(s.appended for s in sinks),
        "redis": unit,
    }


def run(quick: bool) -> dict[str, Any]:
    from benchmarks.common import ChildGateway
    from benchmarks.concurrency import idle_memory
    from benchmarks.usage_submit import run as usage_submit
    from gateway.base.settings import Settings
    from tests.conftest import RedisServer

    turns = 10 if quick else 50
    idle_s = 3.0 if quick else 10.0
    server = RedisServer()
    server.start()
    result: dict[str, Any] = {
        "benchmark": "scaling",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "engine": "simulated, zero latency, short turns",
        "redis_server": _server_version(server.url),
    }
    try:
        probe = RedisProbe(server.url)
        with ChildGateway("--script", "short", "--redis-url", server.url) as gw:
            # what the gateway does to Redis (and costs itself) with nothing to do
            time.sleep(1.0)
            probe.reset()
            c0, a = cpu_seconds(gw.proc.pid), probe.snap()
            time.sleep(idle_s)
            idle = probe.delta(a, probe.snap())
            idle["gateway_cpu_s"] = cpu_seconds(gw.proc.pid) - c0
            result["idle"] = {
                "wall_s": idle["wall_s"],
                "gateway_cpu_s_per_s": idle["gateway_cpu_s"] / idle["wall_s"],
                "redis": _per_unit(idle, None, 1),
            }
            plan = [
                ("ws", 32_768),
                ("ws", 131_072),
                ("http_chained", 32_768),
                ("http_chained", 131_072),
                ("ws_store", 32_768),
                ("conversation", 32_768),
                ("background", 32_768),
            ]
            result["turns"] = [turn_scenario(gw, probe, idle, mode, size, turns) for mode, size in plan]
        with ChildGateway("--script", "short", "--redis-url", server.url) as gw:
            result["idle_cpu"] = asyncio.run(idle_cpu(gw.ws_url, 32 if quick else 256, 5.0 if quick else 45.0, gw))
        memory = []
        for size, conns in ((32_768, 4 if quick else 32), (131_072, 2 if quick else 8)):
            with ChildGateway("--script", "short", "--redis-url", server.url) as gw:
                memory.append(asyncio.run(idle_memory(gw.ws_url, conns, size, gw)))
        result["idle_memory"] = memory
        result["ledger"] = asyncio.run(ledger(server.url, probe, 5_000 if quick else 50_000))
    finally:
        server.stop()
    with tempfile.TemporaryDirectory() as tmp:
        wal = usage_submit(5 if quick else 50, 256, Path(tmp))
    result["usage_wal"] = {
        "submit_us_per_record_wal": wal["submit_us_per_record_median"]["wal"],
        "wal_cost_us_per_record": wal["wal_cost_us_per_record"],
    }
    defaults = Settings()
    result["retention"] = {
        "store_ttl_s": defaults.store_ttl_s,
        "ledger_marker_ttl_s": defaults.usage_marker_ttl_s,
        "ledger_stream_shards": defaults.usage_stream_shards,
    }
    return result


def _server_version(url: str) -> str:
    import redis

    info = redis.Redis.from_url(url).info("server")
    return f"{'valkey ' + info['valkey_version'] if 'valkey_version' in info else 'redis ' + info['redis_version']}"


def bench(out: Path, quick: bool) -> Path:
    """The runner's step: measure, write ``<out>/scaling.json`` (the runner then calls :func:`write_doc`)."""
    from benchmarks.common import machine

    load0, t0 = os.getloadavg()[0], time.perf_counter()
    result = run(quick)
    result["machine"] = machine(load0, time.perf_counter() - t0)
    result["quick"] = quick
    path = out / "scaling.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


# -- the document ---------------------------------------------------------------------------------

#: The workload model (see the document's "Workload" section for why these values).
SESSIONS = 100_000
TURN_EVERY_S = 10.0
#: a replica is one gateway process (one event loop, one core's worth of Python): CPU use to plan for
REPLICA_CPU_TARGET = 0.6
#: a replica pod's memory limit, and the share of it planned for connection state
REPLICA_MEMORY_GIB = 8.0
REPLICA_MEMORY_USABLE = 0.75
#: a Redis primary runs commands on one thread: the share of that core to plan for
SHARD_CPU_TARGET = 0.5
#: memory per Redis primary planned for data (a 32 GiB node, no persistence fork, some fragmentation)
SHARD_MEMORY_GIB = 24.0
#: network per Redis primary to plan for, bytes per second each way (2 Gbit/s of a 10 Gbit/s NIC)
SHARD_NET_BYTES_S = 250e6
#: how long the plan keeps ledger records in the streams (``usage_stream_retention_s``, off by default:
#: the plan assumes billing exports the day's records and the streams are trimmed to a day)
LEDGER_RETENTION_PLAN_S = 86400.0
#: the marker TTL before it became a setting (for the "before" line of the first-bottleneck section)
OLD_MARKER_TTL_S = 7 * 86400


def doc_path(out: Path, result: dict[str, Any]) -> Path:
    """``deploy/SCALING.md`` for a full run into ``benchmarks/results/``; next to the JSON otherwise
    (a quick run or another folder must not overwrite the committed document)."""
    if not result.get("quick") and out.resolve() == RESULTS.resolve():
        return DOC
    return out / "SCALING.md"


def write_doc(out: Path) -> Path | None:
    path = out / "scaling.json"
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    target = doc_path(out, result)
    target.write_text(render_doc(result))
    return target


def _n(x: float, nd: int = 0) -> str:
    return f"{x:,.{nd}f}"


def _b(x: float) -> str:
    """Bytes, human-sized (binary units)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:,.0f} B"


def _k(tokens: int) -> str:
    return f"{round(tokens / 1024)}k"


def _row(result: dict[str, Any], mode: str, size: int) -> dict[str, Any]:
    return next(t for t in result["turns"] if t["mode"] == mode and abs(t["state_tokens_start"] - size) < size / 4)


def _memory(result: dict[str, Any], size: int) -> dict[str, Any]:
    return min(result["idle_memory"], key=lambda m: abs(m["state_tokens"] - size))


def plan(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The four workloads at ``SESSIONS``: gateway replicas, Redis shards, ledger; all from ``result``."""
    turns_s = SESSIONS / TURN_EVERY_S
    led = result["ledger"]
    idle_conn_cpu = result["idle_cpu"]["cpu_s_per_connection_second"]
    replica_usable = REPLICA_MEMORY_GIB * 2**30 * REPLICA_MEMORY_USABLE
    shard_mem = SHARD_MEMORY_GIB * 2**30
    store_ttl = result["retention"]["store_ttl_s"]
    marker_ttl = result["retention"]["ledger_marker_ttl_s"]
    # at a fleet's rate per replica (turns/s ÷ replicas, a few hundred) a queue finds one record per
    # batch, not 256: the shard's CPU per record is that of single-record calls from many clients
    # (the dearer of one stream and several shards: a shard costs what a stream does)
    single = [led["single"]] + ([led["sharded"]["single"]] if "sharded" in led else [])
    unbatched = max(x["redis"]["cpu_s_per_unit"] for x in single)
    net_per_record = max(max(x["redis"]["net_in_bytes_per_unit"], x["redis"]["net_out_bytes_per_unit"]) for x in single)
    # what one ledger shard holds per record/s: markers over their TTL, entries over the retention
    held_per_record_s = (
        marker_ttl * led["marker_bytes_per_record"] + LEDGER_RETENTION_PLAN_S * led["stream_bytes_per_record"]
    )
    ledger_ceiling = {
        "CPU": SHARD_CPU_TARGET / unbatched,
        "memory": shard_mem / held_per_record_s,
        "network": SHARD_NET_BYTES_S / net_per_record,
    }
    out = []
    for mode, size in (("ws", 32_768), ("ws", 131_072), ("http_chained", 32_768), ("http_chained", 131_072)):
        t = _row(result, mode, size)
        ws = t["transport"] == "ws"
        cores = turns_s * t["gateway_cpu_s_per_turn"] + (SESSIONS * idle_conn_cpu if ws else 0.0)
        cpu_replicas = math.ceil(cores / REPLICA_CPU_TARGET)
        mem_replicas = None
        per_conn = None
        if ws:
            m = _memory(result, size)
            per_conn = m["bytes_per_idle_connection"]
            base = m["rss_before_mb"] * 2**20
            mem_replicas = math.ceil(SESSIONS * per_conn / (replica_usable - base))
        replicas = max(cpu_replicas, mem_replicas or 0)
        r = t["redis"]
        # the turn's ops include its usage record; the ledger is its own shard (one stream, one slot)
        ops_s = turns_s * r["calls_per_unit"]
        in_s, out_s = turns_s * r["net_in_bytes_per_unit"], turns_s * r["net_out_bytes_per_unit"]
        redis_cores = turns_s * r["cpu_s_per_unit"]
        ledger_cores = turns_s * unbatched
        # a store=false WS turn's only Redis work is its usage record: all of it is the ledger's
        store_cores = max(0.0, redis_cores - ledger_cores) if t["store"] else 0.0
        stored_per_response = t["redis_data_bytes_per_turn"] if t["store"] else 0.0
        store_mem = turns_s * store_ttl * stored_per_response
        marker_mem = turns_s * marker_ttl * led["marker_bytes_per_record"]
        stream_day = turns_s * 86400 * led["stream_bytes_per_record"]
        shards = (
            max(
                math.ceil(store_cores / SHARD_CPU_TARGET),
                math.ceil(store_mem / shard_mem),
                math.ceil(max(in_s, out_s) / SHARD_NET_BYTES_S),
                1,
            )
            if t["store"]
            else 0
        )
        ledger_cpu_ceiling = SHARD_CPU_TARGET / unbatched  # records/s one shard takes, a record per call
        # the ledger's shards, sized like the store's: CPU, memory (markers + retained entries), network
        stream_mem = turns_s * LEDGER_RETENTION_PLAN_S * led["stream_bytes_per_record"]
        ledger_need = {
            "CPU": ledger_cores / SHARD_CPU_TARGET,
            "memory": (marker_mem + stream_mem) / shard_mem,
            "network": turns_s * net_per_record / SHARD_NET_BYTES_S,
        }
        ledger_shards = max(max(math.ceil(v) for v in ledger_need.values()), 1)
        out.append(
            {
                "mode": mode,
                "label": t["label"],
                "name": f"{SHORT[mode]}, {_k(size)}",
                "state_k": _k(size),
                "ws": ws,
                "turns_s": turns_s,
                "state_tokens": t["state_tokens_start"],
                "gateway_cores": cores,
                "cpu_replicas": cpu_replicas,
                "mem_replicas": mem_replicas,
                "bytes_per_connection": per_conn,
                "replicas": replicas,
                "replicas_bound": "memory" if (mem_replicas or 0) > cpu_replicas else "CPU",
                "ops_s": ops_s,
                "in_s": in_s,
                "out_s": out_s,
                "redis_cores": redis_cores,
                "store_cores": store_cores,
                "ledger_cores": ledger_cores,
                "stored_per_response": stored_per_response,
                "store_mem": store_mem,
                "marker_mem": marker_mem,
                "stream_day": stream_day,
                "shards": shards,
                "ledger_needed": turns_s,
                "ledger_replica_s": led["records_per_s"],
                "ledger_cpu_ceiling": ledger_cpu_ceiling,
                "ledger_cpu_per_record": unbatched,
                "ledger_cpu_ceiling_batched": SHARD_CPU_TARGET / led["redis"]["cpu_s_per_unit"],
                "ledger_mem_ceiling_s": shard_mem / (marker_ttl * led["marker_bytes_per_record"]),
                "ledger_stream_mem": stream_mem,
                "ledger_net_s": turns_s * net_per_record,
                "ledger_shards": ledger_shards,
                "ledger_bound": max(ledger_need, key=lambda k: ledger_need[k]),
                "ledger_shard_ceiling": ledger_ceiling,
                "ledger_shard_records_s": min(ledger_ceiling.values()),
                "ledger_shard_bound": min(ledger_ceiling, key=lambda k: ledger_ceiling[k]),
                "ledger_old_mem_ceiling_s": shard_mem / (OLD_MARKER_TTL_S * led["marker_bytes_per_record"]),
            }
        )
    return out


#: column heads of the four workloads
SHORT = {"ws": "WS store=false", "http_chained": "HTTP store=true"}


def render_doc(result: dict[str, Any]) -> str:
    m = result["machine"]
    led = result["ledger"]
    ic = result["idle_cpu"]
    wal = result["usage_wal"]
    idle = result["idle"]
    quick = " (a `--quick` smoke run: figures are not for planning)" if result.get("quick") else ""
    L = [
        "# Capacity on paper: 100,000 agent sessions",
        "",
        "<!-- Written by benchmarks/scaling.py (render_doc) from benchmarks/results/scaling.json; do not edit by hand:"
        " `python -m benchmarks --only scaling` remeasures, `python -m benchmarks --report-only` rewrites it. -->",
        "",
        f"Every figure below is computed from one benchmark run (`benchmarks/scaling.py`, "
        f"`benchmarks/results/scaling.json`) of {result['date']}{quick}: {m['cpus']} vCPUs ({m['platform']}, "
        f"Python {m['python']}), 1-minute load average {m['loadavg_1m_start']:.1f} at the start and "
        f"{m['loadavg_1m_end']:.1f} at the end, {_n(m['wall_s'])} s. The machine is small and shared, so "
        "what is read here is CPU *seconds* from `/proc` and counts and bytes from the servers' own counters, "
        "not latencies; CPU seconds still inflate somewhat on a loaded machine (shared caches, frequency), "
        "so the figures err on the expensive side of a dedicated node.",
        "",
        f"Set-up: the gateway in its own process (`benchmarks/sim_server.py`), the simulated engine at zero "
        f"latency with terse answers, {result['redis_server']} for the response store, conversations and the "
        f"usage ledger. Each measured turn adds one {result['turns'][0]['new_tokens_per_turn']}-token user item "
        "(a tool output) and gets a short answer; engine time is not part of any gateway figure.",
        "",
        "## Measured units",
        "",
        "### Gateway, per turn",
        "",
        "| turn | state (tokens, start → end) | chain depth | gateway CPU ms / turn | RSS growth / turn |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in result["turns"]:
        L.append(
            f"| {t['label']} | {_n(t['state_tokens_start'])} → {_n(t['state_tokens_end'])} | "
            f"{t['chain_depth_start']} → {t['chain_depth_end']} | {_n(t['gateway_cpu_s_per_turn'] * 1e3, 2)} | "
            f"{_b(t['gateway_rss_growth_bytes_per_turn'])} |"
        )
    L += [
        "",
        f"The usage WAL (on in production with a journal, off in this gateway process) adds "
        f"{_n(wal['wal_cost_us_per_record'], 1)} µs of CPU per turn on top (`benchmarks/usage_submit.py`, same run).",
        "",
        "### Gateway, per idle WebSocket connection",
        "",
        "| state held | connections | RSS per connection | RSS per state token |",
        "|---:|---:|---:|---:|",
    ]
    for x in result["idle_memory"]:
        L.append(
            f"| {_n(x['state_tokens'])} | {x['connections']} | {_b(x['bytes_per_idle_connection'])} | "
            f"{_n(x['bytes_per_state_token'], 1)} B |"
        )
    L += [
        "",
        f"Idle CPU: {ic['connections']} open connections over {_n(ic['seconds'])} s (the server pings every "
        f"20 s) cost {_n(ic['cpu_s_per_connection_second'] * 1e6, 2)} µs of gateway CPU per connection per second "
        f"({_n(ic['gateway_cpu_s_open'], 3)} s vs {_n(ic['gateway_cpu_s_none'], 3)} s with none open).",
        "",
        "### Redis, per turn",
        "",
        "Calls counted by `INFO commandstats` (a Lua script's or a transaction's inner commands count, as Redis "
        "executes them); bytes from `total_net_input_bytes` / `total_net_output_bytes`; Redis CPU from `INFO cpu` "
        "(the server's own user + system time); data: `MEMORY USAGE` summed over every key, before and after "
        "(the usage record's share: the ledger stream and its markers). What an idle gateway does to Redis "
        f"({_n(idle['redis']['calls_per_unit'] / idle['wall_s'], 1)} calls/s: "
        + ", ".join(f"{k} {_n(v / idle['wall_s'], 1)}/s" for k, v in idle["redis"]["commands_per_unit"].items())
        + ") is subtracted at its rate.",
        "",
        "| turn | state | calls / turn | bytes in / turn | bytes out / turn | Redis CPU µs / turn | data / turn | of it, usage record | commands / turn |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in result["turns"]:
        r = t["redis"]
        cmds = ", ".join(f"{k} {_n(v, 1)}" for k, v in sorted(r["commands_per_unit"].items(), key=lambda kv: -kv[1]))
        L.append(
            f"| {t['label']} | {_k(t['state_tokens_start'])} | {_n(r['calls_per_unit'], 1)} | "
            f"{_b(r['net_in_bytes_per_unit'])} | {_b(r['net_out_bytes_per_unit'])} | "
            f"{_n(r['cpu_s_per_unit'] * 1e6)} | {_b(t['redis_data_bytes_per_turn'] + t['redis_ledger_bytes_per_turn'])} | "
            f"{_b(t['redis_ledger_bytes_per_turn'])} | {cmds} |"
        )
    lr = led["redis"]
    h = _row(result, "http_chained", 32_768)
    pexpire = h["redis"]["commands_per_unit"].get("pexpire", 0)
    depths = f"{h['chain_depth_start']} → {h['chain_depth_end']}"
    L += (
        [
            "",
            "Every turn's usage record is part of its row (the ledger's script and its `SET`/`XADD`). "
            + (
                "`store=true` chains write one record per response and keep the whole chain alive with one "
                "`PEXPIRE` of its chain hash (and one of the record), whatever the chain's depth: here "
                f"{_n(pexpire, 1)} `PEXPIRE` a turn over depths {depths}, so calls and bytes per turn do not grow "
                "with the session's length."
                if pexpire <= 3
                else "`store=true` chains write one record per response and refresh every ancestor's TTL in the same "
                "transaction, so calls per turn grow with the chain's depth (its number of responses), not its "
                f"tokens: here {_n(pexpire, 1)} `PEXPIRE` a turn over depths {depths}; an agent session of several "
                "hundred turns pays several hundred a turn, and the plan below holds for chains of the depths "
                "measured."
            ),
            "",
            "### Ledger",
            "",
            f"One billing queue (one writer, batches of up to {led['batch_max']}, one in flight) delivered "
            f"{_n(led['records'])} records into the Redis ledger at **{_n(led['records_per_s'])} records/s**; "
            f"Redis spent {_n(lr['cpu_s_per_unit'] * 1e6, 1)} µs of CPU per record "
            f"({_n(lr['calls_per_unit'], 2)} calls, {_b(lr['net_in_bytes_per_unit'])} in per record). Memory per record: "
            f"{_b(led['stream_bytes_per_record'])} in the stream, {_b(led['marker_bytes_per_record'])} for its "
            f"dedup marker ({_b(led['marker_key_bytes'])} the key itself, the rest the keyspace's tables; kept "
            f"{_dur(result['retention']['ledger_marker_ttl_s'])}).",
            "",
        ]
        + _sharded_units(result)
        + [
            "## Workload",
            "",
            f"**{_n(SESSIONS)} concurrent agent sessions, each taking one turn every {_n(TURN_EVERY_S)} s** "
            f"({_n(SESSIONS / TURN_EVERY_S)} turns/s in all). A coding agent's turn is one model call ending in a "
            "tool call, then the tool runs; with a fast engine (hundreds of tokens/s per stream, prefix cache hits) "
            "the model part takes about a second, and the tool — reading files, running a build or the tests, "
            "waiting on the user's approval — takes the rest. Averaged over many sessions that is a turn every "
            "several seconds to tens of seconds; every 10 s is a busy fleet, not an idle one. The figures are "
            "linear in the turn rate: halving the interval doubles every per-turn line below (not the memory "
            "held per connection).",
            "",
            "Four variants: WebSocket `store=false` (Codex's transport: the state lives in the connection), and "
            "HTTP `store=true` with `previous_response_id` (the SDKs' default: the state lives in Redis), each "
            "with a 32k- and a 128k-token state per session.",
            "",
            "Sizing assumptions: a gateway replica is one process (one event loop: about one core of Python) "
            f"planned at {_n(100 * REPLICA_CPU_TARGET)}% CPU, with a {_n(REPLICA_MEMORY_GIB)} GiB memory limit of which "
            f"{_n(100 * REPLICA_MEMORY_USABLE)}% is planned for connection state (the rest: bursts of in-flight turns, "
            "allocator headroom); the replica's own base RSS is taken from the run. A Redis primary runs commands "
            f"on one thread, planned at {_n(100 * SHARD_CPU_TARGET)}% of it, with {_n(SHARD_MEMORY_GIB)} GiB for data "
            f"and {_b(SHARD_NET_BYTES_S)}/s of network each way. Retention: stored responses "
            f"{_n(result['retention']['store_ttl_s'] / 3600)} h (`store_ttl_s`'s default), ledger markers "
            f"{_dur(result['retention']['ledger_marker_ttl_s'])} (`usage_marker_ttl_s`'s default), ledger records "
            f"{_dur(LEDGER_RETENTION_PLAN_S)} in the streams (`usage_stream_retention_s`, off by default: billing "
            "exports the day's records, then the streams are trimmed). Replicas of each primary (failover) "
            "double the Redis nodes, not the shard count.",
            "",
            "## What 100,000 sessions need",
            "",
            "| | " + " | ".join(p["name"] for p in plan(result)) + " |",
            "|---|" + "---:|" * 4,
        ]
    )
    P = plan(result)

    def row(name: str, cells: list[str]) -> None:
        L.append(f"| {name} | " + " | ".join(cells) + " |")

    row("gateway CPU (cores)", [_n(p["gateway_cores"], 1) for p in P])
    row("replicas, CPU-bound", [_n(p["cpu_replicas"]) for p in P])
    row("RSS per session", [_b(p["bytes_per_connection"]) if p["ws"] else "no connection state" for p in P])
    row("replicas, memory-bound", [_n(p["mem_replicas"]) if p["mem_replicas"] else "—" for p in P])
    row("**gateway replicas**", [f"**{_n(p['replicas'])}** ({p['replicas_bound']})" for p in P])
    row("Redis calls/s", [_n(p["ops_s"]) for p in P])
    row("Redis network in / out per s", [f"{_b(p['in_s'])} / {_b(p['out_s'])}" for p in P])
    row("Redis CPU (cores), store / ledger", [f"{_n(p['store_cores'], 2)} / {_n(p['ledger_cores'], 2)}" for p in P])
    row("stored bytes per response", [_b(p["stored_per_response"]) if p["stored_per_response"] else "—" for p in P])
    row("store memory at retention", [_b(p["store_mem"]) if p["store_mem"] else "—" for p in P])
    row("**store shards**", [f"**{_n(p['shards'])}**" if p["shards"] else "none (ledger only)" for p in P])
    row("ledger records/s needed", [_n(p["ledger_needed"]) for p in P])
    row(
        f"ledger marker memory ({_dur(result['retention']['ledger_marker_ttl_s'])} TTL)",
        [_b(p["marker_mem"]) for p in P],
    )
    row(f"ledger streams at retention ({_dur(LEDGER_RETENTION_PLAN_S)})", [_b(p["ledger_stream_mem"]) for p in P])
    row("ledger network per s", [_b(p["ledger_net_s"]) for p in P])
    row("**ledger shards**", [f"**{_n(p['ledger_shards'])}** ({p['ledger_bound']})" for p in P])
    L += [""]
    p0 = P[0]
    L += [
        "How each line is computed: gateway cores = turns/s × CPU per turn (+ sessions × idle CPU per "
        "connection for WebSocket); CPU-bound replicas = cores ÷ the CPU target; memory-bound replicas = "
        "sessions × RSS per idle connection ÷ (planned memory − base RSS); the replica count is the larger. "
        "Redis: turns/s × each per-turn unit; stored bytes per response = the data a turn added (`MEMORY USAGE`), "
        "its usage record apart; store shards = the largest of CPU ÷ target, memory at retention ÷ shard memory, network ÷ "
        "shard network; ledger shards likewise from the ledger's own units (below). The per-turn Redis CPU was measured with one client "
        "turn at a time, so the server also paid a wake-up per request; a busy shard amortizes those (a "
        f"WS `store=false` turn cost Redis {_n(_row(result, 'ws', 32_768)['redis']['cpu_s_per_unit'] * 1e6)} µs "
        f"alone, its usage record {_n(result['ledger']['single']['redis']['cpu_s_per_unit'] * 1e6)} µs from "
        f"{result['ledger']['single']['writers']} writers at once), so the Redis CPU lines err high.",
        "",
    ]
    # the ledger: N streams, a hash tag each, sized like the store
    ws_min = min(p["replicas"] for p in P)
    ceil = p0["ledger_shard_ceiling"]
    ttl = result["retention"]["ledger_marker_ttl_s"]
    L += [
        "## The ledger's shards",
        "",
        "The usage ledger is `usage_stream_shards` Redis Streams, each with its own hash tag and its records' "
        "dedup markers in its slot, a record's shard chosen by a hash of its response id (`billing/ledger.py`), "
        "so shards spread over the cluster's nodes like the store's chains, and a replay always meets its "
        f"record's marker. {_n(SESSIONS)} sessions need **{_n(p0['ledger_needed'])} records/s**. Measured: one "
        f"replica's queue delivers {_n(led['records_per_s'])} records/s on its own, so the fleet's "
        f"{_n(ws_min)}+ replicas together have "
        f"{'ample' if led['records_per_s'] * ws_min > 2 * p0['ledger_needed'] else 'too little'} "
        f"writer capacity. A replica at the fleet's rate ({_n(p0['turns_s'] / ws_min)} turns/s or fewer) finds "
        f"about one record per batch, and {led['single']['writers']} clients writing one record per call (the "
        f"fleet's shape, Redis kept busy) cost Redis {_n(p0['ledger_cpu_per_record'] * 1e6, 1)} µs per record "
        "(the dearer of one stream and of several shards), so one shard takes "
        f"{_n(ceil['CPU'])} records/s at the {_n(100 * SHARD_CPU_TARGET)}% CPU target (in full batches "
        f"{_n(p0['ledger_cpu_ceiling_batched'])}); its memory holds {_n(ceil['memory'])} records/s "
        f"({_b(led['marker_bytes_per_record'])} of marker for {_dur(ttl)} and "
        f"{_b(led['stream_bytes_per_record'])} of entry for {_dur(LEDGER_RETENTION_PLAN_S)} each, in "
        f"{_n(SHARD_MEMORY_GIB)} GiB), and its network {_n(ceil['network'])} records/s. A shard is therefore "
        f"**{ceil_name(p0)}-bound at {_n(p0['ledger_shard_records_s'])} records/s**, and "
        f"{_n(SESSIONS)} sessions need **{_n(p0['ledger_shards'])} shards** "
        f"(`RESPGATE_USAGE_STREAM_SHARDS={_n(p0['ledger_shards'])}` or more): "
        f"{_b(p0['marker_mem'])} of markers and {_b(p0['ledger_stream_mem'])} of retained entries, "
        f"{_n(100 * p0['ledger_cores'] / SHARD_CPU_TARGET / p0['ledger_shards'])}% of each shard's CPU budget. "
        "Without a retention (the default) nothing trims the streams: together they grow "
        f"{_b(p0['stream_day'])} a day, and the shards' memory runs out within days unless billing trims them.",
        "",
    ]
    # where the first bottleneck is: the default layout (one stream) first, then the sharded plan
    one = p0["ledger_shard_records_s"] * TURN_EVERY_S  # sessions one ledger shard carries
    old = min(p0["ledger_old_mem_ceiling_s"], p0["ledger_cpu_ceiling"]) * TURN_EVERY_S
    L += ["## Where the first bottleneck is", ""]
    if one < SESSIONS:
        L += [
            f"**With the default one ledger stream: the ledger shard's {ceil_name(p0)}.** At one turn every "
            f"{_n(TURN_EVERY_S)} s one stream (its markers for {_dur(ttl)}, its entries trimmed to "
            f"{_dur(LEDGER_RETENTION_PLAN_S)}) carries about **{_n(one)} sessions**, whatever the transport "
            f"(with the week-long markers of earlier releases its memory capped it at {_n(old)}), below the "
            f"{_n(SESSIONS)} asked for. Sharded as above ({_n(p0['ledger_shards'])} streams), the ledger "
            "scales out by adding shards like the store, and no single node caps the deployment: every "
            "part grows by adding units of it; batching records across a replica's turns (a short linger "
            "before each write) would cut the ledger's CPU per record, not its memory.",
            "",
        ]
    else:
        L += [
            f"Not the ledger: its one stream carries {_n(one)} sessions at this turn rate before its "
            f"{ceil_name(p0)} runs out, above the {_n(SESSIONS)} asked for. The first limits are then the parts "
            "that scale out, below.",
            "",
        ]
    big = max(P[2:], key=lambda p: p["shards"])
    L += [
        f"What then sizes the deployment is Redis memory for `store=true` (the store's "
        f"{_n(big['shards'])} shards at {big['state_k']}, set by {_store_bound(big)}, against the ledger's "
        f"{_n(p0['ledger_shards'])}) and gateway replicas for WebSocket sessions (below). The one slot "
        "still shared by the whole deployment is the background responses' leases (`{bg}`), which only "
        "background responses touch.",
        "",
    ]
    gw_bound = max(P, key=lambda p: p["replicas"])
    ws32, ws128, h32, h128 = P
    out32, out128 = h32["out_s"] / h32["turns_s"], h128["out_s"] / h128["turns_s"]
    #: does a store=true turn read its history back (bytes out of Redis growing with the state)?
    readback_grows = out128 > 1.5 * out32
    L += [
        "Gateway: for WebSocket sessions a replica runs out of "
        + ("memory" if ws32["replicas_bound"] == "memory" else "CPU")
        + f" first at 32k ({_n(ws32['replicas'])} replicas) and of "
        + ("memory" if ws128["replicas_bound"] == "memory" else "CPU")
        + f" at 128k ({_n(ws128['replicas'])}): the session's state lives in the replica, "
        f"{_b(ws128['bytes_per_connection'])} of RSS at 128k. HTTP `store=true` sessions hold no connection "
        "state there (a bounded token cache per replica), but each turn costs more CPU "
        f"({_n(h32['gateway_cores'] / h32['turns_s'] * 1e3, 2)} ms at 32k, "
        f"{_n(h128['gateway_cores'] / h128['turns_s'] * 1e3, 2)} ms at 128k, against "
        f"{_n(ws32['gateway_cores'] / ws32['turns_s'] * 1e3, 2)} ms on WebSocket): "
        + (
            f"the response is read back from Redis every turn, every ancestor's delta of it "
            f"({_b(out32)} out of Redis per turn at 32k, {_b(out128)} at 128k), even on the replica that "
            "already holds the chain's tokens."
            if readback_grows
            else f"what comes out of Redis per turn stays flat ({_b(out32)} at 32k, {_b(out128)} at 128k: the "
            "replica holds the chain's context and reads only the parent record's own fields), so the extra "
            "cost is the turn's own round trips — the parent read, the record written (one script in the "
            "chain's slot), the terminal event held until the write lands — and the Response object parsed "
            "and serialized on each side."
        )
        + f" The largest count is {_n(gw_bound['replicas'])} replicas "
        f"({gw_bound['name']}), about {_n(SESSIONS / gw_bound['replicas'])} sessions each.",
        "",
        f"Store: for `store=true` HTTP the shard count is set by {_store_bound(h32)} at 32k and "
        f"{_store_bound(h128)} at 128k ({_n(h32['shards'])} and {_n(h128['shards'])} shards). Every turn keeps "
        "its response for the store's TTL, so memory is turns/s × TTL × bytes per response, and a shorter "
        "`store_ttl_s` cuts it in proportion"
        + (
            "; the read-back above is what makes the network grow with the state."
            if readback_grows
            else "; the network per turn does not grow with the state."
        ),
        "",
        "What this does not cover: the engine (its GPUs are sized by tokens/s, not by the gateway), output "
        "streaming beyond a short answer (each output token costs gateway CPU: `benchmarks/results/REPORT.md`, "
        "(c)), TLS, and a replica rebuilding the tokens of a chain it has not seen (the HTTP `store=true` rows "
        "are chains the replica already holds tokens for).",
        "",
    ]
    return "\n".join(L)


def ceil_name(p: dict[str, Any]) -> str:
    """What binds one ledger shard: ``CPU``, ``memory`` or ``network``."""
    return p["ledger_shard_bound"]


def _dur(seconds: float) -> str:
    """A retention in words: whole days as days, else hours."""
    if seconds >= 86400 and seconds % 86400 == 0:
        days = seconds / 86400
        return f"{_n(days)} day{'s' if days != 1 else ''}"
    return f"{_n(seconds / 3600, 1 if seconds % 3600 else 0)} h"


def _sharded_units(result: dict[str, Any]) -> list[str]:
    """The measured-units paragraph of the sharded ledger runs (absent from runs before shards)."""
    led = result["ledger"]
    sh = led.get("sharded")
    if sh is None:
        return []
    one, many = led["single"], sh["single"]
    return [
        f"Into {sh['shards']} stream shards (the batch split per shard, the shards' scripts concurrent) the "
        f"same queue delivered {_n(sh['records_per_s'])} records/s, Redis spending "
        f"{_n(sh['redis']['cpu_s_per_unit'] * 1e6, 1)} µs per record ({_n(sh['redis']['calls_per_unit'], 2)} "
        f"calls); one record per call from {one['writers']} clients cost Redis "
        f"{_n(one['redis']['cpu_s_per_unit'] * 1e6, 1)} µs per record into one stream "
        f"({_n(one['records_per_s'])} records/s) and {_n(many['redis']['cpu_s_per_unit'] * 1e6, 1)} µs into "
        f"{sh['shards']} ({_n(many['records_per_s'])} records/s). All of it on this one server: the shards "
        "do not add capacity here, they show what a record costs a shard (a record is one script on one "
        "stream either way; the plan takes the dearer of the two figures), and on a cluster each shard "
        f"is its own node's. Memory per record across {sh['shards']} shards: {_b(sh['stream_bytes_per_record'])} "
        f"in the streams, {_b(sh['marker_bytes_per_record'])} for the marker.",
        "",
    ]


def _store_bound(p: dict[str, Any]) -> str:
    shard_mem = SHARD_MEMORY_GIB * 2**30
    parts = {
        "memory": p["store_mem"] / shard_mem,
        "CPU": p["store_cores"] / SHARD_CPU_TARGET,
        "network": max(p["in_s"], p["out_s"]) / SHARD_NET_BYTES_S,
    }
    return max(parts, key=lambda k: parts[k])


def section(result: dict[str, Any]) -> list[str]:
    """The REPORT.md section: where the units went (the document is the result)."""
    link = "SCALING.md" if result.get("quick") else "../../deploy/SCALING.md"
    return [
        "## Scaling units",
        "",
        f"Per-unit costs (gateway CPU and memory per turn and per connection, Redis calls, bytes and memory "
        f"per turn, ledger throughput: {_n(result['ledger']['records_per_s'])} records/s per replica) and "
        f"what they imply for {_n(SESSIONS)} agent sessions: [`SCALING.md`]({link}).",
        "",
    ]
