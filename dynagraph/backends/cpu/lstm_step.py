"""lstm_step on the cpu backend: the recurrent product as the affine direct kernel makes it, the
cell by the fused LSTM kernel (gates.inc dg_lstm_fwd / dg_lstm_bwd).

These are the twins of the compiled batch steps: direct_batch.c's DIRECT_LSTM_STEP and
backward_ops.c's NB_LSTM_STEP make the same decisions and call the same kernels, so both leave
the same bits. Any operand they do not take (another dtype, a broadcast row, a view, a
per-node weight) runs the op's own numpy code (ops/cells.py), the reference.

The state per node is [h | c | i f o g tanh(c)]; the kernel's act is its last 5H.
"""
from __future__ import annotations

import numpy as np

from ...ops.base import DEFER, OPS, WeightProduct, one_row
from ...ops.cells import STATE_WIDTH, chains
from ..._kernels import ffi
from .direct import _products_twin, _tgrad_fits, small_product_grad
from .ffi import F32, F64, _fn, _p

_OP = OPS["lstm_step"]
_AFFINE = _products_twin("affine", 1)  # b + W x as direct_products.c makes it


def _plain(x, dt, rows: int, width: int) -> bool:
    return type(x) is np.ndarray and x.dtype == dt and x.flags.c_contiguous and x.shape == (rows, width)


def _takes(H: int, K: int, xs: tuple) -> bool:
    """Every operand an exact C-contiguous float32/float64 array, one row per node (no broadcast
    row), each W (1, 4H, H) shared (direct_step.c checks the same)."""
    pre = xs[0]
    if type(pre) is not np.ndarray or pre.ndim != 2 or (pre.dtype != F32 and pre.dtype != F64):
        return False
    dt, B = pre.dtype, pre.shape[0]
    if not all(_plain(x, dt, B, 4 * H) for x in xs[:K]):
        return False
    if len(xs) == K:
        return True
    return (all(type(W) is np.ndarray and W.dtype == dt and W.flags.c_contiguous and W.shape == (1, 4 * H, H)
                for W in xs[K:2 * K]) and _plain(xs[2 * K], dt, B, K * STATE_WIDTH * H))


def lstm_step_forward(xp, a, data, *xs):
    H, fb, K = a[0], a[1], chains(a)
    if not _takes(H, K, xs):
        return _OP.forward(xp, a, data, *xs)
    dt, B, S = xs[0].dtype, xs[0].shape[0], STATE_WIDTH * H
    out = np.empty((B, K * S), dt)
    for k in range(K):
        if len(xs) > K:
            prev = xs[2 * K][:, k * S:(k + 1) * S]
            gates = _AFFINE(xp, (), None, xs[k], xs[K + k], np.ascontiguousarray(prev[:, :H]))
            c_prev = np.ascontiguousarray(prev[:, H:2 * H])
        else:
            gates, c_prev = xs[k], None
        c, h, act = np.empty((B, H), dt), np.empty((B, H), dt), np.empty((B, 5 * H), dt)
        _fn("dg_lstm_fwd", dt)(_p(gates), ffi.NULL if c_prev is None else _p(c_prev), _p(c), _p(h), _p(act), B, H,
                               float(fb))
        o = out[:, k * S:(k + 1) * S]
        o[:, :H], o[:, H:2 * H], o[:, 2 * H:] = h, c, act
    return out


def _pre_grad(H: int, y, g, c_prev):
    """(dpre, dc_prev or None) of one chain (y, g: its state and the state's gradient): the fused
    kernel's backward from dh = g_h and dc = g_c + g_t (1 - t^2), then the activations' own
    gradients g_a added, each times its derivative (a (1 - a) for i, f, o; 1 - a^2 for g):
    backward_step.c computes the same, in the same order."""
    dt, B = g.dtype, g.shape[0]
    act = np.ascontiguousarray(y[:, 2 * H:])
    tc = y[:, 6 * H:]
    dc = g[:, H:2 * H] + g[:, 6 * H:] * (1 - tc * tc)
    dh = np.ascontiguousarray(g[:, :H])
    dpre = np.empty((B, 4 * H), dt)
    dcp = np.empty((B, H), dt) if c_prev is not None else None
    _fn("dg_lstm_bwd", dt)(_p(act), ffi.NULL if c_prev is None else _p(c_prev), _p(dh), _p(dc), _p(dpre),
                           ffi.NULL if dcp is None else _p(dcp), B, H)
    a3, ag = act[:, :3 * H], act[:, 3 * H:4 * H]
    dpre[:, :3 * H] += g[:, 2 * H:5 * H] * (a3 * (1 - a3))
    dpre[:, 3 * H:] += g[:, 5 * H:6 * H] * (1 - ag * ag)
    return dpre, dcp


def _product_grad(W, dpre):
    """dpre W[0], as the affine's input gradient is made (direct.py _products_backward: the
    small-rows kernel where it fits)."""
    return small_product_grad(W, dpre) if _tgrad_fits(W, dpre) else dpre @ W[0]


def lstm_step_backward(xp, a, data, xs, y, g, need):
    H, K = a[0], chains(a)
    S = STATE_WIDTH * H
    if not (_takes(H, K, tuple(xs)) and _plain(g, xs[0].dtype, xs[0].shape[0], K * S)
            and _plain(y, xs[0].dtype, xs[0].shape[0], K * S)):
        return _OP.backward(xp, a, data, xs, y, g, need)
    full = len(xs) > K
    B, dt = xs[0].shape[0], xs[0].dtype
    d_pres, d_ws = [], []
    d_prev = np.zeros((B, K * S), dt) if full and need[2 * K] else None
    for k in range(K):
        sl = slice(k * S, (k + 1) * S)
        prev = xs[2 * K][:, sl] if full else None
        dpre, dcp = _pre_grad(H, y[:, sl], g[:, sl], np.ascontiguousarray(prev[:, H:2 * H]) if full else None)
        d_pres.append(dpre if need[k] else None)
        if not full:
            continue
        gW = None
        if need[K + k]:
            hp = np.ascontiguousarray(prev[:, :H])
            gW = WeightProduct(dpre, hp) if need[K + k] is DEFER else one_row(dpre.T @ hp)
        d_ws.append(gW)
        if d_prev is not None:
            d_prev[:, k * S:k * S + H] = _product_grad(xs[K + k], dpre)
            d_prev[:, k * S + H:k * S + 2 * H] = dcp
    return tuple(d_pres) if not full else tuple(d_pres + d_ws + [d_prev])
