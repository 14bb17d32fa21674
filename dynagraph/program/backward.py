"""Replaying a program's units in reverse. A group's output gradient lives in one
(K*B, ...) buffer (`UnitGrads`); a "stack" operand's gradient is the scatter-add that
undoes the forward gather."""
from __future__ import annotations

from typing import Callable

from ..ops.base import Sliced, SparseRows, reduce_to
from .grads import UnitGrads
from .products import linear_backward, pieces_backward
from .steps import step_backward
from .units import FUSED, GROUP, STEP, Counts


class Backward:
    """`Program.grad`; the program supplies plan, units and counts."""
    plan: object
    units: list
    counts: Counts

    def grad(self, be, acc: UnitGrads, saved: list, need: tuple, divert: Callable | None = None) -> list:
        """Gradients of the plan's inputs then leaves; `divert` as in Plan.grad_steps (single steps)."""
        plan = self.plan
        needs = plan._needs(need)
        kernels = be.backward_kernels
        c = self.counts
        c.backward_copies = c.backward_bytes = 0
        for k in range(len(self.units) - 1, -1, -1):
            u = self.units[k]
            if u.kind == STEP:
                step_backward(be, kernels, plan.steps[u.steps[0]], saved[k], acc, needs, divert, u.steps[0])
            elif u.kind == GROUP:
                self._grad_group(u, k, be, acc, saved[k], needs, kernels)
            elif u.kind == FUSED:
                self._grad_fused(u, be, acc, saved[k], needs)
            else:
                self._grad_pieces(u, k, be, acc, saved[k], needs)
        grads = [acc.result(i) for i in plan.inputs + plan.leaves]
        for k, n in enumerate(saved[-1]):
            g = grads[k]
            if n == 1 and g is not None and not isinstance(g, (Sliced, SparseRows)) and g.shape[0] != 1:
                grads[k] = g.sum(axis=0, keepdims=True)
        return grads

    def _grad_group(self, u, k, be, acc, saved, needs, kernels) -> None:
        steps = self.plan.steps
        i0, op, args0, a, spec, shape = steps[u.steps[0]]
        g = acc.take(k)
        if g is None or op.backward is None or not any(needs.get(steps[n][0], False) for n in u.steps):
            return
        ins, y, d = saved
        K = len(u.steps)
        B = y.shape[0] // K
        want = tuple(any(needs.get(steps[n][2][p], False) for n in u.steps) for p in range(len(u.args)))
        if any(s[0] == "weights" for s in u.args):
            gxs = linear_backward(be.xp, op.name, ins, u.args, g, want, K, B)
        else:
            gxs = kernels.get(op.name, op.backward)(be.xp, a, d, ins, y, g, want)
        for spec, x, gx, w in zip(u.args, ins, gxs, want):
            if gx is None or not w:
                continue
            kind = spec[0]
            if kind == "same":
                if isinstance(gx, (Sliced, SparseRows)):
                    acc.add(spec[1], gx, x.shape)
                    continue
                gx = reduce_to(gx, x.shape)
                if x.shape[0] != 1 and gx.shape[0] == K * B:   # the argument was repeated K times
                    gx = gx.reshape((K, B) + gx.shape[1:]).sum(axis=0)
                acc.add(spec[1], gx, (1,) + gx.shape[1:] if x.shape[0] == 1 else gx.shape)
            elif kind == "view":
                acc.add_range(spec[1], spec[2] * B, gx)
            else:
                rows = gx.shape[0] // K
                for m, v in enumerate(spec[1]):
                    part = gx[m * rows:(m + 1) * rows]
                    acc.add(v, part, part.shape if kind == "stack" else (1,) + part.shape[1:])
                if kind == "stack":  # the scatter-add that undoes the forward gather
                    self.counts.backward_copies += 1
                    self.counts.backward_bytes += gx.nbytes

    def _grad_fused(self, u, be, acc, saved, needs) -> None:
        steps = self.plan.steps
        gouts = [acc.pop(steps[n][0]) for n in u.steps]
        want = [needs.get(j, False) for j in u.inputs]
        if not any(want) or all(g is None for g in gouts):
            return
        ins, ys = saved
        for j, x, gx, w in zip(u.inputs, ins, u.chain.backward(be, ins, ys, gouts, want), want):
            if gx is not None and w:
                acc.add(j, gx, x.shape)

    def _grad_pieces(self, u, k, be, acc, saved, needs) -> None:
        """The piece-major product's gradients from the (P, B, h) gradient (products.pieces_backward)."""
        i, op, args, a, spec, shape = self.plan.steps[u.steps[0]]
        g3 = acc.take(k)
        whole = acc.pop(i)  # a reader of the whole product (a coarsened group's outside user)
        if (g3 is None and whole is None) or not needs.get(i, False):
            return
        xp = be.xp
        ins, y3, d = saved
        P, B, h = y3.shape
        if whole is not None:
            w3 = xp.broadcast_to(whole, (B, P * h)).reshape(B, P, h).transpose(1, 0, 2)
            g3 = xp.ascontiguousarray(w3) if g3 is None else g3.reshape(P, B, h) + w3
        g3 = g3.reshape(P, B, h)
        grads = pieces_backward(xp, op.name, ins, y3, g3, lambda p: needs.get(args[p], False))
        for p, g in enumerate(grads):
            if g is not None:
                acc.add(args[p], g, ins[p].shape)
