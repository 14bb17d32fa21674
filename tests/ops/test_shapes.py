"""DyNet's shape conventions and the errors for shapes that do not fit.

Values are covered by the reference cases; here: recorded shapes (known before
any evaluation), dim(), and that bad shapes or indices fail at recording time
with an error naming the op and the shapes.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy


def _in(*shape):
    return dy.inputTensor(np.ones(shape))


@pytest.mark.parametrize("make,shape", [
    (lambda: _in(4), (4,)),
    (lambda: _in(3, 2), (3, 2)),
    (lambda: _in(4, 2) + _in(4), (4, 2)),             # trailing unit dims broadcast
    (lambda: _in(4) + _in(4, 2), (4, 2)),
    (lambda: dy.cmult(_in(4, 2), _in(1, 2)), (4, 2)),
    (lambda: _in(3, 4) * _in(4), (3,)),
    (lambda: _in(3, 4) * _in(4, 5), (3, 5)),
    (lambda: _in(3) * _in(1, 2), (3, 2)),
    (lambda: dy.transpose(_in(5)), (1, 5)),
    (lambda: dy.transpose(_in(2, 5)), (5, 2)),
    (lambda: dy.reshape(_in(6), (2, 3)), (2, 3)),
    (lambda: dy.pick(_in(3, 4), 1), (4,)),
    (lambda: dy.pick(_in(3, 4), 1, 1), (3,)),
    (lambda: dy.pick(_in(4), 1), (1,)),
    (lambda: dy.pick_range(_in(3, 4), 1, 3, 1), (3, 2)),
    (lambda: _in(6)[1:4], (3,)),
    (lambda: dy.select_rows(_in(3, 4), [0, 2]), (2, 4)),
    (lambda: dy.select_cols(_in(3, 4), [1]), (3, 1)),
    (lambda: dy.sum_dim(_in(3, 4), [0]), (4,)),
    (lambda: dy.sum_dim(_in(3, 4), [1]), (3,)),
    (lambda: dy.max_dim(_in(3, 4), 1), (3,)),
    (lambda: dy.min_dim(_in(3, 4)), (4,)),
    (lambda: dy.sum_elems(_in(3, 4)), (1,)),
    (lambda: dy.concatenate([_in(2), _in(3)]), (5,)),
    (lambda: dy.concatenate([_in(2), _in(2)], d=1), (2, 2)),
    (lambda: dy.concatenate_cols([_in(3), _in(3), _in(3)]), (3, 3)),
    (lambda: dy.softmax(_in(3, 4)), (3, 4)),
    (lambda: dy.pickneglogsoftmax(_in(5), 2), (1,)),
    (lambda: dy.dot_product(_in(5), _in(5)), (1,)),
    (lambda: dy.affine_transform([_in(3), _in(3, 4), _in(4), _in(3, 2), _in(2)]), (3,)),
    (lambda: dy.colwise_add(_in(3, 4), _in(3)), (3, 4)),
])
def test_recorded_shape(make, shape):
    dy.renew_cg()
    e = make()
    assert e.shape == shape            # known at recording time
    assert e.dim() == (shape, 1)       # DyNet's (dims, batch size)
    assert e.npvalue().shape == shape


@pytest.mark.parametrize("make,words", [
    (lambda: _in(4, 2) + _in(3), ["add", "(4, 2)", "(3,)"]),
    (lambda: dy.cmult(_in(4), _in(5)), ["cmult"]),
    (lambda: _in(3, 4) * _in(3), ["matmul", "(3, 4)", "(3,)"]),
    (lambda: dy.reshape(_in(2, 3), (4, 2)), ["reshape"]),
    (lambda: dy.concatenate([_in(2, 3), _in(2, 4)]), ["concatenate"]),
    (lambda: dy.esum([_in(2), _in(3)]), ["esum"]),
    (lambda: dy.dot_product(_in(2), _in(3)), ["dot_product"]),
    (lambda: dy.squared_distance(_in(2), _in(3)), ["squared_distance"]),
    (lambda: dy.hinge(_in(2, 2), 0), ["hinge"]),
    (lambda: dy.pickneglogsoftmax(_in(2, 2), 0), ["pickneglogsoftmax"]),
    (lambda: dy.pick_range(_in(4), 2, 6), ["pick_range"]),
    (lambda: dy.sum_dim(_in(3), [1]), ["sum_dim"]),
    (lambda: dy.max_dim(_in(3, 4), 2), ["max_dim"]),
    (lambda: dy.softmax(_in(3), 1), ["softmax"]),
    (lambda: dy.transpose(_in(2, 3), [0, 0]), ["transpose"]),
    (lambda: dy.colwise_add(_in(3, 4), _in(4)), ["colwise_add"]),
    (lambda: dy.affine_transform([_in(3), _in(3, 4)]), ["affine"]),
    (lambda: dy.affine_transform([_in(3), _in(3, 4), _in(4), _in(2, 4), _in(4)]), ["affine"]),
])
def test_bad_shapes_raise_naming_op_and_shapes(make, words):
    dy.renew_cg()
    with pytest.raises(dy.DynagraphError) as e:
        make()
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("make", [
    lambda: dy.pick(_in(4), 4),
    lambda: dy.pick(_in(3, 4), 3),
    lambda: dy.pick(_in(3, 4), 4, 1),
    lambda: dy.select_rows(_in(3, 4), [3]),
    lambda: dy.select_cols(_in(3, 4), [0, 4]),
    lambda: dy.pickneglogsoftmax(_in(5), 5),
    lambda: dy.hinge(_in(5), -1),
    lambda: dy.log_softmax(_in(5), [0, 5]),
])
def test_bad_indices_raise_index_error(make):
    dy.renew_cg()
    with pytest.raises(IndexError):
        make()


def test_slice_with_step_is_rejected():
    dy.renew_cg()
    with pytest.raises(dy.DynagraphError):
        _in(6)[::2]


def test_reshape_is_column_major():
    dy.renew_cg()
    m = dy.inputTensor(np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]))
    np.testing.assert_array_equal(dy.reshape(m, (6,)).npvalue(), [0, 3, 1, 4, 2, 5])
    np.testing.assert_array_equal(dy.reshape(m, (3, 2)).npvalue(), [[0, 4], [3, 2], [1, 5]])
    assert m.vec_value() == [0, 3, 1, 4, 2, 5]
