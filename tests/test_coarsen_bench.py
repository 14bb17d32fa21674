"""bench/coarsen_bench.py at a tiny size, and DyNet's own program texts (bench/swap, import
swap) give the same losses and gradients with automatic coarsening on and off."""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.config import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def test_coarsen_bench_rows():
    from bench import coarsen_bench
    rows = coarsen_bench.main(["--workloads", "treefc,treelstm", "--H", "4", "--batch-size", "4", "--repeat", "1"])
    assert [r["workload"] for r in rows] == ["treefc", "treelstm"]
    for r in rows:
        assert r["nodes"] > 0 and r["patterns"] > 0 and 0 < r["coarse"] <= 1 and r["python_us"] > 0
        assert r["op_level_us"] > 0


def test_coarsen_bench_phases_leave_the_switch_as_found():
    from bench import coarsen_bench
    before = config.coarsen
    rows = coarsen_bench.main(["--workloads", "treelstm", "--H", "4", "--batch-size", "4", "--repeat", "1",
                               "--phases", "--graphs", "1"])
    assert config.coarsen == before
    r = rows[0]
    for label in ("coarse", "op"):
        assert r[f"{label}_forward_ms"] > 0 and r[f"{label}_backward_ms"] > 0 and r[f"{label}_schedule_ms"] > 0
    assert r["speedup"] > 0


@pytest.mark.parametrize("workload", ["treelstm", "treefc", "bilstm", "mvrnn"])
def test_swap_programs_train_the_same_with_coarsening(workload):
    sys.modules.setdefault("dynet", dy)
    from bench import import_swap as isw
    program, data = isw.MINIBATCH[workload]
    mod = importlib.import_module(f"bench.swap.{program}")
    samples, vocab, n_out = isw.load_data(data, 6, 3)
    results = []
    saved = (config.coarsen, config.dtype)
    try:
        for co in (False, True):
            dy.config.set(dtype="float64", coarsen=co)
            pc = dy.ParameterCollection()
            model = mod.Model(pc, 5, vocab, n_out, np.random.default_rng(3))
            dy.renew_cg()
            model.begin()
            loss = dy.esum([model.loss(s) for s in samples])
            value = loss.value()
            loss.backward()
            grads = [p.grad_as_array() for p in pc.parameters_list() + pc.lookup_parameters_list()]
            results.append((value, grads, dy.cg().stats.coarse_groups))
    finally:
        config.coarsen, config.dtype = saved
    (v0, g0, c0), (v1, g1, c1) = results
    assert c0 == 0 and c1 > 0
    assert v1 == pytest.approx(v0, rel=1e-10)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-10)
