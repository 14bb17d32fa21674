"""Compiling a vertex function: traced once, cut into hoisted, recursive and lazy parts;
the TreeLSTM cell matched in it, fused into one op and run as a task kernel (_CellRec)
through the backend's fused_cells capability."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..backends import get_backend
from ..errors import DynagraphError
from ..fusion import slices_first
from ..graph import ComputationGraph
from ..ops import OPS
from ..ops.base import ELEMWISE, OpDef, size_of
from ..program import Program
from ..program.units import FUSED
from ..subgraph import PLACEHOLDER, Plan, _Grads
from .api import Vertex, VertexFunction

_MASK64 = (1 << 64) - 1
_RANDOM_STRIDE = 1 << 12


# =========================================================================== compiling
class _Part(Plan):
    """A Plan run by the Cavs runtime: explicit batch size, per-row random keys, outputs
    written straight into destination buffers, and the backend's kernel overrides."""

    chained = None  # a Program whose elementwise chains are fused kernels (use_fused_chains)

    def use_fused_chains(self) -> None:
        """Run every chain of elementwise steps (gate nonlinearities, products, sums over
        gate slices, in whatever spelling) as one fusion.FusedChain kernel, forward and
        backward; the other steps stay one kernel each. Kept only where a chain forms."""
        prog = Program(self, None, None, fuse=True)
        self.chained = prog if any(u.kind == FUSED for u in prog.units) else None

    def chains(self) -> int:
        """How many fused elementwise chains the part runs."""
        return 0 if self.chained is None else sum(u.kind == FUSED for u in self.chained.units)

    def forward_rows(self, be, B: int, keys, xs: list, dests: list) -> list:
        data_of = lambda spec: self._rows_data(spec, B, keys)  # noqa: E731
        if self.chained is not None:
            vals, saved = self.chained.run(be, xs, data_of, B)
        else:
            vals, saved = self.run_steps(be, xs, data_of)
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
        divert = divert if deferred is not None else None
        if self.chained is not None:
            return self.chained.grad(be, acc, saved, need, divert)
        return self.grad_steps(be, acc, saved, need, divert)

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
        return len(self.steps) if self.chained is None else len(self.chained.units)


def _depends(T, gathered, p: int) -> tuple[list, list]:
    """Per node of T, whether it depends on a gathered node (one in `gathered`) and whether on
    the pulled node p (a gathered node counts as the former only)."""
    n = len(T.op)
    dep_g, dep_p = [False] * n, [False] * n
    for i in range(n):
        if i in gathered:
            dep_g[i] = True
        elif i == p:
            dep_p[i] = True
        else:
            for a in T.args[i]:
                dep_g[i] = dep_g[i] or dep_g[a]
                dep_p[i] = dep_p[i] or dep_p[a]
    return dep_g, dep_p


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


def compiled(vf: VertexFunction, state, pull_shape, fuse: bool) -> "_Compiled":
    """vf's split plans, compiled once per (state, pull shape, fuse) and kept on vf; a function
    that never gathers does not depend on the state."""
    c = vf.compiled_cache.get((None, pull_shape, fuse))
    if c is None:
        c = vf.compiled_cache.get((state, pull_shape, fuse))
    if c is None:
        c = _Compiled(vf, state, pull_shape, fuse)
        vf.compiled_cache[(state if c.gathers else None, pull_shape, fuse)] = c
    return c


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
            # one spelling first (slices before elementwise ops), then the cell matched in it
            keep = roots + [i for ids in vx.gathers.values() for i in ids]
            canon = slices_first(trace, keep + ([vx.pull_id] if vx.pull_id is not None else []))
            m0 = None
            if canon is not None:
                trace, m0 = canon
                roots = [m0[i] for i in roots]
            trace, m, self.fused = _fuse(trace, roots)
            if m0 is not None:
                m = {i: m[j] for i, j in m0.items() if j in m}
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
        # the general case of the fused cell: whatever runs as op steps (a part the TreeLSTM
        # kernel does not cover, or all of them where the run turns cell tasks off) runs its
        # elementwise chains as fused kernels
        if fuse and get_backend().fused_chains is not None:
            for part in self.parts():
                part.use_fused_chains()

    def _split(self, T, name, p, gathers: dict, sc: list, pu, state) -> None:
        gid = {i: (k, j) for k, ids in gathers.items() for j, i in enumerate(ids)}
        n = len(T.op)
        dep_g, dep_p = _depends(T, gid, p)
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
    """(source, start) when node i is op applied to rows start:start+H of source, in any of
    the spellings that compute it: op(pick_range(source, ...)) (one nonlinearity per gate),
    pick_range(op(source), ...) (one nonlinearity over all gates, then slices), and
    either with the source itself a slice of a larger vector (offsets add up). An
    elementwise op commutes with slicing, so all of them are the same gate."""
    if T.op[i] is op:
        src, start = _rows_of(T, T.args[i][0])
        return None if T.shape[i] != (H,) or src is None else (src, start)
    if T.op[i] is not _PICK_RANGE:
        return None
    s, e, d = T.attrs[i]
    if d != 0 or e - s != H:
        return None
    j = T.args[i][0]
    if T.op[j] is not op or len(T.shape[j]) != 1:
        return None
    src, start = _rows_of(T, T.args[j][0])
    return None if src is None else (src, start + s)


def _rows_of(T, i: int) -> tuple:
    """(source, offset) of vector i through any chain of row slices (i itself: offset 0);
    (None, 0) when a slice is not along rows."""
    start = 0
    while T.op[i] is _PICK_RANGE:
        s, _, d = T.attrs[i]
        if d != 0 or len(T.shape[i]) != 1:
            return None, 0
        start += s
        i = T.args[i][0]
    return i, start


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
