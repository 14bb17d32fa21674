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


def _lse(xp, x, axis):
    m = x.max(axis=axis, keepdims=True)
    return m + xp.log(xp.exp(x - m).sum(axis=axis, keepdims=True))


def _softmax_shape(a, s):
    if a[0] >= len(s):
        raise ValueError(f"dimension {a[0]} out of range for shape {s}")
    return s


@op("softmax", _softmax_shape, cost=REDUCE)
class Softmax:
    def forward(xp, a, data, x):
        return xp.exp(x - _lse(xp, x, a[0] + 1))

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
            return x - _lse(xp, x, 1)
        mask = xp.full(x.shape[1:2], -xp.inf, dtype=x.dtype)
        mask[list(restrict)] = 0
        z = x + mask.reshape((1, -1) + (1,) * (x.ndim - 2))
        return z - _lse(xp, z, 1)

    def backward(xp, a, data, xs, y, g, need):
        p = xp.exp(y)
        gz = xp.where(xp.isfinite(y), g, 0)
        return (gz - p * gz.sum(axis=1, keepdims=True),)


@op("pickneglogsoftmax", _vector("pickneglogsoftmax"), cost=REDUCE, uses_data=True)
class PickNegLogSoftmax:
    check = _label_check

    def forward(xp, a, data, x):
        n = len(data)
        x = xp.broadcast_to(x, (n,) + x.shape[1:])
        return _lse(xp, x, 1) - x[xp.arange(n), xp.asarray(data)][:, None]

    def backward(xp, a, data, xs, y, g, need):
        x = xp.broadcast_to(xs[0], (len(data),) + xs[0].shape[1:])
        gx = xp.exp(x - _lse(xp, x, 1))
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


# DyNet guards only the exact end points: log(0) becomes log(FLT_MIN) (a large but
# finite loss), and the backward moves x == 0 to FLT_MIN and x == 1 to 0.9999999.
# Clipping interior values (e.g. to [1e-7, 1 - 1e-7]) would change losses that are
# perfectly representable in float64.
_FLT_MIN = 1.1754943508222875e-38
_ONE_BELOW = 1.0 - 2.0 ** -23  # DyNet's 0.9999999f as stored in float32


def _safe_logs(xp, x):
    return xp.log(xp.maximum(x, _FLT_MIN)), xp.log(xp.maximum(1 - x, _FLT_MIN))


@op("binary_log_loss", _pair_scalar("binary_log_loss"), cost=REDUCE)
class BinaryLogLoss:
    def forward(xp, a, data, x, y):
        lx, l1x = _safe_logs(xp, x)
        return -_rowsum(y * lx + (1 - y) * l1x)

    def backward(xp, a, data, xs, out, g, need):
        x, y = xs
        ge = _expand(g, max(x.ndim, y.ndim))
        gx = gy = None
        if need[0]:
            xb = xp.where(x == 0, _FLT_MIN, xp.where(x == 1, _ONE_BELOW, x))
            gx = reduce_to(ge * xp.where(x == y, 0.0, (1 - y) / (1 - xb) - y / xb), x.shape)
        if need[1]:
            lx, l1x = _safe_logs(xp, x)
            gy = reduce_to(ge * (l1x - lx), y.shape)
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


