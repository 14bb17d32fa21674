"""Elementwise, reduction and softmax-family kernels (forward and backward) over C."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..._kernels import ffi
from .ffi import BINARY, UNARY, _PTRS, _fn, _in, _index, _p, _pi, _real, _width


# ---------------------------------------------------------------- elementwise
def _opcode(table: dict, name: str) -> int:
    code = table.get(name)
    if code is None:
        raise ValueError(f"no compiled kernel {name!r}; have {sorted(table)}")
    return code


def unary_forward(name: str, x) -> np.ndarray:
    code = _opcode(UNARY, name)
    x = np.asarray(x)
    dt = _real(x.dtype, name)
    x = _in(x, dt)
    y = np.empty_like(x)
    _fn("dg_unary_fwd", dt)(code, _p(y), _p(x), x.size)
    return y


def unary_backward(name: str, x, y, g) -> np.ndarray:
    """g * f'(x) where y = f(x); x, y and g share one shape."""
    code = _opcode(UNARY, name)
    g = np.asarray(g)
    dt = _real(g.dtype, name)
    x, y, g = _in(x, dt), _in(y, dt), _in(g, dt)
    if not x.shape == y.shape == g.shape:
        raise ValueError(f"{name} backward: shapes differ: x {x.shape}, y {y.shape}, g {g.shape}")
    gx = np.empty_like(g)
    _fn("dg_unary_bwd", dt)(code, _p(gx), _p(x), _p(y), _p(g), g.size)
    return gx


def _lead_pair(x: np.ndarray, y: np.ndarray, what: str) -> int:
    """Batch size of a binary op whose operands have equal per-row shapes and lead 1 or B."""
    if x.shape[1:] != y.shape[1:] or x.ndim < 1:
        raise ValueError(f"{what}: per-row shapes differ: {x.shape[1:]} and {y.shape[1:]}")
    B = max(x.shape[0], y.shape[0])
    if x.shape[0] not in (1, B) or y.shape[0] not in (1, B):
        raise ValueError(f"{what}: batch sizes {x.shape[0]} and {y.shape[0]} do not broadcast")
    return B


def binary_forward(name: str, x, y) -> np.ndarray:
    """x op y for batched x (Bx, ...) and y (By, ...) with Bx, By in {1, B}."""
    code = _opcode(BINARY, name)
    x, y = np.asarray(x), np.asarray(y)
    dt = _real(np.result_type(x.dtype, y.dtype), name)
    x, y = _in(x, dt), _in(y, dt)
    B = _lead_pair(x, y, name)
    n = _width(x.shape[1:])
    out = np.empty((B,) + x.shape[1:], dt)
    _fn("dg_binary_fwd", dt)(code, _p(out), _p(x), n if x.shape[0] > 1 else 0,
                             _p(y), n if y.shape[0] > 1 else 0, B, n)
    return out


def binary_backward(name: str, x, y, out, g, need: Sequence[bool] = (True, True)) -> tuple:
    """(gx, gy), each shaped like its operand (a shared operand's gradient is summed
    over the batch); None where need is false. g and out have g.shape[0] rows."""
    code = _opcode(BINARY, name)
    g = np.asarray(g)
    dt = _real(g.dtype, name)
    x, y, g, out = _in(x, dt), _in(y, dt), _in(g, dt), _in(out, dt)
    _lead_pair(x, y, name)
    B, n = g.shape[0], _width(x.shape[1:])
    if g.shape[1:] != x.shape[1:] or out.shape != g.shape or any(s.shape[0] not in (1, B) for s in (x, y)):
        raise ValueError(f"{name} backward: g {g.shape}, out {out.shape} do not fit x {x.shape}, y {y.shape}")
    gx = np.empty(x.shape, dt) if need[0] else None
    gy = np.empty(y.shape, dt) if need[1] else None
    xs = n if x.shape[0] > 1 or B == 1 else 0
    ys = n if y.shape[0] > 1 or B == 1 else 0
    _fn("dg_binary_bwd", dt)(code, _p(gx) if gx is not None else ffi.NULL, _p(gy) if gy is not None else ffi.NULL,
                             _p(x), xs, _p(y), ys, _p(out), _p(g), B, n)
    return gx, gy


# ------------------------------------------------------------------- reductions
def sum_args(xs: Sequence, scale: float = 1.0) -> np.ndarray:
    """scale * (xs[0] + xs[1] + ...), each (1 or B, ...) with the same per-row shape."""
    if not xs:
        raise ValueError("sum_args needs at least one argument")
    arrs = [np.asarray(x) for x in xs]
    dt = _real(np.result_type(*arrs), "sum_args")
    arrs = [_in(a, dt) for a in arrs]
    tail = arrs[0].shape[1:]
    B = max(a.shape[0] for a in arrs)
    if any(a.shape[1:] != tail or a.shape[0] not in (1, B) for a in arrs):
        raise ValueError(f"sum_args: shapes {[a.shape for a in arrs]} do not broadcast along the batch")
    n = _width(tail)
    out = np.empty((B,) + tail, dt)
    strides = np.array([n if a.shape[0] > 1 else 0 for a in arrs], dtype=np.int64)
    bufs = [_p(a) for a in arrs]
    _fn("dg_sum_args", dt)(_p(out), ffi.new(_PTRS[dt], bufs), _pi(strides), len(arrs), B, n, float(scale))
    return out


def row_sums(x, mean: bool = False) -> np.ndarray:
    """(rows, ...) -> (rows, 1): the sum (or mean) of each row, in numpy's pairwise order."""
    x = np.asarray(x)
    dt = _real(x.dtype, "row_sums")
    x = _in(x, dt)
    rows, n = x.shape[0], _width(x.shape[1:])
    out = np.empty((rows, 1), dt)
    _fn("dg_row_sums", dt)(_p(out), _p(x), rows, n, n if mean else 1)
    return out


def col_sums(x) -> np.ndarray:
    """(rows, ...) -> (1, ...): the sum over the batch axis."""
    x = np.asarray(x)
    dt = _real(x.dtype, "col_sums")
    x = _in(x, dt)
    out = np.empty((1,) + x.shape[1:], dt)
    _fn("dg_col_sums", dt)(_p(out), _p(x), x.shape[0], _width(x.shape[1:]))
    return out


# ---------------------------------------------------------------- softmax family
def _matrix(x, what: str) -> np.ndarray:
    x = np.asarray(x)
    dt = _real(x.dtype, what)
    x = _in(x, dt)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"{what} takes (rows, classes) with classes > 0, got {x.shape}")
    return x


def _rowwise(name: str, x) -> np.ndarray:
    x = _matrix(x, name)
    y = np.empty_like(x)
    _fn(name, x.dtype)(_p(y), _p(x), x.shape[0], x.shape[1])
    return y


def _rowwise_grad(name: str, y, g) -> np.ndarray:
    y = _matrix(y, name)
    g = _in(g, y.dtype)
    if g.shape != y.shape:
        raise ValueError(f"{name}: gradient shape {g.shape} differs from output shape {y.shape}")
    gx = np.empty_like(y)
    _fn(name, y.dtype)(_p(gx), _p(y), _p(g), y.shape[0], y.shape[1])
    return gx


def softmax_forward(x) -> np.ndarray:
    return _rowwise("dg_softmax_fwd", x)


def softmax_backward(y, g) -> np.ndarray:
    return _rowwise_grad("dg_softmax_bwd", y, g)


def log_softmax_forward(x) -> np.ndarray:
    return _rowwise("dg_log_softmax_fwd", x)


def log_softmax_backward(y, g) -> np.ndarray:
    return _rowwise_grad("dg_log_softmax_bwd", y, g)


def pickneglogsoftmax_forward(x, labels) -> np.ndarray:
    """(rows, 1) losses -log softmax(x[r])[labels[r]]; x may be one shared row (1, n)."""
    x = _matrix(x, "pickneglogsoftmax")
    lab = _index(labels, x.shape[1], "pickneglogsoftmax labels")
    rows = lab.shape[0]
    if x.shape[0] not in (1, rows):
        raise ValueError(f"pickneglogsoftmax: {x.shape[0]} rows of scores for {rows} labels")
    loss = np.empty((rows, 1), x.dtype)
    work = np.empty(x.shape[1], x.dtype)
    # The row stride is 0 only for one shared row: a (0, n) x with no labels is not
    # shared (its buffer holds no row to read).
    _fn("dg_pnls_fwd", x.dtype)(_p(loss), _p(work), _p(x), x.shape[1] if x.shape[0] == rows else 0,
                                _pi(lab), rows, x.shape[1])
    return loss


def pickneglogsoftmax_backward(x, labels, g) -> np.ndarray:
    """Gradient shaped like x: (softmax(x) - onehot) * g per row, summed when x is shared."""
    x = _matrix(x, "pickneglogsoftmax")
    lab = _index(labels, x.shape[1], "pickneglogsoftmax labels")
    rows = lab.shape[0]
    g = _in(g, x.dtype).reshape(-1)
    if x.shape[0] not in (1, rows) or g.shape[0] != rows:
        raise ValueError(f"pickneglogsoftmax backward: x {x.shape}, {rows} labels, g of {g.shape[0]}")
    gx = np.empty_like(x)
    _fn("dg_pnls_bwd", x.dtype)(_p(gx), _p(x), x.shape[1] if x.shape[0] == rows else 0,
                                _pi(lab), _p(g), rows, x.shape[1])
    return gx
