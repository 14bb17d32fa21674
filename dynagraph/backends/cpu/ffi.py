"""The door to the compiled module: the cffi handles, dtype tables, and the checks that
turn arrays into C pointers (every index range-checked, every output validated)."""
from __future__ import annotations

import numpy as np

from ..._kernels import ffi, lib


F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
_BUF = {F32: "float[]", F64: "double[]"}
_PTRS = {F32: "float *[]", F64: "double *[]"}
_SUFFIX = {F32: "_f32", F64: "_f64"}
_FN: dict = {}

UNARY = {"neg": lib.DG_NEG, "tanh": lib.DG_TANH, "logistic": lib.DG_LOGISTIC, "rectify": lib.DG_RECTIFY,
         "exp": lib.DG_EXP, "log": lib.DG_LOG, "square": lib.DG_SQUARE, "sqrt": lib.DG_SQRT}
BINARY = {"add": lib.DG_ADD, "sub": lib.DG_SUB, "cmult": lib.DG_CMULT, "cdiv": lib.DG_CDIV}

# ------------------------------------------------------------------- plumbing
def _fn(name: str, dt: np.dtype):
    f = _FN.get((name, dt))
    if f is None:
        f = _FN[(name, dt)] = getattr(lib, name + _SUFFIX[dt])
    return f


def _real(dt, what: str = "array") -> np.dtype:
    dt = np.dtype(dt)
    if dt not in _BUF:
        raise TypeError(f"{what}: compiled kernels take float32 or float64, got {dt}")
    return dt


def _real_of(a, what: str) -> np.dtype:
    """The dtype of an array a kernel reads or writes: a numpy array of float32/float64."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what}: compiled kernels take a numpy array here, got {type(a).__name__}")
    return _real(a.dtype, what)


def _in(a, dt: np.dtype) -> np.ndarray:
    """An input: any real array-like, made C-contiguous of dtype dt (copied only if needed).
    Complex, string, date or object values are refused, never cast."""
    a = np.asarray(a)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"compiled kernels take real numbers, got an array of {a.dtype}")
    return np.ascontiguousarray(a, dtype=dt)


def _out(a, dt: np.dtype, what: str) -> np.ndarray:
    """An array written in place: converting it would lose the writes, so raise."""
    if not isinstance(a, np.ndarray) or a.dtype != dt or not a.flags.c_contiguous or not a.flags.writeable:
        kind = type(a).__name__ if not isinstance(a, np.ndarray) else f"{a.dtype} contiguous={a.flags.c_contiguous}"
        raise ValueError(f"{what} must be a writeable C-contiguous {dt} numpy array, got {kind}")
    return a


def _p(a: np.ndarray):
    return ffi.from_buffer(_BUF[a.dtype], a)


def _pi(a: np.ndarray):
    return ffi.from_buffer("int64_t[]", a)


def _index(idx, bound: int, what: str) -> np.ndarray:
    """Integer indices as int64, each in [0, bound): C never sees an unchecked index."""
    if type(idx) is list and idx:
        # The executor's case, a list of Python ints: builtin min/max are much cheaper
        # than numpy reductions on short arrays. Anything else takes the general path.
        r = np.array(idx)
        if r.dtype == np.int64 and r.ndim == 1:
            lo, hi = min(idx), max(idx)
            if lo < 0 or hi >= bound:
                raise IndexError(f"{what}: index {lo if lo < 0 else hi} out of range [0, {bound})")
            return r
    r = np.asarray(idx)
    if r.size == 0:
        return np.zeros(0, np.int64)
    if r.dtype.kind not in "iu" or r.ndim != 1:
        raise TypeError(f"{what} must be a flat sequence of integers, got {r.dtype} with shape {r.shape}")
    lo, hi = int(r.min()), int(r.max())
    if lo < 0 or hi >= bound:
        raise IndexError(f"{what}: index {lo if lo < 0 else hi} out of range [0, {bound})")
    return np.ascontiguousarray(r, dtype=np.int64)


def _width(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _rows_operand(vals, n: int, width: int, dt: np.dtype) -> tuple:
    """vals as (array, row stride): a batch broadcast along axis 0 (stride 0) is passed
    once with stride 0 instead of being copied n times, and rows that are each contiguous
    at a regular distance (a slice along the first per-row axis: concatenate's gradient
    g[:, a:b]) are passed in place with that distance instead of being copied together."""
    v = np.asarray(vals)
    if n > 1 and v.ndim >= 1 and v.shape[0] == n and v.strides[0] == 0:
        base = _in(v[0], dt)
        if base.size == width:
            return base, 0
    if n > 1 and v.ndim >= 2 and v.shape[0] == n and v.dtype == dt and not v.flags.c_contiguous \
            and v[0].flags.c_contiguous and v[0].size == width and v.strides[0] % dt.itemsize == 0 \
            and v.strides[0] >= width * dt.itemsize:
        stride = v.strides[0] // dt.itemsize
        # one flat view over the rows and the gaps between them (all inside v's buffer)
        span = np.lib.stride_tricks.as_strided(v, shape=((n - 1) * stride + width,), strides=(dt.itemsize,))
        return span, stride
    v = _in(v, dt)
    if v.size != n * width:
        raise ValueError(f"values hold {v.size} elements, expected {n} rows of {width}")
    return v, width
