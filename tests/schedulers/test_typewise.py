"""The typewise machinery (stable type keys, G_a frontiers, rewards, settling) and the
greedy "typewise" scheduler: valid schedules, equal results to "none", batch counts."""
from __future__ import annotations

import os
import sys

import pytest

import dynagraph as dy
from dynagraph.schedulers import base as sbase
from dynagraph.schedulers.typewise import Simulation, TypewiseBatching, stable_keys

from ._util import check_schedule, compare_with_none

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # examples.workloads
from examples.workloads import WORKLOADS  # noqa: E402


def pending(cg) -> list[int]:
    cg._sync_values()
    return [i for i in range(cg.done, len(cg)) if not cg.op[i].leaf]


def small_graph():
    """u -> p=logistic(u) -> q=tanh(p);  u -> r=tanh(u).  q and r share the tanh type."""
    cg = dy.renew_cg()
    u = dy.inputVector([0.5, -1.0])
    p = dy.logistic(u)
    q = dy.tanh(p)
    r = dy.tanh(u)
    return cg, u.i, p.i, q.i, r.i


def type_of(sim, n) -> int:
    return sim.typ[n - sim.base]


def test_typewise_frontier_counts_and_rewards():
    cg, u, p, q, r = small_graph()
    sim = Simulation(cg, pending(cg))
    T, L, In = type_of(sim, q), type_of(sim, p), type_of(sim, u)
    assert type_of(sim, r) == T and len({T, L, In}) == 3
    # q's nearest tanh ancestors: none (only logistic and input above it), so F_tanh = {q, r}.
    assert sim.fcount0[T] == 2 and sim.fcount0[L] == 1 and sim.fcount0[In] == 1
    sim.reset()
    assert sorted(sim.ready) == [In]
    assert sim.step(In) == 0.0                       # 1 ready of a frontier of 1
    b = sim.base                                     # `ready` holds node id - base
    assert sim.ready[T] == [r - b] and sim.ratio(T) == 0.5
    assert sim.step(T) == -0.5                       # -1 + 1/2: q could have joined
    assert sim.fcount[T] == 1                        # q is still in F_tanh (not ready yet)
    assert sim.step(L) == 0.0
    assert sim.ready[T] == [q - b] and sim.step(T) == 0.0
    assert sim.done and sim.n_batches == 4 and sim.batches == [[u], [r], [p], [q]]


def test_settle_runs_full_frontier_types_only():
    cg, u, p, q, r = small_graph()
    sim = Simulation(cg, pending(cg))
    sim.reset()
    assert sim.settle() == 3                         # input, logistic, then tanh with q and r together
    assert sim.done and sim.batches == [[u], [p], [q, r]]
    assert sim.n_batches == sbase.lower_bound(cg, pending(cg))


def test_nearest_ancestors_look_through_other_types_and_count_once():
    cg = dy.renew_cg()
    u = dy.inputVector([0.1, 0.2])
    a = dy.tanh(u)
    b = dy.logistic(a)
    d = dy.tanh(b + a)                               # reaches a by two paths: one parent
    o = dy.tanh(u * 2.0)                             # an unrelated tanh
    e = dy.tanh(dy.logistic(dy.logistic(d)) + o)     # nearest tanh: d (via two logistics) and o
    f = dy.tanh(d + b)                               # nearest: d, and a via b; a is d's parent: pruned
    sim = Simulation(cg, pending(cg))
    gpar = {n: sim.gpar0[n - sim.base] for n in (a.i, d.i, o.i, e.i, f.i)}
    assert gpar == {a.i: 0, d.i: 1, o.i: 0, e.i: 2, f.i: 1}
    assert sorted(c + sim.base for c in sim.gch[d.i - sim.base]) == [e.i, f.i]
    assert sim.fcount0[type_of(sim, a.i)] == 2       # a and o


@pytest.mark.parametrize("name,n", [("treelstm2type", 4), ("latticelstm", 2)])
def test_frontier_counts_stay_consistent_under_any_order(name, n):
    """Incremental F_a counts equal a from-scratch recount after every step."""
    w = WORKLOADS[name](hidden=2, seed=0)
    cg = w.graph(w.instances(n, seed=3))
    nodes = pending(cg)
    sim = Simulation(cg, nodes)
    sim.reset()
    k = 0
    while sim.ready:
        t = sorted(sim.ready)[k % len(sim.ready)]    # an arbitrary, deterministic order
        k += 1
        sim.step(t)
        assert sim.fcount == _recount(cg, sim, nodes, {n for b in sim.batches for n in b})


@pytest.mark.parametrize("name,n", [("treelstm2type", 3), ("nerlattice", 1)])
def test_chain_heights_stay_consistent_under_any_order(name, n):
    """Chain heights equal a from-scratch count; after every step top[t] is the remaining graph's
    longest type-t chain (lower_bound's share of t), left their sum, and chain_ready(t) says
    whether t's ready nodes hold every pending type-t node of that height."""
    w = WORKLOADS[name](hidden=2, seed=0)
    cg = w.graph(w.instances(n, seed=3))
    nodes = pending(cg)
    sim = Simulation(cg, nodes, heights=True)
    sim.reset()
    unbatchable = sum(1 for x in nodes if type_of(sim, x) < 0)
    assert sim.left == sbase.lower_bound(cg, nodes) - unbatchable
    done: set = set()
    k = 0
    while sim.ready:
        heights = _heights(cg, sim, nodes, done)
        assert all(sim.height[x - sim.base] == h for x, h in heights.items())
        top = [0] * sim.n_types
        for x, h in heights.items():
            top[type_of(sim, x)] = max(top[type_of(sim, x)], h)
        assert sim.top == top and sim.left == sum(top)
        for t, bucket in sim.ready.items():
            heads = {x for x, h in heights.items() if type_of(sim, x) == t and h == top[t]}
            assert sim.chain_ready(t) == (heads <= {x + sim.base for x in bucket})
        t = sorted(sim.ready)[k % len(sim.ready)]
        k += 1
        sim.step(t)
        done = {x for b in sim.batches for x in b}
    assert sim.left == 0 and sim.top == [0] * sim.n_types
    users: dict = {}
    for x in nodes:
        for a in cg.args[x]:
            users.setdefault(a, []).append(x)
    longest: dict = {}
    for x in reversed(nodes):  # the most nodes on a path down to a sink
        longest[x] = 1 + max([longest[u] for u in users.get(x, ())], default=0)
        assert sim.crit[x - sim.base] == longest[x]


def _heights(cg, sim, nodes, done) -> dict:
    """Per pending typed node, the most nodes of its type on a pending path down from it."""
    users: dict = {}
    for x in nodes:
        for a in cg.args[x]:
            users.setdefault(a, []).append(x)
    down: dict = {}
    for x in reversed(nodes):
        if x in done:
            continue
        d: dict = {}
        for u in users.get(x, ()):
            for t, c in down[u].items():
                d[t] = max(d.get(t, 0), c)
        t = type_of(sim, x)
        if t >= 0:
            d[t] = d.get(t, 0) + 1
        down[x] = d
    return {x: d[type_of(sim, x)] for x, d in down.items() if type_of(sim, x) >= 0}


def _recount(cg, sim, nodes, done) -> list[int]:
    """F_a sizes by definition: pending type-a nodes with no pending type-a ancestor."""
    anc: dict = {}  # node -> bit mask of the types of its pending ancestors
    counts = [0] * sim.n_types
    for n in nodes:
        m = 0
        for a in cg.args[n]:
            if a in anc and a not in done:
                m |= anc[a] | (1 << type_of(sim, a))
        anc[n] = m
        t = type_of(sim, n)
        if n not in done and not m >> t & 1:
            counts[t] += 1
    return counts


def test_stable_keys_name_parameters_and_match_across_graphs():
    keys = []
    for seed in (1, 2):
        w = WORKLOADS["latticelstm"](hidden=3, seed=0)
        cg = w.graph(w.instances(3, seed=seed))
        sigs = {cg.sig[n] for n in pending(cg)}
        keys.append(set(stable_keys(cg, sorted(sigs)).values()))
        ids = [str(id(p)) for p in w.pc.parameters_list() + w.pc.lookup_parameters_list()]
        assert not any(i in k for i in ids for k in keys[-1])  # no object ids
    common = keys[0] & keys[1]
    assert any("'/Wx_char'" in k for k in common)    # parameters appear by name
    # The per-lattice loss sums differ in arity between the two samples; the cell types do not.
    assert len(common) >= 15


@pytest.mark.parametrize("name", ["treelstm", "mvrnn", "bilstm", "latticegru"])
def test_typewise_schedules_are_valid_and_no_worse_than_depth(name):
    w = WORKLOADS[name](hidden=2, seed=0)
    cg = w.graph(w.instances(6, seed=1))
    nodes = pending(cg)
    batches = TypewiseBatching().schedule(cg, nodes)
    check_schedule(cg, nodes, batches)
    assert len(batches) <= len(sbase.get("depth").schedule(cg, nodes))


def test_typewise_reaches_the_lower_bound_on_trees():
    w = WORKLOADS["treelstm"](hidden=2, seed=0)
    cg = w.graph(w.instances(8, seed=1))
    nodes = pending(cg)
    assert len(TypewiseBatching().schedule(cg, nodes)) == sbase.lower_bound(cg, nodes)


def test_typewise_matches_none():
    def build(pc):
        w = WORKLOADS["treegru"](hidden=3, seed=None, pc=pc)
        return [w.loss(t) for t in w.instances(3, seed=2)]
    compare_with_none(TypewiseBatching(), build)


def test_typewise_is_registered():
    assert isinstance(sbase.get("typewise"), TypewiseBatching)
    assert TypewiseBatching().schedule(dy.renew_cg(), []) == []
