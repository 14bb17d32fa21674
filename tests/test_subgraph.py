"""Static subgraphs (dy.block): one coarse node per call, same numbers as op-level code."""
import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dynagraph as dy
from refcheck import assert_same_run, executed_batches, run_graph

H = 3
SCHEDULERS = dy.schedulers.available()


@pytest.fixture(autouse=True, params=[None, "naive", "planned"])
def block_plan(request):
    """Every test runs with the planner off (None), naive and planned (dynagraph/program/)."""
    old = dy.config.config.block_plan
    dy.config.set(block_plan=request.param)
    yield request.param
    dy.config.config.block_plan = old


def _lstm_params(pc):
    return (pc.add_lookup_parameters((12, H)), pc.add_parameters((4 * H, H)),
            pc.add_parameters((4 * H, H)), pc.add_parameters(4 * H))


def _cell(E, W, U, b):
    def cell(x, h, c):
        g = dy.affine_transform([b, W, x, U, h])
        i, f, o = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(3))
        u = dy.tanh(g[3 * H:4 * H])
        c2 = dy.cmult(i, u) + dy.cmult(f, c)
        return dy.cmult(o, dy.tanh(c2)), c2
    return cell


def _sequences(blocked: bool):
    def build(pc):
        E, W, U, b = _lstm_params(pc)
        cell = _cell(E, W, U, b)
        step = dy.block(cell) if blocked else cell
        outs = []
        for s, length in enumerate([1, 4, 2, 3]):
            h, c = dy.zeros(H), dy.zeros(H)
            for t in range(length):
                h, c = step(E[(3 * s + t) % 12], h, c)
            outs.append(dy.pickneglogsoftmax(h, s % H))
            outs.append(c)
        return outs
    return build


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_blocked_lstm_equals_op_level(scheduler):
    ref = run_graph("none", _sequences(False))
    got = run_graph(scheduler, _sequences(True))
    assert_same_run(ref, got, rtol=1e-10, atol=1e-12)


def _trees(blocked: bool):
    """A TreeLSTM-like model with a leaf block taking a word index and a node block."""
    def build(pc):
        E = pc.add_lookup_parameters((20, H))
        WL, WR, b = pc.add_parameters((2 * H, H)), pc.add_parameters((2 * H, H)), pc.add_parameters(2 * H)
        Wo = pc.add_parameters((4, H))

        def leaf(w):
            return dy.tanh(E[w])

        def node(hl, hr):
            g = dy.affine_transform([b, WL, hl, WR, hr])
            return dy.cmult(dy.logistic(g[0:H]), dy.tanh(g[H:2 * H]))

        leaf_f, node_f = (dy.block(leaf), dy.block(node)) if blocked else (leaf, node)

        def enc(t):
            return leaf_f(t) if isinstance(t, int) else node_f(enc(t[0]), enc(t[1]))

        trees = [((1, 2), 3), (4, (5, (6, 7))), 8, ((9, 10), (11, 12))]
        return [dy.pickneglogsoftmax(Wo * enc(t), k % 4) for k, t in enumerate(trees)]
    return build


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_blocked_tree_equals_op_level_and_batches_calls(scheduler):
    ref = run_graph("none", _trees(False))
    got = run_graph(scheduler, _trees(True))
    assert_same_run(ref, got, rtol=1e-10, atol=1e-12)
    if scheduler != "none":
        sizes = [len(b) for b in executed_batches(got.cg) if b and got.cg.op[b[0]].name == "block:leaf"]
        assert max(sizes) >= 8  # all leaves of all trees in one call of the leaf plan


def test_block_records_one_node_per_call_plus_outputs():
    pc = dy.ParameterCollection()
    E, W, U, b = _lstm_params(pc)
    step = dy.block(_cell(E, W, U, b))
    cg = dy.renew_cg()
    h, c = dy.zeros(H), dy.zeros(H)
    before = len(cg)
    h, c = step(E[0], h, c)
    added = [cg.op[i].name for i in range(before, len(cg))]
    # lookup + leaves for the 3 parameters + the coarse node + two output views
    assert added.count("block:cell") == 1 and added.count("block_output") == 2
    assert h.dim() == ((H,), 1) and c.dim() == ((H,), 1)


def test_single_output_block_records_one_node_per_call():
    pc = dy.ParameterCollection()
    W = pc.add_parameters((H, H))
    cell = dy.block(lambda h: dy.tanh(W * h), name="one")
    cg = dy.renew_cg()
    h = dy.zeros(H)
    h = cell(h)      # the first call also records the parameter's node
    before = len(cg)
    h2 = cell(h)
    assert [cg.op[i].name for i in range(before, len(cg))] == ["block:one"]  # no block_output view
    assert h2.dim() == ((H,), 1)


def test_block_after_cg_revert_records_its_parameters_again():
    pc = dy.ParameterCollection()
    W = pc.add_parameters((H, H))
    cell = dy.block(lambda h: dy.tanh(W * h), name="one")
    dy.renew_cg()
    x = dy.inputVector([0.3, -0.2, 0.5])
    dy.cg_checkpoint()
    cell(x)          # records W's node after the checkpoint
    dy.cg_revert()   # ... which drops it: the plan's cached parameter ids are stale
    y = cell(x)
    want = np.tanh(W.as_array() @ np.array([0.3, -0.2, 0.5]))
    assert np.allclose(y.npvalue(), want, rtol=1e-6, atol=1e-6)


def _matrix_outputs(blocked: bool):
    """A block whose one output is a matrix, returned bare and as a 1-tuple."""
    def build(pc):
        W, V = pc.add_parameters((2 * H, H)), pc.add_parameters((2, H))

        def bare(x):
            return dy.reshape(dy.tanh(W * x), (H, 2))

        def tupled(m, x):
            return (dy.logistic(m * dy.tanh(V * x)),)
        f, g = (dy.block(bare), dy.block(tupled)) if blocked else (bare, tupled)
        outs = []
        for s in range(4):
            x = dy.inputVector([0.1 * (s + k) - 0.2 for k in range(H)])
            m = f(x)
            (y,) = g(m, x)
            outs.append(dy.sum_elems(dy.cmult(y, y)) + dy.sum_elems(m))
        return outs
    return build


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_single_output_blocks_equal_op_level(scheduler):
    ref = run_graph("none", _matrix_outputs(False))
    got = run_graph(scheduler, _matrix_outputs(True))
    assert_same_run(ref, got, rtol=1e-10, atol=1e-12)


def test_index_argument_is_checked_at_record_time():
    # dy.block's compiled call (block_call.c) hands a bad index to the Python twin, which words it
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((5, H))
    leaf = dy.block(lambda w: dy.tanh(E[w]))
    dy.renew_cg()
    leaf(4)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(dy.DynagraphIndexError) as err:
        leaf(5)
    msg = str(err.value)
    assert "block <lambda>" in msg and "lookup" in msg and "(5, 3)" in msg
    assert f"test_subgraph.py:{line}" in msg
    assert dy.cg().stats.nodes == 0  # raised while recording


def test_index_check_remembers_only_valid_indices():
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((5, H))
    leaf = dy.block(lambda w: dy.tanh(E[w]))
    dy.renew_cg()
    for w in (4, 4, 0, 4):   # valid indices, the repeats answered from the plan's memo
        leaf(w)
    for _ in range(2):       # an invalid one is never remembered: it raises every time
        with pytest.raises(dy.DynagraphIndexError):
            leaf(5)
        with pytest.raises(dy.DynagraphIndexError):
            leaf(-6)


def test_label_index_inside_block():
    pc = dy.ParameterCollection()
    W = pc.add_parameters((4, H), init=np.arange(4 * H, dtype=float).reshape(4, H) / 10)
    loss = dy.block(lambda x, y: dy.pickneglogsoftmax(W * x, y))
    dy.renew_cg()
    x = dy.inputVector([0.5, -1.0, 2.0])
    got = [loss(x, k).value() for k in range(4)]
    ref = [dy.pickneglogsoftmax(W * x, k).value() for k in range(4)]
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    with pytest.raises(dy.DynagraphIndexError, match="label 4"):
        loss(x, 4)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_dropout_inside_block_is_scheduler_invariant(scheduler):
    def build(pc):
        W = pc.add_parameters((6, H))
        f = dy.block(lambda x: dy.dropout(dy.tanh(W * x), 0.5))
        return [f(dy.inputVector([0.1 * k, 1.0, -0.5])) for k in range(5)]
    ref = run_graph("none", build)
    got = run_graph(scheduler, build)
    assert_same_run(ref, got)
    masks = np.array([v != 0 for v in got.values])
    assert masks.any() and not masks.all()
    assert len({m.tobytes() for m in masks}) > 1  # every call draws its own mask


def test_const_parameter_inside_block_gets_no_gradient():
    pc = dy.ParameterCollection()
    W, V = pc.add_parameters((H, H)), pc.add_parameters((H, H))
    f = dy.block(lambda x: dy.sum_elems(dy.const_parameter(W) * x + V * x))
    dy.renew_cg(scheduler="depth")
    dy.esum([f(dy.inputVector([1.0, 2.0, 3.0])) for _ in range(3)]).backward()
    assert not W.grad_as_array().any()
    np.testing.assert_allclose(V.grad_as_array(), 3 * np.tile([1.0, 2.0, 3.0], (H, 1)))


def test_retrace_per_argument_shape():
    f = dy.block(lambda x: dy.sum_elems(dy.square(x)))
    dy.renew_cg()
    assert f(dy.inputVector([1.0, 2.0])).value() == pytest.approx(5.0)
    assert f(dy.inputVector([1.0, 2.0, 3.0])).value() == pytest.approx(14.0)
    assert len(f._plans) == 2


def test_tracing_rejects_values_and_bad_arguments():
    peek = dy.block(lambda x: dy.scalarInput(dy.sum_elems(x).value()))
    dy.renew_cg()
    with pytest.raises(dy.DynagraphError, match="traced once"):
        peek(dy.inputVector([1.0]))
    with pytest.raises(TypeError, match="expressions or int"):
        dy.block(lambda x: x)(1.5)
    with pytest.raises(dy.DynagraphError, match="must return expressions"):
        dy.block(lambda x: 3)(dy.inputVector([1.0]))


def test_stats_count_inner_kernels():
    pc = dy.ParameterCollection()
    E, W, U, b = _lstm_params(pc)
    step = dy.block(_cell(E, W, U, b))
    cg = dy.renew_cg(scheduler="depth")
    outs = []
    for s in range(4):
        h, c = step(E[s], dy.zeros(H), dy.zeros(H))
        outs.append(dy.sum_elems(h))
    dy.esum(outs).value()
    by_op = cg.stats.by_op()
    assert by_op["block:cell"] == (4, 1)
    plan = next(iter(step._plans.values()))
    inner = len(plan.steps) if plan.program is None else len(plan.program.units)
    assert plan.op.inner_kernels == inner
    assert cg.stats.kernel_calls >= inner + 4


@pytest.mark.parametrize("name", ["VanillaLSTMBuilder", "GRUBuilder"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_blocked_builder_matches_unblocked(name, scheduler):
    def build(blocked):
        def f(pc):
            rnn = getattr(dy, name)(2, 3, 4, pc)
            rnn.set_blocked(blocked)
            outs = []
            for s, length in enumerate([3, 1, 4]):
                xs = [dy.inputVector([0.1 * (s + t), -0.2 * t, 0.3]) for t in range(length)]
                outs.extend(rnn.initial_state().transduce(xs))
            return outs
        return f
    ref = run_graph("none", build(False))
    got = run_graph(scheduler, build(True))
    assert_same_run(ref, got, rtol=1e-10, atol=1e-12)
    names = {got.cg.op[b[0]].name for b in executed_batches(got.cg)}
    assert any(n.startswith("block:") for n in names)


def test_blocked_builder_falls_back_with_dropout():
    pc = dy.ParameterCollection()
    rnn = dy.VanillaLSTMBuilder(1, 3, 4, pc)
    rnn.set_blocked(True)
    rnn.set_dropouts(0.5, 0.5)
    cg = dy.renew_cg()
    outs = rnn.initial_state().transduce([dy.inputVector([1.0, 2.0, 3.0])] * 3)
    outs[-1].value()
    assert not any(cg.op[b[0]].name.startswith("block:") for b in executed_batches(cg))


# ------------------------------------------------ calls of index-only blocks run once per distinct index
def _leaf_cells(blocked: bool, words: list, labels: list, two_outputs: bool):
    """Leaf cells of word ids (repeats: the plan runs once per distinct (word, label) pair) feeding
    a chain of node cells; a second index (the label) that differs must keep two calls apart."""
    def build(pc):
        E = pc.add_lookup_parameters((7, H))
        W, b = pc.add_parameters((2 * H, H)), pc.add_parameters(2 * H)
        U = pc.add_parameters((H, 2 * H))

        def leaf(w, y):
            g = dy.affine_transform([b, W, E[w]])
            c = dy.tanh(g[0:H]) + dy.pick(E[y], 0)
            h = dy.cmult(dy.logistic(g[H:2 * H]), dy.tanh(c))
            return (h, c) if two_outputs else h

        def node(a, z):
            return dy.tanh(U * dy.concatenate([a, z]))

        leaf_f, node_f = (dy.block(leaf), dy.block(node)) if blocked else (leaf, node)
        outs, h = [], None
        for w, y in zip(words, labels):
            cell = leaf_f(w, y)
            x = cell[0] if two_outputs else cell
            h = x if h is None else node_f(h, x)
            outs.append(cell[1] if two_outputs else x)
        return outs + [h]
    return build


@pytest.mark.parametrize("two_outputs", [True, False])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2)), min_size=2, max_size=14))
def test_repeated_index_calls_equal_op_level(scheduler, two_outputs, pairs):
    words, labels = [w for w, _ in pairs], [y for _, y in pairs]
    ref = run_graph("none", _leaf_cells(False, words, labels, two_outputs))
    got = run_graph(scheduler, _leaf_cells(True, words, labels, two_outputs))
    assert_same_run(ref, got, rtol=1e-10, atol=1e-12)


def test_index_only_block_runs_once_per_distinct_call(monkeypatch):
    """Twelve leaf calls over three distinct (word, label) pairs: the plan runs on three rows,
    every call still gets its own value, and calls differing in the second index stay apart."""
    from dynagraph import subgraph
    seen = []
    real = subgraph.Plan._forward_calls

    def spy(self, xp, data, xs):
        seen.append((self.name, len(data)))
        return real(self, xp, data, xs)
    monkeypatch.setattr(subgraph.Plan, "_forward_calls", spy)
    words, labels = [1, 2, 1, 1, 2, 1, 1, 2, 1, 1, 2, 1], [0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    ref = run_graph("none", _leaf_cells(False, words, labels, True))
    got = run_graph("agenda", _leaf_cells(True, words, labels, True))
    assert_same_run(ref, got, rtol=1e-10, atol=1e-12)
    assert ("leaf", 3) in seen
    vals = got.values[:len(words)]
    assert np.array_equal(vals[0], vals[3]) and not np.array_equal(vals[0], vals[2])


def test_repeated_index_call_shares_the_first_calls_nodes():
    """A leaf cell called twice with the same word in one graph records one coarse node; a new
    graph, a cg_revert() and share=False record again, and calls with other indices never share."""
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((5, H))
    leaf = dy.block(lambda w: (dy.tanh(E[w]), dy.logistic(E[w])), name="leaf2")
    cg = dy.renew_cg()
    a, b, c = leaf(1), leaf(1), leaf(2)
    assert [x.i for x in a] == [x.i for x in b] and a[0].i != c[0].i
    assert sum(cg.op[i].name == "block:leaf2" for i in range(len(cg))) == 2
    dy.cg_checkpoint()
    d = leaf(3)
    dy.cg_revert()                      # d's nodes are gone: a new call must record again
    e = leaf(3)
    assert np.allclose(e[0].npvalue(), np.tanh(E.row_as_array(3)))
    assert d[0].i == e[0].i and sum(cg.op[i].name == "block:leaf2" for i in range(len(cg))) == 3
    cg2 = dy.renew_cg()
    f = leaf(1)
    assert f[0].cg is cg2 and np.allclose(f[0].npvalue(), np.tanh(E.row_as_array(1)))
    own = dy.block(lambda w: dy.tanh(E[w]), name="own", share=False)
    assert own(4).i != own(4).i
