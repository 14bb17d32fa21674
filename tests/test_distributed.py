"""dy.distributed under `mpirun -np 2` (skipped without mpirun or mpi4py).

Each test starts tests/distributed_worker.py as a bounded subprocess: under mpirun
(2 ranks, each with half of every mini-batch) and as one plain process (the combined
mini-batch); the results must agree to 1e-10 in float64.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dynagraph as dy

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distributed_worker.py")
MPIRUN = shutil.which("mpirun")


def _open_mpi() -> bool:
    """The tests pass Open MPI's flags (--oversubscribe, run-as-root variables)."""
    try:
        out = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout + out.stderr


needs_mpi = pytest.mark.skipif(MPIRUN is None or importlib.util.find_spec("mpi4py") is None or not _open_mpi(),
                               reason="needs Open MPI's mpirun and mpi4py")


def _env(**extra) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def _run(args: list, np_: int, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, WORKER] + [str(a) for a in args]
    if np_ > 0:
        cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", "--bind-to", "none"] + cmd
    return subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=timeout)


def _ok(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"


def _load(d) -> list:
    return [dict(np.load(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.startswith("rank")]


@needs_mpi
@pytest.mark.parametrize("trainer,sparse", [("sgd", 0), ("adam", 0), ("sgd", 1), ("adam", 1), ("momentum", 1)])
def test_two_ranks_equal_one_process_on_the_combined_batch(tmp_path, trainer, sparse):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    _ok(_run([one, trainer, sparse, 5], np_=0))
    _ok(_run([two, trainer, sparse, 5], np_=2))
    (ref,), ranks = _load(one), _load(two)
    assert len(ranks) == 2
    # A loss summed over each rank's shard adds up to the loss over the combined batch.
    np.testing.assert_allclose(ranks[0]["losses"] + ranks[1]["losses"], ref["losses"], rtol=0, atol=1e-10)
    assert ref["losses"].shape == (5,)
    for r in ranks:
        for k, v in ref.items():
            if k != "losses":
                np.testing.assert_allclose(r[k], v, rtol=0, atol=1e-10, err_msg=k)
    # The ranks hold bit-identical weights (same summed gradients, same rule).
    for k in ref:
        if k != "losses":
            np.testing.assert_array_equal(ranks[0][k], ranks[1][k], err_msg=k)
    moved = ref["/E"] if sparse else ref["/W"]
    assert np.abs(moved).sum() > 0  # the parameters were trained, not left alone


@needs_mpi
def test_resume_from_checkpoint_continues_exactly(tmp_path):
    straight, first, second = tmp_path / "straight", tmp_path / "first", tmp_path / "second"
    for d in (straight, first, second):
        d.mkdir()
    ckpt = str(tmp_path / "ckpt.npz")
    _ok(_run([straight, "adam", 1, 5], np_=2))
    _ok(_run([first, "adam", 1, 5, "--save-at", 3, ckpt], np_=2))
    assert os.path.exists(ckpt) and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    _ok(_run([second, "adam", 1, 5, "--resume", ckpt], np_=2))
    a, b, c = _load(straight), _load(first), _load(second)
    for r in range(2):
        np.testing.assert_array_equal(np.concatenate([b[r]["losses"], c[r]["losses"]]), a[r]["losses"])
        for k, v in a[r].items():
            if k != "losses":
                np.testing.assert_array_equal(c[r][k], v, err_msg=k)


@needs_mpi
def test_a_killed_rank_ends_the_job_with_an_error(tmp_path):
    t0 = time.monotonic()
    p = _run([tmp_path, "sgd", 1, 5, "--fail", "kill"], np_=2, timeout=90)
    assert p.returncode != 0
    assert time.monotonic() - t0 < 90
    out = (p.stdout + p.stderr).lower()
    assert "signal 9" in out or "signal: 9" in out, out  # OpenMPI / MPICH wording


@needs_mpi
def test_a_hung_rank_ends_the_job_with_a_timeout_error(tmp_path):
    t0 = time.monotonic()
    p = _run([tmp_path, "sgd", 1, 5, "--fail", "hang"], np_=2, timeout=90, DYNAGRAPH_MPI_TIMEOUT="3")
    assert p.returncode != 0
    assert time.monotonic() - t0 < 90
    assert "gradient all-reduce did not complete within 3 s" in p.stderr, p.stderr


def test_shard_splits_in_order_and_covers_everything():
    items = list(range(11))
    parts = [dy.distributed.shard(items, rank=r, size=3) for r in range(3)]
    assert sum(parts, []) == items
    assert [len(s) for s in parts] == [4, 4, 3]
    assert dy.distributed.shard([1, 2], rank=2, size=3) == []


@given(st.lists(st.floats(0, 100), max_size=40), st.integers(1, 5))
def test_cost_balanced_shards_are_contiguous_and_near_the_mean(costs, n):
    items = list(range(len(costs)))
    parts = [dy.distributed.shard(items, rank=r, size=n, cost=lambda i: costs[i]) for r in range(n)]
    assert sum(parts, []) == items  # contiguous, in order: the combined mini-batch
    bound = sum(costs) / n + max(costs, default=0.0)
    assert all(sum(costs[i] for i in p) <= bound + 1e-9 for p in parts)


def test_shard_rejects_bad_costs_and_ranks():
    with pytest.raises(ValueError, match="finite, non-negative"):
        dy.distributed.shard([1, 2], rank=0, size=2, cost=lambda x: -x)
    with pytest.raises(ValueError, match="finite, non-negative"):
        dy.distributed.shard([1, 2], rank=0, size=2, cost=lambda x: 1e308)
    with pytest.raises(ValueError, match="rank 2 out of range for 2"):
        dy.distributed.shard([1, 2], rank=2, size=2)


def test_single_process_without_mpirun_is_rank_0_of_1():
    # Without mpirun the wrapper is a plain trainer: the same numbers as the bare one.
    pc = dy.ParameterCollection()
    W = pc.add_parameters((2, 3))
    ref = W.as_array()
    trainer = dy.distributed.DataParallelTrainer(dy.SimpleSGDTrainer(pc, 0.5))
    dy.renew_cg()
    loss = dy.squared_norm(W * dy.inputVector([1.0, 2.0, 3.0]))
    loss.backward()
    g = W.grad_as_array()
    trainer.update()
    np.testing.assert_allclose(W.as_array(), ref - 0.5 * g * min(1.0, 5.0 / np.linalg.norm(g)), rtol=1e-6)
    assert trainer.step == 1 and trainer.learning_rate == 0.5


def _tiny_run(path: str, steps: int, resume: bool = False) -> tuple:
    """One process: a lookup + dense model, Adam, batches drawn from dy.config's RNG."""
    dy.reset_random_seed(3)
    pc = dy.ParameterCollection()
    E, W = pc.add_lookup_parameters((10, 3), name="E"), pc.add_parameters((2, 3), name="W")
    trainer = dy.distributed.DataParallelTrainer(dy.AdamTrainer(pc, 0.1))
    start = trainer.load_checkpoint(path)["next"] if resume else 0
    losses = []
    for step in range(start, steps):
        ids = dy.config.config.rng.integers(0, 10, size=4)
        dy.renew_cg()
        loss = dy.esum([dy.pickneglogsoftmax(W * E[int(i)], int(i) % 2) for i in ids])
        losses.append(loss.value())
        loss.backward()
        trainer.update()
        if not resume and step + 1 == 2:
            trainer.save_checkpoint(path, extra={"next": 2})
    return losses, E.as_array(), W.as_array(), trainer


def test_checkpoint_resume_in_one_process(tmp_path, float64):
    path = str(tmp_path / "c.npz")
    full, E, W, t = _tiny_run(path, 4)
    rest, E2, W2, t2 = _tiny_run(path, 4, resume=True)
    assert rest == full[2:]
    np.testing.assert_array_equal(E2, E)
    np.testing.assert_array_equal(W2, W)
    assert t2.step == t.step == 4 and t2.updates == t.updates == 4


def test_checkpoint_refuses_another_trainer_or_a_foreign_file(tmp_path, float64):
    path = str(tmp_path / "c.npz")
    _tiny_run(path, 2)
    pc = dy.ParameterCollection()
    pc.add_lookup_parameters((10, 3), name="E"), pc.add_parameters((2, 3), name="W")
    with pytest.raises(ValueError, match="saved from AdamTrainer, cannot resume SimpleSGDTrainer"):
        dy.distributed.DataParallelTrainer(dy.SimpleSGDTrainer(pc)).load_checkpoint(path)
    pc.save(str(tmp_path / "plain.npz"))
    with pytest.raises(ValueError, match="not a dy.distributed checkpoint"):
        dy.distributed.DataParallelTrainer(dy.AdamTrainer(pc)).load_checkpoint(str(tmp_path / "plain.npz"))


def test_parameters_added_after_wrapping_are_an_error():
    pc = dy.ParameterCollection()
    pc.add_parameters(2)
    trainer = dy.distributed.DataParallelTrainer(dy.SimpleSGDTrainer(pc))
    pc.add_parameters(3)
    with pytest.raises(ValueError, match="added to the collection after the trainer was wrapped"):
        trainer.update()


@needs_mpi
def test_bench_runs_and_prints_the_scaling_table():
    bench = os.path.join(os.path.dirname(HERE), "bench", "distributed_bench.py")
    p = subprocess.run([sys.executable, bench, "--H", "8", "--batch", "4", "--steps", "1", "--rounds", "1"],
                       env=_env(), capture_output=True, text=True, timeout=120)
    _ok(p)
    assert "1 rank tree/s" in p.stdout and "wall-clock scaling: median" in p.stdout, p.stdout


@pytest.mark.parametrize("under_mpirun", [False, True])
def test_without_mpi4py_import_works_and_init_is_one_process_or_a_clear_error(under_mpirun):
    code = ("import sys; sys.modules['mpi4py'] = None\n"  # as if mpi4py were not installed
            "import dynagraph as dy\n"
            "print(dy.distributed.init())\n")
    env = {k: v for k, v in _env().items() if not k.startswith(("OMPI_COMM_WORLD", "PMI", "PMIX"))}
    if under_mpirun:
        env["OMPI_COMM_WORLD_SIZE"] = "2"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    if under_mpirun:
        assert p.returncode != 0 and "mpi4py is not installed; pip install 'dynagraph[mpi]'" in p.stderr, p.stderr
    else:
        _ok(p)
        assert p.stdout.strip() == "(0, 1)"
