"""REPORT.md's hosted-tools section is read from the benchmarks' JSON: each figure in it is the
JSON's, and a run folder without those benchmarks gets no section (nothing typed in by hand)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.report import write_report

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_the_section_carries_the_json_figures(tmp_path: Path) -> None:
    for name in ("file_search_quality", "sandbox"):
        shutil.copy(RESULTS / f"{name}.json", tmp_path / f"{name}.json")
    quality = json.loads((tmp_path / "file_search_quality.json").read_text())
    sandbox = json.loads((tmp_path / "sandbox.json").read_text())
    # change the figures so the test proves they are read, not remembered
    quality["runs"][0]["hybrid"]["summary"]["all"]["recall_at_5"] = 0.123
    sandbox["cold_start_to_first_result"]["p50_ms"] = 987.654
    (tmp_path / "file_search_quality.json").write_text(json.dumps(quality))
    (tmp_path / "sandbox.json").write_text(json.dumps(sandbox))

    report = write_report(tmp_path).read_text()

    section = report[report.index("## Hosted tools") :]
    first = quality["runs"][0]
    row = next(line for line in section.splitlines() if line.startswith(f"| {first['backend']} | {first['chunking']}"))
    assert "| 0.123 |" in row
    assert "| 987.65 |" in section
    assert len(
        [line for line in section.splitlines() if line.startswith("| sqlite") or line.startswith("| postgres")]
    ) == len(quality["runs"])


def test_no_tool_benchmarks_no_section(tmp_path: Path) -> None:
    assert "## Hosted tools" not in write_report(tmp_path).read_text()
