"""Trainer rules over C: SGD, momentum, Adagrad and Adam in one pass, dense or per row."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..._kernels import ffi, lib
from .ffi import _PTRS, _fn, _in, _index, _out, _p, _pi, _real_of, _width


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


# ------------------------------------------------------- a whole collection per call
RULES = {"sgd": lib.DG_RULE_SGD, "momentum": lib.DG_RULE_MOMENTUM, "adagrad": lib.DG_RULE_ADAGRAD,
         "adam": lib.DG_RULE_ADAM}
FROZEN, DENSE, ROWS = lib.DG_MODE_FROZEN, lib.DG_MODE_DENSE, lib.DG_MODE_ROWS


class CollectionStep:
    """A trainer's update() of every parameter of a collection in one C call (dg_optim_step):
    the global gradient norm, clipping, the rule, and clearing the gradients, per-sentence
    programs call it once per sentence. Built once for a fixed set of arrays, which it keeps
    alive (it holds C pointers into them); the trainer rebuilds it when any array changes.

    entries: per parameter (w, g, states, touched mask or None, mode FROZEN/DENSE/ROWS), in
    the collection's order. Every array must be a C-contiguous float32 or float64 numpy
    array of one dtype (states shaped like w); anything else raises ValueError here, once."""

    def __init__(self, rule: str, entries: Sequence[tuple]):
        if rule not in RULES:
            raise ValueError(f"optimizer rule {rule!r}: compiled collection steps exist for {sorted(RULES)}")
        self.rule = RULES[rule]
        n = len(entries)
        dt = _real_of(entries[0][0], "collection step weights") if n else np.dtype(np.float64)
        ptrs, nrows, width, modes = _PTRS[dt], [], [], []
        w, g, s0, s1, touched = (ffi.new(ptrs, n), ffi.new(ptrs, n), ffi.new(ptrs, n), ffi.new(ptrs, n),
                                 ffi.new("uint8_t *[]", n))
        keep = []
        for k, (wk, gk, states, mask, mode) in enumerate(entries):
            _out(wk, dt, "collection step weights")
            _out(gk, dt, "collection step gradient")
            if gk.shape != wk.shape or len(states) > 2:
                raise ValueError(f"collection step: gradient {gk.shape} or states do not fit weights {wk.shape}")
            w[k], g[k] = _p(wk), _p(gk)
            for slot, s in zip((s0, s1), states):
                _out(s, dt, "collection step state")
                if s.shape != wk.shape:
                    raise ValueError(f"collection step: state shape {s.shape} differs from weights {wk.shape}")
                slot[k] = _p(s)
            rows = wk.shape[0] if wk.ndim else 1
            if mask is not None:
                if not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (rows,)
                        and mask.flags.c_contiguous and mask.flags.writeable):
                    raise ValueError(f"collection step: touched mask must be a writeable bool array of {rows} rows")
                touched[k] = ffi.cast("uint8_t *", ffi.from_buffer(mask))
            elif mode == ROWS:
                raise ValueError("collection step: a row-wise update needs a touched mask")
            nrows.append(rows)
            width.append(wk.size // rows if rows else 0)
            modes.append(int(mode))
            keep.append((wk, gk, states, mask))
        self._fn = _fn("dg_optim_step", dt)
        self._args = (n, w, g, s0, s1, ffi.new("int64_t[]", nrows), ffi.new("int64_t[]", width), touched,
                      ffi.new("int64_t[]", modes))
        self._keep = keep  # the arrays the pointers point into
        self._out = ffi.new("double[3]")
        self._hp = ffi.new("double[6]")

    def __call__(self, hp: Sequence[float], clip: float) -> tuple:
        """(finite, squared norm, clipped): with finite False nothing was written."""
        h = self._hp
        for i, x in enumerate(hp):
            h[i] = x
        out = self._out
        bad = self._fn(*self._args, self.rule, h, float(clip), out)
        return not bad, out[0], out[2] != 0.0
