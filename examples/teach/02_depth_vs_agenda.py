"""Walk-through 2: depth against agenda. Two ways to decide what runs together.

`depth` (TensorFlow Fold) batches nodes with the same signature at the same depth
(longest path from the inputs). `agenda` (DyNet) keeps the ready nodes per signature
and runs the signature whose nodes are, on average, the shallowest. On trees of
different shapes they differ: depth never merges a leaf's work with an internal
node's work at another height, agenda can.

    python examples/teach/02_depth_vs_agenda.py --out teach_out
writes 02_depth.svg, 02_agenda.svg and 02_compare.html (both side by side, with the
lower bound: no schedule needs fewer batches).
"""
from __future__ import annotations

import argparse
import os
import random

import dynagraph as dy

H = 4


def random_tree(rng: random.Random, leaves: int):
    """A random binary tree as nested pairs; leaves are word ids."""
    items = [rng.randrange(10) for _ in range(leaves)]
    while len(items) > 1:
        k = rng.randrange(len(items) - 1)
        items[k:k + 2] = [(items[k], items[k + 1])]
    return items[0]


def make_recorder(trees, scheduler: str):
    pc = dy.ParameterCollection()
    W, E, w_out = pc.add_parameters((H, 2 * H)), pc.add_lookup_parameters((10, H)), pc.add_parameters((1, H))

    def encode(t):
        if isinstance(t, int):
            return dy.tanh(E[t])                                              # a leaf
        return dy.tanh(W * dy.concatenate([encode(t[0]), encode(t[1])]))    # an internal node

    def record():
        dy.renew_cg(scheduler=scheduler)
        scores = [w_out * encode(t) for t in trees]
        dy.esum(scores)
        return dy.cg()
    return record


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="teach_out", help="folder for the pictures")
    ap.add_argument("--trees", type=int, default=3)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    trees = [random_tree(rng, rng.randint(2, 5)) for _ in range(args.trees)]
    print("trees:", *trees, sep="\n  ")
    counts = {}
    for name in ("depth", "agenda"):
        cg = make_recorder(trees, name)()
        info = dy.viz.graph(cg, os.path.join(args.out, f"02_{name}.svg"))
        counts[name] = info["batches"]
        by_op = {}
        for batch in dy.viz.schedule_of(cg):
            by_op.setdefault(cg.op[batch[0]].name, []).append(len(batch))
        print(f"{name:>6}: {info['batches']} batches (lower bound {info['lower_bound']}); batch sizes per op:")
        for op, sizes in by_op.items():
            print(f"          {op:<12} {sizes}")
    both = dy.viz.compare(make_recorder(trees, "agenda"), os.path.join(args.out, "02_compare.html"),
                          schedulers=("depth", "agenda"))
    print(f"side by side -> {both['path']}: depth {both['depth']}, agenda {both['agenda']}, "
          f"lower bound {both['lower_bound']}")
    return {"depth": counts["depth"], "agenda": counts["agenda"], "lower_bound": both["lower_bound"],
            "files": [os.path.join(args.out, f) for f in ("02_depth.svg", "02_agenda.svg", "02_compare.html")]}


if __name__ == "__main__":
    main()
