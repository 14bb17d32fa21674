"""Fused cells: a dy.cavs function part that is exactly the N-ary TreeLSTM pattern
(compile._CellRec) run as one task kernel through the backend's `fused_cells` capability
instead of op step by op step.

_Run asks each function only "has it a fused cell?": at the start of a pass
`TreeLSTMCell.start` returns a `TreeLSTMPass` (None where the backend has no fused_cells:
the numpy and cuda backends run the generic op steps), whose `forward(t)` /
`backward(t, saved)` run one task, and `leaf_grads` gives the bias and weight gradients at
the end. A leaf function's hoisted part has `HoistedCell`. Everything TreeLSTM-specific
(the task rows as KidRows windows, the per-pass TreeCellPlans, the weights side by side)
lives here.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np

from ..ops.base import one_row
from .compile import _CellRec, _Part


class FusedCellPass(Protocol):
    """What _Run calls on a function's fused cell during one pass."""
    forward_kernels: int    # per task, for the kernel count
    backward_kernels: int

    def forward(self, t: int) -> Any: ...          # task t's outputs written; returns what backward needs

    def start_backward(self, ctx, gS: list, gLZ, defer: bool, need_leaf: tuple) -> None: ...

    def backward(self, t: int, saved: Any) -> None: ...  # input gradients added into gS

    def leaf_grads(self, need_leaf: tuple) -> tuple: ...  # (the part's input + leaf gradients, kernels run)


class FusedCell(Protocol):
    """A function's recursive part as one task kernel, matched at compile time."""

    def start(self, be, ctx, lv: list, dt) -> Optional[FusedCellPass]: ...  # None: be lacks the capability


def recursive_cell(comp, f: int, sched) -> "Optional[FusedCell]":
    """Function f's fused cell for one run, or None (its tasks run the generic op steps)."""
    return TreeLSTMCell(comp.cell, f, comp, sched) if comp.cell is not None else None


def hoisted_cell(comp) -> "Optional[HoistedCell]":
    """The fused cell of f's hoisted part, or None."""
    return HoistedCell(comp.hoist_cell) if comp.hoist_cell is not None else None


def _apart(outs: list, ins: list) -> bool:
    """No array of outs shares memory with any of ins (None entries ignored)."""
    return not any(o is not None and x is not None and np.shares_memory(o, x) for o in outs for x in ins)


def _copy_to_further_dests(cl: _CellRec, dests: list) -> None:
    """The kernel wrote h and c into the first destination of each: copy those into
    any further destination of the same output."""
    first: dict = {}
    for kind, dst in zip(cl.outs, dests):
        if kind in first:
            dst[...] = first[kind]
        else:
            first[kind] = dst


def _cell_run(fc, cl: _CellRec, pre, kids, b, act, dests: list, disjoint: bool = False, kid_rows=None) -> None:
    """The compiled cell (fc: the backend's fused_cells), writing h and c into the first
    destination of each; any further destination of the same output gets a copy. kids:
    (N, M, H), or with kid_rows the state table they index."""
    first = {}
    for kind, dst in zip(cl.outs, dests):
        first.setdefault(kind, dst)
    # disjoint: the run's output buffers (states, push rows, act) share no memory with
    # pre or the weights, checked once per pass on the whole buffers (forward), and the
    # children are rows the outputs do not write (TreeLSTMCell.rows)
    fc.treelstm_forward(pre, kids, bias=b, out=(first.get("h"), first.get("c"), act), disjoint=disjoint,
                        kid_rows=kid_rows)
    _copy_to_further_dests(cl, dests)


class _HoistSaved:
    """What a hoisted TreeLSTM leaf part keeps for backward."""
    __slots__ = ("X", "act", "W", "shape", "fc")

    def __init__(self, X, act, W, shape, fc=None):
        self.X, self.act, self.W, self.shape, self.fc = X, act, W, shape, fc


class HoistedCell:
    """A leaf function's hoisted part as the TreeLSTM kernel: one GEMM, the cell (no children)."""

    def __init__(self, cl: _CellRec):
        self.cl = cl

    def forward(self, fc, ctx, X, lv: list, dests: list) -> _HoistSaved:
        cl = self.cl
        b, W, WT = cl.weights(ctx.xp, lv)
        X2 = X.reshape(len(X), -1)
        act = ctx.empty("HACT", (len(X2), cl.G + cl.H), X2.dtype)
        pre = ctx.xp.matmul(X2, WT, out=ctx.empty("HPRE", (len(X2), cl.G), X2.dtype))
        _cell_run(fc, cl, pre, None, b, act, dests)
        return _HoistSaved(X2, act, W, X.shape, fc)

    def backward(self, part: _Part, gouts: list, saved: _HoistSaved, need: tuple) -> list:
        """Gradients of the pulled input, then of the part's leaves (the bias and W)."""
        cl = self.cl
        dh = dc = None
        for kind, g in zip(cl.outs, gouts):
            if kind == "h":
                dh = g if dh is None else dh + g
            else:
                dc = g if dc is None else dc + g
        if dh is None:
            dh = np.zeros((len(saved.X), cl.H), dtype=saved.act.dtype)
        dpre, _ = saved.fc.treelstm_backward(saved.act, None, dh, dc)
        grads: list = [None] * (1 + len(part.leaves))
        if need[0]:
            grads[0] = (dpre @ saved.W).reshape(saved.shape)
        if need[1 + cl.b]:
            grads[1 + cl.b] = dpre.sum(axis=0).reshape((1,) + part.leaf_params[cl.b].values.shape)
        if need[1 + cl.w[0]]:
            grads[1 + cl.w[0]] = one_row(dpre.T @ saved.X)
        return grads


class TreeLSTMCell:
    """Function f's recursive part as the TreeLSTM task kernel, for one run: per task one
    take of the x's, one GEMM, the compiled cell; see compile._CellRec."""

    def __init__(self, cl: _CellRec, f: int, comp, sched):
        self.cl, self.f, self.comp, self.sched = cl, f, comp, sched
        self.task_rows: Optional[dict] = None  # task -> (x rows, children's rows), built once a run

    def start(self, be, ctx, lv: list, dt) -> "Optional[TreeLSTMPass]":
        """This pass's cell on backend be, or None where be has no fused_cells (the tasks
        then run the generic op steps). lv: the recursive part's leaf values."""
        return None if be.fused_cells is None else TreeLSTMPass(self, be, ctx, lv, dt)

    def rows(self, t: int, kid_rows: type) -> tuple:
        """Task t's rows for the compiled cell, as KidRows into the state tables (rows
        0..N): the x's (M, n) and the children's cells, child-major (N, M). Built for every
        task of f at once, as windows of two arrays over all state rows, each checked once.
        The cell kernel reads the children while it writes rows s0:e0 of the same table,
        and adds their gradients while it reads rows s0:e0 of the gradient table: a child
        has a lower height, so it is an earlier task's row (< s0), or row N."""
        if self.task_rows is None:
            self.task_rows = self._build_rows(kid_rows)
        return self.task_rows[t]

    def _build_rows(self, kid_rows: type) -> dict:
        sch, cl = self.sched, self.cl
        ts = [u for u, task in enumerate(sch.tasks) if task[0] == self.f]
        if not ts:
            return {}
        b = np.asarray(sch.bounds, dtype=np.int64)
        start = np.repeat(b[:-1], np.diff(b))  # per state row, its task's first row
        xs = sch.child_rows[:, cl.slots_h]  # (rows, n): a task's x's are its rows
        cs = sch.child_rows[:, cl.slots_c].T  # (N, rows): a task's children are its columns
        if not ((cs < start) | (cs == sch.N)).all():
            raise AssertionError("dy.cavs: a task's child is not an earlier task's row")
        spans = [(sch.tasks[u][1], sch.tasks[u][2]) for u in ts]
        x_rows = kid_rows.windows(xs, sch.N + 1, spans, axis=0)
        c_rows = kid_rows.windows(cs, sch.N + 1, spans, axis=1)
        return {u: (x, c) for u, x, c in zip(ts, x_rows, c_rows)}


class TreeLSTMPass:
    """One pass of a TreeLSTMCell: its buffers (rows in f's order), plans and gradient sums."""
    forward_kernels = 4  # take, GEMM, cell, the scatter

    def __init__(self, cell: TreeLSTMCell, be, ctx, lv: list, dt):
        cl, nv = cell.cl, cell.sched.count[cell.f]
        self.cell, self.cl, self.fc, self.row_add, self.xp, self.dt = cell, cl, be.fused_cells, be.row_add, ctx.xp, dt
        self.S, self.lz = ctx["S"], ctx["LZ"][cell.f]
        # the gathered x's of every task: the weight gradient's GEMM input
        self.XG = ctx.empty("XG", (nv, len(cl.w), cl.D), dt)
        # act (kept for backward; the children's cells are read in place from the state)
        # and one GEMM output the size of the largest task, reused task after task
        self.ACT = ctx.empty("ACT", (nv, cl.G + cl.H), dt)
        self.PRE = ctx.empty("PRE", cell.sched.widest[cell.f] * cl.G, dt)
        self.W = cl.weights(self.xp, lv)
        # the buffers checked once a pass: a task then checks only its rows
        self.plan = self.forward_plan()
        self.tasks, self.rec_out = cell.sched.tasks, cell.comp.rec_out
        self.dP = self.bplan = self.gS = self.gLZ = None
        self.backward_kernels = 3
        self.sums: list = [None, None]
        self.need_w = False

    def forward_plan(self):
        """A cells.TreeCellPlan over this pass's buffers, or None (an output that the plan
        cannot address: the tasks then go through the per-call checked _cell_run)."""
        cl, lz = self.cl, self.lz
        if not {"h", "c"} <= set(cl.outs):
            return None
        # CuPy's flags have no writeable: its arrays always are
        if lz is not None and not (lz.flags.c_contiguous and getattr(lz.flags, "writeable", True)):
            return None
        return self.fc.TreeCellPlan(cl.n, cl.H, self.PRE, self.W[0], self.S[cl.jc], self.ACT,
                                    [*self.S] + ([lz] if lz is not None else []))

    def _dests(self, t: int) -> list:
        _, s0, e0, l0, _ = self.tasks[t]
        l1 = l0 + e0 - s0
        return [self.S[j][s0:e0] if kind == "s" else self.lz[l0:l1, a:b] for kind, a, b, j in self.rec_out]

    def _scratch(self, M: int, width: int):
        """A contiguous (M, width) block of the per-task scratch, or None (numpy allocates)."""
        return self.PRE[:M * width].reshape(M, width) if M * width <= len(self.PRE) else None

    def forward(self, t: int) -> tuple:
        """Task t: take, GEMM, cell (bias added inside, h and c written straight into their
        state or push rows). Returns what backward needs."""
        _, s0, e0, l0, _ = self.tasks[t]
        cl, xp, M = self.cl, self.xp, e0 - s0
        xr, kr = self.cell.rows(t, self.fc.KidRows)
        X = self.XG[l0:l0 + M]
        if xp is np:
            xp.take(self.S[cl.jh], xr.rows, axis=0, out=X, mode="clip")  # rows are in range: row N is zeros
        else:  # CuPy's take has neither mode nor a checked out=: gather, then one copy
            X[...] = xp.take(self.S[cl.jh], xr.rows, axis=0)
        X = X.reshape(M, -1)
        b, _, WT = self.W
        pre = xp.matmul(X, WT, out=self._scratch(M, cl.G))
        act = self.ACT[l0:l0 + M]
        # the children's cells are read in place from the state (kr)
        if self.plan is None:
            _cell_run(self.fc, cl, pre, self.S[cl.jc], b, act, self._dests(t), False, kr)
            return X, kr, act
        first: dict = {}  # h and c go to the first destination of each: (table, row, column)
        for kind, (k, a, _, j) in zip(cl.outs, self.rec_out):
            first.setdefault(kind, (j, s0, 0) if k == "s" else (len(self.S), l0, a))
        self.plan.forward(l0, M, kr, first["h"], first["c"])  # pre is at the scratch's start
        if len(cl.outs) > len(first):
            _copy_to_further_dests(cl, self._dests(t))
        return X, kr, act

    def start_backward(self, ctx, gS: list, gLZ, defer: bool, need_leaf: tuple) -> None:
        """gS: the state gradients, gLZ: f's push-row gradients; defer: the pre-activation
        gradients of every task go to one buffer (one weight-gradient GEMM at the end);
        need_leaf: per leaf of the recursive part, whether its gradient is wanted."""
        cl = self.cl
        self.gS, self.gLZ, self.sums = gS, gLZ, [None, None]
        self.need_w = any(need_leaf[k] for k in cl.w)
        self.dP = ctx.empty("dP", (self.cell.sched.count[self.cell.f], cl.G), self.dt) if defer else None
        self.bplan = self.backward_plan()
        self.backward_kernels = 3 + (self.dP is None)  # cell, GEMM, scatter-add (+ the dW GEMM)

    def backward_plan(self):
        """A cells.TreeCellPlan for this pass's backward, or None. It writes dP's rows (or
        fresh arrays) and adds into gS, reading act, the state and the gradients in gS /
        gLZ (or fresh sums of them): dP apart from those, checked once here."""
        cl, dP, gS = self.cl, self.dP, self.gS
        if dP is not None and not _apart([dP], [*gS, self.gLZ]):
            return None
        return self.fc.TreeCellPlan(cl.n, cl.H, self.PRE, None, self.S[cl.jc], self.ACT, [], dpre=dP,
                                    gkids=gS[cl.jc], gx=gS[cl.jh] if cl.jh != cl.jc else None)

    def _output_grads(self, t: int, M: int) -> tuple:
        """dh and dc of task t: the sums of its outputs' gradients (dc None where unused)."""
        _, s0, e0, l0, _ = self.tasks[t]
        dh = dc = None
        for kind, (k, a, b, j) in zip(self.cl.outs, self.rec_out):
            g = self.gS[j][s0:e0] if k == "s" else self.gLZ[l0:l0 + M, a:b]
            if kind == "h":
                dh = g if dh is None else dh + g
            else:
                dc = g if dc is None else dc + g
        return dh, dc

    def backward(self, t: int, saved: tuple) -> None:
        """One task of the cell backward. The pre-activation gradients go to dP (one
        weight-gradient GEMM at the end) or, without dP, into sums = [dW, db] now."""
        _, s0, e0, l0, _ = self.tasks[t]
        cl, xp, M, dP = self.cl, self.xp, e0 - s0, self.dP
        X, kids, act = saved
        xr = self.cell.task_rows[t][0]  # built by forward
        dh, dc = self._output_grads(t, M)
        if dh is None:
            dh = xp.zeros((M, cl.H), dtype=act.dtype)
        # into dP's rows when the weight gradient is one GEMM at the end: no copy; the
        # children's cell gradients are added straight into their rows of gS
        plan = self.bplan
        if plan is not None:
            dpre = plan.backward(l0, M, kids, dh, dc)
        else:
            dpre, _ = self.fc.treelstm_backward(act, self.S[cl.jc], dh, dc,
                                                dpre=None if dP is None else dP[l0:l0 + M], kid_rows=kids,
                                                dc_table=self.gS[cl.jc])
        scratch = self._scratch(M, cl.n * cl.D)
        gx = xp.matmul(dpre, self.W[1], out=scratch)
        if scratch is not None and plan is not None and plan.gx is not None:
            plan.add_inputs_grad(xr)  # gx is at the scratch's start
        else:  # repeated rows too
            self.row_add(self.gS[cl.jh], xr.rows.reshape(-1), gx.reshape(-1, cl.D))
        if dP is None:
            self._sum_leaf_grads(dpre, X)

    def _sum_leaf_grads(self, dpre, X) -> None:
        sums = self.sums
        if sums[0] is not None or sums[1] is not None:  # [dW, db] of the tasks so far
            if sums[0] is not None:
                sums[0] += dpre.T @ X
            sums[1] += dpre.sum(axis=0)
        else:
            sums[0] = dpre.T @ X if self.need_w else None
            sums[1] = dpre.sum(axis=0)

    def leaf_grads(self, need_leaf: tuple) -> tuple:
        """(gradients of the recursive part's inputs then leaves, as backward_rows gives
        them: only the bias and the W's set; kernels run). The W's are side by side in dW."""
        cl, rec, dP = self.cl, self.cell.comp.rec, self.dP
        nin = len(rec.inputs)
        grads: list = [None] * (nin + len(rec.leaves))
        dW, db = self.sums
        nk = 0
        if dP is not None:  # ONE GEMM over every task
            dW = dP.T @ self.XG.reshape(len(dP), -1) if self.need_w else None
            db = dP.sum(axis=0)
            nk = 2
        if db is not None and need_leaf[cl.b]:
            grads[nin + cl.b] = db.reshape((1,) + rec.leaf_params[cl.b].values.shape)
        if dW is not None:
            for m, k in enumerate(cl.w):
                if need_leaf[k]:
                    g = dW[None, :, m * cl.D:(m + 1) * cl.D]
                    grads[nin + k] = g if grads[nin + k] is None else grads[nin + k] + g
        return grads, nk
