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

A third op, lstm_step, is a whole step of one LSTM layer whose input products were made
beforehand (the builders' hoisted W_x x for every word): the recurrent product, the cell
and the output in one node,

    lstm_step(pre_x[, W_h, s_prev]; H, fb) = s = [h | c | i f o g tanh(c)]   (7H)
        gates = pre_x + W_h h_prev, h_prev = s_prev[:H], c_prev = s_prev[H:2H]

with the formulas above. The state carries the activations, so the backward needs no
recomputation. Per sentence a bidirectional LSTM step was six small batches (two products
that cannot share a batch, their weights differing, then lstm_c and lstm_h, each run node
by node because the two directions' products lie in two blocks); it is two.
"""
from __future__ import annotations

from .base import DEFER, ELEMWISE, GEMM, WeightProduct, op, one_row, reduce_to
from .elementwise import _logistic
from .linalg import mm


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


STATE_WIDTH = 7  # lstm_step's value per node, in units of H: h, c and the five activations


def _lstm_step_shape(a, pre, *rest):
    H = a[0]
    _pre_shape(H, pre)
    if len(rest) not in (0, 2):
        raise ValueError(f"takes the input pre-activations alone, or with the recurrent weight and the previous "
                         f"state, got {1 + len(rest)} arguments")
    if rest:
        W, prev = rest
        if W != (4 * H, H):
            raise ValueError(f"the recurrent weight must have shape ({4 * H}, {H}), got {W}")
        if prev != (STATE_WIDTH * H,):
            raise ValueError(f"the previous state must have shape ({STATE_WIDTH * H},) (an lstm_step's value), got {prev}")
    return (STATE_WIDTH * H,)


@op("lstm_step", _lstm_step_shape, cost=GEMM, deferred_weights=(1,))
class LstmStep:
    """attrs (H, forget_bias); arguments pre_x (4H), then optionally W_h (4H, H) and the previous
    state (7H). The value is [h | c | i f o g tanh(c)]."""

    def forward(xp, a, data, pre, *rest):
        H, fb = a
        if rest:
            W, prev = rest
            gates = mm(xp, W, prev[:, :H]) + pre
        else:
            gates = pre
        ig = _logistic(xp, gates[:, :H])
        fg = _logistic(xp, gates[:, H:2 * H] + fb)
        og = _logistic(xp, gates[:, 2 * H:3 * H])
        gg = xp.tanh(gates[:, 3 * H:4 * H])
        c = fg * rest[1][:, H:2 * H] + ig * gg if rest else ig * gg
        tc = xp.tanh(c)
        return xp.concatenate([og * tc, c, xp.broadcast_to(ig, c.shape), xp.broadcast_to(fg, c.shape),
                               xp.broadcast_to(og, c.shape), xp.broadcast_to(gg, c.shape), tc], axis=1)

    def backward(xp, a, data, xs, y, g, need):
        H = a[0]
        pre = xs[0]
        ig, fg, og, gg, tc = (y[:, k * H:(k + 1) * H] for k in range(2, STATE_WIDTH))
        gh, gc, gi, gf, go, g_g, gt = (g[:, k * H:(k + 1) * H] for k in range(STATE_WIDTH))
        dc = gc + (gh * og + gt) * (1 - tc * tc)
        d_f = (dc * xs[2][:, H:2 * H] + gf) * fg * (1 - fg) if len(xs) == 3 else gf * fg * (1 - fg)
        dpre = xp.concatenate([(dc * gg + gi) * ig * (1 - ig), d_f, (gh * tc + go) * og * (1 - og),
                               (dc * ig + g_g) * (1 - gg * gg)], axis=1)
        out = [reduce_to(dpre, pre.shape) if need[0] else None]
        if len(xs) == 3:
            W, prev = xs[1], xs[2]
            B = dpre.shape[0]
            hp = xp.broadcast_to(prev[:, :H], (B, H))
            gW = d_prev = None
            if need[1] is DEFER:  # autodiff sums every batch's pairs in one product (shared W only)
                gW = WeightProduct(dpre, xp.ascontiguousarray(hp))
            elif need[1]:
                gW = one_row(dpre.T @ hp) if W.shape[0] == 1 else reduce_to(dpre[:, :, None] * hp[:, None, :], W.shape)
            if need[2]:
                d_prev = xp.zeros((B, STATE_WIDTH * H), dtype=dpre.dtype)
                d_prev[:, :H] = dpre @ W[0] if W.shape[0] == 1 else xp.matmul(W.transpose(0, 2, 1), dpre[:, :, None])[:, :, 0]
                d_prev[:, H:2 * H] = dc * fg
                d_prev = reduce_to(d_prev, prev.shape)
            out += [gW, d_prev]
        return tuple(out)
