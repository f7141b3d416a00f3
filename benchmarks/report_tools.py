"""REPORT.md's section on what the hosted tools cost and how well they retrieve: ``file_search``'s
recall by ranking mode (``file_search_quality``) and the local sandbox's cold start and per-call
overhead for ``code_interpreter`` (``sandbox``). Each benchmark writes its own page with the method
and the reading (``<name>.md``); this section carries the headline figures from the same JSON, so a
rerun of either rewrites them here too."""

from __future__ import annotations

from typing import Any

__all__ = ["tools_section"]

_MODES = ("hybrid", "vector", "keyword")
_SANDBOX_ROWS = (
    ("cold_start_to_first_result", "cold start: `create()` → first result of `1+1`"),
    ("call_1plus1", 'per call: `run("1+1")`, warm container'),
    ("call_1plus1_100_files", "per call, 100 files in the container folder"),
    ("close", "`close()`: kill the tree, remove the folder"),
)


def _quality(q: dict[str, Any]) -> list[str]:
    k = q["k"]
    lines = [
        "### file_search: retrieval quality",
        "",
        f"{q['embedder']}, {q['documents']} documents, {q['queries']} labelled queries; recall@{k} of the "
        "answer files (method and reading: [file_search_quality.md](file_search_quality.md)). "
        "`file_search` and `vector_stores.search` rank by **hybrid**.",
        "",
        "| backend | chunking | chunks | " + " | ".join(f"recall@{k} {m}" for m in _MODES) + " | hit@1 hybrid |",
        "|---|---|---:|" + "---:|" * (len(_MODES) + 1),
    ]
    for run in q["runs"]:
        chunking = f"{run['chunking']} ({run['max_chunk_size_tokens']}/{run['chunk_overlap_tokens']})"
        recalls = " | ".join(f"{run[m]['summary']['all']['recall_at_5']:.3f}" for m in _MODES if m in run)
        lines.append(
            f"| {run['backend']} | {chunking} | {run['chunks']} | {recalls} | "
            f"{run['hybrid']['summary']['all']['hit_at_1']:.3f} |"
        )
    return lines + [""]


def _sandbox(s: dict[str, Any]) -> list[str]:
    lines = [
        "### code_interpreter: the local sandbox",
        "",
        "One container is a bubblewrap process tree with a persistent interpreter "
        "(method and reading: [sandbox.md](sandbox.md)).",
        "",
        "| what | n | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for key, label in _SANDBOX_ROWS:
        x = s.get(key)
        if x:
            lines.append(f"| {label} | {x['n']} | {x['p50_ms']:.2f} | {x['p99_ms']:.2f} |")
    if "idle_container_rss_mib" in s:
        lines += ["", f"An idle container holds {s['idle_container_rss_mib']:.0f} MiB resident."]
    return lines + [""]


def tools_section(r: dict[str, dict[str, Any] | None]) -> list[str]:
    """The section, from whichever of the two benchmarks' JSON the run folder holds (none: nothing)."""
    quality, sandbox = r.get("file_search_quality"), r.get("sandbox")
    if not quality and not sandbox:
        return []
    lines = ["## Hosted tools", ""]
    if quality:
        lines += _quality(quality)
    if sandbox:
        lines += _sandbox(sandbox)
    return lines
