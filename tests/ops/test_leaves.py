"""Leaves: lookup values, sparse gradients (only touched rows), const lookups and
const parameters (no gradient, also when batched with updated uses), bad indices."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from refcheck import loss_weights, run_graph, weighted_loss

TABLE = np.random.default_rng(3).normal(size=(6, 3))


def _table(pc):
    return pc.lookup_parameters_from_numpy(TABLE.copy())


def test_gradient_touches_only_looked_up_rows(pc):
    E = _table(pc)
    dy.renew_cg()
    outs = [E[1], dy.lookup(E, 4), E[1]]           # row 1 twice: its gradients add up
    ws = [loss_weights((3,), s) for s in range(3)]
    dy.esum([weighted_loss(o, w) for o, w in zip(outs, ws)]).backward()
    g = E.grad_as_array()
    want = np.zeros_like(TABLE)
    want[1] = ws[0] + ws[2]
    want[4] = ws[1]
    np.testing.assert_allclose(g, want, rtol=1e-12)
    assert list(E.touched_rows()) == [1, 4]


SCHEDULERS = ["none", "agenda", "depth"]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_const_lookup_gets_no_gradient(pc, scheduler):
    E = _table(pc)
    dy.renew_cg(scheduler=scheduler)
    loss = dy.sum_elems(dy.const_lookup(E, 2) + E[3])
    loss.backward()
    assert list(E.touched_rows()) == [3]
    assert not E.grad_as_array()[2].any()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_const_parameter_gets_no_gradient(pc, scheduler):
    W = pc.add_parameters((2, 3), init=np.ones((2, 3)))
    dy.renew_cg(scheduler=scheduler)
    x1, x2 = dy.inputVector([1.0, 2.0, 3.0]), dy.inputVector([10.0, 20.0, 30.0])
    loss = dy.sum_elems(dy.const_parameter(W) * x2) + dy.sum_elems(W * x1)
    loss.backward()
    np.testing.assert_allclose(W.grad_as_array(), [[1.0, 2.0, 3.0]] * 2, rtol=1e-12)


def test_lookup_values(pc):
    E = _table(pc)
    dy.renew_cg()
    np.testing.assert_array_equal(E[5].npvalue(), TABLE[5])
    assert E[0].shape == (3,)


@pytest.mark.parametrize("index", [-1, 6])
def test_out_of_range_index_raises_index_error(pc, index):
    E = _table(pc)
    dy.renew_cg()
    with pytest.raises(IndexError):
        dy.lookup(E, index)


def test_batched_lookup_gradient_is_sparse_and_matches_unbatched():
    def build(pc):
        E = _table(pc)
        return [dy.tanh(E[i]) for i in (2, 0, 2, 5)]
    runs = [run_graph(s, build) for s in ("none", "depth")]
    for r in runs:
        (g,) = [v for k, v in r.grads.items()]
        assert set(np.flatnonzero(np.abs(g).sum(axis=1))) == {0, 2, 5}
    np.testing.assert_allclose(runs[0].grads[next(iter(runs[0].grads))],
                               runs[1].grads[next(iter(runs[1].grads))], rtol=1e-12)
