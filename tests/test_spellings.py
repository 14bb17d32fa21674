"""Fusion in dy.cavs does not depend on how a cell is spelled: a TreeLSTM written with one
nonlinearity per gate slice, one over all gates then slices, `esum` of products, or
`dy.tree_lstm_update` reaches the fused TreeLSTM task kernel, and any other elementwise
cell (GRU, LSTM by hand) runs its elementwise chains as fused kernels. Every spelling
gives the values and gradients of the unfused op steps (float64, 1e-10)."""
from __future__ import annotations

import numpy as np
import pytest
from backend_params import unavailable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from refcheck import using
from test_cavs import _assert_same, _dag_loss, _grads, _random_dag

import dynagraph as dy
from dynagraph import cavs
from dynagraph.program.units import FUSED

CPU = unavailable("cpu") is None
SPELLINGS = ["per_gate", "one_logistic_then_slices", "all_gates_then_slices", "esum", "helper"]


def gates(spelling: str, g, cs: list, H: int) -> tuple:
    """(h, c) of an N-ary TreeLSTM cell from pre-activations g = [i f_1..f_N o u]."""
    n = len(cs)
    if spelling == "helper":
        return dy.tree_lstm_update(g, cs, H)
    if spelling == "one_logistic_then_slices":
        s = dy.logistic(dy.pick_range(g, 0, (n + 2) * H))
        sig = [dy.pick_range(s, k * H, (k + 1) * H) for k in range(n + 2)]
        u = dy.tanh(dy.pick_range(g, (n + 2) * H, (n + 3) * H))
    elif spelling == "all_gates_then_slices":
        s, t = dy.logistic(g), dy.tanh(g)
        sig = [dy.pick_range(s, k * H, (k + 1) * H) for k in range(n + 2)]
        u = dy.pick_range(t, (n + 2) * H, (n + 3) * H)
    else:
        sig = [dy.logistic(dy.pick_range(g, k * H, (k + 1) * H)) for k in range(n + 2)]
        u = dy.tanh(dy.pick_range(g, (n + 2) * H, (n + 3) * H))
    i, fs, o = sig[0], sig[1:n + 1], sig[n + 1]
    if spelling == "esum":
        c = dy.esum([dy.cmult(u, i)] + [dy.cmult(ck, f) for f, ck in zip(fs, cs)])
    else:
        c = dy.cmult(i, u)
        for f, ck in zip(fs, cs):
            c = c + dy.cmult(f, ck)
    return dy.cmult(dy.tanh(c), o), c


class SpelledTreeLSTM:
    def __init__(self, pc, rng, spelling: str, N: int = 2, H: int = 3, D: int = 2, V: int = 9):
        self.N, self.H, self.spelling = N, H, spelling
        self.E = pc.add_lookup_parameters((V, D), init=rng.normal(size=(V, D)))
        self.W = pc.add_parameters((3 * H, D), init=rng.normal(size=(3 * H, D)))
        self.bw = pc.add_parameters((3 * H,), init=rng.normal(size=3 * H))
        self.U = [pc.add_parameters(((N + 3) * H, H), init=rng.normal(size=((N + 3) * H, H))) for _ in range(N)]
        self.b = pc.add_parameters(((N + 3) * H,), init=rng.normal(size=(N + 3) * H))
        self.fns = {"leaf": cavs.vertex_function(self.leaf, arity=0), "node": cavs.vertex_function(self.node, arity=N)}

    def leaf(self, v) -> None:
        h, c = gates(self.spelling, dy.affine_transform([self.bw, self.W, v.pull()]), [], self.H)
        v.scatter(h, c)
        v.push(h)

    def node(self, v) -> None:
        kids = [v.gather(k) for k in range(self.N)]
        g = dy.affine_transform([self.b] + [x for u, (h, _) in zip(self.U, kids) for x in (u, h)])
        h, c = gates(self.spelling, g, [c for _, c in kids], self.H)
        v.scatter(h, c)
        v.push(h)


def _dags(rng, arity: int, n_graphs: int = 5):
    graphs = [_random_dag(rng, int(n), arity) for n in rng.integers(1, 9, n_graphs)]
    graphs = [{"children": g, "types": ["node" if ch else "leaf" for ch in g]} for g in graphs]
    words = [[int(w) for w in rng.integers(0, 9, len(g["children"]))] for g in graphs]
    return graphs, words


@pytest.mark.skipif(not CPU, reason="compiled kernels not built")
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_treelstm_spelling_reaches_the_fused_cell(float64, monkeypatch, spelling):
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    rng = np.random.default_rng(len(spelling))
    pc = dy.ParameterCollection()
    m = SpelledTreeLSTM(pc, rng, spelling)
    R = pc.add_parameters((2, m.H), init=rng.normal(size=(2, m.H)))
    graphs, words = _dags(rng, m.N)

    def loss(**kw):
        out = cavs.run(m.fns, graphs, pull=(m.E, words), **kw)
        return _dag_loss([[R * p for p in out.pushed(s)] for s in range(len(graphs))])

    fused = _grads(pc, loss)
    r = cavs.run(m.fns, graphs, pull=(m.E, words))._run
    assert r.cell[1] is not None and r.hoist_cell[0] is not None, f"{spelling}: the TreeLSTM cell was not matched"
    plain = _grads(pc, lambda: loss(fuse=False))
    _assert_same(plain, fused)


class HandGRU:
    """A GRU over a tree's children sum, written from primitive ops: no TreeLSTM pattern,
    but elementwise chains over gate slices (one logistic over both gates, then slices)."""

    def __init__(self, pc, rng, H: int = 3, D: int = 2, V: int = 9, arity: int = 2):
        self.H = H
        self.E = pc.add_lookup_parameters((V, D), init=rng.normal(size=(V, D)))
        self.Wz = pc.add_parameters((3 * H, D), init=rng.normal(size=(3 * H, D)))
        self.Uz = pc.add_parameters((2 * H, H), init=rng.normal(size=(2 * H, H)))
        self.Uh = pc.add_parameters((H, H), init=rng.normal(size=(H, H)))
        self.b = pc.add_parameters((3 * H,), init=rng.normal(size=3 * H))
        self.fn = cavs.vertex_function(self.cell, arity=arity, state=H, name="gru")

    def cell(self, v) -> None:
        H = self.H
        x = dy.affine_transform([self.b, self.Wz, v.pull()])
        hp = v.gather_sum()
        zr = dy.logistic(dy.pick_range(x, 0, 2 * H) + self.Uz * hp)
        z, r = dy.pick_range(zr, 0, H), dy.pick_range(zr, H, 2 * H)
        cand = dy.tanh(dy.pick_range(x, 2 * H, 3 * H) + self.Uh * dy.cmult(r, hp))
        h = dy.cmult(1 - z, hp) + dy.cmult(z, cand)
        v.scatter(h)
        v.push(h)


class HandLSTM:
    """A sequence LSTM step from primitive ops: one logistic over three gates, then slices."""

    def __init__(self, pc, rng, H: int = 3, D: int = 2, V: int = 9):
        self.H = H
        self.E = pc.add_lookup_parameters((V, D), init=rng.normal(size=(V, D)))
        self.W = pc.add_parameters((4 * H, D), init=rng.normal(size=(4 * H, D)))
        self.U = pc.add_parameters((4 * H, H), init=rng.normal(size=(4 * H, H)))
        self.b = pc.add_parameters((4 * H,), init=rng.normal(size=4 * H))
        self.fn = cavs.vertex_function(self.cell, arity=1, state=[H, H], name="lstm")

    def cell(self, v) -> None:
        H = self.H
        h0, c0 = v.gather(0)
        g = dy.affine_transform([self.b, self.W, v.pull(), self.U, h0])
        s = dy.logistic(dy.pick_range(g, 0, 3 * H))
        i, f, o = (dy.pick_range(s, k * H, (k + 1) * H) for k in range(3))
        c = dy.cmult(f, c0) + dy.cmult(i, dy.tanh(dy.pick_range(g, 3 * H, 4 * H)))
        h = dy.cmult(o, dy.tanh(c))
        v.scatter(h, c)
        v.push(h)


def _chains(rng, n: int = 4):
    graphs = []
    for L in rng.integers(1, 7, n):
        graphs.append({"children": [[]] + [[k] for k in range(int(L) - 1)]})
    words = [[int(w) for w in rng.integers(0, 9, len(g["children"]))] for g in graphs]
    return graphs, words


@pytest.mark.skipif(not CPU, reason="compiled kernels not built")
@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_hand_written_cells_run_fused_chains(float64, monkeypatch, model):
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    rng = np.random.default_rng(5)
    pc = dy.ParameterCollection()
    if model == "gru":
        m = HandGRU(pc, rng)
        graphs = [{"children": g} for g in (_random_dag(rng, int(n), 2) for n in rng.integers(1, 9, 5))]
        words = [[int(w) for w in rng.integers(0, 9, len(g["children"]))] for g in graphs]
    else:
        m = HandLSTM(pc, rng)
        graphs, words = _chains(rng)
    R = pc.add_parameters((2, m.H), init=rng.normal(size=(2, m.H)))

    def loss(**kw):
        out = cavs.run([m.fn], graphs, pull=(m.E, words), **kw)
        return _dag_loss([[R * p for p in out.pushed(s)] for s in range(len(graphs))])

    fused = _grads(pc, loss)
    plain = _grads(pc, lambda: loss(fuse=False))
    _assert_same(plain, fused)
    comp = next(c for key, c in m.fn.compiled_cache.items() if key[2])
    if model == "lstm":  # i, f, o, u slices: the N = 1 TreeLSTM cell (one fused op), whatever the spelling
        assert comp.fused == 1
    else:
        assert comp.rec.chains() >= 2, "the GRU's elementwise chains were not fused"


# ------------------------------------------------------------------ dy.block
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_compiles_to_one_fused_chain_in_a_block(float64, spelling):
    """A block's node cell in any spelling: the gate GEMM and ONE fused chain, and the
    numbers of the same cell recorded op by op and run unbatched."""
    rng = np.random.default_rng(11)
    H = 3
    pc = dy.ParameterCollection()
    U = [pc.add_parameters((5 * H, H), init=rng.normal(size=(5 * H, H))) for _ in range(2)]
    b = pc.add_parameters((5 * H,), init=rng.normal(size=5 * H))
    E = pc.add_lookup_parameters((9, 2 * H), init=rng.normal(size=(9, 2 * H)))

    def cell(hl, cl, hr, cr):
        return gates(spelling, dy.affine_transform([b, U[0], hl, U[1], hr]), [cl, cr], H)

    def loss(node):
        states = [(dy.pick_range(E[w], 0, H), dy.pick_range(E[w], H, 2 * H)) for w in (1, 4, 7, 2)]
        a, c = node(*states[0], *states[1]), node(*states[2], *states[3])
        top = node(*a, *c)
        return dy.sum_elems(dy.cmult(top[0], top[0])) + dy.sum_elems(top[1])

    blk = dy.block(cell, name=f"node-{spelling}")
    with_block = _grads(pc, lambda: loss(blk))
    with using("float64", 0, "none"):
        plain = _grads(pc, lambda: loss(cell))
    _assert_same(plain, with_block)
    plan = next(iter(blk._plans.values()))
    if plan.program is not None and plan.program.fuse and CPU:
        assert [u.kind for u in plan.program.units].count(FUSED) == 1
        assert len(plan.program.units) == 2


# ------------------------------------------------------------------ the rewrite itself
def _trace_of(fn, n_in: int, shape: tuple):
    from dynagraph.graph import ComputationGraph
    from dynagraph.subgraph import PLACEHOLDER
    T = ComputationGraph(scheduler="none")
    T.tracing = True
    with T:
        ins = [T.placeholder(PLACEHOLDER, shape) for _ in range(n_in)]
        outs = fn(*[dy.Expression(T, i) for i in ins])
    return T, ins, [o.i for o in outs]


def _ops(T, roots) -> list:
    from dynagraph.subgraph import _reachable
    return sorted(T.op[i].name for i in _reachable(T, roots) if not T.op[i].leaf)


def test_slices_first_moves_slices_before_elementwise_ops():
    from dynagraph.fusion import slices_first
    T, ins, outs = _trace_of(lambda x: [dy.pick_range(dy.pick_range(dy.logistic(x), 2, 6), 1, 3),
                                        dy.tanh(dy.pick_range(x, 0, 2))], 1, (8,))
    new, m = slices_first(T, ins + outs)
    o = m[outs[0]]
    assert new.op[o].name == "logistic" and new.op[new.args[o][0]].name == "pick_range"
    assert new.attrs[new.args[o][0]] == (3, 5, 0) and new.args[new.args[o][0]][0] == m[ins[0]]
    assert _ops(new, [m[i] for i in outs]) == ["logistic", "pick_range", "pick_range", "tanh"]


def test_slices_first_keeps_a_value_read_whole_and_leaves_plain_traces_alone():
    from dynagraph.fusion import slices_first
    # s = logistic(x) is read whole by the sum too: its slices stay slices of s (no recomputation)
    T, ins, outs = _trace_of(lambda x: [dy.pick_range(dy.logistic(x), 0, 2) + dy.pick_range(dy.logistic(x), 2, 4)],
                             1, (4,))
    assert slices_first(T, ins + outs) is not None  # two distinct logistic nodes, each only sliced
    def sliced_and_whole(x):
        s = dy.logistic(x)
        return [dy.pick_range(s, 0, 2), dy.sum_elems(s)]
    T, ins, outs = _trace_of(sliced_and_whole, 1, (4,))
    assert slices_first(T, ins + outs) is None
    T, ins, outs = _trace_of(lambda x, y: [dy.cmult(dy.logistic(x), dy.tanh(y))], 2, (3,))
    assert slices_first(T, ins + outs) is None


# ------------------------------------------------------------- random slice programs
_UNARY = ["logistic", "tanh", "exp", "square", "neg"]


def _apply(kind: str, x):
    return -x if kind == "neg" else getattr(dy, kind)(x)


@st.composite
def slice_programs(draw):
    """A vector of 8, then steps: a unary elementwise op or a slice of an earlier value,
    and at the end a sum of several values (some read whole, some only through slices)."""
    steps, sizes = [], [8]
    for _ in range(draw(st.integers(2, 9))):
        src = draw(st.integers(0, len(sizes) - 1))
        if draw(st.booleans()) and sizes[src] > 1:
            a = draw(st.integers(0, sizes[src] - 1))
            b = draw(st.integers(a + 1, sizes[src]))
            steps.append(("slice", src, a, b))
            sizes.append(b - a)
        else:
            steps.append((draw(st.sampled_from(_UNARY)), src))
            sizes.append(sizes[src])
    outs = draw(st.lists(st.integers(1, len(sizes) - 1), min_size=1, max_size=3, unique=True))
    return steps, outs


def _program(steps, outs):
    def fn(x):
        vals = [x]
        for s in steps:
            vals.append(dy.pick_range(vals[s[1]], s[2], s[3]) if s[0] == "slice" else _apply(s[0], vals[s[1]]))
        return [dy.sum_elems(dy.cmult(vals[o], vals[o])) for o in outs]
    return fn


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=slice_programs())
@example(prog=([("slice", 0, 0, 2), ("slice", 1, 0, 2)], [1, 2]))  # two identical slices of one shared row
def test_slices_first_keeps_every_value_and_gradient(prog):
    """Random mixes of slices and elementwise ops: a block compiled from the rewritten
    trace gives the numbers of the same code recorded op by op (float64, 1e-10)."""
    steps, outs = prog
    fn = _program(steps, outs)
    with using("float64", 0, "none"):
        pc = dy.ParameterCollection()
        x = pc.add_parameters((8,), init=np.linspace(-1.5, 1.2, 8))
        plain = _grads(pc, lambda: dy.esum(fn(dy.parameter(x))))
        for plan in (None, "planned"):  # the rewritten steps one by one, and as fused chains
            blk = dy.block(fn, name="slices", plan=plan)
            _assert_same(plain, _grads(pc, lambda blk=blk: dy.esum(list(blk(dy.parameter(x))))))
