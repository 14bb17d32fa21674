"""Reference checks for the loss ops: value vs numpy, gradients vs finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from cases_loss import CASES
from opcases import params, run_reference


@pytest.mark.parametrize("case", params(CASES))
def test_reference(case):
    run_reference(case)


def test_binary_log_loss_end_points_are_finite_as_in_dynet():
    """DyNet replaces log(0) by log(FLT_MIN) instead of clipping interior values."""
    big = -np.log(np.finfo(np.float32).tiny)          # 87.336...
    dy.renew_cg()
    x = dy.inputVector([0.0, 1.0, 0.0, 1.0, 1 - 1e-9])
    y = dy.inputVector([1.0, 0.0, 0.0, 1.0, 0.0])
    # The last entry is representable in float64: no clipping to 1 - 1e-7.
    want = 2 * big + 0.0 + 0.0 - np.log(1e-9)
    np.testing.assert_allclose(dy.binary_log_loss(x, y).value(), want, rtol=1e-6)
