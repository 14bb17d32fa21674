"""A static block's steps compiled into a program of batched units.

A traced block (`subgraph.Plan`) is a list of op steps, each run over the B
calls of a coarse batch. Inside one block many steps share a signature and do
not depend on each other: the three gate logistics of an LSTM, the child
products of a TreeLSTM. Running them as one *group* turns K kernels into one,
over K*B rows. A group's operand list must then be one (K*B, ...) array: either
it already is (a view of another group's output, in the same order) or it is
copied together first (a memory kernel). Which it is depends on the memory
layout, so this is where the PQ-tree planner (`memory.layout`) pays:

* mode None      one kernel per step (no batching inside the block);
* mode "naive"   groups in trace order, every operand list copied together
                 (what a gather-based executor such as DyNet's does);
* mode "planned" groups in the planned kernel order; operand lists that the
                 layout made consecutive are read in place; a GEMM whose output
                 is only ever sliced (LSTM gates g[0:H], g[H:2H], ...) writes its
                 slices piece-major, (pieces, B, h), so that consecutive slices
                 are consecutive memory.

Groups may stack different weight matrices: K products W_k x_k become one
batched GEMM against the stacked (K, n, X) weights.

Backward replays the units in reverse. A group's output gradient lives in one
(K*B, ...) buffer whose per-member views receive the consumers' gradients, so
a consumer that read the group in place adds its gradient back in one call.

The package, in the order data flows through it:

* `units.py`     what a program is made of: the unit kinds, `Unit`, `Counts`;
* `grouping.py`  which steps form a group, a piece-major product or a fused
                 chain, and the units' dependency order;
* `products.py`  K products with different weights as one batched GEMM;
* `steps.py`     one traced step forward and backward (no batching);
* `grads.py`     the gradient stores, per variable and per unit buffer;
* `forward.py`   running the units;
* `backward.py`  replaying them in reverse;
* `build.py`     `Program`: the units of one plan for one mode, and how each
                 group reads its operands (shared, in place, stacked weights, gathered).
"""
from .build import Program
from .grads import Grads, UnitGrads
from .steps import step_backward, step_forward
from .units import FUSED, GROUP, MODES, PIECES, STEP, Counts, Unit

__all__ = ["FUSED", "GROUP", "MODES", "PIECES", "STEP", "Counts", "Grads", "Program", "Unit", "UnitGrads",
           "step_backward", "step_forward"]
