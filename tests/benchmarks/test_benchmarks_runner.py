"""``python -m benchmarks`` itself: a benchmark's figures stand without the plotting extra.

matplotlib is the ``bench`` extra (``make bench`` installs it); ``python -m benchmarks`` on a fresh
environment without it must still write each benchmark's JSON and count the benchmark as run,
not lose the run's figures to a missing plot. Any other failure of a plot is the plot's bug and
still fails the benchmark.
"""

from __future__ import annotations

import builtins
import json
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from benchmarks import __main__ as runner


def _run(tmp_path, monkeypatch, result: dict[str, Any], plot: Callable[[Any, Any], None], quick: bool = False) -> None:
    """The runner's step for a stand-in benchmark module returning ``result`` and plotting with ``plot``."""
    module = types.ModuleType("benchmarks.fake_bench")
    module.run = lambda q: dict(result, quick_asked=q)
    module.plot = plot
    monkeypatch.setitem(sys.modules, "benchmarks.fake_bench", module)
    runner._simple("fake_bench", "fake.png")(tmp_path, quick)


def _written(tmp_path) -> dict[str, Any]:
    return json.loads((tmp_path / "fake_bench.json").read_text())


def test_a_missing_matplotlib_costs_the_plot_only(tmp_path, monkeypatch, capsys):
    def plot(result, png):
        import matplotlib  # noqa: F401  (refused below, as on a machine without the extra)

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    _run(tmp_path, monkeypatch, {"figure": 1.5}, plot, quick=True)  # raises if the plot's error escapes

    written = _written(tmp_path)
    assert written["figure"] == 1.5 and written["quick_asked"] is True and written["quick"] is True
    assert "machine" in written
    assert not (tmp_path / "fake.png").exists()
    assert "matplotlib not installed: no fake.png" in capsys.readouterr().err


def test_a_plot_that_fails_otherwise_still_fails_the_benchmark(tmp_path, monkeypatch):
    def plot(result, png):
        raise ValueError("a real bug in the plot")

    with pytest.raises(ValueError, match="a real bug"):
        _run(tmp_path, monkeypatch, {"figure": 2}, plot)
    assert _written(tmp_path)["figure"] == 2  # the figures were written before the plot


def test_another_missing_module_in_a_plot_is_the_plots_bug(tmp_path, monkeypatch):
    def plot(result, png):
        import benchmarks.no_such_helper  # noqa: F401

    with pytest.raises(ModuleNotFoundError) as caught:
        _run(tmp_path, monkeypatch, {"figure": 3}, plot)
    assert caught.value.name == "benchmarks.no_such_helper"
