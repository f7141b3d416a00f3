"""(b) A coding-agent rollout: 30 tool calls, end to end, three ways of talking to the gateway.

The trajectory is fixed (seeded): 12 file reads returning 2-8k tokens, 12 shell commands with
short output, 6 patches the model writes (150-600 tokens of arguments); every model turn starts
with 40-160 tokens of reasoning; the last turn answers in ~150 tokens. Tools "run" instantly (their
outputs are pre-made), so the time that is not the engine's is the gateway's plus the transport's
plus the client's own JSON work.

The simulated engine emulates fast inference: 1,000 tokens/s decode (one token per delta), 10,000
tokens/s prefill for the part of the prompt its prefix cache does not hold, a prefix cache that
keeps each conversation's last prompt + output (what vLLM's automatic prefix caching gives a
single conversation). It is *paced* (``SimulatedEngine(paced=True)``): tokens fall due on a wall
clock, as from an engine decoding in its own process, so gateway work overlaps decode unless the
gateway falls behind. The engine's share of a turn is what that engine alone would take,
``uncached prompt / 10,000 + output tokens / 1,000`` (from the turn's ``usage``); the rest of the
turn's wall time is the gateway's, the transport's and the client's.

Three chains run interleaved, turn for turn, on one gateway, in its own process
(:mod:`benchmarks.sim_server` ``--script rollout``), as a gateway and an agent are:

* ``ws``             WebSocket, ``previous_response_id``, ``store=false``, only the tool output sent;
* ``http_chained``   HTTP/SSE, ``previous_response_id``, ``store=true``, only the tool output sent;
* ``http_stateless`` HTTP/SSE, ``store=false``, the whole conversation every turn (reasoning replayed
                     as ``encrypted_content``): Codex's HTTP transport.

Each chain starts with its own developer message, so the prefix cache cannot share prompts
across chains. The clock of a turn runs from building the request body to ``response.completed``.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from websockets.sync.client import connect

from benchmarks.common import MODEL, TERMINAL, ChildGateway, filler
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn

MODES = ("ws", "http_chained", "http_stateless")
LABELS = {
    "ws": "WS chained (store=false)",
    "http_chained": "HTTP chained (store=true)",
    "http_stateless": "HTTP full history (store=false)",
}
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
    {
        "type": "function",
        "name": "apply_patch",
        "description": "Apply a unified patch.",
        "parameters": {"type": "object", "properties": {"patch": {"type": "string"}}, "required": ["patch"]},
    },
]
STEP = re.compile(r"\[step (\d+)\]")
DECODE_TPS = 1000.0
PREFILL_TPS = 10_000.0


@dataclass(frozen=True)
class Step:
    turn: Turn  # what the model says and calls
    output: str  # what the tool returns ("" for the final answer)


def trajectory(calls: int = 30, seed: int = 7) -> list[Step]:
    rng = random.Random(seed)
    kinds = ["read"] * (calls * 2 // 5) + ["shell"] * (calls * 2 // 5)
    kinds += ["patch"] * (calls - len(kinds))
    rng.shuffle(kinds)
    kinds[0] = "read"  # an agent looks before it edits
    steps = []
    for k, kind in enumerate(kinds):
        reasoning = f"Step {k}: " + filler(rng.randint(40, 160), seed=k)
        if kind == "read":
            call = ToolCall("read_file", {"path": f"src/pkg/module_{k}.py"})
            output = filler(rng.randint(2000, 8000), seed=k + 3)
        elif kind == "shell":
            call = ToolCall("shell", {"cmd": f"python -m pytest -q tests/test_mod_{k}.py -x"})
            output = filler(rng.randint(30, 300), seed=k + 5)
        else:
            call = ToolCall(
                "apply_patch",
                {"patch": "*** Begin Patch\n" + filler(rng.randint(150, 600), seed=k) + "\n*** End Patch"},
            )
            output = "Success. Updated 1 file."
        steps.append(Step(Turn(reasoning=reasoning, tool_calls=(call,)), f"[step {k}] {output}"))
    steps.append(Step(Turn(reasoning="All checks pass. " + filler(60, seed=1), text=filler(150, seed=2)), ""))
    return steps


def planned(steps: list[Step]):
    """Script: the next step follows the ``[step k]`` tag of the newest tool output (0 after the user)."""

    def script(view: PromptView) -> Turn:
        last = view.last
        m = STEP.match(last.text) if last is not None and last.role == "tool" else None
        return steps[int(m.group(1)) + 1 if m else 0].turn

    return script


class Agent:
    """One mode's conversation; ``step`` sends the new items and returns the response."""

    def __init__(self, live: Any, mode: str) -> None:
        self.live, self.mode = live, mode
        self.prev: str | None = None
        self.history: list[dict[str, Any]] = []
        self.turn_s: list[float] = []
        self.engine_s: list[float] = []
        self.prompt_tokens: list[int] = []
        self.cached_tokens: list[int] = []
        self.prepare_s: list[float] = []  # the gateway's own view: validate .. render, before the engine
        if mode == "ws":
            self.ws = connect(live.ws_url, max_size=None, compression=None)
        else:
            self.http = httpx.Client(base_url=live.url + "/v1", timeout=600)

    def step(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        prep0 = self.live.metric_value("respgate_turn_prepare_seconds_sum")
        t0 = time.perf_counter()
        if self.mode == "http_stateless":
            self.history.extend(items)
            body: dict[str, Any] = {"input": self.history, "store": False, "include": ["reasoning.encrypted_content"]}
        else:
            body = {"input": items, "store": self.mode == "http_chained"}
            if self.prev:
                body["previous_response_id"] = self.prev
        body.update(model=MODEL, tools=TOOLS)
        if self.mode == "ws":
            self.ws.send(orjson.dumps({"type": "response.create", **body}).decode())
            while True:
                ev = orjson.loads(self.ws.recv())
                if ev["type"] in TERMINAL or ev["type"] == "error":
                    break
        else:
            body["stream"] = True
            with self.http.stream(
                "POST", "/responses", content=orjson.dumps(body), headers={"content-type": "application/json"}
            ) as r:
                ev = {"type": f"HTTP {r.status_code}"}
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        ev = orjson.loads(line[6:])
                        if ev["type"] in TERMINAL or ev["type"] == "error":
                            break
        self.turn_s.append(time.perf_counter() - t0)
        self.prepare_s.append(self.live.metric_value("respgate_turn_prepare_seconds_sum") - prep0)
        if ev["type"] != "response.completed":
            raise RuntimeError(f"{self.mode}: {str(ev)[:500]}")
        resp = ev["response"]
        usage = resp["usage"]
        uncached = usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"]
        self.engine_s.append(uncached / PREFILL_TPS + usage["output_tokens"] / DECODE_TPS)
        self.prev = resp["id"]
        self.prompt_tokens.append(resp["usage"]["input_tokens"])
        self.cached_tokens.append(resp["usage"]["input_tokens_details"]["cached_tokens"])
        if self.mode == "http_stateless":
            self.history.extend(resp["output"])
        return resp

    def close(self) -> None:
        (self.ws if self.mode == "ws" else self.http).close()


def run(quick: bool) -> dict[str, Any]:
    calls = 10 if quick else 30
    steps = trajectory(calls)
    live = ChildGateway(
        "--script",
        "rollout",
        "--calls",
        str(calls),
        "--decode-tps",
        str(DECODE_TPS),
        "--prefill-tps",
        str(PREFILL_TPS),
        "--prefix-cache",
    )
    try:
        agents = {m: Agent(live, m) for m in MODES}
        pending = {
            m: [
                {"role": "developer", "content": f"You are a coding agent ({m} run)."},
                {"role": "user", "content": "Fix the failing tests in this repository."},
            ]
            for m in MODES
        }
        for k in range(len(steps)):
            order = MODES[k % 3 :] + MODES[: k % 3]
            for m in order:
                resp = agents[m].step(pending[m])
                calls_out = [o for o in resp["output"] if o["type"] == "function_call"]
                if k < len(steps) - 1:
                    assert len(calls_out) == 1, resp["output"]
                    pending[m] = [
                        {"type": "function_call_output", "call_id": calls_out[0]["call_id"], "output": steps[k].output}
                    ]
                else:
                    assert not calls_out and resp["output"][-1]["type"] == "message"
        for a in agents.values():
            a.close()
    finally:
        live.close()
    rows = {}
    for m, a in agents.items():
        total, eng = sum(a.turn_s), sum(a.engine_s)
        rows[m] = {
            "turns": len(a.turn_s),
            "end_to_end_s": total,
            "engine_s": eng,
            "non_engine_s": total - eng,
            "non_engine_share": (total - eng) / total,
            "gateway_prepare_s": sum(a.prepare_s),
            "gateway_prepare_share": sum(a.prepare_s) / total,
            "final_prompt_tokens": a.prompt_tokens[-1],
            "prompt_tokens_total": sum(a.prompt_tokens),
            "cached_tokens_total": sum(a.cached_tokens),
            "per_turn_s": a.turn_s,
            "per_turn_engine_s": a.engine_s,
            "per_turn_prompt": a.prompt_tokens,
            "per_turn_prepare_s": a.prepare_s,
        }
    ws = rows["ws"]
    return {
        "benchmark": "rollout",
        "tool_calls": calls,
        "engine": "simulated: 1,000 tok/s decode (1 token/delta), 10,000 tok/s uncached prefill, prefix cache",
        "modes": rows,
        "ratios": {
            m: {
                "end_to_end_vs_ws": rows[m]["end_to_end_s"] / ws["end_to_end_s"],
                "non_engine_vs_ws": rows[m]["non_engine_s"] / ws["non_engine_s"],
            }
            for m in MODES
        },
    }


def plot(result: dict[str, Any], path) -> None:
    from benchmarks.common import plt

    pyplot = plt()
    modes = result["modes"]
    fig, (a, b) = pyplot.subplots(1, 2, figsize=(13, 4.8))
    names = [LABELS[m] for m in modes]
    eng = [modes[m]["engine_s"] for m in modes]
    rest = [modes[m]["non_engine_s"] for m in modes]
    a.barh(names, eng, label="engine alone (1k tok/s decode, 10k tok/s prefill)", color="tab:gray")
    a.barh(names, rest, left=eng, label="gateway + transport + client", color="tab:red")
    for i, m in enumerate(modes):
        a.text(eng[i] + rest[i], i, f" {100 * modes[m]['non_engine_share']:.1f}%", va="center", fontsize=8)
    a.set_xlabel("seconds, whole rollout")
    a.set_title(f"{result['tool_calls']}-tool-call agent rollout, end to end")
    a.legend(fontsize=8, loc="lower right")
    colors = {"ws": "tab:green", "http_chained": "tab:blue", "http_stateless": "tab:red"}
    for m, row in modes.items():
        b.plot(
            row["per_turn_prompt"],
            [(t - e) * 1e3 for t, e in zip(row["per_turn_s"], row["per_turn_engine_s"])],
            "o-",
            markersize=3,
            color=colors[m],
            label=LABELS[m],
        )
    b.set_yscale("log")
    b.set_xlabel("prompt tokens at the turn")
    b.set_ylabel("non-engine ms per turn")
    b.set_title("Per turn, as the context grows")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)
