"""The house's style and types are checked on every run: ruff (lint and format) and mypy.

Why a test and not a separate CI step: the README's one test command is the whole gate, so a
newcomer who runs it sees the same failures CI would. The tools read their settings from
pyproject.toml (``[tool.ruff*]``, ``[tool.mypy]``: the strict cores are listed there); the tests
only run them over the checkout and fail with what they printed, so the message names the file,
the line and the rule to fix.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # `python -m tool` from the interpreter running the suite: the versions pinned in the test extra,
    # never whatever ruff or mypy happens to be first on PATH
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"`{' '.join(done.args[2:])}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_ruff_lint_is_clean() -> None:
    """Lint rules (pyproject's [tool.ruff.lint]): import order, likely bugs, py311 syntax, and every
    ``# type: ignore`` / ``# noqa`` naming its code (PGH003/PGH004)."""
    done = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".", timeout=120)
    assert done.returncode == 0, _explain(done)


def test_ruff_format_is_clean() -> None:
    """The tree is as ``ruff format`` writes it: no diff (run ``ruff format .`` to fix)."""
    done = _run("ruff", "format", "--no-cache", "--check", ".", timeout=120)
    assert done.returncode == 0, _explain(done)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mypy_is_clean() -> None:
    """mypy over the product packages ([tool.mypy] files): strict for all of gateway, security and
    billing, the default level for cache and inference, and an unused or code-less
    ``# type: ignore`` is an error. ~50-70 s cold on 2 cores (the cache is ``.mypy_cache``), hence
    slow."""
    done = _run("mypy", timeout=840)
    assert done.returncode == 0, _explain(done)
