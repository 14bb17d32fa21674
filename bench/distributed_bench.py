"""TreeLSTM training throughput with dy.distributed on 1 and on 2 MPI ranks.

    python bench/distributed_bench.py                       # H=256, 64 trees per rank, 3 interleaved rounds
    python bench/distributed_bench.py --H 64 --steps 3 --rounds 2

Each round runs one plain process (1 rank, 64 trees a step) and then `mpirun -np 2`
(2 ranks, 64 trees each a step, gradients all-reduced), each in its own process with
one BLAS thread per rank. Throughput is trees trained per second (after one untimed
warm-up step); scaling = throughput(2) / throughput(1), efficiency = scaling / 2.
"comm+wait" is the share of the 2-rank run spent inside the gradient collectives,
including waiting for the slower rank (shards differ in tree sizes); "all-reduce"
is the share the all-reduce alone takes once the ranks are in step: the most that
overlapping it with the backward pass could win.

Needs mpirun (OpenMPI) and mpi4py (`pip install -e '.[mpi]'`). On a machine whose
cores are busy with other work the 2-rank figure drops: read the ratios, not the
absolute numbers, and compare rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python bench/distributed_bench.py` puts bench/, not the repo, on the path
    sys.path.insert(0, ROOT)


def worker(a: argparse.Namespace) -> None:
    """One rank: train `steps` mini-batches of `batch` trees per rank; rank 0 prints a JSON line."""
    import dynagraph as dy
    from bench import params, workloads
    from bench.dy_models import DyModel

    dy.config.set(threads=1)
    rank, size = dy.distributed.init()
    w = workloads.WORKLOADS["treelstm"]
    samples, vocab = workloads.load("treelstm", a.batch * size * (a.steps + 1), seed=0)
    arrays = params.init_arrays(w.kind, a.H, vocab, w.n_out, seed=0)
    model = DyModel(dy, w.kind, arrays, lr=0.01)
    trainer = dy.distributed.DataParallelTrainer(model.trainer)
    model.trainer = trainer
    batches = [dy.distributed.shard(b) for b in workloads.minibatches(samples, a.batch * size)]
    model.step(batches[0], train=True)  # warm-up: allocations, first-use compilation
    trainer.comm_seconds = 0.0
    dy.distributed.barrier()
    t0 = time.perf_counter()
    for b in batches[1:]:
        model.step(b, train=True)
    dy.distributed.barrier()
    wall = time.perf_counter() - t0
    # The all-reduce alone, ranks already in step: what overlapping it with the backward
    # pass could hide at most (comm_seconds above also holds waiting for the slower rank).
    dy.distributed.barrier()
    t1 = time.perf_counter()
    for _ in range(3):
        trainer.allreduce_gradients()
    reduce_s = (time.perf_counter() - t1) / 3
    model.pc.reset_gradient()
    if dy.distributed.is_main():
        print(json.dumps({"ranks": size, "trees_per_s": a.batch * size * a.steps / wall, "wall": wall,
                          "comm_share": trainer.comm_seconds / wall,
                          "reduce_share": reduce_s * a.steps / wall}), flush=True)


def launch(ranks: int, a: argparse.Namespace) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--H", str(a.H), "--batch", str(a.batch),
           "--steps", str(a.steps)]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--H", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="trees per rank per step")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per run (after 1 warm-up)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved 1-rank / 2-rank rounds")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if shutil.which("mpirun") is None:
        raise SystemExit("mpirun not found: install OpenMPI (Debian: openmpi-bin libopenmpi-dev)")
    from tqdm import tqdm
    rows = []
    for r in tqdm(range(a.rounds), desc="rounds"):
        one, two = launch(1, a), launch(2, a)
        rows.append((r + 1, one, two))
    print(f"\nTreeLSTM training, H={a.H}, {a.batch} trees per rank per step, {a.steps} timed steps, "
          f"1 BLAS thread per rank, {os.cpu_count()} cores")
    print(f"{'round':>5} {'1 rank tree/s':>14} {'2 ranks tree/s':>15} {'scaling':>8} {'efficiency':>10} {'comm+wait':>9} {'all-reduce':>10}")
    for r, one, two in rows:
        s = two["trees_per_s"] / one["trees_per_s"]
        print(f"{r:>5} {one['trees_per_s']:>14.1f} {two['trees_per_s']:>15.1f} {s:>7.2f}x {s / 2:>9.0%} "
              f"{two['comm_share']:>9.1%} {two['reduce_share']:>10.1%}")
    best = max(two["trees_per_s"] / one["trees_per_s"] for _, one, two in rows)
    med = sorted(two["trees_per_s"] / one["trees_per_s"] for _, one, two in rows)[len(rows) // 2]
    print(f"median scaling {med:.2f}x, best {best:.2f}x (target >= 1.7x with 2 ranks)")


if __name__ == "__main__":
    main()
