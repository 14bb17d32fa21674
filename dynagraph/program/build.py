"""`Program`: the units of one plan for one mode, built in the planned (or trace) order,
and how each group reads its operands; running them is `Forward` and `Backward`."""
from __future__ import annotations

import numpy as np

from ..ops.base import size_of
from .backward import Backward
from .forward import Forward
from .grouping import (batched_vars, consecutive_views, fused_unit, fusion_regions, piece_sources, step_groups,
                       unit_order, var_depths, var_shapes)
from .units import FUSED, GROUP, LINEAR, MODES, PIECES, STEP, Counts, Unit


class Program(Forward, Backward):
    """The units of one plan for one mode; `run` and `grad` mirror Plan.run_steps/grad_steps."""

    def __init__(self, plan, mode: str | None = "planned", layout=None, fuse: bool = False,
                 piece_major: bool = True):
        """piece_major: in planned mode, a product that is only sliced writes its slices
        piece-major (off where the product's own value is needed anyway: coarsened groups)."""
        if mode not in MODES:
            raise ValueError(f"plan mode must be one of {MODES}, got {mode!r}")
        self.plan, self.mode, self.fuse, self.piece_major = plan, mode, fuse, piece_major
        self.counts = Counts()
        self._naive_model = None  # naive_copies' model, built on first use
        self.rehomed: list = []   # parameters now stored as slices of a stacked array
        steps = plan.steps
        self.batched = batched_vars(plan)
        self.depth = var_depths(plan)
        self.shapes = var_shapes(plan)
        pieces = piece_sources(plan, self.batched) if mode == "planned" and piece_major else {}
        skip = {steps[n][0] for u in pieces.values() for n in u.piece_of} | set(pieces)
        regions = fusion_regions(plan, self.batched, self.shapes, skip) if fuse else []
        fused = {steps[n][0] for r in regions for n in r}
        slot = {v: n for n, v in enumerate(layout.order)} if layout is not None else {}
        groups = step_groups(plan, self.batched, self.depth, skip | fused, mode is not None)
        for members in groups:
            members.sort(key=lambda n: (slot.get(steps[n][0], 1 << 30), n))
        while True:  # a group that would copy more than it computes runs as single steps
            if not self._build(list(pieces.values()), groups, regions):
                regions = []  # fused regions and groups formed a cycle: drop the fusion
                groups = step_groups(plan, self.batched, self.depth, skip, mode is not None)
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
        units += [fused_unit(self.plan, r) for r in regions]
        units = unit_order(self.plan, units, self.depth)
        if units is None:
            return False
        self.units = units
        self.home = {}          # var -> (unit number, member position)
        self.pieces_unit = {}   # a piece-major product's var -> its unit number
        for k, u in enumerate(units):
            if u.kind == GROUP:
                for m, n in enumerate(u.steps):
                    self.home[steps[n][0]] = (k, m)
            elif u.kind == PIECES:
                self.pieces_unit[steps[u.steps[0]][0]] = k
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
                consecutive_views([p.values for p in params], params[0].backend.address):
            return first.base  # another program already stacked them in this order
        base = params[0].backend.xp.stack([p.values for p in params])  # on the weights' device
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
                                             steps[u.steps[0]][1].name not in LINEAR)
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

    # ----------------------------------------------------------------- accounting
    def copy_model(self) -> tuple:
        """The copies this program's groups make for a batch of B calls, read off its units as
        (forward copies, forward elements per call, forward elements per batch, backward
        copies, backward elements per call): Forward._gathered copies a shared operand
        repeated K times or a "stack" (K*B rows), and weights not stacked by the layout (K
        rows, whatever B); Backward scatter-adds each "stack" back (K*B rows)."""
        fc = f_call = f_fixed = bc = b_call = 0
        for u in self.units:
            if u.kind != GROUP:
                continue
            K = len(u.steps)
            linear = any(s[0] == "weights" for s in u.args)
            for spec in u.args:
                kind = spec[0]
                if kind == "same" and self.batched[spec[1]] and not linear:
                    fc += 1
                    f_call += K * size_of(self.shapes[spec[1]])
                elif kind == "weights" and spec[2] is None:
                    fc += 1
                    f_fixed += sum(size_of(self.shapes[v]) for v in spec[1])
                elif kind == "stack":
                    n = sum(size_of(self.shapes[v]) for v in spec[1])
                    fc += 1
                    f_call += n
                    bc += 1
                    b_call += n
        return fc, f_call, f_fixed, bc, b_call

    def naive_copies(self, B: int, itemsize: int) -> tuple[int, int, int, int] | None:
        """For a planned program, the copies the naive program of the same plan makes for a
        batch of B calls, (forward copies, forward bytes, backward copies, backward bytes),
        from its copy model (built once, on first use): what the layout saved is that minus
        this program's measured counts. None for any other mode (nothing to compare)."""
        if self.mode != "planned":
            return None
        model = self._naive_model
        if model is None:
            model = self._naive_model = Program(self.plan, "naive", None, False, self.piece_major).copy_model()
        fc, f_call, f_fixed, bc, b_call = model
        return fc, (f_call * B + f_fixed) * itemsize, bc, b_call * B * itemsize

    def saved(self, B: int, itemsize: int, backward: bool = False) -> tuple[int, int]:
        """(copies, bytes) the layout saved in the last forward (or backward) of B calls: the
        naive program's copies less the ones this program counted; (0, 0) unless planned."""
        naive = self.naive_copies(B, itemsize)
        if naive is None:
            return 0, 0
        c = self.counts
        if backward:
            return naive[2] - c.backward_copies, naive[3] - c.backward_bytes
        return naive[0] - c.forward_copies, naive[1] - c.forward_bytes

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
