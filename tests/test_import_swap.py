"""The import-swap bench (bench/import_swap.py): its DyNet programs run on dynagraph unchanged.

Each program in bench/swap/ is imported with dynagraph in ``sys.modules['dynet']`` (the
swap the bench's worker makes) at tiny sizes on synthetic data. Checks: the loss and
every parameter's gradient agree between dynagraph's default scheduler and unbatched
execution (scheduler "none"), for the mini-batched loop and the per-sentence loop; and
the driver produces a row per config with dynagraph alone (DyNet is optional).
"""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import dynagraph  # noqa: E402
from bench import import_swap  # noqa: E402


@pytest.fixture()
def swapped(tmp_path, monkeypatch):
    """dynagraph as `dynet`, no shared data (synthetic only); both undone afterwards."""
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path))
    monkeypatch.setitem(sys.modules, "dynet", dynagraph)
    for name in [m for m in sys.modules if m.startswith("bench.swap.")]:
        monkeypatch.delitem(sys.modules, name)
    import_swap._DATA.clear()
    yield
    for name in [m for m in sys.modules if m.startswith("bench.swap.")]:
        del sys.modules[name]
    import_swap._DATA.clear()


def _losses_and_grads(name: str, scheduler: str, H: int = 8):
    program, data = import_swap.MINIBATCH.get(name) or import_swap.SENTENCE[name]
    mod = importlib.import_module(f"bench.swap.{program}")
    loop = importlib.import_module("bench.swap.loop")
    samples, vocab, n_out = import_swap.load_data(data, 3, seed=1)
    if name == "treefc":  # complete 64-leaf trees are the bench's size, not the test's
        samples = samples[:1]
    old = dynagraph.config.get()["scheduler"]
    dynagraph.config.set(scheduler=scheduler)
    try:
        pc = dynagraph.ParameterCollection()
        model = mod.Model(pc, H, vocab, n_out, np.random.default_rng(0))
        trainer = dynagraph.SimpleSGDTrainer(pc, learning_rate=0.1)
        split = dict.fromkeys(import_swap.SPLIT, 0.0)
        if name in import_swap.MINIBATCH:
            losses = [loop.minibatch_step(model, trainer, samples, True, split),
                      loop.minibatch_step(model, trainer, samples, False, split)]
        else:
            losses = [loop.sentence_epoch(model, trainer, samples, split)]
        values = [p.as_array().copy() for p in pc.parameters_list()]
        values += [p.as_array().copy() for p in pc.lookup_parameters_list()]
    finally:
        dynagraph.config.set(scheduler=old)
    return losses, values


@pytest.mark.parametrize("name", [*import_swap.MINIBATCH, *import_swap.SENTENCE])
def test_program_runs_swapped_and_matches_unbatched(swapped, name):
    H = 4 if name == "mvrnn" else 8
    losses, values = _losses_and_grads(name, dynagraph.config.get()["scheduler"], H)
    ref_losses, ref_values = _losses_and_grads(name, "none", H)
    assert all(np.isfinite(losses)) and losses[0] > 0
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    # trained values after the SGD steps: equal iff every gradient was equal
    assert len(values) == len(ref_values)
    for v, r in zip(values, ref_values):
        np.testing.assert_allclose(v, r, rtol=1e-5, atol=1e-6)


def test_driver_dynagraph_only(swapped, capsys):
    rows = import_swap.main(["--workloads", "treelstm,cbow", "--H", "8", "--batch-size", "2", "--batches", "1",
                             "--sentences", "3", "--sentence-warmup", "1", "--autobatch", "", "--rounds", "1",
                             "--no-progress"])
    got = {(r["workload"], r["mode"]) for r in rows}
    assert got == {("treelstm", "train"), ("treelstm", "infer"), ("cbow", "train")}
    for r in rows:
        assert r["system"] == "dynagraph" and r["seconds"] > 0 and set(r["split"]) == set(import_swap.SPLIT)


def test_driver_runs_each_scheduler_and_the_table_credits_the_best():
    """`--scheduler ,depth` starts one dynagraph worker per scheduler; the table compares the
    faster one with DyNet's faster mode and names both winners."""
    rows = import_swap.main(["--workloads", "treefc", "--H", "8", "--batch-size", "2", "--batches", "1",
                             "--modes", "infer", "--autobatch", "", "--rounds", "1", "--scheduler", ",depth",
                             "--no-progress"])
    assert sorted(r["label"] for r in rows) == ["dynagraph", "dynagraph:depth"]

    def row(system, label, seconds):
        return dict(threads=1, suite="minibatch", workload="treelstm", mode="infer", H=64, system=system,
                    label=label, seconds=seconds, samples_per_sec=128 / seconds, samples=128, batch_size=64,
                    split=dict.fromkeys(import_swap.SPLIT, seconds / 4))
    text = import_swap.table([row("dynagraph", "dynagraph", 2.0), row("dynagraph", "dynagraph:depth", 1.0),
                              row("dynet", "dynet:ab1", 1.5), row("dynet", "dynet:ab2", 3.0)])
    line = next(ln for ln in text.splitlines() if "treelstm" in ln)
    assert "depth/ab1" in line and "1.50x" in line  # 128/1.0 over 128/1.5
