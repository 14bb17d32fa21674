"""The DyNet-named expression functions (dy.tanh, dy.concatenate, ...).

Each function only validates its Python-level arguments and records one node.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import DynagraphError, user_line
from .graph import RANDOM_KEY, Expression, IndexSlot, current, lookup_in, record, record1, record2
from .ops import OPS, as_shape
from .parameters import LookupParameters

_O = OPS
_PICK_RANGE = OPS["pick_range"]

__all__ = [
    "parameter", "const_parameter", "lookup", "const_lookup",
    "inputTensor", "inputVector", "scalarInput", "inputMatrix", "zeros", "ones", "constant",
    "random_normal", "random_uniform", "random_bernoulli",
    "tanh", "logistic", "sigmoid", "rectify", "relu", "elu", "selu", "exp", "log", "square", "sqrt", "abs",
    "cube", "softsign", "pow", "nobackprop", "flip_gradient",
    "cmult", "cdiv", "cadd", "bmax", "bmin", "dot_product", "colwise_add",
    "esum", "average", "emax", "logsumexp", "concatenate", "concatenate_cols", "affine_transform",
    "reshape", "transpose", "pick", "pick_range", "pickrange", "select_rows", "select_cols",
    "sum_elems", "mean_elems", "sum_dim", "mean_dim", "max_dim", "min_dim",
    "softmax", "log_softmax", "pickneglogsoftmax", "hinge", "binary_log_loss",
    "squared_distance", "squared_norm", "l2_norm", "dropout", "noise",
]


def _dim(d, what: str) -> tuple:
    try:
        return as_shape(d)
    except (TypeError, ValueError) as e:
        raise DynagraphError(f"{what}: {e}\n  at {user_line()}") from None


def _list(xs, what: str) -> list:
    xs = list(xs)
    if not xs:
        raise DynagraphError(f"{what} needs at least one expression\n  at {user_line()}")
    return xs


# ------------------------------------------------------------------ parameters
def parameter(*ps):
    """DyNet's dy.parameter(p): the expression for a parameter (several -> list)."""
    out = [p.expr(True) for p in ps]
    return out[0] if len(out) == 1 else out


def const_parameter(*ps):
    out = [p.expr(False) for p in ps]
    return out[0] if len(out) == 1 else out


def lookup(p: LookupParameters, index: int, update: bool = True) -> Expression:
    if type(p) is not LookupParameters and not isinstance(p, LookupParameters):
        raise TypeError(f"lookup needs LookupParameters, got {type(p).__name__}")
    return lookup_in(current(), p, index if type(index) is int else _int(index, "lookup"), update)


def const_lookup(p: LookupParameters, index: int) -> Expression:
    return lookup(p, index, update=False)


def _int(i, what: str) -> int:
    if type(i) is int:
        return i
    if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
        return int(i)
    if type(i) is IndexSlot:  # a runtime index inside a static subgraph
        return i
    raise TypeError(f"{what}: index must be an int, got {type(i).__name__} (at {user_line()})")


# ---------------------------------------------------------------------- inputs
def inputTensor(arr, batched: bool = False, device: str = "") -> Expression:
    if batched:
        raise DynagraphError("inputTensor(batched=True): DyNet's minibatch dimension is not supported; "
                             "write per-sample code and let dynagraph batch it")
    a = np.array(arr, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
    if not np.isfinite(a).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise DynagraphError(f"inputTensor(shape {a.shape}): input contains NaN or inf (first at index {where})"
                             f"\n  at {user_line()}")
    return record(_O["input"], (), (a.shape,), a)


def inputVector(v: Sequence[float], device: str = "") -> Expression:
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    return inputTensor(a)


def scalarInput(x: float, device: str = "") -> Expression:
    return inputTensor(np.array([float(x)]))


def inputMatrix(v: Sequence[float], d: tuple) -> Expression:
    """DyNet's inputMatrix: values in column-major order."""
    return inputTensor(np.asarray(v, dtype=np.float64).reshape(tuple(d), order="F"))


def zeros(dim, batch_size: int = 1) -> Expression:
    return record(_O["constant"], (), (_dim(dim, "zeros"), 0.0))


def ones(dim, batch_size: int = 1) -> Expression:
    return record(_O["constant"], (), (_dim(dim, "ones"), 1.0))


def constant(dim, val: float, batch_size: int = 1) -> Expression:
    return record(_O["constant"], (), (_dim(dim, "constant"), float(val)))


def random_normal(dim, mean: float = 0.0, stddev: float = 1.0, batch_size: int = 1) -> Expression:
    return record(_O["random_normal"], (), (_dim(dim, "random_normal"), float(mean), float(stddev)), RANDOM_KEY)


def random_uniform(dim, left: float, right: float, batch_size: int = 1) -> Expression:
    return record(_O["random_uniform"], (), (_dim(dim, "random_uniform"), float(left), float(right)), RANDOM_KEY)


def random_bernoulli(dim, p: float, scale: float = 1.0, batch_size: int = 1) -> Expression:
    return record(_O["random_bernoulli"], (), (_dim(dim, "random_bernoulli"), float(p), float(scale)), RANDOM_KEY)


# --------------------------------------------------------------------- unary
def _u(name):
    op = _O[name]

    def f(x) -> Expression:
        if type(x) is Expression:  # record1's fast path, inlined: one call less per node
            cg = x.cg
            if not cg.retired:
                return Expression(cg, cg.add(op, (x.i,)))
        return record1(op, x)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Elementwise {name}."
    return f


tanh, logistic, rectify, exp, log, square, sqrt, abs, cube, softsign, selu = (
    _u(n) for n in ("tanh", "logistic", "rectify", "exp", "log", "square", "sqrt", "abs", "cube", "softsign", "selu"))
sigmoid = logistic
relu = rectify
nobackprop = _u("nobackprop")
flip_gradient = _u("flip_gradient")
sum_elems, mean_elems, squared_norm, l2_norm = (_u(n) for n in ("sum_elems", "mean_elems", "squared_norm", "l2_norm"))


def elu(x, alpha: float = 1.0) -> Expression:
    return record1(_O["elu"], x, (float(alpha),))


def pow(x, y) -> Expression:
    return x ** y


# ------------------------------------------------------------------- binary
def _b(name):
    op = _O[name]

    def f(x, y) -> Expression:
        if type(x) is Expression and type(y) is Expression:  # record2's fast path, inlined
            cg = x.cg
            if y.cg is cg and not cg.retired:
                return Expression(cg, cg.add(op, (x.i, y.i)))
        return record2(op, x, y)
    f.__name__ = f.__qualname__ = name
    return f


cmult, cdiv, bmax, bmin, dot_product, squared_distance, binary_log_loss, colwise_add = (
    _b(n) for n in ("cmult", "cdiv", "bmax", "bmin", "dot_product", "squared_distance", "binary_log_loss",
                    "colwise_add"))


def cadd(x, y) -> Expression:
    return record(_O["add"], (x, y))


# ------------------------------------------------------------------- n-ary
def esum(xs: Sequence[Expression]) -> Expression:
    return record(_O["esum"], _list(xs, "esum"))


def average(xs: Sequence[Expression]) -> Expression:
    return record(_O["average"], _list(xs, "average"))


def emax(xs: Sequence[Expression]) -> Expression:
    return record(_O["emax"], _list(xs, "emax"))


def logsumexp(xs: Sequence[Expression]) -> Expression:
    return record(_O["logsumexp"], _list(xs, "logsumexp"))


def concatenate(xs: Sequence[Expression], d: int = 0) -> Expression:
    return record(_O["concatenate"], _list(xs, "concatenate"), (int(d),))


def concatenate_cols(xs: Sequence[Expression]) -> Expression:
    return record(_O["concatenate"], _list(xs, "concatenate_cols"), (1,))


def affine_transform(xs: Sequence) -> Expression:
    """b + W1*x1 + W2*x2 + ... in one node (one GEMM per weight when batched)."""
    return record(_O["affine"], _list(xs, "affine_transform"))


# ------------------------------------------------------------ shape & selection
def reshape(x, d, batch_size: int = 1) -> Expression:
    return record1(_O["reshape"], x, (_dim(d, "reshape"),))


def transpose(x, dims: Sequence[int] = (1, 0)) -> Expression:
    return record1(_O["transpose"], x, (tuple(int(d) for d in dims),))


def pick(x, index: int = 0, dim: int = 0) -> Expression:
    return record1(_O["pick"], x, (int(dim),), _int(index, "pick"))


def pick_range(x, s: int, e: int, d: int = 0) -> Expression:
    if type(s) is not int or type(e) is not int or type(d) is not int:  # int() costs a call per node
        s, e, d = int(s), int(e), int(d)
    return record1(_PICK_RANGE, x, (s, e, d))


pickrange = pick_range


def select_rows(x, rs: Sequence[int]) -> Expression:
    return record1(_O["select"], x, (tuple(int(r) for r in rs), 0))


def select_cols(x, cs: Sequence[int]) -> Expression:
    return record1(_O["select"], x, (tuple(int(c) for c in cs), 1))


def _dims(d) -> tuple:
    return (int(d),) if isinstance(d, (int, np.integer)) else tuple(int(i) for i in d)


def sum_dim(x, d: Sequence[int] = (0,), b: bool = False, n: int = 0) -> Expression:
    _no_batch(b, "sum_dim")
    return record1(_O["sum_dim"], x, (_dims(d),))


def mean_dim(x, d: Sequence[int] = (0,), b: bool = False, n: int = 0) -> Expression:
    _no_batch(b, "mean_dim")
    return record1(_O["mean_dim"], x, (_dims(d),))


def _no_batch(b, what):
    if b:
        raise DynagraphError(f"{what}(b=True): the minibatch dimension is not supported\n  at {user_line()}")


def max_dim(x, d: int = 0) -> Expression:
    return record1(_O["max_dim"], x, (int(d),))


def min_dim(x, d: int = 0) -> Expression:
    return record1(_O["min_dim"], x, (int(d),))


# ----------------------------------------------------------- softmax & losses
def softmax(x, d: int = 0) -> Expression:
    return record1(_O["softmax"], x, (int(d),))


def log_softmax(x, restrict: Sequence[int] | None = None) -> Expression:
    return record1(_O["log_softmax"], x, (None if restrict is None else tuple(int(i) for i in restrict),))


def pickneglogsoftmax(x, v: int) -> Expression:
    return record1(_O["pickneglogsoftmax"], x, (), _int(v, "pickneglogsoftmax"))


def hinge(x, index: int, m: float = 1.0) -> Expression:
    return record1(_O["hinge"], x, (float(m),), _int(index, "hinge"))


# ------------------------------------------------------------- regularisation
def dropout(x, p: float) -> Expression:
    if not 0.0 <= p < 1.0:
        raise DynagraphError(f"dropout: p must be in [0, 1), got {p}\n  at {user_line()}")
    if p == 0.0:
        return x
    return record1(_O["dropout"], x, (float(p),), RANDOM_KEY)


def noise(x, stddev: float) -> Expression:
    return record1(_O["noise"], x, (float(stddev),), RANDOM_KEY)

