"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing anchor or
a page left out of ``nav`` fails the test suite, not a reader (issue 29 item 1).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` (not ``--quiet``: that drops the warnings strict mode counts)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_site_builds_strict(tmp_path):
    r = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").exists()


def test_every_page_is_in_nav():
    """``--strict`` warns of a page outside ``nav`` only as INFO in some mkdocs versions: checked here."""
    config = (REPO / "mkdocs.yml").read_text()
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert pages == set(re.findall(r":\s*([\w/.-]+\.md)\s*$", config, re.M)), pages


def test_a_broken_link_fails_the_build(tmp_path):
    """The check can fail: a one-page site under this configuration, with a link to no page."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# home\n\n[gone](no-such-page.md)\n")
    config = (REPO / "mkdocs.yml").read_text()
    (tmp_path / "mkdocs.yml").write_text(config[: config.index("\nnav:")] + "\nnav:\n  - Home: index.md\n")
    r = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0 and "no-such-page.md" in r.stdout + r.stderr, r.stdout + r.stderr
