"""The "cpu" backend: numpy plus C kernels compiled by cffi (`dynagraph._kernels`).

Two layers:
  * a Python API over every kernel (row movers, elementwise, reductions, softmax
    family, fused LSTM/GRU/TreeLSTM cells, trainer rules). It is the only door to the
    C code: every index is range-checked and every shape and dtype validated here,
    inputs are made C-contiguous (copied if need be), outputs that are written in place
    must already be C-contiguous, writeable and of the right dtype, or it raises.
  * `CpuBackend`, which installs a kernel in place of the numpy code only where
    bench/kernels.py measured it faster (see installed_kernels() and the thresholds
    above it), and otherwise falls back to the op's own numpy code batch by batch.

Importing this module raises ImportError when the extension was not built;
backends/__init__.py then warns once and uses the numpy backend.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .._kernels import ffi, lib
from ..ops.base import OPS
from .numpy_backend import NumpyBackend

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
    once with stride 0 instead of being copied n times."""
    v = np.asarray(vals)
    if n > 1 and v.ndim >= 1 and v.shape[0] == n and v.strides[0] == 0:
        base = _in(v[0], dt)
        if base.size == width:
            return base, 0
    v = _in(v, dt)
    if v.size != n * width:
        raise ValueError(f"values hold {v.size} elements, expected {n} rows of {width}")
    return v, width


def _frozen(a: np.ndarray) -> np.ndarray:
    """A private int64 copy that nobody can make writeable again: its memory is a bytes object."""
    a = np.ascontiguousarray(a, dtype=np.int64)
    return np.frombuffer(a.tobytes(), np.int64).reshape(a.shape)


class RowIndex:
    """A validated list of (block, row) pairs. The executor builds one per gathered
    argument and the backward scatter of that argument reuses it: the rows are checked
    once, and only each block's shape is re-checked (per block, not per row).

    Made only by `row_index`, which checks it; it cannot be built or changed from Python
    (no constructor, read-only attributes, arrays in immutable memory), since the C
    kernels trust its rows.
      ids     distinct block ids (tuple)
      local   per row, the position of its block in ids
      rows    int64, each within its own block
      shapes  the shape of each block in ids when the rows were checked
    """
    __slots__ = ("ids", "local", "rows", "shapes")

    def __new__(cls, *args, **kwargs):
        raise TypeError("cpu.RowIndex is made only by cpu.row_index(...), which checks every row")

    def __setattr__(self, name, value):
        raise AttributeError("a checked cpu.RowIndex cannot be changed")

    __delattr__ = __setattr__

    def __repr__(self) -> str:
        return f"RowIndex(ids={self.ids}, rows={self.rows.tolist()[:8]}..., shapes={self.shapes})"


def _row_index_checked(ids, local, rows, shapes) -> RowIndex:
    ix = object.__new__(RowIndex)
    for name, value in (("ids", tuple(ids)), ("local", _frozen(local)), ("rows", _frozen(rows)),
                        ("shapes", tuple(shapes))):
        object.__setattr__(ix, name, value)
    return ix


def _ints(xs, what: str, ints: bool = False) -> np.ndarray:
    """A flat sequence of integers as int64 (no silent truncation of floats or huge uints).
    ints: xs is known to hold Python ints (the executor's own bookkeeping), converted by
    fromiter at half asarray's cost; the values are range-checked all the same."""
    if ints and type(xs) is tuple:
        return np.fromiter(xs, np.int64, len(xs))
    r = np.asarray(xs)
    if r.dtype.kind not in "iu" or r.ndim != 1:
        raise TypeError(f"{what} must be a flat sequence of integers, got {r.dtype} with shape {r.shape}")
    if r.dtype.kind == "u" and r.size and int(r.max()) > np.iinfo(np.int64).max:
        raise IndexError(f"{what}: index {int(r.max())} out of range")
    return np.ascontiguousarray(r, dtype=np.int64)


def row_index(shape_of: Callable[[int], tuple], n_blocks: int, blks: Sequence[int], rows: Sequence[int],
              what: str = "rows", ints: bool = False) -> RowIndex:
    """Check every (blks[j], rows[j]) against the block's shape, vectorised: block ids in
    [0, n_blocks), rows in [0, rows of that block), all blocks with one row shape."""
    n = len(blks)
    if n == 0 or len(rows) != n:
        raise ValueError(f"{what}: {n} block ids for {len(rows)} rows (need the same number, at least one)")
    b, r = _ints(blks, f"{what} block ids", ints), _ints(rows, what, ints)
    lo, hi = int(b.min()), int(b.max())
    if lo < 0 or hi >= n_blocks:
        raise IndexError(f"{what}: block id {lo if lo < 0 else hi} out of range [0, {n_blocks})")
    if lo == hi:
        ids, local = [lo], np.zeros(n, dtype=np.int64)
    else:  # distinct ids and each row's position among them, by a lookup table over [lo, hi]
        seen = np.zeros(hi - lo + 1, dtype=bool)
        seen[b - lo] = True
        present = np.flatnonzero(seen)
        lut = np.empty(hi - lo + 1, dtype=np.int64)
        lut[present] = np.arange(len(present))
        local, ids = lut[b - lo], (present + lo).tolist()
    shapes = tuple(tuple(shape_of(i)) for i in ids)
    tail = shapes[0][1:]
    for i, s in zip(ids, shapes):
        if s[1:] != tail:
            raise ValueError(f"{what}: block {i} has rows of shape {s[1:]}, expected {tail}")
    limit = np.array([s[0] for s in shapes], dtype=np.int64)[local] if len(ids) > 1 else shapes[0][0]
    if int(r.min()) < 0 or not (r < limit).all():
        j = int(np.flatnonzero((r < 0) | (r >= limit))[0])
        lim = int(limit[j]) if len(ids) > 1 else limit
        raise IndexError(f"{what}: row {int(r[j])} out of range for block {ids[int(local[j])]} of {lim} rows")
    return _row_index_checked(ids, local, r, shapes)


def _used(blocks: list, ix: RowIndex, what: str) -> None:
    """The index still fits these blocks: each has the shape it was checked against."""
    for b, u, s in zip(ix.ids, blocks, ix.shapes):
        if u.shape != s:
            raise ValueError(f"{what}: block {b} has shape {u.shape}, the row index was checked for {s}")


# ----------------------------------------------------------------- row movers
def _block_shape(a, what: str) -> tuple:
    if not isinstance(a, np.ndarray) or a.ndim < 1:
        raise TypeError(f"{what}: blocks must be numpy arrays of at least one dimension, got {type(a).__name__}")
    return a.shape


def gather_rows(blocks: Sequence[np.ndarray], blks: Sequence[int], rows: Sequence[int]) -> np.ndarray:
    """Row j of the result is blocks[blks[j]][rows[j]], all source blocks in one call."""
    return gather_indexed(blocks, row_index(lambda i: _block_shape(blocks[i], "gather_rows"), len(blocks), blks,
                                            rows, "gather_rows"))


def gather_indexed(blocks: Sequence[np.ndarray], ix: RowIndex) -> np.ndarray:
    if type(ix) is not RowIndex:
        raise TypeError(f"gather_indexed: ix must be a cpu.RowIndex from cpu.row_index, got {type(ix).__name__}")
    dt = _real_of(blocks[ix.ids[0]], "gather_rows")
    used = [_in(blocks[b], dt) for b in ix.ids]
    _used(used, ix, "gather_rows")
    tail = ix.shapes[0][1:]
    n = len(ix.rows)
    out = np.empty((n,) + tail, dt)
    bufs = [_p(u) for u in used]  # kept alive until the call returns
    _fn("dg_gather_rows", dt)(_p(out), ffi.new(_PTRS[dt], bufs), _pi(ix.local), _pi(ix.rows), n, _width(tail))
    return out


def scatter_add_rows(targets: Callable[[int], np.ndarray] | Sequence[np.ndarray], blks: Sequence[int],
                     rows: Sequence[int], vals) -> None:
    """targets(blks[j])[rows[j]] += vals[j]; repeated (block, row) pairs add up.
    `targets` is a list of blocks or a function from block id to block (created lazily)."""
    if len(blks) == 0:
        return
    get = targets if callable(targets) else targets.__getitem__
    bound = 1 << 62 if callable(targets) else len(targets)
    scatter_indexed(targets, row_index(lambda i: _block_shape(get(i), "scatter_add_rows"), bound, blks, rows,
                                       "scatter_add_rows"), vals)


def scatter_indexed(targets: Callable[[int], np.ndarray] | Sequence[np.ndarray], ix: RowIndex, vals) -> None:
    """scatter_add_rows over a checked index (the one its forward gather used)."""
    if type(ix) is not RowIndex:
        raise TypeError(f"scatter_indexed: ix must be a cpu.RowIndex from cpu.row_index, got {type(ix).__name__}")
    get = targets if callable(targets) else targets.__getitem__
    used = [get(b) for b in ix.ids]
    dt = _real_of(used[0], "scatter_add_rows")
    for b, u in zip(ix.ids, used):
        _out(u, dt, f"scatter target block {b}")
    _used(used, ix, "scatter_add_rows")
    n, width = len(ix.rows), _width(ix.shapes[0][1:])
    v, vstride = _rows_operand(vals, n, width, dt)
    if any(np.may_share_memory(v, u) for u in used):
        v = v.copy()
    bufs = [_p(u) for u in used]
    _fn("dg_scatter_add_rows", dt)(ffi.new(_PTRS[dt], bufs), _pi(ix.local), _pi(ix.rows), _p(v), vstride, n, width)


def take_rows(table: np.ndarray, rows) -> np.ndarray:
    """table[rows] (an embedding lookup); rows checked against len(table)."""
    dt = _real_of(table, "take_rows")
    t = _in(table, dt)
    r = _index(rows, t.shape[0], "take_rows")
    out = np.empty((r.shape[0],) + t.shape[1:], dt)
    if r.shape[0]:
        _fn("dg_take_rows", dt)(_p(out), _p(t), _pi(r), r.shape[0], _width(t.shape[1:]))
    return out


def add_rows(g: np.ndarray, rows, vals) -> None:
    """g[rows] += vals, unbuffered: a repeated row receives every contribution."""
    dt = _real_of(g, "add_rows")
    _out(g, dt, "add_rows target")
    r = _index(rows, g.shape[0], "add_rows")
    n, width = r.shape[0], _width(g.shape[1:])
    if n == 0:
        return
    v, vstride = _rows_operand(vals, n, width, dt)
    if np.may_share_memory(v, g):
        v = v.copy()
    _fn("dg_add_rows", dt)(_p(g), _pi(r), _p(v), vstride, n, width)


embedding_lookup = take_rows


def embedding_backward(grad: np.ndarray, touched: np.ndarray | None, idx, vals) -> None:
    """The sparse gradient of a lookup: grad[idx] += vals (repeats add up) and marks
    touched[idx] (a bool array, as LookupParameters keeps)."""
    if touched is None:
        return add_rows(grad, idx, vals)
    dt = _real_of(grad, "embedding_backward")
    _out(grad, dt, "embedding gradient")
    if not isinstance(touched, np.ndarray) or touched.dtype != np.bool_ or touched.shape != grad.shape[:1] or not touched.flags.c_contiguous \
            or not touched.flags.writeable:
        raise ValueError(f"touched must be a writeable contiguous bool array of shape {grad.shape[:1]}")
    r = _index(idx, grad.shape[0], "embedding_backward")
    n, width = r.shape[0], _width(grad.shape[1:])
    if n == 0:
        return
    v, vstride = _rows_operand(vals, n, width, dt)
    if np.may_share_memory(v, grad):
        v = v.copy()
    _fn("dg_embedding_bwd", dt)(_p(grad), ffi.from_buffer("unsigned char[]", touched.view(np.uint8)),
                                _pi(r), _p(v), vstride, n, width)


# ---------------------------------------------------------------- elementwise
def _opcode(table: dict, name: str) -> int:
    code = table.get(name)
    if code is None:
        raise ValueError(f"no compiled kernel {name!r}; have {sorted(table)}")
    return code


def unary_forward(name: str, x) -> np.ndarray:
    code = _opcode(UNARY, name)
    x = np.asarray(x)
    dt = _real(x.dtype, name)
    x = _in(x, dt)
    y = np.empty_like(x)
    _fn("dg_unary_fwd", dt)(code, _p(y), _p(x), x.size)
    return y


def unary_backward(name: str, x, y, g) -> np.ndarray:
    """g * f'(x) where y = f(x); x, y and g share one shape."""
    code = _opcode(UNARY, name)
    g = np.asarray(g)
    dt = _real(g.dtype, name)
    x, y, g = _in(x, dt), _in(y, dt), _in(g, dt)
    if not x.shape == y.shape == g.shape:
        raise ValueError(f"{name} backward: shapes differ: x {x.shape}, y {y.shape}, g {g.shape}")
    gx = np.empty_like(g)
    _fn("dg_unary_bwd", dt)(code, _p(gx), _p(x), _p(y), _p(g), g.size)
    return gx


def _lead_pair(x: np.ndarray, y: np.ndarray, what: str) -> int:
    """Batch size of a binary op whose operands have equal per-row shapes and lead 1 or B."""
    if x.shape[1:] != y.shape[1:] or x.ndim < 1:
        raise ValueError(f"{what}: per-row shapes differ: {x.shape[1:]} and {y.shape[1:]}")
    B = max(x.shape[0], y.shape[0])
    if x.shape[0] not in (1, B) or y.shape[0] not in (1, B):
        raise ValueError(f"{what}: batch sizes {x.shape[0]} and {y.shape[0]} do not broadcast")
    return B


def binary_forward(name: str, x, y) -> np.ndarray:
    """x op y for batched x (Bx, ...) and y (By, ...) with Bx, By in {1, B}."""
    code = _opcode(BINARY, name)
    x, y = np.asarray(x), np.asarray(y)
    dt = _real(np.result_type(x.dtype, y.dtype), name)
    x, y = _in(x, dt), _in(y, dt)
    B = _lead_pair(x, y, name)
    n = _width(x.shape[1:])
    out = np.empty((B,) + x.shape[1:], dt)
    _fn("dg_binary_fwd", dt)(code, _p(out), _p(x), n if x.shape[0] > 1 else 0,
                             _p(y), n if y.shape[0] > 1 else 0, B, n)
    return out


def binary_backward(name: str, x, y, out, g, need: Sequence[bool] = (True, True)) -> tuple:
    """(gx, gy), each shaped like its operand (a shared operand's gradient is summed
    over the batch); None where need is false. g and out have g.shape[0] rows."""
    code = _opcode(BINARY, name)
    g = np.asarray(g)
    dt = _real(g.dtype, name)
    x, y, g, out = _in(x, dt), _in(y, dt), _in(g, dt), _in(out, dt)
    _lead_pair(x, y, name)
    B, n = g.shape[0], _width(x.shape[1:])
    if g.shape[1:] != x.shape[1:] or out.shape != g.shape or any(s.shape[0] not in (1, B) for s in (x, y)):
        raise ValueError(f"{name} backward: g {g.shape}, out {out.shape} do not fit x {x.shape}, y {y.shape}")
    gx = np.empty(x.shape, dt) if need[0] else None
    gy = np.empty(y.shape, dt) if need[1] else None
    xs = n if x.shape[0] > 1 or B == 1 else 0
    ys = n if y.shape[0] > 1 or B == 1 else 0
    _fn("dg_binary_bwd", dt)(code, _p(gx) if gx is not None else ffi.NULL, _p(gy) if gy is not None else ffi.NULL,
                             _p(x), xs, _p(y), ys, _p(out), _p(g), B, n)
    return gx, gy


# ------------------------------------------------------------------- reductions
def sum_args(xs: Sequence, scale: float = 1.0) -> np.ndarray:
    """scale * (xs[0] + xs[1] + ...), each (1 or B, ...) with the same per-row shape."""
    if not xs:
        raise ValueError("sum_args needs at least one argument")
    arrs = [np.asarray(x) for x in xs]
    dt = _real(np.result_type(*arrs), "sum_args")
    arrs = [_in(a, dt) for a in arrs]
    tail = arrs[0].shape[1:]
    B = max(a.shape[0] for a in arrs)
    if any(a.shape[1:] != tail or a.shape[0] not in (1, B) for a in arrs):
        raise ValueError(f"sum_args: shapes {[a.shape for a in arrs]} do not broadcast along the batch")
    n = _width(tail)
    out = np.empty((B,) + tail, dt)
    strides = np.array([n if a.shape[0] > 1 else 0 for a in arrs], dtype=np.int64)
    bufs = [_p(a) for a in arrs]
    _fn("dg_sum_args", dt)(_p(out), ffi.new(_PTRS[dt], bufs), _pi(strides), len(arrs), B, n, float(scale))
    return out


def row_sums(x, mean: bool = False) -> np.ndarray:
    """(rows, ...) -> (rows, 1): the sum (or mean) of each row, in numpy's pairwise order."""
    x = np.asarray(x)
    dt = _real(x.dtype, "row_sums")
    x = _in(x, dt)
    rows, n = x.shape[0], _width(x.shape[1:])
    out = np.empty((rows, 1), dt)
    _fn("dg_row_sums", dt)(_p(out), _p(x), rows, n, n if mean else 1)
    return out


def col_sums(x) -> np.ndarray:
    """(rows, ...) -> (1, ...): the sum over the batch axis."""
    x = np.asarray(x)
    dt = _real(x.dtype, "col_sums")
    x = _in(x, dt)
    out = np.empty((1,) + x.shape[1:], dt)
    _fn("dg_col_sums", dt)(_p(out), _p(x), x.shape[0], _width(x.shape[1:]))
    return out


# ---------------------------------------------------------------- softmax family
def _matrix(x, what: str) -> np.ndarray:
    x = np.asarray(x)
    dt = _real(x.dtype, what)
    x = _in(x, dt)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"{what} takes (rows, classes) with classes > 0, got {x.shape}")
    return x


def _rowwise(name: str, x) -> np.ndarray:
    x = _matrix(x, name)
    y = np.empty_like(x)
    _fn(name, x.dtype)(_p(y), _p(x), x.shape[0], x.shape[1])
    return y


def _rowwise_grad(name: str, y, g) -> np.ndarray:
    y = _matrix(y, name)
    g = _in(g, y.dtype)
    if g.shape != y.shape:
        raise ValueError(f"{name}: gradient shape {g.shape} differs from output shape {y.shape}")
    gx = np.empty_like(y)
    _fn(name, y.dtype)(_p(gx), _p(y), _p(g), y.shape[0], y.shape[1])
    return gx


def softmax_forward(x) -> np.ndarray:
    return _rowwise("dg_softmax_fwd", x)


def softmax_backward(y, g) -> np.ndarray:
    return _rowwise_grad("dg_softmax_bwd", y, g)


def log_softmax_forward(x) -> np.ndarray:
    return _rowwise("dg_log_softmax_fwd", x)


def log_softmax_backward(y, g) -> np.ndarray:
    return _rowwise_grad("dg_log_softmax_bwd", y, g)


def pickneglogsoftmax_forward(x, labels) -> np.ndarray:
    """(rows, 1) losses -log softmax(x[r])[labels[r]]; x may be one shared row (1, n)."""
    x = _matrix(x, "pickneglogsoftmax")
    lab = _index(labels, x.shape[1], "pickneglogsoftmax labels")
    rows = lab.shape[0]
    if x.shape[0] not in (1, rows):
        raise ValueError(f"pickneglogsoftmax: {x.shape[0]} rows of scores for {rows} labels")
    loss = np.empty((rows, 1), x.dtype)
    work = np.empty(x.shape[1], x.dtype)
    # The row stride is 0 only for one shared row: a (0, n) x with no labels is not
    # shared (its buffer holds no row to read).
    _fn("dg_pnls_fwd", x.dtype)(_p(loss), _p(work), _p(x), x.shape[1] if x.shape[0] == rows else 0,
                                _pi(lab), rows, x.shape[1])
    return loss


def pickneglogsoftmax_backward(x, labels, g) -> np.ndarray:
    """Gradient shaped like x: (softmax(x) - onehot) * g per row, summed when x is shared."""
    x = _matrix(x, "pickneglogsoftmax")
    lab = _index(labels, x.shape[1], "pickneglogsoftmax labels")
    rows = lab.shape[0]
    g = _in(g, x.dtype).reshape(-1)
    if x.shape[0] not in (1, rows) or g.shape[0] != rows:
        raise ValueError(f"pickneglogsoftmax backward: x {x.shape}, {rows} labels, g of {g.shape[0]}")
    gx = np.empty_like(x)
    _fn("dg_pnls_bwd", x.dtype)(_p(gx), _p(x), x.shape[1] if x.shape[0] == rows else 0,
                                _pi(lab), _p(g), rows, x.shape[1])
    return gx


# ------------------------------------------------------------------ fused cells
def _gates(pre, k: int, what: str) -> tuple:
    """pre (B, k*H) -> (pre as C-contiguous float array, B, H)."""
    pre = np.asarray(pre)
    dt = _real(pre.dtype, what)
    pre = _in(pre, dt)
    if pre.ndim != 2 or pre.shape[1] % k:
        raise ValueError(f"{what}: pre-activations must be (B, {k}*H), got {pre.shape}")
    return pre, pre.shape[0], pre.shape[1] // k


def _state(a, dt, shape: tuple, what: str, optional: bool = False):
    if a is None:
        if optional:
            return None
        raise ValueError(f"{what} is required")
    a = _in(a, dt)
    if a.shape != shape:
        raise ValueError(f"{what} must have shape {shape}, got {a.shape}")
    return a


def _opt(a):
    return ffi.NULL if a is None else _p(a)


def lstm_forward(pre, c_prev=None, forget_bias: float = 0.0) -> tuple:
    """One LSTM step from pre-activations [i f o g] (B, 4H): returns (h, c, act), act
    being what lstm_backward needs. c_prev None means zeros (the first step)."""
    pre, B, H = _gates(pre, 4, "lstm_forward")
    dt = pre.dtype
    cp = _state(c_prev, dt, (B, H), "c_prev", optional=True)
    c, h, act = np.empty((B, H), dt), np.empty((B, H), dt), np.empty((B, 5 * H), dt)
    _fn("dg_lstm_fwd", dt)(_p(pre), _opt(cp), _p(c), _p(h), _p(act), B, H, float(forget_bias))
    return h, c, act


def lstm_backward(act, c_prev, dh, dc=None) -> tuple:
    """(dpre (B, 4H), dc_prev (B, H) or None when c_prev is None)."""
    act, B, H = _gates(act, 5, "lstm_backward")
    dt = act.dtype
    cp = _state(c_prev, dt, (B, H), "c_prev", optional=True)
    dh = _state(dh, dt, (B, H), "dh")
    dc = _state(dc, dt, (B, H), "dc", optional=True)
    dpre = np.empty((B, 4 * H), dt)
    dcp = np.empty((B, H), dt) if cp is not None else None
    _fn("dg_lstm_bwd", dt)(_p(act), _opt(cp), _p(dh), _opt(dc), _p(dpre), _opt(dcp), B, H)
    return dpre, dcp


def gru_gates_forward(pre_zr, h_prev) -> tuple:
    """GRU stage 1: pre [z r] (B, 2H) -> (zr activations (B, 2H), r * h_prev (B, H))."""
    pre, B, H = _gates(pre_zr, 2, "gru_gates_forward")
    hp = _state(h_prev, pre.dtype, (B, H), "h_prev")
    zr, rh = np.empty_like(pre), np.empty((B, H), pre.dtype)
    _fn("dg_gru_gates_fwd", pre.dtype)(_p(pre), _p(hp), _p(zr), _p(rh), B, H)
    return zr, rh


def gru_output_forward(pre_c, zr, h_prev) -> tuple:
    """GRU stage 2: cand = tanh(pre_c), h = (1 - z) h_prev + z cand -> (h, cand)."""
    pre, B, H = _gates(pre_c, 1, "gru_output_forward")
    zr = _state(zr, pre.dtype, (B, 2 * H), "zr")
    hp = _state(h_prev, pre.dtype, (B, H), "h_prev")
    cand, h = np.empty_like(pre), np.empty_like(pre)
    _fn("dg_gru_out_fwd", pre.dtype)(_p(pre), _p(zr), _p(hp), _p(cand), _p(h), B, H)
    return h, cand


def gru_output_backward(zr, h_prev, cand, dh) -> tuple:
    """(dpre_c, dz, dh_prev) of stage 2; dh_prev is the direct term only."""
    zr, B, H = _gates(zr, 2, "gru_output_backward")
    dt = zr.dtype
    hp, cand, dh = (_state(a, dt, (B, H), w) for a, w in ((h_prev, "h_prev"), (cand, "cand"), (dh, "dh")))
    dpre, dz, dhp = (np.empty((B, H), dt) for _ in range(3))
    _fn("dg_gru_out_bwd", dt)(_p(zr), _p(hp), _p(cand), _p(dh), _p(dpre), _p(dz), _p(dhp), B, H)
    return dpre, dz, dhp


def gru_gates_backward(zr, h_prev, dz, drh, dh_prev: np.ndarray | None = None) -> np.ndarray:
    """dpre_zr (B, 2H) of stage 1; adds r * drh into dh_prev in place when given."""
    zr, B, H = _gates(zr, 2, "gru_gates_backward")
    dt = zr.dtype
    hp, dz, drh = (_state(a, dt, (B, H), w) for a, w in ((h_prev, "h_prev"), (dz, "dz"), (drh, "drh")))
    if dh_prev is not None:
        _out(dh_prev, dt, "dh_prev")
        if dh_prev.shape != (B, H):
            raise ValueError(f"dh_prev must have shape {(B, H)}, got {dh_prev.shape}")
    dpre = np.empty((B, 2 * H), dt)
    _fn("dg_gru_gates_bwd", dt)(_p(zr), _p(hp), _p(dz), _p(drh), _p(dpre), _opt(dh_prev), B, H)
    return dpre


def _kids(c_kids, N: int, B: int, H: int, dt) -> np.ndarray:
    if N == 0:
        return np.zeros((0, B, H), dt)
    if isinstance(c_kids, (list, tuple)):
        c_kids = np.stack([_in(c, dt) for c in c_kids]) if c_kids else np.zeros((0, B, H), dt)
    return _state(c_kids, dt, (N, B, H), "c_kids")


def _rows_out(a, dt, shape: tuple, what: str) -> int:
    """An output written row by row: unit column stride, rows ld elements apart (ld >= width),
    so it may be rows and columns of a wider buffer. Returns ld."""
    if not isinstance(a, np.ndarray) or a.dtype != dt or not a.flags.writeable or a.shape != shape:
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{what} must be a writeable {dt} array of shape {shape}, got {got}")
    it = dt.itemsize
    ld = a.strides[0] // it if shape[0] > 1 else shape[1]
    if shape[0] and shape[1] and (a.strides[1] != it and shape[1] > 1 or a.strides[0] % it or ld < shape[1]):
        raise ValueError(f"{what}: rows must be unit-stride and not overlap, got strides {a.strides}")
    return ld


def _disjoint(outs: list, ins: list, what: str) -> None:
    """The kernels' pointers are restrict: no output may share memory with another array."""
    for i, o in enumerate(outs):
        for x in outs[i + 1:] + ins:
            if x is not None and o.size and x.size and np.shares_memory(o, x):
                raise ValueError(f"{what}: an output overlaps another argument")


class KidRows:
    """The children of a TreeLSTM batch as rows of a state table: child k of batch row b
    is row rows[k, b]. Checked once, against `bound` (a table passed with it must have at
    least that many rows), so a caller that reuses it every pass pays the check once. The
    rows are a read-only private copy: nobody can change a checked index. ld: the
    elements from one child's rows to the next's (B, or more for a window of a wider
    array, see windows)."""

    __slots__ = ("rows", "bound", "N", "B", "ld", "ptr")

    def __init__(self, rows, bound: int):
        r = self._checked(rows, bound)
        self._set(r, int(bound), r.shape[0], r.shape[1], r.shape[1], ffi.from_buffer("int64_t[]", r))

    def _set(self, rows, bound, N, B, ld, ptr) -> None:
        for name, value in zip(self.__slots__, (rows, bound, N, B, ld, ptr)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        # The kernels trust a KidRows: its rows, bound and pointer are fixed once checked.
        raise AttributeError("a checked cpu.KidRows cannot be changed")

    __delattr__ = __setattr__

    @classmethod
    def windows(cls, rows, bound: int, spans: Sequence, axis: int) -> list:
        """One KidRows per span [s, e) of a 2-D array checked once: its columns s..e-1
        (axis=1: N = the array's rows, B = e - s) or its rows (axis=0: N = e - s, B = its
        columns). What a caller with many small batches a pass (dy.cavs's tasks) wants."""
        r = cls._checked(rows, bound)
        base, (n0, n1) = ffi.from_buffer("int64_t[]", r), r.shape
        out = []
        for s, e in spans:
            if not 0 <= s <= e <= r.shape[axis]:
                raise ValueError(f"KidRows.windows: span {s}..{e} beyond {r.shape[axis]}")
            k = cls.__new__(cls)
            N, B, ld = (n0, e - s, n1) if axis else (e - s, n1, n1)
            k._set(r[:, s:e] if axis else r[s:e], int(bound), N, B, ld, base + (s if axis else s * n1))
            out.append(k)
        return out

    @staticmethod
    def _checked(rows, bound: int) -> np.ndarray:
        r = np.array(rows, dtype=np.int64, order="C", copy=True)
        if r.ndim != 2:
            raise ValueError(f"KidRows: rows must be (N, B), got shape {r.shape}")
        if r.size and (int(r.min()) < 0 or int(r.max()) >= bound):
            bad = int(r.min()) if r.min() < 0 else int(r.max())
            raise IndexError(f"KidRows: row {bad} out of range [0, {bound})")
        return _frozen(r)  # never writeable again, even through .base


def _kid_table(table, rows: KidRows, dt, H: int, B: int, what: str, out: bool = False) -> np.ndarray:
    """A (R, H) state table (or its gradient) that rows index: R >= rows.bound."""
    if type(table) is not np.ndarray or table.dtype != dt or not table.flags.c_contiguous or \
            (out and not table.flags.writeable):
        got = f"{table.dtype} contiguous={table.flags.c_contiguous}" if isinstance(table, np.ndarray) \
            else type(table).__name__
        raise ValueError(f"{what} must be a{' writeable' if out else ''} C-contiguous {dt} array, got {got}")
    if table.ndim != 2 or table.shape[1] != H or table.shape[0] < rows.bound or rows.B != B:
        raise ValueError(f"{what}: a table of >= {rows.bound} rows of {H} for {rows.B} batch rows, "
                         f"got shape {table.shape} for {B}")
    return table


def _kids_arg(c_kids, kid_rows, B: int, H: int, dt, what: str) -> tuple:
    """(N, kids array, row pointer or NULL, its row stride): dense (N, B, H) kids, or a
    table and KidRows."""
    if kid_rows is None:
        N = len(c_kids) if c_kids is not None else 0
        return N, _kids(c_kids, N, B, H, dt), ffi.NULL, 0
    if type(kid_rows) is not KidRows:
        raise TypeError(f"{what}: kid_rows must be a cpu.KidRows, got {type(kid_rows).__name__}")
    return kid_rows.N, _kid_table(c_kids, kid_rows, dt, H, B, f"{what} c_kids"), kid_rows.ptr, kid_rows.ld


def treelstm_forward(pre, c_kids, bias=None, out: tuple | None = None, disjoint: bool = False,
                     kid_rows: "KidRows | None" = None) -> tuple:
    """N-ary TreeLSTM step: pre (B, (N+3)H) = [i f_1..f_N o u], c_kids (N, B, H) or a
    list of N (B, H) arrays (N = 0 for a leaf). Returns (h, c, act).

    kid_rows (a KidRows), if given: c_kids is a state table (R, H) and child k of row b
    is its row kid_rows.rows[k, b], read in place (no gathered copy). The rows must not
    be rows that c or h write (dy.cavs's children are earlier tasks' rows).
    bias ((N+3)H,), if given, is added to pre inside the kernel (the same rounding as
    pre + bias first). out = (h, c, act), any of them None, are written in place: h and
    c may be row blocks of wider arrays (unit column stride), act must be C-contiguous.
    disjoint=True: the caller allocated out in buffers of its own that no input shares
    (dy.cavs's workspace), so the per-call overlap check is skipped; shapes, dtypes and
    strides are still checked."""
    pre = np.asarray(pre)
    dt = _real(pre.dtype, "treelstm_forward")
    N = len(c_kids) if kid_rows is None and c_kids is not None else getattr(kid_rows, "N", 0)
    pre, B, H = _gates(pre, N + 3, "treelstm_forward")
    N, kids, rows_p, ldk = _kids_arg(c_kids, kid_rows, B, H, dt, "treelstm_forward")
    if bias is not None:
        bias = _in(bias, dt)
        if bias.shape not in (((N + 3) * H,), (1, (N + 3) * H)):
            raise ValueError(f"treelstm_forward: bias must have {(N + 3) * H} values, got shape {bias.shape}")
    h, c, act = out if out is not None else (None, None, None)
    h = np.empty((B, H), dt) if h is None else h
    c = np.empty((B, H), dt) if c is None else c
    act = np.empty((B, (N + 4) * H), dt) if act is None else _out(act, dt, "treelstm_forward act")
    if act.shape != (B, (N + 4) * H):
        raise ValueError(f"treelstm_forward: act must have shape {(B, (N + 4) * H)}, got {act.shape}")
    ldh, ldc = _rows_out(h, dt, (B, H), "treelstm_forward h"), _rows_out(c, dt, (B, H), "treelstm_forward c")
    if out is not None and not disjoint:
        _disjoint([h, c, act], [pre, bias] + ([kids] if kid_rows is None else []), "treelstm_forward")
        if kid_rows is not None:
            _disjoint([act], [kids], "treelstm_forward")
            for o in (h, c):
                _not_a_kid_row(o, kids, kid_rows, "treelstm_forward")
    _fn("dg_treelstm_fwd", dt)(_p(pre), _opt(bias), _p(kids), rows_p, ldk, N, _rows_p(c), ldc, _rows_p(h), ldh,
                               _p(act), B, H)
    return h, c, act


def _not_a_kid_row(o: np.ndarray, table: np.ndarray, rows: KidRows, what: str) -> None:
    """An output that shares the kids' table may only write rows that are nobody's child."""
    if not o.size or not np.shares_memory(o, table):
        return
    off = o.__array_interface__["data"][0] - table.__array_interface__["data"][0]
    r0 = off // table.strides[0]
    r1 = (off + (o.shape[0] - 1) * o.strides[0] + o.shape[1] * o.itemsize - 1) // table.strides[0] + 1
    if ((rows.rows >= r0) & (rows.rows < r1)).any():
        raise ValueError(f"{what}: an output row is also a child's row of the kids' table")


def _rows_p(a: np.ndarray):
    """A pointer to a's first element; a may be a strided view (its extent is checked by _rows_out)."""
    if a.flags.c_contiguous:
        return _p(a)
    return ffi.cast(_BUF[a.dtype].replace("[]", "*"), a.ctypes.data)


def treelstm_backward(act, c_kids, dh, dc=None, dpre=None, disjoint: bool = False,
                      kid_rows: "KidRows | None" = None, dc_table=None) -> tuple:
    """(dpre (B, (N+3)H), dc_kids (N, B, H)). dpre, if given, is a C-contiguous array
    written in place (rows of a larger per-run buffer: no copy afterwards); disjoint as
    in treelstm_forward.

    kid_rows, as in treelstm_forward: c_kids is the state table, and the children's
    cell gradients are ADDED to the same rows of dc_table (R, H), which is returned in
    place of dc_kids (None without dc_table). dh and dc may be rows of dc_table that
    are nobody's child."""
    act = np.asarray(act)
    dt = _real(act.dtype, "treelstm_backward")
    N = len(c_kids) if kid_rows is None and c_kids is not None else getattr(kid_rows, "N", 0)
    act, B, H = _gates(act, N + 4, "treelstm_backward")
    N, kids, rows_p, ldk = _kids_arg(c_kids, kid_rows, B, H, dt, "treelstm_backward")
    dh = _state(dh, dt, (B, H), "dh")
    dc = _state(dc, dt, (B, H), "dc", optional=True)
    if dpre is None:
        dpre = np.empty((B, (N + 3) * H), dt)
    elif _out(dpre, dt, "treelstm_backward dpre").shape != (B, (N + 3) * H):
        raise ValueError(f"treelstm_backward: dpre must have shape {(B, (N + 3) * H)}, got {dpre.shape}")
    elif not disjoint:
        _disjoint([dpre], [act, kids, dh, dc], "treelstm_backward")
    if kid_rows is None:
        dkids = np.empty((N, B, H), dt)
    elif dc_table is None:
        dkids = None
    else:
        dkids = _kid_table(dc_table, kid_rows, dt, H, B, "treelstm_backward dc_table", out=True)
        if not disjoint:
            _disjoint([dkids], [act, kids, dpre], "treelstm_backward")
            for g in (dh, dc):
                if g is not None:
                    _not_a_kid_row(g, dkids, kid_rows, "treelstm_backward")
    _fn("dg_treelstm_bwd", dt)(_p(act), _p(kids), rows_p, ldk, N, _p(dh), _opt(dc), _p(dpre), _opt(dkids), B, H)
    return dpre, dkids


class TreeCellPlan:
    """Many TreeLSTM cell calls over the same buffers (a dy.cavs pass: a task per tree
    level): the buffers are checked once here, and each call checks only its integer
    row ranges before the kernel runs, where treelstm_forward/backward check every
    array again (about 10 µs a call inside a dy.cavs step, bench/README.md).

    pre    1-D C-contiguous scratch; a call's (M, (N+3)H) pre-activations at its start
    bias   ((N+3)H,) or None
    kids   (R, H) state table that the calls' KidRows index (bound <= R)
    act    (V, (N+4)H); a call owns rows [l0, l0 + M)
    outs   2-D C-contiguous tables h and c rows are written into, named per call as
           (table index, first row, first column)
    dpre   (V, (N+3)H) written by backward, rows [l0, l0 + M) (None: a fresh array a call)
    gkids  (R, H) table the children's cell gradients are added into (None: not wanted)
    gx     (R', D) table add_inputs_grad adds the rows at the scratch's start into

    Written buffers share no memory with the buffers they are computed from (checked
    here), except that an output table may be the kids table: a call's children must
    then not be rows it writes, and a backward's dh and dc must not be rows of dpre or
    children's rows of gkids. dy.cavs checks both once a run (children are earlier
    rows) and once a pass (its gradient buffers apart)."""

    __slots__ = ("N", "H", "G", "A", "dt", "V", "R", "pre_size", "keep", "p_pre", "p_bias", "p_kids", "p_act",
                 "outs", "p_outs", "dpre", "p_dpre", "p_gkids", "gx", "p_gx", "fwd", "bwd", "add")

    def __init__(self, N: int, H: int, pre, bias, kids, act, outs: Sequence, dpre=None, gkids=None, gx=None):
        dt = _real(act.dtype, "TreeCellPlan")
        G, A = (N + 3) * H, (N + 4) * H
        what = "TreeCellPlan"
        pre, act = _out(pre, dt, f"{what} pre"), _out(act, dt, f"{what} act")
        if pre.ndim != 1 or act.ndim != 2 or act.shape[1] != A:
            raise ValueError(f"{what}: pre must be 1-D and act (V, {A}), got {pre.shape} and {act.shape}")
        kids = _out(kids, dt, f"{what} kids")
        if kids.ndim != 2 or kids.shape[1] != H:
            raise ValueError(f"{what}: kids must be an (R, {H}) table, got {kids.shape}")
        if bias is not None:
            bias = _in(bias, dt)
            if bias.size != G:
                raise ValueError(f"{what}: bias must have {G} values, got shape {bias.shape}")
        outs = [_out(o, dt, f"{what} output table") for o in outs]
        if any(o.ndim != 2 for o in outs):
            raise ValueError(f"{what}: output tables must be 2-D")
        if dpre is not None and (_out(dpre, dt, f"{what} dpre").shape != (act.shape[0], G)):
            raise ValueError(f"{what}: dpre must be {(act.shape[0], G)}, got {dpre.shape}")
        if gkids is not None and _out(gkids, dt, f"{what} gkids").shape != kids.shape:
            raise ValueError(f"{what}: gkids must be {kids.shape}, got {gkids.shape}")
        _disjoint([act, *[o for o in outs if o is not kids]], [pre, bias, kids], what)
        if gx is not None and _out(gx, dt, f"{what} gx").ndim != 2:
            raise ValueError(f"{what}: gx must be a 2-D table, got {gx.shape}")
        _disjoint([g for g in (dpre, gkids, gx) if g is not None], [pre, act, kids, *outs], what)
        self.N, self.H, self.G, self.A, self.dt = N, H, G, A, dt
        self.V, self.R, self.pre_size = act.shape[0], kids.shape[0], pre.size
        self.keep = (pre, bias, kids, act, gkids)  # the pointers below point into these
        self.p_pre, self.p_bias, self.p_kids, self.p_act = _p(pre), _opt(bias), _p(kids), _p(act)
        self.outs, self.p_outs = outs, [_p(o) for o in outs]
        self.dpre, self.p_dpre = dpre, _opt(dpre)
        self.p_gkids = _opt(gkids)
        self.gx, self.p_gx = gx, _opt(gx)
        self.fwd, self.bwd, self.add = _fn("dg_treelstm_fwd", dt), _fn("dg_treelstm_bwd", dt), _fn("dg_add_rows", dt)

    def _rows(self, l0: int, M: int, kr: KidRows) -> None:
        if not (type(kr) is KidRows and kr.N == self.N and kr.B == M and kr.bound <= self.R):
            raise ValueError(f"TreeCellPlan: children must be a KidRows of {self.N} x {M} rows below {self.R}")
        if not (0 <= l0 and l0 + M <= self.V and M * self.G <= self.pre_size):
            raise ValueError(f"TreeCellPlan: rows {l0}..{l0 + M} beyond act's {self.V} or pre's {self.pre_size}")

    def _at(self, at: tuple, M: int) -> tuple:
        """(pointer, row stride) of rows [r0, r0 + M), columns [c0, c0 + H) of output table i."""
        i, r0, c0 = at
        o = self.outs[i]
        rows, ld = o.shape
        if not (0 <= r0 and r0 + M <= rows and 0 <= c0 and c0 + self.H <= ld):
            raise ValueError(f"TreeCellPlan: output rows {r0}..{r0 + M}, columns {c0}..{c0 + self.H} beyond "
                             f"a table of {o.shape}")
        return self.p_outs[i] + (r0 * ld + c0), ld

    def forward(self, l0: int, M: int, kr: KidRows, h_at: tuple, c_at: tuple) -> None:
        """Task rows [l0, l0 + M): pre at the scratch's start, children kr; h and c into
        their tables at h_at and c_at, act into its rows."""
        self._rows(l0, M, kr)
        (ph, ldh), (pc, ldc) = self._at(h_at, M), self._at(c_at, M)
        if h_at[0] == c_at[0] and abs(h_at[1] - c_at[1]) < M and abs(h_at[2] - c_at[2]) < self.H:
            raise ValueError("TreeCellPlan: h and c overlap")
        self.fwd(self.p_pre, self.p_bias, self.p_kids, kr.ptr, kr.ld, self.N, pc, ldc, ph, ldh,
                 self.p_act + l0 * self.A, M, self.H)

    def backward(self, l0: int, M: int, kr: KidRows, dh, dc=None) -> np.ndarray:
        """The pre-activation gradients of task rows [l0, l0 + M) (dpre's rows, or a fresh
        array), the children's cell gradients added into gkids."""
        self._rows(l0, M, kr)
        dh = _state(dh, self.dt, (M, self.H), "dh")
        dc = _state(dc, self.dt, (M, self.H), "dc", optional=True)
        if self.dpre is not None:
            dpre, p = self.dpre[l0:l0 + M], self.p_dpre + l0 * self.G
        else:
            dpre = np.empty((M, self.G), self.dt)
            p = _p(dpre)
        self.bwd(self.p_act + l0 * self.A, self.p_kids, kr.ptr, kr.ld, self.N, _p(dh), _opt(dc), p, self.p_gkids, M,
                 self.H)
        return dpre

    def add_inputs_grad(self, rows: KidRows) -> None:
        """gx[rows[i, k]] += row i k of the scratch's start, in that order (repeats add):
        the x gradients of a task whose x's were rows of one state table."""
        if self.gx is None:
            raise ValueError("TreeCellPlan: no gx table")
        if type(rows) is not KidRows:
            raise TypeError(f"TreeCellPlan: rows must be a KidRows, got {type(rows).__name__}")
        R, D = self.gx.shape
        n = rows.N * rows.B
        if not (rows.bound <= R and n * D <= self.pre_size and rows.ld == rows.B):
            raise ValueError(f"TreeCellPlan: {n} rows of {D} below {R} do not fit the scratch of {self.pre_size}")
        if n:
            self.add(self.p_gx, rows.ptr, self.p_pre, D, n, D)


# ----------------------------------------------------------------- trainer rules
def _rule_args(w: np.ndarray, g, states: Sequence[np.ndarray], rows, what: str) -> tuple:
    """Validated (g, row index array or None, nrows, width) for an in-place rule."""
    dt = _real_of(w, what)
    _out(w, dt, f"{what} weights")
    g = _in(g, dt)
    if g.shape != w.shape:
        raise ValueError(f"{what}: gradient shape {g.shape} differs from weights {w.shape}")
    for s in states:
        _out(s, dt, f"{what} state")
        if s.shape != w.shape:
            raise ValueError(f"{what}: state shape {s.shape} differs from weights {w.shape}")
    if rows is None:
        return g, None, 1, w.size
    r = _index(rows, w.shape[0] if w.ndim else 1, f"{what} rows")
    # strictly increasing (a trainer's touched_rows()) is distinct without sorting
    if r.size > 1 and not (r[1:] > r[:-1]).all() and np.unique(r).shape[0] != r.shape[0]:
        raise ValueError(f"{what}: rows must be distinct (each row is updated once)")
    return g, r, r.shape[0], _width(w.shape[1:])


def _rows_ptr(r):
    return ffi.NULL if r is None else _pi(r)


def sgd_update(w: np.ndarray, g, lr_scaled: float, rows=None) -> None:
    """SimpleSGDTrainer: w -= g * (lr * gscale); pass lr_scaled = lr * gscale."""
    g, r, nrows, width = _rule_args(w, g, (), rows, "sgd")
    _fn("dg_sgd", w.dtype)(_p(w), _p(g), _rows_ptr(r), nrows, width, float(lr_scaled))


def momentum_update(w: np.ndarray, g, v: np.ndarray, mom: float, lr_scaled: float, rows=None) -> None:
    """MomentumSGDTrainer: v = mom v - g * (lr * gscale); w += v."""
    g, r, nrows, width = _rule_args(w, g, (v,), rows, "momentum")
    _fn("dg_momentum", w.dtype)(_p(w), _p(g), _p(v), _rows_ptr(r), nrows, width, float(mom), float(lr_scaled))


def adagrad_update(w: np.ndarray, g, h: np.ndarray, lr: float, eps: float, gscale: float, rows=None) -> None:
    """AdagradTrainer: g *= gscale; h += g^2; w -= g / sqrt(h + eps) * lr."""
    g, r, nrows, width = _rule_args(w, g, (h,), rows, "adagrad")
    _fn("dg_adagrad", w.dtype)(_p(w), _p(g), _p(h), _rows_ptr(r), nrows, width, float(lr), float(eps), float(gscale))


def adam_update(w: np.ndarray, g, m: np.ndarray, v: np.ndarray, beta1: float, beta2: float, eps: float,
                lr_t: float, gscale: float, rows=None) -> None:
    """AdamTrainer with DyNet's bias correction folded into lr_t (computed by the trainer)."""
    g, r, nrows, width = _rule_args(w, g, (m, v), rows, "adam")
    _fn("dg_adam", w.dtype)(_p(w), _p(g), _p(m), _p(v), _rows_ptr(r), nrows, width, float(beta1), float(beta2),
                            float(eps), float(lr_t), float(gscale))


# ============================================================ op-level adapters
# Same signatures as an op's forward/backward. An adapter takes the C path only for
# batches where bench/kernels.py measured it faster (float32/float64 numpy arrays of
# a size in the winning range, per-row shapes equal, leading axes 1 or B) and runs the
# op's own numpy code otherwise, so installing one never changes which programs run.
#
# What the measurements say (2-core AVX-512 machine, numpy 2.4, float32): numpy's
# ufuncs cost ~0.5-1 us a call and run AVX-512 loops, so a single-pass C kernel
# (tanh, exp, add, cmult forward) never wins; a kernel wins where it fuses several
# numpy passes (float32 logistic, which numpy computes as 0.5 tanh(x/2) + 0.5; the
# softmax family, unary backward, shared-operand gradients, row sums) on enough
# elements to amortise the ~2 us cffi call, or where numpy needs one call per source
# block or an unbuffered add.at (the row movers).
def _is_real(*arrs) -> bool:
    dt = arrs[0].dtype if type(arrs[0]) is np.ndarray else None
    return dt in _BUF and all(type(a) is np.ndarray and a.dtype == dt for a in arrs)


def _exp_worth(x: np.ndarray, n: int) -> bool:
    """Kernels computing exp/tanh: float32 uses the vectorized dg_expf and wins unless
    rows are long (n >= 1000); float64 calls libm per element and wins only while the
    call overhead dominates (<= 1024 elements)."""
    return n < 1000 if x.dtype == F32 else x.size <= 1024


# Minimum batch elements for the C path, from the benchmark table. The logistic wins in
# float32 only (float64 calls libm's tanh per element: 5-8x slower than numpy).
UNARY_FWD_MIN = {"rectify": 8192, "logistic": 1024}
UNARY_FWD_F32_ONLY = {"logistic"}
UNARY_BWD_MIN = {"tanh": 16384, "logistic": 16384, "rectify": 16384}
CMULT_SHARED_BWD_MIN = 16384
ROW_SUMS_MIN = 4096
SOFTMAX_BWD_MIN = 1024


def _unary_forward(name: str, min_size: int):
    op, code = OPS[name], UNARY[name]
    f32_only = name in UNARY_FWD_F32_ONLY

    def forward(xp, a, data, x):
        if not _is_real(x) or x.size < min_size or f32_only and x.dtype != F32:
            return op.forward(xp, a, data, x)
        x = _in(x, x.dtype)
        y = np.empty_like(x)
        _fn("dg_unary_fwd", x.dtype)(code, _p(y), _p(x), x.size)
        return y
    return forward


def _unary_backward(name: str, min_size: int):
    op, code = OPS[name], UNARY[name]

    def backward(xp, a, data, xs, y, g, need):
        x = xs[0]
        if not (_is_real(x, y, g) and x.shape == y.shape == g.shape) or g.size < min_size:
            return op.backward(xp, a, data, xs, y, g, need)
        dt = g.dtype
        x, y, g = _in(x, dt), _in(y, dt), _in(g, dt)
        gx = np.empty_like(g)
        _fn("dg_unary_bwd", dt)(code, _p(gx), _p(x), _p(y), _p(g), g.size)
        return (gx,)
    return backward


def _binary_fits(x, y, B: int) -> bool:
    return x.shape[1:] == y.shape[1:] and x.ndim >= 2 and x.shape[0] in (1, B) and y.shape[0] in (1, B)


def _binary_forward(name: str, min_size: int):
    op = OPS[name]

    def forward(xp, a, data, x, y):
        if not _is_real(x, y) or max(x.size, y.size) < min_size \
                or not _binary_fits(x, y, max(x.shape[0], y.shape[0])):
            return op.forward(xp, a, data, x, y)
        return binary_forward(name, x, y)
    return forward


def _binary_backward(name: str, min_size: int, shared_only: bool):
    op = OPS[name]

    def backward(xp, a, data, xs, out, g, need):
        x, y = xs
        if not _is_real(x, y, out, g) or g.size < min_size or not _binary_fits(x, y, g.shape[0]) \
                or g.shape != out.shape or g.shape[1:] != x.shape[1:] \
                or (shared_only and x.shape[0] == y.shape[0] == g.shape[0]):
            return op.backward(xp, a, data, xs, out, g, need)
        return binary_backward(name, x, y, out, g, need)
    return backward


def _esum_forward(xp, a, data, *xs):
    if not (_is_real(*xs) and len({x.shape[1:] for x in xs}) == 1 and xs[0].ndim >= 2):
        return OPS["esum"].forward(xp, a, data, *xs)
    return sum_args(xs)


def _row_sums_forward(name: str, mean: bool, min_size: int):
    op = OPS[name]

    def forward(xp, a, data, x):
        if not _is_real(x) or x.size < min_size:
            return op.forward(xp, a, data, x)
        return row_sums(x, mean)
    return forward


def _softmax_forward(xp, a, data, x):
    if a[0] != 0 or not _is_real(x) or x.ndim != 2 or not _exp_worth(x, x.shape[1]):
        return OPS["softmax"].forward(xp, a, data, x)
    return softmax_forward(x)


def _softmax_backward(xp, a, data, xs, y, g, need):
    if a[0] != 0 or not _is_real(y, g) or y.ndim != 2 or y.shape != g.shape or y.size < SOFTMAX_BWD_MIN:
        return OPS["softmax"].backward(xp, a, data, xs, y, g, need)
    return (softmax_backward(y, g),)


def _log_softmax_forward(xp, a, data, x):
    if a[0] is not None or not _is_real(x) or x.ndim != 2 or not _exp_worth(x, x.shape[1]):
        return OPS["log_softmax"].forward(xp, a, data, x)
    return log_softmax_forward(x)


def _log_softmax_backward(xp, a, data, xs, y, g, need):
    if not _is_real(y, g) or y.ndim != 2 or y.shape != g.shape or not _exp_worth(y, y.shape[1]):
        return OPS["log_softmax"].backward(xp, a, data, xs, y, g, need)
    return (log_softmax_backward(y, g),)


def _pnls_forward(xp, a, data, x):
    if not _is_real(x) or x.ndim != 2 or x.shape[0] not in (1, len(data)) or not _exp_worth(x, x.shape[1]):
        return OPS["pickneglogsoftmax"].forward(xp, a, data, x)
    return pickneglogsoftmax_forward(x, data)


def _pnls_backward(xp, a, data, xs, y, g, need):
    x = xs[0]
    if not _is_real(x, g) or x.ndim != 2 or x.shape[0] not in (1, len(data)) or g.size != len(data) \
            or not _exp_worth(x, x.shape[1]):
        return OPS["pickneglogsoftmax"].backward(xp, a, data, xs, y, g, need)
    return (pickneglogsoftmax_backward(x, data, g),)


def _lookup_forward(xp, a, data, table):
    if not _is_real(table) or table.shape[0] != 1:
        return OPS["lookup"].forward(xp, a, data, table)
    return take_rows(table[0], data)


def all_forward_kernels(min_size: int = 0) -> dict:
    """Every op-level forward adapter by op name, taking the C path from `min_size`
    elements on (0: always, as the tests and the benchmark use them)."""
    k = {name: _unary_forward(name, min_size) for name in UNARY}
    k.update({name: _binary_forward(name, min_size) for name in BINARY})
    k.update(esum=_esum_forward, softmax=_softmax_forward, log_softmax=_log_softmax_forward,
             pickneglogsoftmax=_pnls_forward, sum_elems=_row_sums_forward("sum_elems", False, min_size),
             mean_elems=_row_sums_forward("mean_elems", True, min_size), lookup=_lookup_forward)
    return k


def all_backward_kernels(min_size: int = 0) -> dict:
    k = {name: _unary_backward(name, min_size) for name in UNARY}
    k.update({name: _binary_backward(name, min_size, False) for name in BINARY})
    k.update(softmax=_softmax_backward, log_softmax=_log_softmax_backward, pickneglogsoftmax=_pnls_backward)
    return k


def installed_kernels() -> tuple:
    """(forward, backward) overrides CpuBackend installs: the measured winners only."""
    fwd = {name: _unary_forward(name, m) for name, m in UNARY_FWD_MIN.items()}
    fwd.update(softmax=_softmax_forward, log_softmax=_log_softmax_forward, pickneglogsoftmax=_pnls_forward,
               sum_elems=_row_sums_forward("sum_elems", False, ROW_SUMS_MIN),
               mean_elems=_row_sums_forward("mean_elems", True, ROW_SUMS_MIN))
    bwd = {name: _unary_backward(name, m) for name, m in UNARY_BWD_MIN.items()}
    bwd.update(cmult=_binary_backward("cmult", CMULT_SHARED_BWD_MIN, True), softmax=_softmax_backward,
               log_softmax=_log_softmax_backward, pickneglogsoftmax=_pnls_backward)
    return fwd, bwd


# A single-block add_rows with distinct rows is one numpy fancy-index add (~3 us);
# the C call wins from this many rows on, or whenever a row repeats (np.add.at).
ADD_ROWS_MIN = 64


class CpuBackend(NumpyBackend):
    """numpy for everything, C kernels for row movement and the measured winners."""
    name = "cpu"

    def __init__(self, install: bool = True):
        super().__init__(np)
        if install:
            fwd, bwd = installed_kernels()
            self.forward_kernels.update(fwd)
            self.backward_kernels.update(bwd)

    # ------------------------------------------------------------ row movement
    # take_rows (one source block) stays numpy: a single fancy index beats the call.
    def row_index(self, blocks: list, blks: list, rows: list):
        if blocks is None or type(blocks[blks[0]]) is not np.ndarray:
            return super().row_index(blocks, blks, rows)
        return row_index(lambda i: blocks[i].shape, len(blocks), blks, rows, "gather_rows", ints=True)

    def gather_indexed(self, blocks: list, index):
        if type(index) is not RowIndex:
            return super().gather_indexed(blocks, index)
        return gather_indexed(blocks, index)

    def scatter_indexed(self, grad_block, index, vals) -> None:
        if type(index) is not RowIndex:  # row_index left non-numpy blocks to the numpy code
            return super().scatter_indexed(grad_block, index, vals)
        scatter_indexed(grad_block, index, vals)

    def scatter_rows(self, grad_block, blks: list, rows: list, vals) -> None:
        if type(vals) is not np.ndarray:
            return super().scatter_rows(grad_block, blks, rows, vals)
        scatter_add_rows(grad_block, blks, rows, vals)

    def add_rows(self, g, rows: list, vals) -> None:
        if type(g) is not np.ndarray or (len(rows) < ADD_ROWS_MIN and len(set(rows)) == len(rows)):
            return super().add_rows(g, rows, vals)
        add_rows(g, rows, vals)

    def embedding_backward(self, p, idx, vals) -> None:
        """A lookup table's sparse gradient, p.grad[idx] += vals and p.touched[idx] = True
        (LookupParameters.add_sparse_grad's np.add.at) in one call."""
        if type(vals) is not np.ndarray:
            return p.add_sparse_grad(idx, vals)
        embedding_backward(p.grad, p.touched, idx, vals)
