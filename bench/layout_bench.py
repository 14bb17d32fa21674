"""Memory layout planning for static subgraphs, in the spirit of ED-Batch's Table 2.

For each cell (a dy.block), compare the naive layout (variables in step order, a
gather per batched operand list) with the PQ-tree plan: memory kernels and bytes
copied per call (batch 8, hidden 64, float32), and the planning time.

    .venv/bin/python -m bench.layout_bench [--hidden 64] [--batch 8] [--describe CELL]

The plan is not executed yet: Plan.forward still runs one op per step, so these
are the copies the executor *would* make with batched steps, naive vs planned.
"""
from __future__ import annotations

import argparse
import statistics

import dynagraph as dy
from dynagraph.memory.layout import block_layouts


def _lstm(pc, H):
    W, U, b = pc.add_parameters((4 * H, H)), pc.add_parameters((4 * H, H)), pc.add_parameters(4 * H)

    def cell(x, h, c):
        g = dy.affine_transform([b, W, x, U, h])
        i, f, o = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(3))
        c2 = dy.cmult(i, dy.tanh(g[3 * H:])) + dy.cmult(f, c)
        return dy.cmult(o, dy.tanh(c2)), c2
    return cell, [H, H, H]


def _gru(pc, H):
    W, U, b = pc.add_parameters((2 * H, H)), pc.add_parameters((2 * H, H)), pc.add_parameters(2 * H)
    Wh, Uh, bh = pc.add_parameters((H, H)), pc.add_parameters((H, H)), pc.add_parameters(H)

    def cell(x, h):
        g = dy.affine_transform([b, W, x, U, h])
        r, z = dy.logistic(g[:H]), dy.logistic(g[H:])
        hh = dy.tanh(dy.affine_transform([bh, Wh, x, Uh, dy.cmult(r, h)]))
        return h + dy.cmult(z, hh - h)
    return cell, [H, H]


def _treelstm_node(pc, H):
    Ul, Ur, b = pc.add_parameters((5 * H, H)), pc.add_parameters((5 * H, H)), pc.add_parameters(5 * H)

    def node(hl, cl, hr, cr):
        g = dy.affine_transform([b, Ul, hl, Ur, hr])
        i, fl, fr, o = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(4))
        c = dy.cmult(i, dy.tanh(g[4 * H:])) + dy.cmult(fl, cl) + dy.cmult(fr, cr)
        return dy.cmult(o, dy.tanh(c)), c
    return node, [H, H, H, H]


def _treelstm_leaf(pc, H):
    E, W, b = pc.add_lookup_parameters((100, H)), pc.add_parameters((3 * H, H)), pc.add_parameters(3 * H)

    def leaf(w):
        g = dy.affine_transform([b, W, E[w]])
        c = dy.cmult(dy.logistic(g[:H]), dy.tanh(g[2 * H:]))
        return dy.cmult(dy.logistic(g[H:2 * H]), dy.tanh(c)), c
    return leaf, ["index"]


def _treegru_node(pc, H):
    Ul, Ur, b = pc.add_parameters((5 * H, H)), pc.add_parameters((5 * H, H)), pc.add_parameters(5 * H)
    Wl, Wr, bh = pc.add_parameters((H, H)), pc.add_parameters((H, H)), pc.add_parameters(H)

    def node(hl, hr):
        g = dy.affine_transform([b, Ul, hl, Ur, hr])
        rl, rr, zl, zr, zh = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(5))
        hh = dy.tanh(dy.affine_transform([bh, Wl, dy.cmult(rl, hl), Wr, dy.cmult(rr, hr)]))
        return dy.cmult(zl, hl) + dy.cmult(zr, hr) + dy.cmult(zh, hh)
    return node, [H, H]


def _treegru_leaf(pc, H):
    E, W, b = pc.add_lookup_parameters((100, H)), pc.add_parameters((2 * H, H)), pc.add_parameters(2 * H)

    def leaf(w):
        g = dy.affine_transform([b, W, E[w]])
        return dy.cmult(dy.logistic(g[:H]), dy.tanh(g[H:]))
    return leaf, ["index"]


def _mvrnn(pc, H):
    W1, W2, b = pc.add_parameters((H, H)), pc.add_parameters((H, H)), pc.add_parameters(H)
    WM1, WM2 = pc.add_parameters((H, H)), pc.add_parameters((H, H))

    def node(a, A, bv, B):
        p = dy.tanh(dy.affine_transform([b, W1, B * a, W2, A * bv]))
        return p, WM1 * A + WM2 * B
    return node, [H, (H, H), H, (H, H)]


CELLS = {"LSTMCell": _lstm, "GRUCell": _gru, "TreeLSTM internal": _treelstm_node,
         "TreeLSTM leaf": _treelstm_leaf, "TreeGRU internal": _treegru_node,
         "TreeGRU leaf": _treegru_leaf, "MV-RNN": _mvrnn}


def layout_of(name: str, H: int, B: int, repeats: int = 5):
    """(layout, median planning ms) for one cell."""
    dy.renew_cg()
    fn, args = CELLS[name](dy.ParameterCollection(), H)
    blk = dy.block(fn, name=name)
    blk(*[3 if a == "index" else dy.zeros(a) for a in args])
    runs = [block_layouts(blk, batch_size=B)[0] for _ in range(repeats)]
    return runs[-1], statistics.median(r.plan_ms for r in runs)


def table(H: int = 64, B: int = 8) -> list:
    rows = []
    for name in CELLS:
        lay, ms = layout_of(name, H, B)
        rows.append((name, lay.naive_kernels, lay.kernels, lay.naive_bytes, lay.bytes, ms, len(lay.conflicts)))
    return rows


def _ratio(a: int, b: int) -> str:
    return "inf" if b == 0 and a else "1.00" if b == 0 else f"{a / b:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--describe", choices=list(CELLS), help="print the planned layout of one cell")
    a = ap.parse_args()
    if a.describe:
        print(layout_of(a.describe, a.hidden, a.batch, repeats=1)[0].describe())
        return
    print(f"batch {a.batch}, hidden {a.hidden}, float32; naive -> planned (ratio naive/planned)")
    print(f"{'cell':18} {'mem kernels/call':>22} {'bytes copied/call':>28} {'plan ms':>8} {'dropped':>7}")
    for name, nk, k, nb, b, ms, c in table(a.hidden, a.batch):
        print(f"{name:18} {nk:>6} -> {k:<4} ({_ratio(nk, k):>5}) {nb:>9} -> {b:<8} ({_ratio(nb, b):>5}) "
              f"{ms:8.1f} {c:7}")


if __name__ == "__main__":
    main()
