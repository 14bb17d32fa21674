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
recomputation. One node may step K independent chains side by side (attrs (H, fb, K):
K pre_x, K W_h, a state of 7KH): BiRNNBuilder steps a layer's two directions together.
Per sentence a bidirectional LSTM step was six small batches (two products that cannot
share a batch, their weights differing, then lstm_c and lstm_h, each run node by node
because the two directions' products lie in two blocks); it is one.
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


STATE_WIDTH = 7  # lstm_step's value per chain, in units of H: h, c and the five activations


def chains(a) -> int:
    """K, the number of independent LSTM chains an lstm_step node steps: attrs (H, fb[, K])."""
    return a[2] if len(a) > 2 else 1


def _lstm_step_shape(a, *shapes):
    H, K = a[0], chains(a)
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"the number of chains must be a positive int, got {K!r}")
    if len(shapes) not in (K, 2 * K + 1):
        raise ValueError(f"takes {K} input pre-activations, alone or with {K} recurrent weights and the previous "
                         f"state, got {len(shapes)} arguments")
    for pre in shapes[:K]:
        _pre_shape(H, pre)
    if len(shapes) > K:
        for W in shapes[K:2 * K]:
            if W != (4 * H, H):
                raise ValueError(f"the recurrent weight must have shape ({4 * H}, {H}), got {W}")
        if shapes[2 * K] != (K * STATE_WIDTH * H,):
            raise ValueError(f"the previous state must have shape ({K * STATE_WIDTH * H},) (an lstm_step's value), "
                             f"got {shapes[2 * K]}")
    return (K * STATE_WIDTH * H,)


def _step_weights(a, n_args: int) -> tuple:
    """The argument positions of an lstm_step's recurrent weights (OpDef.deferred_weights)."""
    K = chains(a)
    return tuple(range(K, 2 * K)) if n_args == 2 * K + 1 else ()


def _one_state(xp, H, fb, pre, W=None, prev=None):
    """One chain's state [h | c | i f o g tanh(c)] from its pre_x, W_h and previous state (or none)."""
    gates = pre if W is None else mm(xp, W, prev[:, :H]) + pre
    ig = _logistic(xp, gates[:, :H])
    fg = _logistic(xp, gates[:, H:2 * H] + fb)
    og = _logistic(xp, gates[:, 2 * H:3 * H])
    gg = xp.tanh(gates[:, 3 * H:4 * H])
    c = ig * gg if W is None else fg * prev[:, H:2 * H] + ig * gg
    tc = xp.tanh(c)
    return xp.concatenate([og * tc, c, xp.broadcast_to(ig, c.shape), xp.broadcast_to(fg, c.shape),
                           xp.broadcast_to(og, c.shape), xp.broadcast_to(gg, c.shape), tc], axis=1)


def _one_grads(xp, H, pre, y, g, need, W=None, prev=None):
    """One chain's (d pre_x, W_h's gradient, d prev) from its state y and the state's gradient g;
    need: (pre_x, W_h, prev)."""
    ig, fg, og, gg, tc = (y[:, k * H:(k + 1) * H] for k in range(2, STATE_WIDTH))
    gh, gc, gi, gf, go, g_g, gt = (g[:, k * H:(k + 1) * H] for k in range(STATE_WIDTH))
    dc = gc + (gh * og + gt) * (1 - tc * tc)
    d_f = (dc * prev[:, H:2 * H] + gf) * fg * (1 - fg) if W is not None else gf * fg * (1 - fg)
    dpre = xp.concatenate([(dc * gg + gi) * ig * (1 - ig), d_f, (gh * tc + go) * og * (1 - og),
                           (dc * ig + g_g) * (1 - gg * gg)], axis=1)
    d_x = reduce_to(dpre, pre.shape) if need[0] else None
    if W is None:
        return d_x, None, None
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
    return d_x, gW, d_prev


@op("lstm_step", _lstm_step_shape, cost=GEMM, deferred_weights=_step_weights)
class LstmStep:
    """attrs (H, forget_bias[, K]); arguments K input pre-activations pre_x (4H each), then
    optionally K recurrent weights W_h (4H, H) and the previous state (7KH). The value is each
    chain's [h | c | i f o g tanh(c)] side by side (K = 2: a bidirectional layer's two
    directions, stepped together)."""

    def forward(xp, a, data, *xs):
        H, fb, K = a[0], a[1], chains(a)
        full = len(xs) > K
        S = STATE_WIDTH * H
        states = [_one_state(xp, H, fb, xs[k], *((xs[K + k], xs[2 * K][:, k * S:(k + 1) * S]) if full else ()))
                  for k in range(K)]
        if K == 1:
            return states[0]
        B = max(st.shape[0] for st in states)  # a chain of shared rows only is one row: broadcast it
        return xp.concatenate([xp.broadcast_to(st, (B, st.shape[1])) for st in states], axis=1)

    def backward(xp, a, data, xs, y, g, need):
        H, K = a[0], chains(a)
        full = len(xs) > K
        S = STATE_WIDTH * H
        d_pres, d_ws, d_prevs = [], [], []
        for k in range(K):
            sl = slice(k * S, (k + 1) * S)
            extra = (xs[K + k], xs[2 * K][:, sl]) if full else ()
            want = (need[k], need[K + k], need[2 * K]) if full else (need[k], False, False)
            d_x, gW, d_prev = _one_grads(xp, H, xs[k], y[:, sl], g[:, sl], want, *extra)
            d_pres.append(d_x)
            d_ws.append(gW)
            d_prevs.append(d_prev)
        if not full:
            return tuple(d_pres)
        d_prev = None
        if need[2 * K]:
            d_prev = d_prevs[0] if K == 1 else xp.concatenate(d_prevs, axis=1)
            d_prev = reduce_to(d_prev, xs[2 * K].shape)
        return tuple(d_pres + d_ws + [d_prev])
