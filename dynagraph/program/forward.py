"""Running a program's units forward: single steps, groups (operands shared, read in
place, stacked weights or gathered), fused chains and piece-major products."""
from __future__ import annotations

from typing import Callable

from .grouping import consecutive_views
from .products import linear_forward, pieces_forward
from .steps import step_forward
from .units import FUSED, GROUP, STEP, Counts, Unit


class Forward:
    """`Program.run`; the program supplies plan, units and counts."""
    plan: object
    units: list
    counts: Counts

    def run(self, be, xs: list, data_of: Callable, B: int) -> tuple[dict, list]:
        plan, xp = self.plan, be.xp
        xs = list(xs)
        lead = [x.shape[0] for x in xs[:len(plan.inputs)]]
        for k, n in enumerate(lead):
            if n != B:  # a parameter passed straight in: groups stack per-call rows
                xs[k] = xp.broadcast_to(xs[k], (B,) + xs[k].shape[1:])
        vals = dict(zip(plan.inputs + plan.leaves, xs))
        outs: dict = {}
        saved = []
        c = self.counts
        c.forward_copies = c.forward_bytes = 0
        kernels = be.forward_kernels
        for k, u in enumerate(self.units):
            if u.kind == STEP:
                saved.append(step_forward(be, kernels, plan.steps[u.steps[0]], vals, data_of))
            elif u.kind == GROUP:
                saved.append(self._run_group(u, be, vals, outs, k, data_of, B))
            elif u.kind == FUSED:
                ins = [vals[j] for j in u.inputs]
                ys = u.chain.forward(be, ins)
                for n, y in zip(u.steps, ys):
                    vals[self.plan.steps[n][0]] = y
                saved.append((ins, ys))
            else:
                saved.append(self._run_pieces(u, xp, vals, outs, k, B))
        saved.append(lead)
        return vals, saved

    def _gathered(self, xp, arrays: list):
        out = xp.concatenate(arrays)
        self.counts.forward_copies += 1
        self.counts.forward_bytes += out.nbytes
        return out

    def _run_group(self, u: Unit, be, vals: dict, outs: dict, k: int, data_of: Callable, B: int):
        xp, steps = be.xp, self.plan.steps
        i0, op, args0, a, spec0, shape = steps[u.steps[0]]
        K = len(u.steps)
        linear = any(s[0] == "weights" for s in u.args)
        ins = []
        for spec in u.args:
            kind = spec[0]
            if kind == "same":
                x = vals[spec[1]]  # a batched product input stays (B, X): the GEMM broadcasts it
                ins.append(x if x.shape[0] == 1 or linear else self._gathered(xp, [x] * K))
            elif kind == "view":
                src = outs[spec[1]]
                ins.append(src[spec[2] * B:(spec[2] + K) * B])
            elif kind == "weights":
                ws = [vals[v] for v in spec[1]]
                base = spec[2]
                if base is not None and base.shape[0] == len(ws) and all(w.base is base for w in ws) \
                        and consecutive_views([w[0] for w in ws], be.address) and be.address(ws[0][0]) == be.address(base):
                    ins.append(base)  # the weights are the stacked array: no copy
                else:
                    ins.append(self._gathered(xp, ws))
            else:
                ins.append(self._gathered(xp, [vals[v] for v in spec[1]]))
        d = None
        if op.uses_data:
            d = [x for n in u.steps for x in data_of(steps[n][4])]
        if linear:
            y = linear_forward(xp, op.name, ins, u.args, K, B)
        else:
            y = be.forward_kernels.get(op.name, op.forward)(xp, a, d, *ins)
            if y.shape[0] != K * B:  # all K steps read the same shared rows, so computed them once
                y = xp.ascontiguousarray(xp.broadcast_to(y.reshape((1, -1) + shape), (K, B) + shape))
        y = y.reshape((K * B,) + shape)
        outs[k] = y
        for m, n in enumerate(u.steps):
            vals[steps[n][0]] = y[m * B:(m + 1) * B]
        return ins, y, d

    def _run_pieces(self, u: Unit, xp, vals: dict, outs: dict, k: int, B: int):
        i, op, args, a, spec, shape = self.plan.steps[u.steps[0]]
        ins = [vals[j] for j in args]
        y3 = pieces_forward(xp, op.name, ins, u.pieces, shape[0] // u.pieces, B)
        outs[k] = y3.reshape(-1, y3.shape[2])
        for n, piece in u.piece_of.items():
            vals[self.plan.steps[n][0]] = y3[piece]
        return ins, y3, None
