"""Walk-through 5: memory planning inside a dy.block (ED-Batch's PQ-tree layout).

Inside an LSTM cell, the three gate logistics run as one kernel, and so do the two
products i*u and f*c. A batched kernel reads each operand list as one array: if the
operands already sit next to each other in memory, in kernel order, no copy is needed.
The planner chooses one memory order for all the block's variables that makes as many
lists consecutive as it can; what it cannot is copied (a gather).

    python examples/teach/05_memory_planning.py --out teach_out
writes 05_lstm_memory.html (every list in place) and 05_crossed_memory.html (two lists
that want opposite orders: one copy must remain).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import dynagraph as dy
from dynagraph.memory.layout import block_layouts

H = 4


def lstm_cell(pc, plan: str):
    W, U, b = pc.add_parameters((4 * H, H)), pc.add_parameters((4 * H, H)), pc.add_parameters(4 * H)

    def cell(x, h, c):
        g = dy.affine_transform([b, W, x, U, h])
        i, f, o = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(3))
        u = dy.tanh(g[3 * H:4 * H])
        c2 = dy.cmult(i, u) + dy.cmult(f, c)
        return dy.cmult(o, dy.tanh(c2)), c2
    return dy.block(cell, plan=plan)


def run_sequences(cell, E, sentences) -> float:
    dy.renew_cg()
    scores = []
    for words in sentences:
        h = c = dy.zeros(H)
        for w in words:
            h, c = cell(E[w], h, c)
        scores.append(dy.sum_elems(h))
    return dy.esum(scores).value()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="teach_out", help="folder for the pictures")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    sentences = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    values = {}
    for plan in (None, "naive", "planned"):
        dy.reset_random_seed(5)
        pc = dy.ParameterCollection()
        cell, E = lstm_cell(pc, plan), pc.add_lookup_parameters((10, H))
        values[plan or "none"] = run_sequences(cell, E, sentences)
    lay = block_layouts(cell)[0]  # the planned cell of the last loop
    print("1. the LSTM cell's planned memory layout:")
    print("   " + lay.describe().replace("\n", "\n   "))
    print(f"   values with plan None / naive / planned: {values['none']:.6f} {values['naive']:.6f} "
          f"{values['planned']:.6f} (agree: {np.allclose(list(values.values()), values['none'], rtol=1e-5)})")
    lstm = dy.viz.memory(lay, os.path.join(args.out, "05_lstm_memory.html"))
    print(f"   copies per call: {lstm['copies']} planned against {lstm['naive_copies']} naive -> {lstm['path']}")

    @dy.block
    def crossed(a, b):  # [a, b] for one product, [b, a] for the other: both cannot be in place
        return dy.cmult(dy.tanh(a), dy.tanh(b)), dy.cmult(dy.tanh(b), dy.tanh(a))
    dy.renew_cg()
    crossed(dy.zeros(H), dy.zeros(H))
    cross = dy.viz.memory(crossed, os.path.join(args.out, "05_crossed_memory.html"))
    print(f"2. a block whose two products want opposite orders: {cross['copies']} copy remains "
          f"({cross['naive_copies']} without planning) -> {cross['path']}")
    return {"lstm_copies": lstm["copies"], "lstm_naive": lstm["naive_copies"], "crossed_copies": cross["copies"],
            "values": values, "files": [lstm["path"], cross["path"]]}


if __name__ == "__main__":
    main()
