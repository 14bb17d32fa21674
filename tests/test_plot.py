"""bench/plot.py and the --plot flags (skipped without matplotlib, which is optional)."""
from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import plot  # noqa: E402

ROWS = [{"workload": w, "scheduler": s, "x_lb": v} for w, s, v in
        [("tree", "depth", 1.2), ("tree", "agenda", 1.5), ("seq", "depth", 1.0), ("seq", "agenda", None)]]


def test_without_matplotlib_the_error_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(plot.PlotUnavailable, match=r"\.\[plot\]"):
        plot.grouped_bars(str(tmp_path / "x.png"), ROWS, "workload", "scheduler", "x_lb")


def test_grouped_bars_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")
    png = plot.grouped_bars(str(tmp_path / "a.png"), ROWS, "workload", "scheduler", "x_lb", hline=1.0)
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    svg = plot.grouped_bars(str(tmp_path / "a.svg"), ROWS, "workload", "scheduler", "x_lb", log=True)
    text = open(svg).read()
    ET.fromstring(text)  # well-formed
    assert "depth" in text and "agenda" in text  # the legend names the series
    assert sorted(os.listdir(tmp_path)) == ["a.png", "a.svg"]  # no temporary left behind
    with pytest.raises(ValueError, match="png"):
        plot.lines(str(tmp_path / "a.jpg"), {"loss": [1, 2]})


def test_lines(tmp_path):
    pytest.importorskip("matplotlib")
    path = plot.lines(str(tmp_path / "l.png"), {"loss": [3.0, 2.0, 1.5]}, xlabel="step")
    assert os.path.getsize(path) > 1000


def test_compare_schedulers_plot_flag(tmp_path):
    pytest.importorskip("matplotlib")
    from bench import compare_schedulers
    rows = compare_schedulers.main(["--workloads", "bilstm", "--instances", "2", "--hidden", "4", "--episodes",
                                    "10", "--encodings", "sort", "--reps", "1", "--quiet", "--out",
                                    str(tmp_path), "--plot", str(tmp_path / "s.svg")])
    text = open(tmp_path / "s.svg").read()
    assert all(escape(r["scheduler"]) in text for r in rows)  # "fsm-sort>agenda" is written "fsm-sort&gt;agenda"


def test_treelstm_plot_flag(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path))  # synthetic trees only
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import treelstm
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    treelstm.main(["--quiet", "--train", "32", "--dev", "8", "--epochs", "2", "--hidden", "8", "--emb-dim", "8",
                   "--batch-size", "16", "--plot", str(tmp_path / "loss.png")])
    assert open(tmp_path / "loss.png", "rb").read(4) == b"\x89PNG"


def test_cavs_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from bench import cavs_bench
    results = [{"H": 64, "threads": 1, "system": "dynagraph:agenda", "samples_per_sec": 2900.0},
               {"H": 64, "threads": 1, "system": "dynagraph:cavs", "samples_per_sec": 11000.0},
               {"H": 64, "threads": 1, "system": "dynet:2", "error": "not installed"}]
    text = open(cavs_bench.plot(str(tmp_path / "c.svg"), results)).read()
    assert "dynagraph:cavs" in text and "dynet:2" not in text  # failed systems are left out
    assert cavs_bench.parse_args(["--plot", "x.png"]).plot == "x.png"
