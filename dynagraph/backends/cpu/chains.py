"""The fused-chains capability (backends/contract.py FusedChains) over
dg_fused_fwd/dg_fused_bwd (kernels/fused.inc). fusion.FusedChain owns the program,
its checks and its reference path; this module turns operands into pointers and
calls C (moved here from fusion.py so that no module outside backends/ sees cffi)."""
from __future__ import annotations

import numpy as np

from ..._kernels import ffi, lib
from .. import optable
from .ffi import _BUF, _PTRS, F32, F64

TILE = optable.FUSED_TILE


class ChainKernel:
    """One FusedChain program, its code and constants converted to C once (the per-call
    cost is what fusion is for)."""

    def __init__(self, code: np.ndarray, consts: np.ndarray, n_inputs: int, n_steps: int):
        self._code, self._consts = code, consts  # the pointers below borrow them
        self._code_p = ffi.from_buffer("int64_t[]", code)
        self._consts_p = ffi.from_buffer("double[]", consts)
        self.n_inputs, self.n_steps = n_inputs, n_steps
        self._masks: dict = {}

    def forward(self, ins: list, B: int, shape: tuple, n: int, dt) -> tuple:
        """(block (nsteps, B, *shape), handles to reuse in backward, whether an input was copied)."""
        iptr, istr, copied = _operands(ins, B, n, dt)
        ip, isp = ffi.new(_PTRS[dt], iptr), ffi.new("int64_t[]", istr)
        block = np.empty((self.n_steps, B) + shape, dt)
        _FWD[dt](self._code_p, self._consts_p, self.n_steps, ip, isp, self.n_inputs,
                 ffi.from_buffer(_BUF[dt], block), B, n)
        return block, (ip, isp), copied

    def backward(self, ins: list, handles, block, outs: list, gouts: list, live: np.ndarray, need: tuple,
                 B: int, n: int, dt) -> list:
        """handles: the forward's (when its inputs are the same, alive); block: the
        forward's own output block when `outs` are its planes, else None."""
        ns, nin = self.n_steps, self.n_inputs
        buf = _BUF[dt]
        if handles is not None:
            ip, isp = handles  # the forward's own inputs, alive: its pointers hold
        else:
            iptr, istr, _ = _operands(ins, B, n, dt)
            ip, isp = ffi.new(_PTRS[dt], iptr), ffi.new("int64_t[]", istr)
        if block is not None:  # the forward's own outputs: consecutive (B, n) planes
            p0, plane = ffi.from_buffer(buf, block), B * n
            optr, ostr = [p0 + m * plane for m in range(ns)], [n] * ns
        else:
            optr, ostr, _ = _operands(outs, B, n, dt)
        gptr, gstr, _ = _operands(gouts, B, n, dt)
        live_p = self._mask(live)
        grads, gin = _grad_buffers(ins, need, dt)
        # one pointer array and one stride array for outputs, output gradients, input gradients
        P = ffi.new(_PTRS[dt], optr + gptr + gin)
        S = ffi.new("int64_t[]", ostr + gstr)
        work = np.empty((nin + ns + 1) * TILE + ns * n, dt)
        _BWD[dt](self._code_p, self._consts_p, ns, ip, isp, nin, P, S, P + ns, S + ns, P + 2 * ns, live_p,
                 ffi.from_buffer(buf, work), B, n)
        return grads

    def _mask(self, live: np.ndarray):
        hit = self._masks.get(id(live))
        if hit is None or hit[0] is not live:  # FusedChain caches its live arrays: converted once each
            hit = self._masks[id(live)] = (live, ffi.from_buffer("unsigned char[]", live))
        return hit[1]


class CChains:
    dtypes = frozenset(_BUF)
    array_type = np.ndarray

    def __init__(self):
        if (lib.DG_FUSED_TILE, lib.DG_FUSED_MAX_REGS) != (optable.FUSED_TILE, optable.FUSED_MAX_REGS) or \
                any(getattr(lib, "DG_FZ_" + name.upper()) != code for name, code in optable.OPCODE.items()):
            raise ImportError("dynagraph._kernels was built from another op table; rebuild: pip install -e .")

    def compile(self, code: np.ndarray, consts: np.ndarray, n_inputs: int, n_steps: int) -> ChainKernel:
        return ChainKernel(code, consts, n_inputs, n_steps)


_FWD = {F32: lib.dg_fused_fwd_f32, F64: lib.dg_fused_fwd_f64}
_BWD = {F32: lib.dg_fused_bwd_f32, F64: lib.dg_fused_bwd_f64}


def _grad_buffers(ins: list, need: tuple, dt) -> tuple:
    """The input gradients, shaped like their inputs, as views of one allocation (one
    pointer conversion instead of one per input), and their pointers (NULL: not needed)."""
    sizes = [x.size if w else 0 for x, w in zip(ins, need)]
    flat = np.empty(sum(sizes), dt)
    p0 = ffi.from_buffer(_BUF[dt], flat)
    grads, ptrs, at = [], [], 0
    for x, size, w in zip(ins, sizes, need):
        if w:
            grads.append(flat[at:at + size].reshape(x.shape))
            ptrs.append(p0 + at)
            at += size
        else:
            grads.append(None)
            ptrs.append(ffi.NULL)
    return grads, ptrs


def _operands(arrs: list, B: int, n: int, dt) -> tuple:
    """(row-0 pointers, row strides in elements, whether any was copied) for the C
    kernel; None -> NULL.

    A per-row operand is read in place when C-contiguous or a 2-D view with contiguous
    rows at least n apart (stride >= n); a shared one (leading axis 1) gets stride 0.
    Anything else is copied. The kernel reads element j < n of row b < B at
    row0 + b * stride + j, which these checks keep inside the array."""
    it = dt.itemsize
    buf = _BUF[dt]
    ptrs, strides, copied = [], [], False
    for x in arrs:
        if x is None:
            ptrs.append(ffi.NULL)
            strides.append(0)
            continue
        per_row = x.shape[0] > 1
        flags = x.flags
        if flags.c_contiguous and flags.aligned:
            ptrs.append(ffi.from_buffer(buf, x))  # the cdata keeps x alive until the call
            strides.append(n if per_row else 0)
            continue
        st = x.strides
        if not (flags.aligned and x.ndim == 2 and st[1] == it and
                (not per_row or (st[0] >= n * it and st[0] % it == 0))):
            x = np.ascontiguousarray(x)
            st = (n * it,)
            copied = True
        ptrs.append(ffi.from_buffer(buf, x[:1]))  # row 0: rows further on are read by stride
        strides.append(st[0] // it if per_row else 0)
    return ptrs, strides, copied
