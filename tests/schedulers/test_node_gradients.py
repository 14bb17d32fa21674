"""Expression.gradient() of *every* node, including nodes that need no gradient.

A batch computes an argument's gradient for all its rows as soon as one row
needs it, so a node that needs none (a product of two inputs) may pick up a
partial gradient under a batching scheduler while "none" leaves it at zero.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from refcheck import using

from ._util import SCHEDULERS, TOL

_PARAMS = SCHEDULERS


def _node_grads(name: str, full: bool) -> list:
    with using("float64", 0):
        p = dy.ParameterCollection().add_parameters(2)
        cg = dy.renew_cg(scheduler=name)
        x, y = dy.inputVector([1.0, 2.0]), dy.inputVector([3.0, 4.0])
        a = dy.cmult(x, y)                 # needs no gradient ...
        b = dy.cmult(dy.parameter(p), y)   # ... this one does
        sa, sb = dy.sum_elems(a), dy.sum_elems(b)
        loss = (sa + sb) + (sb + sa)       # the two adds batch: slot 0 holds sa and sb
        loss.backward(full=full)
        assert not cg.needs_grad[a.i] and cg.needs_grad[b.i]
        return [cg.gradient(i) for i in range(len(cg))]


def _assert_same(ref: list, got: list) -> None:
    assert len(ref) == len(got)
    for i, (g, h) in enumerate(zip(ref, got)):
        np.testing.assert_allclose(h, g, rtol=TOL, atol=TOL, err_msg=f"gradient of node {i}")


@pytest.mark.parametrize("name", _PARAMS)
def test_gradient_of_nodes_that_need_none_is_scheduler_invariant(name):
    _assert_same(_node_grads("none", False), _node_grads(name, False))


@pytest.mark.parametrize("name", SCHEDULERS)
def test_full_backward_gradients_of_all_nodes_are_invariant(name):
    ref = _node_grads("none", True)
    _assert_same(ref, _node_grads(name, True))
    assert all(np.any(g != 0) for g in ref), "full=True must give every node of this graph a gradient"
