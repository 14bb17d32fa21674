"""Row movers over the C kernels: validated (block, row) indices, multi-block gathers and
scatter-adds, single-table takes/adds and the sparse embedding gradient."""
from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np

from ..._kernels import ffi
from .ffi import F32, F64, _PTRS, _fn, _in, _index, _out, _p, _pi, _real_of, _rows_operand, _width

try:  # optional, compiled beside _kernels (kernels/cpython/run_tables.c); DYNAGRAPH_BOOKKEEPING=python: not used
    if os.environ.get("DYNAGRAPH_BOOKKEEPING", "").lower() == "python":
        raise ImportError("DYNAGRAPH_BOOKKEEPING=python")
    from ..._bookkeeping import block_table as _block_table, row_index_small as _row_index_c
except ImportError:
    _block_table = _row_index_c = None
_FMT = {F32: "f", F64: "d"}
_PTR = {F32: "float **", F64: "double **"}


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


def _row_index_frozen(ids: tuple, local: np.ndarray, rows: np.ndarray, shapes: tuple) -> RowIndex:
    """_row_index_checked for arrays that already view immutable bytes (row_index_small's)."""
    ix = object.__new__(RowIndex)
    for name, value in (("ids", ids), ("local", local), ("rows", rows), ("shapes", shapes)):
        object.__setattr__(ix, name, value)
    return ix


def row_index_of_blocks(blocks: list, blks: Sequence[int], rows: Sequence[int]) -> RowIndex:
    """row_index over a list of blocks for the executor's (block, row) tuples: a few rows in one C
    call (row_index_small) where every value is in range, else the checks and errors below."""
    if _row_index_c is not None and type(blks) is tuple and type(rows) is tuple and type(blocks) is list:
        got = _row_index_c(blocks, blks, rows)
        if got is not None:
            ids, local, r, shapes = got
            return _row_index_frozen(ids, np.frombuffer(local, np.int64), np.frombuffer(r, np.int64), shapes)
    return row_index(lambda i: blocks[i].shape, len(blocks), blks, rows, "gather_rows", ints=True)


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
    if ints and n <= _SMALL and type(blks) is tuple and type(rows) is tuple:
        small = _row_index_small(shape_of, n_blocks, blks, rows, what)
        if small is not None:
            return small
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


_SMALL = 64  # up to this many rows, checking in Python beats the vectorised path's fixed cost


def _row_index_small(shape_of, n_blocks: int, blks: tuple, rows: tuple, what: str) -> RowIndex | None:
    """row_index for a few rows of Python ints (the executor's per-sentence gathers): the same
    checks, errors and RowIndex without a dozen small numpy calls (~60 us -> ~10 us). None when
    some value is not a plain int: the vectorised path decides."""
    for v in blks + rows:
        if type(v) is not int:
            return None
    ids = sorted(set(blks))
    if ids[0] < 0 or ids[-1] >= n_blocks:
        raise IndexError(f"{what}: block id {ids[0] if ids[0] < 0 else ids[-1]} out of range [0, {n_blocks})")
    shapes = tuple(tuple(shape_of(i)) for i in ids)
    tail = shapes[0][1:]
    for i, sh in zip(ids, shapes):
        if sh[1:] != tail:
            raise ValueError(f"{what}: block {i} has rows of shape {sh[1:]}, expected {tail}")
    pos = {bb: k for k, bb in enumerate(ids)}
    local = [pos[bb] for bb in blks]
    for k, r in zip(local, rows):
        if not 0 <= r < shapes[k][0]:
            raise IndexError(f"{what}: row {r} out of range for block {ids[k]} of {shapes[k][0]} rows")
    return _row_index_checked(ids, np.array(local, np.int64), np.array(rows, np.int64), shapes)


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


def _table(arrays: list, ix: RowIndex, writable: bool, avoid=None):
    """(dtype, block address table, overlaps avoid) from one C call when every block is a C-contiguous
    float32/float64 array of its checked shape, else None (the per-block Python path below: it
    converts, checks and reports). Per sentence most gathers read one row from each of a dozen
    blocks, and the per-block checks and pointers were most of their cost."""
    a0 = arrays[0]
    fmt = _FMT.get(a0.dtype) if type(a0) is np.ndarray else None
    if fmt is None or _block_table is None:
        return None
    got = _block_table(arrays, ix.shapes, fmt, writable, avoid)
    return None if got is None else (a0.dtype, got[0], got[1])  # the caller holds the table while C reads it


def gather_indexed(blocks: Sequence[np.ndarray], ix: RowIndex) -> np.ndarray:
    if type(ix) is not RowIndex:
        raise TypeError(f"gather_indexed: ix must be a cpu.RowIndex from cpu.row_index, got {type(ix).__name__}")
    fast = _table([blocks[b] for b in ix.ids], ix, False)
    if fast is not None:
        dt, table, _ = fast
        tail, n = ix.shapes[0][1:], len(ix.rows)
        out = np.empty((n,) + tail, dt)
        _fn("dg_gather_rows", dt)(_p(out), ffi.cast(_PTR[dt], ffi.from_buffer(table)), _pi(ix.local), _pi(ix.rows), n,
                                  _width(tail))
        return out
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
    n, width = len(ix.rows), _width(ix.shapes[0][1:])
    v = vals
    if type(v) is np.ndarray and type(used[0]) is np.ndarray and v.dtype == used[0].dtype and v.flags.c_contiguous \
            and v.size == n * width:
        fast = _table(used, ix, True, v)
        if fast is not None:
            dt, table, overlaps = fast
            if overlaps:  # as np.may_share_memory below: the values must not change while added
                v = v.copy()
            _fn("dg_scatter_add_rows", dt)(ffi.cast(_PTR[dt], ffi.from_buffer(table)), _pi(ix.local), _pi(ix.rows),
                                           _p(v), width, n, width)
            return
    dt = _real_of(used[0], "scatter_add_rows")
    for b, u in zip(ix.ids, used):
        _out(u, dt, f"scatter target block {b}")
    _used(used, ix, "scatter_add_rows")
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


def _row_update(g: np.ndarray, rows, vals, what: str, target: str) -> tuple | None:
    """The checked operands of g[rows] += vals: (dtype, rows, vals, vals' row stride, n, width),
    or None when there are no rows. vals is copied if it overlaps g (the kernel adds in place)."""
    dt = _real_of(g, what)
    _out(g, dt, target)
    r = _index(rows, g.shape[0], what)
    n, width = r.shape[0], _width(g.shape[1:])
    if n == 0:
        return None
    v, vstride = _rows_operand(vals, n, width, dt)
    if np.may_share_memory(v, g):
        v = v.copy()
    return dt, r, v, vstride, n, width


def add_rows(g: np.ndarray, rows, vals) -> None:
    """g[rows] += vals, unbuffered: a repeated row receives every contribution."""
    op = _row_update(g, rows, vals, "add_rows", "add_rows target")
    if op is not None:
        dt, r, v, vstride, n, width = op
        _fn("dg_add_rows", dt)(_p(g), _pi(r), _p(v), vstride, n, width)


embedding_lookup = take_rows


def embedding_backward(grad: np.ndarray, touched: np.ndarray | None, idx, vals) -> None:
    """The sparse gradient of a lookup: grad[idx] += vals (repeats add up) and marks
    touched[idx] (a bool array, as LookupParameters keeps)."""
    if touched is None:
        return add_rows(grad, idx, vals)
    _real_of(grad, "embedding_backward")  # grad is a real array before its shape is read
    if not isinstance(touched, np.ndarray) or touched.dtype != np.bool_ or touched.shape != grad.shape[:1] or not touched.flags.c_contiguous \
            or not touched.flags.writeable:
        raise ValueError(f"touched must be a writeable contiguous bool array of shape {grad.shape[:1]}")
    op = _row_update(grad, idx, vals, "embedding_backward", "embedding gradient")
    if op is None:
        return
    dt, r, v, vstride, n, width = op
    _fn("dg_embedding_bwd", dt)(_p(grad), ffi.from_buffer("unsigned char[]", touched.view(np.uint8)),
                                _pi(r), _p(v), vstride, n, width)
