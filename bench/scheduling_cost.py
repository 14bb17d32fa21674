"""Scheduling cost per node: one schedule() call of each scheduler on one recorded graph.

    python bench/scheduling_cost.py                              # nerlattice, 32 lattices
    python bench/scheduling_cost.py --workload latticelstm --instances 32 --reps 40

Times are CPU time of the calling thread (time.thread_time), best of --reps: the
schedulers are single-threaded C calls, and on a shared machine wall time mostly
measures the neighbours. "fsm" is an untrained FSM (settling plus the fallback rule,
the same G_a work as a trained one). Prints a Markdown table with ratios to agenda.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import dynagraph as dy  # noqa: E402
from dynagraph import schedulers  # noqa: E402
from dynagraph.schedulers import fsm as _fsm, typewise as _typewise  # noqa: E402,F401  (register)
from examples.workloads import WORKLOADS  # noqa: E402

SCHEDULERS = ["depth", "agenda", "agenda+merge", "typewise", "fsm"]


def best_cpu_ms(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return 1e3 * best


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="nerlattice", choices=list(WORKLOADS))
    ap.add_argument("--instances", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args(argv)
    dy.config.set(threads=1)
    w = WORKLOADS[args.workload](hidden=args.hidden, seed=0)
    cg = w.graph(w.instances(args.instances, seed=2))
    cg._sync_values()
    nodes = [i for i in range(cg.done, len(cg)) if not cg.op[i].leaf]
    rows = []
    for name in SCHEDULERS:
        sched = schedulers.get(name)
        batches = sched.schedule(cg, nodes)
        schedulers.validate(cg, nodes, batches, name)
        rows.append({"scheduler": name, "batches": len(batches), "ms": best_cpu_ms(lambda: sched.schedule(cg, nodes), args.reps)})
    agenda = next(r for r in rows if r["scheduler"] == "agenda")
    print(f"{args.workload}, {args.instances} instances, {len(nodes)} pending nodes, CPU ms best of {args.reps}\n")
    print("| scheduler | batches | ms per call | us per node | x agenda |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['scheduler']} | {r['batches']} | {r['ms']:.2f} | {1e3 * r['ms'] / len(nodes):.3f} | "
              f"{r['ms'] / agenda['ms']:.2f} |")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
