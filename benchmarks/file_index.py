"""The embedded chunk index behind ``file_search``: which store, measured.

``python -m benchmarks.file_index [--sizes 10000 100000] [--queries 200] [--out DIR]`` fills each
candidate with the same chunks (384-dim float32 vectors around 200 cluster centres, the shape of
all-MiniLM-L6-v2's; text drawn from a Zipf vocabulary with code identifiers mixed in, ~120 words a
chunk; 50 chunks a file, one store) and measures, each candidate and size in its own process:

* ingestion, chunks/s (file by file, one transaction a file, FTS indexed as it goes);
* search latency p50/p99 over the same random queries: vector top-40, keyword top-40, the
  vector side under a selective (1 %) and a broad (50 %) attribute filter, and the fused
  ``search()`` (what a request does); the first vector query apart (it builds the cached matrix);
* RSS after ingestion and after the searches (``/proc/self/status``), the file's size.

Candidates: ``sqlite``: :class:`cache.files.sqlite_index.SqliteChunkIndex` (stdlib ``sqlite3`` +
FTS5, numpy over a cached matrix); ``sqlite-nocache``: the same with no matrix cache (every
vector query reads the BLOBs); ``apsw-vec``: ``apsw`` + ``sqlite-vec``'s ``vec0`` table (cosine,
brute force: what loading the extension would give), vectors only, unfiltered — it takes no
attribute filter but its own metadata columns, so a JSON filter would have to run after it.
Writes ``file_index.json``; the committed figures are in ``results/file_index.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
DIMS = 384
CHUNKS_PER_FILE = 50
WORDS_PER_CHUNK = 120
CANDIDATES = ("sqlite", "sqlite-nocache", "apsw-vec")


def corpus(n: int, seed: int = 0) -> tuple[list[str], np.ndarray, list[dict[str, Any]]]:
    """``n`` chunk texts, their unit vectors (clustered) and per-file attributes."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(20_000)]
    idents = [f"get_{a}_by_{b}" for a in ("user", "order", "item", "token") for b in ("id", "name", "key")]
    idents += [f"ERR-{4000 + i}" for i in range(50)]
    ranks = np.minimum(rng.zipf(1.2, size=n * WORDS_PER_CHUNK) - 1, len(vocab) - 1)
    words = [vocab[r] for r in ranks]
    texts = []
    for i in range(n):
        part = words[i * WORDS_PER_CHUNK : (i + 1) * WORDS_PER_CHUNK]
        part[int(rng.integers(0, WORDS_PER_CHUNK))] = idents[int(rng.integers(0, len(idents)))]
        texts.append(" ".join(part))
    centres = rng.standard_normal((200, DIMS)).astype(np.float32)
    vectors = centres[rng.integers(0, 200, size=n)] + 0.6 * rng.standard_normal((n, DIMS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    files = (n + CHUNKS_PER_FILE - 1) // CHUNKS_PER_FILE
    attrs = [{"team": f"team{f % 2}", "shard": f % 100, "draft": f % 3 == 0} for f in range(files)]
    return texts, vectors, attrs


def queries(count: int, seed: int = 1) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        kind = rng.integers(0, 3)
        if kind == 0:
            texts.append(f"how to call get_user_by_id w{int(rng.integers(0, 300))}")
        elif kind == 1:
            texts.append(f"ERR-{4000 + int(rng.integers(0, 50))} after w{int(rng.integers(0, 2000))}")
        else:
            texts.append(" ".join(f"w{int(rng.zipf(1.3))}" for _ in range(6)))
    vectors = rng.standard_normal((count, DIMS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return texts, vectors


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


async def timed(calls: list[Callable[[], Awaitable[Any]]]) -> dict[str, float]:
    samples = []
    for call in calls:
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return pct(samples)


async def run_sqlite(n: int, nq: int, workdir: Path, cache: bool) -> dict[str, Any]:
    from cache.files.index import NewChunk, SearchQuery, parse_filter, search
    from cache.files.sqlite_index import SqliteChunkIndex

    texts, vectors, attrs = corpus(n)
    qtexts, qvectors = queries(nq)
    base = rss_mb()
    path = workdir / "chunks.db"
    index = SqliteChunkIndex(path, DIMS, cache_bytes=(1 << 30) if cache else 0)
    start = time.perf_counter()
    for f, a in enumerate(attrs):
        lo, hi = f * CHUNKS_PER_FILE, min(n, (f + 1) * CHUNKS_PER_FILE)
        chunks = [NewChunk(i - lo, texts[i], 0, len(texts[i]), WORDS_PER_CHUNK, vectors[i]) for i in range(lo, hi)]
        await index.add("tenant", "vs", f"file_{f}", chunks, a)
    ingest_s = time.perf_counter() - start
    out: dict[str, Any] = {
        "ingest_chunks_per_s": round(n / ingest_s, 1),
        "rss_after_ingest_mb": round(rss_mb() - base, 1),
        "file_mb": round(sum(p.stat().st_size for p in workdir.iterdir()) / 2**20, 1),
    }
    start = time.perf_counter()
    await index.nearest("tenant", ["vs"], qvectors[0], 40, None)
    out["first_vector_query_ms"] = round((time.perf_counter() - start) * 1000, 1)
    selective = parse_filter({"type": "eq", "key": "shard", "value": 7})  # 1 % of files
    broad = parse_filter({"type": "eq", "key": "team", "value": "team1"})  # 50 %
    out["vector"] = await timed([lambda v=v: index.nearest("tenant", ["vs"], v, 40, None) for v in qvectors])
    out["keyword"] = await timed([lambda t=t: index.keyword("tenant", ["vs"], t, 40, None) for t in qtexts])
    out["vector_filter_1pct"] = await timed(
        [lambda v=v: index.nearest("tenant", ["vs"], v, 40, selective) for v in qvectors]
    )
    out["vector_filter_50pct"] = await timed(
        [lambda v=v: index.nearest("tenant", ["vs"], v, 40, broad) for v in qvectors]
    )
    out["keyword_filter_1pct"] = await timed(
        [lambda t=t: index.keyword("tenant", ["vs"], t, 40, selective) for t in qtexts]
    )
    out["hybrid_search_10"] = await timed(
        [
            lambda t=t, v=v: search(index, "tenant", SearchQuery(("vs",), t, v, max_results=10))
            for t, v in zip(qtexts, qvectors, strict=True)
        ]
    )
    out["rss_after_search_mb"] = round(rss_mb() - base, 1)
    await index.aclose()
    return out


def run_apsw_vec(n: int, nq: int, workdir: Path) -> dict[str, Any]:
    import apsw
    import sqlite_vec

    texts, vectors, attrs = corpus(n)
    del texts, attrs
    _, qvectors = queries(nq)
    base = rss_mb()
    db = apsw.Connection(str(workdir / "vec.db"))
    db.enable_load_extension(True)
    db.load_extension(sqlite_vec.loadable_path())
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"CREATE VIRTUAL TABLE v USING vec0(embedding float[{DIMS}] distance_metric=cosine)")
    start = time.perf_counter()
    for lo in range(0, n, CHUNKS_PER_FILE):
        with db:
            db.executemany(
                "INSERT INTO v (rowid, embedding) VALUES (?, ?)",
                [(i + 1, vectors[i].tobytes()) for i in range(lo, min(n, lo + CHUNKS_PER_FILE))],
            )
    ingest_s = time.perf_counter() - start
    out: dict[str, Any] = {
        "ingest_chunks_per_s_vectors_only": round(n / ingest_s, 1),
        "rss_after_ingest_mb": round(rss_mb() - base, 1),
    }
    samples = []
    for v in qvectors:
        start = time.perf_counter()
        list(db.execute("SELECT rowid, distance FROM v WHERE embedding MATCH ? AND k = 40", (v.tobytes(),)))
        samples.append(time.perf_counter() - start)
    out["vector"] = pct(samples)
    out["rss_after_search_mb"] = round(rss_mb() - base, 1)
    db.close()
    return out


def worker(candidate: str, n: int, nq: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="file-index-bench-") as tmp:
        if candidate == "apsw-vec":
            return run_apsw_vec(n, nq, Path(tmp))
        return asyncio.run(run_sqlite(n, nq, Path(tmp), cache=candidate == "sqlite"))


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--worker", nargs=2, metavar=("CANDIDATE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.queries)))
        return
    results: dict[str, Any] = {"loadavg_start": loadavg(), "cpus": os.cpu_count(), "dims": DIMS, "runs": []}
    for n in args.sizes:
        for candidate in args.candidates:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.file_index", "--worker", candidate, str(n)]
                + ["--queries", str(args.queries)],
                capture_output=True,
                text=True,
                check=True,
                cwd=HERE.parent,
            )
            run = {"candidate": candidate, "chunks": n, **json.loads(done.stdout.strip().splitlines()[-1])}
            print(json.dumps(run), flush=True)
            results["runs"].append(run)
    results["loadavg_end"] = loadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "file_index.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
