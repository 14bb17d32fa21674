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
