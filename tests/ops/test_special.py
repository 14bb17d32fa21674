"""The plain-array special functions behind dy.erf and dy.lgamma (dynagraph/ops/special.py)
against Python's math module, over the whole float range, and at the poles."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import dynagraph as dy
from dynagraph.ops import special
from refcheck import using

FINITE = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(FINITE, min_size=1, max_size=20))
def test_erf_matches_math(xs):
    x = np.array(xs)
    np.testing.assert_allclose(special.erf(np, x), [math.erf(v) for v in xs], rtol=4e-15, atol=1e-300)


@settings(max_examples=300, deadline=None)
@given(st.lists(FINITE.filter(lambda v: v > 0 or v != math.floor(v)), min_size=1, max_size=20))
def test_lgamma_matches_math_away_from_poles(xs):
    x = np.array(xs)
    want = np.array([math.lgamma(v) for v in xs])
    # relative accuracy, and ~1e-14 absolute next to the zeros at 1 and 2 (the shift to x >= 10
    # subtracts numbers near 15 there); the reflection for x < 0
    # inherits sin(pi x)'s relative error there, ~1e-16 / distance to the nearest pole
    slack = np.where(x < 0, 1e-16 / np.maximum(np.abs(x - np.round(x)), 1e-300), 0.0)
    assert (np.abs(special.lgamma(np, x) - want) <= 1e-13 * np.abs(want) + 2e-14 + slack).all()


def test_digamma_matches_differences_of_lgamma():
    x = np.concatenate([np.linspace(0.05, 30, 400), -np.linspace(0.05, 6, 400) - 0.01])
    x = x[np.abs(x - np.round(x)) > 0.02]
    h = 1e-5
    diff = (np.array([math.lgamma(v + h) - math.lgamma(v - h) for v in x])) / (2 * h)
    np.testing.assert_allclose(special.digamma(np, x), diff, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(special.digamma(np, np.array([1.0])), [-0.5772156649015329], rtol=1e-15)


def test_lgamma_poles_are_inf_and_infinities_pass_through():
    with np.errstate(all="raise"):  # no warnings escape: the poles are handled on purpose
        assert np.isposinf(special.lgamma(np, np.array([0.0, -1.0, -7.0]))).all()
    np.testing.assert_array_equal(special.erf(np, np.array([-np.inf, np.inf])), [-1.0, 1.0])


def test_float32_lgamma_is_exact_next_to_its_zeros():
    with using("float32"):
        dy.renew_cg()
        v = dy.lgamma(dy.inputVector([1.0, 2.0, 3.0])).npvalue()
    assert v.dtype == np.float32
    np.testing.assert_allclose(v, [0.0, 0.0, math.log(2.0)], atol=1e-7)

