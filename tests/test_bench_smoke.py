"""Smoke test of the benchmark harness (bench/run.py) at tiny sizes, dynagraph and numpy only.

Checks the JSON it writes and that the harness compares like with like: every
dynagraph scheduler, and the hand-batched numpy baseline, report the same losses
for the same data and initial parameters (also after an SGD step).
"""
from __future__ import annotations

import json
import os
import sys
from itertools import groupby
from pathlib import Path

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import report, run  # noqa: E402

WORKLOADS = ["treelstm", "treefc64", "bilstm", "mvrnn"]  # synthetic only: tests never read ../shared


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    run.main(["--systems", "dynagraph,numpy", "--workloads", ",".join(WORKLOADS), "--H", "8",
              "--batch-size", "4", "--batches", "2", "--warmup", "0", "--modes", "train,infer",
              "--out", str(out), "--no-progress", "--quiet"])
    with open(out) as f:
        return json.load(f)


def by_config(results):
    key = lambda r: (r["workload"], r["mode"], r["H"])  # noqa: E731
    return {k: list(g) for k, g in groupby(sorted(results, key=key), key=key)}


def test_json_fields(doc):
    meta = doc["meta"]
    assert {"date", "command", "versions", "cpus", "threads"} <= set(meta)
    assert "dynagraph" in meta["versions"]
    results = doc["results"]
    schedulers = run.dynagraph_schedulers()
    # every (workload, mode) ran on every scheduler; numpy only where it has a model
    assert len(by_config(results)) == len(WORKLOADS) * 2
    for (workload, mode, H), rows in by_config(results).items():
        labels = {r["label"] for r in rows}
        assert {f"dynagraph:{s}" for s in schedulers} <= labels
        assert ("numpy" in labels) == workload.startswith("tree")
        assert H == 8
    for r in results:
        assert not r.get("error"), r.get("traceback", r.get("error"))
        assert r["samples"] == 8 and len(r["losses"]) == 2
        assert r["samples_per_sec"] > 0 and len(r["step_seconds"]) == 2
        assert r["vs_dynet_best"] is None  # DyNet did not run
        if r["system"] == "dynagraph":
            assert set(r["time_split"]) == set(report.SPLIT)
            assert abs(sum(r["time_split"].values()) - 1.0) < 1e-6 or r["time_split"]["other"] == 0.0
            last = r["last_step"]
            assert last["batches"] >= last["lower_bound"] > 0  # no schedule beats the bound
            assert r["nodes_per_step"] >= last["batches"]
            if r["variant"] == "none":
                assert last["batches"] == last["nodes"]  # no batching at all


def test_losses_equal_across_schedulers_and_numpy(doc):
    for config, rows in by_config(doc["results"]).items():
        ref = np.array(rows[0]["losses"])
        assert np.all(np.isfinite(ref)) and np.all(ref > 0)
        for r in rows[1:]:
            np.testing.assert_allclose(r["losses"], ref, rtol=1e-5, err_msg=f"{config} {r['label']}")


def test_train_and_infer_start_equal_and_sgd_changes_the_next_loss(doc):
    for (workload, mode, _), rows in by_config(doc["results"]).items():
        first, second = rows[0]["losses"]
        infer = [r for r in doc["results"] if r["workload"] == workload and r["mode"] == "infer"][0]
        assert infer["losses"][0] == pytest.approx(first, rel=1e-5)  # same data, same initial parameters
        if mode == "train":  # batch 2 was seen after one SGD step: different parameters, different loss
            assert second != pytest.approx(infer["losses"][1], rel=1e-6)


def test_table_lists_every_run(doc):
    text = report.table(doc["results"])
    for r in doc["results"]:
        assert r["label"] in text
    assert "samples/s" in text.splitlines()[0]



def test_kernel_table_runs_section(capsys):
    """bench/kernels.py's runs rows call the run kernel through pointers it must keep alive."""
    from bench import kernels
    from dynagraph.backends import get_backend
    if get_backend("cpu").elementwise_runs is None:
        pytest.skip("compiled kernels (with runs) not built")
    kernels.bench_runs(kernels.Table(), np.random.default_rng(0), np.float32, (1, 16), (8,))
    out = capsys.readouterr().out
    assert out.count("run step") == 10


def test_kernel_table_trainer_and_cell_gemm_rows(capsys):
    from bench import kernels
    if not hasattr(kernels.cpu, "sgd_update"):
        pytest.skip("compiled kernels not built")
    t = kernels.Table()
    kernels.bench_trainers(t, np.random.default_rng(0), np.float32, (8,))
    kernels.bench_cell_gemm(t, np.random.default_rng(0), np.float32, (8,))
    out = capsys.readouterr().out
    assert "sgd sparse rows" in out and out.count("cell GEMM") == 1


def test_scheduling_cost_table(capsys):
    from bench import scheduling_cost
    rows = scheduling_cost.main(["--workload", "latticegru", "--instances", "2", "--hidden", "2", "--reps", "2"])
    assert [r["scheduler"] for r in rows] == scheduling_cost.SCHEDULERS
    assert all(r["batches"] > 0 and r["ms"] >= 0 for r in rows)
    out = capsys.readouterr().out
    assert "| agenda |" in out and "x agenda" in out


def test_compare_schedulers_times_execution_with_the_schedule_given(tmp_path):
    """bench/compare_schedulers.py: every row has `exec ms`, the forward pass with its schedule
    given; the given schedule is checked against the graph once, so one that does not fit raises."""
    from bench import compare_schedulers as cs
    from dynagraph.errors import DynagraphError
    rows = cs.main(["--workloads", "treelstm", "--instances", "2", "--hidden", "4", "--episodes", "5",
                    "--encodings", "chain", "--baselines", "agenda,depth", "--reps", "1", "--quiet",
                    "--out", str(tmp_path)])
    assert {r["scheduler"] for r in rows} >= {"agenda", "depth", "fsm-chain"}
    assert all(r["exec_ms"] > 0 for r in rows)
    assert "| exec ms |" in open(tmp_path / "compare_schedulers.md").read()
    from examples.workloads import WORKLOADS
    w = WORKLOADS["treelstm"](hidden=4, seed=0)
    xs = w.instances(2, seed=2)
    cg = w.graph(xs)
    batches = cs.schedulers.get("agenda").schedule(cg, cs.pending(cg))
    assert cs.execute_given(w, xs, batches, 1) > 0
    with pytest.raises(DynagraphError, match="not scheduled"):
        cs.execute_given(w, xs, batches[:-1], 1)  # a batch left out: not every pending node runs


def test_instruction_counts_turn_cumulative_runs_into_phases():
    """bench/instruction_counts.py: runs stopped after each phase give cumulative totals; a
    phase is the difference, a sentence's share of it; the totals come from callgrind's file."""
    from bench import instruction_counts as ic
    assert ic.parse_total("events: Ir\nsummary: 12345\n") == 12345
    assert ic.parse_total("# callgrind format\ntotals: 77\n") == 77
    with pytest.raises(ValueError):
        ic.parse_total("events: Ir\n")
    phases = ic.per_phase([1000, 3000, 6000, 7000], 10)
    assert phases == {"record": 100.0, "forward": 200.0, "backward": 300.0, "update": 100.0, "all": 700.0}
    with pytest.raises(ValueError):
        ic.per_phase([1, 2], 1)
    out = ic.table([{"workload": "cbow", "system": "dynagraph", **phases}])
    assert out.splitlines()[2] == "| cbow | dynagraph | 0 | 0 | 0 | 0 | 1 |"


@pytest.mark.parametrize("phase", ["record", "forward"])
def test_instruction_counts_minibatch_worker_runs_each_phase(tmp_path, phase):
    """bench/instruction_counts.py --suite minibatch: the worker callgrind runs records and
    evaluates a mini-batched program (synthetic data here), the timed phase inside the reduce."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, DYNAGRAPH_DATA=str(tmp_path), OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(root / "bench" / "instruction_counts.py"), "--minibatch-worker",
                           "treefc", "dynagraph", phase, "1", "1", "8", "4"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert np.isfinite(float(done.stdout.strip().splitlines()[-1]))
