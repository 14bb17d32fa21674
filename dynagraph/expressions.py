"""The DyNet-named expression functions (dy.tanh, dy.concatenate, ...).

Each function only validates its Python-level arguments and records one node.
DyNet's minibatch dimension (a BatchedExpression argument) takes the slow path of
record/record1/record2 below, which records the op once per sample (dynagraph.batched).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import expression as _expression
from . import parameters as _params_module
from .batched import (
    BatchedExpression,
    batch_size_of,
    batched,
    map_record,
    sample,
    samples_of,
)
from .errors import DynagraphError, as_index, user_line
from .expression import Expression, expression_of
from .graph import IndexSlot, random_key
from .ops import OPS, as_shape
from .parameters import LookupParameters, Parameters
from .recording import BARE, INDEX, INTS, LIST, LIST_INT, ONE, TWO, entry_recorders, recorder

_O = OPS
_PICK_RANGE = OPS["pick_range"]
_RESHAPE = OPS["reshape"]

__all__ = [
    "parameter", "const_parameter", "lookup", "const_lookup",
    "inputTensor", "inputVector", "scalarInput", "inputMatrix", "zeros", "ones", "constant",
    "random_normal", "random_uniform", "random_bernoulli",
    "tanh", "logistic", "sigmoid", "rectify", "relu", "elu", "selu", "exp", "log", "square", "sqrt", "abs",
    "cube", "softsign", "pow", "nobackprop", "flip_gradient",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log_sigmoid",
    "silu", "scale_gradient", "floor", "ceil", "round", "argmax", "erf", "lgamma",
    "cmult", "cdiv", "cadd", "bmax", "bmin", "dot_product", "colwise_add",
    "esum", "average", "emax", "logsumexp", "concatenate", "concatenate_cols", "affine_transform",
    "reshape", "transpose", "pick", "pick_range", "pickrange", "select_rows", "select_cols",
    "sum_elems", "mean_elems", "sum_dim", "mean_dim", "max_dim", "min_dim",
    "softmax", "log_softmax", "pickneglogsoftmax", "hinge", "binary_log_loss",
    "squared_distance", "squared_norm", "l2_norm", "dropout", "dropout_dim", "dropout_batch", "noise",
    # DyNet's minibatch dimension
    "lookup_batch", "const_lookup_batch", "pick_batch", "pick_batch_elem", "pick_batch_elems",
    "pickneglogsoftmax_batch", "hinge_batch", "sum_batches", "mean_batches", "std_batches", "moment_batches",
    "concatenate_to_batch",
    # images (dynagraph/ops/conv.py)
    "conv2d", "conv2d_bias", "maxpooling2d", "kmax_pooling",
]


# ------------------------------------------------------------------ recording
# Like expression.record1/record2, compiled recorders (dynagraph.recording) whose fallback is this
# module's record(): it also maps an op over the samples of BatchedExpression arguments.
_B = BatchedExpression


def _record1(op, x, attrs: tuple = (), data=None):
    return record(op, (x,), attrs, data)


def _record2(op, x, y, attrs: tuple = ()):
    return record(op, (x, y), attrs)


def _record_list(op, xs, attrs: tuple = ()):
    return record(op, xs, attrs)


record1 = recorder(None, ONE, _record1)
record2 = recorder(None, TWO, _record2)
record_list = recorder(None, LIST, _record_list)  # record_list(op, [x, y, ...], attrs)


def record(op, args: Sequence = (), attrs: tuple = (), data=None):
    """expression.record, or one record per sample when an argument is batched."""
    for a in args:
        if type(a) is _B:
            return map_record(op, args, attrs, data)
    return _expression.record(op, args, attrs, data)


def _list_recorder(name: str, what: str | None = None, doc: str = "", attrs: tuple = ()):
    """dy.<what>(xs): records op `name` from a list of expressions (compiled fast path)."""
    op, what = _O[name], what or name

    def slow(xs, attrs: tuple = attrs):
        return record(op, _list(xs, what), attrs)
    return _named(recorder(op, LIST, slow, attrs), what, doc)


def _named(f, name: str, doc: str):
    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc
    f.__module__ = __name__
    return f


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
    if len(ps) == 1 and type(ps[0]) is Parameters:  # the common call, once per weight per graph
        return expression_of(ps[0], True)
    out = [p.expr(True) for p in ps]
    return out[0] if len(out) == 1 else out


def lookup(p: LookupParameters, index: int, update: bool = True) -> Expression:
    if type(p) is not LookupParameters and not isinstance(p, LookupParameters):
        raise TypeError(f"lookup needs LookupParameters, got {type(p).__name__}")
    return expression_of(p, update, index if type(index) is int else _int(index, "lookup"))


# Compiled for the common call (recording.entry_recorders); the functions above are their twins.
parameter, lookup, _table_getitem = entry_recorders(Parameters, LookupParameters, np.integer, parameter, lookup)
if _table_getitem is not None:  # E[w], once per word: the compiled row lookup (parameters.py has the twin)
    LookupParameters.__getitem__ = _table_getitem


def const_parameter(*ps):
    out = [p.expr(False) for p in ps]
    return out[0] if len(out) == 1 else out


def const_lookup(p: LookupParameters, index: int) -> Expression:
    return lookup(p, index, update=False)


def _int(i, what: str) -> int:
    if type(i) is IndexSlot:  # a runtime index inside a static subgraph
        return i
    return as_index(i, what)


# ---------------------------------------------------------------------- inputs
def inputTensor(arr, batched: bool = False, device: str = "") -> Expression:
    """batched=True: the last axis is DyNet's minibatch dimension, one input per sample."""
    if batched:
        return _batched_input(np.asarray(arr, dtype=np.float64))
    a = np.array(arr, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
    if not np.isfinite(a).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise DynagraphError(f"inputTensor(shape {a.shape}): input contains NaN or inf (first at index {where})"
                             f"\n  at {user_line()}")
    return record(_O["input"], (), (a.shape,), a)


def _batched_input(a: np.ndarray):
    if a.ndim == 0:
        a = a.reshape(1)
    return batched([inputTensor(a[..., b]) for b in range(a.shape[-1])])


def inputVector(v: Sequence[float], device: str = "") -> Expression:
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    return inputTensor(a)


def scalarInput(x: float, device: str = "") -> Expression:
    return inputTensor(np.array([float(x)]))


def inputMatrix(v: Sequence[float], d: tuple) -> Expression:
    """DyNet's inputMatrix: values in column-major order."""
    return inputTensor(np.asarray(v, dtype=np.float64).reshape(tuple(d), order="F"))


def zeros(dim, batch_size: int = 1) -> Expression:
    return _constant(dim, 0.0, batch_size, "zeros")


def ones(dim, batch_size: int = 1) -> Expression:
    return _constant(dim, 1.0, batch_size, "ones")


def constant(dim, val: float, batch_size: int = 1) -> Expression:
    return _constant(dim, val, batch_size, "constant")


def _constant(dim, val: float, batch_size: int, what: str):
    e = record(_O["constant"], (), (_dim(dim, what), float(val)))
    return e if batch_size == 1 else batched([e] * _batch_arg(batch_size, what))  # equal samples: one node


def _batch_arg(n, what: str) -> int:
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise DynagraphError(f"{what}: batch_size must be a positive int, got {n!r}\n  at {user_line()}")
    return int(n)


def _per_sample(n: int, what: str, make):
    """DyNet's batch_size argument of the random inputs: an independent draw per sample."""
    return make() if n == 1 else batched([make() for _ in range(_batch_arg(n, what))])


def random_normal(dim, mean: float = 0.0, stddev: float = 1.0, batch_size: int = 1) -> Expression:
    attrs = (_dim(dim, "random_normal"), float(mean), float(stddev))
    return _per_sample(batch_size, "random_normal", lambda: record(_O["random_normal"], (), attrs, random_key()))


def random_uniform(dim, left: float, right: float, batch_size: int = 1) -> Expression:
    attrs = (_dim(dim, "random_uniform"), float(left), float(right))
    return _per_sample(batch_size, "random_uniform", lambda: record(_O["random_uniform"], (), attrs, random_key()))


def random_bernoulli(dim, p: float, scale: float = 1.0, batch_size: int = 1) -> Expression:
    attrs = (_dim(dim, "random_bernoulli"), float(p), float(scale))
    return _per_sample(batch_size, "random_bernoulli", lambda: record(_O["random_bernoulli"], (), attrs, random_key()))


# --------------------------------------------------------------------- unary
def _u(name):
    op = _O[name]

    def slow(x, attrs: tuple = (), data=None) -> Expression:
        return record(op, (x,), attrs, data)
    return _named(recorder(op, ONE, slow), name, f"{name}(x): elementwise {name}.")


tanh, logistic, rectify, exp, log, square, sqrt, abs, cube, softsign, selu = (
    _u(n) for n in ("tanh", "logistic", "rectify", "exp", "log", "square", "sqrt", "abs", "cube", "softsign", "selu"))
sigmoid = logistic
relu = rectify
nobackprop = _u("nobackprop")
flip_gradient = _u("flip_gradient")
sum_elems, mean_elems, squared_norm, l2_norm = (_u(n) for n in ("sum_elems", "mean_elems", "squared_norm", "l2_norm"))


sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh, log_sigmoid = (
    _u(n) for n in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
                    "log_sigmoid"))


def silu(x, beta: float = 1.0) -> Expression:
    """x * logistic(beta * x) (SiLU / swish)."""
    return record1(_O["silu"], x, (float(beta),))


def scale_gradient(x, lambd: float = 1.0) -> Expression:
    """x forward; the gradient is multiplied by lambd on the way back."""
    return record1(_O["scale_gradient"], x, (float(lambd),))


def _rounding(name: str):
    def f(x, gradient_mode: str = "zero_gradient") -> Expression:
        if gradient_mode not in ("zero_gradient", "straight_through_gradient"):
            raise DynagraphError(f"{name}: gradient_mode must be 'zero_gradient' or 'straight_through_gradient', "
                                 f"got {gradient_mode!r}\n  at {user_line()}")
        return record1(_O[name], x, (gradient_mode == "straight_through_gradient",))
    return _named(f, name, f"{name}(x, gradient_mode='zero_gradient'): elementwise {name}; "
                           f"'straight_through_gradient' passes the gradient through unchanged.")


floor, ceil, round = (_rounding(n) for n in ("floor", "ceil", "round"))
argmax = _rounding("argmax")  # the same gradient modes (DyNet: vectors only)
argmax.__doc__ = ("argmax(x, gradient_mode='zero_gradient'): the one-hot vector of the first maximum of "
                  "vector x; 'straight_through_gradient' passes the gradient through unchanged.")
erf, lgamma = _u("erf"), _u("lgamma")


def elu(x, alpha: float = 1.0) -> Expression:
    return record1(_O["elu"], x, (float(alpha),))


def pow(x, y) -> Expression:
    return x ** y


# ------------------------------------------------------------------- binary
def _b(name):
    op = _O[name]

    def slow(x, y, attrs: tuple = ()) -> Expression:
        return record(op, (x, y), attrs)
    return _named(recorder(op, TWO, slow), name, f"{name}(x, y)")


cmult, cdiv, bmax, bmin, dot_product, squared_distance, binary_log_loss, colwise_add = (
    _b(n) for n in ("cmult", "cdiv", "bmax", "bmin", "dot_product", "squared_distance", "binary_log_loss",
                    "colwise_add"))


def cadd(x, y) -> Expression:
    return record2(_O["add"], x, y)


# ------------------------------------------------------------------- n-ary
esum = _list_recorder("esum", doc="esum([x, ...]): the elementwise sum.")
average = _list_recorder("average", doc="average([x, ...]): the elementwise mean.")
emax = _list_recorder("emax", doc="emax([x, ...]): the elementwise maximum.")
logsumexp = _list_recorder("logsumexp", doc="logsumexp([x, ...]): log(sum(exp(x))) elementwise.")
_concatenate = _list_recorder("concatenate")


def concatenate(xs: Sequence[Expression], d: int = 0) -> Expression:
    return _concatenate(xs, (d if type(d) is int else as_index(d, "concatenate"),))


# A list of live expressions and an exact int: compiled, no Python frame (twice per tree node).
concatenate = _named(recorder(_O["concatenate"], LIST_INT, concatenate, (0,)), "concatenate",
                     "concatenate([x, ...], d=0): the expressions joined along dimension d.")


concatenate_cols = _list_recorder("concatenate", "concatenate_cols", "concatenate_cols([x, ...]): side by side "
                                  "as columns.", attrs=(1,))


affine_transform = _list_recorder(
    "affine", "affine_transform", "affine_transform([b, W1, x1, W2, x2, ...]): b + W1*x1 + W2*x2 + ... in one "
    "node (one GEMM per weight when batched).")


# ------------------------------------------------------------ shape & selection
def reshape(x, d, batch_size: int = 1) -> Expression:
    """DyNet: d and batch_size give the new shape; batch_size=1 with a per-sample d keeps x's batch."""
    if type(d) is tuple and d and batch_size == 1 and type(x) is not _B:  # a tuple of sizes: no as_shape
        for k in d:
            if type(k) is not int or k <= 0:
                break
        else:
            return record1(_RESHAPE, x, (d,))
    d = _dim(d, "reshape")
    if type(x) is _B or batch_size != 1:
        return _reshape_batch(x, d, _batch_arg(batch_size, "reshape"))
    return record1(_O["reshape"], x, (d,))


def _reshape_batch(x, d: tuple, n_out: int):
    xs = samples_of(x)
    n, m = int(np.prod(xs[0].shape)), int(np.prod(d))
    if n_out == 1 and m == n or n_out == len(xs) and m == n:  # the batch is kept
        return batched([record1(_O["reshape"], e, (d,)) for e in xs])
    if n * len(xs) != m * n_out:
        raise DynagraphError(f"reshape: {xs[0].shape} with batch size {len(xs)} has {n * len(xs)} values, "
                             f"{d} with batch size {n_out} needs {m * n_out}\n  at {user_line()}")
    # Moving values between samples: DyNet's column-major layout has the batch last, so the
    # whole tensor flattened is the samples flattened one after another.
    flat = [e if e.shape == (n,) else record1(_O["reshape"], e, ((n,),)) for e in xs]
    whole = flat[0] if len(flat) == 1 else concatenate(flat)
    return batched([record1(_O["reshape"], pick_range(whole, k * m, (k + 1) * m), (d,)) for k in range(n_out)])


def transpose(x, dims: Sequence[int] = (1, 0)) -> Expression:
    return record1(_O["transpose"], x, (tuple(as_index(d, "transpose") for d in dims),))


transpose = _named(recorder(_O["transpose"], BARE, transpose, ((1, 0),)), "transpose",
                   "transpose(x, dims=[1, 0]): x with its dimensions permuted.")


def pick(x, index: int = 0, dim: int = 0) -> Expression:
    return record1(_O["pick"], x, (as_index(dim, "pick"),), _int(index, "pick"))


def pick_range(x, s: int, e: int, d: int = 0) -> Expression:
    return record1(_PICK_RANGE, x, (as_index(s, "pick_range"), as_index(e, "pick_range"), as_index(d, "pick_range")))


# Exact ints take the compiled path with no Python frame (a gate slice per gate per cell).
pick_range = _named(recorder(_PICK_RANGE, INTS, pick_range, (None, None, 0)), "pick_range",
                    "pick_range(x, s, e, d=0): elements [s, e) of x along dimension d.")


pickrange = pick_range


def select_rows(x, rs: Sequence[int]) -> Expression:
    return record1(_O["select"], x, (tuple(as_index(r, "select_rows") for r in rs), 0))


def select_cols(x, cs: Sequence[int]) -> Expression:
    return record1(_O["select"], x, (tuple(as_index(c, "select_cols") for c in cs), 1))


def _dims(d) -> tuple:
    return (as_index(d, "dimension"),) if isinstance(d, (int, np.integer)) else tuple(as_index(i, "dimension") for i in d)


def sum_dim(x, d: Sequence[int] = (0,), b: bool = False, n: int = 0) -> Expression:
    """b=True also sums over the minibatch dimension."""
    d = _dims(d)
    if b:
        return sum_batches(x if not d else sum_dim(x, d))
    return record1(_O["sum_dim"], x, (d,))


def mean_dim(x, d: Sequence[int] = (0,), b: bool = False, n: int = 0) -> Expression:
    """b=True also averages over the minibatch dimension."""
    d = _dims(d)
    if b:
        return mean_batches(x if not d else mean_dim(x, d))
    return record1(_O["mean_dim"], x, (d,))


def max_dim(x, d: int = 0) -> Expression:
    return record1(_O["max_dim"], x, (as_index(d, "max_dim"),))


def min_dim(x, d: int = 0) -> Expression:
    return record1(_O["min_dim"], x, (as_index(d, "min_dim"),))


# ----------------------------------------------------------- softmax & losses
def softmax(x, d: int = 0) -> Expression:
    return record1(_O["softmax"], x, (as_index(d, "softmax"),))


softmax = _named(recorder(_O["softmax"], INTS, softmax, (0,)), "softmax", "softmax(x, d=0): softmax along d.")


def log_softmax(x, restrict: Sequence[int] | None = None) -> Expression:
    return record1(_O["log_softmax"], x, (None if restrict is None else tuple(as_index(i, "log_softmax restrict") for i in restrict),))


log_softmax = _named(recorder(_O["log_softmax"], BARE, log_softmax, (None,)), "log_softmax",
                     "log_softmax(x, restrict=None): log of the softmax (over `restrict` only, if given).")


def pickneglogsoftmax(x, v: int) -> Expression:
    return record1(_O["pickneglogsoftmax"], x, (), _int(v, "pickneglogsoftmax"))


# An expression and an int label: compiled, the label's range checked in C (once per loss).
pickneglogsoftmax = _named(recorder(_O["pickneglogsoftmax"], INDEX, pickneglogsoftmax, (),
                                    row_check=_O["pickneglogsoftmax"].check),
                           "pickneglogsoftmax", "pickneglogsoftmax(x, v): -log(softmax(x)[v]).")


def hinge(x, index: int, m: float = 1.0) -> Expression:
    return record1(_O["hinge"], x, (float(m),), _int(index, "hinge"))


# ------------------------------------------------------------- regularisation
def dropout(x, p: float) -> Expression:
    if not 0.0 <= p < 1.0:
        raise DynagraphError(f"dropout: p must be in [0, 1), got {p}\n  at {user_line()}")
    if p == 0.0:
        return x
    return record1(_O["dropout"], x, (float(p),), random_key())


def _rate(p, what: str) -> float:
    if not 0.0 <= p < 1.0:
        raise DynagraphError(f"{what}: p must be in [0, 1), got {p}\n  at {user_line()}")
    return float(p)


def dropout_dim(x, d: int, p: float) -> Expression:
    """Dropout with one keep/drop draw per slice along dimension d (shared by the elements
    along d: for a matrix, d=0 drops whole columns and d=1 whole rows), as in DyNet."""
    d = as_index(d, "dropout_dim")
    if _rate(p, "dropout_dim") == 0.0:
        return x
    return record1(_O["dropout_dim"], x, (float(p), d), random_key())


def dropout_batch(x, p: float) -> Expression:
    """Dropout of whole minibatch elements: each sample is kept (scaled by 1/(1-p)) or zeroed."""
    if _rate(p, "dropout_batch") == 0.0:
        return x
    return record1(_O["dropout_batch"], x, (float(p),), random_key())


def noise(x, stddev: float) -> Expression:
    return record1(_O["noise"], x, (float(stddev),), random_key())



# ---------------------------------------------------------- minibatch dimension
# DyNet's hand-batching API. A batched expression is one expression per sample
# (dynagraph.batched); these functions only regroup samples.
def lookup_batch(p: LookupParameters, indices: Sequence[int], update: bool = True):
    """Rows `indices` of p, one sample each."""
    return batched([lookup(p, i, update) for i in _indices(indices, "lookup_batch")])


def const_lookup_batch(p: LookupParameters, indices: Sequence[int]):
    return lookup_batch(p, indices, update=False)


def pick_batch(x, indices: Sequence[int], dim: int = 0):
    """Element indices[b] of sample b (an ordinary x is every sample)."""
    return _per_index(x, indices, "pick_batch", lambda e, i: pick(e, i, dim))


def pickneglogsoftmax_batch(x, labels: Sequence[int]):
    return _per_index(x, labels, "pickneglogsoftmax_batch", pickneglogsoftmax)


def hinge_batch(x, indices: Sequence[int], m: float = 1.0):
    return _per_index(x, indices, "hinge_batch", lambda e, i: hinge(e, i, m))


def _per_index(x, indices, what: str, f):
    """f(sample b, index b); DyNet broadcasts an ordinary x over the indices."""
    ids, n = _indices(indices, what), batch_size_of(what, [x])
    if n > 1 and len(ids) != n:
        raise DynagraphError(f"{what}: {len(ids)} indices for an expression of batch size {n}"
                             f"\n  at {user_line()}")
    return batched([f(sample(x, b), i) for b, i in enumerate(ids)])


def _indices(indices, what: str) -> list:
    ids = [_int(i, what) for i in (indices.tolist() if isinstance(indices, np.ndarray) else indices)]
    if not ids:
        raise DynagraphError(f"{what}: needs at least one index\n  at {user_line()}")
    return ids


def pick_batch_elem(x, v: int):
    """Sample v of x, an ordinary expression."""
    return _samples_at(x, [v], "pick_batch_elem")


def pick_batch_elems(x, vs: Sequence[int]):
    return _samples_at(x, _indices(vs, "pick_batch_elems"), "pick_batch_elems")


def _samples_at(x, vs: list, what: str):
    xs = samples_of(x)
    for v in vs:
        if not 0 <= _int(v, what) < len(xs):
            raise DynagraphError(f"{what}: element {v} of a batch of size {len(xs)}\n  at {user_line()}")
    return batched([xs[v] for v in vs])


def concatenate_to_batch(xs: Sequence):
    """One batch made of the samples of every expression in xs, in order."""
    out = [e for x in _list(xs, "concatenate_to_batch") for e in samples_of(x)]
    shapes = {e.shape for e in out}
    if len(shapes) > 1:
        raise DynagraphError(f"concatenate_to_batch: samples of different shapes {sorted(shapes)}"
                             f"\n  at {user_line()}")
    return batched(out)


def sum_batches(x) -> Expression:
    """The sum over the minibatch dimension: an ordinary expression."""
    return x if type(x) is not _B else esum(x.samples)


def mean_batches(x) -> Expression:
    return x if type(x) is not _B else average(x.samples)


def moment_batches(x, r: int) -> Expression:
    """(1/B) sum_b x_b^r, elementwise."""
    return average([e ** r for e in samples_of(x)])


def std_batches(x) -> Expression:
    """The elementwise standard deviation over the minibatch dimension (1/B, as DyNet)."""
    xs = samples_of(x)
    mu = average(xs)
    return sqrt(average([square(e - mu) for e in xs]))


# parameters.py cannot import this module (a cycle): E.batch(ids) reaches lookup_batch here.
_params_module.batch_hook = lookup_batch


# ---------------------------------------------------------------------- images
def _two(v, what: str) -> tuple:
    try:
        t = tuple(int(s) for s in v)
    except TypeError:
        t = ()
    if len(t) != 2 or min(t) < 1:
        raise DynagraphError(f"{what} must be a list of two positive ints, got {v!r}\n  at {user_line()}")
    return t


def conv2d(x, f, stride, is_valid: bool = True) -> Expression:
    """DyNet's conv2d: x (H, W, C), filters f (kh, kw, C, O), stride [sh, sw]; is_valid=False is
    TensorFlow's "SAME" padding. A cross-correlation, as in DyNet."""
    return record(_O["conv2d"], (x, f), (_two(stride, "conv2d stride"), bool(is_valid)))


def conv2d_bias(x, f, b, stride, is_valid: bool = True) -> Expression:
    """conv2d plus b, one bias per output channel (shape (O,))."""
    return record(_O["conv2d_bias"], (x, f, b), (_two(stride, "conv2d_bias stride"), bool(is_valid)))


def maxpooling2d(x, ksize, stride, is_valid: bool = True) -> Expression:
    """DyNet's maxpooling2d over windows ksize [kh, kw] of an (H, W, C) input, per channel."""
    return record(_O["maxpooling2d"], (x,), (_two(ksize, "maxpooling2d ksize"),
                                             _two(stride, "maxpooling2d stride"), bool(is_valid)))


def kmax_pooling(x, k: int, d: int = 1) -> Expression:
    """DyNet's kmax_pooling: the k largest values along dimension d, in their original order."""
    return record(_O["kmax_pooling"], (x,), (_int(k, "kmax_pooling k"), _int(d, "kmax_pooling d")))
