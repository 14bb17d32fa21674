"""The cells of ED-Batch's Table 2 as dy.block bodies, shared by the layout bench and the tests.

Each entry builds (cell function, argument specs) from a ParameterCollection and a
hidden size; an argument spec is a shape (an expression argument) or "index" (a
word id). `LSTMCell (4 weights)` keeps one weight matrix per gate, so that batching
inside the block has to stack weights: its four products become one batched GEMM.
"""
from __future__ import annotations

import dynagraph as dy


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


def _lstm_split(pc, H):
    Ws = [pc.add_parameters((H, H)) for _ in range(4)]
    Us = [pc.add_parameters((H, H)) for _ in range(4)]
    bs = [pc.add_parameters(H) for _ in range(4)]

    def cell(x, h, c):
        i, f, o, u = (dy.affine_transform([b, W, x, U, h]) for b, W, U in zip(bs, Ws, Us))
        c2 = dy.cmult(dy.logistic(i), dy.tanh(u)) + dy.cmult(dy.logistic(f), c)
        return dy.cmult(dy.logistic(o), dy.tanh(c2)), c2
    return cell, [H, H, H]


CELLS = {"LSTMCell": _lstm, "LSTMCell (4 weights)": _lstm_split, "GRUCell": _gru, "TreeLSTM internal": _treelstm_node,
         "TreeLSTM leaf": _treelstm_leaf, "TreeGRU internal": _treegru_node,
         "TreeGRU leaf": _treegru_leaf, "MV-RNN": _mvrnn}
