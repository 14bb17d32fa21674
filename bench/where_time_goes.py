"""Where dynagraph's time goes on one workload: the graph's own time split plus cProfile.

    python bench/where_time_goes.py --workload treelstm --H 64 --scheduler agenda [--mode train] [--top 25]

Runs `--batches` minibatches (after one warm-up) in this process, prints
cg.stats' split (record / schedule / execute / memory / backward, and the
trainer update) and the functions with the most own time.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import dynagraph as dy  # noqa: E402
from bench import params, workloads  # noqa: E402
from bench.dy_models import DyModel  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="treelstm", choices=list(workloads.WORKLOADS))
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--scheduler", default="agenda")
    ap.add_argument("--mode", default="train", choices=["train", "infer"])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=25, help="functions to list (0: no cProfile)")
    args = ap.parse_args(argv)
    dy.config.set(threads=args.threads)
    w = workloads.WORKLOADS[args.workload]
    samples, vocab = workloads.load(w.name, (args.batches + 1) * args.batch_size, seed=0)
    batches = workloads.minibatches(samples, args.batch_size)
    model = DyModel(dy, w.kind, params.init_arrays(w.kind, args.H, vocab, w.n_out), 1e-3,
                    {"scheduler": args.scheduler})
    train = args.mode == "train"
    model.step(batches[0], train)
    total, timer, stats = 0.0, {}, dy.stats.Stats()
    prof = cProfile.Profile() if args.top else None
    for b in batches[1:]:
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        model.step(b, train, timer)
        total += time.perf_counter() - t0
        if prof:
            prof.disable()
        stats.merge(dy.cg().stats)
    print_split(stats, timer.get("update", 0.0), total, len(batches) - 1, args)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


def print_split(s, update: float, total: float, n: int, args) -> None:
    parts = {"record": s.t_record, "schedule": s.t_schedule, "execute (fwd kernels)": s.t_execute,
             "memory (gather/scatter)": s.t_memory, "backward kernels": s.t_backward, "update": update}
    parts["other (untimed)"] = total - sum(parts.values())
    print(f"{args.workload} {args.mode} H={args.H} scheduler={args.scheduler}: {n} steps of "
          f"{args.batch_size}, {total / n * 1e3:.1f} ms/step, {n * args.batch_size / total:.1f} samples/s"
          f"{' (under cProfile)' if args.top else ''}")
    print(f"  nodes/step {s.nodes // n}, batches/step {s.batches // n}, kernels/step {s.kernel_calls // n}, "
          f"gathers/step {s.gathers // n}, scatters/step {s.scatters // n}")
    for k, v in parts.items():
        print(f"  {k:<24}{v / n * 1e3:9.1f} ms {100 * v / total:5.1f}%")


if __name__ == "__main__":
    main()
