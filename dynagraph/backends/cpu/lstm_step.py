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
from ...ops.cells import STATE_WIDTH
from ..._kernels import ffi
from .direct import _BASES, _ZERO_ROWS, _products_twin, _tgrad_fits
from .ffi import F32, F64, _fn, _p, _pi

_OP = OPS["lstm_step"]
_AFFINE = _products_twin("affine", 1)  # b + W x as direct_products.c makes it


def _plain(x, dt, rows: int, width: int) -> bool:
    return type(x) is np.ndarray and x.dtype == dt and x.flags.c_contiguous and x.shape == (rows, width)


def _takes(H: int, pre, rest: tuple) -> bool:
    """Every operand an exact C-contiguous float32/float64 array, one row per node (no broadcast
    row), W (1, 4H, H) shared (direct_batch.c's lstm_step checks the same)."""
    if type(pre) is not np.ndarray or pre.ndim != 2 or (pre.dtype != F32 and pre.dtype != F64):
        return False
    dt, B = pre.dtype, pre.shape[0]
    if not _plain(pre, dt, B, 4 * H):
        return False
    if not rest:
        return True
    W, prev = rest
    return (type(W) is np.ndarray and W.dtype == dt and W.flags.c_contiguous and W.shape == (1, 4 * H, H)
            and _plain(prev, dt, B, STATE_WIDTH * H))


def lstm_step_forward(xp, a, data, pre, *rest):
    H, fb = a
    if not _takes(H, pre, rest):
        return _OP.forward(xp, a, data, pre, *rest)
    dt, B = pre.dtype, pre.shape[0]
    if rest:
        W, prev = rest
        gates = _AFFINE(xp, (), None, pre, W, np.ascontiguousarray(prev[:, :H]))
        c_prev = np.ascontiguousarray(prev[:, H:2 * H])
    else:
        gates, c_prev = pre, None
    out = np.empty((B, STATE_WIDTH * H), dt)
    c, h, act = np.empty((B, H), dt), np.empty((B, H), dt), np.empty((B, 5 * H), dt)
    _fn("dg_lstm_fwd", dt)(_p(gates), ffi.NULL if c_prev is None else _p(c_prev), _p(c), _p(h), _p(act), B, H,
                           float(fb))
    out[:, :H], out[:, H:2 * H], out[:, 2 * H:] = h, c, act
    return out


def _pre_grad(H: int, y, g, c_prev):
    """(dpre, dc_prev or None): the fused kernel's backward from dh = g_h and dc = g_c + g_t (1 - t^2),
    then the activations' own gradients g_a added, each times its derivative (a (1 - a) for
    i, f, o; 1 - a^2 for g): backward_ops.c's lstm_step computes the same, in the same order."""
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


def _state_grad(H: int, W, dpre, dcp):
    """The previous state's gradient [dpre W | dc_prev | 0]: the product as the affine's input
    gradient is made (direct.py _products_backward: the small-rows kernel where it fits)."""
    B, dt = dpre.shape[0], dpre.dtype
    out = np.zeros((B, STATE_WIDTH * H), dt)
    if _tgrad_fits(W, dpre):
        gx = np.empty((B, H), dt)
        _fn("dg_rows_matvec_tgrad", dt)(_p(gx), ffi.new(_BASES[dt], [_p(W)]), _pi(_ZERO_ROWS), _pi(_ZERO_ROWS),
                                        _p(dpre), B, 4 * H, H)
    else:
        gx = dpre @ W[0]
    out[:, :H] = gx
    out[:, H:2 * H] = dcp
    return out


def lstm_step_backward(xp, a, data, xs, y, g, need):
    H = a[0]
    pre, rest = xs[0], tuple(xs[1:])
    if not (_takes(H, pre, rest) and _plain(g, pre.dtype, pre.shape[0], STATE_WIDTH * H)
            and _plain(y, pre.dtype, pre.shape[0], STATE_WIDTH * H)):
        return _OP.backward(xp, a, data, xs, y, g, need)
    c_prev = np.ascontiguousarray(rest[1][:, H:2 * H]) if rest else None
    dpre, dcp = _pre_grad(H, y, g, c_prev)
    out = [dpre if need[0] else None]
    if rest:
        W, prev = rest
        gW = None
        if need[1]:
            hp = np.ascontiguousarray(prev[:, :H])
            gW = WeightProduct(dpre, hp) if need[1] is DEFER else one_row(dpre.T @ hp)
        out += [gW, _state_grad(H, W, dpre, dcp) if need[2] else None]
    return tuple(out)
