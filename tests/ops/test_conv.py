"""Reference checks for the image ops: value vs loop formulas, gradients vs finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from cases_conv import CASES
from opcases import params, run_reference


@pytest.mark.parametrize("case", params(CASES))
def test_reference(case):
    run_reference(case)


@pytest.mark.parametrize("build, match", [
    (lambda x, f: dy.conv2d(x, f, [1, 1]), "channels"),
    (lambda x, f: dy.conv2d(x, dy.reshape(f, (4, 4, 3)), [1, 1]), "filter"),
    (lambda x, f: dy.conv2d(x, f, [0, 1]), "stride"),
    (lambda x, f: dy.maxpooling2d(x, [5, 1], [1, 1]), "larger than the input"),
    (lambda x, f: dy.kmax_pooling(x, 9, 1), "k=9"),
])
def test_bad_arguments_raise_at_record_time(build, match):
    dy.renew_cg()
    x = dy.inputTensor([[[1.0, 2.0]] * 3] * 4)  # (4, 3, 2)
    f = dy.inputTensor([[[[1.0] * 3] * 4] * 2] * 2)  # (2, 2, 4, 3): 4 input channels
    with pytest.raises(dy.DynagraphError, match=match):
        build(x, f)


def test_kmax_pooling_keeps_the_k_largest_in_order_with_ties():
    """Ties go to the earlier entry; the k largest are always kept (DyNet 2.2 can drop one:
    README, remaining differences)."""
    dy.renew_cg()
    x = dy.inputTensor(np.array([[0.0, 0.0, 0.06, 0.0, 0.14]]))
    np.testing.assert_array_equal(dy.kmax_pooling(x, 3, 1).npvalue(), [[0.0, 0.06, 0.14]])
