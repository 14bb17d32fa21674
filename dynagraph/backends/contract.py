"""The backend contract: what the executor, autodiff, runs, fusion, dy.cavs and the
trainers may ask of a backend.

Every backend provides the required part (an `xp` array module, per-op override
tables and the row movers of NumpyBackend). The accelerated paths are optional
capabilities: an attribute that is None where a backend lacks it. Callers ask for
the capability (`be.elementwise_runs is not None`), never for the backend's name,
so a new backend plugs in by filling in capabilities inside `backends/` alone.

    capability          what it runs                                    used by
    elementwise_runs    consecutive elementwise batches, rows in place  runs.py
    fused_chains        a straight-line elementwise program (a cell)    fusion.py
    fused_cells         the N-ary TreeLSTM cell over state tables       cavs/
    row_add             g[rows] += vals in one call, repeats included   cavs/
    optimizer_rules     SGD / momentum / Adagrad / Adam, dense or rows  nn/trainers.py
    direct_kernels      small elementwise batches by kernel pointer     executor.py (batch_run.c)
    native_backward     the compiled backward step's scatters and ops    autodiff.py
    block_pool          .empty / .zeros(shape, dtype) for the compiled    executor.py, autodiff.py
                        steps' blocks, reusing arrays nothing else holds

A lookup table's sparse gradient is the required `embedding_backward`. Parameters, their
gradients and optimizer state are arrays of the backend's `xp`; `to_host` and `to_device`
are the only doors to and from numpy (tests/checked_backend.py proves that training passes
through no other). A backend with
fused_cells also has row_add (the cell task scatter-adds its inputs' gradients).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class ElementwiseRuns(Protocol):
    """Runs (runs.py): steps of (opcode, nargs) from optable, each row read through a
    pointer; `outs`, `src`, ... are int64 address tables as bytes."""
    dtypes: frozenset

    def forward(self, dt: np.dtype, code: np.ndarray, consts: np.ndarray, rows: np.ndarray, widths: np.ndarray,
                outs: bytes, src: bytes) -> None: ...

    def backward(self, dt: np.dtype, code: np.ndarray, consts: np.ndarray, rows: np.ndarray, widths: np.ndarray,
                 outs: bytes, gout: bytes, src: bytes, gsrc: np.ndarray, need: bytes, zero_at: np.ndarray,
                 work: np.ndarray) -> None: ...


@runtime_checkable
class ChainKernel(Protocol):
    """One compiled FusedChain program (fusion.py) on a backend."""

    def forward(self, ins: list, B: int, shape: tuple, n: int, dt: np.dtype) -> tuple: ...

    def backward(self, ins: list, handles: Any, block: Any, outs: list, gouts: list, live: np.ndarray,
                 need: tuple, B: int, n: int, dt: np.dtype) -> list: ...


@runtime_checkable
class FusedChains(Protocol):
    dtypes: frozenset
    array_type: type

    def compile(self, code: np.ndarray, consts: np.ndarray, n_inputs: int, n_steps: int) -> ChainKernel: ...


@runtime_checkable
class FusedCells(Protocol):
    """The N-ary TreeLSTM cell (dy.cavs): gates from a pre-activation and the children's
    cell states read in place through row tables (see backends/cpu/cells.py)."""
    KidRows: type
    TreeCellPlan: type

    def treelstm_forward(self, pre, c_kids, bias=None, out=None, disjoint: bool = False, **kw) -> tuple: ...

    def treelstm_backward(self, act, c_kids, dh, dc=None, dpre=None, disjoint: bool = False, **kw) -> tuple: ...


@runtime_checkable
class OptimizerRules(Protocol):
    """Trainer rules in place on w (and its states); rows: only those rows (sparse)."""

    def sgd_update(self, w, g, lr_scaled: float, rows=None) -> None: ...

    def momentum_update(self, w, g, v, mom: float, lr_scaled: float, rows=None) -> None: ...

    def adagrad_update(self, w, g, h, lr: float, eps: float, gscale: float, rows=None) -> None: ...

    def adam_update(self, w, g, m, v, beta1: float, beta2: float, eps: float, lr_t: float, gscale: float,
                    rows=None) -> None: ...


@runtime_checkable
class NativeBackward(Protocol):
    """What the compiled backward step (kernels/cpython/backward_batch.c) may do itself:
    scatter a gathered argument's gradient through the backend's checked row index, and run an
    op's backward there (code(op, backward_kernels) > 0) with its C kernels' addresses."""
    row_index_type: type
    kernels: bytes
    lstm_f64_max: int

    def code(self, op, backward_kernels: dict) -> int: ...


@runtime_checkable
class Backend(Protocol):
    """The required part, then the optional capabilities (None where absent)."""
    name: str                       # for messages and stats only: never branch on it
    xp: Any
    forward_kernels: dict
    backward_kernels: dict

    def take_rows(self, block, rows: list): ...
    def gather_rows(self, blocks: list, blks: list, rows: list): ...
    def row_index(self, blocks: list, blks: list, rows: list): ...
    def gather_indexed(self, blocks: list, index): ...
    def scatter_indexed(self, grad_block, index, vals) -> None: ...
    def scatter_rows(self, grad_block, blks: list, rows: list, vals) -> None: ...
    def add_rows(self, g, rows: list, vals) -> None: ...
    def embedding_backward(self, p, idx, vals) -> None: ...
    def to_host(self, a) -> np.ndarray: ...
    def to_device(self, a): ...
    def address(self, a) -> int: ...

    elementwise_runs: Optional[ElementwiseRuns]
    fused_chains: Optional[FusedChains]
    fused_cells: Optional[FusedCells]
    row_add: Optional[Callable[[Any, Sequence[int], Any], None]]
    optimizer_rules: Optional[OptimizerRules]
    # (blocks, row index) -> an argument left in place that an op reading OpDef.rows_args may
    # take instead of the gathered copy (cpu/rowmm.py), or None where it cannot
    rows_operand: Optional[Callable[[list, Any], Any]]
    # op name -> (descriptor, twin): small elementwise batches the compiled batch step calls
    # through a kernel pointer, and the same kernel in Python (cpu/direct.py), or None
    direct_kernels: Optional[Any]
    native_backward: Optional[NativeBackward]
    # .empty(shape, dtype) and .zeros(shape, dtype), as xp's: the compiled steps' outputs and
    # gradient blocks (cpu: _bookkeeping.BlockPool), or None (they call xp.empty and xp.zeros)
    block_pool: Optional[Any]


CAPABILITIES = ("elementwise_runs", "fused_chains", "fused_cells", "row_add", "optimizer_rules", "rows_operand",
                "direct_kernels", "native_backward", "block_pool")
