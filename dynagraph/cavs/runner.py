"""Running a compiled dy.cavs call: the state tables, forward and backward over tasks."""
from __future__ import annotations

import time

import numpy as np

from ..backends import get_backend
from ..memory.workspace import WORKSPACE
from ..ops.base import SparseRows, size_of
from .. import cavs as _knobs  # the switches, read at call time: tests and benches set them on dy.cavs
from .schedule import _Schedule
from .compile import _CellRec, _Part
from .pullpush import _Pull


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
        self.dedup = [pull.unique(f) if c.hoist is not None and not c.hoist.random and _knobs.DEDUP_HOISTED else None
                      for f, c in enumerate(comps)]
        # the TreeLSTM task kernels (on the "cpu" backend, checked again at each pass)
        self.cell = [c.cell if _knobs.CELL_TASKS else None for c in comps]
        self.hoist_cell = [c.hoist_cell if _knobs.CELL_TASKS else None for c in comps]
        self.defer = [self._deferrable(f, c) for f, c in enumerate(comps)]
        self._task_rows()
        self.timing = {"build": 0.0, "forward": 0.0, "backward": 0.0}
        self.kernels = {"forward": 0, "backward": 0}

    def _deferrable(self, f: int, c) -> frozenset:
        """Leaves of f's recursive part whose weight gradient waits for one GEMM at the end."""
        if c.rec is None or not c.rec.defer or not _knobs.DEFER_WEIGHT_GRADS:
            return frozenset()
        tasks = sum(1 for t in self.sched.tasks if t[0] == f)
        # the TreeLSTM task kernel defers by writing its pre-activation gradients into one buffer
        # (no copying together): measured no slower at H=64, faster from H=256 (~15% at H=512)
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
        else:  # repeated rows too
            get_backend().row_add(gS[cl.jh], self.cell_rows[t][0].rows.reshape(-1), gx.reshape(-1, cl.D))
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
