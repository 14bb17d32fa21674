"""Batched reverse mode (dynagraph.autodiff): adopted gradient blocks are copy-on-write."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from refcheck import loss_weights, run_graph

RNG = np.random.default_rng(11)
W0, U0 = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
V = np.array([0.5, -1.0, 2.0, 0.25])


def _shared_gradient(pc):
    """add's backward hands the same array to both arguments; replayed in reverse, x then
    gets a second gradient (from tanh, recorded earlier): adding it into the shared array
    would corrupt y's, whose backward runs after."""
    W = pc.add_parameters((3, 4), name="W")
    U = pc.add_parameters((3, 4), name="U")
    W.set_value(W0)
    U.set_value(U0)
    v = dy.inputVector(V.tolist())
    outs = []
    for k in range(3):
        x, y = W * (v * (k + 1.0)), U * v
        t = dy.tanh(x)
        s = x + y
        outs.append(dy.cmult(s, s) + t)
    return outs


@pytest.mark.parametrize("scheduler", ["none", "depth", "agenda"])
def test_shared_output_gradient_is_not_corrupted(scheduler):
    run = run_graph(scheduler, _shared_gradient)
    gW, gU = np.zeros_like(W0), np.zeros_like(U0)
    for k in range(3):  # loss = sum_k w_k . ((x+y)^2 + tanh x), by hand
        x, y = W0 @ (V * (k + 1.0)), U0 @ V
        w = loss_weights((3,), 1000 + k)
        dz = w * 2 * (x + y)
        gW += np.outer(dz + w * (1 - np.tanh(x) ** 2), V * (k + 1.0))
        gU += np.outer(dz, V)
    np.testing.assert_allclose(run.grads["/W"], gW, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(run.grads["/U"], gU, rtol=1e-10, atol=1e-12)


def _two_levels(pc):
    """W is used by two batches (two depths), two and three rows each: its gradient is
    deferred and summed over both as one product."""
    W = pc.add_parameters((3, 4), name="W")
    W.set_value(W0)
    b = pc.add_parameters(3, name="b")
    outs = []
    for k in range(3):
        v = dy.inputVector((V * (k + 1.0)).tolist())
        h = dy.tanh(dy.affine_transform([b, W, v]))           # depth 1: three rows
        if k < 2:
            h = dy.affine_transform([b, W, dy.concatenate([h, dy.pick_range(v, 0, 1)])])  # depth 2
        outs.append(h)
    return outs


@pytest.mark.parametrize("scheduler", ["none", "depth", "agenda"])
def test_deferred_weight_gradients_match_per_batch_ones(scheduler, monkeypatch):
    from dynagraph.ops import OPS
    deferred = run_graph(scheduler, _two_levels)
    monkeypatch.setattr(OPS["affine"], "defers_leaf_grads", False)
    eager = run_graph(scheduler, _two_levels)
    assert deferred.grads.keys() == eager.grads.keys() and len(eager.grads) == 2
    for name in eager.grads:
        np.testing.assert_allclose(deferred.grads[name], eager.grads[name], rtol=1e-12, atol=1e-14)
        assert np.abs(deferred.grads[name]).sum() > 0
    if scheduler != "none":  # batched: W's two batches were one deferred product
        assert deferred.cg.stats.kernel_calls == eager.cg.stats.kernel_calls + 1


def test_outer_sum_collects_factors_and_flush_multiplies_them_once():
    from dynagraph.ops.base import DEFER, OuterSum
    from dynagraph.ops.linalg import mm_grads
    G, X, A = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 4)), RNG.standard_normal((1, 3, 4))
    gA, gX = mm_grads(np, A, X, G, (DEFER, True))
    assert type(gA) is OuterSum and gA.shape == (1, 3, 4)
    np.testing.assert_allclose(gA.dense(), (G.T @ X)[None])
    np.testing.assert_allclose(gX, G @ A[0])
    eager, _ = mm_grads(np, A, X, G, (True, False))  # plain True: computed at once, as before
    np.testing.assert_allclose(eager, gA.dense())
    one, _ = mm_grads(np, A, X[:1], G[:1], (DEFER, False))  # a single row is not worth deferring
    assert type(one) is np.ndarray
