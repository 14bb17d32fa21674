"""ED-Batch's memory-layout planner for a static subgraph (a dy.block Plan).

Inside a block, steps with the same signature and no dependency between them can
run as one kernel (a *batch*: the gate logistics of an LSTM, the child products
of a TreeLSTM). A batched kernel reads each operand list as one strided array
and writes one array of results. If the variables of an operand list sit next to
each other, in the same order as the results, no copy is needed; otherwise a
gather kernel copies them first. The planner picks one memory order for all the
block's variables (inputs, parameters, step outputs) that avoids as many copies
as possible:

1. hard constraints: slices (pick_range) of one source are views, so the pieces
   of a source stay together, in order (the producer writes them as one array);
2. every batch asks for its results, then each operand list, to be consecutive
   (PQ-tree reductions, most bytes first; one that fails is dropped, recorded);
3. propagation: any subset that the tree forces together in one list of a batch
   is forced together in the batch's other lists, until nothing changes;
4. alignment: each batch fixes its kernel order from the results, and each list
   is chained in that order (a Q-node); the direction of every Q-node is chosen
   with a union-find carrying a reversal bit, which finds conflicting batches;
5. the order is read from the tree, and every list is re-checked on the final
   offsets: the reported copies are measured, not promised.

Parameters take part like any variable: LSTM gate weights placed side by side
are one stacked matrix, so one GEMM reads them without a copy. Conflicts never
raise: the weaker constraint is dropped and its operand list stays a gather.

`dynagraph.program` runs a plan with this layout: the kernel order of each batch
comes from the memory order, and operand lists found consecutive are read in place.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..ops.base import size_of
from .pqtree import PQTree

VIEW_OPS = {"pick_range"}


@dataclass
class Batch:
    """Steps of one signature run as one kernel: results and operand lists, in step order."""
    op: str
    steps: list
    results: list
    operands: list  # per argument position: list of variables, or None when broadcast


@dataclass
class Layout:
    order: list
    offsets: dict
    sizes: dict
    names: dict
    batches: list
    aligned: list = field(default_factory=list)     # (batch, position) read in place; -1 = results
    gathers: list = field(default_factory=list)     # (batch, position) still copied
    conflicts: list = field(default_factory=list)   # dropped constraints, why
    kernels: int = 0
    bytes: int = 0
    naive_kernels: int = 0
    naive_bytes: int = 0
    plan_ms: float = 0.0

    def describe(self) -> str:
        lines = ["memory order (offset: variable [size]):"]
        lines += [f"  {self.offsets[v]:6d}: {self.names[v]} [{self.sizes[v]}]" for v in self.order]
        lines.append("batches:")
        for k, b in enumerate(self.batches):
            lines.append(f"  #{k} {b.op} x{len(b.steps)}: results {_fmt(self, b.results)} "
                         f"{'in place' if (k, -1) in self.aligned else 'SCATTER'}")
            for p, vs in enumerate(b.operands):
                if vs is None:
                    continue
                state = "in place" if (k, p) in self.aligned else "GATHER"
                lines.append(f"      operand {p}: {_fmt(self, vs)} {state}")
        lines += [f"conflict: {c}" for c in self.conflicts]
        lines.append(f"memory kernels/call {self.kernels} (naive {self.naive_kernels}), "
                     f"bytes/call {self.bytes} (naive {self.naive_bytes}), planned in {self.plan_ms:.1f} ms")
        return "\n".join(lines)


def _fmt(lay: Layout, vs: list) -> str:
    return "[" + ", ".join(lay.names[v] for v in vs) + "]"


# ---------------------------------------------------------------- the model
class _Model:
    """Variables, sizes, view groups and batches of one plan."""

    def __init__(self, plan, in_shapes):
        self.sizes, self.names, self.shape = {}, {}, {}
        in_shapes = in_shapes if in_shapes is not None else getattr(plan, "in_shapes", None)
        for k, i in enumerate(plan.inputs):
            shape = tuple(in_shapes[k]) if in_shapes is not None else _guess_shape(plan, i)
            self._var(i, f"in{k}", shape)
        for k, (i, p) in enumerate(zip(plan.leaves, plan.leaf_params)):
            self._var(i, f"param{k}{tuple(p.values.shape)}", tuple(p.values.shape))
        self.depth = {i: 0 for i in self.sizes}
        for i, op, args, attrs, spec, shape in plan.steps:
            self._var(i, f"%{i}={op.name}", tuple(shape))
            self.depth[i] = 1 + max((self.depth.get(j, 0) for j in args), default=0)
        self.groups = self._view_groups(plan)
        self.batches = self._batches(plan)

    def _var(self, i, name: str, shape: tuple) -> None:
        self.names[i], self.shape[i], self.sizes[i] = name, shape, size_of(shape)

    def _view_groups(self, plan) -> dict:
        """source -> its pieces in memory order (pick_range outputs and fillers), when the
        slices are disjoint ranges of the first axis: then they are views, not copies."""
        by_src: dict = {}
        for i, op, args, attrs, spec, shape in plan.steps:
            if op.name in VIEW_OPS and len(attrs) >= 3 and attrs[2] == 0:
                by_src.setdefault(args[0], []).append((attrs[0], attrs[1], i))
        groups = {}
        for src, cuts in by_src.items():
            cuts.sort()
            if any(a[1] > b[0] for a, b in zip(cuts, cuts[1:])):
                continue  # overlapping slices: keep them as copies
            rest = size_of(self.shape[src][1:])
            pieces, at = [], 0
            for s, e, i in cuts + [(self.shape[src][0], None, None)]:
                if s > at:  # an unused stretch of the source still occupies memory
                    f = ("fill", src, at)
                    self._var(f, f"{self.names[src]}[{at}:{s}]", (s - at,) + self.shape[src][1:])
                    pieces.append(f)
                if i is not None:
                    pieces.append(i)
                    at = e
            if len(pieces) >= 2 and sum(self.sizes[p] for p in pieces) == self.sizes[src] == rest * self.shape[src][0]:
                groups[src] = pieces
        # a slice that is itself sliced whole (a view of a view): its own slices stay copies, since
        # the tree places the outer source's pieces, and the inner source is one of them
        for src in [s for s in groups if any(s in ps for ps in groups.values())]:
            del groups[src]
        return groups

    def _batches(self, plan) -> list:
        views = {i for ps in self.groups.values() for i in ps}
        keyed: dict = {}
        for i, op, args, attrs, spec, shape in plan.steps:
            if i in views:
                continue
            # Parameters batch by shape, not identity: inside a block we choose where they live.
            key = (op.name, repr(attrs), tuple(self.shape[j] for j in args), self.depth[i])
            keyed.setdefault(key, []).append((i, args))
        out = []
        for key, members in keyed.items():
            if len(members) < 2:
                continue
            ops = [m[0] for m in members]
            cols = []
            for p in range(len(members[0][1])):
                vs = [m[1][p] for m in members]
                cols.append(None if len(set(vs)) == 1 else vs)
            out.append(Batch(key[0], ops, ops, cols))
        return out

    def elements(self) -> list:
        inside = set(self.groups)
        return [v for v in self.sizes if v not in inside]

    def placeable(self, vs: list) -> bool:
        """A list the tree can reason about: distinct plain variables (no view source)."""
        return len(set(vs)) == len(vs) and not any(v in self.groups for v in vs)


def _guess_shape(plan, i) -> tuple:
    """Without the traced input shapes, take the shape of the first step using the input
    (right for elementwise uses, an estimate otherwise)."""
    for j, op, args, attrs, spec, shape in plan.steps:
        if i in args:
            return tuple(shape)
    return (1,)


# -------------------------------------------------------------- the planner
def plan_layout(plan, in_shapes: list | None = None, batch_size: int = 8, itemsize: int = 4,
                mode: str = "planned") -> Layout:
    """The memory layout of one plan. mode "naive" (or None) lays variables out in step
    order and gathers every batched operand list; in_shapes are the block's traced
    argument shapes (see `block_layouts`)."""
    t0 = time.perf_counter()
    m = _Model(plan, in_shapes)
    lists = _lists(m)
    conflicts: list = []
    naive = mode in (None, "naive")
    if naive:
        order = m.elements()  # step order: inputs, parameters, then each step's output
    else:
        tree = PQTree(m.elements())
        for src, pieces in m.groups.items():
            if not _chain(tree, pieces):
                conflicts.append(f"slices of {m.names[src]} cannot stay together")
        active = _consecutive(m, tree, lists, conflicts)
        _propagate(m, tree, active, conflicts)
        chains = _align(m, tree, active, conflicts)
        _orient(m, tree, chains, conflicts)
        order = tree.frontier()
    lay = _measure(m, order, lists, naive, batch_size * itemsize)
    lay.conflicts = conflicts
    lay.plan_ms = 1000 * (time.perf_counter() - t0)
    return lay


def _lists(m: _Model) -> list:
    """(batch, position, variables, bytes per instance); position -1 is the results."""
    out = []
    for k, b in enumerate(m.batches):
        out.append((k, -1, b.results, sum(m.sizes[v] for v in b.results)))
        for p, vs in enumerate(b.operands):
            if vs is not None:
                out.append((k, p, vs, sum(m.sizes[v] for v in vs)))
    return out


def _chain(tree: PQTree, vs: list) -> bool:
    """Force vs consecutive in this order (up to reversal); all or nothing."""
    work = tree.copy()
    if not work.reduce(vs) or not all(work.reduce(pair) for pair in zip(vs, vs[1:])):
        return False
    tree._assign(work)
    return True


def _consecutive(m: _Model, tree: PQTree, lists: list, conflicts: list) -> dict:
    """Ask for each list to be consecutive, results first, then by bytes saved."""
    active: dict = {}
    ranked = sorted(lists, key=lambda t: (t[1] != -1, -t[3], t[0], t[1]))
    for k, p, vs, nbytes in ranked:
        if not m.placeable(vs):
            conflicts.append(f"batch #{k} operand {p}: repeats a variable or a sliced source")
        elif tree.reduce(vs):
            active.setdefault(k, {})[p] = vs
        else:
            conflicts.append(f"batch #{k} {'results' if p < 0 else f'operand {p}'}: "
                             f"cannot be consecutive with the lists placed before")
    return active


def _induced(tree: PQTree, vs: list) -> list:
    """Index sets (positions in the batch) that the tree forces together among vs."""
    where = {v: k for k, v in enumerate(vs)}
    out = set()

    def walk(n):  # returns the batch indices under n
        if n.kind == "leaf":
            return frozenset([where[n.value]]) if n.value in where else frozenset()
        parts = [walk(c) for c in n.children]
        here = frozenset().union(*parts)
        if 1 < len(here) < len(vs):
            out.add(here)
        if n.kind == "Q":
            for a, b in zip(parts, parts[1:]):
                if a and b and len(a | b) < len(vs):
                    out.add(a | b)
        return here

    walk(tree.root)
    return sorted(out, key=sorted)


def _propagate(m: _Model, tree: PQTree, active: dict, conflicts: list) -> None:
    """Whatever is forced together in one list of a batch is forced in its others."""
    for _ in range(50):  # a fixpoint; the bound only guards against a bug looping
        changed = False
        for k in sorted(active):
            for p in sorted(active[k]):
                if p not in active[k]:  # dropped by a conflict found earlier in this pass
                    continue
                for idx in _induced(tree, active[k][p]):
                    for q in sorted(active[k]):
                        if q == p or q not in active[k]:
                            continue
                        target = [active[k][q][i] for i in sorted(idx)]
                        before = tree.count()
                        if not tree.reduce(target):
                            conflicts.append(f"batch #{k} {'results' if q < 0 else f'operand {q}'}: "
                                             f"structure of its partner lists does not fit")
                            del active[k][q]
                        elif tree.count() != before:
                            changed = True
        if not changed:
            return


def _align(m: _Model, tree: PQTree, active: dict, conflicts: list) -> dict:
    """Fix each batch's kernel order from its results and chain every list in it."""
    chains: dict = {}
    for k in sorted(active):
        pos = {v: n for n, v in enumerate(tree.frontier())}
        lists = active[k]
        ref = lists.get(-1) or lists[min(lists)]
        order = sorted(range(len(ref)), key=lambda i: pos[ref[i]])
        for p in sorted(lists):
            vs = [lists[p][i] for i in order]
            if _chain(tree, vs):
                chains.setdefault(k, {})[p] = vs
            else:
                conflicts.append(f"batch #{k} {'results' if p < 0 else f'operand {p}'}: "
                                 f"cannot follow the kernel order of its batch")
    return chains


class _ParityUF:
    """Union-find whose edges carry a reversal bit: flip(a) ^ flip(b) == bit."""

    def __init__(self):
        self.up: dict = {}

    def find(self, a):
        par, bit = self.up.get(a, (a, 0))
        if par == a:
            return a, 0
        root, b2 = self.find(par)
        self.up[a] = (root, bit ^ b2)
        return root, bit ^ b2

    def union(self, a, b, bit: int) -> bool:
        (ra, pa), (rb, pb) = self.find(a), self.find(b)
        if ra == rb:
            return pa ^ pb == bit
        self.up[ra] = (rb, pa ^ pb ^ bit)
        return True


FIXED = "memory"  # the union-find node standing for "not reversed" (a source's own order)


def _direction(tree: PQTree, vs: list):
    """(node holding the chain, 1 if the node's child order reads the chain backwards)."""
    a, b = tree.leaves[vs[0]], tree.leaves[vs[1]]
    node = a.parent
    if node is None or b.parent is not node:
        return None
    kids = node.children
    return node, int(kids.index(a) > kids.index(b))


def _orient(m: _Model, tree: PQTree, chains: dict, conflicts: list) -> None:
    """Choose which Q-nodes to reverse so every chain reads in its batch's direction."""
    uf = _ParityUF()
    for src, pieces in m.groups.items():
        d = _direction(tree, pieces)
        if d is None or not uf.union(id(d[0]), FIXED, d[1]):
            conflicts.append(f"slices of {m.names[src]}: direction conflict")
    for k in sorted(chains):
        lists = chains[k]
        ref_p = -1 if -1 in lists else min(lists)
        ref = _direction(tree, lists[ref_p])
        for p in sorted(lists):
            d = _direction(tree, lists[p])
            if p == ref_p or d is None or ref is None:
                continue
            if not uf.union(id(d[0]), id(ref[0]), d[1] ^ ref[1]):
                conflicts.append(f"batch #{k} operand {p}: direction conflicts with another batch")
    stack = [tree.root] if tree.root is not None else []
    while stack:
        n = stack.pop()
        if n.kind == "leaf":
            continue
        root, bit = uf.find(id(n))
        fixed_root, fixed_bit = uf.find(FIXED)
        if root == fixed_root:
            bit ^= fixed_bit
        if bit:
            n.children.reverse()
        stack.extend(n.children)


# ----------------------------------------------------------------- measuring
def _measure(m: _Model, order: list, lists: list, naive: bool, scale: int) -> Layout:
    offsets, at = {}, 0
    for v in order:
        offsets[v] = at
        at += m.sizes[v]
    for src, pieces in m.groups.items():
        offsets[src] = offsets[pieces[0]]
    sizes = dict(m.sizes)
    lay = Layout(order, offsets, sizes, m.names, m.batches)
    slot = {v: n for n, v in enumerate(order)}
    kernel_order: dict = {}
    for k, b in enumerate(m.batches):  # the kernel runs its steps in the results' memory order
        res = [slot.get(v, -1) for v in b.results]
        kernel_order[k] = sorted(range(len(res)), key=lambda i: res[i])
    for k, p, vs, nbytes in lists:
        if p >= 0:
            lay.naive_kernels += 1
            lay.naive_bytes += nbytes * scale
        in_place = not naive and m.placeable(vs) and _contiguous([slot[vs[i]] for i in kernel_order[k]])
        if in_place or (naive and p < 0):
            lay.aligned.append((k, p))
        else:
            lay.gathers.append((k, p))
            lay.kernels += 1
            lay.bytes += nbytes * scale
    if naive:
        lay.kernels, lay.bytes = lay.naive_kernels, lay.naive_bytes
    return lay


def _contiguous(slots: list) -> bool:
    return all(b == a + 1 for a, b in zip(slots, slots[1:]))


def compare(plan, in_shapes: list | None = None, batch_size: int = 8, itemsize: int = 4) -> Layout:
    """The planned layout, with the naive layout's costs filled in for comparison."""
    naive = plan_layout(plan, in_shapes, batch_size, itemsize, mode="naive")
    lay = plan_layout(plan, in_shapes, batch_size, itemsize)
    lay.naive_kernels, lay.naive_bytes = naive.kernels, naive.bytes
    return lay


def block_layouts(block, batch_size: int = 8, itemsize: int = 4) -> list:
    """compare() for every traced signature of a dy.block: the trace key holds the argument shapes."""
    out = []
    for key, plan in block._plans.items():
        shapes = [k for k in key if k != "index"]
        out.append(compare(plan, shapes, batch_size, itemsize))
    return out
