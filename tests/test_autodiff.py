"""Batched reverse mode (dynagraph.autodiff): adopted gradient blocks are copy-on-write."""
from __future__ import annotations

import numpy as np
import pytest
from refcheck import assert_same_run, loss_weights, run_graph

import dynagraph as dy

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


def test_esum_over_a_batch_of_losses_adds_its_gradient_once(monkeypatch):
    """dy.esum(losses) whose losses are consecutive rows of one batch: one add of the
    gradient into those rows (not one scatter per loss), the same gradients as unbatched."""
    from dynagraph import autodiff
    calls = []
    real = autodiff.scatter
    monkeypatch.setattr(autodiff, "_backward_native", None)  # the reference path's calls are counted
    monkeypatch.setattr(autodiff, "scatter", lambda *a: calls.append(a[3]) or real(*a))

    def build(pc):
        W = pc.add_parameters((3, 4), name="W")
        xs = [dy.inputVector(np.linspace(-1, 1, 4) * (k + 1) / 20) for k in range(20)]
        return [dy.esum([dy.pickneglogsoftmax(W * x, k % 3) for k, x in enumerate(xs)])]
    plain = run_graph("none", build)
    n_plain, calls[:] = len(calls), []
    batched = run_graph("agenda", build)
    assert_same_run(batched, plain, rtol=1e-12, atol=1e-14)
    assert n_plain >= 20 and len(calls) < 10  # the 20 losses' rows: one add, no per-loss scatter
