"""Type-level scheduling machinery and the greedy "typewise" heuristic (ED-Batch).

A *type* is a signature. Scheduling is simulated on the pending graph: the
*frontier* is the set of ready nodes (all pending arguments already run);
an action picks a type and runs all its ready nodes as one batch. Unbatchable
nodes run alone as soon as they are ready, outside any policy.

Typewise frontier (ED-Batch, Chen et al. 2023): G_a links each type-a node to
its *nearest* type-a ancestors, looking through nodes of other types. Its
frontier F_a holds the pending type-a nodes with no pending type-a ancestor:
the nodes a type-a batch could ever hold right now if we waited for the other
types. The ratio |ready_a| / |F_a| (<= 1) says how much of that potential batch
is ready; 1 means running type a now loses nothing. `TypewiseBatching` greedily
runs the type with the highest ratio; `Simulation.step` returns the reward
-1 + ratio used to train the FSM policy (dynagraph.fsm).

F_a counts are maintained incrementally: executing a type-a node decrements the
pending-parent count of its G_a children, which join F_a at zero.

Holding the tail (`hold_tail`, FSM policies trained with it). A *tail* type is one from
which no cycle of the type graph through two or more types can be reached (a -> b when a
type-a node has a type-b user; a type-a node with an unbatchable user is never tail): a
loss layer, the losses, their sums. No other node depends on a tail node, so holding ready
tail nodes back until every other batchable node has run costs the rest nothing; then the
first tail type in type-graph order always has its whole F_a ready, so settle runs the
tail type by type, each in as many batches as its longest chain, which no schedule beats.
Run as soon as ready instead, they cost a batch each time a sample finishes.

Chain heights (`heights`, the FSM's "chain" encoding). height[n] of a type-a node is the number of
type-a nodes on the longest G_a path from n down (n included): the batches of type a that must
still follow once n runs. top[a], the largest height among pending type-a nodes, is what
lower_bound (schedulers/base.py) charges type a for the rest of the graph, and `left` sums it
over the types. Running type a now keeps top[a] on schedule exactly when its ready nodes hold
every pending type-a node of height top[a] (`chain_ready(a)`); otherwise that batch is one more
than the bound. `steps + left` starts at lower_bound's count of batchable batches and ends at the
schedule's: the FSM's "bound" reward is minus its change per decision (dynagraph.fsm), so the
rewards of an episode sum to lower bound minus batches.

`Simulation.settle` runs every type with ratio 1 at once. That is always safe:
any schedule's next batch of such a type can only hold nodes of F_a, all ready
now, so running them now never adds a batch. The typewise heuristic does it
implicitly (ratio 1 is the maximum); the FSM does it before each decision.
"""
from __future__ import annotations

from typing import Sequence

from ..recording import NATIVE
from .base import batchable_by_sig, register, users_of


# ----------------------------------------------------------------- stable keys
def _canon(x, names: dict):
    """Replace ("shared", id(param), ...) by ("shared", param name, ...), recursively."""
    if isinstance(x, tuple):
        if len(x) >= 2 and x[0] == "shared" and isinstance(x[1], int):
            return ("shared", names.get(x[1], "?")) + x[2:]
        return tuple(_canon(y, names) for y in x)
    return x


def param_names(cg) -> dict:
    """id(parameter) -> its name, for every parameter bound in this graph."""
    out = {}
    for nid in cg._leaves.values():
        p = cg.attrs[nid][1]
        out[id(p)] = p.name()
    return out


def base_key(signature: tuple, names: dict) -> str:
    """A signature's model-level key before collisions are numbered (see stable_keys)."""
    op, attrs, parts = signature
    return f"{op.name}{_canon(attrs, names)!r}{_canon(parts, names)!r}"


def stable_keys(cg, sigs: Sequence[int]) -> dict:
    """Signature id -> a string stable across graphs of one model.

    The key spells the op name, its attributes and its argument shapes, with
    shared parameters named instead of identified by object id. Two signatures
    that still collide (same-named parameters of different collections) get a
    "#k" suffix in first-recorded order, so keys stay one-to-one.
    """
    names = param_names(cg)
    out: dict = {}
    used: set = set()
    for s in sorted(set(sigs)):
        key = base_key(cg.signatures[s], names)
        k, base = 1, key
        while key in used:
            key = f"{base}#{k}"
            k += 1
        used.add(key)
        out[s] = key
    return out


# ------------------------------------------------------------------ simulation
class Simulation:
    """The pending graph as a scheduling environment, reusable across episodes.

    Types are dense ints 0..T-1 (`type_sig[t]` is the signature id); -1 marks
    unbatchable nodes. Static structure is computed once; `reset()` starts an
    episode. Internally a node is its local index, node id - `base`; `ready`
    holds local indices and `batches` (the schedule) node ids.
    """

    def __init__(self, cg, nodes: Sequence[int], typewise: bool = True, hold_tail: bool = False,
                 heights: bool = False):
        self.nodes = list(nodes)
        indeg, users, base = users_of(cg, self.nodes)
        self.indeg0, self.base = indeg, base
        self.users = [None if us is None else [u - base for u in us] for us in users]
        op, sig = cg.op, cg.sig
        dense: dict = {}
        typ = [-1] * len(indeg)
        for n in self.nodes:
            if op[n].batchable:
                typ[n - base] = dense.setdefault(sig[n], len(dense))
        self.typ = typ
        self.type_sig = list(dense)
        self.typewise = typewise
        self.tail = tail_types(typ, self.users, len(dense)) if hold_tail else [False] * len(dense)
        self.nontail0 = sum(1 for t in typ if t >= 0 and not self.tail[t]) if hold_tail else 0
        if typewise:
            self.gpar0, self.gch = _type_graph(cg, self.nodes, users, base, typ)
            self.fcount0 = [0] * len(dense)
            for n in self.nodes:
                t = typ[n - base]
                if t >= 0 and self.gpar0[n - base] == 0:
                    self.fcount0[t] += 1
        self.heights = heights and typewise
        if self.heights:
            self.height, self.hcount0 = chain_heights(typ, self.gch, len(dense))
            self.crit = path_lengths(self.users)

    @property
    def n_types(self) -> int:
        return len(self.type_sig)

    def reset(self, record: bool = True) -> None:
        """Start an episode: everything pending; run the unbatchable nodes that are ready."""
        self.indeg = list(self.indeg0)
        self.ready: dict = {}
        self.held: dict = {}            # ready nodes of tail types, until no other batchable node is pending
        self.nontail = self.nontail0    # pending batchable nodes of other types (0: nothing is held)
        self.batches: list | None = [] if record else None
        self.steps = 0          # batches of batchable types (decisions and settled ones)
        self.unbatchable = 0    # batches of one unbatchable node
        if self.typewise:
            self.gpar = list(self.gpar0)
            self.fcount = list(self.fcount0)
        if self.heights:
            self.hcount = [list(c) for c in self.hcount0]   # pending type-t nodes per height
            self.hready = [[0] * len(c) for c in self.hcount0]  # of which ready (or held)
            self.top = [len(c) - 1 for c in self.hcount0]
            self.left = sum(self.top)
        base, indeg0 = self.base, self.indeg0
        self._add([n - base for n in self.nodes if indeg0[n - base] == 0])

    @property
    def done(self) -> bool:
        return not self.ready

    @property
    def n_batches(self) -> int:
        return self.steps + self.unbatchable

    def ratio(self, t: int) -> float:
        """|ready of type t| / |frontier of G_t|: 1 when running t now loses nothing."""
        return len(self.ready[t]) / self.fcount[t]

    def chain_ready(self, t: int) -> bool:
        """Whether t's ready nodes hold every pending type-t node of the greatest height (module
        docstring): running t now keeps its longest remaining chain on the lower bound's schedule."""
        h = self.top[t]
        return self.hready[t][h] == self.hcount[t][h]

    def step(self, t: int) -> float:
        """Run all ready nodes of type t as one batch; returns the reward -1 + ratio."""
        batch = self.ready.pop(t)
        if self.heights:
            self._lower(t, batch)
        reward = -1.0
        if self.typewise:
            fc = self.fcount
            reward += len(batch) / fc[t]
            fc[t] -= len(batch)
            gpar, gch = self.gpar, self.gch
            for n in batch:
                ch = gch[n]
                if ch:
                    for c in ch:
                        k = gpar[c] - 1
                        gpar[c] = k
                        if k == 0:
                            fc[t] += 1
        self.steps += 1
        if self.batches is not None:
            base = self.base
            batch.sort()  # recording order keeps consecutive rows contiguous for later users
            self.batches.append([n + base for n in batch])
        held = self.nontail > 0
        if held and not self.tail[t]:
            self.nontail -= len(batch)
        self._free(batch)
        if held and self.nontail == 0:  # the last non-tail batch: the tail shows up
            for h, b in self.held.items():
                self.ready.setdefault(h, []).extend(b)
            self.held.clear()
        return reward

    def settle(self) -> int:
        """Run every type whose whole G_a frontier is ready (ratio 1), until none is left.

        Safe: any schedule's next batch of such a type is a subset of its ready
        nodes, so running them all now never costs a batch. Returns the steps taken.
        """
        ready, fcount, k = self.ready, self.fcount, 0
        while True:
            full = [t for t, b in ready.items() if len(b) == fcount[t]]
            if not full:
                return k
            for t in sorted(full):
                self.step(t)
                k += 1

    def _lower(self, t: int, batch: list) -> None:
        """The batch leaves the pending counts per height; top[t] drops past emptied heights."""
        height, hc, hr = self.height, self.hcount[t], self.hready[t]
        for n in batch:
            h = height[n]
            hc[h] -= 1
            hr[h] -= 1
        h = self.top[t]
        while h > 0 and hc[h] == 0:
            h -= 1
        self.left -= self.top[t] - h
        self.top[t] = h

    def _bucket(self, t: int) -> dict:
        """Where a ready node of type t goes: `held` while it is a tail type and others are pending."""
        return self.held if self.nontail > 0 and self.tail[t] else self.ready

    def _free(self, batch: list) -> None:
        """Count down the users of executed nodes; those left with no pending argument become ready."""
        users, indeg, typ = self.users, self.indeg, self.typ
        lone = None
        for n in batch:
            us = users[n]
            if us:
                for u in us:
                    k = indeg[u] - 1
                    indeg[u] = k
                    if k == 0:
                        t = typ[u]
                        if t < 0:
                            if lone is None:
                                lone = []
                            lone.append(u)
                            continue
                        ready = self._bucket(t)
                        b = ready.get(t)
                        if b is None:
                            ready[t] = [u]
                        else:
                            b.append(u)
                        if self.heights:
                            self.hready[t][self.height[u]] += 1
        if lone:
            self._add(lone)

    def _add(self, fresh: list) -> None:
        """Make nodes ready; unbatchable ones run at once, alone (and may free more)."""
        typ = self.typ
        for n in fresh:
            t = typ[n]
            if t >= 0:
                ready = self._bucket(t)
                b = ready.get(t)
                if b is None:
                    ready[t] = [n]
                else:
                    b.append(n)
                if self.heights:
                    self.hready[t][self.height[n]] += 1
                continue
            self.unbatchable += 1
            if self.batches is not None:
                self.batches.append([n + self.base])
            self._free([n])


def tail_types(typ: list, users: list, n_types: int) -> list:
    """Per type, whether it is a tail type (module docstring): the least fixed point of
    "no unbatchable user, and every user's type is a tail type or its own" (a type's chain, like
    sums of sums of losses, stays in the tail: settle runs it level by level, its chain length)."""
    succ = [0] * n_types
    blocked = [False] * n_types
    for i, t in enumerate(typ):
        if t < 0 or not users[i]:
            continue
        for u in users[i]:
            tu = typ[u]
            if tu < 0:
                blocked[t] = True
            else:
                succ[t] |= 1 << tu
    tail, mask = [False] * n_types, 0
    changed = True
    while changed:
        changed = False
        for t in range(n_types):
            if not tail[t] and not blocked[t] and succ[t] & ~(mask | 1 << t) == 0:
                tail[t], mask, changed = True, mask | (1 << t), True
    return tail


def chain_heights(typ: list, gch: list, n_types: int) -> tuple[list, list]:
    """Per local node its chain height (module docstring; 0 for unbatchable nodes), and per type
    the count of its nodes at each height (index 0 unused). G_a children come later in recording
    order, so one backward pass sees them first."""
    height = [0] * len(typ)
    top = [0] * n_types
    for i in range(len(typ) - 1, -1, -1):
        t = typ[i]
        if t < 0:
            continue
        h = 1
        ch = gch[i]
        if ch:
            for c in ch:
                if height[c] >= h:
                    h = height[c] + 1
        height[i] = h
        if h > top[t]:
            top[t] = h
    counts = [[0] * (top[t] + 1) for t in range(n_types)]
    for i, t in enumerate(typ):
        if t >= 0:
            counts[t][height[i]] += 1
    return height, counts


def path_lengths(users: list) -> list:
    """Per local node, the most nodes on a path from it to a sink (itself included): how far
    behind its sample is, the critical-path priority of list scheduling."""
    crit = [1] * len(users)
    for i in range(len(users) - 1, -1, -1):
        us = users[i]
        if us:
            crit[i] = 1 + max([crit[u] for u in us])
    return crit


def _type_graph(cg, nodes, users, base, typ) -> tuple[list, list]:
    """Pending-parent counts and children lists of every G_a, all types at once.

    near[n] maps a type t to the frozenset of n's nearest type-t nodes (n itself
    if it has type t). It is kept only for the types some descendant of n has
    (`below`), which keeps it small: a type matters at n only if n lies between
    two nodes of that type.

    Sets are pruned of members that are G_a parents of other members: such a
    member runs before them anyway, so dropping it never changes when a count
    reaches zero. Without this an LSTM's cell state, which passes no gate, makes
    every earlier gate a "nearest" ancestor (quadratic edge counts).
    """
    below = _below_masks(nodes, users, base, typ)
    pset = _pruned_parents(cg, nodes, base, typ, below)
    return _children(nodes, base, pset)


def _below_masks(nodes, users, base, typ) -> list:
    """Per node (local index), the bit mask of the types strictly below it."""
    span = len(typ)
    below = [0] * span
    for n in reversed(nodes):  # bit mask of the types strictly below each node
        us = users[n - base]
        if us:
            m = 0
            for u in us:
                t = typ[u - base]
                m |= below[u - base] | ((1 << t) if t >= 0 else 0)
            below[n - base] = m
    return below


def _pruning_union(pset: list, base: int):
    """The union of two pruned nearest-sets, pruned (see _type_graph), over G_a parents `pset`."""

    def union(x: frozenset, y: frozenset) -> frozenset:
        """x | y, pruned; x and y are already pruned within themselves."""
        if x <= y:
            return y
        if y <= x:
            return x
        drop = None
        for a, b in ((x, y), (y, x)):
            for q in a:
                ps = pset[q - base]
                if ps and not ps.isdisjoint(b):
                    drop = (ps & b) if drop is None else drop | (ps & b)
        u = x | y
        return u - drop if drop else u

    return union


def _pruned_parents(cg, nodes, base, typ, below) -> list:
    """Each typed node's pruned G_a parents (a frozenset, or None), by local index (see _type_graph)."""
    span = len(typ)
    near: list = [None] * span  # None or a map type -> frozenset; may be shared
    pset: list = [None] * span  # each typed node's (pruned) G_a parents
    union = _pruning_union(pset, base)
    kmask = [0] * span  # bit mask of the keys of near[i]
    args = cg.args
    for n in nodes:
        i = n - base
        t_n, b = typ[i], below[i]
        d, dm, owned, par = None, 0, False, None
        for p in args[n]:
            j = p - base
            if j < 0:
                continue
            dp = near[j]
            if dp is None or dp is d:
                continue
            if t_n >= 0:
                s = dp.get(t_n)
                if s is not None:
                    par = s if par is None or par is s else union(par, s)
            if d is None:  # share the first argument's map until it must change
                d, dm = dp, kmask[j]
                continue
            if not owned:
                d, owned = dict(d), True
            dm |= kmask[j]
            for t, s in dp.items():
                cur = d.get(t)
                if cur is None:
                    d[t] = s
                elif cur is not s:
                    d[t] = union(cur, s)
        own = t_n >= 0 and b >> t_n & 1
        extra = dm & ~b  # types nobody below needs any more
        if extra or own:
            if not owned:
                d = dict(d) if d else {}
            while extra:
                low = extra & -extra
                d.pop(low.bit_length() - 1, None)
                extra ^= low
            dm &= b
            if own:
                d[t_n] = frozenset((n,))
                dm |= 1 << t_n
        if dm:
            near[i], kmask[i] = d, dm
        if par:
            pset[i] = par
    return pset


def _children(nodes, base, pset) -> tuple[list, list]:
    """Pending-parent counts and children lists (local indices) from the G_a parents `pset`."""
    span = len(pset)
    gpar = [0] * span          # by local index, like gch's entries
    gch: list = [None] * span
    for n in nodes:
        i = n - base
        par = pset[i]
        if par:
            gpar[i] = len(par)
            for q in par:
                c = gch[q - base]
                if c is None:
                    gch[q - base] = [i]
                else:
                    c.append(i)
    return gpar, gch


# ------------------------------------------------------------------ heuristic
class TypewiseBatching:
    """Greedy ED-Batch heuristic: run the ready type with the highest |ready| / |F_a|.

    Ties go to the type with more ready nodes, then to the first-recorded type.
    """
    name = "typewise"
    trusted = True  # validated by tests/schedulers/test_typewise.py

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        """In C when dynagraph._bookkeeping is built (same decisions); schedule_py is its twin."""
        if NATIVE is not None and nodes:
            out = NATIVE.typewise_batches(cg.args, cg.sig, batchable_by_sig(cg), nodes, None)
            if out is not None:
                return out[0]
        return self.schedule_py(cg, nodes)

    def schedule_py(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        if not nodes:
            return []
        sim = Simulation(cg, nodes, typewise=True)
        sim.reset()
        ready, fcount = sim.ready, sim.fcount
        while ready:
            best, key = -1, None
            for t, bucket in ready.items():
                k = (len(bucket) / fcount[t], len(bucket), -t)
                if key is None or k > key:
                    best, key = t, k
            sim.step(best)
        return sim.batches


register("typewise", TypewiseBatching)
