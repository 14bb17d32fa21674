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


def test_binary_log_loss_end_points_are_exact_not_clamped(float64):
    """A prediction at the end point matching its label costs 0; at the opposite end point
    the loss is infinite and backward raises, where DyNet's log(FLT_MIN) would report 87
    with a zero gradient through a saturated logistic. Interior values are not clipped."""
    x = dy.inputVector([0.0, 1.0, 1 - 1e-9])
    y = dy.inputVector([0.0, 1.0, 0.0])
    np.testing.assert_allclose(dy.binary_log_loss(x, y).value(), -np.log(1e-9), rtol=1e-6)
    pc = dy.ParameterCollection()
    p = pc.add_parameters(1, init=dy.ConstInitializer(5.0))
    before = p.as_array().copy()
    trainer = dy.SimpleSGDTrainer(pc)
    loss = dy.binary_log_loss(dy.logistic(100 * dy.parameter(p)), dy.inputVector([0.0]))
    with np.errstate(divide="ignore", invalid="ignore"):
        assert loss.value() == np.inf
        with pytest.raises(dy.NonFiniteError, match="binary_log_loss"):
            loss.backward()
    trainer.update()
    np.testing.assert_array_equal(p.as_array(), before)