"""Walk-through 3: a learned FSM batching policy (ED-Batch).

A TreeLSTM with two kinds of internal cell: at every step both kinds may be ready, and
the order in which they run decides how many batches are needed (DyNet's agenda rule
needs about twice the lower bound here). `dy.fsm.train` learns, by Q-learning on one recorded graph, a
table from "which types are ready" to "which type to run", and that policy then
schedules other graphs of the same model. The printout compares it with the fixed rules
on trees it has not seen; the policy table is a plain JSON file.

    python examples/teach/03_fsm_policy.py --out teach_out
writes 03_policy.json and 03_compare.html (depth, agenda, typewise and FSM side by side).
"""
from __future__ import annotations

import argparse
import os
import sys

import dynagraph as dy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples.workloads import WORKLOADS  # noqa: E402  (the benchmark models)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="teach_out", help="folder for the pictures")
    ap.add_argument("--episodes", type=int, default=150, help="Q-learning episodes")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    model = WORKLOADS["treelstm2type"](hidden=2, seed=0)

    train_graph = model.graph(model.instances(2, seed=1))
    print(f"1. training on a graph of {len(train_graph.pending_nodes())} nodes "
          f"(lower bound {dy.viz.lower_bound(train_graph)} batches)")
    policy = dy.fsm.train(train_graph, encoding="sort", episodes=args.episodes, progress=False)
    meta = policy.meta
    print(f"   after {meta['episodes']} episodes the greedy policy needs {meta['batches']} batches; "
          f"{len(policy.table)} states in its table, {len(policy.types)} node types")
    path = os.path.join(args.out, "03_policy.json")
    policy.save(path)
    print(f"   saved -> {path}")

    test_graph = model.graph(model.instances(2, seed=7))  # other trees, same model
    sched = dy.fsm.Scheduler(policy)
    counts = dy.viz.compare(test_graph, os.path.join(args.out, "03_compare.html"), fsm_policy=policy)
    print(f"2. on new trees ({counts['nodes']} nodes, lower bound {counts['lower_bound']}):")
    for name in ("depth", "agenda", "typewise", "fsm"):
        print(f"     {name:<9} {counts[name]:4d} batches  ({counts[name] / counts['lower_bound']:.2f}x the bound)")
    nodes = test_graph.pending_nodes()
    sched.schedule(test_graph, nodes)
    print(f"   policy decisions found in the table: {sched.hits}, fallback decisions: {sched.misses}")
    print(f"   side by side -> {counts['path']}")
    return {**{k: counts[k] for k in ("depth", "agenda", "typewise", "fsm", "lower_bound")},
            "hits": sched.hits, "misses": sched.misses, "files": [path, counts["path"]]}


if __name__ == "__main__":
    main()
