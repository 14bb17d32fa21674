"""DyNet functions built from existing ops (dynagraph/composites.py): numpy formulas and finite
differences in float64, and dynet38 parity in float32 (skipped without it)."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from refcheck import check_op

try:
    import dynet as dn
except ImportError:
    dn = None


def _arr(shape, lo=-1.0, hi=1.0, seed=0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32).astype(np.float64)


X, Y = _arr((5,), -2, 2, seed=1), _arr((5,), -2, 2, seed=2)
M, N = _arr((2, 3), seed=3), _arr((2, 3), seed=4)
G, B = _arr((5,), 0.5, 1.5, seed=5), _arr((5,), seed=6)


def _huber(a, c=1.345):
    a = np.abs(a)
    return np.where(a <= c, a * a / 2, c * (a - c / 2)).sum()


def _lse(x, d):
    return np.log(np.exp(x).sum(axis=d))


CASES = {
    "l1_distance": (lambda m, x, y: m.l1_distance(x, y), [X, Y], lambda x, y: np.abs(x - y).sum()),
    "huber_distance": (lambda m, x, y: m.huber_distance(x, y), [X, Y], lambda x, y: _huber(x - y)),
    "huber_distance_c": (lambda m, x, y: m.huber_distance(x, y, 0.5), [X, Y], lambda x, y: _huber(x - y, 0.5)),
    "std_elems": (lambda m, x: m.std_elems(x), [M], lambda x: x.std()),
    "moment_elems": (lambda m, x: m.moment_elems(x, 3), [X], lambda x: (x ** 3).mean()),
    "logsumexp_dim0": (lambda m, x: m.logsumexp_dim(x, 0), [M], lambda x: _lse(x, 0)),
    "logsumexp_dim1": (lambda m, x: m.logsumexp_dim(x, 1), [M], lambda x: _lse(x, 1)),
    "trace_of_product": (lambda m, x, y: m.trace_of_product(x, y), [M, N], lambda x, y: np.trace(x @ y.T)),
    "layer_norm": (lambda m, x, g, b: m.layer_norm(x, g, b), [X, G, B],
                   lambda x, g, b: g * (x - x.mean()) / np.sqrt(x.var() + 1e-8) + b),
    "moment_dim": (lambda m, x: m.moment_dim(x, [1], 2, False), [M], lambda x: (x ** 2).mean(1)),
    "moment_dim_n": (lambda m, x: m.moment_dim(x, [0], 3, False, 4), [M], lambda x: (x ** 3).sum(0) / 4),
    "std_dim0": (lambda m, x: m.std_dim(x, [0], False), [M], lambda x: x.std(0)),
    "std_dim1": (lambda m, x: m.std_dim(x, [1], False), [M], lambda x: x.std(1)),
    "cumsum_vector": (lambda m, x: m.cumsum(x), [X], lambda x: np.cumsum(x)),
    "cumsum_d0": (lambda m, x: m.cumsum(x, 0), [M], lambda x: np.cumsum(x, 0)),
    "cumsum_d1": (lambda m, x: m.cumsum(x, 1), [M], lambda x: np.cumsum(x, 1)),
    "weight_norm": (lambda m, w, g: m.weight_norm(w, g), [M, np.array([1.7])],
                    lambda w, g: g[0] * w / np.linalg.norm(w)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_formula_and_finite_differences(name):
    build, arrays, ref = CASES[name]
    check_op(lambda *xs: build(dy, *xs), arrays, lambda *a: np.asarray(ref(*a)).reshape(-1)
             if np.ndim(ref(*a)) == 0 else ref(*a))


def _run(lib, build, arrays):
    pc = lib.ParameterCollection()
    ps = [pc.parameters_from_numpy(a.copy()) for a in arrays]
    lib.renew_cg()
    out = build(lib, *[lib.parameter(p) for p in ps])
    value = np.asarray(out.npvalue(), dtype=np.float64)
    w = np.random.default_rng(9).normal(size=value.shape)
    loss = lib.sum_elems(lib.cmult(out, lib.inputTensor(w)))
    loss.value()
    loss.backward()
    return value, [np.asarray(p.grad_as_array()) for p in ps]


@pytest.mark.skipif(dn is None, reason="dynet38 is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_dynet(name):
    build, arrays, _ = CASES[name]
    want_v, want_g = _run(dn, build, arrays)
    got_v, got_g = _run(dy, build, arrays)
    np.testing.assert_allclose(got_v.reshape(want_v.shape), want_v, rtol=1e-4, atol=1e-6, err_msg="value")
    for k, (g, w) in enumerate(zip(got_g, want_g)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"gradient of input {k}")


@pytest.mark.skipif(dn is None, reason="dynet38 is not installed")
def test_one_hot_matches_dynet():
    dn.renew_cg()
    dy.renew_cg()
    np.testing.assert_array_equal(dy.one_hot(5, 3).npvalue(), dn.one_hot(5, 3).npvalue())


def test_one_hot_batch_and_errors():
    dy.renew_cg()
    e = dy.one_hot(4, [0, 3])
    np.testing.assert_array_equal(dy.sum_batches(e).npvalue(), [1, 0, 0, 1])
    with pytest.raises(dy.DynagraphError, match="out of range"):
        dy.one_hot(4, 4)
    with pytest.raises(dy.DynagraphError, match="positive int"):
        dy.moment_elems(dy.inputVector([1.0]), 0)
