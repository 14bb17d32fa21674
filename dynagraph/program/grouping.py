"""Compiling a plan into units: which variables are batched, which steps group together,
which products are written piece-major, which elementwise chains fuse, and the units'
dependency order (shallowest first)."""
from __future__ import annotations

from typing import Any, Callable

from .units import FUSED, LINEAR, PIECES, Unit

_NEVER_GROUP = {"pick_range", "block_output", "placeholder"}


def batched_vars(plan) -> dict:
    """Which variables have one row per call (True) rather than one shared row."""
    out = {i: True for i in plan.inputs}
    out.update({i: False for i in plan.leaves})
    for i, op, args, a, spec, shape in plan.steps:
        out[i] = op.uses_data or any(out[j] for j in args)
    return out


def var_depths(plan) -> dict:
    depth = {i: 0 for i in plan.inputs + plan.leaves}
    for i, op, args, a, spec, shape in plan.steps:
        depth[i] = 1 + max((depth[j] for j in args), default=0)
    return depth


def _weight_positions(op, args: list, shapes: dict, batched: dict) -> set:
    """Positions of a product whose shared weights may differ inside a group: matrices
    times batched vectors (and an affine's shared bias)."""
    if op.name not in LINEAR:
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


def step_groups(plan, batched: dict, depth: dict, skip: set, batching: bool) -> list:
    """Step indices grouped by (op, attrs, shapes, depth, shared arguments)."""
    shapes = var_shapes(plan)
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


def var_shapes(plan) -> dict:
    out = dict(zip(plan.inputs, plan.in_shapes))
    out.update({i: tuple(p.values.shape) for i, p in zip(plan.leaves, plan.leaf_params)})
    for i, op, args, a, spec, shape in plan.steps:
        out[i] = tuple(shape)
    return out


def piece_sources(plan, batched: dict) -> dict:
    """GEMM outputs consumed only by equal, disjoint slices covering them: written piece-major."""
    users: dict = {}
    for n, (i, op, args, a, spec, shape) in enumerate(plan.steps):
        for j in args:
            users.setdefault(j, []).append(n)
    shapes = var_shapes(plan)
    out = {}
    for n, (i, op, args, a, spec, shape) in enumerate(plan.steps):
        if op.name not in LINEAR or len(shape) != 1 or i in plan.outputs or not batched[i]:
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


def consecutive_views(arrays: list, address: Callable[[Any], int]) -> bool:
    """Equal-sized contiguous arrays that follow each other in memory (address(a): the
    backend's address of a's first element)."""
    if not all(a.flags.c_contiguous for a in arrays):
        return False
    at = address(arrays[0])
    for a in arrays:
        if address(a) != at:
            return False
        at += a.nbytes
    return True


def fusion_regions(plan, batched: dict, shapes: dict, skip: set) -> list:
    """Chains of elementwise steps to fuse, in step order. A region stays open until a
    step outside it reads one of its values: the fused kernel runs where its last
    member was, so nothing may need its values earlier."""
    from ..fusion import MAX_REGS, fusable
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


def fused_unit(plan, members: list) -> Unit:
    from ..fusion import FusedChain
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


def unit_order(plan, units: list, depth: dict) -> list | None:
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
