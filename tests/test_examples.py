"""Smoke tests of examples/: each main() with tiny arguments, on synthetic data only."""
import importlib
import math
import os
import sys

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
NAMES = ["mlp", "treelstm", "bilstm_tagger", "demo"]


@pytest.fixture(autouse=True)
def no_shared_data(monkeypatch, tmp_path):
    # Tests must not read ../shared: point the data root at an empty folder.
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path))


@pytest.fixture(scope="module")
def ex():
    sys.path.insert(0, EXAMPLES)
    try:
        yield {name: importlib.import_module(name) for name in NAMES}
    finally:
        sys.path.remove(EXAMPLES)


@pytest.mark.parametrize("name", NAMES)
def test_help(ex, name, capsys):
    with pytest.raises(SystemExit) as e:
        ex[name].parse_args(["--help"])
    assert e.value.code == 0 and "usage" in capsys.readouterr().out


def test_mlp_learns_spirals(ex):
    r = ex["mlp"].main(["--quiet", "--train", "400", "--test", "200", "--epochs", "25"])
    assert all(math.isfinite(x) for x in r["losses"])
    assert r["losses"][-1] < 0.5 * r["losses"][0]
    assert r["test_acc"] > 0.8  # two spirals are not linearly separable (linear: ~0.6)


TREE_ARGS = ["--quiet", "--train", "48", "--dev", "16", "--epochs", "3", "--hidden", "16", "--emb-dim", "16",
             "--batch-size", "16"]


def test_treelstm_loss_decreases(ex):
    r = ex["treelstm"].main(TREE_ARGS)
    assert r["source"] == "synthetic"
    losses = [h["loss"] for h in r["history"]]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    h = r["history"][0]
    assert 0 < h["batches"] < h["nodes"]  # the default scheduler batches


def test_treelstm_same_training_under_every_scheduler(ex):
    runs = {s: ex["treelstm"].main(TREE_ARGS + ["--epochs", "1", "--scheduler", s])  # last flag wins
            for s in ("none", "depth", "agenda")}
    base = runs["none"]["history"][0]
    assert base["batches"] == base["nodes"]
    for s in ("depth", "agenda"):
        h = runs[s]["history"][0]
        assert h["nodes"] == base["nodes"] and h["batches"] < base["nodes"] / 10
        assert h["loss"] == pytest.approx(base["loss"], rel=1e-5)
        assert h["dev_acc"] == base["dev_acc"]


def test_bilstm_tagger_loss_decreases(ex):
    r = ex["bilstm_tagger"].main(["--quiet", "--train", "48", "--test", "16", "--epochs", "3", "--hidden", "16",
                                  "--emb-dim", "16", "--mlp-dim", "16", "--batch-size", "16"])
    assert r["source"] == "synthetic"
    assert all(math.isfinite(x) for x in r["losses"])
    assert r["losses"][0] > r["losses"][1] > r["losses"][2]
    assert all(0.0 <= a <= 1.0 for a in r["test_acc"])
    # synthetic data has no "O" tag: its most frequent tag is left out instead (counting every
    # token printed the test accuracy twice)
    tag = ex["bilstm_tagger"].outside_tag
    assert tag([[("a", "T1"), ("b", "T0"), ("c", "T0")]]) == "T0"
    assert tag([[("a", "B-PER"), ("b", "O"), ("c", "B-PER")]]) == "O"


def test_demo_schedulers_agree_and_batch(ex, capsys):
    r = ex["demo"].main(["--quiet", "--train", "24", "--dev", "8", "--epochs", "1", "--bench", "24",
                         "--batch-size", "12", "--hidden", "8", "--emb-dim", "8", "--repeat", "1"])
    rows = {row["scheduler"]: row for row in r["rows"]}
    assert list(rows) == ["none", "depth", "agenda", "agenda+block", "cavs"]
    nodes = rows["none"]["nodes"]
    assert rows["none"]["batches"] == nodes > 0
    for s in ("depth", "agenda", "agenda+block", "cavs"):
        if s in ("agenda+block", "cavs"):  # a node per call, or one for all vertices: far fewer
            assert rows[s]["nodes"] < nodes / 3 and rows[s]["batches"] < rows["agenda"]["batches"]
        else:
            assert rows[s]["nodes"] == nodes
            assert r["lower_bound"] <= rows[s]["batches"] < nodes / 10
        # Same start weights and data: batching must not change the numbers.
        np.testing.assert_allclose(rows[s]["losses"], rows["none"]["losses"], rtol=1e-5)
        assert rows[s]["loss_diff"] < 1e-5 and rows[s]["weight_diff"] < 1e-5
    out = capsys.readouterr().out
    assert "vs none" in out and "agenda" in out
    if r["dynet"] is not None:  # dynet38 installed: DyNet's own speed on one program text
        assert [row["system"] for row in r["dynet"]] == ["DyNet autobatch", "dynagraph agenda"]
        assert "vs DyNet" in out
        np.testing.assert_allclose(r["dynet"][1]["losses"], r["dynet"][0]["losses"], rtol=1e-4)


def test_demo_help_describes_what_it_prints(ex, capsys):
    with pytest.raises(SystemExit):
        ex["demo"].parse_args(["--help"])
    text = capsys.readouterr().out
    assert "three times" not in text and "five by default" in text and "DyNet" in text
