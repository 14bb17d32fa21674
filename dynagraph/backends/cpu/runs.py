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

    def forward(self, dt, code, consts, rows, widths, outs: bytes, src: bytes) -> None:
        ptr = _PTR[dt]
        self._fwd[dt](ffi.from_buffer("int64_t[]", code), ffi.from_buffer("double[]", consts), len(rows),
                      ffi.from_buffer("int64_t[]", rows), ffi.from_buffer("int64_t[]", widths),
                      ffi.cast(ptr, ffi.from_buffer(outs)), ffi.cast(ptr, ffi.from_buffer(src)))

    def backward(self, dt, code, consts, rows, widths, outs: bytes, gout: bytes, src: bytes, gsrc, need: bytes,
                 zero_at, work) -> None:
        ptr = _PTR[dt]
        self._bwd[dt](ffi.from_buffer("int64_t[]", code), ffi.from_buffer("double[]", consts), len(rows),
                      ffi.from_buffer("int64_t[]", rows), ffi.from_buffer("int64_t[]", widths),
                      ffi.cast(ptr, ffi.from_buffer(outs)), ffi.cast(ptr, ffi.from_buffer(gout)),
                      ffi.cast(ptr, ffi.from_buffer(src)), ffi.cast(ptr, ffi.from_buffer(gsrc)),
                      ffi.from_buffer("unsigned char[]", need), ffi.from_buffer("int64_t[]", zero_at),
                      ffi.cast(ptr[:-1], ffi.from_buffer(work)))
