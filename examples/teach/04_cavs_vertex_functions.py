"""Walk-through 4: Cavs vertex functions. Declare the per-vertex computation F once,
give the input graphs as plain data, and dynagraph runs F once per *task*: all the
vertices, across every input graph, whose children are done.

    python examples/teach/04_cavs_vertex_functions.py --out teach_out
writes 04_cavs.html: the input trees, each vertex coloured by the task that ran it.
"""
from __future__ import annotations

import argparse
import os
import random

import numpy as np

import dynagraph as dy

H = 4


def random_children(rng: random.Random, leaves: int) -> list:
    """A random binary tree as children lists in post-order (children before parents)."""
    children: list = [[] for _ in range(leaves)]
    roots = list(range(leaves))
    while len(roots) > 1:
        k = rng.randrange(len(roots) - 1)
        children.append([roots[k], roots[k + 1]])
        roots[k:k + 2] = [len(children) - 1]
    return children


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="teach_out", help="folder for the pictures")
    ap.add_argument("--trees", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    dy.reset_random_seed(args.seed)
    pc = dy.ParameterCollection()
    W, U, b = pc.add_parameters((H, H)), pc.add_parameters((H, 2 * H)), pc.add_parameters(H)
    E = pc.add_lookup_parameters((20, H))

    @dy.cavs.vertex_function(arity=2, state=(H,))   # a missing child gathers zeros
    def cell(v):
        kids = dy.concatenate([v.gather(0), v.gather(1)])
        h = dy.tanh(dy.affine_transform([b, W, v.pull(), U, kids]))
        v.scatter(h)   # what the parent gathers
        v.push(h)      # what the outside world reads

    graphs = [random_children(rng, rng.randint(2, 5)) for _ in range(args.trees)]
    words = [[rng.randrange(20) for _ in g] for g in graphs]
    dy.renew_cg()
    out = dy.cavs.run(cell, graphs, pull=(E, words))
    roots = [out.push(s, len(g) - 1) for s, g in enumerate(graphs)]
    total = dy.esum([dy.sum_elems(r) for r in roots])
    value = total.value()
    vertices = sum(len(g) for g in graphs)
    print(f"1. {len(graphs)} trees, {vertices} vertices: F ran {out.tasks} times (one task per height)")
    for t, (name, members) in enumerate(out.task_vertices()):
        print(f"     task {t}: {name} on {len(members)} vertices {members}")

    def op_level(t: int, g: list, ws: list):  # the same model written op by op, for comparison
        kids = [op_level(c, g, ws) for c in g[t]] + [dy.zeros(H)] * (2 - len(g[t]))
        return dy.tanh(dy.affine_transform([b, W, E[ws[t]], U, dy.concatenate(kids)]))
    dy.renew_cg()
    ref = dy.esum([dy.sum_elems(op_level(len(g) - 1, g, ws)) for g, ws in zip(graphs, words)]).value()
    print(f"2. value {value:.6f}; the same model op by op: {ref:.6f} "
          f"(agree: {np.isclose(value, ref, rtol=1e-4)}), {dy.cg().stats.batches} batches op by op")
    info = dy.viz.cavs(out, graphs, os.path.join(args.out, "04_cavs.html"))
    print(f"3. picture -> {info['path']}")
    return {"tasks": out.tasks, "vertices": vertices, "value": value, "reference": ref, "files": [info["path"]]}


if __name__ == "__main__":
    main()
