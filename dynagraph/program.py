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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .ops.base import Sliced, SparseRows, reduce_to, size_of

MODES = (None, "naive", "planned")
STEP, GROUP, PIECES, FUSED = 0, 1, 2, 3
_LINEAR = ("matmul", "affine")
_NEVER_GROUP = {"pick_range", "block_output", "placeholder"}


@dataclass
class Unit:
    kind: int
    steps: list                  # step indices (into plan.steps), in kernel order
    args: list = field(default_factory=list)   # per position: an argument spec (see _arg)
    pieces: int = 1              # PIECES: number of equal slices of the output
    piece_of: dict = field(default_factory=dict)   # PIECES: pick_range step -> slice index
    inputs: list = field(default_factory=list)     # FUSED: the chain's outside arguments
    chain: object = None                           # FUSED: a fusion.FusedChain


@dataclass
class Counts:
    """Memory kernels (copies) and bytes moved by the last forward and backward."""
    forward_copies: int = 0
    forward_bytes: int = 0
    backward_copies: int = 0
    backward_bytes: int = 0


# ====================================================================== one step
def step_forward(be, kernels: dict, step: tuple, vals: dict, data_of: Callable) -> tuple:
    """Run one traced step over the batch, store its value; returns what backward needs."""
    i, op, args, a, spec, shape = step
    d = data_of(spec) if op.uses_data else None
    ins = [vals[j] for j in args]
    y = kernels.get(op.name, op.forward)(be.xp, a, d, *ins)
    vals[i] = y = y.reshape((y.shape[0],) + shape)
    return ins, y, d


def step_backward(be, kernels: dict, step: tuple, saved: tuple, acc: "Grads", needs: dict,
                  divert: Callable | None = None, n: int = -1) -> None:
    """The gradient of one step's inputs from its output gradient in `acc`.
    `divert(n, args, ins, g, want)` may clear entries of `want` to take them elsewhere."""
    i, op, args, a, spec, shape = step
    gi = acc.pop(i)
    if gi is None or op.backward is None or not needs.get(i, False):
        return
    ins, y, d = saved
    want = [needs.get(j, False) for j in args]
    if divert is not None:
        divert(n, args, ins, gi, want)
    gxs = kernels.get(op.name, op.backward)(be.xp, a, d, ins, y, gi, tuple(want))
    for j, x, gx, w in zip(args, ins, gxs, want):
        if gx is not None and w:
            acc.add(j, gx, x.shape)


# ======================================================================= compiling
class Program:
    """The units of one plan for one mode; `run` and `grad` mirror Plan.run_steps/grad_steps."""

    def __init__(self, plan, mode: str | None = "planned", layout=None, fuse: bool = False):
        if mode not in MODES:
            raise ValueError(f"plan mode must be one of {MODES}, got {mode!r}")
        self.plan, self.mode, self.fuse = plan, mode, fuse
        self.counts = Counts()
        self.rehomed: list = []   # parameters now stored as slices of a stacked array
        steps = plan.steps
        self.batched = _batched(plan)
        self.depth = _depths(plan)
        self.shapes = _shapes(plan)
        pieces = _piece_sources(plan, self.batched) if mode == "planned" else {}
        skip = {steps[n][0] for u in pieces.values() for n in u.piece_of} | set(pieces)
        regions = _regions(plan, self.batched, self.shapes, skip) if fuse else []
        fused = {steps[n][0] for r in regions for n in r}
        slot = {v: n for n, v in enumerate(layout.order)} if layout is not None else {}
        groups = _groups(plan, self.batched, self.depth, skip | fused, mode is not None)
        for members in groups:
            members.sort(key=lambda n: (slot.get(steps[n][0], 1 << 30), n))
        while True:  # a group that would copy more than it computes runs as single steps
            if not self._build(list(pieces.values()), groups, regions):
                regions = []  # fused regions and groups formed a cycle: drop the fusion
                groups = _groups(plan, self.batched, self.depth, skip, mode is not None)
                continue
            bad = [u for u in self.units if u.kind == GROUP and not self._pays(u)]
            if not bad:
                break
            drop = {u.steps[0] for u in bad}
            groups = [g for g in groups if g[0] not in drop] + [[n] for u in bad for n in u.steps]

    def _build(self, pieces: list, groups: list, regions: list) -> bool:
        """Units in a dependency order (False if the units' dependencies form a cycle)."""
        steps = self.plan.steps
        units = pieces + [Unit(STEP if len(g) == 1 else GROUP, g) for g in groups]
        units += [_fused_unit(self.plan, r) for r in regions]
        units = _ordered(self.plan, units, self.depth)
        if units is None:
            return False
        self.units = units
        self.home = {}          # var -> (unit number, member position)
        for k, u in enumerate(units):
            if u.kind == GROUP:
                for m, n in enumerate(u.steps):
                    self.home[steps[n][0]] = (k, m)
            elif u.kind == PIECES:
                for n, piece in u.piece_of.items():
                    self.home[steps[n][0]] = (k, piece)
        for u in units:
            if u.kind == GROUP:
                u.args = [self._arg_spec(u, p) for p in range(len(steps[u.steps[0]][2]))]
        return True

    def _colocate(self, vs: list):
        """Store the group's weights as slices of one stacked array, so that the batched
        GEMM reads them with no copy (ED-Batch lays parameters out too). Returns the
        stacked array; at run time it is used only if the weights still live there."""
        plan = self.plan
        params = [plan.leaf_params[plan.leaves.index(v)] for v in vs]
        first = params[0].values
        if len({id(p) for p in params}) < len(params) or any(
                getattr(p, "is_lookup", False) or p.values.shape != first.shape or p.values.dtype != first.dtype
                for p in params):
            return None
        if all(p.values.base is not None and p.values.base is first.base for p in params) and \
                _consecutive_views([p.values for p in params]):
            return first.base  # another program already stacked them in this order
        base = np.stack([p.values for p in params])
        for k, p in enumerate(params):
            p.values = base[k]
        self.rehomed.extend(params)
        return base

    def _pays(self, u: Unit) -> bool:
        """Copying an operand list costs about what an elementwise kernel over it costs. In
        planned mode a group whose operands the layout could not make consecutive (block
        inputs, say) runs as separate kernels instead of gathering; in naive mode a group is
        kept unless a copied operand is larger than the member's output (stacking per-call
        matrices for matrix-vector products, as in MV-RNN, costs more than it saves)."""
        steps = self.plan.steps
        if self.mode == "planned" and any(spec[0] == "stack" for spec in u.args):
            return False  # the layout could not make it contiguous: separate kernels, no copy
        out = size_of(steps[u.steps[0]][5])
        for spec, var in zip(u.args, steps[u.steps[0]][2]):
            copied = spec[0] == "stack" or (spec[0] == "same" and self.batched[var] and
                                             steps[u.steps[0]][1].name not in _LINEAR)
            if copied and size_of(self.shapes[var]) > out:
                return False
        return True

    def _arg_spec(self, u: Unit, p: int) -> tuple:
        """How position p of group u is assembled: ("same", var), ("weights", vars),
        ("view", unit, first member) or ("stack", vars)."""
        steps = self.plan.steps
        vs = [steps[n][2][p] for n in u.steps]
        if vs.count(vs[0]) == len(vs):
            return ("same", vs[0])
        if not self.batched[vs[0]]:
            return ("weights", vs, self._colocate(vs) if self.mode == "planned" else None)
        if self.mode == "planned":
            homes = [self.home.get(v) for v in vs]
            if homes[0] is not None and all(h is not None and h[0] == homes[0][0] and h[1] == homes[0][1] + m
                                            for m, h in enumerate(homes)):
                return ("view", homes[0][0], homes[0][1])
        return ("stack", vs)

    # ------------------------------------------------------------------ forward
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
                        and _consecutive_views([w[0] for w in ws]) and ws[0][0].ctypes.data == base.ctypes.data:
                    ins.append(base)  # the weights are the stacked array: no copy
                else:
                    ins.append(self._gathered(xp, ws))
            else:
                ins.append(self._gathered(xp, [vals[v] for v in spec[1]]))
        d = None
        if op.uses_data:
            d = [x for n in u.steps for x in data_of(steps[n][4])]
        if linear:
            y = _linear_forward(xp, op.name, ins, u.args, K, B)
        else:
            y = be.forward_kernels.get(op.name, op.forward)(xp, a, d, *ins)
        y = y.reshape((K * B,) + shape)
        outs[k] = y
        for m, n in enumerate(u.steps):
            vals[steps[n][0]] = y[m * B:(m + 1) * B]
        return ins, y, d

    def _run_pieces(self, u: Unit, xp, vals: dict, outs: dict, k: int, B: int):
        i, op, args, a, spec, shape = self.plan.steps[u.steps[0]]
        ins = [vals[j] for j in args]
        P = u.pieces
        h = shape[0] // P
        y3 = None
        for w, x in _products(op.name, ins):
            p = xp.matmul(x[None], w[0].reshape(P, h, -1).transpose(0, 2, 1))  # (P, B, h)
            y3 = p if y3 is None else y3 + p
        if op.name == "affine":
            y3 = y3 + ins[0].reshape(ins[0].shape[0], P, h).transpose(1, 0, 2)
        y3 = xp.ascontiguousarray(xp.broadcast_to(y3, (P, B, h)))
        outs[k] = y3.reshape(P * B, h)
        for n, piece in u.piece_of.items():
            vals[self.plan.steps[n][0]] = y3[piece]
        return ins, y3, None

    # ----------------------------------------------------------------- backward
    def grad(self, be, acc: "UnitGrads", saved: list, need: tuple) -> list:
        plan = self.plan
        needs = plan._needs(need)
        kernels = be.backward_kernels
        c = self.counts
        c.backward_copies = c.backward_bytes = 0
        for k in range(len(self.units) - 1, -1, -1):
            u = self.units[k]
            if u.kind == STEP:
                step_backward(be, kernels, plan.steps[u.steps[0]], saved[k], acc, needs)
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
            gxs = _linear_backward(be.xp, op.name, ins, u.args, g, want, K, B)
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
        """The piece-major product's gradients straight from the (P, B, h) gradient:
        batched GEMMs per slice, so no transposing copy back to (B, n)."""
        i, op, args, a, spec, shape = self.plan.steps[u.steps[0]]
        g3 = acc.take(k)
        if g3 is None or not needs.get(i, False):
            return
        xp = be.xp
        ins, y3, d = saved
        P, B, h = y3.shape
        g3 = g3.reshape(P, B, h)
        if op.name == "affine" and needs.get(args[0], False):
            acc.add(args[0], g3.sum(axis=1).reshape(1, P * h), ins[0].shape)
        first = 1 if op.name == "affine" else 0
        for p in range(first, len(args) - 1, 2):
            w, x = ins[p], ins[p + 1]
            if needs.get(args[p], False):
                gw = xp.matmul(g3.transpose(0, 2, 1), x[None])          # (P, h, X)
                acc.add(args[p], gw.reshape((1,) + w.shape[1:]), w.shape)
            if needs.get(args[p + 1], False):
                gx = xp.matmul(g3, w[0].reshape(P, h, -1)).sum(axis=0)  # (B, X)
                acc.add(args[p + 1], gx, x.shape)

    # ----------------------------------------------------------------- teaching
    def describe(self) -> str:
        steps = self.plan.steps
        lines = [f"program ({self.mode}): {len(self.units)} kernels for {len(steps)} steps"]
        for k, u in enumerate(self.units):
            names = ", ".join(f"%{steps[n][0]}" for n in u.steps)
            op = steps[u.steps[0]][1].name
            if u.kind == STEP:
                lines.append(f"  #{k} {op} {names}")
            elif u.kind == PIECES:
                lines.append(f"  #{k} {op} {names} written as {u.pieces} slices (piece-major)")
            elif u.kind == FUSED:
                ops = " ".join(steps[n][1].name for n in u.steps)
                lines.append(f"  #{k} fused [{ops}] {names}")
            else:
                how = []
                for p, s in enumerate(u.args):
                    how.append(f"arg{p}: " + {"same": "shared", "view": "in place", "weights": "stacked weights",
                                               "stack": "GATHER"}[s[0]])
                lines.append(f"  #{k} {op} x{len(u.steps)} [{names}] " + "; ".join(how))
        return "\n".join(lines)


# ---------------------------------------------------------------- compile helpers
def _batched(plan) -> dict:
    """Which variables have one row per call (True) rather than one shared row."""
    out = {i: True for i in plan.inputs}
    out.update({i: False for i in plan.leaves})
    for i, op, args, a, spec, shape in plan.steps:
        out[i] = op.uses_data or any(out[j] for j in args)
    return out


def _depths(plan) -> dict:
    depth = {i: 0 for i in plan.inputs + plan.leaves}
    for i, op, args, a, spec, shape in plan.steps:
        depth[i] = 1 + max((depth[j] for j in args), default=0)
    return depth


def _weight_positions(op, args: list, shapes: dict, batched: dict) -> set:
    """Positions of a product whose shared weights may differ inside a group: matrices
    times batched vectors (and an affine's shared bias)."""
    if op.name not in _LINEAR:
        return set()
    first = 1 if op.name == "affine" else 0
    pos = set()
    for k in range(first, len(args) - 1, 2):
        w, x = args[k], args[k + 1]
        if batched[w] or not batched[x] or len(shapes[w]) != 2 or len(shapes[x]) != 1:
            return set()
        pos.add(k)
    if op.name == "affine":
        if batched[args[0]] or len(shapes[args[0]]) != 1:
            return set()
        pos.add(0)
    return pos


def _groups(plan, batched: dict, depth: dict, skip: set, batching: bool) -> list:
    """Step indices grouped by (op, attrs, shapes, depth, shared arguments)."""
    shapes = _shapes(plan)
    keyed: dict = {}
    order = []
    for n, (i, op, args, a, spec, shape) in enumerate(plan.steps):
        if i in skip:
            continue
        ok = batching and op.batchable and not op.leaf and not op.saves_ctx and batched[i] \
            and op.name not in _NEVER_GROUP and (not op.uses_data or spec[0] != "const")
        if not ok:
            order.append([n])
            continue
        wpos = _weight_positions(op, args, shapes, batched)
        shared = tuple("w" if p in wpos else (j if not batched[j] else "b") for p, j in enumerate(args))
        key = (op.name, repr(a), tuple(shapes[j] for j in args), tuple(shape), depth[i], shared, spec[0])
        if key not in keyed:
            keyed[key] = []
            order.append(keyed[key])
        keyed[key].append(n)
    return order


def _shapes(plan) -> dict:
    out = dict(zip(plan.inputs, plan.in_shapes))
    out.update({i: tuple(p.values.shape) for i, p in zip(plan.leaves, plan.leaf_params)})
    for i, op, args, a, spec, shape in plan.steps:
        out[i] = tuple(shape)
    return out


def _piece_sources(plan, batched: dict) -> dict:
    """GEMM outputs consumed only by equal, disjoint slices covering them: written piece-major."""
    users: dict = {}
    for n, (i, op, args, a, spec, shape) in enumerate(plan.steps):
        for j in args:
            users.setdefault(j, []).append(n)
    shapes = _shapes(plan)
    out = {}
    for n, (i, op, args, a, spec, shape) in enumerate(plan.steps):
        if op.name not in _LINEAR or len(shape) != 1 or i in plan.outputs or not batched[i]:
            continue
        if len(_weight_positions(op, args, shapes, batched)) == 0:
            continue
        cuts = _cuts(plan, users.get(i, []), shape[0])
        if cuts is not None:
            out[i] = Unit(PIECES, [n], pieces=cuts[0], piece_of=cuts[1])
    return out


def _cuts(plan, consumers: list, total: int):
    """(pieces, {pick step: slice index}) when every consumer slices one of P equal pieces."""
    ranges = {}
    for n in consumers:
        i, op, args, a, spec, shape = plan.steps[n]
        if op.name != "pick_range" or a[2] != 0:
            return None
        ranges[n] = (a[0], a[1])
    if not ranges:
        return None
    h = min(e - s for s, e in ranges.values())
    if any(e - s != h or s % h for s, e in ranges.values()):
        return None
    if total % h or total // h < 2:
        return None
    return total // h, {n: s // h for n, (s, e) in ranges.items()}


def _consecutive_views(arrays: list) -> bool:
    """Equal-sized contiguous arrays that follow each other in memory."""
    if not all(a.flags.c_contiguous for a in arrays):
        return False
    at = arrays[0].ctypes.data
    for a in arrays:
        if a.ctypes.data != at:
            return False
        at += a.nbytes
    return True


def _regions(plan, batched: dict, shapes: dict, skip: set) -> list:
    """Chains of elementwise steps to fuse, in step order. A region stays open until a
    step outside it reads one of its values: the fused kernel runs where its last
    member was, so nothing may need its values earlier."""
    from .fusion import MAX_REGS, fusable
    region_of: dict = {}     # var -> region (a list of step indices)
    regs: dict = {}          # region id -> values it may hold (a chain has at most MAX_REGS)
    open_: set = set()       # ids of regions still open
    regions = []
    for n, (i, op, args, a, spec, shape) in enumerate(plan.steps):
        if i in skip:  # a piece-major GEMM or its slices: a reader outside every region
            open_.difference_update(id(region_of[j]) for j in args if j in region_of)
            continue
        ok = batched[i] and not op.uses_data and fusable(op, a, [shapes[j] for j in args], shape)
        mine = {id(region_of[j]): region_of[j] for j in args if j in region_of and id(region_of[j]) in open_}
        if not ok:
            open_.difference_update(mine)
            continue
        if mine and sum(regs[k] for k in mine) + 1 + len(args) > MAX_REGS:
            open_.difference_update(mine)  # full: close it, start a new chain
            mine = {}
        if mine:
            rs = list(mine.values())
            r = rs[0]
            regs[id(r)] = sum(regs[k] for k in mine) + 1 + len(args)
            for other in rs[1:]:  # both still open: nothing outside has read either yet
                r.extend(other)
                open_.discard(id(other))
                for m in other:
                    region_of[plan.steps[m][0]] = r
            r.append(n)
            r.sort()
        else:
            r = [n]
            regions.append(r)
            open_.add(id(r))
            regs[id(r)] = 1 + len(args)
        region_of[i] = r
    seen, out = set(), []
    for r in regions:
        if id(r) not in seen and len(r) > 1 and all(region_of[plan.steps[m][0]] is r for m in r):
            seen.add(id(r))
            out.append(r)
    return out


def _fused_unit(plan, members: list) -> Unit:
    from .fusion import FusedChain
    pos = {plan.steps[n][0]: m for m, n in enumerate(members)}
    inputs: list = []
    chain = []
    for n in members:
        i, op, args, a, spec, shape = plan.steps[n]
        refs = []
        for j in args:
            if j in pos:
                refs.append(("step", pos[j]))
            else:
                if j not in inputs:
                    inputs.append(j)
                refs.append(("in", inputs.index(j)))
        chain.append((op, a, refs))
    k = len(inputs)
    steps = [(op, a, [r if kind == "in" else k + r for kind, r in refs]) for op, a, refs in chain]
    return Unit(FUSED, list(members), inputs=inputs, chain=FusedChain(steps, k))


def _ordered(plan, units: list, depth: dict) -> list | None:
    """Units in a dependency order, shallowest first (None on a cycle)."""
    import heapq
    owner = {}
    for k, u in enumerate(units):
        for n in u.steps + list(u.piece_of):
            owner[plan.steps[n][0]] = k
    deps = [set() for _ in units]
    users = [[] for _ in units]
    for k, u in enumerate(units):
        for n in u.steps + list(u.piece_of):
            for j in plan.steps[n][2]:
                d = owner.get(j)
                if d is not None and d != k and d not in deps[k]:
                    deps[k].add(d)
                    users[d].append(k)
    key = [(min(depth[plan.steps[n][0]] for n in u.steps), min(u.steps)) for u in units]
    heap = [(key[k], k) for k in range(len(units)) if not deps[k]]
    heapq.heapify(heap)
    left = [len(d) for d in deps]
    out = []
    while heap:
        _, k = heapq.heappop(heap)
        out.append(units[k])
        for v in users[k]:
            left[v] -= 1
            if not left[v]:
                heapq.heappush(heap, (key[v], v))
    return out if len(out) == len(units) else None


# ------------------------------------------------------------ grouped products
def _products(name: str, ins: list):
    first = 1 if name == "affine" else 0
    return [(ins[k], ins[k + 1]) for k in range(first, len(ins) - 1, 2)]


def _as_group(x, spec, K: int):
    """(K or 1, rows, ...) view of a group argument."""
    if spec[0] == "same":
        return x[None]
    return x.reshape((K, x.shape[0] // K) + x.shape[1:])


def _linear_forward(xp, name: str, ins: list, specs: list, K: int, B: int):
    """K products with different weights: one batched GEMM, (K, B, n)."""
    first = 1 if name == "affine" else 0
    y = None
    for k in range(first, len(ins) - 1, 2):
        w = ins[k]                                        # (K, n, X) stacked or (1, n, X) shared
        x = _as_group(ins[k + 1], specs[k + 1], K)     # (K, B, X) or (1, B, X)
        p = xp.matmul(x, w.transpose(0, 2, 1))
        y = p if y is None else y + p
    if name == "affine":
        b = ins[0]  # (K, n) stacked or (1, n) shared
        y = y + b[:, None, :]
    return xp.broadcast_to(y, (K, B, y.shape[-1])).reshape(K * B, -1)


def _linear_backward(xp, name: str, ins: list, specs: list, g, want: tuple, K: int, B: int) -> list:
    g3 = g.reshape(K, B, -1)
    out = [None] * len(ins)
    first = 1 if name == "affine" else 0
    if name == "affine" and want[0]:
        gb = g3.sum(axis=1)                                   # (K, n)
        out[0] = gb if specs[0][0] == "weights" else gb.sum(axis=0, keepdims=True)
    for k in range(first, len(ins) - 1, 2):
        w = ins[k]
        x = _as_group(ins[k + 1], specs[k + 1], K)
        if want[k]:
            gw = xp.matmul(g3.transpose(0, 2, 1), x if x.shape[0] == K else xp.broadcast_to(x, (K,) + x.shape[1:]))
            out[k] = gw if specs[k][0] == "weights" else gw.sum(axis=0, keepdims=True)
        if want[k + 1]:
            gx = xp.matmul(g3, w)                             # (K, B, X)
            out[k + 1] = gx.reshape(K * B, -1) if x.shape[0] == K else gx.sum(axis=0)
    return out


# ================================================================== gradients
class Grads:
    """Gradients of a plan's variables. Buffers it allocated are updated in place;
    arrays handed over by an op (which may alias its output gradient) are copied on write."""

    def __init__(self, xp):
        self.xp = xp
        self.g: dict = {}
        self.owned: set = set()
        self.sparse: dict = {}

    def add(self, i: int, gx, shape: tuple | None = None) -> None:
        if isinstance(gx, SparseRows):
            self.sparse.setdefault(i, []).append(gx)
            return
        if isinstance(gx, Sliced):
            buf = self._own(i, gx.shape if shape is None or shape[0] != 1 else shape, gx.vals.dtype)
            buf[(slice(None),) + gx.index] += gx.vals if buf.shape[0] == gx.vals.shape[0] \
                else gx.vals.sum(axis=0, keepdims=True)
            return
        if shape is not None and shape[0] == 1 and gx.shape[0] != 1:
            gx = reduce_to(gx, shape)  # a shared argument: sum over the batch
        old = self.g.get(i)
        if old is None:
            self.g[i] = gx
        elif i in self.owned and old.shape == np.broadcast_shapes(old.shape, gx.shape):
            old += gx
        else:
            self.g[i] = old + gx
            self.owned.add(i)

    def _own(self, i: int, shape: tuple, dtype):
        old = self.g.get(i)
        if old is None:
            buf = self.xp.zeros(shape, dtype=dtype)
        elif i in self.owned:
            return old
        else:
            buf = old.copy()
        self.g[i] = buf
        self.owned.add(i)
        return buf

    def pop(self, i: int):
        self.owned.discard(i)
        return self.g.pop(i, None)

    def result(self, i: int):
        if i in self.sparse:
            parts = self.sparse[i]
            return SparseRows(np.concatenate([p.idx for p in parts]),
                              self.xp.concatenate([p.vals for p in parts]))
        return self.g.get(i)


class UnitGrads(Grads):
    """Grads whose group members and slices live in one buffer per unit, so a
    consumer that read a group in place adds its gradient back in one call."""

    def __init__(self, xp, program: Program, B: int, dtype):
        super().__init__(xp)
        self.program, self.B, self.dtype = program, B, dtype
        self.buf: dict = {}

    def _buffer(self, k: int):
        buf = self.buf.get(k)
        if buf is None:
            u = self.program.units[k]
            shape = self.program.plan.steps[u.steps[0]][5]
            if u.kind == PIECES:
                shape = (shape[0] // u.pieces,)
            rows = (len(u.steps) if u.kind == GROUP else u.pieces) * self.B
            buf = self.buf[k] = self.xp.zeros((rows,) + tuple(shape), dtype=self.dtype)
        return buf

    def add(self, i: int, gx, shape: tuple | None = None) -> None:
        home = self.program.home.get(i)
        if home is None:
            return super().add(i, gx, shape)
        k, m = home
        view = self._buffer(k)[m * self.B:(m + 1) * self.B]
        if isinstance(gx, Sliced):
            view[(slice(None),) + gx.index] += gx.vals
        else:
            view += gx

    def add_range(self, k: int, start: int, gx) -> None:
        self._buffer(k)[start:start + gx.shape[0]] += gx

    def take(self, k: int):
        return self.buf.pop(k, None)
