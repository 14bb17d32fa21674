"""The vanilla LSTM cell after its affine_transform, as two ops.

DyNet's VanillaLSTMBuilder records a step as one affine_transform and thirteen
elementwise nodes (four gate slices, three logistics, two tanh, the forget bias, two
products and a sum). Per-sentence programs pay for every one of them at recording,
scheduling, execution and backward. These two ops compute the same numbers from the
stacked pre-activations `pre` = [i, f, o, g] (4H) with the same formulas in the same
order:

    lstm_c(pre[, c_prev]; H, fb) = s(f + fb) * c_prev + s(i) * tanh(g)   (no c_prev: s(i) * tanh(g))
    lstm_h(pre, c; H)            = s(o) * tanh(c)

s being the logistic function as the `logistic` op computes it. Each backward
recomputes the gate activations it needs from `pre` (cheaper than storing them).
"""
from __future__ import annotations

from .base import ELEMWISE, op, reduce_to
from .elementwise import _logistic


def _pre_shape(H, pre) -> None:
    if not isinstance(H, int) or H <= 0:
        raise ValueError(f"hidden size must be a positive int, got {H!r}")
    if pre != (4 * H,):
        raise ValueError(f"pre-activations must have shape ({4 * H},) (gates i, f, o, g of size {H}), got {pre}")


def _lstm_c_shape(a, pre, *c_prev):
    H = a[0]
    _pre_shape(H, pre)
    if len(c_prev) > 1:
        raise ValueError(f"takes pre-activations and at most one previous cell, got {1 + len(c_prev)} arguments")
    if c_prev and c_prev[0] != (H,):
        raise ValueError(f"the previous cell must have shape ({H},), got {c_prev[0]}")
    return (H,)


def _lstm_h_shape(a, pre, c):
    H = a[0]
    _pre_shape(H, pre)
    if c != (H,):
        raise ValueError(f"the cell must have shape ({H},), got {c}")
    return (H,)


@op("lstm_c", _lstm_c_shape, cost=ELEMWISE)
class LstmC:
    """attrs (H, forget_bias); arguments pre (4H) and optionally c_prev (H)."""

    def forward(xp, a, data, pre, *c_prev):
        H, fb = a
        ig = _logistic(xp, pre[:, :H])
        gg = xp.tanh(pre[:, 3 * H:4 * H])
        if not c_prev:
            return ig * gg
        a_f = pre[:, H:2 * H] + fb if fb != 0.0 else pre[:, H:2 * H]
        return _logistic(xp, a_f) * c_prev[0] + ig * gg

    def backward(xp, a, data, xs, y, g, need):
        H, fb = a
        pre = xs[0]
        ig = _logistic(xp, pre[:, :H])
        gg = xp.tanh(pre[:, 3 * H:4 * H])
        fg = None
        if len(xs) == 2:
            a_f = pre[:, H:2 * H] + fb if fb != 0.0 else pre[:, H:2 * H]
            fg = _logistic(xp, a_f)
        d_pre = None
        if need[0]:
            d_pre = xp.zeros((max(pre.shape[0], g.shape[0]), 4 * H), dtype=g.dtype)  # o: no gradient here
            d_pre[:, :H] = (1 - ig) * ig * (g * gg)
            d_pre[:, 3 * H:4 * H] = (1 - gg * gg) * (g * ig)
            if fg is not None:
                d_pre[:, H:2 * H] = (1 - fg) * fg * (g * xs[1])
            d_pre = reduce_to(d_pre, pre.shape)
        if fg is None:
            return (d_pre,)
        return d_pre, (reduce_to(g * fg, xs[1].shape) if need[1] else None)


@op("lstm_h", _lstm_h_shape, cost=ELEMWISE)
class LstmH:
    """attrs (H,); arguments pre (4H) and the cell c (H)."""

    def forward(xp, a, data, pre, c):
        H = a[0]
        return _logistic(xp, pre[:, 2 * H:3 * H]) * xp.tanh(c)

    def backward(xp, a, data, xs, y, g, need):
        H = a[0]
        pre, c = xs
        og = _logistic(xp, pre[:, 2 * H:3 * H])
        tc = xp.tanh(c)
        d_pre = d_c = None
        if need[0]:
            d_pre = xp.zeros((max(pre.shape[0], g.shape[0]), 4 * H), dtype=g.dtype)
            d_pre[:, 2 * H:3 * H] = (1 - og) * og * (g * tc)
            d_pre = reduce_to(d_pre, pre.shape)
        if need[1]:
            d_c = reduce_to((1 - tc * tc) * (g * og), c.shape)
        return d_pre, d_c
