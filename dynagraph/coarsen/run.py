"""Running coarsened groups: one compiled plan (dy.block's `Plan`/`Program`) per pattern,
a schedule over units (instances and the nodes left op-level), and the backward record.

Every member node keeps its own value block (a view of the plan's value, no copy),
so later batches, `.value()`, `gradient()` of a root and autodiff see what op-by-op
execution leaves. The record's `grad` replays the plan in reverse from the gradients
that arrived in the members' blocks and scatters the results to the outside inputs.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict

from .. import executor
from ..autodiff import scatter
from ..config import config
from ..errors import NonFiniteError
from ..executor import LEAF, SLICE, ExecutedBatch, any_true
from ..graph import ComputationGraph, IndexSlot
from ..ops.base import Sliced, SparseRows
from ..program import Grads, UnitGrads
from ..program.units import PIECES
from ..stats import count_block_copies
from ..subgraph import PLACEHOLDER, Plan
from .detect import DEFER_HEIGHT, Head, heads, payloads

_PLANS: OrderedDict[tuple, Plan] = OrderedDict()   # canonical key -> compiled plan
_MAX_PLANS = 256
# How a group's backward runs: "batches" hands autodiff one batch per member position (its
# compiled per-batch step, the op-level kernels), "replay" replays the plan step by step in
# Python (CoarseRecord.grad). DYNAGRAPH_COARSEN_BACKWARD chooses; see member_batches.
BACKWARD = os.environ.get("DYNAGRAPH_COARSEN_BACKWARD", "batches")


def plan_for(cg, p: Head) -> tuple[Plan, list]:
    """The compiled plan of pattern p (cached across graphs by a graph-independent key) and
    the graph's node ids of its parameters, in the plan's leaf order."""
    canon = (_canonical(cg.signatures, p.key), config.block_plan, cg.dtype.str)
    plan = _PLANS.get(canon)
    if plan is None:
        plan = _PLANS[canon] = _trace(cg, p)
        if len(_PLANS) > _MAX_PLANS:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(canon)
    if plan.program is not None and plan.program.rehomed:
        cg.rebind(plan.program.rehomed)   # the planned layout stacked some weights
    return plan, [cg.leaf(prm, upd) for prm, upd in zip(plan.leaf_params, plan.leaf_update)]


def _canonical(sigs: list, key: tuple) -> tuple:
    """The key with each signature id replaced by the signature itself (ids are per graph)."""
    out, k = [], 0
    while k < len(key):
        n = key[k + 1]
        out.append((sigs[key[k]], key[k + 2:k + 2 + n]))
        k += 2 + n
    return tuple(out)


def _trace(cg, p: Head) -> Plan:
    """Re-record the first instance into a private trace graph: outside inputs become
    placeholders (or the same parameters), per-node data becomes index slots."""
    ms, ext = p.members, p.externals
    trace = ComputationGraph(scheduler="none")
    trace.tracing = True
    trace.dtype = cg.dtype
    ids: dict = {}
    inputs = []
    for a in ext:
        if cg.op[a].leaf:
            ids[a] = trace.leaf(cg.attrs[a][1], cg.sig_part[a][2])
        else:
            ids[a] = trace.placeholder(PLACEHOLDER, cg.shape[a])
            inputs.append(ids[a])
    slot = 0
    for n in ms:
        op = cg.op[n]
        d = None
        if op.uses_data:
            d = IndexSlot(slot)
            slot += 1
        ids[n] = trace.add(op, tuple(ids[a] for a in cg.args[n]), cg.attrs[n], d)
    ops = "+".join(sorted({cg.op[n].name for n in ms}))
    # no fused chains: their C backward keeps the chain's inner gradients to itself, and
    # gradient() of every node of the group must equal op-level autodiff's; no piece-major
    # products: every member, the sliced product too, keeps its own (B, n) value, and a
    # product that is a single step hands its weight gradient to autodiff's one GEMM
    plan = Plan(f"coarse[{ops}]", trace, inputs, [ids[ms[-1]]], config.block_plan, False, piece_major=False)
    plan.positions = [ids[n] for n in ms]           # trace id of member position m
    plan.ext_is_input = [not cg.op[a].leaf for a in ext]
    plan.weight_products = _weight_products(plan, trace)
    return plan


def _weight_products(plan: Plan, trace) -> dict:
    """step index -> [(W position, x position, leaf number)] for the products W x of a step
    with W one of the plan's parameters and x a vector per instance: their weight gradient
    is left to autodiff, which sums G^T X over every batch and group in one GEMM."""
    leaf_at = {i: k for k, i in enumerate(plan.leaves)}
    out: dict = {}
    for n, (i, op, args, a, spec, shape) in enumerate(plan.steps):
        if op.weight_products is None or len(shape) != 1:
            continue
        found = [(w, x, leaf_at[args[w]]) for w, x in op.weight_products(len(args))
                 if args[w] in leaf_at and len(trace.shape[args[w]]) == 2 and len(trace.shape[args[x]]) == 1]
        if found:
            out[n] = found
    return out


class CoarseRecord:
    """One coarsened group's forward, kept for backward (an entry of cg.executed)."""

    __slots__ = ("B", "bids", "cols", "groups", "leads", "plan", "plans", "saved", "steps", "xs")

    def __init__(self, plan, steps, bids, xs, plans, cols, saved, B, leads, delegated: bool = False):
        """delegated: the members' backward runs as op-level batches that follow this record
        in cg.executed (member_batches); then `steps` is empty (executed_batches() lists
        those batches instead) and grad() does nothing. `groups` is every member position's
        nodes either way."""
        self.plan, self.bids, self.xs, self.plans = plan, bids, xs, plans
        self.groups, self.steps = steps, ([] if delegated else steps)
        self.cols, self.saved, self.B, self.leads = cols, saved, B, leads

    @property
    def nodes(self) -> list:
        """Every member node (what revert() and set_data() look at)."""
        return [n for s in self.groups for n in s]

    def grad(self, cg, be, gb, full: bool, grad_block, deferred: dict | None = None) -> None:
        """Replay the plan in reverse from the gradients in the members' blocks. With
        `deferred` (autodiff's parameter block -> [(G, X)]), the weight gradients of the
        plan's single-step products go there instead of being computed per group."""
        if not self.steps:  # delegated to the member batches
            return
        t0 = time.perf_counter()
        plan, B, xp = self.plan, self.B, be.xp
        gs = [gb[b] for b in self.bids]
        if all(g is None for g in gs):
            return
        if full:
            need = (True,) * len(self.cols)
        else:
            need = tuple(any_true(cg.needs_grad, ids) for ids in self.cols)
            if True not in need:
                return
        prog = plan.program
        dtype = cg.dtype
        acc = _Captured(xp) if prog is None else _CapturedUnits(xp, prog, B, dtype)
        shapes = {i: shape for i, _, _, _, _, shape in plan.steps}
        for t, g, lead in zip(plan.positions, gs, self.leads):
            if g is not None:
                acc.add(t, g, (lead,) + shapes[t] if lead == 1 else g.shape)
        divert = self._divert(deferred) if deferred is not None and plan.weight_products else None
        if prog is not None:
            gxs = prog.grad(be, acc, self.saved, need, divert)
        else:
            gxs = plan.grad_steps(be, acc, self.saved, need, divert)
        self._node_grads(gb, acc, B, xp)
        t1 = time.perf_counter()
        stats = cg.stats
        stats.t_backward += t1 - t0
        stats.kernel_calls += plan.op.inner_kernels
        if prog is not None:
            count_block_copies(prog.counts.backward_copies, prog.counts.backward_bytes,
                               prog.saved(B, dtype.itemsize, True), stats)
        for k, pl in enumerate(self.plans):
            gx = gxs[k]
            if not need[k] or gx is None:
                continue
            if pl[0] != LEAF and not isinstance(gx, (SparseRows, Sliced)) and gx.shape[0] != B:
                gx = xp.broadcast_to(gx, (B,) + gx.shape[1:])
            scatter(cg, be, gb, pl, gx, stats)
        stats.t_memory += time.perf_counter() - t1

    def _divert(self, deferred: dict):
        """program.step_backward's divert: (G, X) of each parameter product to `deferred`,
        under the conditions of autodiff._defer_weight_grads (a shared (1, n, m) weight, a
        (B, m) input, a (B, n) output gradient)."""
        products = self.plan.weight_products
        first_leaf = len(self.plan.inputs)
        plans = self.plans

        def divert(n, args, ins, gi, want):
            for w, x, k in products.get(n, ()):
                W, X = ins[w], ins[x]
                if want[w] and W.ndim == 3 and W.shape[0] == 1 and X.ndim == 2 and gi.ndim == 2 and \
                        X.shape[0] == gi.shape[0] and gi.shape[1] == W.shape[1] and X.shape[1] == W.shape[2]:
                    want[w] = False
                    deferred.setdefault(plans[first_leaf + k][1], []).append((gi, X))
        return divert

    def _node_grads(self, gb, acc, B: int, xp) -> None:
        """Each member's total gradient into its block's gradient, as op-level autodiff
        leaves it (gradient() of any node of the group)."""
        prog = self.plan.program
        for t, bid in zip(self.plan.positions, self.bids):
            g = _unit_grad(prog, acc.seen_units, t, B, xp) if prog is not None else None
            whole = acc.seen.get(t)
            if g is None:
                g = whole
            elif whole is not None and t not in prog.home:  # a piece-major product read whole too
                g = g + whole
            if g is not None and type(g) is not Sliced and type(g) is not SparseRows:
                if g.shape[0] != B:
                    g = xp.broadcast_to(g, (B,) + g.shape[1:])
                gb[bid] = g if g.flags.c_contiguous else xp.ascontiguousarray(g)


def _unit_grad(prog, seen_units: dict, t: int, B: int, xp):
    """A member's gradient from the unit buffer it lived in (a group, or a piece-major product)."""
    home = prog.home.get(t)
    if home is not None:
        buf = seen_units.get(home[0])
        return None if buf is None else buf[home[1] * B:(home[1] + 1) * B]
    k = prog.pieces_unit.get(t)
    if k is None:
        return None
    buf = seen_units.get(k)
    if buf is None:
        return None
    P = prog.units[k].pieces
    h = buf.shape[-1]
    return xp.ascontiguousarray(buf.reshape(P, B, h).transpose(1, 0, 2)).reshape(B, P * h)


class _Seen:
    """Keeps every variable's gradient as the replay takes it (its total by then)."""

    def pop(self, i: int):
        g = super().pop(i)
        if g is not None:
            self.seen[i] = g
        return g

    def take(self, k: int):
        g = super().take(k)
        if g is not None:
            self.seen_units[k] = g
        return g


class _Captured(_Seen, Grads):
    def __init__(self, xp):
        super().__init__(xp)
        self.seen, self.seen_units = {}, {}


class _CapturedUnits(_Seen, UnitGrads):
    def __init__(self, xp, program, B: int, dtype):
        super().__init__(xp, program, B, dtype)
        self.seen, self.seen_units = {}, {}


def run_group(cg, be, plan: Plan, leaf_ids: list, payload: tuple) -> None:
    """Run a group of instances of one pattern as one call of its plan. payload: per member
    position the instances' node ids, per outside argument the same, per instance its
    per-node data (detect.payloads)."""
    stats = cg.stats
    xp = be.xp
    t0 = time.perf_counter()
    by_member, by_position, data = payload
    B = len(data)
    cols = [ids for ids, inp in zip(by_position, plan.ext_is_input) if inp]
    xs, plans = [], []
    for ids in cols:
        x, pl = executor.gather(cg, be, ids, stats)
        xs.append(x)
        plans.append(pl)
    for leaf in leaf_ids:
        b = cg.blk[leaf]
        xs.append(cg.blocks[b])
        plans.append((LEAF, b, None))
        cols.append((leaf,))
    t1 = time.perf_counter()
    data_of = lambda spec: plan._data(spec, data)
    if plan.program is not None:
        vals, saved = plan.program.run(be, xs, data_of, B)
    else:
        vals, saved = plan.run_steps(be, xs, data_of)
    t2 = time.perf_counter()
    steps, bids, leads = [], [], []
    dtype = cg.dtype
    for m, t in enumerate(plan.positions):
        v = vals.get(t)
        if v is None:
            v = _piece_value(plan, saved, t, xp)
        leads.append(v.shape[0])
        if v.shape[0] != B:  # computed from parameters alone: one shared row
            v = xp.broadcast_to(v, (B,) + v.shape[1:])
        v = xp.ascontiguousarray(v, dtype=dtype)
        nodes = by_member[m]
        if cg.check_validity and not bool(be.to_host(xp.isfinite(v).all())):  # one explicit scalar copy
            op = cg.op[nodes[0]]
            raise NonFiniteError(f"{op.name} produced a non-finite value (nodes {list(nodes)[:5]}..., "
                                 f"in coarsened group {plan.name})")
        bid = len(cg.blocks)
        cg.blocks.append(v)
        executor.place(cg.blk, cg.row, nodes, bid)
        steps.append(nodes)
        bids.append(bid)
    batches = member_batches(cg, plan, steps, bids, xs, plans, cols, leads, B) if BACKWARD == "batches" else None
    cg.executed.append(CoarseRecord(plan, steps, bids, xs, plans, cols, saved, B, leads, batches is not None))
    if batches is not None:
        cg.executed.extend(batches)
    stats.kernel_calls += plan.op.inner_kernels
    stats.batches += 1
    stats.nodes += B * len(plan.positions)
    stats.coarse_groups += 1
    stats.coarse_nodes += B * len(plan.positions)
    if plan.program is not None:
        c = plan.program.counts
        count_block_copies(c.forward_copies, c.forward_bytes, plan.program.saved(B, dtype.itemsize), stats)
    stats.t_execute += t2 - t1
    stats.t_memory += (t1 - t0) + (time.perf_counter() - t2)
    if stats.batch_log is not None and len(stats.batch_log) < 100_000:
        stats.batch_log.append((f"{plan.name}/{len(plan.positions)}", B))


def member_batches(cg, plan: Plan, steps: list, bids: list, xs: list, plans: list, cols: list, leads: list,
                   B: int) -> list | None:
    """The group's backward as op-level batches: per member position (in forward order) an
    ExecutedBatch over the instances' nodes, each argument where its value lies (another
    member's block, the group's gathered outside input, a parameter), so that autodiff runs
    every member's backward with the kernels op-level execution uses (its compiled step on
    the cpu backend) and leaves every member's gradient in its block. An argument's column
    (what autodiff derives `need` from) is the other member's nodes, the gathered input's
    ids, or the parameter's one node. None where a member does not map onto a batch (an
    output with one shared row, a step the plan does not list)."""
    wiring = _member_wiring(plan)
    if wiring is None or any(lead != B for lead in leads):
        return None
    blocks = cg.blocks
    # sources: the members, then the group's arguments (outside inputs, then parameters)
    X = [blocks[b] for b in bids] + xs
    P = [(SLICE, b, 0) for b in bids] + plans
    C = steps + cols
    return [ExecutedBatch(nodes, [X[i] for i in w], bid, [P[i] for i in w], tuple([C[i] for i in w]))
            for nodes, bid, w in zip(steps, bids, wiring)]


def _member_wiring(plan: Plan) -> list | None:
    """Per member position, the sources of its step's arguments as indexes into member
    positions then the plan's inputs then its leaves (member_batches' X, P, C); cached on the
    plan. None if a member is not a step of the plan."""
    wiring = getattr(plan, "member_wiring", False)
    if wiring is not False:
        return wiring
    M, n_in = len(plan.positions), len(plan.inputs)
    where = {t: m for m, t in enumerate(plan.positions)}
    where.update({t: M + k for k, t in enumerate(plan.inputs)})
    where.update({t: M + n_in + k for k, t in enumerate(plan.leaves)})
    step_args = {i: args for i, op, args, a, spec, shape in plan.steps}
    wiring = []
    for t in plan.positions:
        args = step_args.get(t)
        if args is None or any(a not in where for a in args):
            wiring = None
            break
        wiring.append(tuple(where[a] for a in args))
    plan.member_wiring = wiring
    return wiring


def _piece_value(plan: Plan, saved: list, t: int, xp):
    """A piece-major product's own value, (B, P*h), from its (P, B, h) output (only when a
    node of the graph is that product; the plan's steps read the slices)."""
    prog = plan.program
    for k, u in enumerate(prog.units):
        if u.kind == PIECES and plan.steps[u.steps[0]][0] == t:
            y3 = saved[k][1]
            P, B, h = y3.shape
            return xp.ascontiguousarray(y3.transpose(1, 0, 2)).reshape(B, P * h)
    raise KeyError(f"coarsened plan {plan.name}: no value for trace node {t}")


def _defer(asap: list, readers: list) -> list:
    """Final unit levels: as soon as possible, except the deferred units (those at most
    DEFER_HEIGHT from a sink, read only by deferred units), which run at top - height with
    top = the largest asap + height among them: never before their own as-soon-as-possible
    level, always after what feeds them and before what reads them."""
    n = len(asap)
    height, deferred = [0] * n, [False] * n
    for u in range(n - 1, -1, -1):
        rs = readers[u]
        if not rs:
            deferred[u] = True
            continue
        h = 1 + max(height[c] for c in rs)
        height[u] = h
        deferred[u] = h <= DEFER_HEIGHT and all(deferred[c] for c in rs)
    top = max((asap[u] + height[u] for u in range(n) if deferred[u]), default=0)
    return [top - height[u] if deferred[u] else asap[u] for u in range(n)]


class Coarsened:
    """A chunk of pending nodes with its coarsened patterns: scheduled over units and run."""

    def __init__(self, cg, pending: list, patterns: list, owner: list | None, batches: list | None = None):
        """patterns: find_patterns' patterns with owner, its instance roots, from which
        schedule() computes the unit schedule; or Heads with batches, that schedule with the
        groups' node ids, from the compiled pass (detect.plan_native)."""
        self.cg, self.pending, self.owner, self.batches = cg, pending, owner, batches
        self.found = patterns
        self.patterns = patterns if batches is not None else heads(patterns)

    def schedule(self) -> list:
        """Batches over units by unit depth: (-1, [node ids]) or (pattern index, payload)
        with the payload detect.payloads describes."""
        if self.batches is None:
            self.batches = payloads(self.found, self.schedule_py())
        return self.batches

    def schedule_py(self) -> list:
        """The unit schedule in Python (the compiled pass's twin), over instance indices:
        (-1, [node ids]) or (pattern index, [instance indices]). Units are visited in the
        order of their instance roots (a topological order, see detect.py). A unit runs one
        level after the deepest unit that feeds it (as soon as possible), except near the
        end: a unit at most DEFER_HEIGHT steps from the chunk's sinks, all of whose readers
        are such units too (a tree's root cell and its loss, a tagger's per-word losses),
        runs as late as possible, so that those of every sample share one level instead of
        one per depth. Units of one pattern (or op-level nodes of one signature) at one
        level run as one group."""
        cg = self.cg
        self.roots = {r for p in self.found for r in p.roots}   # the coarsened instances
        args, sig, ops = cg.args, cg.sig, cg.op
        owner, lo = self.owner, self.pending[0]
        span = len(owner)
        roots = self.roots
        units = []   # (instance root, node id, pattern or -1, payload)
        for pi, p in enumerate(self.found):
            units.extend([(r, r, pi, w) for w, r in enumerate(p.roots)])
        units.extend([(owner[n - lo], n, -1, n) for n in self.pending if owner[n - lo] not in roots])
        units.sort()
        index: dict = {}     # a unit's level key (its root, or its node) -> unit number
        asap, readers = [], []
        for u, (_, r, pi, payload) in enumerate(units):
            deps = args[payload] if pi < 0 else self.found[pi].externals[payload]
            lv = 0
            for a in deps:
                j = a - lo
                if 0 <= j < span:
                    o = owner[j]
                    v = index.get(o if o in roots else a)
                    if v is not None:
                        readers[v].append(u)
                        if asap[v] >= lv:
                            lv = asap[v] + 1
            index[r] = u
            asap.append(lv)
            readers.append([])
        levels = _defer(asap, readers)
        groups: dict = {}
        out = []
        for (_, r, pi, payload), lv in zip(units, levels):
            if pi < 0:
                key = (lv, -1, sig[payload]) if ops[payload].batchable else None
            else:
                key = (lv, pi, 0)
            g = groups.get(key) if key is not None else None
            if g is None:
                g = [payload]
                if key is not None:
                    groups[key] = g
                out.append((lv, r, pi, g))
            else:
                g.append(payload)
        out.sort(key=lambda t: (t[0], t[1]))
        return [(pi, g) for _, _, pi, g in out]

    def execute(self, be, batches: list) -> None:
        cg = self.cg
        stretch: list = []
        compiled = [None] * len(self.patterns)
        for pi, g in batches:
            if pi < 0:
                stretch.append(g)
                continue
            if stretch:
                executor.execute(cg, be, stretch)
                stretch = []
            if compiled[pi] is None:
                compiled[pi] = plan_for(cg, self.patterns[pi])
            plan, leaf_ids = compiled[pi]
            run_group(cg, be, plan, leaf_ids, g)
        if stretch:
            executor.execute(cg, be, stretch)
