"""``python -m benchmarks`` itself: a benchmark's figures stand without the plotting extra.

matplotlib is the ``bench`` extra (``make bench`` installs it); ``python -m benchmarks`` on a fresh
environment without it must still write each benchmark's JSON and count the benchmark as run,
not lose the run's figures to a missing plot.
"""

from __future__ import annotations

import builtins
import json
import sys
import types

from benchmarks import __main__ as runner


def test_a_missing_matplotlib_costs_the_plot_only(tmp_path, monkeypatch, capsys):
    module = types.ModuleType("benchmarks.fake_bench")
    module.run = lambda quick: {"figure": 1.5, "quick_asked": quick}

    def plot(result, png):
        import matplotlib  # noqa: F401  (refused below, as on a machine without the extra)

    module.plot = plot
    monkeypatch.setitem(sys.modules, "benchmarks.fake_bench", module)
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    runner._simple("fake_bench", "fake.png")(tmp_path, True)  # raises if the plot's error escapes

    written = json.loads((tmp_path / "fake_bench.json").read_text())
    assert written["figure"] == 1.5 and written["quick_asked"] is True and written["quick"] is True
    assert "machine" in written
    assert not (tmp_path / "fake.png").exists()
    assert "matplotlib not installed: no fake.png" in capsys.readouterr().err


def test_a_plot_that_fails_otherwise_still_fails_the_benchmark(tmp_path, monkeypatch):
    module = types.ModuleType("benchmarks.fake_bench")
    module.run = lambda quick: {"figure": 2}

    def plot(result, png):
        raise ValueError("a real bug in the plot")

    module.plot = plot
    monkeypatch.setitem(sys.modules, "benchmarks.fake_bench", module)
    try:
        runner._simple("fake_bench", "fake.png")(tmp_path, False)
    except ValueError:
        pass
    else:
        raise AssertionError("a plot's own bug must reach the runner (it reports the benchmark as failed)")
    assert json.loads((tmp_path / "fake_bench.json").read_text())["figure"] == 2


def test_another_missing_module_in_a_plot_is_the_plots_bug(tmp_path, monkeypatch):
    """Only matplotlib's absence is forgiven: a plot that imports a module that does not exist
    fails the benchmark like any other bug of its own."""
    module = types.ModuleType("benchmarks.fake_bench")
    module.run = lambda quick: {"figure": 3}

    def plot(result, png):
        import benchmarks.no_such_helper  # noqa: F401

    module.plot = plot
    monkeypatch.setitem(sys.modules, "benchmarks.fake_bench", module)
    try:
        runner._simple("fake_bench", "fake.png")(tmp_path, False)
    except ModuleNotFoundError as exc:
        assert exc.name == "benchmarks.no_such_helper"
    else:
        raise AssertionError("a plot's missing module other than matplotlib must fail the benchmark")
