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

Importing this package raises ImportError when the extension was not built;
backends/__init__.py then warns once and uses the numpy backend.

Modules, along the seams of the C code: ffi (the cffi door: pointers, checks),
rows (row movers), rowmm (per-sample products read in place), elementwise (elementwise, reductions, softmax family), cells
(LSTM/GRU/TreeLSTM cells), optim (trainer rules), overrides (the op-level adapters
and their measured thresholds). This file assembles `CpuBackend` and re-exports
every name the modules define, so `cpu.treelstm_forward`, `cpu.KidRows`, ... work
as before the split.
"""
from __future__ import annotations

import numpy as np

from ..._kernels import lib as _lib  # noqa: F401  (first: without the extension this import fails)
from ..numpy_backend import NumpyBackend
from . import cells, optim
from .chains import CChains
from .runs import CRuns
from .ffi import (F32, F64, _BUF, _PTRS, _SUFFIX, _FN, UNARY, BINARY, _fn, _real, _in, _out, _p, _pi, _index, _width,
    _rows_operand)  # noqa: F401
from .rows import (RowIndex, _ints, row_index, row_index_of_blocks, _used, gather_rows, gather_indexed,
    scatter_add_rows, scatter_indexed, take_rows, add_rows, embedding_lookup, embedding_backward)  # noqa: F401
from .elementwise import (_opcode, unary_forward, unary_backward, _lead_pair, binary_forward, binary_backward,
    sum_args, row_sums, col_sums, _matrix, _rowwise, _rowwise_grad, softmax_forward, softmax_backward,
    log_softmax_forward, log_softmax_backward, pickneglogsoftmax_forward, pickneglogsoftmax_backward)  # noqa: F401
from .cells import (_gates, _state, _opt, lstm_forward, lstm_backward, gru_gates_forward, gru_output_forward,
    gru_output_backward, gru_gates_backward, _kids, _rows_out, _disjoint, KidRows, _kid_table, _kids_arg,
    treelstm_forward, _not_a_kid_row, _rows_p, treelstm_backward, TreeCellPlan)  # noqa: F401
from .rowmm import RowsOperand, OuterRows, rows_operand  # noqa: F401
from .heap import keep_freed_memory
from . import direct
from .direct import DirectKernels
from .lstm_step import lstm_step_backward, lstm_step_forward
from .backward import NATIVE_BACKWARD
from .pool import block_pool
from .optim import (_rule_args, _rows_ptr, sgd_update, momentum_update, adagrad_update, adam_update)  # noqa: F401
from .overrides import (_is_real, _exp_worth, UNARY_FWD_MIN, UNARY_FWD_F32_ONLY, UNARY_BWD_MIN, CMULT_SHARED_BWD_MIN,
    ROW_SUMS_MIN, _unary_forward, _unary_backward, _binary_fits, _binary_forward, _binary_backward,
    _esum_forward, _row_sums_forward, _softmax_forward, _softmax_backward, _colwise_add_backward, _log_softmax_forward,
    _log_softmax_backward, _pnls_forward, _pnls_backward, _lookup_forward, all_forward_kernels, all_backward_kernels,
    installed_kernels)  # noqa: F401

# A single-block add_rows with distinct rows is one numpy fancy-index add (~3 us);
# the C call wins from this many rows on, or whenever a row repeats (np.add.at).
ADD_ROWS_MIN = 64


class CpuBackend(NumpyBackend):
    """numpy for everything, C kernels for row movement and the measured winners."""
    name = "cpu"

    def __init__(self, install: bool = True):
        super().__init__(np)
        keep_freed_memory()  # freed blocks stay in the heap for the next graph (heap.py)
        # the optional capabilities of backends/contract.py
        self.elementwise_runs = CRuns()
        self.fused_chains = CChains()
        self.fused_cells = cells
        self.row_add = add_rows
        self.optimizer_rules = optim
        self.rows_operand = rows_operand
        if install:
            fwd, bwd = installed_kernels()
            self.forward_kernels.update(fwd)
            self.backward_kernels.update(bwd)
            self.backward_kernels.update(direct.PRODUCT_BACKWARD)  # small products' input gradients
            self.forward_kernels["lstm_step"] = lstm_step_forward  # the recurrent product and the fused cell
            self.backward_kernels["lstm_step"] = lstm_step_backward
        # small elementwise batches called from the compiled batch step (direct.py), where it is built
        self.direct_kernels = DirectKernels(self.forward_kernels) if install and direct.register() else None
        self.native_backward = NATIVE_BACKWARD
        self.block_pool = block_pool()

    # ------------------------------------------------------------ row movement
    # take_rows (one source block) stays numpy: a single fancy index beats the call.
    def row_index(self, blocks: list, blks: list, rows: list):
        if blocks is None or type(blocks[blks[0]]) is not np.ndarray:
            return super().row_index(blocks, blks, rows)
        return row_index_of_blocks(blocks, blks, rows)

    def gather_indexed(self, blocks: list, index):
        if type(index) is not RowIndex:
            return super().gather_indexed(blocks, index)
        return gather_indexed(blocks, index)

    def scatter_indexed(self, grad_block, index, vals) -> None:
        if type(index) is not RowIndex:  # row_index left non-numpy blocks to the numpy code
            return super().scatter_indexed(grad_block, index, vals)
        if type(vals) is OuterRows:  # a per-sample matrices' gradient (rowmm.py), added in place
            get = grad_block if callable(grad_block) else grad_block.__getitem__
            return vals.add_into([get(b) for b in index.ids], index)
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
