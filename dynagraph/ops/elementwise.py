"""Elementwise ops: unary, scalar-constant, binary with DyNet broadcasting, n-ary."""
from __future__ import annotations

from .base import ELEMWISE, broadcast_shape, defop, op, pad_to, reduce_to, same_shape

SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805


def _unary(name, f, df, cost=ELEMWISE):
    """f(xp, a, x) -> y ; df(xp, a, x, y, g) -> gx.  `a` holds the constant attrs."""
    def forward(xp, a, data, x):
        return f(xp, a, x)

    def backward(xp, a, data, xs, y, g, need):
        return (df(xp, a, xs[0], y, g),)
    return defop(name, same_shape, forward, backward, cost=cost)


def _elu(xp, alpha, x):
    return xp.where(x > 0, x, alpha * xp.expm1(xp.minimum(x, 0)))


NEG = _unary("neg", lambda xp, a, x: -x, lambda xp, a, x, y, g: -g)
def _tanh_grad(xp, y, g):
    t = y * y  # in place on one temporary: these run on every gate of every cell
    xp.subtract(1, t, out=t)
    t *= g
    return t


def _logistic(xp, x):
    t = x * 0.5
    xp.tanh(t, out=t)
    t *= 0.5
    t += 0.5
    return t


def _logistic_grad(xp, y, g):
    t = 1 - y
    t *= y
    t *= g
    return t


TANH = _unary("tanh", lambda xp, a, x: xp.tanh(x), lambda xp, a, x, y, g: _tanh_grad(xp, y, g))
# 0.5*tanh(x/2)+0.5 is the logistic function without exp overflow for large |x|.
LOGISTIC = _unary("logistic", lambda xp, a, x: _logistic(xp, x), lambda xp, a, x, y, g: _logistic_grad(xp, y, g))
RECTIFY = _unary("rectify", lambda xp, a, x: xp.maximum(x, 0), lambda xp, a, x, y, g: g * (x > 0))
ELU = _unary("elu", lambda xp, a, x: _elu(xp, a[0], x),
             lambda xp, a, x, y, g: g * xp.where(x > 0, 1.0, y + a[0]))
SELU = _unary("selu", lambda xp, a, x: SELU_SCALE * _elu(xp, SELU_ALPHA, x),
              lambda xp, a, x, y, g: g * xp.where(x > 0, SELU_SCALE, y + SELU_SCALE * SELU_ALPHA))
EXP = _unary("exp", lambda xp, a, x: xp.exp(x), lambda xp, a, x, y, g: g * y)
LOG = _unary("log", lambda xp, a, x: xp.log(x), lambda xp, a, x, y, g: g / x)
SQUARE = _unary("square", lambda xp, a, x: x * x, lambda xp, a, x, y, g: 2 * g * x)
CUBE = _unary("cube", lambda xp, a, x: x * x * x, lambda xp, a, x, y, g: 3 * g * x * x)
SQRT = _unary("sqrt", lambda xp, a, x: xp.sqrt(x), lambda xp, a, x, y, g: g / (2 * y))
ABS = _unary("abs", lambda xp, a, x: xp.abs(x), lambda xp, a, x, y, g: g * xp.sign(x))
SOFTSIGN = _unary("softsign", lambda xp, a, x: x / (1 + xp.abs(x)),
                  lambda xp, a, x, y, g: g / ((1 + xp.abs(x)) ** 2))
# Trigonometric and hyperbolic functions (DyNet 2.1+).
SIN = _unary("sin", lambda xp, a, x: xp.sin(x), lambda xp, a, x, y, g: g * xp.cos(x))
COS = _unary("cos", lambda xp, a, x: xp.cos(x), lambda xp, a, x, y, g: -g * xp.sin(x))
TAN = _unary("tan", lambda xp, a, x: xp.tan(x), lambda xp, a, x, y, g: g * (1 + y * y))
ASIN = _unary("asin", lambda xp, a, x: xp.arcsin(x), lambda xp, a, x, y, g: g / xp.sqrt(1 - x * x))
ACOS = _unary("acos", lambda xp, a, x: xp.arccos(x), lambda xp, a, x, y, g: -g / xp.sqrt(1 - x * x))
ATAN = _unary("atan", lambda xp, a, x: xp.arctan(x), lambda xp, a, x, y, g: g / (1 + x * x))
SINH = _unary("sinh", lambda xp, a, x: xp.sinh(x), lambda xp, a, x, y, g: g * xp.cosh(x))
COSH = _unary("cosh", lambda xp, a, x: xp.cosh(x), lambda xp, a, x, y, g: g * xp.sinh(x))
ASINH = _unary("asinh", lambda xp, a, x: xp.arcsinh(x), lambda xp, a, x, y, g: g / xp.sqrt(x * x + 1))
ACOSH = _unary("acosh", lambda xp, a, x: xp.arccosh(x), lambda xp, a, x, y, g: g / xp.sqrt(x * x - 1))
ATANH = _unary("atanh", lambda xp, a, x: xp.arctanh(x), lambda xp, a, x, y, g: g / (1 - x * x))
# log(logistic(x)) = -log(1 + e^-x), without overflow; its derivative is 1 - logistic(x) = 1 - e^y.
LOG_SIGMOID = _unary("log_sigmoid", lambda xp, a, x: -xp.logaddexp(0, -x), lambda xp, a, x, y, g: -g * xp.expm1(y))


def _silu_grad(xp, beta, x, g):
    s = _logistic(xp, beta * x)
    return g * (s + beta * x * s * (1 - s))


SILU = _unary("silu", lambda xp, a, x: x * _logistic(xp, a[0] * x), lambda xp, a, x, y, g: _silu_grad(xp, a[0], x, g))
SCALE_GRADIENT = _unary("scale_gradient", lambda xp, a, x: x, lambda xp, a, x, y, g: g * a[0])


def _round_half_away(xp, x):  # DyNet rounds 2.5 to 3 and -0.5 to -1 (numpy: half to even)
    return xp.sign(x) * xp.floor(xp.abs(x) + 0.5)


# attrs = (straight_through,): DyNet's gradient_mode "straight_through_gradient" passes the
# gradient unchanged; "zero_gradient" (the derivative almost everywhere) passes zero.
FLOOR = _unary("floor", lambda xp, a, x: xp.floor(x), lambda xp, a, x, y, g: g if a[0] else g * 0)
CEIL = _unary("ceil", lambda xp, a, x: xp.ceil(x), lambda xp, a, x, y, g: g if a[0] else g * 0)
ROUND = _unary("round", lambda xp, a, x: _round_half_away(xp, x), lambda xp, a, x, y, g: g if a[0] else g * 0)
# Scalar-constant forms: the constant is an attribute, hence part of the signature.
ADDC = _unary("addc", lambda xp, a, x: x + a[0], lambda xp, a, x, y, g: g)
MULC = _unary("mulc", lambda xp, a, x: x * a[0], lambda xp, a, x, y, g: g * a[0])
RSUBC = _unary("rsubc", lambda xp, a, x: a[0] - x, lambda xp, a, x, y, g: -g)
RDIVC = _unary("rdivc", lambda xp, a, x: a[0] / x, lambda xp, a, x, y, g: -g * y / x)
POWC = _unary("powc", lambda xp, a, x: x ** a[0], lambda xp, a, x, y, g: g * a[0] * x ** (a[0] - 1))
# Gradient control.
NOBACKPROP = defop("nobackprop", same_shape, lambda xp, a, d, x: x, None, blocks_grad=True)
FLIP_GRADIENT = _unary("flip_gradient", lambda xp, a, x: x, lambda xp, a, x, y, g: -g)


# ------------------------------------------------------------------ binary, broadcast
def _binary(name, f, dfx, dfy):
    """Binary op with DyNet broadcasting (trailing unit dims, any dim of size 1)."""
    def shape(a, xs, ys):
        return broadcast_shape(xs, ys)

    def forward(xp, a, data, x, y):
        nd = max(x.ndim, y.ndim) - 1
        return f(xp, pad_to(x, nd), pad_to(y, nd))

    def backward(xp, a, data, xs, out, g, need):
        x, y = xs
        nd = max(x.ndim, y.ndim) - 1
        px, py = pad_to(x, nd), pad_to(y, nd)
        gx = reduce_to(dfx(xp, px, py, out, g), x.shape) if need[0] else None
        gy = reduce_to(dfy(xp, px, py, out, g), y.shape) if need[1] else None
        return gx, gy
    return defop(name, shape, forward, backward)


ADD = _binary("add", lambda xp, x, y: x + y, lambda xp, x, y, o, g: g, lambda xp, x, y, o, g: g)
SUB = _binary("sub", lambda xp, x, y: x - y, lambda xp, x, y, o, g: g, lambda xp, x, y, o, g: -g)
CMULT = _binary("cmult", lambda xp, x, y: x * y, lambda xp, x, y, o, g: g * y, lambda xp, x, y, o, g: g * x)
CDIV = _binary("cdiv", lambda xp, x, y: x / y, lambda xp, x, y, o, g: g / y, lambda xp, x, y, o, g: -g * o / y)
POW = _binary("pow", lambda xp, x, y: x ** y, lambda xp, x, y, o, g: g * y * x ** (y - 1),
              lambda xp, x, y, o, g: g * o * xp.log(x))
BMAX = _binary("bmax", lambda xp, x, y: xp.maximum(x, y), lambda xp, x, y, o, g: g * (x >= y),
               lambda xp, x, y, o, g: g * (x < y))
BMIN = _binary("bmin", lambda xp, x, y: xp.minimum(x, y), lambda xp, x, y, o, g: g * (x <= y),
               lambda xp, x, y, o, g: g * (x > y))


# ------------------------------------------------------------------------ n-ary
def _same_shapes(a, *shapes):
    if len(set(shapes)) != 1:
        raise ValueError(f"all arguments must have the same shape, got {', '.join(map(str, shapes))}")
    return shapes[0]


def _stack_args(xp, xs):
    """Stack n same-shaped batched args into (n, L, ...) broadcasting shared ones."""
    lead = max(x.shape[0] for x in xs)
    return xp.stack([xp.broadcast_to(x, (lead,) + x.shape[1:]) for x in xs])


@op("esum", _same_shapes)
class ESum:
    def forward(xp, a, data, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    def backward(xp, a, data, xs, y, g, need):
        return tuple(reduce_to(g, x.shape) if n else None for x, n in zip(xs, need))


@op("average", _same_shapes)
class Average:
    def forward(xp, a, data, *xs):
        return ESum.forward(xp, a, data, *xs) * (1.0 / len(xs))

    def backward(xp, a, data, xs, y, g, need):
        return ESum.backward(xp, a, data, xs, y, g * (1.0 / len(xs)), need)


@op("emax", _same_shapes)
class EMax:
    def forward(xp, a, data, *xs):
        return _stack_args(xp, xs).max(axis=0)

    def backward(xp, a, data, xs, y, g, need):
        winner = _stack_args(xp, xs).argmax(axis=0)  # ties go to the first argument
        return tuple(reduce_to(g * (winner == i), x.shape) if n else None
                     for i, (x, n) in enumerate(zip(xs, need)))


@op("logsumexp", _same_shapes, cost=ELEMWISE)
class LogSumExp:
    def forward(xp, a, data, *xs):
        s = _stack_args(xp, xs)
        m = s.max(axis=0)
        return m + xp.log(xp.exp(s - m).sum(axis=0))

    def backward(xp, a, data, xs, y, g, need):
        return tuple(reduce_to(g * xp.exp(x - y), x.shape) if n else None for x, n in zip(xs, need))

