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
"""
from __future__ import annotations

import itertools
import time
from typing import Callable, Sequence

import numpy as np

from .backends import get_backend
from .errors import DynagraphError, DynagraphIndexError, user_line
from .graph import ComputationGraph, Expression, current, record
from .memory.workspace import WORKSPACE
from .ops import OPS
from .ops.base import CHEAP, ELEMWISE, GEMM, OpDef, SparseRows, as_shape, size_of
from .parameters import LookupParameters
from .subgraph import PLACEHOLDER, Plan, _Grads

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

_RANDOM_STRIDE = 1 << 12
_MASK64 = (1 << 64) - 1


# =========================================================================== declaring
class VertexFunction:
    """A function of one vertex, traced once per (state shape, pull shape) and run over tasks."""

    def __init__(self, fn: Callable, arity: int, state=None, name: str | None = None):
        if isinstance(arity, bool) or not isinstance(arity, (int, np.integer)) or arity < 0:
            raise ValueError(f"vertex_function: arity must be a non-negative int, got {arity!r}")
        self.fn = fn
        self.arity = int(arity)
        self.name = name or getattr(fn, "__name__", "vertex")
        self.state = None if state is None else _state_shapes(state)
        self._compiled: dict = {}

    def __call__(self, *a, **k):
        raise TypeError(f"vertex function {self.name} is not called directly: pass it to dy.cavs.run()")

    def __repr__(self) -> str:
        return f"<vertex function {self.name} arity={self.arity}>"

    def compiled(self, state, pull_shape, fuse: bool) -> "_Compiled":
        """The split plans; a function that never gathers does not depend on the state."""
        c = self._compiled.get((None, pull_shape, fuse))
        if c is None:
            c = self._compiled.get((state, pull_shape, fuse))
        if c is None:
            c = _Compiled(self, state, pull_shape, fuse)
            self._compiled[(state if c.gathers else None, pull_shape, fuse)] = c
        return c


def vertex_function(fn: Callable | None = None, *, arity: int = 2, state=None, name: str | None = None):
    """Decorator: `@dy.cavs.vertex_function(arity=2)`.

    state: the shape of what scatter() writes (an int or tuple), or a list of shapes
    when several expressions are scattered; inferred from a function that scatters
    without gathering (a leaf function) when omitted."""
    if fn is None:
        return lambda f: VertexFunction(f, arity, state, name)
    return VertexFunction(fn, arity, state, name)


def _state_shapes(state) -> tuple:
    if isinstance(state, list):
        return tuple(as_shape(s) for s in state)
    return (as_shape(state),)


class _NeedState(Exception):
    """gather() was traced before the state's shape is known (inferred from another function)."""


class Vertex:
    """What a vertex function receives while it is traced: gather, scatter, pull, push."""

    def __init__(self, vf: VertexFunction, trace: ComputationGraph, state, pull_shape):
        self._vf, self._trace, self._state, self._pull_shape = vf, trace, state, pull_shape
        self.gathers: dict = {}     # k -> placeholder ids, one per state symbol
        self.pull_id: int | None = None
        self.scattered: list | None = None
        self.pushed: int | None = None

    @property
    def arity(self) -> int:
        return self._vf.arity

    def pull(self) -> Expression:
        if self._pull_shape is None:
            raise DynagraphError(f"vertex function {self._vf.name} calls pull(), but run() got no pull= "
                                 f"input for any of its vertices\n  at {user_line()}")
        if self.pull_id is None:
            self.pull_id = self._trace.placeholder(PLACEHOLDER, self._pull_shape)
        return Expression(self._trace, self.pull_id)

    def gather(self, k: int):
        """The state child k scattered: one expression, or a tuple when several were scattered."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"gather(k): k must be an int, got {type(k).__name__}")
        k = int(k)
        if not 0 <= k < self._vf.arity:
            raise DynagraphIndexError(f"vertex function {self._vf.name}: gather({k}) but its arity is "
                                      f"{self._vf.arity} (children 0..{self._vf.arity - 1}); declare a larger "
                                      f"arity= in vertex_function\n  at {user_line()}")
        if self._state is None:
            raise _NeedState
        ids = self.gathers.get(k)
        if ids is None:
            ids = self.gathers[k] = [self._trace.placeholder(PLACEHOLDER, s) for s in self._state]
        exprs = tuple(Expression(self._trace, i) for i in ids)
        return exprs[0] if len(exprs) == 1 else exprs

    def gather_sum(self):
        """Sum of the states of all children (missing children count as zeros)."""
        states = [self.gather(k) for k in range(self._vf.arity)]
        if not states:
            raise DynagraphError(f"vertex function {self._vf.name}: gather_sum() with arity 0")
        if type(states[0]) is Expression:
            return _esum(states)
        return tuple(_esum(list(s)) for s in zip(*states))

    def scatter(self, *xs) -> None:
        if self.scattered is not None:
            raise DynagraphError(f"vertex function {self._vf.name}: scatter() called twice; scatter several "
                                 f"expressions in one call\n  at {user_line()}")
        if not xs:
            raise DynagraphError(f"vertex function {self._vf.name}: scatter() needs an expression")
        self.scattered = [self._own(x, "scatter") for x in xs]

    def push(self, x) -> None:
        if self.pushed is not None:
            raise DynagraphError(f"vertex function {self._vf.name}: push() called twice\n  at {user_line()}")
        self.pushed = self._own(x, "push")

    def _own(self, x, what: str) -> int:
        if type(x) is not Expression or x.cg is not self._trace:
            raise DynagraphError(f"vertex function {self._vf.name}: {what}() takes an expression computed "
                                 f"inside the vertex function, got {type(x).__name__}\n  at {user_line()}")
        return x.i


def _esum(xs: list) -> Expression:
    return xs[0] if len(xs) == 1 else record(OPS["esum"], xs)


# =========================================================================== input graphs
class Graph:
    """One input graph: `children[v]` lists v's children (vertex indices of this graph);
    `types[v]` names (or numbers) v's vertex function when run() is given several."""
    __slots__ = ("children", "types")

    def __init__(self, children: Sequence[Sequence[int]], types: Sequence | None = None):
        self.children = children
        self.types = types

    def __len__(self) -> int:
        return len(self.children)

    @classmethod
    def from_tree(cls, tree, leaf="leaf", node="node") -> tuple["Graph", list]:
        """A datasets.Tree in post-order: (graph, nodes), nodes[v] being vertex v's Tree node."""
        nodes = tree.nodes_postorder()
        at = {id(n): v for v, n in enumerate(nodes)}
        children = [[at[id(c)] for c in n.children] for n in nodes]
        return cls(children, [leaf if n.is_leaf() else node for n in nodes]), nodes


def _unpack(g, s: int) -> tuple:
    if isinstance(g, Graph):
        return g.children, g.types
    if isinstance(g, dict):
        if "children" not in g:
            raise DynagraphError(f"dy.cavs.run: graph {s} is a dict without a 'children' list")
        return g["children"], g.get("types", g.get("type"))
    if isinstance(g, (list, tuple)) or (type(g) is np.ndarray and g.ndim == 2):
        return g, None
    raise TypeError(f"dy.cavs.run: graph {s} must be a dy.cavs.Graph, a dict, a list of children lists or "
                    f"an (n, k) integer array (-1: no child), got {type(g).__name__}")


def _flat_children(kid_lists: list, N: int) -> tuple:
    """(children per vertex, every child index in order). Graphs given as (n, k) integer
    arrays (-1 pads a missing child) are concatenated as they are: no Python per vertex."""
    if kid_lists and all(type(c) is np.ndarray and c.ndim == 2 for c in kid_lists) \
            and len({c.shape[1] for c in kid_lists}) == 1:
        kids = np.concatenate(kid_lists).reshape(-1)
        if kids.dtype.kind not in "iu":
            raise TypeError(f"dy.cavs.run: children arrays must hold integer vertex indices, got {kids.dtype}")
        return np.full(N, kid_lists[0].shape[1], dtype=np.int64), kids.astype(np.int64, copy=False)
    lists = [c.tolist() if type(c) is np.ndarray else c for c in kid_lists]
    counts = np.fromiter(map(len, itertools.chain.from_iterable(lists)), dtype=np.int64, count=N)
    try:
        kids = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(lists)),
                           dtype=np.int64, count=int(counts.sum()))
    except (TypeError, ValueError):
        raise TypeError("dy.cavs.run: children lists must hold int vertex indices (or -1: no child)") from None
    return counts, kids


def _levels_any_order(ch: Sequence, s: int) -> list:
    """Kahn's algorithm; a vertex left over sits on a cycle. -1 pads a missing child."""
    n = len(ch)
    parents: list = [[] for _ in range(n)]
    waiting = [sum(1 for c in k if c >= 0) for k in ch]
    for v, kids in enumerate(ch):
        for c in kids:
            if c >= 0:
                parents[c].append(v)
    lev = [0] * n
    ready = [v for v in range(n) if not waiting[v]]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for p in parents[v]:
            if lev[v] + 1 > lev[p]:
                lev[p] = lev[v] + 1
            waiting[p] -= 1
            if not waiting[p]:
                ready.append(p)
    if done < n:
        v = next(v for v in range(n) if waiting[v])
        raise DynagraphError(f"dy.cavs.run: graph {s} has a cycle through vertex {v} (children lists must "
                             f"form a DAG)\n  at {user_line()}")
    return lev


class _Schedule:
    """Where each vertex of a batch of input graphs goes: tasks, rows and child rows.

    Global vertex g = base[sample] + v. Vertices are sorted by (height, function);
    a task is one run of equal keys, so it owns contiguous rows of the state buffer
    (`rank`) and of its function's per-vertex buffers (`local`). Everything here is
    plain integer work on the input data, done before any kernel."""

    def __init__(self, graphs: Sequence, names: dict, arity: list):
        nf = len(arity)
        sizes, kid_lists, types = [], [], []
        for s, g in enumerate(graphs):
            ch, ty = _unpack(g, s)
            sizes.append(len(ch))
            kid_lists.append(ch)
            if ty is None:
                if nf > 1:
                    raise DynagraphError(f"dy.cavs.run: graph {s} has no vertex types, but there are {nf} vertex "
                                         f"functions; give Graph(children, types)")
                ty = np.zeros(len(ch), dtype=np.int64)
            elif len(ty) != len(ch):
                raise DynagraphError(f"dy.cavs.run: graph {s} has {len(ch)} children lists but {len(ty)} types")
            types.append(ty)
        self.S = len(sizes)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.N = N = int(self.base[-1])
        self.sample_of = np.repeat(np.arange(self.S), self.sizes)
        self.type = self._type_ids(types, names, nf)
        counts, kids = _flat_children(kid_lists, N)
        owner = np.repeat(np.arange(N), counts)
        pos = np.arange(len(kids)) - (np.cumsum(counts) - counts)[owner]  # child slot k of its vertex
        self._check_children(kids, owner, pos, arity, names)
        real = kids >= 0  # -1 pads a missing child: gather() reads zeros there
        gkids = kids[real] + self.base[self.sample_of[owner[real]]]
        self.tree = not len(gkids) or int(np.bincount(gkids, minlength=N).max()) <= 1
        self.has_parent = np.zeros(N, dtype=bool)
        self.has_parent[gkids] = True
        km = np.full((N, max(max(arity), 1)), -1, dtype=np.int64)
        km[owner[real], pos[real]] = gkids
        self.level = self._levels(km, kid_lists)
        self._order(nf, km)

    def _type_ids(self, per_graph: list, names: dict, nf: int) -> np.ndarray:
        if all(type(t) is np.ndarray for t in per_graph):
            arr = np.concatenate(per_graph) if per_graph else np.zeros(0, dtype=np.int64)
            types = arr
        else:
            types = [t for ty in per_graph for t in ty]
            arr = np.asarray(types) if types else np.zeros(0, dtype=np.int64)
        if arr.dtype.kind not in "iu":  # names (or a mix): map them, -1 when unknown
            arr = np.asarray([names.get(t, -1) if isinstance(t, str) else
                              (t if isinstance(t, (int, np.integer)) and not isinstance(t, bool) else -1)
                              for t in types], dtype=np.int64)
        arr = arr.astype(np.int64).reshape(self.N)
        bad = np.flatnonzero((arr < 0) | (arr >= nf))
        if bad.size:
            g = int(bad[0])
            s = int(self.sample_of[g])
            raise DynagraphError(f"dy.cavs.run: graph {s}: vertex {g - int(self.base[s])} has type {types[g]!r}; "
                                 f"the vertex functions are {list(names)} (or 0..{nf - 1})")
        return arr

    def _check_children(self, kids, owner, pos, arity, names) -> None:
        n_own = self.sizes[self.sample_of[owner]]
        bad = np.flatnonzero((kids < -1) | (kids >= n_own))
        if bad.size:
            j = int(bad[0])
            g = int(owner[j])
            s = int(self.sample_of[g])
            raise DynagraphIndexError(f"dy.cavs.run: graph {s}: vertex {g - int(self.base[s])} has child "
                                      f"{int(kids[j])}, out of range for a graph of {int(n_own[j])} vertices")
        ar = np.asarray(arity, dtype=np.int64)[self.type[owner]]
        over = np.flatnonzero((pos >= ar) & (kids >= 0))
        if over.size:
            g = int(owner[over[0]])
            s = int(self.sample_of[g])
            fname = list(names)[int(self.type[g])]
            raise DynagraphError(f"dy.cavs.run: graph {s}: vertex {g - int(self.base[s])} has a child in slot "
                                 f"{int(pos[over[0]])}, but its vertex function {fname} has arity {int(ar[over[0]])}")

    def _levels(self, km: np.ndarray, kid_lists: list) -> np.ndarray:
        """Height of every vertex (a leaf is 0) by relaxation: h = 1 + max over children, from
        all zeros, is exact after height + 1 sweeps. Deep graphs (long chains) or cycles
        fall back to one pass per graph in Python, which also names a cycle."""
        N = self.N
        inner = np.flatnonzero((km >= 0).any(axis=1))  # only vertices with children can change
        kmi = np.ascontiguousarray(np.where(km[inner] >= 0, km[inner], N).T)  # (slot, vertex): max over rows
        lev = np.zeros(N + 1, dtype=np.int64)
        lev[N] = -1
        for _ in range(48):
            new = lev[kmi].max(axis=0) + 1
            if np.array_equal(new, lev[inner]):
                return lev[:N]
            lev[inner] = new
        out: list = []
        for s, ch in enumerate(kid_lists):
            out.extend(_levels_any_order(ch, s))
        return np.asarray(out, dtype=np.int64).reshape(N)

    def _order(self, nf: int, km: np.ndarray) -> None:
        N = self.N
        key = self.level * nf + self.type
        order = np.argsort(key, kind="stable")
        self.rank = np.empty(N, dtype=np.int64)
        self.rank[order] = np.arange(N)
        ks, ts = key[order], self.type[order]
        local_sorted = np.empty(N, dtype=np.int64)
        self.count, self.members = [], []
        for f in range(nf):
            idx = np.flatnonzero(ts == f)
            local_sorted[idx] = np.arange(len(idx))
            self.count.append(len(idx))
            self.members.append(order[idx])  # global ids in this function's row order
        self.local = np.empty(N, dtype=np.int64)
        self.local[order] = local_sorted
        kso = km[order]
        child_rows = np.where(kso >= 0, self.rank[np.maximum(kso, 0)], N)  # row N of the state is zeros
        self.child_rows = child_rows  # (N, arity): row r's children, r in the state's order
        cuts = (np.flatnonzero(ks[1:] != ks[:-1]) + 1).tolist() if N else []
        bounds = [0] + cuts + [N] if N else [0]
        self.bounds = bounds  # task t owns state rows bounds[t]..bounds[t + 1]
        self.tasks = [(int(ts[s0]), s0, e0, int(local_sorted[s0]), child_rows[s0:e0])
                      for s0, e0 in zip(bounds[:-1], bounds[1:])]
        self.depth = int(self.level.max()) + 1 if N else 0
        self.widest = [0] * nf  # per function, its largest task: the size of per-task scratch
        for f, s0, e0, _, _ in self.tasks:
            self.widest[f] = max(self.widest[f], e0 - s0)

    def gid(self, sample: int, vertex: int) -> int:
        if not 0 <= sample < self.S:
            raise DynagraphIndexError(f"sample {sample} out of range: the run has {self.S} graphs")
        if not 0 <= vertex < int(self.sizes[sample]):
            raise DynagraphIndexError(f"vertex {vertex} out of range: graph {sample} has "
                                      f"{int(self.sizes[sample])} vertices")
        return int(self.base[sample]) + vertex


# =========================================================================== compiling
class _Part(Plan):
    """A Plan run by the Cavs runtime: explicit batch size, per-row random keys, outputs
    written straight into destination buffers, and the backend's kernel overrides."""

    def forward_rows(self, be, B: int, keys, xs: list, dests: list) -> list:
        vals, saved = self.run_steps(be, xs, lambda spec: self._rows_data(spec, B, keys))
        for o, dst in zip(self.outputs, dests):
            v = vals[o]
            dst[...] = v.reshape(v.shape[0], -1)  # a shared (lead 1) value broadcasts over the rows
        return saved

    def backward_rows(self, be, B: int, gouts: list, saved: list, need: tuple, deferred: list | None = None,
                      defer_leaves: frozenset = frozenset()) -> list:
        """Gradients of inputs and leaves. Weight gradients of the products in `self.defer`
        whose weight is leaf k in `defer_leaves` are not computed: (k, output gradient,
        input) goes to `deferred` instead, so that the caller does ONE GEMM over all tasks."""
        acc = _Grads(be.xp)
        for o, g, shape in zip(self.outputs, gouts, self.out_shapes):
            if g is not None:
                acc.add(o, g.reshape((B,) + shape))

        def divert(n, args, ins, gi, want):
            for pos in self.defer.get(n, ()):
                if want[pos] and self._leaf_at[args[pos]] in defer_leaves:
                    want[pos] = False
                    deferred.append((self._leaf_at[args[pos]], gi, ins[pos + 1]))
        return self.grad_steps(be, acc, saved, need, divert if deferred is not None else None)

    def find_deferrable(self, trace: ComputationGraph) -> None:
        """Products W x with W a shared matrix and x a batch of vectors: their weight gradient
        G^T X can be summed over tasks as one GEMM."""
        self._leaf_at = {i: k for k, i in enumerate(self.leaves)}
        self.defer: dict = {}
        for n, (i, op, args, a, spec, shape) in enumerate(self.steps):
            if op not in (_AFFINE, _MATMUL) or len(shape) != 1:
                continue
            first = 1 if op is _AFFINE else 0
            pos = [k for k in range(first, len(args) - 1, 2)
                   if args[k] in self._leaf_at and len(trace.shape[args[k]]) == 2
                   and len(trace.shape[args[k + 1]]) == 1]
            if pos:
                self.defer[n] = pos

    def _rows_data(self, spec, B: int, keys) -> list:
        kind, v = spec
        if kind == "random":
            return [(int(k) * _RANDOM_STRIDE + v) & _MASK64 for k in keys]
        if kind == "slot":
            raise DynagraphError("vertex functions take no int arguments (index slots)")
        return [v] * B

    @property
    def n_kernels(self) -> int:
        return len(self.steps)


def _walk(T: ComputationGraph, roots: Sequence[int], stop: set) -> tuple[set, set]:
    """(nodes reached from roots without passing a stop node, stop nodes reached)."""
    inner, hit = set(), set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i in stop:
            hit.add(i)
        elif i not in inner:
            inner.add(i)
            stack.extend(T.args[i])
    return inner, hit


def _extract(T: ComputationGraph, name: str, outputs: list, cut: list) -> _Part:
    """The part of trace T between `cut` (its new placeholders, in order) and `outputs`,
    recorded again into a fresh trace: the split reuses Plan unchanged."""
    new = ComputationGraph(scheduler="none")
    new.tracing = True
    m: dict = {}
    for i in cut:
        m[i] = new.placeholder(PLACEHOLDER, T.shape[i])
    inner, _ = _walk(T, outputs, set(cut))
    for i in sorted(inner):
        op = T.op[i]
        if op is PLACEHOLDER:
            raise AssertionError(f"cavs: placeholder {i} reached outside the cut of {name}")
        if op.leaf:
            m[i] = new.leaf(T.attrs[i][1], T.sig_part[i][2])
        else:
            m[i] = new.add(op, tuple(m[a] for a in T.args[i]), T.attrs[i], T.data[i])
    part = _Part(name, new, [m[i] for i in cut], [m[o] for o in outputs])
    part.in_shapes = [T.shape[i] for i in cut]
    part.find_deferrable(new)
    return part


def _trace(vf: VertexFunction, state, pull_shape) -> tuple[ComputationGraph, Vertex]:
    trace = ComputationGraph(scheduler="none")
    trace.tracing = True
    v = Vertex(vf, trace, state, pull_shape)
    with trace:
        out = vf.fn(v)
    if out is not None:
        raise DynagraphError(f"vertex function {vf.name} returned a value; use v.scatter() and v.push()")
    if v.scattered is None and v.pushed is None:
        raise DynagraphError(f"vertex function {vf.name} neither scatters nor pushes anything")
    return trace, v


class _Compiled:
    """A vertex function traced for one (state, pull shape), split into three plans.

    Column layouts: `hoist_cols` (hoisted outputs in XH), `rec_in` / `rec_out` and
    `lazy_in` describe where each plan input comes from and each output goes:
    ("g", slot position, a, b, symbol): gathered state columns a:b (state symbol j);
    ("h", a, b): hoisted columns (XH); ("s", a, b, symbol): state columns;
    ("l", a, b[, None]): LZ columns, the recursive values the lazy part needs."""

    def __init__(self, vf: VertexFunction, state, pull_shape, fuse: bool):
        self.name = vf.name
        trace, vx = _trace(vf, state, pull_shape)
        self.gathers = bool(vx.gathers)
        sc = list(vx.scattered or [])
        pu = vx.pushed
        roots = sc + ([pu] if pu is not None else [])
        self.fused = 0
        if fuse:
            trace, m, self.fused = _fuse(trace, roots)
            sc = [m[i] for i in sc]
            pu = m[pu] if pu is not None else None
            gathers = {k: [m[i] for i in ids] for k, ids in vx.gathers.items()}
            p = m[vx.pull_id] if vx.pull_id is not None else None
        else:
            gathers, p = vx.gathers, vx.pull_id
        self.scatter_shapes = tuple(trace.shape[i] for i in sc) if vx.scattered is not None else None
        self.push_shape = trace.shape[pu] if pu is not None else None
        self.uses_pull = p is not None
        self._split(trace, vf.name, p, gathers, sc, pu, state if state is not None else self.scatter_shapes)
        # the recursive part as the TreeLSTM task kernel (one GEMM, the fused cell) where it matches
        fast = bool(self.fused)  # used where CELL_TASKS is on when the run starts
        self.cell = _CellRec.match(self.rec, self.rec_in, self.used_k) if fast and self.rec is not None else None
        # a leaf function's hoisted part (x = pull()) as the same kernel, once over all vertices
        self.hoist_cell = (_CellRec.match(self.hoist, [("p", None, 0, size_of(pull_shape), None)], [], "p")
                           if fast and self.hoist is not None and pull_shape is not None else None)
        # push(x) of a recursive value x as is: the recursive part writes x straight into the
        # push table, which is then its LZ buffer (no lazy pass, no copy either way)
        lz = self.lazy
        self.push_direct = (lz is not None and not lz.steps and len(self.lazy_in) == 1 and
                            self.lazy_in[0][0] == "l" and lz.outputs == lz.inputs and
                            self.lazy_in[0][2] - self.lazy_in[0][1] == self.lz_width)
        # state symbols the recursive part gathers (one take per symbol and task)
        self.gsyms = sorted({spec[4] for spec in self.rec_in if spec[0] == "g"})

    def _split(self, T, name, p, gathers: dict, sc: list, pu, state) -> None:
        gid = {i: (k, j) for k, ids in gathers.items() for j, i in enumerate(ids)}
        n = len(T.op)
        dep_g, dep_p = [False] * n, [False] * n
        for i in range(n):
            if i in gid:
                dep_g[i] = True
            elif i == p:
                dep_p[i] = True
            else:
                for a in T.args[i]:
                    dep_g[i] = dep_g[i] or dep_g[a]
                    dep_p[i] = dep_p[i] or dep_p[a]
        hset = {i for i in range(n) if dep_p[i] and not dep_g[i]}
        gset = set(gid)
        rec_inner, rec_hit = _walk(T, sc, hset | gset)
        lz_inner, lz_hit = (_walk(T, [pu], hset | gset | {i for i in rec_inner if dep_g[i]})
                            if pu is not None else (set(), set()))
        rec2lazy = sorted(i for i in lz_hit if i in gset or (i in rec_inner and dep_g[i]))
        used_k = sorted({gid[i][0] for i in (rec_hit | set(rec2lazy)) & gset})
        hf = sorted((rec_hit | lz_hit) & hset)
        self.used_k = used_k
        # state columns
        sizes = [size_of(s) for s in state] if state else []
        self.scols = list(zip(np.cumsum([0] + sizes[:-1]).tolist(), np.cumsum(sizes).tolist()))
        # hoisted part: everything that needs pull() but no gather(), for all vertices at once
        self.hoist, self.hoist_cols, hcol = None, [], {}
        if hf:
            self.hoist = _extract(T, f"{name}/hoisted", hf, [p])
            a = 0
            for i in hf:
                hcol[i] = (a, a + size_of(T.shape[i]))
                a += size_of(T.shape[i])
            self.hoist_cols = [hcol[i] for i in hf]
        self.hoist_width = sum(b - a for a, b in self.hoist_cols)
        # recursive part: what scatter() needs, once per task
        lz_cols, a = {}, 0
        for i in rec2lazy:
            lz_cols[i] = (a, a + size_of(T.shape[i]))
            a += size_of(T.shape[i])
        self.lz_width = a
        self.rec, self.rec_in, self.rec_out = None, [], []
        rec_outputs = sc + rec2lazy
        if rec_outputs:
            cut, spec = [], []
            for kk, k in enumerate(used_k):
                for j, i in enumerate(gathers[k]):
                    cut.append(i)
                    spec.append(("g", kk) + self.scols[j] + (j,))
            for i in sorted(rec_hit & hset):
                cut.append(i)
                spec.append(("h",) + hcol[i])
            self.rec = _extract(T, f"{name}/recursive", rec_outputs, cut)
            self.rec_in = spec
            self.rec_out = ([("s",) + self.scols[j] + (j,) for j in range(len(sc))]
                            + [("l",) + lz_cols[i] + (None,) for i in rec2lazy])
        # lazy part: what only push() needs, once over all vertices after the recursion
        self.lazy, self.lazy_in = None, []
        if pu is not None:
            lz_h = sorted(lz_hit & hset)
            self.lazy = _extract(T, f"{name}/lazy", [pu], rec2lazy + lz_h)
            self.lazy_in = [("l",) + lz_cols[i] for i in rec2lazy] + [("h",) + hcol[i] for i in lz_h]

    def parts(self) -> list:
        return [x for x in (self.hoist, self.rec, self.lazy) if x is not None]


# =========================================================================== fusion
def _cell_shape(a, pre, *kids):
    n, h = a
    return ((n + 6) * h,)


def _cell_forward(xp, a, data, pre, *kids):
    cells = get_backend().fused_cells
    B = max([pre.shape[0]] + [k.shape[0] for k in kids])
    pre = xp.broadcast_to(pre, (B,) + pre.shape[1:])
    h, c, act = cells.treelstm_forward(pre, [xp.broadcast_to(k, (B,) + k.shape[1:]) for k in kids])
    return xp.concatenate([h, c, act], axis=1)  # [h, c, i, f_1..f_N, o, u, tanh(c)]


def _cell_backward(xp, a, data, xs, y, g, need):
    cells = get_backend().fused_cells
    n, H = a
    B = y.shape[0]
    kids = [xp.broadcast_to(k, (B,) + k.shape[1:]) for k in xs[1:]]
    dpre, dkids = cells.treelstm_backward(y[:, 2 * H:], kids, g[:, :H], g[:, H:2 * H])
    return (dpre if need[0] else None,) + tuple(dkids[k] if need[k + 1] else None for k in range(n))


# One N-ary TreeLSTM cell: attrs (N, H); args: pre-activations [i f_1..f_N o u], c_1..c_N.
TREE_CELL = OpDef("cavs_treelstm_cell", _cell_shape, _cell_forward, _cell_backward, cost=ELEMWISE)


def fusion_available() -> bool:
    """The fused cell needs the backend's fused_cells capability (backends/contract.py)."""
    return get_backend().fused_cells is not None


class _Match:
    __slots__ = ("h", "c", "pre", "kids", "n", "H", "node", "inner")

    def __init__(self, h, c, pre, kids, n, H, inner):
        self.h, self.c, self.pre, self.kids, self.n, self.H, self.inner = h, c, pre, kids, n, H, inner
        self.node = None


def _gate(T, i: int, op: OpDef, H: int):
    """(source, start) when node i is op(pick_range(source, start, start + H))."""
    if T.op[i] is not op:
        return None
    j = T.args[i][0]
    if T.op[j] is not _PICK_RANGE:
        return None
    s, e, d = T.attrs[j]
    if d != 0 or e - s != H:
        return None
    return T.args[j][0], s


def _sum_terms(T, c: int, users: list) -> list | None:
    """The summands of c = t1 + t2 + ... (inner sums must have no other user)."""
    out: list = []
    stack = [(c, True)]
    while stack:
        i, top = stack.pop()
        op = T.op[i]
        if (op is _ADD or op is _ESUM) and (top or users[i] == 1) and \
                all(T.shape[a] == T.shape[i] for a in T.args[i]):
            stack.extend((a, False) for a in reversed(T.args[i]))
        else:
            out.append(i)
    return out


def _match_cell(T, h: int, users: list) -> _Match | None:
    """h = o * tanh(c), c = i*u + sum_k f_k*c_k, gates from slices [i f_1..f_N o u] of one vector."""
    if T.op[h] is not _CMULT or len(T.shape[h]) != 1:
        return None
    H = T.shape[h][0]
    x, y = T.args[h]
    for og_id, t_id in ((x, y), (y, x)):
        og = _gate(T, og_id, _LOGISTIC, H)
        if og is None or T.op[t_id] is not _TANH or users[t_id] != 1:
            continue
        c = T.args[t_id][0]
        terms = _sum_terms(T, c, users)
        n = len(terms) - 1
        pre, o_at = og
        if T.shape[pre] != ((n + 3) * H,) or o_at != (n + 1) * H:
            continue
        kids = _cell_terms(T, terms, c, pre, n, H, users)
        if kids is not None:
            return _Match(h, c, pre, kids, n, H, {t_id} | set(terms) - {c})
    return None


def _cell_terms(T, terms, c, pre, n, H, users) -> list | None:
    kids: list = [None] * n
    seen_iu = False
    for t in terms:
        if T.op[t] is not _CMULT or (t != c and users[t] != 1):
            return None
        a, b = T.args[t]
        if not seen_iu and any(_gate(T, p, _LOGISTIC, H) == (pre, 0) and _gate(T, q, _TANH, H) == (pre, (n + 2) * H)
                               for p, q in ((a, b), (b, a))):
            seen_iu = True
            continue
        for fg, ck in ((a, b), (b, a)):
            g = _gate(T, fg, _LOGISTIC, H)
            if g is not None and g[0] == pre and g[1] % H == 0 and 1 <= g[1] // H <= n \
                    and kids[g[1] // H - 1] is None and T.shape[ck] == (H,):
                kids[g[1] // H - 1] = ck
                break
        else:
            return None
    return kids if seen_iu and all(k is not None for k in kids) else None


def _fuse(T: ComputationGraph, roots: list) -> tuple[ComputationGraph, dict, int]:
    """Re-record trace T with every matched gate pattern replaced by one TREE_CELL node."""
    live, _ = _walk(T, roots, set())
    users = [0] * len(T.op)
    for i in live:
        for a in T.args[i]:
            users[a] += 1
    for r in roots:
        users[r] += 1
    subst: dict = {}
    taken: set = set()
    for i in sorted(live):
        mt = _match_cell(T, i, users)
        if mt is not None and not ({mt.h, mt.c} | mt.inner) & taken:
            subst[mt.h], subst[mt.c] = ("h", mt), ("c", mt)
            taken |= {mt.h, mt.c} | mt.inner
    if not subst:
        return T, {i: i for i in range(len(T.op))}, 0
    deps = (lambda i: [subst[i][1].pre] + subst[i][1].kids if i in subst else T.args[i])
    need, stack = set(), list(roots)
    while stack:
        i = stack.pop()
        if i not in need:
            need.add(i)
            stack.extend(deps(i))
    new = ComputationGraph(scheduler="none")
    new.tracing = True
    m: dict = {}
    for i in range(len(T.op)):
        op = T.op[i]
        if op is PLACEHOLDER:
            m[i] = new.placeholder(PLACEHOLDER, T.shape[i])
        elif i not in need:
            continue
        elif i in subst:
            kind, mt = subst[i]
            if mt.node is None:
                mt.node = new.add(TREE_CELL, tuple(m[a] for a in [mt.pre] + mt.kids), (mt.n, mt.H))
            start = 0 if kind == "h" else mt.H
            m[i] = new.add(_PICK_RANGE, (mt.node,), (start, start + mt.H, 0))
        elif op.leaf:
            m[i] = new.leaf(T.attrs[i][1], T.sig_part[i][2])
        else:
            m[i] = new.add(op, tuple(m[a] for a in T.args[i]), T.attrs[i], T.data[i])
    return new, m, len(subst) // 2


class _CellRec:
    """The recursive part of an N-ary TreeLSTM vertex as one task kernel:
    pre = b + sum_k W_k x_k over gathered states x_k (all of one state symbol), then the
    fused cell over the children's cells c_1..c_N, scattering h and/or c.

    Per task: ONE take of the x's into a (M, n*D) block, ONE GEMM against [W_1 .. W_n]
    (the weights side by side, built once per pass), the compiled cell reading the c_k
    in place from the state, and in backward the cell (adding the c_k's gradients into
    their rows), ONE GEMM for the x gradients and one scatter-add of them. The weight
    gradients of all tasks are one GEMM at the end (the tasks' rows are contiguous in
    per-function buffers, so nothing is copied together). Same maths as the op steps;
    only the summation order inside the products differs (rounding level)."""

    __slots__ = ("n", "H", "G", "D", "jh", "jc", "slots_h", "slots_c", "w", "b", "outs")

    @classmethod
    def match(cls, part: _Part, specs: list, used_k: list, kind: str = "g") -> "_CellRec | None":
        """The layout when `part` is exactly that pattern, else None. specs: where each part
        input comes from; the x's must all be of `kind`: "g" (gathered, the recursive
        part) or "p" (the pulled input, the hoisted part of a leaf function: no children)."""
        ops = [s[1] for s in part.steps]
        if part.random or ops.count(_AFFINE) != 1 or ops.count(TREE_CELL) != 1 or \
                any(op not in (_AFFINE, TREE_CELL, _PICK_RANGE) for op in ops):
            return None
        aff = part.steps[ops.index(_AFFINE)]
        cell = part.steps[ops.index(TREE_CELL)]
        inp = dict(zip(part.inputs, specs))
        leaf = {i: k for k, i in enumerate(part.leaves)}
        r = cls()
        r.n, r.H = cell[3]
        r.G = (r.n + 3) * r.H
        args = aff[2]
        if cell[2][0] != aff[0] or aff[5] != (r.G,) or len(args) < 3 or args[0] not in leaf:
            return None
        r.b = leaf[args[0]]
        r.w, r.slots_h, r.jh = [], [], None
        for W, x in zip(args[1::2], args[2::2]):
            spec = inp.get(x)
            if W not in leaf or spec is None or spec[0] != kind or r.jh not in (None, spec[4]):
                return None
            r.jh = spec[4]
            r.w.append(leaf[W])
            r.slots_h.append(used_k[spec[1]] if kind == "g" else None)
        if kind == "p" and len(r.w) != 1:  # W_1 x + W_2 x: the x's are not side by side
            return None
        r.D = spec[3] - spec[2]
        if any(part.in_shapes[part.inputs.index(x)] != (r.D,) for x in args[2::2]):
            return None
        r.slots_c, r.jc = [], None
        for x in cell[2][1:]:
            spec = inp.get(x)
            if spec is None or spec[0] != "g" or r.jc not in (None, spec[4]) or spec[3] - spec[2] != r.H:
                return None
            r.jc = spec[4]
            r.slots_c.append(used_k[spec[1]])
        picks = {}
        for i, op, a_, at, spec, shape in part.steps:
            if op is _PICK_RANGE:
                if a_[0] != cell[0] or at not in ((0, r.H, 0), (r.H, 2 * r.H, 0)):
                    return None
                picks[i] = "h" if at[0] == 0 else "c"
        if any(o not in picks for o in part.outputs):
            return None
        r.outs = [picks[o] for o in part.outputs]
        return r

    def weights(self, xp, lv: list):
        """(bias row, W = [W_1 .. W_n] side by side, W^T), once per pass.
        `python bench/kernels.py --only cellgemm` (OpenBLAS, one thread, a TreeLSTM step's
        twelve task sizes M = 2..398): X @ W.T with W^T a view takes 776 us at H=64 and
        2943 us at H=128, against 675 and 2642 us with a contiguous copy of W^T made once,
        the copy included; at H=256 the copy loses (11851 against 13962 us: numpy's
        transposing copy is cache-hostile). So small weights are copied, large ones viewed."""
        ws = [lv[k][0] for k in self.w]
        W = ws[0] if len(ws) == 1 else xp.concatenate(ws, axis=1)
        WT = xp.ascontiguousarray(W.T) if W.size <= _COPY_WT_MAX else W.T
        return lv[self.b].reshape(1, self.G), W, WT


_COPY_WT_MAX = 200_000  # elements: H=128's (640, 256) is copied, H=256's (1280, 512) viewed

_PICK_RANGE, _CMULT, _ADD, _ESUM, _TANH, _LOGISTIC, _AFFINE, _MATMUL = (
    OPS[n] for n in ("pick_range", "cmult", "add", "esum", "tanh", "logistic", "affine", "matmul"))


# =========================================================================== pull data
class _Pull:
    """The external inputs: an embedding table with ids, or one expression per vertex."""

    def __init__(self, pull, sched: _Schedule, nf: int):
        self.kind, self.table, self.exprs = None, None, []
        self.shapes: list = [None] * nf
        if pull is None:
            return
        if isinstance(pull, tuple) and len(pull) == 2 and isinstance(pull[0], LookupParameters):
            self._table(pull[0], pull[1], sched, nf)
        else:
            self._expressions(pull, sched, nf)

    def _table(self, E: LookupParameters, ids, sched: _Schedule, nf: int) -> None:
        self.kind, self.table = "table", E
        if len(ids) != sched.S:
            raise DynagraphError(f"dy.cavs.run: pull ids for {len(ids)} graphs, but {sched.S} graphs were given")
        flat = []
        for s, w in enumerate(ids):
            if len(w) != int(sched.sizes[s]):
                raise DynagraphError(f"dy.cavs.run: graph {s} has {int(sched.sizes[s])} vertices but {len(w)} "
                                     f"pull ids (use -1 or None for a vertex without input)")
            flat.extend(w)
        try:
            arr = np.asarray(flat, dtype=np.int64).reshape(sched.N)
        except (TypeError, ValueError):
            arr = np.asarray([-1 if x is None else x for x in flat], dtype=np.int64).reshape(sched.N)
        rows = E.values.shape[0]
        bad = np.flatnonzero((arr < -1) | (arr >= rows))
        if bad.size:
            g = int(bad[0])
            s = int(sched.sample_of[g])
            raise DynagraphIndexError(f"dy.cavs.run: pull id {int(arr[g])} of graph {s} vertex "
                                      f"{g - int(sched.base[s])} is out of range for {E.name()} ({rows} rows)")
        self.ids = [arr[m] for m in sched.members]  # per function, in its row order
        self.shapes = [tuple(E.values.shape[1:])] * nf

    def _expressions(self, pull, sched: _Schedule, nf: int) -> None:
        self.kind = "exprs"
        get = pull if callable(pull) else None
        if get is None and len(pull) != sched.S:
            raise DynagraphError(f"dy.cavs.run: pull expressions for {len(pull)} graphs, but {sched.S} graphs "
                                 f"were given")
        self.rows: list = [[] for _ in range(nf)]
        self.argpos: list = [[] for _ in range(nf)]
        for s in range(sched.S):
            n = int(sched.sizes[s])
            xs = [get(s, v) for v in range(n)] if get is not None else pull[s]
            if len(xs) != n:
                raise DynagraphError(f"dy.cavs.run: graph {s} has {n} vertices but {len(xs)} pull expressions "
                                     f"(use None for a vertex without input)")
            base = int(sched.base[s])
            for v, x in enumerate(xs):
                if x is None:
                    continue
                if type(x) is not Expression:
                    raise TypeError(f"dy.cavs.run: pull for graph {s} vertex {v} must be an Expression or None, "
                                    f"got {type(x).__name__}")
                f = int(sched.type[base + v])
                shape = x.cg.shape[x.i]
                if self.shapes[f] is None:
                    self.shapes[f] = shape
                elif self.shapes[f] != shape:
                    raise DynagraphError(f"dy.cavs.run: pull for graph {s} vertex {v} has shape {shape}, other "
                                         f"vertices of the same function pull {self.shapes[f]}")
                self.rows[f].append(int(sched.local[base + v]))
                self.argpos[f].append(len(self.exprs))
                self.exprs.append(x)

    @property
    def n_args(self) -> int:
        return len(self.exprs) + (1 if self.kind == "table" else 0)

    def values(self, xp, xs: tuple, f: int, nv: int, dtype, ids=None):
        """This function's pull matrix (rows, *shape): ONE gather from the table (rows `ids`,
        default every vertex of f) or from the run node's expression arguments."""
        shape = self.shapes[f]
        if self.kind == "table":
            ids = self.ids[f] if ids is None else ids
            X = xp.take(xs[len(self.exprs)][0], np.maximum(ids, 0), axis=0)
            missing = ids < 0
            if missing.any():
                X[missing] = 0
            return X
        X = xp.zeros((nv,) + shape, dtype=dtype)
        if self.argpos[f]:
            X[np.asarray(self.rows[f])] = xp.concatenate([xs[k] for k in self.argpos[f]], axis=0)
        return X

    def unique(self, f: int):
        """(distinct ids, inverse, order, group starts) when f's vertices repeat table rows enough
        for hoisted work per distinct row to pay; else None."""
        if self.kind != "table" or not len(self.ids[f]):
            return None
        uniq, inv = np.unique(self.ids[f], return_inverse=True)
        if len(uniq) > 0.9 * len(inv):
            return None
        perm = np.argsort(inv, kind="stable")
        starts = np.flatnonzero(np.r_[True, inv[perm][1:] != inv[perm][:-1]])
        return uniq, inv, perm, starts

    def grads(self, xp, gX: list, need: tuple, ids: list) -> list:
        """Gradients for the run node's leading arguments (expressions, then the table);
        gX[f] holds rows for table rows ids[f] (table) or for f's vertices (expressions)."""
        out: list = [None] * self.n_args
        if self.kind == "table":
            if need[len(self.exprs)]:
                idx, vals = [], []
                for g, rows in zip(gX, ids):
                    if g is not None:
                        keep = rows >= 0
                        idx.append(rows[keep])
                        vals.append(g[keep])
                if idx:
                    out[-1] = SparseRows(np.concatenate(idx), xp.concatenate(vals))
            return out
        for f, g in enumerate(gX):
            if g is None:
                continue
            for r, k in zip(self.rows[f], self.argpos[f]):
                if need[k]:
                    out[k] = g[r:r + 1]
        return out


# =========================================================================== running
class _PushTable:
    """Pushed rows of one vertex function, bound in the imperative graph like an embedding
    table: view nodes read rows of it without copying it, and their gradients arrive as
    sparse rows (`grad`, `touched`, add_sparse_grad: the LookupParameters protocol the
    backends use), which the run node's backward then consumes."""
    is_lookup = True
    updated = True

    def __init__(self, name: str, values: np.ndarray):
        self._name, self.values = name, values
        self._grad = self._touched = None  # allocated by the first gradient: most runs reach backward
        # once, and a forward-only run never does

    @property
    def grad(self) -> np.ndarray:
        if self._grad is None:
            self._grad = np.zeros_like(self.values)
        return self._grad

    @grad.setter
    def grad(self, g: np.ndarray) -> None:  # `p.grad += g` (a dense gradient) sets it back
        self._grad = g

    @property
    def touched(self) -> np.ndarray:
        if self._touched is None:
            self._touched = np.zeros(self.values.shape[0], dtype=bool)
        return self._touched

    def name(self) -> str:
        return self._name

    def add_sparse_grad(self, idx, g) -> None:
        np.add.at(self.grad, idx, g)
        self.touched[idx] = True

    def take_grad(self):
        """The accumulated gradient, or None when no pushed value was used; resets it."""
        if self._touched is None or not self._touched.any():
            return None
        g, self._grad, self._touched = self.grad, None, None
        return g


class _HoistSaved:
    """What a hoisted TreeLSTM leaf part keeps for backward."""
    __slots__ = ("X", "act", "W", "shape")

    def __init__(self, X, act, W, shape):
        self.X, self.act, self.W, self.shape = X, act, W, shape


def _apart(outs: list, ins: list) -> bool:
    """No array of outs shares memory with any of ins (None entries ignored)."""
    return not any(o is not None and x is not None and np.shares_memory(o, x) for o in outs for x in ins)


class _Ctx(dict):
    """A pass's saved state. Its big buffers come from the shared workspace (numpy only:
    CuPy pools its own memory) and go back to it when the context is garbage."""

    __slots__ = ("__weakref__", "xp", "lease")

    def __init__(self, xp):
        super().__init__()
        self.xp = xp
        self.lease = None
        if xp is np:
            self.lease = WORKSPACE.lease()
            self.lease.bind(self)

    def empty(self, tag: str, shape, dtype):
        return self.lease.empty(tag, shape, dtype) if self.lease is not None else self.xp.empty(shape, dtype=dtype)

    def zeros(self, tag: str, shape, dtype):
        return self.lease.zeros(tag, shape, dtype) if self.lease is not None else self.xp.zeros(shape, dtype=dtype)


class _Run:
    """One dy.cavs.run(): the schedule, the compiled functions and the buffers of a pass."""

    def __init__(self, fns, comps, sched: _Schedule, pull: _Pull, state, dtype, key0: int):
        self.fns, self.comps, self.sched, self.pull = fns, comps, sched, pull
        self.dtype = dtype
        self.key0 = key0
        sizes = [size_of(s) for s in state] if state else []
        self.scols = list(zip(np.cumsum([0] + sizes[:-1]).tolist(), np.cumsum(sizes).tolist())) if sizes else []
        # the run's shared parameters: every leaf of every plan, once per (parameter, mode)
        self.leaf_keys: list = []
        index: dict = {}
        self.leaf_pos: dict = {}
        for c in comps:
            for part in c.parts():
                pos = []
                for p, upd in zip(part.leaf_params, part.leaf_update):
                    k = (id(p), upd)
                    if k not in index:
                        index[k] = len(self.leaf_keys)
                        self.leaf_keys.append((p, upd))
                    pos.append(index[k])
                self.leaf_pos[id(part)] = pos
        self.holders: list = [None] * len(comps)
        # eager hoisting per distinct table row: identical inputs give identical hoisted values
        self.dedup = [pull.unique(f) if c.hoist is not None and not c.hoist.random and DEDUP_HOISTED else None
                      for f, c in enumerate(comps)]
        # the TreeLSTM task kernels (on the "cpu" backend, checked again at each pass)
        self.cell = [c.cell if CELL_TASKS else None for c in comps]
        self.hoist_cell = [c.hoist_cell if CELL_TASKS else None for c in comps]
        self.defer = [self._deferrable(f, c) for f, c in enumerate(comps)]
        self._task_rows()
        self.timing = {"build": 0.0, "forward": 0.0, "backward": 0.0}
        self.kernels = {"forward": 0, "backward": 0}

    def _deferrable(self, f: int, c) -> frozenset:
        """Leaves of f's recursive part whose weight gradient waits for one GEMM at the end."""
        if c.rec is None or not c.rec.defer or not DEFER_WEIGHT_GRADS:
            return frozenset()
        tasks = sum(1 for t in self.sched.tasks if t[0] == f)
        # the TreeLSTM task kernel defers by writing its pre-activation gradients into one buffer
        # (no copying together): measured no slower at H=64, faster from H=256 (~15% at H=512)
        cell = self.cell[f] is not None and DEFER_WEIGHT_GRADS == "auto"
        out = set()
        for n, positions in c.rec.defer.items():
            args = c.rec.steps[n][2]
            for pos in positions:
                k = c.rec._leaf_at[args[pos]]
                r, q = c.rec.leaf_params[k].values.shape
                if DEFER_WEIGHT_GRADS is True or cell or r * q * tasks > 3 * self.sched.count[f] * (r + q):
                    out.add(k)
        return frozenset(out)

    def _task_rows(self) -> None:
        """Per task, the state rows its gathers read, once per run, not per pass: kid_rows
        (M, used children). The compiled cell's rows are built by _cell_rows, on the cpu
        backend only."""
        self.kid_rows: list = [None] * len(self.sched.tasks)
        self.cell_rows: list = [None] * len(self.sched.tasks)
        for t, (f, s0, e0, l0, cr) in enumerate(self.sched.tasks):
            c = self.comps[f]
            if c.used_k:  # the numpy backend runs cell tasks op by op too
                self.kid_rows[t] = np.ascontiguousarray(cr[:, c.used_k])

    # ---------------------------------------------------------------- helpers
    def _keys(self, part, f: int, l0: int, M: int, code: int):
        if not part.random:
            return None
        return (self.key0 + self.sched.members[f][l0:l0 + M]) * 4 + code

    def _leafvals(self, part, leafv: tuple) -> list:
        return [leafv[k] for k in self.leaf_pos[id(part)]]

    def _add_leaf_grads(self, acc: list, part, grads: list, fresh: bool = False) -> None:
        """acc[k] += the part's gradient of leaf k. fresh: the caller's arrays (or views of
        them) are new and referenced nowhere else, so the first one is kept, not copied."""
        for k, g in zip(self.leaf_pos[id(part)], grads[len(part.inputs):]):
            if g is None:
                continue
            if isinstance(g, SparseRows):
                acc[k] = (acc[k] or []) + [g]
            elif acc[k] is None:
                acc[k] = g if fresh else g.copy()
            else:
                acc[k] += g

    def _cell_rows(self, t: int) -> tuple:
        """Task t's rows for the compiled cell, as cells.KidRows into the state tables (rows
        0..N): the x's (M, n) and the children's cells, child-major (N, M). Built for every
        cell task of the run at once, as windows of two arrays over all state rows, each
        checked once. The cell kernel reads the children while it writes rows s0:e0 of the
        same table, and adds their gradients while it reads rows s0:e0 of the gradient
        table: a child has a lower height, so it is an earlier task's row (< s0), or row N."""
        got = self.cell_rows[t]
        if got is None:
            cells = get_backend().fused_cells
            sch = self.sched
            b = np.asarray(sch.bounds, dtype=np.int64)
            start = np.repeat(b[:-1], np.diff(b))  # per state row, its task's first row
            for f, cl in enumerate(self.cell):
                ts = [u for u, task in enumerate(sch.tasks) if task[0] == f]
                if cl is None or not ts:
                    continue
                xs = sch.child_rows[:, cl.slots_h]  # (rows, n): a task's x's are its rows
                cs = sch.child_rows[:, cl.slots_c].T  # (N, rows): a task's children are its columns
                if not ((cs < start) | (cs == sch.N)).all():
                    raise AssertionError("dy.cavs: a task's child is not an earlier task's row")
                spans = [(sch.tasks[u][1], sch.tasks[u][2]) for u in ts]
                x_rows = cells.KidRows.windows(xs, sch.N + 1, spans, axis=0)
                c_rows = cells.KidRows.windows(cs, sch.N + 1, spans, axis=1)
                for u, x, c in zip(ts, x_rows, c_rows):
                    self.cell_rows[u] = (x, c)
            got = self.cell_rows[t]
        return got

    @staticmethod
    def _view(buf, spec, r0: int, r1: int, shape):
        return buf[r0:r1, spec[-2]:spec[-1]].reshape((r1 - r0,) + shape)

    # ---------------------------------------------------------------- forward
    def forward(self, xs: tuple):
        t0 = time.perf_counter()
        be = get_backend()
        xp, dt, sch = be.xp, self.dtype, self.sched
        leafv = xs[self.pull.n_args:]
        nk = 0
        # the state, one buffer per symbol: a gather of one symbol is one contiguous take;
        # row N (a missing child) stays zeros
        ctx = _Ctx(xp)
        S = [ctx.empty("S", (sch.N + 1, b - a), dt) for a, b in self.scols]
        for s in S:
            s[sch.N] = 0
        cells = [cl if be.fused_cells is not None else None for cl in self.cell]
        ctx.update({"S": S, "XH": [], "LZ": [], "hoist": [], "rec": [None] * len(sch.tasks), "lazy": [],
                    "cells": cells, "XG": [], "W": [], "ACT": [], "PRE": []})
        for f, c in enumerate(self.comps):
            nv = sch.count[f]
            XH = hs = None
            if c.hoist is not None and nv:
                dd = self.dedup[f]
                X = self.pull.values(xp, xs, f, nv, dt, None if dd is None else dd[0])
                rows = X.shape[0]
                XH = ctx.empty("XH", (rows, c.hoist_width), dt)
                dests = [XH[:, a:b] for a, b in c.hoist_cols]
                if self.hoist_cell[f] is not None and be.fused_cells is not None:
                    hs = self._hoist_forward(ctx, self.hoist_cell[f], X, self._leafvals(c.hoist, leafv), dests)
                else:
                    hs = c.hoist.forward_rows(be, rows, self._keys(c.hoist, f, 0, rows, 1),
                                              [X] + self._leafvals(c.hoist, leafv), dests)
                if dd is not None:
                    XH = xp.take(XH, dd[1], axis=0)  # distinct rows -> every vertex: one copy
                nk += c.hoist.n_kernels + 2 + (dd is not None)
            ctx["XH"].append(XH)
            ctx["hoist"].append(hs)
            ctx["LZ"].append(self.holders[f].values.reshape(nv, -1) if c.push_direct else
                             ctx.empty("LZ", (nv, c.lz_width), dt) if c.lz_width else None)
            cl = cells[f]
            # the gathered x's of every task, rows in f's order: the weight gradient's GEMM input
            ctx["XG"].append(ctx.empty("XG", (nv, len(cl.w), cl.D), dt) if cl is not None else None)
            # the cell's per-run rows (act, kept for backward; the children's cells are read
            # in place from the state) and one GEMM output the size of the largest task,
            # reused task after task
            ctx["ACT"].append(ctx.empty("ACT", (nv, cl.G + cl.H), dt) if cl is not None else None)
            ctx["PRE"].append(ctx.empty("PRE", sch.widest[f] * cl.G, dt) if cl is not None else None)
            ctx["W"].append(cl.weights(xp, self._leafvals(c.rec, leafv)) if cl is not None else None)
        # each cell function's buffers checked once a pass: a task then checks only its rows
        ctx["plan"] = [self._cell_plan(cl, f, ctx) for f, cl in enumerate(cells)]
        for t, (f, s0, e0, l0, cr) in enumerate(sch.tasks):
            c = self.comps[f]
            if c.rec is None:
                continue
            if cells[f] is not None:
                ctx["rec"][t] = self._cell_forward(xp, cells[f], t, ctx)
                nk += 4  # take, GEMM, cell, the scatter
            else:
                ctx["rec"][t] = self._task_forward(be, t, leafv, ctx)
                nk += c.rec.n_kernels + 1 + len(c.gsyms)
        for f, c in enumerate(self.comps):
            nv = sch.count[f]
            ls = None
            if c.lazy is not None and nv and not c.push_direct:
                ins = [self._view(ctx["LZ"][f] if spec[0] == "l" else ctx["XH"][f], spec, 0, nv, shape)
                       for spec, shape in zip(c.lazy_in, c.lazy.in_shapes)]
                dest = self.holders[f].values.reshape(nv, -1)
                ls = c.lazy.forward_rows(be, nv, self._keys(c.lazy, f, 0, nv, 3), ins + self._leafvals(c.lazy, leafv),
                                         [dest])
                nk += c.lazy.n_kernels + 1  # + the push
            ctx["lazy"].append(ls)
        self.kernels["forward"] = nk
        self.timing["forward"] += time.perf_counter() - t0
        return xp.zeros((1, 1), dtype=dt), ctx

    @staticmethod
    def _hoist_forward(ctx: "_Ctx", cl: _CellRec, X, lv: list, dests: list) -> "_HoistSaved":
        """A leaf function's hoisted part as the TreeLSTM kernel: one GEMM, the cell (no children)."""
        b, W, WT = cl.weights(ctx.xp, lv)
        X2 = X.reshape(len(X), -1)
        act = ctx.empty("HACT", (len(X2), cl.G + cl.H), X2.dtype)
        pre = ctx.xp.matmul(X2, WT, out=ctx.empty("HPRE", (len(X2), cl.G), X2.dtype))
        _Run._cell_run(cl, pre, None, b, act, dests)
        return _HoistSaved(X2, act, W, X.shape)

    @staticmethod
    def _hoist_backward(cl: _CellRec, part: _Part, gouts: list, saved: "_HoistSaved", need: tuple) -> list:
        """Gradients of the pulled input, then of the part's leaves (the bias and W)."""
        cells = get_backend().fused_cells
        dh = dc = None
        for kind, g in zip(cl.outs, gouts):
            if kind == "h":
                dh = g if dh is None else dh + g
            else:
                dc = g if dc is None else dc + g
        if dh is None:
            dh = np.zeros((len(saved.X), cl.H), dtype=saved.act.dtype)
        dpre, _ = cells.treelstm_backward(saved.act, None, dh, dc)
        grads: list = [None] * (1 + len(part.leaves))
        if need[0]:
            grads[0] = (dpre @ saved.W).reshape(saved.shape)
        if need[1 + cl.b]:
            grads[1 + cl.b] = dpre.sum(axis=0).reshape((1,) + part.leaf_params[cl.b].values.shape)
        if need[1 + cl.w[0]]:
            grads[1 + cl.w[0]] = (dpre.T @ saved.X)[None]
        return grads

    def _dests(self, f: int, t: int, ctx: dict) -> list:
        _, s0, e0, l0, _ = self.sched.tasks[t]
        l1 = l0 + e0 - s0
        return [ctx["S"][j][s0:e0] if kind == "s" else ctx["LZ"][f][l0:l1, a:b]
                for kind, a, b, j in self.comps[f].rec_out]

    def _task_forward(self, be, t: int, leafv: tuple, ctx: dict):
        """One task through the recursive plan, op step by op step."""
        f, s0, e0, l0, cr = self.sched.tasks[t]
        c = self.comps[f]
        xp, M, l1 = be.xp, e0 - s0, l0 + e0 - s0
        if c.used_k:  # gather: ONE copy per state symbol
            kids = self.kid_rows[t]
            gb = {j: xp.take(ctx["S"][j], kids, axis=0) for j in c.gsyms}
        ins = []
        for spec, shape in zip(c.rec_in, c.rec.in_shapes):
            if spec[0] == "g":
                ins.append(gb[spec[4]][:, spec[1]].reshape((M,) + shape))
            else:
                ins.append(self._view(ctx["XH"][f], spec, l0, l1, shape))
        return c.rec.forward_rows(be, M, self._keys(c.rec, f, l0, M, 2), ins + self._leafvals(c.rec, leafv),
                                  self._dests(f, t, ctx))

    def _cell_forward(self, xp, cl: _CellRec, t: int, ctx: dict):
        """One task as the TreeLSTM kernel: take, GEMM, cell (bias added inside, h and c
        written straight into their state or push rows)."""
        f, s0, e0, l0, cr = self.sched.tasks[t]
        M = e0 - s0
        xr, kr = self._cell_rows(t)
        X = ctx["XG"][f][l0:l0 + M]
        xp.take(ctx["S"][cl.jh], xr.rows, axis=0, out=X, mode="clip")  # rows are in range: row N is zeros
        X = X.reshape(M, -1)
        b, _, WT = ctx["W"][f]
        pre = xp.matmul(X, WT, out=self._scratch(ctx, f, M, cl.G))
        act = ctx["ACT"][f][l0:l0 + M]
        # the children's cells are read in place from the state (kr)
        plan = ctx["plan"][f]
        if plan is None:
            self._cell_run(cl, pre, ctx["S"][cl.jc], b, act, self._dests(f, t, ctx), False, kr)
            return X, kr, act
        first: dict = {}  # h and c go to the first destination of each: (table, row, column)
        for kind, (k, a, _, j) in zip(cl.outs, self.comps[f].rec_out):
            first.setdefault(kind, (j, s0, 0) if k == "s" else (len(ctx["S"]), l0, a))
        plan.forward(l0, M, kr, first["h"], first["c"])  # pre is at the scratch's start
        if len(cl.outs) > len(first):
            self._copy_to_further_dests(cl, self._dests(f, t, ctx))
        return X, kr, act

    def _cell_plan(self, cl: "_CellRec | None", f: int, ctx: dict):
        """A cells.TreeCellPlan over f's buffers for this pass's tasks, or None (no cell, or
        an output that the plan cannot address: the tasks then go through _cell_run)."""
        if cl is None or not {"h", "c"} <= set(cl.outs):
            return None
        cells = get_backend().fused_cells
        lz = ctx["LZ"][f]
        if lz is not None and not (lz.flags.c_contiguous and lz.flags.writeable):
            return None
        return cells.TreeCellPlan(cl.n, cl.H, ctx["PRE"][f], ctx["W"][f][0], ctx["S"][cl.jc], ctx["ACT"][f],
                                [*ctx["S"]] + ([lz] if lz is not None else []))

    @staticmethod
    def _scratch(ctx: dict, f: int, M: int, width: int):
        """A contiguous (M, width) block of f's per-task scratch, or None (numpy allocates)."""
        buf = ctx["PRE"][f]
        return buf[:M * width].reshape(M, width) if M * width <= len(buf) else None

    @staticmethod
    def _cell_run(cl: _CellRec, pre, kids, b, act, dests: list, disjoint: bool = False, kid_rows=None) -> None:
        """The compiled cell, writing h and c into the first destination of each; any
        further destination of the same output gets a copy. kids: (N, M, H), or with
        kid_rows the state table they index."""
        cells = get_backend().fused_cells
        first = {}
        for kind, dst in zip(cl.outs, dests):
            first.setdefault(kind, dst)
        # disjoint: the run's output buffers (states, push rows, act) share no memory with
        # pre or the weights, checked once per pass on the whole buffers (forward), and the
        # children are rows the outputs do not write (_cell_rows)
        cells.treelstm_forward(pre, kids, bias=b, out=(first.get("h"), first.get("c"), act), disjoint=disjoint,
                             kid_rows=kid_rows)
        _Run._copy_to_further_dests(cl, dests)

    @staticmethod
    def _copy_to_further_dests(cl: _CellRec, dests: list) -> None:
        """The kernel wrote h and c into the first destination of each: copy those into
        any further destination of the same output."""
        first: dict = {}
        for kind, dst in zip(cl.outs, dests):
            if kind in first:
                dst[...] = first[kind]
            else:
                first[kind] = dst

    # ---------------------------------------------------------------- backward
    def backward(self, xs: tuple, need: tuple, ctx: dict) -> tuple:
        t0 = time.perf_counter()
        be = get_backend()
        xp, dt, sch = be.xp, self.dtype, self.sched
        npull = self.pull.n_args
        nk = 0
        acc: list = [None] * len(self.leaf_keys)
        # one gradient buffer per state symbol: the gather gradients scatter-add into whole rows
        gS = [ctx.zeros("gS", (sch.N + 1, b - a), dt) for a, b in self.scols]
        gLZ = [self._push_grad(f, xp, dt) if c.push_direct else
               ctx.zeros("gLZ", (sch.count[f], c.lz_width), dt) if c.lz_width else None
               for f, c in enumerate(self.comps)]
        gXH = [ctx.zeros("gXH", (sch.count[f], c.hoist_width), dt) if ctx["XH"][f] is not None else None
               for f, c in enumerate(self.comps)]
        for f, c in enumerate(self.comps):  # lazy parts ran last: their backward comes first
            gp = self.holders[f].take_grad() if self.holders[f] is not None else None
            if gp is None or ctx["lazy"][f] is None:
                continue
            nv = sch.count[f]
            grads = c.lazy.backward_rows(be, nv, [gp.reshape(nv, -1)], ctx["lazy"][f], self._need(c.lazy, need))
            nk += c.lazy.n_kernels
            for spec, g in zip(c.lazy_in, grads):
                if g is not None:
                    buf = gLZ[f] if spec[0] == "l" else gXH[f]
                    buf[:, spec[1]:spec[2]] += g.reshape(nv, -1)
            self._add_leaf_grads(acc, c.lazy, grads)
        deferred: dict = {}
        cells = ctx["cells"]
        # per cell function: the pre-activation gradients of every task, rows in f's order
        dP = [ctx.empty("dP", (sch.count[f], cl.G), dt) if cl is not None and self.defer[f] else None
              for f, cl in enumerate(cells)]
        sums: list = [[None, None] for _ in cells]
        ctx["need"] = need
        # each cell function's backward buffers checked once a pass, not per task
        ctx["bplan"] = [self._cell_bplan(cl, f, ctx, dP[f], gS, gLZ[f]) for f, cl in enumerate(cells)]
        for t in range(len(sch.tasks) - 1, -1, -1):
            f = sch.tasks[t][0]
            if ctx["rec"][t] is None:
                continue
            if cells[f] is not None:
                self._cell_backward(xp, cells[f], t, gS, gLZ, ctx, dP[f], sums[f])
                nk += 3 + (dP[f] is None)  # cell, GEMM, scatter-add (+ the dW GEMM)
            else:
                nk += self._task_backward(be, t, gS, gLZ, gXH, acc, need, ctx, deferred)
        for f, cl in enumerate(cells):
            if cl is not None and sch.count[f]:
                nk += self._cell_leaf_grads(cl, f, ctx, dP[f], sums[f], acc, need)
        for k, pairs in deferred.items():  # ONE GEMM per shared weight over every task
            G = xp.concatenate([g for g, x in pairs], axis=0)
            X = xp.concatenate([x for g, x in pairs], axis=0)
            dWk = (G.T @ X)[None]
            acc[k] = dWk if acc[k] is None else acc[k] + dWk
            nk += 1
        gX: list = [None] * len(self.comps)
        gids: list = [None] * len(self.comps)
        pull_need = any(need[:npull])
        for f, c in enumerate(self.comps):
            if ctx["hoist"][f] is None:
                continue
            g, rows, dd = gXH[f], sch.count[f], self.dedup[f]
            if dd is not None:  # sum the vertices' gradients per distinct row
                g = self._sum_per_row(be, g, dd)
                rows = len(dd[0])
            gouts = [g[:, a:b] for a, b in c.hoist_cols]
            hneed = (pull_need,) + tuple(need[npull + k] for k in self.leaf_pos[id(c.hoist)])
            if type(ctx["hoist"][f]) is _HoistSaved:
                grads = self._hoist_backward(self.hoist_cell[f], c.hoist, gouts, ctx["hoist"][f], hneed)
            else:
                grads = c.hoist.backward_rows(be, rows, gouts, ctx["hoist"][f], hneed)
            nk += c.hoist.n_kernels
            gX[f] = grads[0] if pull_need else None
            gids[f] = self.pull.ids[f] if dd is None and self.pull.kind == "table" else (
                dd[0] if dd is not None else None)
            self._add_leaf_grads(acc, c.hoist, grads)
        out = self.pull.grads(xp, gX, need, gids)
        for k, g in enumerate(acc):
            if isinstance(g, list):
                g = SparseRows(np.concatenate([p.idx for p in g]), xp.concatenate([p.vals for p in g]))
            out.append(g if need[npull + k] else None)
        self.kernels["backward"] = nk
        self.timing["backward"] += time.perf_counter() - t0
        return tuple(out)

    def _push_grad(self, f: int, xp, dt):
        """The LZ gradient of a direct push: the push table's own gradient, taken over."""
        nv = self.sched.count[f]
        g = self.holders[f].take_grad()
        return g.reshape(nv, -1) if g is not None else xp.zeros((nv, self.comps[f].lz_width), dtype=dt)

    def _cell_backward(self, xp, cl: _CellRec, t: int, gS, gLZ, ctx, dP, sums: list) -> None:
        """One task of the TreeLSTM kernel backward. The pre-activation gradients go to dP
        (one weight-gradient GEMM at the end) or, without dP, into sums = [dW, db] now."""
        f, s0, e0, l0, cr = self.sched.tasks[t]
        M = e0 - s0
        X, kids, act = ctx["rec"][t]
        dh = dc = None
        for kind, (k, a, b, j) in zip(cl.outs, self.comps[f].rec_out):
            g = gS[j][s0:e0] if k == "s" else gLZ[f][l0:l0 + M, a:b]
            if kind == "h":
                dh = g if dh is None else dh + g
            else:
                dc = g if dc is None else dc + g
        if dh is None:
            dh = xp.zeros((M, cl.H), dtype=act.dtype)
        # into dP's rows when the weight gradient is one GEMM at the end: no copy; the
        # children's cell gradients are added straight into their rows of gS
        plan = ctx["bplan"][f]
        if plan is not None:
            dpre = plan.backward(l0, M, kids, dh, dc)
        else:
            cells = get_backend().fused_cells
            dpre, _ = cells.treelstm_backward(act, ctx["S"][cl.jc], dh, dc, dpre=None if dP is None else dP[l0:l0 + M],
                                            kid_rows=kids, dc_table=gS[cl.jc])
        scratch = self._scratch(ctx, f, M, cl.n * cl.D)
        gx = xp.matmul(dpre, ctx["W"][f][1], out=scratch)
        if scratch is not None and plan is not None and plan.gx is not None:
            plan.add_inputs_grad(self.cell_rows[t][0])  # gx is at the scratch's start
        else:
            get_backend().row_add(gS[cl.jh], self.cell_rows[t][0].rows.reshape(-1), gx.reshape(-1, cl.D))  # repeated rows too
        if dP is not None:
            return
        if sums[0] is not None or sums[1] is not None:  # [dW, db] of the tasks so far
            if sums[0] is not None:
                sums[0] += dpre.T @ X
            sums[1] += dpre.sum(axis=0)
        else:
            sums[0] = dpre.T @ X if self._cell_need_w(cl, f, ctx["need"]) else None
            sums[1] = dpre.sum(axis=0)

    @staticmethod
    def _cell_bplan(cl: "_CellRec | None", f: int, ctx: dict, dP, gS: list, gLZ):
        """A cells.TreeCellPlan for f's cell backward this pass, or None. It writes dP's rows
        (or fresh arrays) and adds into gS, reading act, the state and the gradients in
        gS / gLZ (or fresh sums of them): dP apart from those, checked once here."""
        if cl is None or dP is not None and not _apart([dP], [*gS, gLZ]):
            return None
        cells = get_backend().fused_cells
        return cells.TreeCellPlan(cl.n, cl.H, ctx["PRE"][f], None, ctx["S"][cl.jc], ctx["ACT"][f], [], dpre=dP,
                                gkids=gS[cl.jc], gx=gS[cl.jh] if cl.jh != cl.jc else None)

    def _cell_need_w(self, cl: _CellRec, f: int, need: tuple) -> bool:
        pos = self.leaf_pos[id(self.comps[f].rec)]
        return any(need[self.pull.n_args + pos[k]] for k in cl.w)

    def _cell_leaf_grads(self, cl: _CellRec, f: int, ctx, dP, sums: list, acc: list, need: tuple) -> int:
        """Bias and weight gradients of a cell function: its W's are side by side in dW."""
        rec = self.comps[f].rec
        nin, pos, npull = len(rec.inputs), self.leaf_pos[id(rec)], self.pull.n_args
        grads: list = [None] * (nin + len(rec.leaves))
        dW, db = sums
        nk = 0
        if dP is not None:  # ONE GEMM over every task
            dW = dP.T @ ctx["XG"][f].reshape(len(dP), -1) if self._cell_need_w(cl, f, need) else None
            db = dP.sum(axis=0)
            nk = 2
        if db is not None and need[npull + pos[cl.b]]:
            grads[nin + cl.b] = db.reshape((1,) + rec.leaf_params[cl.b].values.shape)
        if dW is not None:
            for m, k in enumerate(cl.w):
                if need[npull + pos[k]]:
                    g = dW[None, :, m * cl.D:(m + 1) * cl.D]
                    grads[nin + k] = g if grads[nin + k] is None else grads[nin + k] + g
        self._add_leaf_grads(acc, rec, grads, fresh=True)  # db, dW: this call's own arrays
        return nk

    @staticmethod
    def _sum_per_row(be, g, dd):
        """Per distinct table row, the sum of its vertices' gradients, in vertex order either way
        (0 + x == x: the same numbers); the compiled scatter-add skips reduceat's gathered copy."""
        if be.row_add is not None and type(g) is np.ndarray:
            out = np.zeros((len(dd[0]),) + g.shape[1:], dtype=g.dtype)
            be.row_add(out, dd[1], g)
            return out
        return np.add.reduceat(g[dd[2]], dd[3], axis=0)

    def _scatter_add(self, be, target, rows, vals) -> None:
        """target[rows] += vals; row N (a missing child) collects garbage nobody reads."""
        if be.row_add is not None and type(vals) is np.ndarray:
            be.row_add(target, rows, vals)  # one pass in C, repeated rows included
        elif self.sched.tree:
            target[rows] += vals
        else:
            np.add.at(target, rows, vals)

    def _need(self, part, need: tuple) -> tuple:
        npull = self.pull.n_args
        return (True,) * len(part.inputs) + tuple(need[npull + k] for k in self.leaf_pos[id(part)])

    def _task_backward(self, be, t: int, gS, gLZ, gXH, acc, need, ctx, deferred: dict) -> int:
        f, s0, e0, l0, cr = self.sched.tasks[t]
        c = self.comps[f]
        saved = ctx["rec"][t]
        if saved is None:
            return 0
        M, l1 = e0 - s0, l0 + e0 - s0
        gouts = [gS[j][s0:e0] if kind == "s" else gLZ[f][l0:l1, a:b] for kind, a, b, j in c.rec_out]
        pairs: list | None = [] if self.defer[f] else None
        grads = c.rec.backward_rows(be, M, gouts, saved, self._need(c.rec, need), pairs, self.defer[f])
        for k, g, x in pairs or ():
            deferred.setdefault(self.leaf_pos[id(c.rec)][k], []).append((g, x))
        nk = c.rec.n_kernels
        for spec, g in zip(c.rec_in, grads):
            if g is None:
                continue
            if spec[0] == "g":  # the gradient of gather is a scatter-add into the children's rows
                self._scatter_add(be, gS[spec[4]], cr[:, c.used_k[spec[1]]], g.reshape(M, -1))
                nk += 1
            else:
                gXH[f][l0:l1, spec[1]:spec[2]] += g.reshape(M, -1)
        self._add_leaf_grads(acc, c.rec, grads)
        return nk


def _run_forward(xp, attrs, data, *xs):
    return data[0].forward(xs)


def _run_backward(xp, attrs, data, xs, y, g, need, ctx=None):
    return data[0].backward(xs, need, ctx)


# ----------------------------------------------------------------------- push views
def _push_shape(a, table, run):
    return a[0]


def _push_check(a, row, table, run):
    if not 0 <= row < table[0]:
        raise IndexError(f"pushed row {row} out of range ({table[0]} rows)")


def _push_forward(xp, a, data, table, run):
    return table[0][xp.asarray(data)]


def _push_backward(xp, a, data, xs, y, g, need):
    return (SparseRows(np.asarray(data), g) if need[0] else None,
            xp.zeros((len(data), 1), dtype=g.dtype) if need[1] else None)


# A pushed value: args (the function's push table, the run node), data = its row.
# All views of one run and function share a signature: one batched copy.
CAVS_PUSH = OpDef("cavs_push", _push_shape, _push_forward, _push_backward, check=_push_check,
                  uses_data=True, cost=CHEAP)


class CavsOutput:
    """The result of dy.cavs.run(): per-vertex pushed values as expressions of the graph."""

    def __init__(self, run: _Run, cg: ComputationGraph, node: int, names: list):
        self._run, self._cg, self._node, self._names = run, cg, node, names
        self._views: dict = {}
        self._roots = None

    @property
    def expression(self) -> Expression:
        """The run node itself (its value is a dummy scalar)."""
        return Expression(self._cg, self._node)

    @property
    def timing(self) -> dict:
        """Seconds: build (validation, schedule, tracing), forward and backward."""
        return self._run.timing

    @property
    def kernels(self) -> dict:
        """Kernel calls (op steps plus gather/scatter/pull/push copies) of the last pass."""
        return self._run.kernels

    @property
    def tasks(self) -> int:
        return len(self._run.sched.tasks)

    def push(self, sample: int, vertex: int) -> Expression:
        """What vertex `vertex` of graph `sample` pushed."""
        return self._view(self._run.sched.gid(sample, vertex))

    def _view(self, g: int) -> Expression:
        got = self._views.get(g)
        if got is not None:
            return got
        sch = self._run.sched
        f = int(sch.type[g])
        h = self._run.holders[f]
        if h is None:
            s = int(sch.sample_of[g])
            raise DynagraphError(f"vertex {g - int(sch.base[s])} of graph {s} is a {self._names[f]} vertex, whose "
                                 f"function never calls push()\n  at {user_line()}")
        cg = self._cg
        if cg.retired:
            raise DynagraphError(f"dy.cavs: the graph of this run was retired by renew_cg()\n  at {user_line()}")
        e = Expression(cg, cg.add(CAVS_PUSH, (cg.leaf(h), self._node), (h.values.shape[1:],), int(sch.local[g])))
        self._views[g] = e
        return e

    def pushed(self, sample: int) -> list:
        """Every vertex of graph `sample` whose function pushes, in vertex order (others: None)."""
        sch = self._run.sched
        b = sch.gid(sample, 0) if int(sch.sizes[sample]) else 0
        return [self._view(g) if self._run.holders[int(sch.type[g])] is not None else None
                for g in range(b, b + int(sch.sizes[sample]))]

    def _root_ids(self) -> np.ndarray:
        """The root (only vertex without a parent) of every graph, found once for all."""
        if self._roots is None:
            sch = self._run.sched
            idx = np.flatnonzero(~sch.has_parent)
            per = np.bincount(sch.sample_of[idx], minlength=sch.S)
            bad = np.flatnonzero(per != 1)
            if bad.size:
                raise DynagraphError(f"graph {int(bad[0])} has {int(per[bad[0]])} vertices without a parent; use "
                                     f"push(sample, vertex)\n  at {user_line()}")
            self._roots = idx  # ascending global ids: one per graph, in graph order
        return self._roots

    def root(self, sample: int) -> Expression:
        """The pushed value of the graph's root (its only vertex without a parent)."""
        sch = self._run.sched
        if not 0 <= sample < sch.S:
            raise DynagraphIndexError(f"sample {sample} out of range: the run has {sch.S} graphs")
        b, n = int(sch.base[sample]), int(sch.sizes[sample])
        roots = np.flatnonzero(~sch.has_parent[b:b + n])
        if len(roots) != 1:
            raise DynagraphError(f"graph {sample} has {len(roots)} vertices without a parent; use "
                                 f"push(sample, vertex)\n  at {user_line()}")
        return self._view(b + int(roots[0]))

    def roots(self) -> list:
        """root(s) of every graph, in order."""
        return self._views_of(self._root_ids())

    def _views_of(self, gs: np.ndarray) -> list:
        """_view for many vertices: the per-vertex lookups done as one array op each."""
        sch, run, cg = self._run.sched, self._run, self._cg
        types, locs = sch.type[gs].tolist(), sch.local[gs].tolist()
        if cg.retired or any(run.holders[f] is None for f in set(types)):
            return [self._view(g) for g in gs.tolist()]  # the error paths
        views, add, leaf = self._views, cg.add, cg.leaf
        out = []
        for g, f, loc in zip(gs.tolist(), types, locs):
            e = views.get(g)
            if e is None:
                h = run.holders[f]
                e = views[g] = Expression(cg, add(CAVS_PUSH, (leaf(h), self._node), (h.values.shape[1:],), loc))
            out.append(e)
        return out


# =========================================================================== run()
def _functions(functions) -> tuple[list, dict]:
    if isinstance(functions, VertexFunction):
        return [functions], {functions.name: 0}
    if isinstance(functions, dict):
        items = list(functions.items())
    elif isinstance(functions, (list, tuple)):
        items = [(f.name if isinstance(f, VertexFunction) else str(k), f) for k, f in enumerate(functions)]
    else:
        raise TypeError(f"dy.cavs.run: functions must be a vertex function, a dict name -> vertex function "
                        f"or a list, got {type(functions).__name__}")
    if not items:
        raise DynagraphError("dy.cavs.run needs at least one vertex function")
    for name, f in items:
        if not isinstance(f, VertexFunction):
            raise TypeError(f"dy.cavs.run: {name!r} is not a vertex function (decorate it with "
                            f"@dy.cavs.vertex_function)")
    return [f for _, f in items], {name: k for k, (name, _) in enumerate(items)}


def _compile_all(fns: list, pull_shapes: list, fuse: bool) -> tuple[list, tuple | None]:
    """Trace every function; the state shape comes from a declaration or a leaf function."""
    declared = {f.state for f in fns if f.state is not None}
    if len(declared) > 1:
        raise DynagraphError(f"dy.cavs.run: vertex functions declare different states {sorted(declared)}")
    state = next(iter(declared)) if declared else None
    comps: list = [None] * len(fns)
    pending = list(range(len(fns)))
    while pending:
        progress = False
        for f in list(pending):
            try:
                comps[f] = fns[f].compiled(state, pull_shapes[f], fuse)
            except _NeedState:
                continue
            pending.remove(f)
            progress = True
            if state is None and comps[f].scatter_shapes:
                state = comps[f].scatter_shapes
        if not progress:
            names = ", ".join(fns[f].name for f in pending)
            raise DynagraphError(f"dy.cavs.run: {names} gather() a state whose shape is unknown: no function "
                                 f"scatters without gathering; declare it with vertex_function(state=...)")
    for f, c in enumerate(comps):
        if c.scatter_shapes is not None and state is not None and c.scatter_shapes != state:
            raise DynagraphError(f"dy.cavs.run: vertex function {fns[f].name} scatters {list(c.scatter_shapes)} "
                                 f"but the state is {list(state)} (every function scatters the same shapes)")
    return comps, state


def _check_gathered(sched: _Schedule, comps: list, names: list) -> None:
    """A vertex may only have children whose function scatters something to gather."""
    silent = [f for f, c in enumerate(comps) if c.scatter_shapes is None]
    if not silent:
        return
    bad = set(np.unique(sched.type[sched.has_parent]).tolist()).intersection(silent)
    if bad:
        raise DynagraphError(f"dy.cavs.run: vertices of function {names[min(bad)]} have parents, but it never "
                             f"calls scatter(): there is nothing to gather")


def _kernel_estimate(comps: list, sched: _Schedule) -> int:
    """Kernels one pass launches (the executor and autodiff each count it once per pass)."""
    n = 0
    for f, c in enumerate(comps):
        if sched.count[f]:
            n += sum(p.n_kernels + 1 for p in (c.hoist, c.lazy) if p is not None)
    for f, *_ in sched.tasks:
        c = comps[f]
        if c.cell is not None and CELL_TASKS:  # take, GEMM, cell, the scatter
            n += 4
        elif c.rec is not None:
            n += c.rec.n_kernels + 1 + len(c.gsyms)  # + the scatter, one gather per state symbol
    return max(1, n)


def run(functions, graphs: Sequence, pull=None, *, fuse: bool | None = None) -> CavsOutput:
    """Evaluate vertex functions over a batch of input graphs, as ONE node of the current graph.

    functions: a vertex function, or a dict name -> vertex function (vertex types name them).
    graphs:    per sample, a Graph(children, types), a dict {"children", "types"} or a list
               of children lists; children lists hold vertex indices of the same graph.
    pull:      None; (LookupParameters E, ids) with ids[sample][vertex] a row of E or -1;
               a list per sample of per-vertex Expressions (None: no input); or a callable
               (sample, vertex) -> Expression | None. A missing input reads zeros.
    fuse:      use the compiled TreeLSTM cell where the pattern matches (default: on the cpu backend).
    """
    t0 = time.perf_counter()
    fns, names = _functions(functions)
    name_list = list(names)
    sched = _Schedule(graphs, names, [f.arity for f in fns])
    pull_data = _Pull(pull, sched, len(fns))
    use_fuse = fusion_available() if fuse is None else bool(fuse) and fusion_available()
    comps, state = _compile_all(fns, [pull_data.shapes[f] for f in range(len(fns))], use_fuse)
    for f, c in enumerate(comps):
        if c.uses_pull and pull_data.shapes[f] is None:
            raise DynagraphError(f"dy.cavs.run: vertex function {fns[f].name} calls pull(), but none of its "
                                 f"vertices has an input")
    _check_gathered(sched, comps, name_list)
    cg = pull_data.exprs[0].cg if pull_data.exprs else current()
    r = _Run(fns, comps, sched, pull_data, state, cg.dtype, key0=(cg._rand_base + len(cg.op)) << 20)
    for f, c in enumerate(comps):
        if c.push_shape is not None:
            r.holders[f] = _PushTable(f"cavs:{name_list[f]}:push",  # every row written by the lazy part
                                      np.empty((sched.count[f],) + c.push_shape, dtype=cg.dtype))
    args = list(pull_data.exprs)
    if pull_data.kind == "table":
        args.append(Expression(cg, cg.leaf(pull_data.table, True)))
    args += [Expression(cg, cg.leaf(p, upd)) for p, upd in r.leaf_keys]
    op = OpDef(f"cavs:{'+'.join(name_list)}", lambda a, *s: (1,), _run_forward, _run_backward, uses_data=True,
               saves_ctx=True, cost=GEMM, inner_kernels=_kernel_estimate(comps, sched))
    node = record(op, args, (), r)
    r.timing["build"] = time.perf_counter() - t0
    return CavsOutput(r, cg, node.i, name_list)
