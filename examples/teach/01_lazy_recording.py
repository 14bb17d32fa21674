"""Walk-through 1: lazy recording. Writing per-sample code computes nothing; dynagraph
records every operation, and only `.value()` runs them, batched across samples.

    python examples/teach/01_lazy_recording.py --out teach_out
writes teach_out/01_recorded.svg (the recorded graph, coloured by the batches it will
run in) and teach_out/01_schedule.html (step through what ran).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import dynagraph as dy

SENTENCES = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]  # three samples of different lengths


def record(pc_params, scheduler: str):
    """A tiny RNN per sentence, h = tanh(W h + E[w]); returns the sum of the three scores."""
    W, E = pc_params
    dy.renew_cg(scheduler=scheduler)
    scores = []
    for words in SENTENCES:  # ordinary per-sample Python: loops of different lengths
        h = dy.zeros(4)
        for w in words:
            h = dy.tanh(W * h + E[w])
        scores.append(dy.sum_elems(h))
    return dy.esum(scores)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="teach_out", help="folder for the pictures")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    dy.reset_random_seed(1)
    pc = dy.ParameterCollection()
    params = (pc.add_parameters((4, 4)), pc.add_lookup_parameters((10, 4)))

    total = record(params, "agenda")
    cg = dy.cg()
    print(f"1. recorded {len(cg.pending_nodes())} operations; batches run so far: {cg.stats.batches}")
    print("   the first few recorded nodes (nothing computed yet):")
    for line in cg.print_graph().splitlines()[:6]:
        print("     " + line)
    drawn = dy.viz.graph(cg, os.path.join(args.out, "01_recorded.svg"))
    print(f"2. drew the plan: {drawn['nodes']} nodes in {drawn['batches']} batches -> {drawn['path']}")

    value = total.value()  # now the graph runs: one kernel per batch, across all three sentences
    print(f"3. .value() = {value:.6f}; ran {cg.stats.batches} batches for {cg.stats.nodes} nodes "
          f"(lower bound {cg.stats.lower_bound})")
    if cg.stats.kernel_calls > cg.stats.batches:
        # the cpu backend runs a small batch whose rows lie in several blocks node by node:
        # cheaper than copying them together first (executor.SPLIT_MAX)
        print(f"   in {cg.stats.kernel_calls} kernel calls: small batches whose arguments lie apart "
              f"ran node by node, cheaper than gathering them")
    cg.print_batches()
    viewer = dy.viz.schedule(cg, os.path.join(args.out, "01_schedule.html"))
    print(f"   step-by-step viewer -> {viewer['path']}")

    reference = record(params, "none")  # the same program, one node at a time
    ref_value = reference.value()
    print(f"4. node by node: {dy.cg().stats.batches} kernels, value {ref_value:.6f} "
          f"(batched and unbatched agree: {np.isclose(value, ref_value, rtol=1e-5)})")
    return {"nodes": drawn["nodes"], "batches": cg.stats.batches, "unbatched": dy.cg().stats.batches,
            "value": value, "reference": ref_value, "files": [drawn["path"], viewer["path"]]}


if __name__ == "__main__":
    main()
