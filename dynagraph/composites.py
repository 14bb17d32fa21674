"""DyNet functions that are compositions of existing ops (no new kernel, no new backward).

Each records a few nodes of ops defined in dynagraph/ops, so values, gradients and batching
come from those ops' checked definitions. Formulas were matched against dynet38
(tests/test_composites.py).
"""
from __future__ import annotations

import numpy as np

from .batched import batched
from .errors import DynagraphError, user_line
from .expressions import (
    abs, bmin, cdiv, cmult, constant, exp, inputTensor, l2_norm, log, max_dim, mean_dim, mean_elems, reshape,
    sqrt, square, sum_dim, sum_elems,
)
from .expression import Expression

__all__ = ["l1_distance", "huber_distance", "std_elems", "moment_elems", "logsumexp_dim", "one_hot",
           "trace_of_product", "layer_norm", "weight_norm", "moment_dim", "std_dim", "cumsum"]

LAYER_NORM_EPS = 1e-8  # under the variance's square root, against a constant input


def l1_distance(x, y) -> Expression:
    """sum_i |x_i - y_i|."""
    return sum_elems(abs(x - y))


def huber_distance(x, y, c: float = 1.345) -> Expression:
    """sum_i h(x_i - y_i), h(a) = a^2 / 2 for |a| <= c, else c (|a| - c / 2); written as
    q^2 / 2 + c (|a| - q) with q = min(|a|, c), which is both branches at once."""
    a = abs(x - y)
    q = bmin(a, constant(a.shape, float(c)))
    return sum_elems(square(q) * 0.5 + (a - q) * float(c))


def std_elems(x) -> Expression:
    """The population standard deviation of all elements (DyNet divides by n)."""
    return sqrt(mean_elems(square(x - mean_elems(x))))


def moment_elems(x, r: int) -> Expression:
    """The r-th raw moment of the elements: mean(x^r)."""
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
        raise DynagraphError(f"moment_elems: r must be a positive int, got {r!r}\n  at {user_line()}")
    return mean_elems(x ** float(r))


def logsumexp_dim(x, d: int = 0) -> Expression:
    """log(sum(exp(x))) along dimension d, shifted by the maximum so it cannot overflow."""
    shape = x.shape
    if not 0 <= d < len(shape):
        raise DynagraphError(f"logsumexp_dim: dimension {d} out of range for shape {shape}\n  at {user_line()}")
    kept = shape[:d] + (1,) + shape[d + 1:]
    m = max_dim(x, d)
    shifted = x - reshape(m, kept)
    return log(sum_dim(exp(shifted), [d])) + m


def one_hot(d: int, idx, device: str = "") -> Expression:
    """A d-vector with 1 at idx (a list of indices: DyNet's minibatch of one-hot vectors)."""
    def vec(i):
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < d:
            raise DynagraphError(f"one_hot: index {i!r} out of range for dimension {d}\n  at {user_line()}")
        v = np.zeros(d)
        v[int(i)] = 1.0
        return inputTensor(v)
    if isinstance(idx, (list, tuple, np.ndarray)):
        return batched([vec(i) for i in idx])
    return vec(idx)


def trace_of_product(x, y) -> Expression:
    """trace(x y^T) = sum_ij x_ij y_ij."""
    return sum_elems(cmult(x, y))


def layer_norm(x, g, b) -> Expression:
    """g * (x - mean(x)) / std(x) + b, elementwise (Ba et al., 2016)."""
    centred = x - mean_elems(x)
    return cmult(g, cdiv(centred, sqrt(mean_elems(square(centred)) + LAYER_NORM_EPS))) + b


def weight_norm(w, g) -> Expression:
    """g * w / ||w|| (Salimans and Kingma, 2016); g is a scalar expression."""
    return cmult(w, cdiv(g, l2_norm(w)))


def _dim_mean(x, d: list, n: int):
    """The mean over dimensions d; n > 0 replaces the divisor (DyNet's masking option)."""
    return sum_dim(x, d) * (1.0 / n) if n > 0 else mean_dim(x, d)


def _dims_arg(d, what: str, b: bool, shape: tuple) -> list:
    if b:
        raise DynagraphError(f"{what}: b=True (reducing over DyNet's minibatch dimension) is not supported; "
                             f"use sum_batches/mean_batches\n  at {user_line()}")
    d = [int(d)] if isinstance(d, (int, np.integer)) else [int(i) for i in d]
    if not d or any(not 0 <= i < len(shape) for i in d) or len(set(d)) != len(d):
        raise DynagraphError(f"{what}: bad dimensions {d} for shape {shape}\n  at {user_line()}")
    return d


def moment_dim(x, d, r: int, b: bool = False, n: int = 0) -> Expression:
    """The r-th raw moment, 1/n sum_i x_i^r, along dimensions d."""
    d = _dims_arg(d, "moment_dim", b, x.shape)
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
        raise DynagraphError(f"moment_dim: r must be a positive int, got {r!r}\n  at {user_line()}")
    return _dim_mean(x ** float(r), d, n)


def std_dim(x, d, b: bool = False, n: int = 0) -> Expression:
    """sqrt(1/n sum_i (x_i - mu)^2) along dimensions d."""
    d = _dims_arg(d, "std_dim", b, x.shape)
    kept = tuple(1 if i in d else s for i, s in enumerate(x.shape))
    centred = x - reshape(_dim_mean(x, d, n), kept)
    return sqrt(_dim_mean(square(centred), d, n))


def cumsum(x, d: int = 0) -> Expression:
    """y_i = sum_{j <= i} x_j along dimension d of a vector or matrix: one product with a
    triangular matrix of ones."""
    shape = x.shape
    if len(shape) > 2 or not 0 <= d < len(shape):
        raise DynagraphError(f"cumsum: dimension {d} of a shape {shape} (vectors and matrices only)"
                             f"\n  at {user_line()}")
    size = shape[d]
    lower = inputTensor(np.tril(np.ones((size, size))))
    if d == 0:
        return lower * x
    return x * inputTensor(np.triu(np.ones((size, size))))
