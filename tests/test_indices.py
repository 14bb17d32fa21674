"""Indices, dimensions and range bounds must be integers (numpy's too): a float is never
truncated, and an out-of-range slice raises instead of being clamped."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy

FLOAT_INDICES = {
    "pick_range": lambda x, v: dy.pick_range(x, v, 2),
    "pick_range_dim": lambda x, v: dy.pick_range(x, 0, 2, v),
    "select_rows": lambda x, v: dy.select_rows(x, [v]),
    "select_cols": lambda x, v: dy.select_cols(dy.reshape(x, (1, 3)), [v]),
    "pick": lambda x, v: dy.pick(x, v),
    "pick_dim": lambda x, v: dy.pick(x, 0, v),
    "getitem": lambda x, v: x[v],
    "slice": lambda x, v: x[v:2],
    "pickneglogsoftmax": lambda x, v: dy.pickneglogsoftmax(x, v),
    "hinge": lambda x, v: dy.hinge(x, v),
    "log_softmax_restrict": lambda x, v: dy.log_softmax(x, restrict=[v, 1]),
    "softmax_dim": lambda x, v: dy.softmax(x, v),
    "max_dim": lambda x, v: dy.max_dim(x, v),
    "sum_dim": lambda x, v: dy.sum_dim(x, [v]),
    "concatenate": lambda x, v: dy.concatenate([x, x], v),
    "pick_batch": lambda x, v: dy.pick_batch(x, [v]),
}


@pytest.mark.parametrize("name", sorted(FLOAT_INDICES))
@pytest.mark.parametrize("bad", [0.0, 0.9, np.float64(1.0), True, "1"], ids=["0.0", "0.9", "np1.0", "bool", "str"])
def test_non_integer_indices_are_refused_naming_the_op(name, bad):
    x = dy.inputVector([1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="indices must be integers"):
        FLOAT_INDICES[name](x, bad)


@pytest.mark.parametrize("name", sorted(FLOAT_INDICES))
def test_numpy_integers_are_indices(name):
    x = dy.inputVector([1.0, 2.0, 3.0])
    for t in (np.int64, np.int32, np.uint8):
        a = FLOAT_INDICES[name](x, t(0)).npvalue()
        b = FLOAT_INDICES[name](x, 0).npvalue()
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("sl", [slice(1, 9), slice(-9, 2), slice(3, 4), slice(2, 1), slice(1, 1), slice(0, 3, 2)])
def test_out_of_range_slices_raise(sl):
    x = dy.inputVector([1.0, 2.0, 3.0])
    with pytest.raises(dy.DynagraphError, match="pick_range"):
        x[sl]


def test_in_range_slices():
    x = dy.inputVector([1.0, 2.0, 3.0])
    for sl, want in [(slice(1, 3), [2, 3]), (slice(None, 2), [1, 2]), (slice(-2, None), [2, 3]),
                     (slice(0, -1), [1, 2]), (slice(None), [1, 2, 3])]:
        np.testing.assert_array_equal(x[sl].npvalue(), want)
