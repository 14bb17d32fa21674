"""Trainer rules over C: SGD, momentum, Adagrad and Adam in one pass, dense or per row."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..._kernels import ffi
from .ffi import _fn, _in, _index, _out, _p, _pi, _real_of, _width


# ----------------------------------------------------------------- trainer rules
def _rule_args(w: np.ndarray, g, states: Sequence[np.ndarray], rows, what: str) -> tuple:
    """Validated (g, row index array or None, nrows, width) for an in-place rule."""
    dt = _real_of(w, what)
    _out(w, dt, f"{what} weights")
    if type(g) is not np.ndarray or g.dtype != dt or not g.flags.c_contiguous:  # the trainer's case skips a copy check
        g = _in(g, dt)
    if g.shape != w.shape:
        raise ValueError(f"{what}: gradient shape {g.shape} differs from weights {w.shape}")
    for s in states:
        _out(s, dt, f"{what} state")
        if s.shape != w.shape:
            raise ValueError(f"{what}: state shape {s.shape} differs from weights {w.shape}")
    if rows is None:
        return g, None, 1, w.size
    r = _index(rows, w.shape[0] if w.ndim else 1, f"{what} rows")
    # strictly increasing (a trainer's touched_rows()) is distinct without sorting
    if r.size > 1 and not (r[1:] > r[:-1]).all() and np.unique(r).shape[0] != r.shape[0]:
        raise ValueError(f"{what}: rows must be distinct (each row is updated once)")
    return g, r, r.shape[0], _width(w.shape[1:])


def _rows_ptr(r):
    return ffi.NULL if r is None else _pi(r)


def sgd_update(w: np.ndarray, g, lr_scaled: float, rows=None) -> None:
    """SimpleSGDTrainer: w -= g * (lr * gscale); pass lr_scaled = lr * gscale."""
    g, r, nrows, width = _rule_args(w, g, (), rows, "sgd")
    _fn("dg_sgd", w.dtype)(_p(w), _p(g), _rows_ptr(r), nrows, width, float(lr_scaled))


def momentum_update(w: np.ndarray, g, v: np.ndarray, mom: float, lr_scaled: float, rows=None) -> None:
    """MomentumSGDTrainer: v = mom v - g * (lr * gscale); w += v."""
    g, r, nrows, width = _rule_args(w, g, (v,), rows, "momentum")
    _fn("dg_momentum", w.dtype)(_p(w), _p(g), _p(v), _rows_ptr(r), nrows, width, float(mom), float(lr_scaled))


def adagrad_update(w: np.ndarray, g, h: np.ndarray, lr: float, eps: float, gscale: float, rows=None) -> None:
    """AdagradTrainer: g *= gscale; h += g^2; w -= g / sqrt(h + eps) * lr."""
    g, r, nrows, width = _rule_args(w, g, (h,), rows, "adagrad")
    _fn("dg_adagrad", w.dtype)(_p(w), _p(g), _p(h), _rows_ptr(r), nrows, width, float(lr), float(eps), float(gscale))


def adam_update(w: np.ndarray, g, m: np.ndarray, v: np.ndarray, beta1: float, beta2: float, eps: float,
                lr_t: float, gscale: float, rows=None) -> None:
    """AdamTrainer with DyNet's bias correction folded into lr_t (computed by the trainer)."""
    g, r, nrows, width = _rule_args(w, g, (m, v), rows, "adam")
    _fn("dg_adam", w.dtype)(_p(w), _p(g), _p(m), _p(v), _rows_ptr(r), nrows, width, float(beta1), float(beta2),
                            float(eps), float(lr_t), float(gscale))
