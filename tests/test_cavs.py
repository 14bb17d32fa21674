"""Cavs vertex functions (dy.cavs): same numbers as op-level code, interop, errors.

Every comparison runs in float64 against an op-level (or unbatched) evaluation of
the same function with the same weights, values and parameter gradients.
"""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest
from backend_params import BACKENDS as ALL_BACKENDS, unavailable
from refcheck import using

import dynagraph as dy
import dynagraph.cavs as cavs
from dynagraph.backends import get_backend

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
TOL = dict(rtol=1e-10, atol=1e-10)
BACKENDS = [p.values[0] for p in ALL_BACKENDS if unavailable(p.values[0]) is None]  # every backend this machine has


@pytest.fixture
def backend(request):
    saved = dy.config.config.backend
    dy.config.set(backend=request.param)
    yield request.param
    dy.config.config.backend = saved


@pytest.fixture(scope="module")
def three_ways():
    sys.path.insert(0, EXAMPLES)
    try:
        yield importlib.import_module("treelstm_three_ways")
    finally:
        sys.path.remove(EXAMPLES)


def _params(pc) -> list:
    return pc.parameters_list() + pc.lookup_parameters_list()


def _grads(pc, build) -> tuple[float, list]:
    """Loss value and every parameter's gradient for the loss `build()` records."""
    for p in _params(pc):
        p.grad[...] = 0
    dy.renew_cg()
    loss = build()
    value = loss.value()
    loss.backward()
    return value, [p.grad_as_array() for p in _params(pc)]


def _assert_same(ref: tuple, got: tuple) -> None:
    np.testing.assert_allclose(got[0], ref[0], **TOL)
    for a, b in zip(ref[1], got[1]):
        np.testing.assert_allclose(b, a, **TOL)


# ------------------------------------------------------------------ TreeLSTM three ways
def _tree_batch(ex, n: int = 6, seed: int = 3):
    from dynagraph.datasets import Vocab, synthetic_trees
    trees = synthetic_trees(n, vocab_size=30, max_len=9, seed=seed)
    vocab = Vocab.build(w for t in trees for w in t.words())
    return [ex.FlatTree(t, vocab) for t in trees], len(vocab)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_treelstm_three_ways_same_loss_and_gradients(three_ways, float64, backend):
    ex = three_ways
    flat, n_words = _tree_batch(ex)
    pc = dy.ParameterCollection()
    m = ex.CavsTreeLSTM(pc, n_words, 4, 5, n_labels=5)
    for p in pc.parameters_list():  # non-zero biases: every term of the gradient is exercised
        p.set_value(np.random.default_rng(len(p.name())).normal(0, 0.5, p.shape()))
    cells = ex.BlockCells(m)
    ref = _grads(pc, lambda: dy.esum(ex.op_level_losses(m, flat)))
    _assert_same(ref, _grads(pc, lambda: dy.esum(ex.block_losses(m, cells, flat))))
    _assert_same(ref, _grads(pc, lambda: dy.esum(ex.cavs_losses(m, flat))))
    if get_backend().fused_cells is not None:  # the compiled TreeLSTM cell replaced both gate chains
        assert all(c.fused == 1 for f in m.functions.values() for c in f.compiled_cache.values())


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_runs_reuse_the_workspace_without_changing_a_number(three_ways, float64, backend):
    """A run takes the buffers the previous run gave back (no fresh pages), and values
    a user kept from an earlier graph are not overwritten by the next one."""
    from dynagraph.memory.workspace import WORKSPACE
    ex = three_ways
    flat, n_words = _tree_batch(ex, n=7, seed=5)
    other, _ = _tree_batch(ex, n=4, seed=6)
    pc = dy.ParameterCollection()
    m = ex.CavsTreeLSTM(pc, n_words + 30, 4, 5, n_labels=5)
    WORKSPACE.clear()
    cold = _grads(pc, lambda: dy.esum(ex.cavs_losses(m, flat)))
    kept = dy.concatenate(m.run(other).roots()).npvalue()
    kept_copy = kept.copy()
    hits = WORKSPACE.hits
    warm = _grads(pc, lambda: dy.esum(ex.cavs_losses(m, flat)))
    if get_backend().xp is np:  # the workspace pools host buffers; a device backend allocates with its xp
        assert WORKSPACE.hits > hits  # the retired graphs' buffers came back and were taken
    np.testing.assert_array_equal(warm[0], cold[0])
    for a, b in zip(cold[1], warm[1]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(kept, kept_copy)


@pytest.mark.parametrize("defer, dedup", [(True, True), (True, False), (False, False)])
def test_optimisation_switches_keep_the_numbers(three_ways, float64, monkeypatch, defer, dedup):
    """Deferred weight gradients (one GEMM over all tasks) and hoisting per distinct word."""
    ex = three_ways
    flat, n_words = _tree_batch(ex, n=8, seed=4)
    pc = dy.ParameterCollection()
    m = ex.CavsTreeLSTM(pc, n_words, 4, 5, n_labels=5)
    ref = _grads(pc, lambda: dy.esum(ex.op_level_losses(m, flat)))
    monkeypatch.setattr(cavs, "DEFER_WEIGHT_GRADS", defer)
    monkeypatch.setattr(cavs, "DEDUP_HOISTED", dedup)
    dy.renew_cg()
    run = m.run(flat)._run
    assert bool(run.defer[1]) == defer and (run.dedup[0] is not None) == dedup
    _assert_same(ref, _grads(pc, lambda: dy.esum(ex.cavs_losses(m, flat))))


def test_vertex_function_is_traced_once(three_ways, float64):
    ex = three_ways
    flat, n_words = _tree_batch(ex)
    m = ex.CavsTreeLSTM(dy.ParameterCollection(), n_words, 4, 5, n_labels=5)
    for batch in (flat[:3], flat[3:], flat):
        dy.renew_cg()
        dy.esum(ex.cavs_losses(m, batch)).value()
    assert [len(f.compiled_cache) for f in m.functions.values()] == [1, 1]


# ------------------------------------------------------------------ random DAGs
def _random_dag(rng, n: int, arity: int) -> list:
    """Children lists in a shuffled vertex order; shared children (several parents), a
    child repeated in one list, and -1 pads (missing children) all occur."""
    kids = [[] for _ in range(n)]
    for v in range(1, n):
        k = int(rng.integers(0, arity + 1))
        kids[v] = [int(c) for c in rng.integers(0, v, size=k)]
        if k and rng.random() < 0.3:
            kids[v][int(rng.integers(k))] = -1
    perm = rng.permutation(n)
    pos = np.argsort(perm)
    return [[-1 if c < 0 else int(pos[c]) for c in kids[perm[i]]] for i in range(n)]


class DagRNN:
    """h_v = tanh(W x_v + U (sum of children's h) + b); push: a projection of h (lazy part)."""

    def __init__(self, pc, rng, H: int = 3, D: int = 2, V: int = 9, arity: int = 4):
        self.H, self.arity = H, arity
        self.E = pc.add_lookup_parameters((V, D), init=rng.normal(size=(V, D)))
        self.W = pc.add_parameters((H, D), init=rng.normal(size=(H, D)))
        self.U = pc.add_parameters((H, H), init=rng.normal(size=(H, H)) * 0.5)
        self.b = pc.add_parameters((H,), init=rng.normal(size=H))
        self.R = pc.add_parameters((2, H), init=rng.normal(size=(2, H)))
        self.fn = cavs.vertex_function(self.cell, arity=arity, state=H, name="dag")

    def cell(self, v) -> None:
        h = dy.tanh(self.W * v.pull() + self.U * v.gather_sum() + self.b)
        v.scatter(h)
        v.push(self.R * h)

    def unbatched(self, graphs, words) -> list:
        out = []
        for g, ws in zip(graphs, words):
            memo: dict = {}

            def h(v):
                if v not in memo:
                    real = [h(c) for c in g[v] if c >= 0]
                    s = dy.esum(real) if real else dy.zeros(self.H)
                    memo[v] = dy.tanh(self.W * dy.lookup(self.E, ws[v]) + self.U * s + self.b)
                return memo[v]
            out.append([self.R * h(v) for v in range(len(g))])
        return out


def _dag_loss(pushed: list) -> object:
    return dy.esum([dy.pickneglogsoftmax(p, v % 2) for ps in pushed for v, p in enumerate(ps)])


@pytest.mark.parametrize("seed", range(4))
def test_random_dags_match_unbatched(float64, seed):
    rng = np.random.default_rng(seed)
    pc = dy.ParameterCollection()
    model = DagRNN(pc, rng)
    graphs = [_random_dag(rng, int(n), model.arity) for n in rng.integers(1, 9, 5)]
    words = [[int(w) for w in rng.integers(0, 9, len(g))] for g in graphs]

    def batched():
        out = cavs.run(model.fn, graphs, pull=(model.E, words))
        return _dag_loss([out.pushed(s) for s in range(len(graphs))])

    with using(scheduler="none"):
        ref = _grads(pc, lambda: _dag_loss(model.unbatched(graphs, words)))
    _assert_same(ref, _grads(pc, batched))
    # the pushed values themselves, not only the loss
    dy.renew_cg()
    out = cavs.run(model.fn, graphs, pull=(model.E, words))
    got = [p.npvalue() for p in out.pushed(len(graphs) - 1)]
    dy.renew_cg()
    want = [p.npvalue() for p in model.unbatched(graphs, words)[-1]]
    np.testing.assert_allclose(got, want, **TOL)


def test_children_as_integer_arrays_give_the_same_run(float64):
    """(n, k) arrays padded with -1 are the fast input form; same numbers as lists."""
    rng = np.random.default_rng(7)
    pc = dy.ParameterCollection()
    model = DagRNN(pc, rng, arity=3)
    graphs = [_random_dag(rng, int(n), 3) for n in (1, 4, 8, 6)]
    words = [[int(w) for w in rng.integers(0, 9, len(g))] for g in graphs]
    padded = [np.array([c + [-1] * (3 - len(c)) for c in g], dtype=np.int32).reshape(len(g), 3) for g in graphs]

    def loss(gs):
        out = cavs.run(model.fn, gs, pull=(model.E, words))
        return _dag_loss([out.pushed(s) for s in range(len(gs))])
    _assert_same(_grads(pc, lambda: loss(graphs)), _grads(pc, lambda: loss(padded)))
    with pytest.raises(TypeError, match="integer"):
        dy.renew_cg()
        cavs.run(model.fn, [p.astype(float) for p in padded], pull=(model.E, words))


@pytest.mark.parametrize("as_array", [False, True])
def test_deep_chain_with_padding_uses_the_exact_fallback(float64, as_array):
    """Past 48 levels the heights come from a per-graph pass; -1 there is no child, not a cycle."""
    rng = np.random.default_rng(8)
    pc = dy.ParameterCollection()
    model = DagRNN(pc, rng, arity=2)
    n = 60
    chain = [[-1, -1]] + [[v - 1, -1] for v in range(1, n)]
    graphs = [np.array(chain) if as_array else chain]
    words = [[int(w) for w in rng.integers(0, 9, n)]]
    dy.renew_cg()
    out = cavs.run(model.fn, graphs, pull=(model.E, words))
    assert out._run.sched.depth == n
    with using(scheduler="none"):
        ref = _grads(pc, lambda: _dag_loss(model.unbatched([chain], words)))
    _assert_same(ref, _grads(pc, lambda: _dag_loss([cavs.run(model.fn, graphs, pull=(model.E, words)).pushed(0)])))


class NaryTreeLSTM:
    """Leaf (pulls a word) and node (arity-N TreeLSTM cell over gathered h and c): the pattern
    the "cpu" backend runs as one task kernel. push: h as is, or a projection of it."""

    def __init__(self, pc, rng, N: int = 3, H: int = 3, D: int = 2, V: int = 9, project: bool = False,
                 const_u: bool = False):
        self.N, self.H, self.project, self.const_u = N, H, project, const_u
        self.E = pc.add_lookup_parameters((V, D), init=rng.normal(size=(V, D)))
        self.W = pc.add_parameters((3 * H, D), init=rng.normal(size=(3 * H, D)))
        self.bw = pc.add_parameters((3 * H,), init=rng.normal(size=3 * H))
        self.U = [pc.add_parameters(((N + 3) * H, H), init=rng.normal(size=((N + 3) * H, H))) for _ in range(N)]
        self.b = pc.add_parameters(((N + 3) * H,), init=rng.normal(size=(N + 3) * H))
        self.R = pc.add_parameters((2, H), init=rng.normal(size=(2, H)))
        self.fns = {"leaf": cavs.vertex_function(self.leaf, arity=0), "node": cavs.vertex_function(self.node, arity=N)}

    def _gates(self, g, n: int, cs: list):
        H = self.H
        sl = [dy.pick_range(g, k * H, (k + 1) * H) for k in range(n + 3)]
        c = dy.cmult(dy.logistic(sl[0]), dy.tanh(sl[n + 2]))
        for k in range(n):
            c = c + dy.cmult(dy.logistic(sl[k + 1]), cs[k])
        return dy.cmult(dy.logistic(sl[n + 1]), dy.tanh(c)), c

    def _out(self, v, h, c) -> None:
        v.scatter(h, c)
        v.push(self.R * h if self.project else h)

    def leaf(self, v) -> None:
        self._out(v, *self._gates(dy.affine_transform([self.bw, self.W, v.pull()]), 0, []))

    def node(self, v) -> None:
        kids = [v.gather(k) for k in range(self.N)]
        us = [dy.const_parameter(u) if self.const_u else u for u in self.U]
        g = dy.affine_transform([self.b] + [x for u, (h, _) in zip(us, kids) for x in (u, h)])
        self._out(v, *self._gates(g, self.N, [c for _, c in kids]))


@pytest.mark.skipif("cpu" not in BACKENDS, reason="compiled kernels not built")
@pytest.mark.parametrize("seed, project, const_u", [(0, False, False), (1, True, False), (2, False, True)])
def test_cell_task_kernel_matches_op_steps(float64, monkeypatch, seed, project, const_u):
    """The TreeLSTM task kernel (one take, one GEMM, the compiled cell; leaf parts hoisted the
    same way) against the fused op steps and op-level code, on DAGs: shared children, a child
    repeated in one list and missing children (zeros) all occur; gradients of a constant U skipped."""
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    rng = np.random.default_rng(seed)
    pc = dy.ParameterCollection()
    m = NaryTreeLSTM(pc, rng, project=project, const_u=const_u)
    graphs = [_random_dag(rng, int(n), m.N) for n in rng.integers(1, 10, 6)]
    graphs = [{"children": g, "types": ["node" if ch else "leaf" for ch in g]} for g in graphs]
    words = [[int(w) for w in rng.integers(0, 9, len(g["children"]))] for g in graphs]

    def loss(**kw):
        out = cavs.run(m.fns, graphs, pull=(m.E, words), **kw)
        pushed = [out.pushed(s) for s in range(len(graphs))]
        if not project:
            pushed = [[m.R * p for p in ps] for ps in pushed]
        return _dag_loss(pushed)

    results = []
    for tasks, fuse in ((True, None), (False, None), (False, False)):
        monkeypatch.setattr(cavs, "CELL_TASKS", tasks)
        results.append(_grads(pc, lambda: loss(fuse=fuse)))
    monkeypatch.setattr(cavs, "CELL_TASKS", True)
    with monkeypatch.context() as mp:  # without a pass's cpu.TreeCellPlan: every call checked on its own
        mp.setattr(cavs.TreeLSTMPass, "forward_plan", lambda *a: None)
        mp.setattr(cavs.TreeLSTMPass, "backward_plan", lambda *a: None)
        results.append(_grads(pc, lambda: loss()))
    dy.renew_cg()
    r = cavs.run(m.fns, graphs, pull=(m.E, words))._run
    # a leaf pushing R h hoists R h too: that part is no longer the pattern, and runs op by op
    assert r.cell[0] is None and r.cell[1] is not None and (r.hoist_cell[0] is not None) == (not project)
    assert r.comps[1].push_direct == (not project)
    _assert_same(results[2], results[0])
    _assert_same(results[2], results[1])
    _assert_same(results[2], results[3])
    if const_u:
        assert all(not np.any(u.grad) for u in m.U)


def test_schedule_batches_by_height_across_graphs():
    # two chains of 3 and one lone vertex: heights 0,1,2 / 0,1,2 / 0 -> 3 tasks
    s = cavs._Schedule([[[], [0], [1]], [[], [0], [1]], [[]]], {"f": 0}, [1])
    assert [(t[1], t[2]) for t in s.tasks] == [(0, 3), (3, 5), (5, 7)]
    assert s.level.tolist() == [0, 1, 2, 0, 1, 2, 0]


# ------------------------------------------------------------------ interop
def _interop_model(pc, rng, H=3, D=2, V=6):
    E = pc.add_lookup_parameters((V, D), init=rng.normal(size=(V, D)))
    A = pc.add_parameters((D, D), init=rng.normal(size=(D, D)))
    W = pc.add_parameters((H, D), init=rng.normal(size=(H, D)))
    U = pc.add_parameters((H, H), init=rng.normal(size=(H, H)))
    R = pc.add_parameters((3, H), init=rng.normal(size=(3, H)))

    @cavs.vertex_function(arity=2, state=H)
    def cell(v):
        h = dy.tanh(W * v.pull() + U * (v.gather(0) + v.gather(1)))
        v.scatter(h)
        v.push(h)
    return E, A, W, U, R, cell


def test_interop_pull_from_imperative_push_into_losses(float64):
    """Pulled values are imperative expressions (tanh(A * E[w])); pushed values feed
    imperative losses; gradients flow both ways across the run."""
    rng = np.random.default_rng(7)
    pc = dy.ParameterCollection()
    E, A, W, U, R, cell = _interop_model(pc, rng)
    trees = [[[], [], [0, 1]], [[]], [[], [], [0, 1], [], [2, 3]]]
    words = [[1, 2, 0], [5], [3, 4, 0, 1, 2]]

    def x(w):
        return dy.tanh(A * dy.lookup(E, w))

    def op_level():
        losses = []
        for g, ws in zip(trees, words):
            hs = []
            for v, kids in enumerate(g):
                s = hs[kids[0]] + hs[kids[1]] if kids else dy.zeros(3)
                hs.append(dy.tanh(W * x(ws[v]) + U * s))
            losses += [dy.pickneglogsoftmax(R * h, v % 3) for v, h in enumerate(hs)]
        return dy.esum(losses)

    def with_cavs(pull_kind):
        if pull_kind == "lists":
            pull = [[x(w) for w in ws] for ws in words]
        else:
            pull = lambda s, v: x(words[s][v])  # noqa: E731
        out = cavs.run(cell, trees, pull=pull)
        return dy.esum([dy.pickneglogsoftmax(R * h, v % 3) for s in range(len(trees))
                        for v, h in enumerate(out.pushed(s))])

    ref = _grads(pc, op_level)
    assert np.abs(A.grad).sum() > 0  # the gradient reaches through the pulled expressions
    _assert_same(ref, _grads(pc, lambda: with_cavs("lists")))
    _assert_same(ref, _grads(pc, lambda: with_cavs("callable")))


@pytest.mark.parametrize("scheduler", ["none", "depth", "agenda"])
def test_run_node_under_every_scheduler(float64, scheduler):
    rng = np.random.default_rng(2)
    pc = dy.ParameterCollection()
    E, A, W, U, R, cell = _interop_model(pc, rng)
    trees, words = [[[], [], [0, 1]], [[], [], [1, 0]]], [[1, 2, 3], [4, 5, 0]]

    def build():
        out = cavs.run(cell, trees, pull=(E, words))
        return dy.esum([dy.pickneglogsoftmax(R * h, 1) for h in out.roots()])
    ref = _grads(pc, build)
    with using(scheduler=scheduler):
        _assert_same(ref, _grads(pc, build))


# ------------------------------------------------------------------ several functions
def test_several_vertex_functions(float64):
    """A leaf type and two node types with their own weights, mixed in one tree."""
    rng = np.random.default_rng(5)
    pc = dy.ParameterCollection()
    H = 3
    E = pc.add_lookup_parameters((8, H), init=rng.normal(size=(8, H)))
    Wa = pc.add_parameters((H, 2 * H), init=rng.normal(size=(H, 2 * H)))
    Wm = pc.add_parameters((H, H), init=rng.normal(size=(H, H)))
    R = pc.add_parameters((2, H), init=rng.normal(size=(2, H)))

    @cavs.vertex_function(arity=0)
    def leaf(v):
        v.scatter(dy.tanh(v.pull()))

    @cavs.vertex_function(arity=2)
    def plus(v):
        v.scatter(dy.tanh(Wa * dy.concatenate([v.gather(0), v.gather(1)])))

    @cavs.vertex_function(arity=2)
    def times(v):
        h = dy.cmult(v.gather(0), Wm * v.gather(1))
        v.scatter(h)
        v.push(R * h)

    graphs = [cavs.Graph([[], [], [0, 1], [], [2, 3]], ["leaf", "leaf", "plus", "leaf", "times"]),
              cavs.Graph([[], [], [1, 0]], ["leaf", "leaf", "times"]),
              {"children": [[], [], [0, 1], [2, 0]], "types": [0, 0, 1, 2]}]
    words = [[1, 2, -1, 3, -1], [4, 5, -1], [6, 7, -1, -1]]

    def op_level():
        losses = []
        for g, ws in zip(graphs, words):
            kids, types = (g.children, g.types) if isinstance(g, cavs.Graph) else (g["children"], g["types"])
            hs = []
            for v, (k, t) in enumerate(zip(kids, types)):
                if t in ("leaf", 0):
                    hs.append(dy.tanh(dy.lookup(E, ws[v])))
                elif t in ("plus", 1):
                    hs.append(dy.tanh(Wa * dy.concatenate([hs[k[0]], hs[k[1]]])))
                else:
                    hs.append(dy.cmult(hs[k[0]], Wm * hs[k[1]]))
            losses.append(dy.pickneglogsoftmax(R * hs[-1], len(ws) % 2))
        return dy.esum(losses)

    def with_cavs():
        out = cavs.run({"leaf": leaf, "plus": plus, "times": times}, graphs, pull=(E, words))
        return dy.esum([dy.pickneglogsoftmax(r, len(ws) % 2) for r, ws in zip(out.roots(), words)])
    _assert_same(_grads(pc, op_level), _grads(pc, with_cavs))


def test_hoisted_recursive_and_lazy_parts(float64):
    """W x (pull only) is hoisted, the recurrence runs per task, R h (push only) runs lazily."""
    rng = np.random.default_rng(0)
    model = DagRNN(dy.ParameterCollection(), rng)
    E = model.E
    dy.renew_cg()
    out = cavs.run(model.fn, [[[], [0], [1]]], pull=(E, [[0, 1, 2]]))
    out.root(0).value()
    c = next(iter(model.fn.compiled_cache.values()))
    ops = lambda part: [s[1].name for s in part.steps]  # noqa: E731
    assert ops(c.hoist) == ["matmul"]                       # W x, for every vertex at once
    assert "matmul" in ops(c.rec) and "tanh" in ops(c.rec)  # U (sum of children), per task
    assert ops(c.lazy) == ["matmul"]
    assert out.tasks == 3


# ------------------------------------------------------------------ errors before any kernel
@cavs.vertex_function(arity=2, state=2)
def _sum_cell(v):
    v.scatter(dy.tanh(v.gather(0) + v.gather(1) + v.pull()))


@cavs.vertex_function(arity=1, state=2)
def _bad_gather(v):
    v.scatter(v.gather(1))


@pytest.mark.parametrize("fn, graphs, match", [
    (_sum_cell, [[[1], [0]]], "cycle through vertex"),
    (_sum_cell, [[[], [2]]], "child 2, out of range"),
    (_sum_cell, [[[], [], [], [0, 1, 2]]], "arity 2"),
    (_bad_gather, [[[]]], r"gather\(1\) but its arity is 1"),
    ({"a": _sum_cell, "b": _sum_cell}, [cavs.Graph([[]], ["c"])], "has type 'c'"),
])
def test_errors_raise_at_run_before_any_kernel(fn, graphs, match):
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((4, 2))
    cg = dy.renew_cg()
    with pytest.raises(dy.DynagraphError, match=match):
        cavs.run(fn, graphs, pull=(E, [[0] * len(g if isinstance(g, list) else g.children) for g in graphs]))
    assert cg.stats.batches == 0 and len(cg) == 0


def test_output_errors():
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((4, 2))
    dy.renew_cg()
    out = cavs.run(_sum_cell, [[[], [], [0], [1]]], pull=(E, [[0, 1, 2, 3]]))
    with pytest.raises(dy.DynagraphError, match="never calls push"):
        out.push(0, 0)
    with pytest.raises(dy.DynagraphError, match="2 vertices without a parent"):
        out.root(0)
    with pytest.raises(IndexError):
        out.push(1, 0)


def test_state_shape_must_be_known():
    @cavs.vertex_function(arity=1)
    def chain(v):
        v.scatter(dy.tanh(v.gather(0)))
    with pytest.raises(dy.DynagraphError, match="state="):
        cavs.run(chain, [[[], [0]]])


# ------------------------------------------------------------------ examples
@pytest.mark.parametrize("name, args", [
    ("cavs_treelstm", ["--train", "32", "--dev", "16", "--epochs", "2", "--hidden", "8", "--emb-dim", "8"]),
    ("tree_fc", ["--train", "32", "--dev", "16", "--epochs", "2", "--hidden", "8"]),
    ("chain_lstm", ["--train", "24", "--test", "8", "--epochs", "2", "--hidden", "8", "--emb-dim", "8"]),
    ("dag_rnn", ["--graphs", "40", "--epochs", "3", "--hidden", "8"]),
    ("treelstm_three_ways", ["--trees", "24", "--batch-size", "8", "--batches", "2", "--hidden", "8"]),
])
def test_examples_run(name, args, monkeypatch, tmp_path):
    monkeypatch.setenv("DYNAGRAPH_DATA", str(tmp_path))  # synthetic data only: tests never read ../shared
    sys.path.insert(0, EXAMPLES)
    try:
        r = importlib.import_module(name).main(args + ["--quiet"])
    finally:
        sys.path.remove(EXAMPLES)
    if name == "treelstm_three_ways":
        ref = r["op-level"]["losses"]
        assert len(ref) == 2 and np.isfinite(ref).all()
        np.testing.assert_allclose(r["block"]["losses"], ref, rtol=1e-4)
        np.testing.assert_allclose(r["vertex"]["losses"], ref, rtol=1e-4)
    else:
        losses = [h["loss"] for h in r["history"]]
        assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_bench_models_compute_the_same_loss(float64):
    """bench/cavs_bench.py compares like with like: op level, dy.block and dy.cavs models
    give the same loss on the same data and weights, also after an SGD step."""
    root = os.path.dirname(EXAMPLES)
    sys.path.insert(0, root)
    try:
        from bench import cavs_bench, params, workloads
    finally:
        sys.path.remove(root)
    samples, vocab = workloads.load("treelstm", 8, 0)
    arrays = {k: v.astype(np.float64) for k, v in params.init_arrays("treelstm", 4, vocab, 5, seed=0).items()}
    models = [cavs_bench.DyModel(dy, "treelstm", arrays, 0.1, {"scheduler": "depth"}),
              cavs_bench.BlockModel(dy, "treelstm", arrays, 0.1), cavs_bench.CavsModel(dy, "treelstm", arrays, 0.1)]
    for batch in (samples[:4], samples[4:]):
        losses = [m.step(batch, True) for m in models]
        np.testing.assert_allclose(losses[1:], [losses[0]] * 2, rtol=1e-10)


def test_graph_from_tree():
    from dynagraph.datasets import parse_tree
    g, nodes = cavs.Graph.from_tree(parse_tree("(3 (2 a) (4 (1 b) (0 c)))"))
    assert g.children == [[], [], [], [1, 2], [0, 3]]
    assert g.types == ["leaf", "leaf", "leaf", "node", "node"]
    assert [n.word for n in nodes[:3]] == ["a", "b", "c"]


@pytest.mark.skipif("cpu" not in BACKENDS, reason="compiled kernels not built")
def test_fused_lstm_chain_matches_unfused(float64, monkeypatch):
    """The chain LSTM step is the N = 1 case of the fused cell: same numbers either way."""
    sys.path.insert(0, EXAMPLES)
    try:
        chain = importlib.import_module("chain_lstm")
    finally:
        sys.path.remove(EXAMPLES)
    monkeypatch.setattr(dy.config.config, "backend", "cpu")
    pc = dy.ParameterCollection()
    model = chain.ChainLSTM(pc, 10, 3, 4, 5)
    sents = [([1, 2, 3], [0, 1, 2]), ([4], [1]), ([5, 6, 7, 8, 9], [2, 2, 0, 1, 0])]
    results = []
    for fuse in (False, True):
        monkeypatch.setattr(cavs, "fusion_available", lambda: fuse)
        results.append(_grads(pc, lambda: dy.esum(model.losses(sents))))
    assert [c.fused for c in model.step.compiled_cache.values()] == [0, 1]
    _assert_same(*results)


@pytest.mark.skipif("cpu" not in BACKENDS, reason="compiled kernels not built")
def test_bench_runs_each_backend_in_its_own_worker(tmp_path, monkeypatch):
    """cavs_bench's dynagraph:<variant>@<backend> runs that backend, side by side with the default."""
    monkeypatch.delenv("DYNAGRAPH_BACKEND", raising=False)  # the workers' default is the cpu backend
    root = os.path.dirname(EXAMPLES)
    sys.path.insert(0, root)
    try:
        from bench import cavs_bench
    finally:
        sys.path.remove(root)
    out = tmp_path / "b.json"
    doc = cavs_bench.main(["--systems", "dynagraph:cavs,dynagraph:cavs@numpy", "--H", "4", "--threads", "1",
                           "--rounds", "1", "--batches", "1", "--out", str(out), "--quiet"])
    got = {r["system"]: r for r in doc["results"]}
    assert got["dynagraph:cavs"]["versions"]["backend"] == "cpu"
    assert got["dynagraph:cavs@numpy"]["versions"]["backend"] == "numpy"
    assert all(r["samples_per_sec"] > 0 for r in got.values())
    np.testing.assert_allclose(got["dynagraph:cavs@numpy"]["losses"], got["dynagraph:cavs"]["losses"], rtol=1e-5)
