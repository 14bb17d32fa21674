"""Cavs: vertex-centric dynamic networks (Xu et al., ATC'18) on top of static subgraphs.

A vertex function F is declared ONCE with symbolic dy.* ops and four primitives:

    @dy.cavs.vertex_function(arity=2)         # children per vertex (at most)
    def cell(v):
        hl, cl = v.gather(0)                   # the state child 0 scattered (zeros if missing)
        hr, cr = v.gather(1)
        ...                                    # plain dy.* ops; parameters by closure
        v.scatter(h, c)                        # this vertex's state, read by its parents
        v.push(h)                              # this vertex's external output

    @dy.cavs.vertex_function(arity=0)
    def leaf(v):
        x = v.pull()                           # this vertex's external input
        ...

    out = dy.cavs.run({"leaf": leaf, "node": cell}, graphs, pull=(E, word_ids))
    loss = dy.esum([dy.pickneglogsoftmax(W * out.root(i) + b, y) for i, y in enumerate(labels)])

Input graphs are plain data, read as I/O and never recorded: per sample a list of
children lists (vertex indices) and, with several vertex functions, a type per
vertex (`dy.cavs.Graph(children, types)` or a dict with those keys).

How a run executes. `run()` validates the graphs (ranges, arity, cycles) and traces
every vertex function (once per state and pull shape, cached) before any kernel.
The trace is split into three static subgraphs (`subgraph.Plan`s):
  * hoisted: ops that depend on pull() but on no gather() (input projections W x):
    run once over all vertices of the function, before the recursion (eager hoisting);
  * recursive: what scatter() needs: run once per task, a task being every activated
    vertex of one function across all input graphs (a vertex is activated when all
    its children are done, i.e. tasks go by height);
  * lazy: what only push() needs: run once over all vertices after the recursion
    (lazy batching).
Memory is preallocated per kind (the state: one buffer per scattered symbol; pushed
rows), and each task writes rows [offset, offset + M): gather (one take per symbol),
scatter, pull and push are each one multi-row copy; a push of a recursive value as
is goes straight into the push table. Backward walks the task stack in reverse; gather and
scatter are each other's gradients, and so are pull and push.

The whole run is ONE node of the imperative graph: its arguments are the pulled
expressions (or one embedding table) and the shared parameters; per-vertex pushed
values are cheap view nodes (`CavsOutput.push`), batched across vertices, so
imperative code builds losses on them and gradients flow both ways.

Fusion: where the backend has the fused_cells capability (backends/contract.py; the
cpu backend's backends/cpu/cells.py), the N-ary TreeLSTM/LSTM gate pattern (sigmoid
gates from slices of one pre-activation, c = i*u + sum f_k*c_k, h = o*tanh(c)) becomes
one compiled kernel (treelstm_forward/backward). Other elementwise chains run op by op.

Task kernel: where a recursive part is exactly pre = b + sum_k W_k x_k over gathered
states, then that fused cell (a TreeLSTM node), each task runs as: one take of the
x's, one GEMM against the W's side by side, the cell, which reads the children's cells
in place from the state (cells.KidRows); backward: the cell, which adds the children's
cell gradients into their rows, one GEMM for the x gradients, one scatter-add of them,
and the weight gradients of all tasks as one GEMM at the end (`_CellRec`). The cell
calls of a pass go through one cells.TreeCellPlan, which checks the pass's buffers once.
A leaf function's hoisted part (the same cell on W pull()) runs the same way. The state
is one buffer per symbol, so each take is contiguous.

Modules: api (vertex functions, their symbols), schedule (input graphs -> rows, tasks),
compile (tracing, the hoisted/recursive/lazy parts, the TreeLSTM cell match),
fused_cell (the matched cell as a task kernel over the backend's fused_cells
capability), pullpush (pull data in, push views out), runner (`_Run`: state tables,
forward and backward over tasks: generic op steps, or a function's fused cell), record
(`run()`, `CavsOutput`). The switches below stay here: runner and record read them
from this module at call time.
"""
from __future__ import annotations

__all__ = ["vertex_function", "VertexFunction", "Vertex", "Graph", "run", "CavsOutput"]

# Switches for the measured optimisations (bench/cavs_bench.py's cavs-plain variant turns them off).
# Weight gradients of per-task products as ONE GEMM over all tasks: True, False, or "auto":
# only where it was measured faster, i.e. when accumulating a big weight gradient once per
# task moves more memory than copying the task inputs and output gradients together once
# (TreeLSTM, 64 trees: slower at H=64, even at H=256, ~20% faster backward GEMMs at H=512).
# The TreeLSTM task kernel copies nothing together, and defers whenever this is "auto".
DEFER_WEIGHT_GRADS = "auto"
DEDUP_HOISTED = True        # hoisted work once per distinct embedding row, not per vertex
CELL_TASKS = True           # TreeLSTM recursive parts as one task kernel (_CellRec), with fusion

# the modules read the switches above through this module: imported after them
from .api import (VertexFunction, vertex_function, _state_shapes, _NeedState, Vertex, _esum)
from .schedule import (Graph, _unpack, _flat_children, _levels_any_order, _Schedule)
from .compile import (_Part, _walk, _extract, _trace, _Compiled, _cell_shape, _cell_forward, _cell_backward,
    TREE_CELL, fusion_available, _Match, _gate, _sum_terms, _match_cell, _cell_terms, _fuse, _CellRec, _COPY_WT_MAX,
    _PICK_RANGE, _CMULT, _ADD, _ESUM, _TANH, _LOGISTIC, _AFFINE, _MATMUL)
from .pullpush import (_Pull, _PushTable, _push_shape, _push_check, _push_forward, _push_backward, CAVS_PUSH)
from .fused_cell import (_HoistSaved, _apart, HoistedCell, TreeLSTMCell, TreeLSTMPass)
from .runner import (_Ctx, _Run, _run_forward, _run_backward)
from .record import (CavsOutput, _functions, _compile_all, _check_gathered, _kernel_estimate, run)
