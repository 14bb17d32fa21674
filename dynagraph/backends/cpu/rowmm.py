"""Per-sample products that read their matrices in place (kernels/rowmm.c).

A batch of products A_j x_j whose matrices are rows of several earlier blocks (MV-RNN's
`A[r] * a[l]`: A from a lookup table or from the previous level's outputs) would be
gathered into one (B, r, c) copy, multiplied, and its gradient (B, r, c) built and
scattered back. The executor instead hands the op a `RowsOperand` (the backend's
`rows_operand` capability): the forward reads each A_j where it lies, and the backward
returns an `OuterRows`, which `scatter_indexed` adds into the gradient rows in place
(g_j x_j^T, sequential over j, so a matrix read by several products receives every
contribution). Anything the kernel does not cover (a matrix argument on the right, a
vector A, integer data) takes the dense path: `dense()` is the gather the executor
would have made.
"""
from __future__ import annotations

import numpy as np

from ..._kernels import ffi
from .ffi import _PTRS, _fn, _in, _p, _pi
from .rows import _PTR, RowIndex, _table, _used, gather_indexed


class RowsOperand:
    """An argument list left in place: rows `index` (a checked cpu.RowIndex) of the blocks
    given, whose arrays it keeps (a later re-evaluation may drop them from the graph's
    list; this batch's backward still reads what its forward read, as from a gathered copy).

    Has the shape and dtype of the array it stands for; ops ask `reads_in_place` and
    either call `matvec`/`matvec_grads` or take `dense()`."""
    __slots__ = ("bases", "index", "shape", "dtype", "ndim", "table")
    reads_in_place = True

    def __init__(self, blocks: list, index: RowIndex):
        if type(index) is not RowIndex:  # the kernels trust its rows: only a checked index
            raise TypeError(f"RowsOperand needs a cpu.RowIndex from cpu.row_index, got {type(index).__name__}")
        bases = [blocks[b] for b in index.ids]
        # the block addresses in one C call, checked there (C-contiguous, one dtype, the index's shapes):
        # a tree's batch reads rows of a dozen blocks or more, and a pointer per block per call was
        # most of a small batch's time
        fast = _table(bases, index, False) if all(type(u) is np.ndarray for u in bases) else None
        if fast is None:
            dt = bases[0].dtype if type(bases[0]) is np.ndarray else None
            for u in bases:
                if type(u) is not np.ndarray or u.dtype != dt or dt not in _PTRS or not u.flags.c_contiguous:
                    raise ValueError("rows operand: blocks must be C-contiguous float32/float64 numpy arrays of one dtype")
            _used(bases, index, "rows operand")
            self.table = None
        else:
            dt, self.table = fast[0], fast[1]
        self.bases, self.index, self.dtype = tuple(bases), index, dt
        self.shape = (len(index.rows),) + index.shapes[0][1:]
        self.ndim = len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def _pointers(self):
        """The blocks' addresses as the kernels' pointer table; the caller holds self (and so the
        blocks) while C reads them."""
        if self.table is not None:
            return ffi.cast(_PTR[self.dtype], ffi.from_buffer(self.table))
        return ffi.new(_PTRS[self.dtype], [_p(u) for u in self.bases])

    def dense(self) -> np.ndarray:
        """The gathered copy (what the executor would have passed)."""
        return gather_indexed(dict(zip(self.index.ids, self.bases)), self.index)

    def copy_into(self, out: np.ndarray) -> None:
        """out[j] = A_j, where out is a view whose rows are each contiguous at one distance
        (a slice of a concatenation's output along its first per-row axis); any other
        destination takes the dense copy."""
        n, width = self.shape[0], int(np.prod(self.shape[1:]))
        dt = self.dtype
        if type(out) is not np.ndarray or out.shape != self.shape or out.dtype != dt:
            raise ValueError(f"copy_into: destination of shape {getattr(out, 'shape', None)} and dtype "
                             f"{getattr(out, 'dtype', None)}, expected {self.shape} {dt}")
        if not out.flags.writeable:
            raise ValueError("copy_into: destination is read-only")
        if n < 2 or out.flags.c_contiguous:
            stride = width
            span = out.reshape(-1) if out.flags.c_contiguous else None
        else:
            stride = out.strides[0] // dt.itemsize
            ok = out[0].flags.c_contiguous and out.strides[0] % dt.itemsize == 0 and stride >= width
            span = np.lib.stride_tricks.as_strided(out, shape=((n - 1) * stride + width,), strides=(dt.itemsize,)) \
                if ok else None
        if span is None:
            out[...] = self.dense()
            return
        _fn("dg_rows_copy_into", dt)(_p(span), stride, self._pointers(), _pi(self.index.local),
                                     _pi(self.index.rows), n, width)

    def _fits(self, X) -> bool:
        """A batch of vectors X of this dtype, one per product (or one shared), matching c."""
        return (self.ndim == 3 and type(X) is np.ndarray and X.ndim == 2 and X.dtype == self.dtype
                and X.shape[1] == self.shape[2] and X.shape[0] in (1, self.shape[0]))

    def matvec(self, X) -> np.ndarray | None:
        """y_j = A_j x_j as (n, r); None where the kernel does not apply (take dense())."""
        if not self._fits(X):
            return None
        n, r, c = self.shape
        dt = self.dtype
        x = _in(X, dt)
        y = np.empty((n, r), dt)
        _fn("dg_rows_matvec", dt)(_p(y), self._pointers(), _pi(self.index.local), _pi(self.index.rows),
                                  _p(x), 0 if x.shape[0] == 1 and n > 1 else c, n, r, c)
        return y

    def matvec_grads(self, X, G, need: tuple) -> tuple | None:
        """(gA, gX) of y_j = A_j x_j: gA an OuterRows (added in place by scatter_indexed),
        gX = A_j^T g_j summed over j where X is shared; None where matvec would not apply."""
        if not self._fits(X) or type(G) is not np.ndarray or G.shape != self.shape[:2]:
            return None
        n, r, c = self.shape
        dt = self.dtype
        g = _in(G, dt)
        gA = OuterRows(g, _in(X, dt), self.shape) if need[0] else None
        gX = None
        if need[1]:
            gX = np.empty((n, c), dt)
            _fn("dg_rows_matvec_tgrad", dt)(_p(gX), self._pointers(), _pi(self.index.local),
                                            _pi(self.index.rows), _p(g), n, r, c)
            if X.shape[0] == 1 and n > 1:
                gX = gX.sum(axis=0, keepdims=True)
        return gA, gX


class OuterRows:
    """The gradient g_j x_j^T of per-sample matrices, never materialised: scatter_indexed
    adds it into the gradient rows through the forward's row index."""
    __slots__ = ("g", "x", "shape", "dtype")

    def __init__(self, g: np.ndarray, x: np.ndarray, shape: tuple):
        self.g, self.x, self.shape, self.dtype = g, x, shape, g.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def dense(self) -> np.ndarray:
        n = self.shape[0]
        x = np.broadcast_to(self.x, (n, self.x.shape[1]))
        return self.g[:, :, None] * x[:, None, :]

    def add_into(self, targets: list, ix: RowIndex) -> None:
        """targets[k] is the gradient block of ix.ids[k]; each row += g_j x_j^T."""
        n, r, c = self.shape
        dt = self.dtype
        if len(ix.rows) != n or ix.shapes[0][1:] != (r, c):
            raise ValueError(f"outer-product gradient of shape {self.shape} does not fit rows of {ix.shapes[0][1:]}")
        for b, u in zip(ix.ids, targets):
            if type(u) is not np.ndarray or u.dtype != dt or not u.flags.c_contiguous or not u.flags.writeable:
                raise ValueError(f"scatter target block {b} must be a writeable C-contiguous {dt} numpy array")
        _used(targets, ix, "outer-product scatter")
        xstride = 0 if self.x.shape[0] == 1 and n > 1 else c
        bufs = [_p(u) for u in targets]
        _fn("dg_rows_outer_add", dt)(ffi.new(_PTRS[dt], bufs), _pi(ix.local), _pi(ix.rows), _p(self.g), _p(self.x),
                                     xstride, n, r, c)


def rows_operand(blocks: list, index) -> RowsOperand | None:
    """The capability: rows `index` of `blocks` left in place, or None where the kernel
    cannot read them (not a cpu.RowIndex, or blocks that are not real numpy arrays)."""
    if type(index) is not RowIndex:
        return None
    dt = getattr(blocks[index.ids[0]], "dtype", None)
    for b in index.ids:
        u = blocks[b]
        if type(u) is not np.ndarray or u.dtype != dt or dt not in _PTRS or not u.flags.c_contiguous:
            return None
    return RowsOperand(blocks, index)
