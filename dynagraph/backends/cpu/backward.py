"""What the compiled backward step (kernels/cpython/backward_batch.c) may do itself on this
backend: the `native_backward` capability of backends/contract.py.

The step's reference is autodiff's Python (_batch_step, scatter) and each op's own backward
(or this backend's override of it); a backend without this capability (numpy, cuda) keeps
them. Here the step may
  * read the backend's own checked row index (rows.RowIndex: its rows were range-checked
    against the shapes it records, and each target gradient block is checked to have that
    shape before a row is written), so a gathered argument's gradient is scattered in C;
  * run the commonest ops' backward without a Python frame (kernels/cpython/backward_ops.c):
    a product's input gradient by the small-rows kernel or numpy's @ (direct.PRODUCT_BACKWARD), the LSTM gates and pickneglogsoftmax through the
    C kernels' addresses, esum's and add's (the output gradient, shared), a lookup's rows
    added into its table's gradient by the embedding kernel (embedding_backward's), tanh's and
    logistic's by a loop of the numpy code's float operations (below the adapter's threshold),
    lstm_step's by the fused cell kernel and the products' (lstm_step.py's twin); reshape's and
    transpose's where the values keep their order, softmax's and colwise_add's through their
    adapters' kernels, and products of per-node matrices by dg_small_matmul_grads as matmul's
    twin makes them (backward_shaped.c).
    An op is offered only where the step's code is the path this backend runs for it: the
    op's own backward where no override replaces it, the C adapters (overrides.py) where they
    are installed, with the same size thresholds.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ...ops.base import OPS
from .ffi import ffi, lib
from .direct import PRODUCT_BACKWARD
from .overrides import LSTM_F64_MAX, _colwise_add_backward, _lstm_c_backward, _lstm_h_backward, _pnls_backward, \
    _softmax_backward
from .lstm_step import lstm_step_backward
from .rows import RowIndex

# backward_ops.c's op codes (its NB_* enum) and the overrides they stand for (None: the op's own)
_UNARY = "unary adapter"  # the op's own backward, or overrides._unary_backward with NB_UNARY_MAX
_CODES = {"matmul": (1, PRODUCT_BACKWARD["matmul"]), "affine": (2, PRODUCT_BACKWARD["affine"]),
          "lstm_c": (3, _lstm_c_backward), "lstm_h": (4, _lstm_h_backward),
          "esum": (5, None), "add": (6, None), "lookup": (7, None), "pickneglogsoftmax": (8, _pnls_backward),
          "tanh": (9, _UNARY), "logistic": (10, _UNARY), "concatenate": (11, None),
          "lstm_step": (12, lstm_step_backward), "reshape": (13, None), "transpose": (14, None),
          "softmax": (15, _softmax_backward), "colwise_add": (16, _colwise_add_backward)}
# backward_batch.h's NB_UNARY_MAX: smaller tanh/logistic batches take backward_ops.c's loop, which is
# the op's numpy code; the adapter runs that code below its threshold, so it must be this one
NB_UNARY_MAX = 16384
# ... and the numpy code is the op's own backward as ops/elementwise.py defines it (not a replacement)
_OWN_BACKWARD = {name: OPS[name].backward for name in ("tanh", "logistic")}
# backward_ops.c's kernel table, in its slot order
_KERNELS = ("dg_lstmc_bwd_f32", "dg_lstmc_bwd_f64", "dg_lstmh_bwd_f32", "dg_lstmh_bwd_f64",
            "dg_embedding_bwd_f32", "dg_embedding_bwd_f64", "dg_pnls_bwd_f32", "dg_pnls_bwd_f64",
            "dg_rows_matvec_tgrad_f32", "dg_rows_matvec_tgrad_f64", "dg_lstm_bwd_f32", "dg_lstm_bwd_f64",
            "dg_softmax_bwd_f32", "dg_softmax_bwd_f64", "dg_row_sums_f32", "dg_row_sums_f64",
            "dg_small_matmul_grads_f32", "dg_small_matmul_grads_f64")


def _addresses() -> bytes:
    return struct.pack(f"<{len(_KERNELS)}Q", *(int(ffi.cast("uintptr_t", getattr(lib, n))) for n in _KERNELS))


@dataclass(frozen=True)
class NativeBackward:
    row_index_type: type                      # the MANY plans' row index whose scatters run in C
    ops: dict = field(default_factory=dict)   # op name -> (backward_ops.c's code, the kernel it stands for)
    kernels: bytes = b""                      # backward_ops.c's kernel addresses
    lstm_f64_max: int = LSTM_F64_MAX          # the override's float64 threshold, kept by the C path

    def code(self, op, backward_kernels: dict) -> int:
        """backward_ops.c's code for `op` on a backend whose backward overrides are
        `backward_kernels` (0: none): only where the override in place is the one it stands
        for (None: the op's own backward, no override)."""
        code, stands_for = self.ops.get(op.name, (0, None))
        kernel = backward_kernels.get(op.name)
        if stands_for is _UNARY:
            own = op.backward is _OWN_BACKWARD.get(op.name)
            return code if own and (kernel is None or getattr(kernel, "unary_min", None) == (op.name, NB_UNARY_MAX)) else 0
        return code if kernel is stands_for else 0


NATIVE_BACKWARD = NativeBackward(RowIndex, dict(_CODES), _addresses())
