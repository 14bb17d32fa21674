"""What automatic coarsening finds in the import-swap programs, and what finding it costs.

For each mini-batched workload of bench/import_swap.py (one graph of --batch-size samples,
recorded by the DyNet program text with dynagraph swapped in), prints the pending nodes,
the patterns found, the share of nodes they cover, the instances of the three largest
patterns, and the cost per node of detection, patterns and the unit schedule: the compiled
pass (dynagraph._coarsen.plan) and its pure-Python twins (best CPU time of --repeat), beside the
op-level scheduler's cost on the same nodes (what the pass replaces). Timing the
coarsened run against op-level runs is bench/import_swap.py's job:

    DYNAGRAPH_COARSEN=1 python bench/import_swap.py --suite minibatch --baseline . \\
        --baseline-env DYNAGRAPH_COARSEN=0 --threads 1

    python -m bench.coarsen_bench --workloads treelstm,treefc,bilstm --H 64

With --phases it also times both settings in one process, graph after graph, interleaved
(CPU time, median over --graphs graphs after two warm-up ones): forward with its
scheduling part (the compiled pass for coarsened graphs, the op-level scheduler
otherwise) and backward, and prints where the coarsened graph loses or wins.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time

import numpy as np


def _graph(dy, isw, workload: str, H: int, batch: int, seed: int):
    program, data = isw.MINIBATCH[workload]
    mod = importlib.import_module(f"bench.swap.{program}")
    samples, vocab, n_out = isw.load_data(data, batch, seed)
    model = mod.Model(dy.ParameterCollection(), H, vocab, n_out, np.random.default_rng(seed))
    cg = dy.renew_cg()
    model.begin()
    dy.esum([model.loss(s) for s in samples[:batch]])
    return cg


def _phase_graph(dy, model, samples: list, coarsen: bool) -> tuple:
    """(forward, backward) CPU seconds of one graph, coarsened or not, with the forward's
    scheduling part in wall seconds (what cg.stats.t_schedule measures)."""
    dy.config.set(coarsen=coarsen)
    cg = dy.renew_cg()
    model.begin()
    loss = dy.esum([model.loss(s) for s in samples])
    t0 = time.process_time()
    loss.value()
    t1 = time.process_time()
    loss.backward()
    t2 = time.process_time()
    return t1 - t0, cg.stats.t_schedule, t2 - t1


def phases(dy, isw, workload: str, H: int, batch: int, seed: int, graphs: int) -> dict:
    """Median ms per graph of forward, scheduling and backward, coarsened and op-level, the
    two settings alternating graph by graph on the same mini-batches (one process)."""
    program, data = isw.MINIBATCH[workload]
    mod = importlib.import_module(f"bench.swap.{program}")
    samples, vocab, n_out = isw.load_data(data, 4 * batch, seed)
    model = mod.Model(dy.ParameterCollection(), H, vocab, n_out, np.random.default_rng(seed))
    times: dict = {True: [], False: []}
    saved = dy.config.get()["coarsen"]
    try:
        for k in range(graphs + 2):
            part = samples[(k % 4) * batch:(k % 4 + 1) * batch]
            for coarsen in (False, True):
                t = _phase_graph(dy, model, part, coarsen)
                if k >= 2:
                    times[coarsen].append(t)
    finally:
        dy.config.set(coarsen=saved)
    out = {"workload": workload}
    for coarsen, label in ((True, "coarse"), (False, "op")):
        for j, phase in enumerate(("forward", "schedule", "backward")):
            out[f"{label}_{phase}_ms"] = 1e3 * float(np.median([t[j] for t in times[coarsen]]))
    return out


def _best(fn, repeat: int) -> float:
    """Best CPU time of `repeat` calls (wall time on a loaded machine charges the longer calls
    for every preemption)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
        gc.enable()
    return best


def _twins(cg, pending: list) -> list:
    """What the compiled pass does, in Python: patterns, then the unit schedule with payloads."""
    from dynagraph.coarsen import Coarsened, detect
    patterns, owner = detect.find_patterns(cg, pending)
    return Coarsened(cg, pending, patterns, owner).schedule() if patterns else []


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="treelstm,treefc,bilstm,mvrnn")
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--phases", action="store_true", help="also time forward/backward, coarsened vs op-level")
    ap.add_argument("--graphs", type=int, default=10, help="timed graphs per setting with --phases")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (0: the library default)")
    args = ap.parse_args(argv)
    import dynagraph as dy
    from dynagraph.coarsen import detect
    if args.threads > 0:
        dy.config.set(threads=args.threads)
    sys.modules["dynet"] = dy  # the programs import dynet
    from bench import import_swap as isw
    rows = []
    from dynagraph import schedulers
    print(f"{'workload':10} {'nodes':>7} {'patterns':>8} {'coarse':>7} {'largest patterns (instances x nodes)':<38} "
          f"{'C us/node':>9} {'py us/node':>10} {'op-level':>9}")
    for name in args.workloads.split(","):
        cg = _graph(dy, isw, name, args.H, args.batch_size, args.seed)
        pending = [i for i in range(len(cg)) if not cg.op[i].leaf]
        patterns, _ = detect.find_patterns(cg, pending)
        covered = sum(len(ms) for p in patterns for ms in p.members)
        top = sorted(patterns, key=lambda p: -len(p.roots) * len(p.members[0]))[:3]
        native = _best(lambda cg=cg, pending=pending: detect.plan_native(cg, pending), args.repeat) \
            if detect._NATIVE else float("nan")
        saved, detect._NATIVE = detect._NATIVE, None
        try:
            python = _best(lambda cg=cg, pending=pending: _twins(cg, pending), args.repeat)
        finally:
            detect._NATIVE = saved
        sched = schedulers.get(cg.scheduler)  # what the pass replaces: the op-level schedule
        op_level = _best(lambda cg=cg, pending=pending: sched.schedule(cg, pending), args.repeat)
        row = {"workload": name, "nodes": len(pending), "patterns": len(patterns), "coarse": covered / len(pending),
               "native_us": 1e6 * native / len(pending), "python_us": 1e6 * python / len(pending),
               "op_level_us": 1e6 * op_level / len(pending),
               "top": [(len(p.roots), len(p.members[0])) for p in top]}
        rows.append(row)
        tops = ", ".join(f"{b}x{n}" for b, n in row["top"])
        print(f"{name:10} {row['nodes']:7d} {row['patterns']:8d} {100 * row['coarse']:6.1f}% {tops:<38} "
              f"{row['native_us']:9.2f} {row['python_us']:10.2f} {row['op_level_us']:9.2f}")
    if args.phases:
        print(f"\nms a graph, coarsened / op-level, median of {args.graphs}: forward and backward in CPU time; "
              f"schedule (wall time, part of forward) is the compiled pass or the op-level scheduler")
        print(f"{'workload':10} {'forward':>15} {'schedule':>15} {'backward':>15} {'op/coarse':>10}")
        for name in args.workloads.split(","):
            ph = phases(dy, isw, name, args.H, args.batch_size, args.seed, args.graphs)
            ratio = (ph["op_forward_ms"] + ph["op_backward_ms"]) / (ph["coarse_forward_ms"] + ph["coarse_backward_ms"])
            ph["speedup"] = ratio
            cells = [f"{ph['coarse_' + k + '_ms']:6.1f} / {ph['op_' + k + '_ms']:5.1f}"
                     for k in ("forward", "schedule", "backward")]
            print(f"{name:10} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} {ratio:9.2f}x")
            next(r for r in rows if r["workload"] == name).update(ph)
    return rows


if __name__ == "__main__":
    main()
