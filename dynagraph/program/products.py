"""Grouped products: K products W_k x_k with different weights as one batched GEMM
against the stacked (K, n, X) weights, forward and backward."""
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
