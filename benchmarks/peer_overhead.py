"""(a) against the Rust peer: continuation turns through respgate and through agentic-api, side by side.

Both gateways get the same conversations and the same continuation turn (``previous_response_id``
+ one short user message), each in front of an engine that costs nothing:

* **respgate** — :mod:`benchmarks.sim_server`, the simulated engine at zero latency (prefix-cache
  emulation off): script ``short`` (reasoning ``ok``, answer ``done``), and for capped turns
  script ``stream`` (an answer that only ``max_output_tokens`` ends: every turn is cut off), served
  by the same process under its own model name (:data:`STREAM_MODEL`), as one agentic-api process
  serves both.
* **agentic** — vllm-project/agentic-api's release binary (:mod:`benchmarks.agentic_peer`, pinned
  there) in front of :mod:`benchmarks.upstream_stub`, which answers vLLM's stateless
  ``/v1/responses`` at once with the same short answer, or with ``max_output_tokens`` one-token
  deltas ending incomplete. agentic-api re-sends the whole conversation upstream every turn; the
  stub reads it and answers pre-rendered bytes, so what grows with history on that side is the
  peer's own work (state, serialization, the upstream request) plus reading the body.

* **floor** — :mod:`benchmarks.floor_server`: respgate's own frames for the turn (recorded from it
  at the start), replayed in one write by a server that does nothing else; WebSocket chains at the
  smallest history only (it answers alike whatever the history). What no server can take away from
  this client's measurement: a ratio target below it cannot be met by any server.

Conversations (chains), every combination of:

* transport: ``ws`` (WebSocket, ``store=false``, parent from the connection's state) and ``http``
  (HTTP/SSE, ``store=true``, parent from the gateway's store: respgate's memory store,
  agentic-api's SQLite);
* history shape: ``items`` — grown the way an agent's grows, turn by turn with user items of
  :data:`ITEM_TOKENS` tokens, each answered (so 128k is ~160 items of ~800 tokens plus the answers)
  — and ``one`` — a single user item of the whole size, then the turns;
* history size: 1k / 32k / 128k tokens (o200k, as respgate's renderer counts them);
* output: ``short`` (uncapped, the short answer) and ``cap16`` (``max_output_tokens=16`` on every
  turn, including the ones that built the history: a client with a small cap).

All chains advance turn for turn, in an order shuffled every round (seeded), so machine noise —
and what the turn before left in the caches — hits all alike; time runs from the first byte sent to the terminal event received (``response.completed``
or ``response.incomplete``), the rest of the stream is drained untimed. Rounds alternate between
timed and counted (``--turns`` of each after the warm-up): in a counted round each chain reads its
server's counters before and after its turn — respgate's ``/metrics`` (tokens encoded, full-render
fallbacks by reason), the stub's ``/stats`` (bytes agentic-api sent upstream, and the stub's own
busy time reading and answering them — part of agentic-api's measured turn that is the stand-in's,
not the peer's) — and in a timed round nobody reads counters, so no timed turn follows a scrape
of its own server (a whole ``/metrics`` exposition in Python just before the turn, against a few
numbers from the stub: it cost respgate's turns ~1 ms each, measured).

Reported: per-turn median and p90 per chain; respgate / agentic-api per transport, shape, output
and size; flatness (128k median / 1k median) for both.

Then a back-to-back phase (:func:`back_to_back`): the smallest WebSocket chains, a block of turns
in a row per chain, blocks rotating — each server warm — reported beside the interleaved figures.

    python -m benchmarks.peer_overhead [--turns 100] [--history 1000 32768 131072] [--transports ws http]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.sync.client import connect

from benchmarks.agentic_peer import AGENTIC_API_VERSION, AgenticServer, StubUpstream, install
from benchmarks.common import MODEL, ChildGateway, filler, machine, pct
from benchmarks.floor_server import FloorServer, recorded_turn

RESULTS = Path(__file__).parent / "results"
TARGETS = ("respgate", "agentic")
#: the no-work floor (benchmarks/floor_server.py): WebSocket only, at the smallest history (it
#: replays the same frames whatever the history)
FLOOR = "floor"
TRANSPORTS = ("ws", "http")
SHAPES = ("items", "one")
OUTPUTS = ("short", "cap16")
ITEM_TOKENS = 800
CAP = 16
#: the model under which respgate's process serves the capped chains' endless answer (``cap16``)
STREAM_MODEL = MODEL + "-stream"
TERMINAL = ("response.completed", "response.incomplete")
FAILED = ("error", "response.failed")
LABELS = {"respgate": "respgate", "agentic": f"agentic-api {AGENTIC_API_VERSION}", FLOOR: "no-work floor"}


def _fallbacks(text: str) -> dict[str, float]:
    """``respgate_render_full_fallbacks_total`` by reason, from Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("respgate_render_full_fallbacks_total{"):
            labels, value = line.rsplit(" ", 1)
            reason = labels.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0.0) + float(value)
    return out


class Server:
    """One gateway under test and the counters a turn moves on it."""

    def __init__(
        self,
        target: str,
        url: str,
        ws_url: str,
        *,
        gateway: ChildGateway | None = None,
        stub: StubUpstream | None = None,
        model: str = MODEL,
    ) -> None:
        self.target, self.url, self.ws_url = target, url, ws_url
        self.gateway, self.stub = gateway, stub
        #: the model a turn names (respgate serves the capped chains' endless script under its own)
        self.model = model

    def counters(self) -> dict[str, Any]:
        if self.gateway is not None:
            from benchmarks.common import metric_value

            text = self.gateway.metrics_text()
            return {
                "encoded": metric_value(text, "respgate_render_tokens_total", '{mode="append"}')
                + metric_value(text, "respgate_render_tokens_total", '{mode="full"}'),
                "fallbacks": _fallbacks(text),
            }
        if self.stub is None:
            return {}  # the floor server: nothing to count
        s = self.stub.stats()
        return {
            "upstream_bytes": s["body_bytes"].get("POST /v1/responses", 0),
            "upstream_requests": s["requests"].get("POST /v1/responses", 0),
            "stub_busy_s": s["busy_s"],
        }


class Chain:
    """One conversation; ``turn`` sends one user item and returns seconds to the terminal event."""

    def __init__(self, server: Server, transport: str, shape: str, history_tokens: int, output: str) -> None:
        self.server, self.transport, self.shape, self.output = server, transport, shape, output
        self.history_tokens = history_tokens
        self.target = server.target
        self.key = (self.target, transport, shape, output, history_tokens)
        self.prev: str | None = None
        self.times: list[float] = []
        self.counted = 0  # turns whose server counters were read
        self.burst_times: list[float] = []  # back-to-back turns (:func:`back_to_back`)
        self.events: list[int] = []
        self.statuses: dict[str, int] = {}
        self.encoded: list[float] = []
        self.fallbacks: dict[str, float] = {}
        self.upstream_bytes: list[float] = []
        self.upstream_requests: list[float] = []
        self.stub_ms: list[float] = []  # the upstream stub's own busy time in the turn
        self.input_tokens = 0
        self.first_input_tokens = 0
        if transport == "ws":
            self.ws = connect(server.ws_url, max_size=None, compression=None, open_timeout=60)
        else:
            self.http = httpx.Client(base_url=server.url + "/v1", timeout=600)
        if shape == "one":
            self.turn({"role": "user", "content": filler(history_tokens, seed=1)})
        else:
            left, k = history_tokens, 0
            while left > 0:
                size = min(ITEM_TOKENS, left)
                self.turn({"role": "user", "content": filler(size, seed=k)})
                left, k = left - size, k + 1
        self.first_input_tokens = self.input_tokens

    def _body(self, item: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.server.model, "store": self.transport == "http", "input": [item]}
        if self.output == "cap16":
            body["max_output_tokens"] = CAP
        if self.transport == "http":
            body["stream"] = True
        else:
            body["type"] = "response.create"
        if self.prev:
            body["previous_response_id"] = self.prev
        return body

    def turn(self, item: dict[str, Any], timed: bool = False, counted: bool = False) -> float:
        """One turn; ``timed``: its time, event count and status are recorded; ``counted``: its
        server's counters are read before and after it (never both: see :func:`run_chains`)."""
        data = orjson.dumps(self._body(item))
        before = self.server.counters() if counted else None
        t0 = time.perf_counter()
        ev, dt, n = self._send_ws(data, t0) if self.transport == "ws" else self._send_http(data, t0)
        response = ev["response"]
        self.prev = response["id"]
        usage = response.get("usage") or {}
        self.input_tokens = usage.get("input_tokens") or 0
        if timed:
            self.times.append(dt)
            self.events.append(n)
            self.statuses[response["status"]] = self.statuses.get(response["status"], 0) + 1
        if counted:
            after = self.server.counters()
            self.counted += 1
            if "encoded" in after:
                self.encoded.append(after["encoded"] - before["encoded"])  # type: ignore[index]
                for reason, v in after["fallbacks"].items():
                    d = v - before["fallbacks"].get(reason, 0.0)  # type: ignore[index]
                    if d:
                        self.fallbacks[reason] = self.fallbacks.get(reason, 0.0) + d
            elif "upstream_bytes" in after:
                self.upstream_bytes.append(after["upstream_bytes"] - before["upstream_bytes"])  # type: ignore[index]
                self.upstream_requests.append(after["upstream_requests"] - before["upstream_requests"])  # type: ignore[index]
                self.stub_ms.append((after["stub_busy_s"] - before["stub_busy_s"]) * 1e3)  # type: ignore[index]
        return dt

    def _send_ws(self, data: bytes, t0: float) -> tuple[dict[str, Any], float, int]:
        self.ws.send(data.decode())
        n = 0
        while True:
            ev = orjson.loads(self.ws.recv(timeout=600))
            n += 1
            if ev["type"] in TERMINAL:
                return ev, time.perf_counter() - t0, n
            if ev["type"] in FAILED:
                raise RuntimeError(f"{self.key}: {str(ev)[:500]}")

    def _send_http(self, data: bytes, t0: float) -> tuple[dict[str, Any], float, int]:
        terminal: tuple[dict[str, Any], float, int] | None = None
        n = 0
        with self.http.stream("POST", "/responses", content=data, headers={"content-type": "application/json"}) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.key}: HTTP {r.status_code}: {r.read()[:500]!r}")
            for line in r.iter_lines():
                if terminal is not None or not line.startswith("data: ") or line == "data: [DONE]":
                    continue  # after the terminal event: drained untimed, so the connection is reused
                ev = orjson.loads(line[6:])
                n += 1
                if ev["type"] in TERMINAL:
                    terminal = (ev, time.perf_counter() - t0, n)
                elif ev["type"] in FAILED:
                    raise RuntimeError(f"{self.key}: {str(ev)[:500]}")
        if terminal is None:
            raise RuntimeError(f"{self.key}: stream ended before a terminal event")
        return terminal

    def close(self) -> None:
        (self.ws if self.transport == "ws" else self.http).close()


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(chains: list[Chain], args: argparse.Namespace) -> dict[str, Any]:
    sizes = sorted(args.history)
    small, big = str(sizes[0]), str(sizes[-1])
    rows: dict[str, Any] = {}
    history: dict[str, dict[str, int]] = {}
    for c in chains:
        row = {
            "median_ms": statistics.median(c.times) * 1e3,
            "p90_ms": pct(c.times, 90) * 1e3,
            "p99_ms": pct(c.times, 99) * 1e3,
            "mean_ms": statistics.fmean(c.times) * 1e3,
            "turns": len(c.times),
            "events_per_turn_median": statistics.median(c.events),
            "statuses": c.statuses,
        }
        if c.target == "respgate":
            row.update(
                input_tokens_first=c.first_input_tokens,
                input_tokens_last=c.input_tokens,
                encoded_tokens_per_turn_median=_median(c.encoded),
                full_render_fallbacks=c.fallbacks,
                full_render_fallbacks_total=sum(c.fallbacks.values()),
                counted_turns=c.counted,
            )
            history.setdefault(c.shape, {})[str(c.history_tokens)] = c.first_input_tokens
        elif c.target == "agentic":
            row.update(
                upstream_bytes_per_turn_median=_median(c.upstream_bytes),
                upstream_requests_per_turn_median=_median(c.upstream_requests),
                upstream_stub_ms_per_turn_median=_median(c.stub_ms),
            )
        rows.setdefault(c.target, {}).setdefault(c.transport, {}).setdefault(c.shape, {}).setdefault(c.output, {})[
            str(c.history_tokens)
        ] = row
    flatness: dict[str, Any] = {}
    ratio: dict[str, Any] = {}
    for target, by_t in rows.items():
        for transport, by_s in by_t.items():
            for shape, by_o in by_s.items():
                for output, by_n in by_o.items():
                    if small in by_n and big in by_n:
                        flatness.setdefault(target, {}).setdefault(transport, {}).setdefault(shape, {})[output] = (
                            by_n[big]["median_ms"] / by_n[small]["median_ms"]
                        )
    if "respgate" in rows and "agentic" in rows:
        for transport, by_s in rows["respgate"].items():
            for shape, by_o in by_s.items():
                for output, by_n in by_o.items():
                    theirs = rows["agentic"].get(transport, {}).get(shape, {}).get(output, {})
                    ratio.setdefault(transport, {}).setdefault(shape, {})[output] = {
                        n: {"median": x["median_ms"] / theirs[n]["median_ms"], "p90": x["p90_ms"] / theirs[n]["p90_ms"]}
                        for n, x in by_n.items()
                        if n in theirs
                    }
    floor = {
        shape: {output: by_n[small]["median_ms"] for output, by_n in by_o.items() if small in by_n}
        for shape, by_o in rows.get(FLOOR, {}).get("ws", {}).items()
    }
    burst: dict[str, Any] = {}
    for c in chains:
        if c.burst_times:
            burst.setdefault(c.shape, {})[c.target] = {
                "median_ms": statistics.median(c.burst_times) * 1e3,
                "p90_ms": pct(c.burst_times, 90) * 1e3,
                "turns": len(c.burst_times),
            }
    for by_target in burst.values():
        if "respgate" in by_target and "agentic" in by_target:
            by_target["ratio"] = by_target["respgate"]["median_ms"] / by_target["agentic"]["median_ms"]
    return {
        "benchmark": "peer_overhead",
        "agentic_api_version": AGENTIC_API_VERSION,
        "written_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "engine": {
            "respgate": "simulated, zero latency, prefix-cache emulation off",
            "agentic": "benchmarks/upstream_stub.py: pre-rendered /v1/responses answers",
            FLOOR: "benchmarks/floor_server.py: respgate's recorded frames, one write a turn",
        },
        "turns": args.turns,
        "warmup": args.warmup,
        "history_tokens": sizes,
        "item_tokens": ITEM_TOKENS,
        "cap": CAP,
        "transports": list(args.transports),
        "shapes": list(args.shapes),
        "outputs": list(args.outputs),
        "history_input_tokens": history,
        "chains": rows,
        "flatness_big_over_small": flatness,
        "ratio_respgate_over_agentic": ratio,
        "floor_ws_ms": floor,
        "back_to_back": {
            "history_tokens": small,
            "blocks": args.burst_blocks,
            "per_block": args.burst_turns,
            "by_shape": burst,
        },
    }


def plot(result: dict[str, Any], path: Path) -> None:
    from benchmarks.common import plt

    pyplot = plt()
    from matplotlib.ticker import FuncFormatter

    shapes, outputs = result["shapes"], result["outputs"]
    fig, axes = pyplot.subplots(
        len(shapes), len(outputs), figsize=(6.5 * len(outputs), 4.2 * len(shapes)), squeeze=False
    )
    sizes = result["history_tokens"]
    colors = {"ws": "tab:green", "http": "tab:blue"}
    for i, shape in enumerate(shapes):
        for j, output in enumerate(outputs):
            ax = axes[i][j]
            for target, style in (("respgate", "o-"), ("agentic", "s--")):
                for transport in result["transports"]:
                    by_n = result["chains"].get(target, {}).get(transport, {}).get(shape, {}).get(output)
                    if not by_n:
                        continue
                    ax.errorbar(
                        sizes,
                        [by_n[str(n)]["median_ms"] for n in sizes],
                        yerr=[[0] * len(sizes), [by_n[str(n)]["p90_ms"] - by_n[str(n)]["median_ms"] for n in sizes]],
                        fmt=style,
                        color=colors[transport],
                        capsize=3,
                        markersize=4,
                        label=f"{LABELS[target]}, {transport.upper()}",
                    )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(sizes, [f"{max(1, round(n / 1024))}k" for n in sizes])
            plain = FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
            ax.set_xlabel("history tokens")
            ax.set_ylabel("ms per turn (median, bar to p90)")
            ax.set_title(
                f"history: {'~800-token items' if shape == 'items' else 'one item'}; "
                f"output: {'short' if output == 'short' else f'{CAP}-token cap'}",
                fontsize=10,
            )
            ax.legend(fontsize=7)
    fig.suptitle("Continuation turn: respgate (simulated engine) vs agentic-api (instant upstream)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)


def record_frames(respgate: dict[str, Server]) -> dict[str, list[str]]:
    """respgate's frames for one WebSocket continuation turn of each output kind (the floor replays them)."""
    frames: dict[str, list[str]] = {}
    for output, server in respgate.items():
        with connect(server.ws_url, max_size=None, compression=None, open_timeout=60) as ws:
            body: dict[str, Any] = {
                "type": "response.create",
                "model": server.model,
                "store": False,
                "input": [{"role": "user", "content": filler(64, seed=3)}],
            }
            if output == "cap16":
                body["max_output_tokens"] = CAP
            first = recorded_turn(ws, body)
            body["previous_response_id"] = orjson.loads(first[-1])["response"]["id"]
            body["input"] = [{"role": "user", "content": "step 0: continue"}]
            frames[output] = recorded_turn(ws, body)
    return frames


def run_chains(args: argparse.Namespace) -> list[Chain]:
    binary = install()
    max_context = str(max(args.history) * 2)
    # One respgate process for both outputs, as one agentic-api serves both: with a process per
    # output, each sat idle through the other's chains, and its first chain after them (the 1k one,
    # by construction order) paid the wake-up of a long-idle process every round.
    gateway = ChildGateway("--script", "short", "--stream-model", STREAM_MODEL, "--max-context", max_context)
    opened: list[Any] = [gateway]
    chains: list[Chain] = []
    try:
        respgate = {
            o: Server(
                "respgate", gateway.url, gateway.ws_url, gateway=gateway, model=STREAM_MODEL if o == "cap16" else MODEL
            )
            for o in args.outputs
        }
        stub = StubUpstream(MODEL)
        opened.append(stub)
        agentic = AgenticServer(binary, stub.url)
        opened.append(agentic)
        floor = FloorServer(record_frames(respgate))
        opened.append(floor)
        servers = {("agentic", o): Server("agentic", agentic.url, agentic.ws_url, stub=stub) for o in args.outputs}
        for o in args.outputs:
            servers[("respgate", o)] = respgate[o]
            servers[(FLOOR, o)] = Server(FLOOR, floor.url, floor.ws_url)
        smallest = min(args.history)
        for shape in args.shapes:
            for output in args.outputs:
                for transport in args.transports:
                    for n in args.history:
                        for target in TARGETS:
                            chains.append(Chain(servers[(target, output)], transport, shape, n, output))
                        if transport == "ws" and n == smallest:
                            chains.append(Chain(servers[(FLOOR, output)], transport, shape, n, output))
                print(f"  built {shape}/{output}: {len(chains)} chains", file=sys.stderr)
        # Timed and counted rounds alternate: reading a server's counters right before a timed turn
        # would time that turn after the reader's request (respgate's /metrics is a whole
        # exposition in Python, the stub's /stats a few numbers: unequal), so no counter is read in
        # a timed round, and no turn of a counted round is timed.
        # Each round in its own order (a seeded shuffle): a turn's time depends on what ran just
        # before it — a turn after agentic-api read a 128k-token body upstream runs on caches that
        # read evicted — and a rotation keeps every chain's neighbours, so the chain built first
        # (respgate's 1k WebSocket one) followed the heaviest turn of the round every round.
        order = random.Random(15)
        rounds = args.warmup + 2 * args.turns
        for i in range(rounds):
            measured = i >= args.warmup
            timed, counted = measured and (i - args.warmup) % 2 == 0, measured and (i - args.warmup) % 2 == 1
            for chain in order.sample(chains, len(chains)):
                chain.turn({"role": "user", "content": f"step {i}: continue"}, timed=timed, counted=counted)
            if (i + 1) % 10 == 0:
                print(f"  round {i + 1}/{rounds}", file=sys.stderr)
        back_to_back(chains, args.burst_blocks, args.burst_turns)
    finally:
        for c in chains:
            c.close()
        for p in reversed(opened):
            p.close()
    return chains


def back_to_back(chains: list[Chain], blocks: int, per_block: int) -> None:
    """The smallest WebSocket chains of each target (short answers, both history shapes) again,
    this time ``per_block`` turns in a row on one chain before the next chain's block (blocks
    rotate, ``blocks`` each): the server's process is warm, as one that serves many sessions at
    once always is. The interleaved rounds measure the other case — a turn finds its server idle
    since its previous turn (the other server's turn, or more, in between) and its caches cold —
    which a Python process (a larger working set per turn) pays more for than a compiled one; the
    report gives both."""
    smallest = min(c.history_tokens for c in chains)
    picked = [c for c in chains if c.transport == "ws" and c.output == "short" and c.history_tokens == smallest]
    for b in range(blocks):
        k = b % len(picked) if picked else 0
        for chain in picked[k:] + picked[:k]:
            for j in range(per_block + 1):  # the block's first turn wakes the server: not timed
                dt = chain.turn({"role": "user", "content": f"burst {b}.{j}: continue"})
                if j:
                    chain.burst_times.append(dt)


def run(quick: bool, argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv or (["--turns", "20", "--warmup", "3", "--burst-blocks", "3"] if quick else []))
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    chains = run_chains(args)
    out = summarize(chains, args)
    out["machine"] = machine(load0, time.perf_counter() - t0)
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peer_overhead")
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--burst-blocks", type=int, default=10, help="back-to-back blocks per chain (0: none)")
    ap.add_argument("--burst-turns", type=int, default=20, help="timed turns in a back-to-back block")
    ap.add_argument("--history", type=int, nargs="+", default=[1000, 32768, 131072])
    ap.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--outputs", nargs="+", choices=OUTPUTS, default=list(OUTPUTS))
    ap.add_argument("--json", type=Path, default=RESULTS / "peer_overhead.json")
    ap.add_argument("--plot", type=Path, default=RESULTS / "peer_overhead.png")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    chains = run_chains(args)
    result = summarize(chains, args)
    result["machine"] = machine(load0, time.perf_counter() - t0)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["ratio_respgate_over_agentic"], indent=1))
    try:
        plot(result, args.plot)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
