"""The reference-check helper itself: it must catch wrong values and wrong
gradients, and run_under must give comparable runs."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.config import config
from dynagraph.ops import OPS
from refcheck import Const, assert_same_run, check_op, numeric_grad, run_graph, run_under, using

X = np.array([0.3, -0.8, 0.5])


def test_accepts_a_correct_op():
    c = check_op(dy.tanh, [X], np.tanh, op="tanh")
    assert c.grads[0].shape == X.shape and np.abs(c.grads[0]).sum() > 0


def test_catches_a_wrong_value():
    with pytest.raises(AssertionError, match="forward value"):
        check_op(dy.tanh, [X], lambda x: np.tanh(x) + 1e-6)


def test_catches_a_wrong_shape():
    with pytest.raises(AssertionError, match="shape"):
        check_op(dy.transpose, [X], lambda x: x)


def test_catches_the_wrong_op():
    with pytest.raises(AssertionError, match="expected op"):
        check_op(dy.logistic, [X], op="tanh")


def test_catches_a_wrong_gradient(monkeypatch):
    tanh = OPS["tanh"]
    monkeypatch.setattr(tanh, "backward", lambda xp, a, data, xs, y, g, need: (g * (1 - y * y) * 1.001,))
    with pytest.raises(AssertionError, match="gradient"):
        check_op(dy.tanh, [X], np.tanh)


def test_const_inputs_are_not_differentiated():
    c = check_op(lambda x, y: dy.cmult(x, y), [X, Const(2 * X)], lambda x, y: x * y)
    assert c.grads[1] is None and c.params[1] is None


def test_numeric_grad_of_a_known_function():
    x = np.array([1.0, 2.0, -0.5])
    g = numeric_grad(lambda: float(np.sum(x ** 3)), x)
    np.testing.assert_allclose(g, 3 * np.array([1.0, 2.0, -0.5]) ** 2, rtol=1e-8)
    np.testing.assert_array_equal(x, [1.0, 2.0, -0.5])      # restored after perturbation


def test_using_restores_global_settings():
    before = (config.dtype, config.scheduler, config.seed)
    with using(dtype="float32", seed=7, scheduler="depth"):
        assert (config.dtype, config.scheduler, config.seed) == ("float32", "depth", 7)
    assert (config.dtype, config.scheduler, config.seed) == before


def _tree(pc):
    W = pc.add_parameters((3, 3))
    E = pc.add_lookup_parameters((5, 3))
    return [dy.tanh(W * E[i] + E[j]) for i, j in [(0, 1), (2, 3), (4, 0)]]


def test_run_under_same_results_for_every_scheduler():
    base = run_under("none", _tree)
    for s in ("depth", "agenda"):
        assert_same_run(run_under(s, _tree), base)
    values, grads = base
    assert len(values) == 3 and set(grads) == {"/_0", "/_1"}


def test_run_graph_batches_and_detects_differences():
    r = run_graph("depth", _tree)
    assert max(len(e.nodes) for e in r.cg.executed) >= 3
    other = run_graph("none", _tree, seed=1)                  # different parameters
    with pytest.raises(AssertionError):
        assert_same_run(r, other)
