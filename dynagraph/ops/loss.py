"""Softmax family and losses. Per-node class indices travel as data, so a batch
of losses with different gold labels is still one kernel."""
from __future__ import annotations

from .base import REDUCE, op, reduce_to


def _vector(name):
    def shape(a, s):
        if len(s) != 1:
            raise ValueError(f"{name} needs a vector, got shape {s}")
        return (1,)
    return shape


def _label_check(a, index, s):
    if not 0 <= index < s[0]:
        raise IndexError(f"label {index} out of range for a vector of size {s[0]}")


def _shifted(xp, x, axis):
    """(x - m, log(sum(exp(x - m)))) with m the maximum along `axis`.

    Log-softmax is their difference. Adding m and the log-sum into one number first
    would round the log-sum away once |m| dwarfs it (logits of 1e8 in float64, 1e4 in
    float32), so callers keep the two apart.
    """
    z = x - x.max(axis=axis, keepdims=True)
    return z, xp.log(xp.exp(z).sum(axis=axis, keepdims=True))


def _softmax_shape(a, s):
    if a[0] >= len(s):
        raise ValueError(f"dimension {a[0]} out of range for shape {s}")
    return s


@op("softmax", _softmax_shape, cost=REDUCE)
class Softmax:
    def forward(xp, a, data, x):
        z, ls = _shifted(xp, x, a[0] + 1)
        return xp.exp(z - ls)

    def backward(xp, a, data, xs, y, g, need):
        return (y * (g - (g * y).sum(axis=a[0] + 1, keepdims=True)),)


def _log_softmax_shape(a, s):
    if len(s) > 2:
        raise ValueError(f"log_softmax needs a vector or a matrix, got {s}")
    restrict = a[0]
    if restrict is not None and any(not 0 <= i < s[0] for i in restrict):
        raise IndexError(f"restrict indices {list(restrict)} out of range for size {s[0]}")
    return s


@op("log_softmax", _log_softmax_shape, cost=REDUCE)
class LogSoftmax:
    """Column-wise; with `restrict`, classes outside the list get -inf."""
    def forward(xp, a, data, x):
        restrict = a[0]
        if restrict is None:
            z, ls = _shifted(xp, x, 1)
            return z - ls
        mask = xp.full(x.shape[1:2], -xp.inf, dtype=x.dtype)
        mask[list(restrict)] = 0
        z, ls = _shifted(xp, x + mask.reshape((1, -1) + (1,) * (x.ndim - 2)), 1)
        return z - ls

    def backward(xp, a, data, xs, y, g, need):
        # Classes a restriction left out (y = -inf) have softmax 0 and pass their own
        # gradient through: a loss built on them is infinite and must show it, so
        # nothing here is zeroed.
        return (g - xp.exp(y) * g.sum(axis=1, keepdims=True),)


@op("pickneglogsoftmax", _vector("pickneglogsoftmax"), cost=REDUCE, uses_data=True)
class PickNegLogSoftmax:
    check = _label_check

    def forward(xp, a, data, x):
        n = len(data)
        z, ls = _shifted(xp, xp.broadcast_to(x, (n,) + x.shape[1:]), 1)
        return ls - z[xp.arange(n), xp.asarray(data)][:, None]

    def backward(xp, a, data, xs, y, g, need):
        x = xp.broadcast_to(xs[0], (len(data),) + xs[0].shape[1:])
        z, ls = _shifted(xp, x, 1)
        gx = xp.exp(z - ls)
        gx[xp.arange(len(data)), xp.asarray(data)] -= 1
        return (reduce_to(gx * g, xs[0].shape),)


def _hinge_shape(a, s):
    return _vector("hinge")(a, s)


def _hinge_terms(xp, a, data, x):
    # A module function, not a method: @op replaces the class by its OpDef.
    n = len(data)
    x = xp.broadcast_to(x, (n,) + x.shape[1:])
    gold = x[xp.arange(n), xp.asarray(data)][:, None]
    t = xp.maximum(a[0] - gold + x, 0)
    t[xp.arange(n), xp.asarray(data)] = 0
    return t


@op("hinge", _hinge_shape, cost=REDUCE, uses_data=True)
class Hinge:
    """sum over i != gold of max(0, margin - x[gold] + x[i])."""
    check = _label_check

    def forward(xp, a, data, x):
        return _hinge_terms(xp, a, data, x).sum(axis=1, keepdims=True)

    def backward(xp, a, data, xs, y, g, need):
        active = (_hinge_terms(xp, a, data, xs[0]) > 0).astype(g.dtype)
        gx = active * g
        n = len(data)
        gx[xp.arange(n), xp.asarray(data)] = -active.sum(axis=1) * g[:, 0]
        return (reduce_to(gx, xs[0].shape),)


def _pair_scalar(name):
    def shape(a, sx, sy):
        if sx != sy:
            raise ValueError(f"{name} needs equal shapes, got {sx} and {sy}")
        return (1,)
    return shape


def _rowsum(x):
    return x.reshape(x.shape[0], -1).sum(axis=1, keepdims=True)


def _expand(g, nd):
    return g.reshape((g.shape[0],) + (1,) * (nd - 1))


@op("squared_distance", _pair_scalar("squared_distance"), cost=REDUCE)
class SquaredDistance:
    def forward(xp, a, data, x, y):
        d = x - y
        return _rowsum(d * d)

    def backward(xp, a, data, xs, out, g, need):
        x, y = xs
        d = 2 * (x - y) * _expand(g, max(x.ndim, y.ndim))
        return (reduce_to(d, x.shape) if need[0] else None, reduce_to(-d, y.shape) if need[1] else None)


def _xent_terms(xp, x, y):
    """y log x + (1 - y) log(1 - x), with a term whose weight is exactly 0 left out
    (so a hard label at the matching end point costs 0, not 0 * -inf = nan)."""
    return y * xp.log(xp.where(y == 0, 1.0, x)) + (1 - y) * xp.log(xp.where(y == 1, 1.0, 1 - x))


# Unlike DyNet, which replaces log(0) by log(FLT_MIN) (a loss of 87 per element with
# a gradient that a saturated logistic then zeroes), a prediction at the exact end
# point opposite its label costs an infinite loss with an infinite gradient, so the
# trainer raises NonFiniteError instead of silently learning nothing. Interior values
# are never clipped: they are representable in float64.
@op("binary_log_loss", _pair_scalar("binary_log_loss"), cost=REDUCE)
class BinaryLogLoss:
    def forward(xp, a, data, x, y):
        return -_rowsum(_xent_terms(xp, x, y))

    def backward(xp, a, data, xs, out, g, need):
        x, y = xs
        ge = _expand(g, max(x.ndim, y.ndim))
        gx = gy = None
        if need[0]:
            # d/dx, each term divided only where its weight is non-zero (no 0/0 at x == y)
            d = (1 - y) / xp.where(y == 1, 1.0, 1 - x) - y / xp.where(y == 0, 1.0, x)
            gx = reduce_to(ge * xp.where(x == y, 0.0, d), x.shape)
        if need[1]:
            gy = reduce_to(ge * (xp.log(1 - x) - xp.log(x)), y.shape)
        return gx, gy


@op("squared_norm", lambda a, s: (1,), cost=REDUCE)
class SquaredNorm:
    def forward(xp, a, data, x):
        return _rowsum(x * x)

    def backward(xp, a, data, xs, y, g, need):
        return (2 * xs[0] * _expand(g, xs[0].ndim),)


@op("l2_norm", lambda a, s: (1,), cost=REDUCE)
class L2Norm:
    def forward(xp, a, data, x):
        return xp.sqrt(_rowsum(x * x))

    def backward(xp, a, data, xs, y, g, need):
        safe = xp.where(y > 0, y, 1)
        return (xs[0] * _expand(g / safe, xs[0].ndim),)


