"""run(): compile the functions, schedule the graphs, record one node; CavsOutput, its result."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..backends import get_backend
from ..errors import DynagraphError, DynagraphIndexError, user_line
from ..expression import Expression, record
from ..graph import ComputationGraph, current
from ..ops.base import GEMM, OpDef
from .. import cavs as _knobs  # the switches, read at call time: tests and benches set them on dy.cavs
from .api import VertexFunction, _NeedState
from .compile import compiled
from .schedule import _Schedule
from .pullpush import CAVS_PUSH, _Pull, _PushTable
from .runner import _Run, _run_backward, _run_forward


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

    def task_vertices(self) -> list:
        """Per task, in run order: (vertex function name, [(sample, vertex), ...]), every vertex
        activated together in one evaluation of F (what dy.viz.cavs draws)."""
        sch = self._run.sched
        at_row = np.argsort(sch.rank)  # state row -> global vertex id
        out = []
        for f, s0, e0, _, _ in sch.tasks:
            gs = at_row[s0:e0]
            samples = sch.sample_of[gs]
            out.append((self._names[f], [(int(s), int(g - sch.base[s])) for s, g in zip(samples, gs)]))
        return out

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
                comps[f] = compiled(fns[f], state, pull_shapes[f], fuse)
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
        if c.cell is not None and _knobs.CELL_TASKS:  # take, GEMM, cell, the scatter
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
    use_fuse = _knobs.fusion_available() if fuse is None else bool(fuse) and _knobs.fusion_available()
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
                                      get_backend().xp.empty((sched.count[f],) + c.push_shape, dtype=cg.dtype))
    args = list(pull_data.exprs)
    if pull_data.kind == "table":
        args.append(Expression(cg, cg.leaf(pull_data.table, True)))
    args += [Expression(cg, cg.leaf(p, upd)) for p, upd in r.leaf_keys]
    op = OpDef(f"cavs:{'+'.join(name_list)}", lambda a, *s: (1,), _run_forward, _run_backward, uses_data=True,
               saves_ctx=True, cost=GEMM, inner_kernels=_kernel_estimate(comps, sched))
    node = record(op, args, (), r)
    r.timing["build"] = time.perf_counter() - t0
    return CavsOutput(r, cg, node.i, name_list)
