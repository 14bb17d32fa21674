"""Grouped products: K products W_k x_k with different weights as one batched GEMM
against the stacked (K, n, X) weights, forward and backward; and a product written
piece-major, (P, B, h), for the slices that read it."""
from __future__ import annotations


def products(name: str, ins: list):
    first = 1 if name == "affine" else 0
    return [(ins[k], ins[k + 1]) for k in range(first, len(ins) - 1, 2)]


def _as_group(x, spec, K: int):
    """(K or 1, rows, ...) view of a group argument."""
    if spec[0] == "same":
        return x[None]
    return x.reshape((K, x.shape[0] // K) + x.shape[1:])


def linear_forward(xp, name: str, ins: list, specs: list, K: int, B: int):
    """K products with different weights: one batched GEMM, (K, B, n)."""
    first = 1 if name == "affine" else 0
    y = None
    for k in range(first, len(ins) - 1, 2):
        w = ins[k]                                        # (K, n, X) stacked or (1, n, X) shared
        x = _as_group(ins[k + 1], specs[k + 1], K)     # (K, B, X) or (1, B, X)
        p = xp.matmul(x, w.transpose(0, 2, 1))
        y = p if y is None else y + p
    if name == "affine":
        b = ins[0]  # (K, n) stacked or (1, n) shared
        y = y + b[:, None, :]
    return xp.broadcast_to(y, (K, B, y.shape[-1])).reshape(K * B, -1)


def linear_backward(xp, name: str, ins: list, specs: list, g, want: tuple, K: int, B: int) -> list:
    g3 = g.reshape(K, B, -1)
    out = [None] * len(ins)
    first = 1 if name == "affine" else 0
    if name == "affine" and want[0]:
        gb = g3.sum(axis=1)                                   # (K, n)
        out[0] = gb if specs[0][0] == "weights" else gb.sum(axis=0, keepdims=True)
    for k in range(first, len(ins) - 1, 2):
        w = ins[k]
        x = _as_group(ins[k + 1], specs[k + 1], K)
        if want[k]:
            gw = xp.matmul(g3.transpose(0, 2, 1), x if x.shape[0] == K else xp.broadcast_to(x, (K,) + x.shape[1:]))
            out[k] = gw if specs[k][0] == "weights" else gw.sum(axis=0, keepdims=True)
        if want[k + 1]:
            gx = xp.matmul(g3, w)                             # (K, B, X)
            out[k + 1] = gx.reshape(K * B, -1) if x.shape[0] == K else gx.sum(axis=0)
    return out


def _rows(xp, x, B: int):
    return x if x.shape[0] == B else xp.broadcast_to(x, (B,) + x.shape[1:])


_STACK_MAX = 1 << 16  # weight elements up to which stacking the products' weights pays (below)


def pieces_forward(xp, name: str, ins: list, P: int, h: int, B: int):
    """sum_k W_k x_k (+ b) written as (P, B, h): slice p of every row is plane p, each plane a
    GEMM against the weight rows of piece p read in place (a transposed view, no copy). Small
    products (the weights up to _STACK_MAX elements: a TreeLSTM node cell at H=64) run as ONE
    batched GEMM instead: the inputs side by side, (B, sum X_k), against the weights' pieces
    stacked, (P, sum X_k, h), a copy that costs less than the second GEMM and the add (1.3x
    faster at B = 382); at H=512 the same copy (10 MB) took as long as the GEMMs."""
    prods = products(name, ins)
    dt = prods[0][1].dtype
    y3 = xp.empty((P, B, h), dtype=dt)
    if len(prods) > 1 and sum(w[0].size for w, _ in prods) <= _STACK_MAX:
        x = xp.concatenate([_rows(xp, xk, B) for _, xk in prods], axis=1)
        wt = xp.concatenate([w[0].reshape(P, h, -1) for w, _ in prods], axis=2).transpose(0, 2, 1)
        xp.matmul(x[None], xp.ascontiguousarray(wt), out=y3)
    else:
        for k, (w, x) in enumerate(prods):
            wt = w[0].reshape(P, h, -1).transpose(0, 2, 1)  # (P, X, h) views of W's rows
            if k == 0:
                xp.matmul(_rows(xp, x, B)[None], wt, out=y3)
            else:
                y3 += xp.matmul(_rows(xp, x, B)[None], wt)
    if name == "affine":
        b = ins[0]
        y3 += b.reshape(b.shape[0], P, h).transpose(1, 0, 2)
    return y3


def pieces_backward(xp, name: str, ins: list, y3, g3, need) -> list:
    """Gradients of pieces_forward's arguments from the (P, B, h) output gradient: the gradient
    laid out row-major once, (B, P h), then two plain GEMMs per product (dW = G^T x, dx = G W)
    instead of P-way batched ones and a (P, B, X) sum. need(position) -> bool."""
    P, B, h = y3.shape
    out = [None] * len(ins)
    if name == "affine" and need(0):
        out[0] = g3.sum(axis=1).reshape(1, P * h)
    prods = [k for k in range(1 if name == "affine" else 0, len(ins) - 1, 2)]
    if not any(need(k) or need(k + 1) for k in prods):
        return out
    g2 = xp.ascontiguousarray(g3.transpose(1, 0, 2)).reshape(B, P * h)
    for k in prods:
        w, x = ins[k], ins[k + 1]
        if need(k):
            gw = xp.outer(g2.sum(axis=0), x[0]) if x.shape[0] == 1 and B > 1 else g2.T @ x
            out[k] = gw.reshape((1,) + w.shape[1:])
        if need(k + 1):
            gx = g2 @ w[0]
            out[k + 1] = gx.sum(axis=0, keepdims=True) if x.shape[0] == 1 and B > 1 else gx
    return out
