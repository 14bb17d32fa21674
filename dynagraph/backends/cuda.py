"""The "cuda" backend: every op's `xp` code run over CuPy, plus the contract's
capabilities as device kernels.

  * row movers: a gather or scatter-add over rows spread across several blocks is ONE
    RawKernel launch over a table of row addresses (built on the host from the blocks'
    base pointers, uploaded in one copy); lookups' sparse gradients and repeated-row
    adds are one atomicAdd kernel (cupyx.scatter_add);
  * fused_chains: a FusedChain program compiled to one forward and one backward kernel
    generated from the same op table as the C runs (backends/cuda_codegen.py), cached
    per (program, dtype);
  * optimizer_rules: SGD, momentum, Adagrad and Adam as one ElementwiseKernel each,
    dense or over rows, on the device-resident weights and states;
  * fused_cells: dy.cavs's N-ary TreeLSTM cell as one generated kernel per arity, from
    the same op-table formulas (cuda_codegen.treelstm_source; the wrapper is shared with
    the xp evaluation of tree_cell.py, which the tests run without a GPU);
  * elementwise_runs: None (runs.py builds host address tables from numpy blocks): those
    batches run the ops' own xp code on the device.

CuPy is optional: this module is imported only for backend "cuda", and raises
ImportError without it (backends/__init__.py turns that into a clear message).
CI has no GPU: tests/backends/test_cuda.py and every suite's cuda rows run where CuPy and
a device are present and skip otherwise (they passed on an H200 with CuPy 14.2).
"""
from __future__ import annotations

import numpy as np

import cupy
import cupyx

from . import cuda_codegen
from .numpy_backend import NumpyBackend
from .tree_cell import _CellsBase

_BLOCK = 256
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

_ROWS_SRC = r"""
extern "C" __global__ void dg_gather_rows_%(T)s(const long long* src, %(T)s* out, long long nrows, long long width) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= nrows * width) return;
    long long r = i / width;
    out[i] = ((const %(T)s*)src[r])[i - r * width];
}
extern "C" __global__ void dg_scatter_add_rows_%(T)s(const long long* dst, const %(T)s* vals, long long nrows,
                                                   long long width) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= nrows * width) return;
    long long r = i / width;
    atomicAdd(((%(T)s*)dst[r]) + (i - r * width), vals[i]);
}
"""


def _grid(n: int) -> tuple:
    return ((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,)


class _RowKernels:
    def __init__(self):
        self._mod = cupy.RawModule(code="".join(_ROWS_SRC % {"T": t} for t in ("float", "double")))

    def fn(self, what: str, dt):
        return self._mod.get_function(f"dg_{what}_{_CTYPE[np.dtype(dt)]}")


class GpuRowIndex:
    """(blks, rows) checked once against the blocks' sizes, as numpy arrays; the row
    addresses are formed per call from the blocks actually passed (value blocks forward,
    gradient blocks backward)."""
    __slots__ = ("blks", "rows", "uniq", "width", "shape")

    def __init__(self, blocks: list, blks, rows):
        self.blks = np.asarray(blks, np.int64)
        self.rows = np.asarray(rows, np.int64)
        self.uniq = np.unique(self.blks)
        first = blocks[int(self.blks[0])]
        self.shape, self.width = first.shape[1:], int(np.prod(first.shape[1:], dtype=np.int64))
        for b in self.uniq:
            blk = blocks[int(b)]
            if blk.shape[1:] != self.shape:
                raise ValueError(f"gather_rows: block {b} has rows of shape {blk.shape[1:]}, expected {self.shape}")
            sel = self.rows[self.blks == b]
            if sel.size and (sel.min() < 0 or sel.max() >= blk.shape[0]):
                raise IndexError(f"gather_rows: a row of block {b} is out of range ({blk.shape[0]} rows)")

    def addresses(self, block_of, dt) -> "cupy.ndarray":
        base = np.zeros(int(self.uniq.max()) + 1, np.int64)
        for b in self.uniq:
            a = block_of(int(b))
            if a.dtype != dt or not a.flags.c_contiguous:
                raise ValueError(f"row kernels need C-contiguous {dt} blocks; block {b} is {a.dtype}")
            base[b] = a.data.ptr
        return cupy.asarray(base[self.blks] + self.rows * (self.width * np.dtype(dt).itemsize))


class CudaChains:
    """fused_chains: FusedChain programs as generated CUDA kernels."""
    dtypes = frozenset(_CTYPE)
    array_type = cupy.ndarray

    def __init__(self):
        self._modules: dict = {}

    def compile(self, code: np.ndarray, consts: np.ndarray, n_inputs: int, n_steps: int):
        return _CudaChain(self, code, consts, n_inputs, n_steps)

    def module(self, code, consts, nin: int, dt):
        key = (code.tobytes(), consts.tobytes(), nin, np.dtype(dt).str)
        mod = self._modules.get(key)
        if mod is None:
            src = cuda_codegen.chain_source(code, consts, nin, np.dtype(dt).name)
            mod = self._modules[key] = cupy.RawModule(code=src)
        return mod


def _operands(arrs: list, B: int, n: int, dt) -> tuple:
    """Device (pointer table, row strides) for a generated kernel: per-row operands are
    made C-contiguous, shared ones (leading axis 1) get stride 0, None is a null pointer."""
    keep, ptrs, strides = [], [], []
    for x in arrs:
        if x is None:
            ptrs.append(0)
            strides.append(0)
            continue
        x = cupy.ascontiguousarray(x, dtype=dt)
        keep.append(x)
        ptrs.append(x.data.ptr)
        strides.append(n if x.shape[0] > 1 else 0)
    return cupy.asarray(np.array(ptrs, np.int64)), cupy.asarray(np.array(strides, np.int64)), keep


class _CudaChain:
    def __init__(self, owner: CudaChains, code, consts, nin: int, ns: int):
        self.owner, self.code, self.consts, self.n_inputs, self.n_steps = owner, code, consts, nin, ns

    def forward(self, ins: list, B: int, shape: tuple, n: int, dt) -> tuple:
        ip, ist, keep = _operands(ins, B, n, dt)
        block = cupy.empty((self.n_steps, B) + tuple(shape), dt)
        fn = self.owner.module(self.code, self.consts, self.n_inputs, dt).get_function("dg_chain_fwd")
        fn(*_grid(B * n), (ip, ist, block, np.int64(B), np.int64(n)))
        return block, None, True  # nothing reused: backward forms its own pointer tables

    def backward(self, ins, handles, block, outs, gouts, live, need, B: int, n: int, dt) -> list:
        ip, ist, keep = _operands(ins, B, n, dt)
        op, _, keep_o = _operands(list(block) if block is not None else outs, B, n, dt)
        gp, gst, keep_g = _operands(gouts, B, n, dt)
        grads = [cupy.zeros(x.shape, dt) if w else None for x, w in zip(ins, need)]
        gin, _, _ = _operands(grads, B, n, dt)
        fn = self.owner.module(self.code, self.consts, self.n_inputs, dt).get_function("dg_chain_bwd")
        fn(*_grid(B * n), (ip, ist, op, gp, gst, gin, np.int64(B), np.int64(n)))
        return grads


class CudaOptimizerRules:
    """The trainer rules as ElementwiseKernels over (rows of) device arrays; the same
    arithmetic as the trainers' _rule and the C rules."""

    def __init__(self):
        ek = cupy.ElementwiseKernel
        self._sgd = ek("T g, T lr", "T w", "w -= g * lr", "dg_sgd")
        self._mom = ek("T g, T mom, T lr", "T w, T v", "v = mom * v - g * lr; w += v", "dg_momentum")
        self._ada = ek("T g, T lr, T eps, T gs", "T w, T h",
                       "T gg = g * gs; h += gg * gg; w -= gg / sqrt(h + eps) * lr", "dg_adagrad")
        self._adam = ek("T g, T b1, T b2, T eps, T lr_t, T gs", "T w, T m, T v",
                        "T gg = g * gs; m = m * b1 + gg * (1 - b1); v = v * b2 + gg * gg * (1 - b2);"
                        " w -= lr_t * m / (sqrt(v) + eps)", "dg_adam")

    @staticmethod
    def _apply(kernel, w, g, states: tuple, scalars: tuple, rows) -> None:
        if rows is None:
            kernel(g, *[w.dtype.type(s) for s in scalars], w, *states)
            return
        r = cupy.asarray(rows)
        # g is the whole table's gradient, as for the C rules; the rows are distinct
        # (trainers pass touched_rows()), so the gathered rows scatter back without loss
        ws, ss = w[r], [s[r] for s in states]
        kernel(g[r], *[w.dtype.type(s) for s in scalars], ws, *ss)
        w[r] = ws
        for s, v in zip(states, ss):
            s[r] = v

    def sgd_update(self, w, g, lr_scaled: float, rows=None) -> None:
        self._apply(self._sgd, w, g, (), (lr_scaled,), rows)

    def momentum_update(self, w, g, v, mom: float, lr_scaled: float, rows=None) -> None:
        self._apply(self._mom, w, g, (v,), (mom, lr_scaled), rows)

    def adagrad_update(self, w, g, h, lr: float, eps: float, gscale: float, rows=None) -> None:
        self._apply(self._ada, w, g, (h,), (lr, eps, gscale), rows)

    def adam_update(self, w, g, m, v, beta1: float, beta2: float, eps: float, lr_t: float, gscale: float,
                    rows=None) -> None:
        self._apply(self._adam, w, g, (m, v), (beta1, beta2, eps, lr_t, gscale), rows)


class CudaCells(_CellsBase):
    """fused_cells: the TreeLSTM cell program of cuda_codegen as one generated kernel per
    (arity, bias, dc, child-gradient mode, dtype), one thread per (row, unit)."""

    def __init__(self):
        super().__init__(cupy)
        self._modules: dict = {}

    def _fn(self, which: str, N: int, has_bias: bool, has_dc: bool, mode: int, dt):
        key = (N, has_bias, has_dc, mode, np.dtype(dt).str)
        mod = self._modules.get(key)
        if mod is None:
            src = cuda_codegen.treelstm_source(N, has_bias, has_dc, mode, np.dtype(dt).name)
            mod = self._modules[key] = cupy.RawModule(code=src)
        return mod.get_function(which)

    @staticmethod
    def _rows_arg(kr) -> tuple:
        if kr is None:
            return _NULL, np.int64(0)
        return kr.rows, np.int64(kr.ld)  # a device view: its pointer is the window's first row

    @staticmethod
    def _ld(a, H: int, what: str) -> np.int64:
        """Row stride (elements) of an output with unit column stride."""
        if a.shape[1] > 1 and a.strides[1] != a.itemsize or a.strides[0] % a.itemsize:
            raise ValueError(f"treelstm: {what} must have unit column stride")
        return np.int64(a.strides[0] // a.itemsize if a.shape[0] > 1 else H)

    def _fwd(self, pre, bias, kids, kr, N: int, h, c, act, B: int, H: int) -> None:
        if not act.flags.c_contiguous:
            raise ValueError("treelstm_forward: act must be C-contiguous")
        fn = self._fn("dg_tree_fwd", N, bias is not None, False, 0, pre.dtype)
        rows, ldk = self._rows_arg(kr)
        fn(*_grid(B * H), (pre, _NULL if bias is None else bias, _NULL if kids is None else kids, rows, ldk,
                           c, self._ld(c, H, "c"), h, self._ld(h, H, "h"), act, np.int64(B), np.int64(H)))

    def _bwd(self, act, kids, kr, N: int, dh, dc, dpre, dkids, mode: int, B: int, H: int) -> None:
        if not dpre.flags.c_contiguous or (mode == 1 and not dkids.flags.c_contiguous):
            raise ValueError("treelstm_backward: dpre and the children's gradients must be C-contiguous")
        fn = self._fn("dg_tree_bwd", N, False, dc is not None, mode, act.dtype)
        rows, ldk = self._rows_arg(kr)
        fn(*_grid(B * H), (act, _NULL if kids is None else kids, rows, ldk, dh, _NULL if dc is None else dc, dpre,
                           _NULL if dkids is None else dkids, np.int64(B), np.int64(H)))


_NULL = np.uint64(0)  # a null pointer argument of a RawKernel


_ADD_AT = getattr(cupy.add, "at", None) or cupyx.scatter_add  # cupy.add.at from CuPy 13; scatter_add deprecated there


def _row_add(g, rows, vals) -> None:
    """g[rows] += vals in one atomicAdd kernel, repeated rows included."""
    _ADD_AT(g, cupy.asarray(rows), vals.reshape((len(rows),) + g.shape[1:]))


class CudaBackend(NumpyBackend):
    name = "cuda"

    def __init__(self):
        super().__init__(cupy)
        cupy.cuda.runtime.getDeviceCount()  # raises here, with CUDA's message, when no device is usable
        self._rows = _RowKernels()
        self.fused_chains = CudaChains()
        self.optimizer_rules = CudaOptimizerRules()
        self.fused_cells = CudaCells()
        self.row_add = _row_add

    def to_host(self, a) -> np.ndarray:
        return cupy.asnumpy(a)

    def address(self, a) -> int:
        return a.data.ptr

    def row_index(self, blocks: list, blks: list, rows: list):
        if blocks is None:
            return super().row_index(blocks, blks, rows)
        return GpuRowIndex(blocks, blks, rows)

    def gather_indexed(self, blocks: list, index):
        if type(index) is not GpuRowIndex:
            return super().gather_indexed(blocks, index)
        first = blocks[int(index.blks[0])]
        out = cupy.empty((len(index.rows),) + index.shape, first.dtype)
        src = index.addresses(lambda b: blocks[b], first.dtype)
        self._rows.fn("gather_rows", first.dtype)(*_grid(out.size), (src, out, np.int64(len(index.rows)),
                                                                     np.int64(index.width)))
        return out

    def scatter_indexed(self, grad_block, index, vals) -> None:
        if type(index) is not GpuRowIndex:
            return super().scatter_indexed(grad_block, index, vals)
        vals = cupy.ascontiguousarray(vals)
        dst = index.addresses(grad_block, vals.dtype)
        self._rows.fn("scatter_add_rows", vals.dtype)(*_grid(vals.size), (dst, vals, np.int64(len(index.rows)),
                                                                          np.int64(index.width)))

    def add_rows(self, g, rows: list, vals) -> None:
        _row_add(g, rows, vals)

    def embedding_backward(self, p, idx, vals) -> None:
        p.add_sparse_grad(idx, vals)
