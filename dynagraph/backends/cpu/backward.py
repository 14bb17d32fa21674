"""What the compiled backward step (kernels/cpython/backward_batch.c) may do itself on this
backend: the `native_backward` capability of backends/contract.py.

The step's reference is autodiff's Python (_batch_step, scatter); a backend without this
capability (numpy, cuda) keeps it. Here the step reads the backend's own checked row index
(rows.RowIndex: its rows were range-checked against the shapes it records, and each target
gradient block is checked to have that shape before a row is written), so a gathered
argument's gradient is scattered without leaving C.
"""
from __future__ import annotations

from dataclasses import dataclass

from .rows import RowIndex


@dataclass(frozen=True)
class NativeBackward:
    row_index_type: type  # the MANY plans' row index whose scatters run in C


NATIVE_BACKWARD = NativeBackward(row_index_type=RowIndex)
