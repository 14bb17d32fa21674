"""Weight gradients of parameter products deferred to one GEMM per parameter (autodiff).

`OpDef.weight_products` lets autodiff keep (g, x) of each product W x whose W is a
parameter and sum dW = G^T X once at the end of the pass. The gradients must equal
the per-batch products (the op's own backward) to float64 rounding, on every scheduler,
including parameters used in deferred and non-deferred products at once, frozen ones,
and mini-batched (dy.lookup_batch) graphs.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dynagraph as dy
from dynagraph import autodiff
from refcheck import using
from dynagraph.ops.base import OPS

PRODUCTS = ("matmul", "affine")


def _grads(build, scheduler: str, deferred: bool) -> list:
    saved = {k: OPS[k].weight_products for k in PRODUCTS}
    try:
        if not deferred:
            for k in PRODUCTS:
                OPS[k].weight_products = None
        pc = dy.ParameterCollection()
        rng = np.random.default_rng(7)
        params = build.params(pc, rng)
        dy.renew_cg(scheduler=scheduler)
        loss = build(params, rng)
        loss.value()
        loss.backward()
        out = [p.grad_as_array().copy() for p in pc.parameters_list()]
        out += [p.grad_as_array().copy() for p in pc.lookup_parameters_list()]
        return out
    finally:
        for k, v in saved.items():
            OPS[k].weight_products = v


class LstmChains:
    """Several LSTM-like chains over shared weights: affine [b, Wx, x, Wh, h] and W * h."""

    def __init__(self, lengths: list, H: int = 5):
        self.lengths, self.H = lengths, H

    def params(self, pc, rng):
        H = self.H
        u = lambda *s: rng.uniform(-0.5, 0.5, s)  # noqa: E731
        return dict(E=pc.lookup_parameters_from_numpy(u(11, H)), Wx=pc.parameters_from_numpy(u(4 * H, H)),
                    Wh=pc.parameters_from_numpy(u(4 * H, H)), b=pc.parameters_from_numpy(u(4 * H)),
                    Wo=pc.parameters_from_numpy(u(3, H)), M=pc.parameters_from_numpy(u(H, H)),
                    F=pc.parameters_from_numpy(u(H, H)))

    def __call__(self, P, rng):
        H = self.H
        Wx, Wh, b, Wo, M = (dy.parameter(P[k]) for k in ("Wx", "Wh", "b", "Wo", "M"))
        frozen = dy.const_parameter(P["F"])  # no gradient wanted: never deferred
        losses = []
        for n in self.lengths:
            h = c = None
            for t in range(n):
                x = dy.lookup(P["E"], int(rng.integers(11)))
                g = dy.affine_transform([b, Wx, x] if h is None else [b, Wx, x, Wh, h])
                i, o = dy.logistic(dy.pick_range(g, 0, H)), dy.logistic(dy.pick_range(g, H, 2 * H))
                u = dy.tanh(dy.pick_range(g, 3 * H, 4 * H))
                c = dy.cmult(i, u) if c is None else c + dy.cmult(i, u)
                h = dy.cmult(o, dy.tanh(c))
                h = h + frozen * h
            # M times a matrix (not deferred) and times a vector (deferred): both reach dM
            mat = dy.concatenate_cols([h, c])
            losses.append(dy.sum_elems(M * mat) + dy.pickneglogsoftmax(Wo * (M * h), n % 3))
        return dy.esum(losses)


@pytest.mark.parametrize("scheduler", ["none", "agenda", "depth"])
def test_deferred_equals_per_batch(float64, scheduler):
    build = LstmChains([3, 1, 4, 2])
    for a, b in zip(_grads(build, scheduler, True), _grads(build, scheduler, False)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=5), st.sampled_from(["none", "agenda", "typewise"]))
def test_deferred_random_chains(lengths, scheduler):
    from refcheck import using
    with using(dtype="float64", seed=0):
        build = LstmChains(lengths, H=3)
        ref = _grads(build, "none", False)
        for a, b in zip(_grads(build, scheduler, True), ref):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_minibatched_lookup_batch(float64):
    """Batched expressions (lookup_batch): the product's rows are one node's batch."""
    class Batched:
        def params(self, pc, rng):
            return dict(E=pc.lookup_parameters_from_numpy(rng.normal(size=(9, 4))),
                        W=pc.parameters_from_numpy(rng.normal(size=(3, 4))))

        def __call__(self, P, rng):
            W = dy.parameter(P["W"])
            x = dy.lookup_batch(P["E"], [1, 5, 2, 7])
            y = dy.tanh(W * x)
            return dy.sum_batches(dy.sum_elems(y * 0.5 + W * dy.tanh(x)))

    for a, b in zip(_grads(Batched(), "agenda", True), _grads(Batched(), "none", False)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _sentence(direct: bool, full: bool, scheduler: str, dtype) -> tuple:
    """One per-sentence graph: W, V and the const F each in one one-row product (W twice over the
    graph, so not direct), U in a product and elementwise (a dense leaf gradient beside the product).
    Returns every parameter's gradient, every parameter node's gradient() and the C adds made."""
    saved, calls = autodiff._outer_add, []
    try:
        autodiff._outer_add = (lambda *a: (calls.append(a), saved(*a))[1]) if direct else None
        rng = np.random.default_rng(5)
        pc = dy.ParameterCollection()
        P = {k: pc.parameters_from_numpy(rng.uniform(-1, 1, s).astype(dtype))
             for k, s in dict(W=(5, 4), V=(3, 5), U=(4, 4), F=(4, 4), T=(2, 4)).items()}
        dy.renew_cg(scheduler=scheduler)
        x = dy.inputVector(rng.uniform(-1, 1, 4).astype(dtype))
        W, V, U, T = (dy.parameter(P[k]) for k in "WVUT")
        F = dy.const_parameter(P["F"])
        h = dy.tanh(V * dy.tanh(W * x))
        u = dy.tanh(U * x) + dy.tanh(F * x)
        loss = dy.sum_elems(h) + dy.sum_elems(dy.cmult(u, u)) + dy.sum_elems(dy.cmult(U, U)) \
            + dy.pickneglogsoftmax(T * u, 1) + dy.sum_elems(dy.tanh(W * u))
        loss.value()
        loss.backward(full=full)
        return ([P[k].grad_as_array().copy() for k in sorted(P)],
                [e.gradient().copy() for e in (W, V, U, T, F)], len(calls))
    finally:
        autodiff._outer_add = saved


@pytest.mark.skipif(getattr(autodiff, "_outer_add", None) is None, reason="dynagraph._bookkeeping is not built")
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("scheduler", ["none", "agenda"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_row_products_added_straight_into_the_gradient(full, scheduler, dtype):
    """A parameter whose only gradient is one one-row product gets g^T x added straight into its
    gradient (autodiff.OuterBlock.add_into): bit for bit what the gradient block and its add give, for
    parameter gradients and for gradient() of the parameter's node (an OuterBlock), beside
    parameters used twice, densely and as dy.const_parameter (with full=True too)."""
    with using(dtype=np.dtype(dtype).name, seed=0):
        got, want = _sentence(True, full, scheduler, dtype), _sentence(False, full, scheduler, dtype)
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert np.any(got[0][sorted("FTUVW").index("V")])  # V took the direct path and got a gradient
    assert got[2] == 2  # V and T: W is used twice, U also densely, F takes no gradient


@pytest.mark.skipif(getattr(autodiff, "_outer_add", None) is None, reason="dynagraph._bookkeeping is not built")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_outer_add_is_numpys_and_leaves_what_it_refuses(dtype):
    """outer_add(grad, g, x) is numpy's `grad += g.T * x` bit for bit; operands it does not take
    raise TypeError with the gradient unchanged."""
    add = autodiff._outer_add
    rng = np.random.default_rng(2)
    G, X = rng.standard_normal((1, 6)).astype(dtype), rng.standard_normal((1, 5)).astype(dtype)
    grad = rng.standard_normal((6, 5)).astype(dtype)
    want = grad + G.T * X
    add(grad, G, X)
    np.testing.assert_array_equal(grad, want)
    before = grad.copy()
    other = np.float32 if dtype == np.float64 else np.float64
    for bad in ((grad[:, :4], G, X[:, :4]), (grad, G.astype(other), X), (grad.T, G, X), (grad, G, X[:, :4])):
        with pytest.raises(TypeError):
            add(*bad)
        np.testing.assert_array_equal(grad, before)
