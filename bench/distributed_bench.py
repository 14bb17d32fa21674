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
overlapping it with the backward pass could win. "cpu-time scaling" divides trees by the
CPU seconds of the busiest rank instead of wall seconds: an estimate of the scaling on
cores nobody else uses (it leaves out waiting, so it is an upper bound when the cores
are free, and the better guide when they are shared).

Needs mpirun (OpenMPI) and mpi4py (`pip install -e '.[mpi]'`). On a machine whose
cores are busy with other work the 2-rank figure drops: read the ratios, not the
absolute numbers, and compare rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
    # Split points balance the trees' node counts, so neither rank waits long in update().
    batches = [dy.distributed.shard(b, cost=lambda t: len(t.words))
               for b in workloads.minibatches(samples, a.batch * size)]
    model.step(batches[0], train=True)  # warm-up: allocations, first-use compilation
    trainer.comm_seconds = 0.0
    dy.distributed.barrier()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for b in batches[1:]:
        model.step(b, train=True)
    cpu = time.process_time() - cpu0  # this rank's own work, whatever else shares the cores
    dy.distributed.barrier()
    wall = time.perf_counter() - t0
    cpus = dy.distributed.allgather_object(cpu)
    busiest_cpu = max(cpus)
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
                          "reduce_share": reduce_s * a.steps / wall,
                          "trees_per_cpu_s": a.batch * size * a.steps / busiest_cpu,
                          "imbalance": busiest_cpu / (sum(cpus) / len(cpus))}), flush=True)


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
    ap.add_argument("--steps", type=int, default=8, help="timed steps per run (after 1 warm-up)")
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
    print(f"{'round':>5} {'1 rank tree/s':>14} {'2 ranks tree/s':>15} {'scaling':>8} {'efficiency':>10} "
          f"{'comm+wait':>9} {'all-reduce':>10} {'cpu-time scaling':>16} {'imbalance':>9}")
    for r, one, two in rows:
        s = two["trees_per_s"] / one["trees_per_s"]
        c = two["trees_per_cpu_s"] / one["trees_per_cpu_s"]
        print(f"{r:>5} {one['trees_per_s']:>14.1f} {two['trees_per_s']:>15.1f} {s:>7.2f}x {s / 2:>9.0%} "
              f"{two['comm_share']:>9.1%} {two['reduce_share']:>10.1%} {c:>15.2f}x {two['imbalance']:>9.2f}")
    for name, key in (("wall-clock", "trees_per_s"), ("cpu-time", "trees_per_cpu_s")):
        ratios = [two[key] / one[key] for _, one, two in rows]
        print(f"{name} scaling: median {statistics.median(ratios):.2f}x, best {max(ratios):.2f}x "
              f"(target >= 1.7x with 2 ranks)")
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        print(f"note: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; the ranks shared their "
              f"cores with other work, so wall-clock scaling understates what 2 free cores give")


if __name__ == "__main__":
    main()
