"""Op-level adapters: C kernels installed in place of an op's numpy code where measured faster."""
from __future__ import annotations

import numpy as np

from ...ops.base import OPS
from ..._kernels import ffi
from .ffi import BINARY, F32, UNARY, _BUF, _fn, _in, _p
from .rows import take_rows
from .elementwise import (binary_backward, binary_forward, log_softmax_backward, log_softmax_forward,
    pickneglogsoftmax_backward, pickneglogsoftmax_forward, row_sums, softmax_backward, softmax_forward, sum_args)


# ============================================================ op-level adapters
# Same signatures as an op's forward/backward. An adapter takes the C path only for
# batches where bench/kernels.py measured it faster (float32/float64 numpy arrays of
# a size in the winning range, per-row shapes equal, leading axes 1 or B) and runs the
# op's own numpy code otherwise, so installing one never changes which programs run.
#
# What the measurements say (2-core AVX-512 machine, numpy 2.4, float32): numpy's
# ufuncs cost ~0.5-1 us a call and run AVX-512 loops, so a single-pass C kernel
# (tanh, exp, add, cmult forward) never wins; a kernel wins where it fuses several
# numpy passes (float32 logistic, which numpy computes as 0.5 tanh(x/2) + 0.5; the
# softmax family, unary backward, shared-operand gradients, row sums) on enough
# elements to amortise the ~2 us cffi call, or where numpy needs one call per source
# block or an unbuffered add.at (the row movers).
def _is_real(*arrs) -> bool:
    dt = arrs[0].dtype if type(arrs[0]) is np.ndarray else None
    return dt in _BUF and all(type(a) is np.ndarray and a.dtype == dt for a in arrs)


def _exp_worth(x: np.ndarray, n: int) -> bool:
    """Kernels computing exp/tanh: float32 uses the vectorized dg_expf and wins unless
    rows are long (n >= 1000); float64 calls libm per element and wins only while the
    call overhead dominates (<= 1024 elements)."""
    return n < 1000 if x.dtype == F32 else x.size <= 1024


# Minimum batch elements for the C path, from the benchmark table. The logistic wins in
# float32 only (float64 calls libm's tanh per element: 5-8x slower than numpy).
UNARY_FWD_MIN = {"rectify": 8192, "logistic": 1024}
UNARY_FWD_F32_ONLY = {"logistic"}
UNARY_BWD_MIN = {"tanh": 16384, "logistic": 16384, "rectify": 16384}
CMULT_SHARED_BWD_MIN = 16384
ROW_SUMS_MIN = 4096


def _unary_forward(name: str, min_size: int):
    op, code = OPS[name], UNARY[name]
    f32_only = name in UNARY_FWD_F32_ONLY

    def forward(xp, a, data, x):
        if not _is_real(x) or x.size < min_size or f32_only and x.dtype != F32:
            return op.forward(xp, a, data, x)
        x = _in(x, x.dtype)
        y = np.empty_like(x)
        _fn("dg_unary_fwd", x.dtype)(code, _p(y), _p(x), x.size)
        return y
    return forward


def _unary_backward(name: str, min_size: int):
    op, code = OPS[name], UNARY[name]

    def backward(xp, a, data, xs, y, g, need):
        x = xs[0]
        if not (_is_real(x, y, g) and x.shape == y.shape == g.shape) or g.size < min_size:
            return op.backward(xp, a, data, xs, y, g, need)
        dt = g.dtype
        x, y, g = _in(x, dt), _in(y, dt), _in(g, dt)
        gx = np.empty_like(g)
        _fn("dg_unary_bwd", dt)(code, _p(gx), _p(x), _p(y), _p(g), g.size)
        return (gx,)
    backward.unary_min = (name, min_size)  # what backward.py's native step checks it stands for
    return backward


def _binary_fits(x, y, B: int) -> bool:
    return x.shape[1:] == y.shape[1:] and x.ndim >= 2 and x.shape[0] in (1, B) and y.shape[0] in (1, B)


def _binary_forward(name: str, min_size: int):
    op = OPS[name]

    def forward(xp, a, data, x, y):
        if not _is_real(x, y) or max(x.size, y.size) < min_size \
                or not _binary_fits(x, y, max(x.shape[0], y.shape[0])):
            return op.forward(xp, a, data, x, y)
        return binary_forward(name, x, y)
    return forward


def _binary_backward(name: str, min_size: int, shared_only: bool):
    op = OPS[name]

    def backward(xp, a, data, xs, out, g, need):
        x, y = xs
        if not _is_real(x, y, out, g) or g.size < min_size or not _binary_fits(x, y, g.shape[0]) \
                or g.shape != out.shape or g.shape[1:] != x.shape[1:] \
                or (shared_only and x.shape[0] == y.shape[0] == g.shape[0]):
            return op.backward(xp, a, data, xs, out, g, need)
        return binary_backward(name, x, y, out, g, need)
    return backward


def _esum_forward(xp, a, data, *xs):
    if not (_is_real(*xs) and len({x.shape[1:] for x in xs}) == 1 and xs[0].ndim >= 2):
        return OPS["esum"].forward(xp, a, data, *xs)
    return sum_args(xs)


def _row_sums_forward(name: str, mean: bool, min_size: int):
    op = OPS[name]

    def forward(xp, a, data, x):
        if not _is_real(x) or x.size < min_size:
            return op.forward(xp, a, data, x)
        return row_sums(x, mean)
    return forward


def _columns(x) -> bool:
    """Whether x is a real (B, n) or (B, n, 1, ...) array: softmax along its first per-node axis is
    the kernels' row-wise softmax of its (B, n) view (attention's scores are an (n, 1) column)."""
    return _is_real(x) and x.ndim >= 2 and all(d == 1 for d in x.shape[2:])


def _softmax_forward(xp, a, data, x):
    if a[0] != 0 or not _columns(x) or not _exp_worth(x, x.shape[1]):
        return OPS["softmax"].forward(xp, a, data, x)
    return softmax_forward(x.reshape(x.shape[:2])).reshape(x.shape)


def _softmax_backward(xp, a, data, xs, y, g, need):
    """The kernel at every size (backward_shaped.c's NB_SOFTMAX stands for this: per sentence the
    compiled step takes it without a Python frame, where numpy's three calls cost more)."""
    if a[0] != 0 or not (_columns(y) and _is_real(g)) or y.shape != g.shape:
        return OPS["softmax"].backward(xp, a, data, xs, y, g, need)
    return (softmax_backward(y.reshape(y.shape[:2]), g.reshape(g.shape[:2])).reshape(y.shape),)


def _colwise_add_backward(xp, a, data, xs, y, g, need):
    """dx = g, db = g's rows summed by dg_row_sums (numpy's pairwise order), for x of g's shape
    (B, r, c) and b (B, r) or (B, r, 1); backward_shaped.c's NB_COLWISE stands for this."""
    x, b = xs
    if not (_is_real(x, b, g) and g.ndim == 3 and x.shape == g.shape and b.shape[0] == g.shape[0]
            and b.shape[1:] in ((g.shape[1],), (g.shape[1], 1))):
        return OPS["colwise_add"].backward(xp, a, data, xs, y, g, need)
    gb = row_sums(g.reshape(-1, g.shape[2])).reshape(b.shape) if need[1] else None
    return (g if need[0] else None, gb)


def _log_softmax_forward(xp, a, data, x):
    if a[0] is not None or not _is_real(x) or x.ndim != 2 or not _exp_worth(x, x.shape[1]):
        return OPS["log_softmax"].forward(xp, a, data, x)
    return log_softmax_forward(x)


def _log_softmax_backward(xp, a, data, xs, y, g, need):
    if not _is_real(y, g) or y.ndim != 2 or y.shape != g.shape or not _exp_worth(y, y.shape[1]):
        return OPS["log_softmax"].backward(xp, a, data, xs, y, g, need)
    return (log_softmax_backward(y, g),)


def _pnls_forward(xp, a, data, x):
    if not _is_real(x) or x.ndim != 2 or x.shape[0] not in (1, len(data)) or not _exp_worth(x, x.shape[1]):
        return OPS["pickneglogsoftmax"].forward(xp, a, data, x)
    return pickneglogsoftmax_forward(x, data)


def _pnls_backward(xp, a, data, xs, y, g, need):
    x = xs[0]
    if not _is_real(x, g) or x.ndim != 2 or x.shape[0] not in (1, len(data)) or g.size != len(data) \
            or not _exp_worth(x, x.shape[1]):
        return OPS["pickneglogsoftmax"].backward(xp, a, data, xs, y, g, need)
    return (pickneglogsoftmax_backward(x, data, g),)


def _lookup_forward(xp, a, data, table):
    if not _is_real(table) or table.shape[0] != 1:
        return OPS["lookup"].forward(xp, a, data, table)
    return take_rows(table[0], data)


# ------------------------------------------------------- the fused LSTM cell ops
# lstm_c / lstm_h (ops/cells.py) replace thirteen elementwise nodes that ran as one C
# elementwise run; their numpy code is ~5-10 ufunc calls a batch, one pass each. One C
# pass over the rows wins for the per-sentence batches (a few rows of H = 64-256). The
# C path takes unbroadcast batches only (every argument and the gradient with the same
# row count); a shared (broadcast) row takes the op's numpy code, which reduces it.
# float64 transcendental calls go to libm per element, so large float64 batches, where
# numpy's vector loops win, stay numpy too.
LSTM_F64_MAX = 512


def _lstm_fits(pre, *rows) -> bool:
    """Whether the C path takes this batch; a plain loop, as it runs once per op call."""
    if type(pre) is not np.ndarray or pre.ndim != 2:
        return False
    dt, n = pre.dtype, pre.shape[0]
    if dt not in _BUF:
        return False
    for r in rows:
        if type(r) is not np.ndarray or r.dtype != dt or r.ndim != 2 or r.shape[0] != n:
            return False
    return dt == F32 or pre.size <= LSTM_F64_MAX


def _lstm_c_forward(xp, a, data, pre, *c_prev):
    if not _lstm_fits(pre, *c_prev):
        return OPS["lstm_c"].forward(xp, a, data, pre, *c_prev)
    H, fb = a
    dt = pre.dtype
    pre = _in(pre, dt)
    cp = _in(c_prev[0], dt) if c_prev else None
    c = np.empty((pre.shape[0], H), dt)
    _fn("dg_lstmc_fwd", dt)(_p(pre), ffi.NULL if cp is None else _p(cp), _p(c), pre.shape[0], H, float(fb))
    return c


def _lstm_c_backward(xp, a, data, xs, y, g, need):
    if not _lstm_fits(xs[0], *xs[1:], g):
        return OPS["lstm_c"].backward(xp, a, data, xs, y, g, need)
    H, fb = a
    dt = g.dtype
    pre, g = _in(xs[0], dt), _in(g, dt)
    cp = _in(xs[1], dt) if len(xs) == 2 else None
    B = pre.shape[0]
    dpre = np.empty((B, 4 * H), dt)  # the kernel writes every slot (o: zero); cheaper than skipping it
    dcp = np.empty((B, H), dt) if cp is not None else None
    _fn("dg_lstmc_bwd", dt)(_p(pre), ffi.NULL if cp is None else _p(cp), _p(g), _p(dpre),
                            ffi.NULL if dcp is None else _p(dcp), B, H, float(fb))
    if cp is None:
        return (dpre if need[0] else None,)
    return (dpre if need[0] else None), (dcp if need[1] else None)


def _lstm_h_forward(xp, a, data, pre, c):
    if not _lstm_fits(pre, c):
        return OPS["lstm_h"].forward(xp, a, data, pre, c)
    H, dt = a[0], pre.dtype
    pre, c = _in(pre, dt), _in(c, dt)
    h = np.empty((pre.shape[0], H), dt)
    _fn("dg_lstmh_fwd", dt)(_p(pre), _p(c), _p(h), pre.shape[0], H)
    return h


def _lstm_h_backward(xp, a, data, xs, y, g, need):
    pre, c = xs
    if not _lstm_fits(pre, c, g):
        return OPS["lstm_h"].backward(xp, a, data, xs, y, g, need)
    H, dt = a[0], g.dtype
    pre, c, g = _in(pre, dt), _in(c, dt), _in(g, dt)
    B = pre.shape[0]
    dpre = np.empty((B, 4 * H), dt) if need[0] else None
    dc = np.empty((B, H), dt) if need[1] else None
    _fn("dg_lstmh_bwd", dt)(_p(pre), _p(c), _p(g), ffi.NULL if dpre is None else _p(dpre),
                            ffi.NULL if dc is None else _p(dc), B, H)
    return dpre, dc


def all_forward_kernels(min_size: int = 0) -> dict:
    """Every op-level forward adapter by op name, taking the C path from `min_size`
    elements on (0: always, as the tests and the benchmark use them)."""
    k = {name: _unary_forward(name, min_size) for name in UNARY}
    k.update({name: _binary_forward(name, min_size) for name in BINARY})
    k.update(esum=_esum_forward, softmax=_softmax_forward, log_softmax=_log_softmax_forward,
             pickneglogsoftmax=_pnls_forward, sum_elems=_row_sums_forward("sum_elems", False, min_size),
             mean_elems=_row_sums_forward("mean_elems", True, min_size), lookup=_lookup_forward,
             lstm_c=_lstm_c_forward, lstm_h=_lstm_h_forward)
    return k


def all_backward_kernels(min_size: int = 0) -> dict:
    k = {name: _unary_backward(name, min_size) for name in UNARY}
    k.update({name: _binary_backward(name, min_size, False) for name in BINARY})
    k.update(softmax=_softmax_backward, log_softmax=_log_softmax_backward, pickneglogsoftmax=_pnls_backward,
             lstm_c=_lstm_c_backward, lstm_h=_lstm_h_backward, colwise_add=_colwise_add_backward)
    return k


def installed_kernels() -> tuple:
    """(forward, backward) overrides CpuBackend installs: the measured winners only."""
    fwd = {name: _unary_forward(name, m) for name, m in UNARY_FWD_MIN.items()}
    fwd.update(softmax=_softmax_forward, log_softmax=_log_softmax_forward, pickneglogsoftmax=_pnls_forward,
               sum_elems=_row_sums_forward("sum_elems", False, ROW_SUMS_MIN),
               mean_elems=_row_sums_forward("mean_elems", True, ROW_SUMS_MIN),
               lstm_c=_lstm_c_forward, lstm_h=_lstm_h_forward)
    bwd = {name: _unary_backward(name, m) for name, m in UNARY_BWD_MIN.items()}
    bwd.update(cmult=_binary_backward("cmult", CMULT_SHARED_BWD_MIN, True), softmax=_softmax_backward,
               log_softmax=_log_softmax_backward, pickneglogsoftmax=_pnls_backward,
               lstm_c=_lstm_c_backward, lstm_h=_lstm_h_backward, colwise_add=_colwise_add_backward)
    return fwd, bwd
