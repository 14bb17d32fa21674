"""Running a compiled dy.cavs call: the state tables, forward and backward over tasks."""
from __future__ import annotations

import time

import numpy as np

from ..backends import get_backend
from ..memory.workspace import WORKSPACE
from ..ops.base import SparseRows, one_row, size_of
from .. import cavs as _knobs  # the switches, read at call time: tests and benches set them on dy.cavs
from .schedule import _Schedule
from .pullpush import _Pull
from .fused_cell import hoisted_cell, recursive_cell


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
        self.dedup = [pull.unique(f) if c.hoist is not None and not c.hoist.random and _knobs.DEDUP_HOISTED else None
                      for f, c in enumerate(comps)]
        # the fused cells matched at compile time (compile._CellRec); each pass runs them where
        # its backend has the fused_cells capability, else the generic op steps
        self.cell = [recursive_cell(c, f, sched) if _knobs.CELL_TASKS else None for f, c in enumerate(comps)]
        self.hoist_cell = [hoisted_cell(c) if _knobs.CELL_TASKS else None for c in comps]
        self.defer = [self._deferrable(f, c) for f, c in enumerate(comps)]
        self._task_rows()
        self.timing = {"build": 0.0, "forward": 0.0, "backward": 0.0}
        self.kernels = {"forward": 0, "backward": 0}

    def _deferrable(self, f: int, c) -> frozenset:
        """Leaves of f's recursive part whose weight gradient waits for one GEMM at the end."""
        if c.rec is None or not c.rec.defer or not _knobs.DEFER_WEIGHT_GRADS:
            return frozenset()
        tasks = sum(1 for t in self.sched.tasks if t[0] == f)
        # a fused cell defers by writing its pre-activation gradients into one buffer (no
        # copying together): measured no slower at H=64, faster from H=256 (~15% at H=512).
        # Decided on the compile-time match, so a backend without fused_cells defers the same
        cell = self.cell[f] is not None and _knobs.DEFER_WEIGHT_GRADS == "auto"
        out = set()
        for n, positions in c.rec.defer.items():
            args = c.rec.steps[n][2]
            for pos in positions:
                k = c.rec._leaf_at[args[pos]]
                r, q = c.rec.leaf_params[k].values.shape
                if _knobs.DEFER_WEIGHT_GRADS is True or cell or r * q * tasks > 3 * self.sched.count[f] * (r + q):
                    out.add(k)
        return frozenset(out)

    def _task_rows(self) -> None:
        """Per task, the state rows its gathers read, once per run, not per pass: kid_rows
        (M, used children). A fused cell builds its own (TreeLSTMCell.rows)."""
        self.kid_rows: list = [None] * len(self.sched.tasks)
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

    @staticmethod
    def _view(buf, spec, r0: int, r1: int, shape):
        return buf[r0:r1, spec[-2]:spec[-1]].reshape((r1 - r0,) + shape)

    # ---------------------------------------------------------------- forward
    def forward(self, xs: tuple):
        t0 = time.perf_counter()
        be = get_backend()
        xp, dt, sch = be.xp, self.dtype, self.sched
        leafv = xs[self.pull.n_args:]
        # the state, one buffer per symbol: a gather of one symbol is one contiguous take;
        # row N (a missing child) stays zeros
        ctx = _Ctx(xp)
        S = [ctx.empty("S", (sch.N + 1, b - a), dt) for a, b in self.scols]
        for s in S:
            s[sch.N] = 0
        ctx.update({"S": S, "XH": [], "LZ": [], "hoist": [], "hcells": [], "rec": [None] * len(sch.tasks),
                    "lazy": []})
        nk = sum(self._forward_hoisted(be, f, xs, leafv, ctx) for f in range(len(self.comps)))
        # this pass's fused cells (None where the backend has none: op steps instead)
        cells = [cl.start(be, ctx, self._leafvals(c.rec, leafv), dt) if cl is not None else None
                 for cl, c in zip(self.cell, self.comps)]
        ctx["cells"] = cells
        for t, (f, s0, e0, l0, cr) in enumerate(sch.tasks):
            c = self.comps[f]
            if c.rec is None:
                continue
            if cells[f] is not None:
                ctx["rec"][t] = cells[f].forward(t)
                nk += cells[f].forward_kernels
            else:
                ctx["rec"][t] = self._task_forward(be, t, leafv, ctx)
                nk += c.rec.n_kernels + 1 + len(c.gsyms)
        nk += sum(self._forward_lazy(be, f, leafv, ctx) for f in range(len(self.comps)))
        self.kernels["forward"] = nk
        self.timing["forward"] += time.perf_counter() - t0
        return xp.zeros((1, 1), dtype=dt), ctx

    def _forward_hoisted(self, be, f: int, xs: tuple, leafv: tuple, ctx: dict) -> int:
        """f's hoisted part over all its vertices at once (its fused cell where it has one),
        and f's push rows; returns the kernels run."""
        c, xp, dt, nv = self.comps[f], be.xp, self.dtype, self.sched.count[f]
        XH = hs = hc = None
        nk = 0
        if c.hoist is not None and nv:
            dd = self.dedup[f]
            X = self.pull.values(xp, xs, f, nv, dt, None if dd is None else dd[0])
            rows = X.shape[0]
            XH = ctx.empty("XH", (rows, c.hoist_width), dt)
            dests = [XH[:, a:b] for a, b in c.hoist_cols]
            hc = self.hoist_cell[f] if be.fused_cells is not None else None
            if hc is not None:
                hs = hc.forward(be.fused_cells, ctx, X, self._leafvals(c.hoist, leafv), dests)
            else:
                hs = c.hoist.forward_rows(be, rows, self._keys(c.hoist, f, 0, rows, 1),
                                          [X] + self._leafvals(c.hoist, leafv), dests)
            if dd is not None:
                XH = xp.take(XH, dd[1], axis=0)  # distinct rows -> every vertex: one copy
            nk += c.hoist.n_kernels + 2 + (dd is not None)
        ctx["XH"].append(XH)
        ctx["hoist"].append(hs)
        ctx["hcells"].append(hc)
        ctx["LZ"].append(self.holders[f].values.reshape(nv, -1) if c.push_direct else
                         ctx.empty("LZ", (nv, c.lz_width), dt) if c.lz_width else None)
        return nk

    def _forward_lazy(self, be, f: int, leafv: tuple, ctx: dict) -> int:
        """f's lazy part over all its vertices, written into its push table."""
        c, nv = self.comps[f], self.sched.count[f]
        ls = None
        nk = 0
        if c.lazy is not None and nv and not c.push_direct:
            ins = [self._view(ctx["LZ"][f] if spec[0] == "l" else ctx["XH"][f], spec, 0, nv, shape)
                   for spec, shape in zip(c.lazy_in, c.lazy.in_shapes)]
            dest = self.holders[f].values.reshape(nv, -1)
            ls = c.lazy.forward_rows(be, nv, self._keys(c.lazy, f, 0, nv, 3), ins + self._leafvals(c.lazy, leafv),
                                     [dest])
            nk += c.lazy.n_kernels + 1  # + the push
        ctx["lazy"].append(ls)
        return nk

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

    # ---------------------------------------------------------------- backward
    def backward(self, xs: tuple, need: tuple, ctx: dict) -> tuple:
        t0 = time.perf_counter()
        be = get_backend()
        xp, dt, sch = be.xp, self.dtype, self.sched
        npull = self.pull.n_args
        acc: list = [None] * len(self.leaf_keys)
        # one gradient buffer per state symbol: the gather gradients scatter-add into whole rows
        gS = [ctx.zeros("gS", (sch.N + 1, b - a), dt) for a, b in self.scols]
        gLZ = [self._push_grad(f, xp, dt) if c.push_direct else
               ctx.zeros("gLZ", (sch.count[f], c.lz_width), dt) if c.lz_width else None
               for f, c in enumerate(self.comps)]
        gXH = [ctx.zeros("gXH", (sch.count[f], c.hoist_width), dt) if ctx["XH"][f] is not None else None
               for f, c in enumerate(self.comps)]
        # lazy parts ran last: their backward comes first
        nk = sum(self._backward_lazy(be, f, need, gLZ, gXH, acc, ctx) for f in range(len(self.comps)))
        nk += self._backward_tasks(be, need, gS, gLZ, gXH, acc, ctx)
        gX: list = [None] * len(self.comps)
        gids: list = [None] * len(self.comps)
        for f in range(len(self.comps)):
            if ctx["hoist"][f] is not None:
                gX[f], gids[f] = self._backward_hoisted(be, f, need, gXH[f], acc, ctx)
                nk += self.comps[f].hoist.n_kernels
        out = self.pull.grads(xp, gX, need, gids)
        for k, g in enumerate(acc):
            if isinstance(g, list):
                g = SparseRows(np.concatenate([p.idx for p in g]), xp.concatenate([p.vals for p in g]))
            out.append(g if need[npull + k] else None)
        self.kernels["backward"] = nk
        self.timing["backward"] += time.perf_counter() - t0
        return tuple(out)

    def _backward_lazy(self, be, f: int, need: tuple, gLZ: list, gXH: list, acc: list, ctx: dict) -> int:
        c = self.comps[f]
        gp = self.holders[f].take_grad() if self.holders[f] is not None else None
        if gp is None or ctx["lazy"][f] is None:
            return 0
        nv = self.sched.count[f]
        grads = c.lazy.backward_rows(be, nv, [gp.reshape(nv, -1)], ctx["lazy"][f], self._need(c.lazy, need))
        for spec, g in zip(c.lazy_in, grads):
            if g is not None:
                buf = gLZ[f] if spec[0] == "l" else gXH[f]
                buf[:, spec[1]:spec[2]] += g.reshape(nv, -1)
        self._add_leaf_grads(acc, c.lazy, grads)
        return c.lazy.n_kernels

    def _backward_tasks(self, be, need: tuple, gS: list, gLZ: list, gXH: list, acc: list, ctx: dict) -> int:
        """The recursive parts' tasks in reverse (a fused cell's where its function has
        one), then their deferred weight gradients; returns the kernels run."""
        xp, sch, nk = be.xp, self.sched, 0
        deferred: dict = {}
        cells = ctx["cells"]
        need_leaf = [tuple(need[self.pull.n_args + p] for p in self.leaf_pos[id(c.rec)]) if cl is not None else None
                     for cl, c in zip(cells, self.comps)]
        for f, cl in enumerate(cells):
            if cl is not None:
                cl.start_backward(ctx, gS, gLZ[f], bool(self.defer[f]), need_leaf[f])
        for t in range(len(sch.tasks) - 1, -1, -1):
            f = sch.tasks[t][0]
            if ctx["rec"][t] is None:
                continue
            if cells[f] is not None:
                cells[f].backward(t, ctx["rec"][t])
                nk += cells[f].backward_kernels
            else:
                nk += self._task_backward(be, t, gS, gLZ, gXH, acc, need, ctx, deferred)
        for f, cl in enumerate(cells):
            if cl is not None and sch.count[f]:
                grads, k = cl.leaf_grads(need_leaf[f])
                self._add_leaf_grads(acc, self.comps[f].rec, grads, fresh=True)  # db, dW: the cell's own arrays
                nk += k
        for k, pairs in deferred.items():  # ONE GEMM per shared weight over every task
            G = xp.concatenate([g for g, x in pairs], axis=0)
            X = xp.concatenate([x for g, x in pairs], axis=0)
            dWk = one_row(G.T @ X)
            acc[k] = dWk if acc[k] is None else acc[k] + dWk
            nk += 1
        return nk

    def _backward_hoisted(self, be, f: int, need: tuple, gXH, acc: list, ctx: dict) -> tuple:
        """f's hoisted part backward (its fused cell's where it ran one): (the pulled
        input's gradient or None, the rows it belongs to or None)."""
        c, npull = self.comps[f], self.pull.n_args
        pull_need = any(need[:npull])
        g, rows, dd = gXH, self.sched.count[f], self.dedup[f]
        if dd is not None:  # sum the vertices' gradients per distinct row
            g = self._sum_per_row(be, g, dd)
            rows = len(dd[0])
        gouts = [g[:, a:b] for a, b in c.hoist_cols]
        hneed = (pull_need,) + tuple(need[npull + k] for k in self.leaf_pos[id(c.hoist)])
        hc = ctx["hcells"][f]
        if hc is not None:
            grads = hc.backward(c.hoist, gouts, ctx["hoist"][f], hneed)
        else:
            grads = c.hoist.backward_rows(be, rows, gouts, ctx["hoist"][f], hneed)
        gid = self.pull.ids[f] if dd is None and self.pull.kind == "table" else (dd[0] if dd is not None else None)
        self._add_leaf_grads(acc, c.hoist, grads)
        return grads[0] if pull_need else None, gid

    def _push_grad(self, f: int, xp, dt):
        """The LZ gradient of a direct push: the push table's own gradient, taken over."""
        nv = self.sched.count[f]
        g = self.holders[f].take_grad()
        return g.reshape(nv, -1) if g is not None else xp.zeros((nv, self.comps[f].lz_width), dtype=dt)

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
