"""The elementwise-runs capability (backends/contract.py ElementwiseRuns) over
dg_run_fwd/dg_run_bwd (kernels/fused.inc). runs.py builds the programs and the
checked row-address tables; this is the only place that hands them to C."""
from __future__ import annotations


from ..._kernels import ffi, lib
from .. import optable
from .ffi import F32, F64

_PTR = {F32: "float **", F64: "double **"}


class CRuns:
    dtypes = frozenset(_PTR)

    def __init__(self):
        if (lib.DG_RUN_COPY, lib.DG_RUN_MAX_ARGS) != (optable.RUN_COPY, optable.RUN_MAX_ARGS):
            raise ImportError("dynagraph._kernels was built from another op table; rebuild: pip install -e .")
        self._fwd = {F32: lib.dg_run_fwd_f32, F64: lib.dg_run_fwd_f64}
        self._bwd = {F32: lib.dg_run_bwd_f32, F64: lib.dg_run_bwd_f64}
        self._views: dict = {}  # id(program array) -> (array, its cffi view)

    def _view(self, kind: str, a):
        """The cffi view of a program array (code, consts, widths: read-only and shared by
        every run of one program, forward and backward), made once: from_buffer costs as
        much as a small run's bookkeeping. The entry holds the array, so its id cannot be
        reused by another array while the entry exists."""
        hit = self._views.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        if len(self._views) >= 8192:
            self._views.clear()
        view = ffi.from_buffer(kind, a)
        self._views[id(a)] = (a, view)
        return view

    def forward(self, dt, code, consts, rows, widths, outs: bytes, src: bytes) -> None:
        ptr = _PTR[dt]
        self._fwd[dt](self._view("int64_t[]", code), self._view("double[]", consts), len(rows),
                      ffi.from_buffer("int64_t[]", rows), self._view("int64_t[]", widths),
                      ffi.cast(ptr, ffi.from_buffer(outs)), ffi.cast(ptr, ffi.from_buffer(src)))

    def backward(self, dt, code, consts, rows, widths, outs: bytes, gout: bytes, src: bytes, gsrc, need: bytes,
                 zero_at, work) -> None:
        ptr = _PTR[dt]
        self._bwd[dt](self._view("int64_t[]", code), self._view("double[]", consts), len(rows),
                      ffi.from_buffer("int64_t[]", rows), self._view("int64_t[]", widths),
                      ffi.cast(ptr, ffi.from_buffer(outs)), ffi.cast(ptr, ffi.from_buffer(gout)),
                      ffi.cast(ptr, ffi.from_buffer(src)), ffi.cast(ptr, ffi.from_buffer(gsrc)),
                      ffi.from_buffer("unsigned char[]", need), ffi.from_buffer("int64_t[]", zero_at),
                      ffi.cast(ptr[:-1], ffi.from_buffer(work)))
