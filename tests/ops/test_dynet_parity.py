"""Parity with DyNet itself (skipped when DyNet is not installed).

The same builder runs on `dynet` and on `dynagraph` (the API is the same), on the
same float32-representable inputs; values and gradients must agree to float32
precision. This pins conventions a numpy reference could get wrong on both sides:
column-major reshape, pick on matrices, column-wise softmax, hinge, elu/selu, ...
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy

dynet = pytest.importorskip("dynet")


def _arr(shape, lo=-1.0, hi=1.0, seed=0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32).astype(np.float64)


M34, V5 = _arr((3, 4), seed=1), _arr((5,), -2, 2, seed=2)
POS = _arr((4,), 0.3, 2.0, seed=3)
PROB = _arr((4,), 0.05, 0.95, seed=4)
AWAY = np.array([-0.7, 0.3, -0.25, 0.9, 0.5])
ROUNDING = np.array([1.3, 2.5, -0.5, -2.5, 0.2])  # halves: DyNet rounds them away from zero

CASES = {
    "reshape_column_major": (lambda m, x: m.reshape(x, (4, 3)), [M34]),
    "reshape_to_vector": (lambda m, x: m.reshape(x, (12,)), [M34]),
    "pick_matrix_d0": (lambda m, x: m.pick(x, 1, 0), [M34]),
    "pick_matrix_d1": (lambda m, x: m.pick(x, 2, 1), [M34]),
    "pick_vector": (lambda m, x: m.pick(x, 3), [V5]),
    "pick_range_d1": (lambda m, x: m.pick_range(x, 1, 3, 1), [M34]),
    "select_cols": (lambda m, x: m.select_cols(x, [3, 0]), [M34]),
    "softmax_matrix": (lambda m, x: m.softmax(x), [M34]),
    "softmax_vector": (lambda m, x: m.softmax(x), [V5]),
    "log_softmax_matrix": (lambda m, x: m.log_softmax(x), [M34]),
    "log_softmax_restrict": (lambda m, x: m.pick(m.log_softmax(x, [0, 2, 3]), 2), [V5]),
    "pickneglogsoftmax": (lambda m, x: m.pickneglogsoftmax(x, 2), [V5]),
    "hinge": (lambda m, x: m.hinge(x, 1), [V5]),
    "hinge_margin": (lambda m, x: m.hinge(x, 4, 0.3), [V5]),
    # Only the prediction's gradient: DyNet's gradient w.r.t. the target reuses the
    # prediction's formula with the arguments swapped, which is not the derivative.
    "binary_log_loss": (lambda m, x, y: m.binary_log_loss(x, m.nobackprop(y)), [PROB, PROB[::-1].copy()]),
    # End points that agree with their label: a prediction at the opposite end point is
    # an infinite loss here (NonFiniteError), where DyNet reports log(FLT_MIN) and a
    # gradient a saturated logistic zeroes (tests/ops/test_loss.py).
    "binary_log_loss_end_points": (lambda m, x, y: m.binary_log_loss(x, m.nobackprop(y)),
                                   [np.array([0.0, 1.0, 0.0, 1.0, 0.3]), np.array([0.0, 1.0, 0.0, 1.0, 1.0])]),
    "elu": (lambda m, x: m.elu(x), [AWAY]),
    "elu_alpha": (lambda m, x: m.elu(x, 2.5), [AWAY]),
    "selu": (lambda m, x: m.selu(x), [AWAY]),
    "logistic": (lambda m, x: m.logistic(x), [V5]),
    "softsign": (lambda m, x: m.softsign(x), [AWAY]),
    "transpose_vector": (lambda m, x: m.transpose(x), [V5]),
    "matmul_transposed": (lambda m, x, v: m.transpose(x) * v, [M34, _arr((3,), seed=5)]),
    "broadcast_add": (lambda m, x, v: x + v, [M34, _arr((3,), seed=6)]),
    "colwise_add": (lambda m, x, v: m.colwise_add(x, v), [M34, _arr((3,), seed=7)]),
    "affine": (lambda m, b, W, x: m.affine_transform([b, W, x]), [_arr((3,), seed=8), M34, _arr((4,), seed=9)]),
    "concatenate_cols": (lambda m, x, y: m.concatenate_cols([x, y]), [V5, AWAY]),
    "concatenate_d1": (lambda m, x: m.concatenate([x, x], d=1), [M34]),
    "sum_dim": (lambda m, x: m.sum_dim(x, [1]), [M34]),
    "max_dim": (lambda m, x: m.max_dim(x, 1), [M34]),
    "min_dim": (lambda m, x: m.min_dim(x, 0), [M34]),
    "mean_elems": (lambda m, x: m.mean_elems(x), [M34]),
    "l2_norm": (lambda m, x: m.l2_norm(x), [V5]),
    "squared_distance": (lambda m, x, y: m.squared_distance(x, y), [V5, AWAY]),
    "dot_product": (lambda m, x, y: m.dot_product(x, y), [V5, AWAY]),
    "logsumexp": (lambda m, x, y: m.logsumexp([x, y]), [V5, AWAY]),
    "emax": (lambda m, x, y: m.emax([x, y]), [V5, AWAY]),
    "cdiv": (lambda m, x, y: m.cdiv(x, y), [V5, AWAY]),
    # (this DyNet build lacks the reflected forms 2 - x, 2 * x, 2 / x)
    "scalar_forms": (lambda m, x: m.cmult(x - 2, x) * 3 + x / 2 + x ** 3 - (-x), [POS]),
    "pow_scalar_exponent": (lambda m, x, y: m.pow(x, y), [POS, _arr((1,), seed=10)]),
    "flip_gradient": (lambda m, x: m.flip_gradient(x), [V5]),
    "softmax_d1": (lambda m, x: m.softmax(x, 1), [M34]),
    "mean_dim": (lambda m, x: m.mean_dim(x, [0], False), [M34]),
    "sum_dim_all": (lambda m, x: m.sum_dim(x, [0, 1]), [M34]),
    "esum_average": (lambda m, x, y: m.esum([x, y]) + m.average([x, y, y]), [V5, AWAY]),
    "unary_mix": (lambda m, x: m.tanh(x) + m.exp(x) + m.log(x) + m.sqrt(x) + m.cube(x) + m.square(x), [POS]),
    "kinks": (lambda m, x, y: m.abs(x) + m.rectify(x) + m.bmax(x, y) + m.bmin(x, y), [AWAY, V5]),
    "select_rows": (lambda m, x: m.select_rows(x, [2, 0, 2]), [M34]),
    "matmul_matrices": (lambda m, x, y: x * y, [M34, _arr((4, 2), seed=11)]),
    "transpose_matrix": (lambda m, x: m.transpose(x), [M34]),
    "squared_norm": (lambda m, x: m.squared_norm(x), [V5]),
    "concatenate": (lambda m, x, y: m.concatenate([x, y]), [V5, AWAY]),
    "sum_elems_matrix": (lambda m, x: m.sum_elems(x), [M34]),
    "trig": (lambda m, x: m.sin(x) + m.cos(x) + m.tan(x) + m.atan(x) + m.sinh(x) + m.cosh(x) + m.asinh(x), [V5]),
    "inverse_trig": (lambda m, x: m.asin(x) + m.acos(x) + m.atanh(x), [_arr((4,), -0.9, 0.9, seed=24)]),
    "acosh": (lambda m, x: m.acosh(x), [_arr((4,), 1.2, 3.0, seed=25)]),
    # silu's beta only at 1: DyNet 2.2's gradient for beta != 1 leaves beta out of x s'(beta x)
    "log_sigmoid_silu": (lambda m, x: m.log_sigmoid(x) + m.silu(x), [V5]),
    "scale_gradient": (lambda m, x: m.scale_gradient(x, 0.25), [V5]),
    # DyNet 2.2 passes the gradient straight through in both modes; its "zero_gradient" is not compared
    # images: cross-correlation, TensorFlow's SAME padding, -inf pool padding, kmax order
    "conv2d_valid": (lambda m, x, f: m.conv2d(x, f, [1, 1]), [_arr((5, 6, 2), seed=13), _arr((3, 2, 2, 3), seed=14)]),
    "conv2d_same_strided": (lambda m, x, f: m.conv2d(x, f, [2, 3], False),
                            [_arr((5, 7, 2), seed=15), _arr((2, 3, 2, 3), seed=16)]),
    "conv2d_bias_2d_input": (lambda m, x, f, b: m.conv2d_bias(x, f, b, [1, 2], False),
                             [_arr((4, 4), seed=17), _arr((2, 2, 1, 3), seed=18), _arr((3,), seed=19)]),
    "maxpooling2d_valid": (lambda m, x: m.maxpooling2d(x, [2, 2], [2, 2]), [_arr((5, 6, 2), seed=20)]),
    "maxpooling2d_same_negative": (lambda m, x: m.maxpooling2d(x, [2, 3], [2, 2], False),
                                   [_arr((5, 7, 2), -4, -2, seed=21)]),
    "kmax_pooling_d1": (lambda m, x: m.kmax_pooling(x, 2), [_arr((3, 6), seed=22)]),
    "kmax_pooling_d0": (lambda m, x: m.kmax_pooling(x, 3, 0), [_arr((5, 2), seed=23)]),
    # special functions; lgamma is log|Gamma| on negative non-integers too
    "erf": (lambda m, x: m.erf(x), [V5]),
    "erf_tails": (lambda m, x: m.erf(x), [np.array([-4.0, -2.75, 2.5, 3.25, 6.0])]),
    "lgamma": (lambda m, x: m.lgamma(x), [np.array([0.3, 1.75, 4.25, 11.5, -0.5, -2.25])]),
    "argmax_zero_gradient": (lambda m, x: m.argmax(x, "zero_gradient"), [V5]),
    "argmax_straight_through": (lambda m, x: m.argmax(x, "straight_through_gradient"), [V5]),
    "argmax_tie_goes_first": (lambda m, x: m.argmax(x, "straight_through_gradient"),
                              [np.array([0.5, 2.0, -1.0, 2.0, 1.0])]),
}


def _run(lib, build, arrays):
    pc = lib.ParameterCollection()
    ps = [pc.parameters_from_numpy(a.copy()) for a in arrays]
    lib.renew_cg()
    out = build(lib, *[p.expr(True) for p in ps])
    value = np.asarray(out.npvalue(), dtype=np.float64)
    shape = tuple(out.dim()[0])
    w = np.random.default_rng(99).normal(size=shape)
    loss = lib.sum_elems(lib.cmult(out, lib.inputTensor(w)))
    loss.value()
    loss.backward()
    return value.reshape(shape), [np.asarray(p.grad_as_array()).reshape(a.shape) for p, a in zip(ps, arrays)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_dynet(name):
    build, arrays = CASES[name]
    want_v, want_g = _run(dynet, build, arrays)
    got_v, got_g = _run(dy, build, arrays)
    assert got_v.shape == want_v.shape
    np.testing.assert_allclose(got_v, want_v, rtol=2e-5, atol=2e-6, err_msg="value")
    for k, (g, w) in enumerate(zip(got_g, want_g)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"gradient of input {k}")


def _lookup_grads(lib, table):
    pc = lib.ParameterCollection()
    E = pc.lookup_parameters_from_numpy(table.copy())
    lib.renew_cg()
    loss = lib.sum_elems(lib.cmult(E[1] + lib.lookup(E, 3) + E[1], lib.inputTensor(np.arange(1.0, 4.0))))
    value = loss.value()
    loss.backward()
    return value, np.asarray(E.grad_as_array())


def test_lookup_gradient_matches_dynet():
    table = _arr((5, 3), seed=12)
    want_v, want_g = _lookup_grads(dynet, table)
    got_v, got_g = _lookup_grads(dy, table)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-5)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-5)


def test_input_matrix_and_vec_value_match_dynet():
    # dynet.inputMatrix itself now raises (deprecated); a column-major fill is the
    # same thing as reshaping the vector, which DyNet still does.
    vals = list(np.arange(6.0))
    dynet.renew_cg()
    want = dynet.reshape(dynet.inputVector(vals), (2, 3))
    got = dy.inputMatrix(vals, (2, 3))
    np.testing.assert_array_equal(got.npvalue(), want.npvalue())
    assert dy.reshape(got, (3, 2)).vec_value() == dynet.reshape(want, (3, 2)).vec_value()


@pytest.mark.parametrize("name", ["floor", "ceil", "round"])
def test_rounding_values_match_dynet(name):
    """Values only: DyNet 2.2's gradients of floor/ceil/round are unreliable (the same call gives
    the output gradient or zero depending on what ran before, whatever gradient_mode says), so
    dynagraph follows the documented modes, checked against finite differences instead."""
    want, _ = _run(dynet, lambda m, x: getattr(m, name)(x, "straight_through_gradient"), [ROUNDING])
    got, got_g = _run(dy, lambda m, x: getattr(m, name)(x, "straight_through_gradient"), [ROUNDING])
    np.testing.assert_array_equal(got, want)
    _, zero = _run(dy, lambda m, x: getattr(m, name)(x, "zero_gradient"), [ROUNDING])
    assert got_g[0].any() and not zero[0].any()


def _conv_net_training(lib):
    """DyNet's MNIST --conv style: conv2d_bias, rectify, maxpooling2d, kmax_pooling, a softmax
    layer; two SGD updates from the same weights. Returns losses and weights after training."""
    rng = np.random.default_rng(0)
    pc = lib.ParameterCollection()
    F = pc.parameters_from_numpy(_arr((3, 3, 1, 4), -0.3, 0.3, seed=30))
    b = pc.parameters_from_numpy(np.zeros(4))
    W = pc.parameters_from_numpy(_arr((3, 64), -0.3, 0.3, seed=31))
    trainer = lib.SimpleSGDTrainer(pc, 0.1)
    images = rng.uniform(0, 1, (6, 8, 8, 1)).astype(np.float32).astype(np.float64)
    losses = []
    for _ in range(2):
        lib.renew_cg()
        parts = []
        for x, label in zip(images, [0, 1, 2, 0, 1, 2]):
            c = lib.conv2d_bias(lib.inputTensor(x), lib.parameter(F), lib.parameter(b), [1, 1], is_valid=False)
            p = lib.maxpooling2d(lib.rectify(c), [2, 2], [2, 2])
            # kmax on values without ties: DyNet 2.2 returns the first k entries >= the k-th
            # largest, which with ties (the zeros of a rectifier) need not be the k largest
            top = lib.kmax_pooling(lib.reshape(lib.maxpooling2d(c, [2, 2], [2, 2]), (16, 4)), 3, 0)
            parts.append(lib.pickneglogsoftmax(lib.parameter(W) * lib.reshape(p, (64,)), label)
                         + lib.sum_elems(top) * 0.01)
        loss = lib.esum(parts)
        losses.append(loss.value())
        loss.backward()
        trainer.update()
    return losses, [F.as_array(), b.as_array(), W.as_array()]


def test_conv_net_training_matches_dynet():
    want_l, want_w = _conv_net_training(dynet)
    got_l, got_w = _conv_net_training(dy)
    np.testing.assert_allclose(got_l, want_l, rtol=1e-4)
    for g, w in zip(got_w, want_w):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def _masks(lib, make, x):
    lib.renew_cg()
    return np.asarray(make(lib, lib.inputTensor(x, batched=x.ndim == 3)).npvalue()) / x


@pytest.mark.parametrize("name", ["dropout_dim_d0", "dropout_dim_d1", "dropout_batch"])
def test_dropout_dim_and_batch_masks_have_dynets_structure(name):
    """The draws differ (dynagraph's are counter-based); what each call shares and its scale
    must be DyNet's: the mask is constant along the shared axes and takes values 0 or 1/(1-p)."""
    make, shared, x = {
        "dropout_dim_d0": (lambda m, e: m.dropout_dim(e, 0, 0.5), (0,), _arr((3, 200), 1, 2, seed=40)),
        "dropout_dim_d1": (lambda m, e: m.dropout_dim(e, 1, 0.5), (1,), _arr((200, 3), 1, 2, seed=41)),
        # 200 samples of shape (3, 2): DyNet's batch is the last axis of the numpy value
        "dropout_batch": (lambda m, e: m.dropout_batch(e, 0.5), (0, 1), _arr((3, 2, 200), 1, 2, seed=42)),
    }[name]
    for lib in (dynet, dy):
        mask = _masks(lib, make, x)
        first = mask[tuple(slice(0, 1) if a in shared else slice(None) for a in range(mask.ndim))]
        np.testing.assert_allclose(mask, np.broadcast_to(first, mask.shape), rtol=1e-6, err_msg=lib.__name__)
        assert set(np.round(np.unique(mask), 5)) == {0.0, 2.0}, lib.__name__
