"""The ``file_search`` benchmarks (issue 33) as ``make bench`` runs them, smoke-sized.

* ``benchmarks.file_search_quality --quick`` end to end on both backends (SQLite here, Postgres
  from ``tests.postgres``), with the simulated embedder (hashed words, no model load; the real
  model's figures are the committed ones, and ``tests/gateway/files/test_real_embedder.py`` runs
  the real model through the gateway): every labelled query scored in every mode, the modes really
  rank differently, the summary agrees with the per-query figures, the write-up names each miss.
* the scoring rule itself (file level, top 5) on hand-made rankings.
* the runner (``python -m benchmarks``) knows all four ``file_search`` benchmarks and hands each
  its quick arguments and the results folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import __main__ as runner
from benchmarks import file_search_quality as fsq

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("fsq")
    fsq.main(["--quick", "--pg", "--embedder", "simulated", "--out", str(out)])
    return json.loads((out / "file_search_quality.json").read_text()), (out / "file_search_quality.md").read_text()


def test_quick_run_scores_every_query_in_every_mode_on_both_backends(quick: tuple[dict[str, Any], str]) -> None:
    result, _ = quick
    _, queries = fsq.labelled()
    assert result["queries"] == len(queries) == 42 and result["quick"] is True
    assert [(r["backend"], r["chunking"]) for r in result["runs"]] == [("sqlite", "auto"), ("postgres", "auto")]
    for run in result["runs"]:
        assert run["chunks"] == 18  # every corpus document is one auto chunk (each under 800 tokens)
        for mode in fsq.MODES:
            per_query = run[mode]["per_query"]
            assert set(per_query) == {q.id for q in queries}
            summary = run[mode]["summary"]
            mean = sum(p["recall_at_5"] for p in per_query.values()) / len(per_query)
            assert summary["all"]["recall_at_5"] == round(mean, 3)
            assert summary["missed"] == [q for q, p in per_query.items() if p["recall_at_5"] == 0]
            for p in per_query.values():
                assert 1 <= len(p["top_files"]) <= fsq.K
        # the three modes are three rankings, not one: each pair differs on some query
        tops = {mode: [run[mode]["per_query"][q.id]["top_files"] for q in queries] for mode in fsq.MODES}
        assert (
            tops["hybrid"] != tops["vector"] and tops["hybrid"] != tops["keyword"] and tops["vector"] != tops["keyword"]
        )
        # exact identifiers are what keyword search is for: BM25 alone finds every keyword-style query
        assert run["keyword"]["summary"]["keyword"]["recall_at_5"] == 1.0


def test_the_write_up_names_the_figures_and_each_miss(quick: tuple[dict[str, Any], str]) -> None:
    result, md = quick
    for run in result["runs"]:
        for mode in fsq.MODES:
            assert f"| {run['backend']} | auto (800/400) | 18 | {mode} |" in md
            for q in run[mode]["summary"]["missed"]:
                assert f"{q} ({result['labels'][q]['style']}:" in md


def test_file_level_scoring() -> None:
    one, two = frozenset({"a.md"}), frozenset({"a.md", "b.md"})
    assert fsq.score(["a.md", "c.md"], one) == {"recall_at_5": 1.0, "hit_at_1": 1.0, "mrr_at_5": 1.0}
    # several chunks of one file count once; the rank is the chunk's
    assert fsq.score(["c.md", "c.md", "a.md"], one) == {"recall_at_5": 1.0, "hit_at_1": 0.0, "mrr_at_5": 1 / 3}
    # only the top 5 chunks count
    assert fsq.score(["c.md"] * 5 + ["a.md"], one) == {"recall_at_5": 0.0, "hit_at_1": 0.0, "mrr_at_5": 0.0}
    assert fsq.score(["b.md", "c.md"], two) == {"recall_at_5": 0.5, "hit_at_1": 1.0, "mrr_at_5": 1.0}
    assert fsq.score([], one)["recall_at_5"] == 0.0


def test_the_runner_runs_the_file_search_benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("file_index", "file_index_pg", "embeddings", "file_search_quality")
    assert set(names) <= set(runner.NAMES) and set(runner.NAMES) == set(runner.STEPS)
    ran: list[list[str]] = []

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        assert kw.get("check") is True
        return subprocess.CompletedProcess(argv, 0)

    asked: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(fsq, "main", lambda argv: asked.append(argv))
    for name in names:
        runner.STEPS[name](tmp_path, True)
    assert [argv[:3] for argv in ran] == [[sys.executable, "-m", f"benchmarks.{n}"] for n in names[:3]]
    assert all(argv[-2:] == ["--out", str(tmp_path)] for argv in ran)
    assert "--quick" in ran[2] and ran[0][3:5] == ["--sizes", "2000"]
    assert asked == [["--quick", "--pg", "--out", str(tmp_path)]]


@pytest.mark.parametrize("module", ["file_index", "file_index_pg", "embeddings", "file_search_quality"])
def test_each_file_search_benchmark_takes_the_runners_arguments(module: str) -> None:
    """The arguments the runner passes are ones each script's own parser accepts (``--help`` lists them)."""
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(fsq.ROOT),
        timeout=120,
    )
    quick_args = {
        "file_index": ["--sizes", "--queries"],
        "file_index_pg": ["--sizes", "--queries"],
        "embeddings": ["--quick", "--only"],
        "file_search_quality": ["--quick", "--pg"],
    }[module]
    for flag in [*quick_args, "--out"]:
        assert flag in done.stdout, (module, flag)
