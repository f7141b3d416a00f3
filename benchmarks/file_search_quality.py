"""Retrieval quality of ``file_search`` on the labelled corpus: hybrid vs vector-only vs keyword-only.

``python -m benchmarks.file_search_quality [--pg] [--quick] [--embedder local|simulated] [--out DIR]``
reads the documents of ``tests/corpus`` (``queries.json`` lists them: Markdown, text, HTML, PDF,
Go, Python, JSON) as ingestion does — :func:`gateway.tools.documents.extract` and
:func:`~gateway.tools.documents.chunk_text` (o200k tokens), at OpenAI's ``auto`` chunking (800
tokens, 400 overlap) and at a ``static`` 200/100 — embeds every chunk with the model the default
install runs (:class:`inference.embeddings.LocalEmbedder`: the packaged all-MiniLM-L6-v2,
offline), adds them to the embedded index (:class:`cache.files.sqlite_index.SqliteChunkIndex`)
and, with ``--pg``, to the Postgres one (:class:`cache.files.pg_index.PgChunkIndex` on a server
``tests.postgres`` starts on loopback), then runs the 42 labelled queries through the one search
code (:func:`cache.files.index.search`) in its three modes: ``hybrid`` (what every request gets:
both rankings fused by RRF), ``vector`` (cosine only: ``ranker: none``) and ``keyword`` (BM25 /
``ts_rank`` only; benchmarks only).

**File-level scoring**, defined: a search returns its top ``K = 5`` chunks (``max_num_results: 5``,
as a client asks); the *files* of those chunks are what the query retrieved (a file named by
several of them counts once). For a query whose ``answers`` are the files that answer it:

* ``recall@5`` = |answers ∩ retrieved files| / |answers| (three queries have two answers);
* ``hit@1``: the first chunk's file is an answer;
* ``MRR@5``: 1 / the rank of the first chunk whose file is an answer (0 if none in the top 5).

Each figure is the mean over the queries, overall and by the query's ``style`` (``keyword``:
exact identifiers or rare words; ``paraphrase``: (almost) no content word shared with the
answer; ``mixed``). The figures are deterministic (same corpus, same model, no sampling): they do
not move with machine load. Timings in the JSON (model load, embedding and index add per chunk)
do, and are there for scale only.

``--quick`` (the suite's smoke test, ``make bench BENCH_ARGS=--quick``): the ``auto`` chunking only.
``--embedder simulated`` uses :class:`inference.simulated_embeddings.SimulatedEmbedder` (hashed
words, no model: the smoke test's speed; its vector side knows no meaning, so its figures say
nothing about the real model). Writes ``file_search_quality.json`` and ``file_search_quality.md``
(figures, method, the queries each mode misses), and a PNG with matplotlib, to ``--out`` (default
``results/``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
ROOT = HERE.parent
CORPUS = ROOT / "tests" / "corpus"
K = 5
#: name -> (max_chunk_size_tokens, chunk_overlap_tokens)
CHUNKINGS: dict[str, tuple[int, int]] = {"auto": (800, 400), "static-200": (200, 100)}
MODES = ("hybrid", "vector", "keyword")
STYLES = ("all", "keyword", "mixed", "paraphrase")
TENANT = "bench"
STORE = "vs_quality"


@dataclass(frozen=True)
class Query:
    id: str
    style: str
    text: str
    answers: frozenset[str]


def labelled() -> tuple[list[str], list[Query]]:
    data = json.loads((CORPUS / "queries.json").read_text())
    queries = [Query(q["id"], q["style"], q["query"], frozenset(q["answers"])) for q in data["queries"]]
    return list(data["documents"]), queries


def chunked(documents: Sequence[str], size: int, overlap: int) -> dict[str, list[Any]]:
    """Each document's chunks as ingestion makes them (``gateway.files.documents``' two steps)."""
    from gateway.tools.documents import chunk_text, extract

    return {name: list(chunk_text(extract(CORPUS / name, name).text, size, overlap)) for name in documents}


def score(files: Sequence[str], answers: frozenset[str]) -> dict[str, float]:
    """One query's figures from the files of its top chunks, best first (see the module docstring)."""
    top = list(files[:K])
    first = next((rank for rank, f in enumerate(top, 1) if f in answers), None)
    return {
        "recall_at_5": len(answers & set(top)) / len(answers),
        "hit_at_1": 1.0 if top and top[0] in answers else 0.0,
        "mrr_at_5": 1.0 / first if first else 0.0,
    }


def summarise(per_query: dict[str, dict[str, Any]], queries: Sequence[Query]) -> dict[str, Any]:
    """Mean figures by style, and the ids of the queries whose top 5 hold no answer at all
    (``missed``) or not every answer (``partial``)."""
    out: dict[str, Any] = {}
    for style in STYLES:
        chosen = [q for q in queries if style in ("all", q.style)]
        out[style] = {
            metric: round(float(np.mean([per_query[q.id][metric] for q in chosen])), 3)
            for metric in ("recall_at_5", "hit_at_1", "mrr_at_5")
        }
        out[style]["queries"] = len(chosen)
    out["missed"] = [q.id for q in queries if per_query[q.id]["recall_at_5"] == 0]
    out["partial"] = [q.id for q in queries if 0 < per_query[q.id]["recall_at_5"] < 1]
    return out


def fusion(run: dict[str, Any], queries: Sequence[Query]) -> dict[str, list[str]]:
    """Where fusing changed the outcome: queries hybrid found (fully) that one side alone missed
    (``recovered``), and queries a side alone found that hybrid did not (``lost``)."""
    recall = {mode: {q.id: run[mode]["per_query"][q.id]["recall_at_5"] for q in queries} for mode in MODES}
    return {
        "recovered": [
            q.id for q in queries if recall["hybrid"][q.id] > min(recall["vector"][q.id], recall["keyword"][q.id])
        ],
        "lost": [
            q.id for q in queries if recall["hybrid"][q.id] < max(recall["vector"][q.id], recall["keyword"][q.id])
        ],
    }


def word_pieces(embedder: Any) -> Any:
    """The embedding model's tokenizer (word pieces it reads, 256 at most), or None for the simulated one."""
    if getattr(embedder, "name", "") != "all-MiniLM-L6-v2":
        return None
    from transformers import AutoTokenizer

    from inference.embeddings import local_model_path

    tokenizer = AutoTokenizer.from_pretrained(local_model_path(), local_files_only=True)
    tokenizer.model_max_length = 1 << 30  # counting only: no "longer than the maximum" warning
    return tokenizer


def window_evidence(
    tokenizer: Any, chunks: dict[str, list[Any]], missed: Sequence[str], queries: Sequence[Query]
) -> dict[str, Any]:
    """How many chunks run past the model's window, and, for each query the vector side missed,
    where in its answer's first chunk the query's words first appear (in the model's word pieces)."""
    window = 256 - 2  # [CLS] and [SEP]
    sizes = [len(tokenizer(c.text, add_special_tokens=False)["input_ids"]) for parts in chunks.values() for c in parts]
    out: dict[str, Any] = {"model_window": 256, "chunks_past_window": sum(n > window for n in sizes), "misses": {}}
    by_id = {q.id: q for q in queries}
    for qid in missed:
        q = by_id[qid]
        words = [w.lower() for w in q.text.replace("/", " ").split() if len(w) >= 3]
        for answer in sorted(q.answers):
            text = chunks[answer][0].text
            found = [i for i in (text.lower().find(w) for w in words) if i >= 0]
            if found:
                before = len(tokenizer(text[: min(found)], add_special_tokens=False)["input_ids"])
                total = len(tokenizer(text, add_special_tokens=False)["input_ids"])
                out["misses"][qid] = {"answer": answer, "first_query_word_at": before, "chunk_word_pieces": total}
                break
    return out


async def evaluate(
    index: Any, chunks: dict[str, list[Any]], vectors: dict[str, np.ndarray], queries: Sequence[Query], qv: np.ndarray
) -> dict[str, Any]:
    """Fill ``index`` with the chunks (one file per document, one store), run every query in every
    mode; per mode the summary and, per query, the top files and figures."""
    from cache.files.index import NewChunk, SearchMode, SearchQuery, search

    start = time.perf_counter()
    for name, parts in chunks.items():
        new = [NewChunk(c.index, c.text, c.start, c.end, c.tokens, vectors[name][i]) for i, c in enumerate(parts)]
        await index.add(TENANT, STORE, name, new, {})
    add_s = time.perf_counter() - start
    result: dict[str, Any] = {"index_add_ms_per_chunk": round(add_s * 1000 / sum(map(len, chunks.values())), 3)}
    for mode in MODES:
        per_query: dict[str, dict[str, Any]] = {}
        for q, v in zip(queries, qv, strict=True):
            hits = await search(index, TENANT, SearchQuery((STORE,), q.text, v, max_results=K, mode=SearchMode(mode)))
            files = [h.file_id for h in hits]
            per_query[q.id] = {"top_files": list(dict.fromkeys(files)), **score(files, q.answers)}
        result[mode] = {"summary": summarise(per_query, queries), "per_query": per_query}
    return result


def make_embedder(kind: str) -> Any:
    if kind == "simulated":
        from inference.simulated_embeddings import SimulatedEmbedder

        return SimulatedEmbedder()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # LocalEmbedder loads local files only anyway
    from inference.embeddings import LocalEmbedder

    return LocalEmbedder()


async def measure(quick: bool, pg: bool, embedder_kind: str) -> dict[str, Any]:
    from cache.files.sqlite_index import SqliteChunkIndex

    documents, queries = labelled()
    embedder = make_embedder(embedder_kind)
    start = time.perf_counter()
    if hasattr(embedder, "load"):
        await embedder.load()
    result: dict[str, Any] = {
        "embedder": embedder.name,
        "embedder_load_s": round(time.perf_counter() - start, 2),
        "k": K,
        "documents": len(documents),
        "queries": len(queries),
        "query_styles": {s: sum(q.style == s for q in queries) for s in STYLES[1:]},
        "labels": {q.id: {"style": q.style, "query": q.text, "answers": sorted(q.answers)} for q in queries},
        "runs": [],
    }
    start = time.perf_counter()
    qv = await embedder.embed([q.text for q in queries], "query")
    result["query_embed_ms"] = round((time.perf_counter() - start) * 1000 / len(queries), 2)
    tokenizer = word_pieces(embedder)
    server = None
    if pg:
        from tests.postgres import PostgresServer

        server = PostgresServer()
        server.start()
    try:
        for chunking, (size, overlap) in CHUNKINGS.items():
            if quick and chunking != "auto":
                continue
            chunks = chunked(documents, size, overlap)
            n = sum(map(len, chunks.values()))
            start = time.perf_counter()
            vectors = {
                name: await embedder.embed([c.text for c in parts], "document") for name, parts in chunks.items()
            }
            embed_ms = round((time.perf_counter() - start) * 1000 / n, 2)
            backends: list[str] = ["sqlite"] + (["postgres"] if server else [])
            for backend in backends:
                if backend == "sqlite":
                    with tempfile.TemporaryDirectory(prefix="file-search-quality-") as tmp:
                        index: Any = SqliteChunkIndex(Path(tmp) / "chunks.db", embedder.dims)
                        run = await evaluate(index, chunks, vectors, queries, qv)
                        await index.aclose()
                else:
                    from cache.files.pg_index import PgChunkIndex

                    assert server is not None
                    index = PgChunkIndex(server.create_database(f"quality_{uuid.uuid4().hex[:12]}"), embedder.dims)
                    run = await evaluate(index, chunks, vectors, queries, qv)
                    await index.aclose()
                result["runs"].append(
                    {
                        "backend": backend,
                        "chunking": chunking,
                        "max_chunk_size_tokens": size,
                        "chunk_overlap_tokens": overlap,
                        "chunks": n,
                        "embed_ms_per_chunk": embed_ms,
                        **run,
                    }
                )
                result["runs"][-1]["fusion"] = fusion(run, queries)
                if tokenizer is not None:
                    missed = run["vector"]["summary"]["missed"]
                    result["runs"][-1]["vector_window"] = window_evidence(tokenizer, chunks, missed, queries)
    finally:
        if server is not None:
            server.stop()
        if hasattr(embedder, "close"):
            embedder.close()
    return result


def run(quick: bool, pg: bool | None = None, embedder: str = "local") -> dict[str, Any]:
    """The runner's entry (``python -m benchmarks``): Postgres too when a server is installed."""
    if pg is None:
        try:
            from tests.postgres import postgres_bin

            postgres_bin()
            pg = True
        except RuntimeError:
            pg = False
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    result = asyncio.run(measure(quick, pg, embedder))
    from benchmarks.common import machine

    result["machine"] = machine(load0, time.perf_counter() - t0)
    result["quick"] = quick
    return result


def plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(runs)), 4))
    width = 0.8 / len(MODES)
    for m, mode in enumerate(MODES):
        xs = [i + (m - 1) * width for i in range(len(runs))]
        ax.bar(xs, [r[mode]["summary"]["all"]["recall_at_5"] for r in runs], width, label=mode)
    ax.set_xticks(range(len(runs)), [f"{r['backend']}\n{r['chunking']}" for r in runs])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(f"file recall@{K}")
    ax.set_title(f"{result['queries']} labelled queries, {result['embedder']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    labels = result["labels"]
    m = result.get("machine", {})
    lines = [
        "# file_search retrieval quality: hybrid vs vector-only vs keyword-only (issue 33)",
        "",
        f"`python -m benchmarks.file_search_quality{' --pg' if any(r['backend'] == 'postgres' for r in result['runs']) else ''}"
        f"{' --quick' if result.get('quick') else ''}` (script: `benchmarks/file_search_quality.py`; raw figures: "
        "`file_search_quality.json`). Embedder: "
        f"**{result['embedder']}**"
        + (
            " (the packaged model the default install runs, offline)"
            if result["embedder"] == "all-MiniLM-L6-v2"
            else ""
        )
        + f". Corpus: `tests/corpus`, {result['documents']} self-written documents (Markdown, text, HTML, 3 PDFs, "
        f"Go, Python, JSON), {result['queries']} labelled queries (`tests/corpus/queries.json`: "
        + ", ".join(f"{n} {s}" for s, n in result["query_styles"].items())
        + ").",
        "",
        "## Method",
        "",
        "Each document is extracted and chunked as ingestion does (o200k tokens) at `auto` (800 tokens, 400 overlap) "
        "and at `static` 200/100, every chunk embedded, one file per document in one vector store. Each query runs "
        "through `cache.files.index.search` — the code every request runs — in three modes: **hybrid** (vector and "
        "keyword candidates fused by RRF, k=60: what `vector_stores.search` and `file_search` do), **vector** "
        "(cosine only; `ranker: none`) and **keyword** (BM25 in SQLite FTS5, `ts_rank` in Postgres; benchmarks only). "
        f"A search returns {result['k']} chunks, as `max_num_results: {result['k']}` would.",
        "",
        f"File level: the files of the top {result['k']} chunks are what a query retrieved. **recall@5** = the share "
        "of the query's answer files among them (3 queries have 2 answers); **hit@1**: the first chunk's file "
        "answers; **MRR@5**: 1 / rank of the first answering chunk (0 if none). Means over the queries. "
        "Deterministic: no figure here depends on machine load.",
        "",
        "## Figures",
        "",
        "| backend | chunking | chunks | mode | recall@5 | hit@1 | MRR@5 | recall@5 keyword | mixed | paraphrase |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        for mode in MODES:
            s = r[mode]["summary"]
            bold = "**" if mode == "hybrid" else ""
            lines.append(
                f"| {r['backend']} | {r['chunking']} ({r['max_chunk_size_tokens']}/{r['chunk_overlap_tokens']}) "
                f"| {r['chunks']} | {mode} | {bold}{s['all']['recall_at_5']:.3f}{bold} | {s['all']['hit_at_1']:.3f} "
                f"| {s['all']['mrr_at_5']:.3f} | {s['keyword']['recall_at_5']:.3f} | {s['mixed']['recall_at_5']:.3f} "
                f"| {s['paraphrase']['recall_at_5']:.3f} |"
            )
    lines += [
        "",
        "## What the numbers mean",
        "",
        f"* The set is small: {result['documents']} files, so at `auto` (one chunk a document) a random top 5 holds "
        f"a given answer {5 / result['documents']:.2f} of the time. recall@5 near 1 in every mode says the right file "
        "is nearly always among the five; hit@1 and MRR@5 (is it *first*?) separate the modes more. One query is "
        f"{1 / result['queries']:.3f} of a figure.",
        "* Keyword-only (each word OR-ed) finds exact identifiers — its recall@5 on the keyword-style queries: "
        + ", ".join(
            f"{r['backend']} {r['chunking']} {r['keyword']['summary']['keyword']['recall_at_5']:.3f}"
            for r in result["runs"]
        )
        + " — and misses the paraphrases that share no telling word with their answer; vector-only finds "
        "paraphrases and can miss a rare name or code. Hybrid fuses both lists by rank and RRF rewards agreement, "
        "so it misses where the answer is high in one list only and wrong files sit fairly high in both.",
    ]
    for r in result["runs"]:
        f = r["fusion"]
        lines.append(
            f"* {r['backend']}, {r['chunking']}: fusion recovered {', '.join(f['recovered']) or 'none'} (a side alone "
            f"missed, hybrid found); lost {', '.join(f['lost']) or 'none'} (a side alone found, hybrid did not)."
        )
    for r in result["runs"]:
        w = r.get("vector_window")
        if not w or r["backend"] != "sqlite":
            continue
        where = "; ".join(
            f"{q}: its first word in {m['answer']} is at word piece {m['first_query_word_at']} of "
            f"{m['chunk_word_pieces']}"
            for q, m in w["misses"].items()
        )
        lines.append(
            f"* The model reads the first {w['model_window']} word pieces of a chunk and ignores the rest. At "
            f"{r['chunking']} ({r['max_chunk_size_tokens']} o200k tokens a chunk), {w['chunks_past_window']} of "
            f"{r['chunks']} chunks run past that window." + (f" Vector-only misses there: {where}." if where else "")
        )
    lines += ["", "## Queries each mode misses", ""]
    lines.append(
        "`missed`: no answer file in the top 5; `partial`: one of two answers. The file first in the ranking is "
        "shown for a miss."
    )
    lines.append("")
    for r in result["runs"]:
        lines.append(f"**{r['backend']}, {r['chunking']}**")
        lines.append("")
        for mode in MODES:
            s = r[mode]["summary"]
            pq = r[mode]["per_query"]
            missed = [
                f"{q} ({labels[q]['style']}: “{labels[q]['query']}” → {', '.join(labels[q]['answers'])}; "
                f"first: {(pq[q]['top_files'] or ['nothing'])[0]})"
                for q in s["missed"]
            ]
            partial = [
                f"{q} (found {', '.join(sorted(set(pq[q]['top_files']) & set(labels[q]['answers'])))})"
                for q in s["partial"]
            ]
            text = "; ".join(missed) if missed else "none"
            if partial:
                text += "; partial: " + "; ".join(partial)
            lines.append(f"* {mode}: {text}")
        lines.append("")
    lines += [
        "## Timings (for scale only)",
        "",
        f"Model load {result['embedder_load_s']} s; query embedding {result['query_embed_ms']} ms each; per run, "
        "embedding and index add per chunk: "
        + "; ".join(
            f"{r['backend']} {r['chunking']} {r['embed_ms_per_chunk']} + {r['index_add_ms_per_chunk']} ms"
            for r in result["runs"]
        )
        + f". Machine: {m.get('cpus', '?')} CPUs, load average {m.get('loadavg_1m_start', 0):.1f} → "
        f"{m.get('loadavg_1m_end', 0):.1f} (shared): these move with load; ingestion throughput and search "
        "latency at 10k and 100k chunks are in `file_index.md` (embedded) and `file_index_pg.md` (Postgres).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", action="store_true", help="also the Postgres index (tests.postgres starts one)")
    parser.add_argument("--quick", action="store_true", help="the auto chunking only")
    parser.add_argument("--embedder", choices=("local", "simulated"), default="local")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    result = run(args.quick, args.pg, args.embedder)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "file_search_quality.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "file_search_quality.md").write_text(markdown(result))
    try:
        plot(result, args.out / "file_search_quality.png")
    except ModuleNotFoundError as exc:  # matplotlib is the ``bench`` extra: the figures stand without it
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        print("matplotlib not installed: no file_search_quality.png", file=sys.stderr)
    for r in result["runs"]:
        figures = {mode: r[mode]["summary"]["all"]["recall_at_5"] for mode in MODES}
        print(f"{r['backend']} {r['chunking']}: recall@{K} {figures}", flush=True)


if __name__ == "__main__":
    main()
