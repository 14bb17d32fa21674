"""Non-finite values are never hidden: an inf or nan loss or gradient reaches the user as
NonFiniteError naming the op, with every parameter left unchanged; under check_validity
the op that first produced the value is named."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy


def _model(init=0.5):
    pc = dy.ParameterCollection()
    W = pc.add_parameters((3, 3), init=dy.ConstInitializer(init))
    return pc, W, dy.AdamTrainer(pc)


def _unchanged(W, before, trainer):
    trainer.update()            # the user carries on regardless: still nothing moves
    np.testing.assert_array_equal(W.as_array(), before)


@pytest.mark.parametrize("scheduler", ["none", "agenda"])
def test_restricted_log_softmax_infinite_loss_raises(scheduler):
    pc, W, trainer = _model()
    before = W.as_array().copy()
    dy.renew_cg(scheduler=scheduler)
    ls = dy.log_softmax(dy.parameter(W) * dy.inputVector([1.0, 2.0, 3.0]), restrict=[0, 1])
    loss = -dy.pick(ls, 2)                       # a class the restriction left out: -log 0
    assert loss.value() == np.inf
    with pytest.raises(dy.NonFiniteError, match="non-finite loss"):
        loss.backward()
    _unchanged(W, before, trainer)


def test_log_softmax_gradient_at_overflowing_logits_is_not_zeroed():
    """float32 log_softmax([3e38, -3e38]) is [0, -inf] (the difference overflows); the
    old backward zeroed the gradient there, so an infinite loss trained on silently."""
    pc = dy.ParameterCollection()
    p = pc.add_parameters(2, init=dy.NumpyInitializer(np.array([3e38, -3e38])))
    trainer = dy.SimpleSGDTrainer(pc)
    before = p.as_array().copy()
    loss = -dy.pick(dy.log_softmax(dy.parameter(p)), 1)
    with np.errstate(over="ignore"), pytest.raises(dy.NonFiniteError):
        loss.backward()
    _unchanged(p, before, trainer)


def test_nan_loss_raises_and_names_the_op():
    pc, W, trainer = _model(-1.0)
    before = W.as_array().copy()
    loss = dy.sum_elems(dy.log(dy.parameter(W)))   # log of negatives: nan
    with np.errstate(invalid="ignore"):
        with pytest.raises(dy.NonFiniteError, match="sum_elems"):
            loss.backward()
    _unchanged(W, before, trainer)


def test_check_validity_names_the_producing_op():
    pc, W, trainer = _model(-1.0)
    dy.renew_cg(check_validity=True)
    with np.errstate(invalid="ignore"):
        with pytest.raises(dy.NonFiniteError, match="^log produced"):
            dy.sum_elems(dy.tanh(dy.log(dy.parameter(W)))).value()


def test_finite_loss_with_infinite_gradient_leaves_parameters_unchanged():
    """sqrt at 0 has a finite value and an infinite derivative: the trainer refuses."""
    pc, W, trainer = _model(0.0)
    before = W.as_array().copy()
    loss = dy.sum_elems(dy.sqrt(dy.parameter(W)))
    assert loss.value() == 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        loss.backward()
    with pytest.raises(dy.NonFiniteError, match="gradient"):
        trainer.update()
        W.as_array()  # on two cores update() ran on the overlap thread: its error surfaces here
    np.testing.assert_array_equal(W.as_array(), before)
