"""Elementwise cases: unary, scalar-constant, broadcast binary and n-ary ops."""
from __future__ import annotations

import math

import numpy as np

import dynagraph as dy
from opcases import A, Case

V4, M42 = A((4,)), A((4, 2))
POS = A((4,), 0.3, 2.0)
SELU_A, SELU_L = 1.6732632423543772, 1.0507009873554805


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _elu(x, a):
    return np.where(x > 0, x, a * (np.exp(x) - 1.0))


def _u(cid, op, f, ref, arg=V4):
    return Case(cid, op, lambda k, x: f(x), [arg], lambda k, x: ref(x))


_BOUNDED = A((4,), -0.9, 0.9)
_OFF_INT = A((4,), 0.1, 0.4)  # + integers below: never at a jump of floor/ceil/round


def _rounded(cid, op, mode, ref):
    return Case(cid, op, lambda k, x: getattr(dy, op)(x * 1.0 + dy.inputTensor(np.array([-2.0, 0.0, 1.0, 3.0])),
                                                      mode),
                [_OFF_INT], lambda k, x: ref(x + np.array([-2.0, 0.0, 1.0, 3.0])),
                grad=None if mode == "straight_through_gradient" else 1.0)


MATH = [
    _u("sin", "sin", dy.sin, np.sin),
    _u("cos", "cos", dy.cos, np.cos),
    _u("tan", "tan", dy.tan, np.tan),
    _u("asin", "asin", dy.asin, np.arcsin, _BOUNDED),
    _u("acos", "acos", dy.acos, np.arccos, _BOUNDED),
    _u("atan", "atan", dy.atan, np.arctan),
    _u("sinh", "sinh", dy.sinh, np.sinh),
    _u("cosh", "cosh", dy.cosh, np.cosh),
    _u("asinh", "asinh", dy.asinh, np.arcsinh),
    _u("acosh", "acosh", dy.acosh, np.arccosh, A((4,), 1.2, 3.0)),
    _u("atanh", "atanh", dy.atanh, np.arctanh, _BOUNDED),
    _u("log_sigmoid", "log_sigmoid", dy.log_sigmoid, lambda x: np.log(_sig(x)), A((4,), -3.0, 3.0)),
    _u("silu", "silu", dy.silu, lambda x: x * _sig(x)),
    _u("silu_beta", "silu", lambda x: dy.silu(x, 2.5), lambda x: x * _sig(2.5 * x)),
    Case("scale_gradient", "scale_gradient", lambda k, x: dy.scale_gradient(x, 0.5), [V4], lambda k, x: x,
         grad=0.5),
    _rounded("floor_zero_gradient", "floor", "zero_gradient", np.floor),
    _rounded("ceil_zero_gradient", "ceil", "zero_gradient", np.ceil),
    _rounded("round_zero_gradient", "round", "zero_gradient", lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5)),
    _rounded("round_straight_through", "round", "straight_through_gradient",
             lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5)),
    # Special functions against Python's math module (an independent implementation).
    _u("erf", "erf", dy.erf, np.vectorize(math.erf), A((4,), -2.0, 2.0)),
    _u("erf_tails", "erf", dy.erf, np.vectorize(math.erf), A((3, 2), 2.5, 5.0)),
    _u("lgamma", "lgamma", dy.lgamma, np.vectorize(math.lgamma), A((4,), 0.05, 12.0)),
    # Negative non-integers: log|Gamma| by reflection (k-0.5 +- 0.3 stays away from the poles).
    Case("lgamma_negative", "lgamma",
         lambda k, x: dy.lgamma(x * 1.0 - dy.inputTensor(np.array([0.5, 1.5, 2.5, 7.5]))), [A((4,), -0.3, 0.3)],
         lambda k, x: np.vectorize(math.lgamma)(x - np.array([0.5, 1.5, 2.5, 7.5]))),
    # Finite differences of a one-hot are zero away from ties: the zero_gradient mode.
    _u("argmax", "argmax", lambda x: dy.argmax(x, "zero_gradient"),
       lambda x: (np.arange(x.size) == np.argmax(x)).astype(float), A((5,))),
    Case("argmax_straight_through", "argmax", lambda k, x: dy.argmax(x, "straight_through_gradient"), [A((5,))],
         lambda k, x: (np.arange(x.size) == np.argmax(x)).astype(float), grad=None),
]

UNARY = [
    _u("neg", "neg", lambda x: -x, lambda x: -x),
    _u("tanh", "tanh", dy.tanh, np.tanh),
    _u("tanh_matrix", "tanh", dy.tanh, np.tanh, M42),
    _u("logistic", "logistic", dy.logistic, _sig),
    _u("sigmoid_alias", "logistic", dy.sigmoid, _sig),
    _u("rectify", "rectify", dy.rectify, lambda x: np.where(x > 0, x, 0.0), A((4,), away0=True)),
    _u("relu_alias", "rectify", dy.relu, lambda x: x * (x > 0), A((2, 3), away0=True)),
    _u("elu", "elu", dy.elu, lambda x: _elu(x, 1.0), A((5,), away0=True)),
    _u("elu_alpha2", "elu", lambda x: dy.elu(x, 2.0), lambda x: _elu(x, 2.0), A((5,), away0=True)),
    _u("selu", "selu", dy.selu, lambda x: SELU_L * _elu(x, SELU_A), A((5,), away0=True)),
    _u("exp", "exp", dy.exp, np.exp),
    _u("log", "log", dy.log, np.log, POS),
    _u("square", "square", dy.square, lambda x: x ** 2),
    _u("cube", "cube", dy.cube, lambda x: x ** 3),
    _u("sqrt", "sqrt", dy.sqrt, np.sqrt, POS),
    _u("abs", "abs", dy.abs, np.abs, A((4,), away0=True)),
    _u("softsign", "softsign", dy.softsign, lambda x: x / (1 + np.abs(x)), A((4,), away0=True)),
    # Gradient control: the value passes through, the gradient is blocked or negated.
    Case("nobackprop", "nobackprop", lambda k, x: dy.nobackprop(x), [V4], lambda k, x: x, grad=0.0),
    Case("flip_gradient", "flip_gradient", lambda k, x: dy.flip_gradient(x), [V4], lambda k, x: x, grad=-1.0),
]

SCALAR_CONST = [
    _u("x_plus_2", "addc", lambda x: x + 2, lambda x: x + 2.0),
    _u("2_plus_x", "addc", lambda x: 2 + x, lambda x: 2.0 + x),
    _u("x_minus_2", "addc", lambda x: x - 2, lambda x: x - 2.0),
    _u("2_minus_x", "rsubc", lambda x: 2 - x, lambda x: 2.0 - x),
    _u("2_times_x", "mulc", lambda x: 2 * x, lambda x: 2.0 * x),
    _u("x_times_2", "mulc", lambda x: x * 2.5, lambda x: x * 2.5, M42),
    _u("x_div_2", "mulc", lambda x: x / 2, lambda x: x / 2.0),
    _u("2_div_x", "rdivc", lambda x: 2 / x, lambda x: 2.0 / x, A((4,), away0=True)),
    _u("x_pow_2", "powc", lambda x: x ** 2, lambda x: x * x),
    _u("x_pow_half", "powc", lambda x: x ** 0.5, np.sqrt, POS),
    _u("x_pow_neg3", "powc", lambda x: x ** -3, lambda x: 1.0 / x ** 3, POS),
]


def _b(cid, op, f, ref, x=V4, y=V4, **kw):
    return Case(cid, op, lambda k, a, b: f(a, b), [x, y], lambda k, a, b: ref(a, b), **kw)


def _colvec(b, nd):
    """DyNet broadcasting pads the smaller shape with trailing unit dims."""
    return b.reshape(b.shape + (1,) * (nd - b.ndim))


BINARY = [
    _b("add", "add", lambda x, y: x + y, lambda x, y: x + y),
    _b("cadd_alias", "add", dy.cadd, lambda x, y: x + y, M42, M42),
    _b("add_bcast_matrix_vector", "add", lambda x, y: x + y, lambda x, y: x + _colvec(y, 2), M42, V4),
    _b("add_bcast_vector_matrix", "add", lambda x, y: x + y, lambda x, y: _colvec(x, 2) + y, V4, M42),
    _b("add_bcast_row", "add", lambda x, y: x + y, lambda x, y: x + y, M42, A((1, 2))),
    _b("add_bcast_scalar", "add", lambda x, y: x + y, lambda x, y: x + y[0], M42, A((1,))),
    _b("sub", "sub", lambda x, y: x - y, lambda x, y: x - y),
    _b("sub_bcast", "sub", lambda x, y: x - y, lambda x, y: x - _colvec(y, 2), M42, V4),
    _b("cmult", "cmult", dy.cmult, lambda x, y: x * y),
    _b("cmult_bcast", "cmult", dy.cmult, lambda x, y: x * _colvec(y, 2), M42, V4),
    _b("cdiv", "cdiv", dy.cdiv, lambda x, y: x / y, V4, A((4,), away0=True)),
    _b("cdiv_bcast", "cdiv", dy.cdiv, lambda x, y: x / _colvec(y, 2), M42, A((4,), away0=True)),
    _b("x_pow_y", "pow", lambda x, y: x ** y, np.power, POS, V4),
    _b("pow_fn", "pow", dy.pow, np.power, POS, A((4,), 0.5, 2.5)),
    _b("bmax", "bmax", dy.bmax, np.maximum),
    _b("bmin", "bmin", dy.bmin, np.minimum, M42, M42),
    _b("bmax_bcast", "bmax", dy.bmax, lambda x, y: np.maximum(x, _colvec(y, 2)), M42, V4),
]


def _n(cid, op, f, ref, n=3, arg=V4):
    return Case(cid, op, lambda k, *xs: f(list(xs)), [arg] * n, lambda k, *xs: ref(np.stack(xs)))


NARY = [
    _n("esum", "esum", dy.esum, lambda s: s.sum(axis=0)),
    _n("esum_one", "esum", dy.esum, lambda s: s[0], n=1),
    _n("esum_matrix", "esum", dy.esum, lambda s: s.sum(axis=0), n=2, arg=M42),
    _n("average", "average", dy.average, lambda s: s.mean(axis=0)),
    _n("emax", "emax", dy.emax, lambda s: s.max(axis=0)),
    _n("emax_matrix", "emax", dy.emax, lambda s: s.max(axis=0), n=2, arg=M42),
    _n("logsumexp", "logsumexp", dy.logsumexp, lambda s: np.log(np.exp(s).sum(axis=0))),
]

CASES = UNARY + MATH + SCALAR_CONST + BINARY + NARY
