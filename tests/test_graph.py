"""Graph recording, lazy evaluation and graph lifecycle, with DyNet's semantics.

Evaluation is observed two ways: the public counters in `cg.stats`, and a
`Probe` op (an identity whose forward counts the rows it computed). The probe is
an unregistered OpDef, so the op registry and its coverage tests never see it.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.expression import record1
from dynagraph.ops.base import OpDef, same_shape


class Probe:
    """An identity op whose forward records how many nodes it evaluated."""

    def __init__(self) -> None:
        self.rows = 0
        self.op = OpDef("probe", same_shape, self._forward, self._backward)

    def _forward(self, xp, attrs, data, x):
        self.rows += x.shape[0]
        return x.copy()

    @staticmethod
    def _backward(xp, attrs, data, xs, y, g, need):
        return (g,)

    def __call__(self, x: dy.Expression) -> dy.Expression:
        return record1(self.op, x)


def counters(cg) -> dict:
    """Everything in the stats except wall-clock times (those move on every call)."""
    return {k: v for k, v in cg.stats.as_dict().items() if not k.startswith("t_")}


@pytest.fixture
def probe() -> Probe:
    return Probe()


# ---------------------------------------------------------------- recording is free
def test_recording_computes_nothing(probe, pc):
    cg = dy.renew_cg()
    W, b = pc.add_parameters((3, 4)), pc.add_parameters(3)
    x = dy.inputVector([1.0, 2.0, 3.0, 4.0])
    loss = dy.sum_elems(probe(dy.tanh(W * x + b)))
    assert len(cg) > 5
    assert loss.dim() == ((1,), 1)  # shapes are known without evaluating
    assert probe.rows == 0
    assert cg.stats.nodes == 0 and cg.stats.batches == 0 and cg.done == 0


def test_value_evaluates_every_pending_node_up_to_itself(probe):
    """DyNet's incremental_forward: nodes with a smaller id run too, later ones do not."""
    cg = dy.cg()
    a = probe(dy.inputVector([1.0]))
    b = probe(dy.inputVector([2.0]))
    c = probe(dy.inputVector([3.0]))
    assert b.value() == 2.0
    assert probe.rows == 2  # a and b, not c
    assert cg.done == b.i + 1 and cg.done <= c.i
    before = counters(cg)
    assert a.value() == 1.0  # already computed by b.value()
    assert probe.rows == 2 and counters(cg) == before
    assert c.value() == 3.0
    assert probe.rows == 3


def test_value_is_cached(probe):
    cg = dy.cg()
    e = dy.exp(probe(dy.inputVector([0.0, 1.0])))
    first = e.value()
    snapshot = counters(cg)
    assert e.value() == first
    np.testing.assert_allclose(e.npvalue(), np.exp([0.0, 1.0]), rtol=1e-6)
    assert counters(cg) == snapshot and probe.rows == 1


def test_forward_evaluates_and_caches(probe):
    cg = dy.cg()
    e = probe(dy.inputVector([5.0]))
    assert e.forward() is e  # chaining: e.forward().value()
    assert probe.rows == 1 and cg.stats.nodes > 0
    snapshot = counters(cg)
    assert e.value() == 5.0 and counters(cg) == snapshot


def test_graph_forward_evaluates_all_pending(probe):
    cg = dy.cg()
    es = [probe(dy.inputVector([float(i)])) for i in range(4)]
    cg.forward()
    assert probe.rows == 4 and cg.done == len(cg)
    assert [e.value() for e in es] == [0.0, 1.0, 2.0, 3.0] and probe.rows == 4


def test_backward_evaluates_pending_nodes_itself(pc):
    W = pc.add_parameters((2, 3), init=np.ones((2, 3)))
    loss = dy.sum_elems(W * dy.inputVector([1.0, 2.0, 3.0]))
    loss.backward()  # no value() first
    np.testing.assert_allclose(W.grad_as_array(), [[1, 2, 3], [1, 2, 3]])
    assert loss.value() == 12.0


def test_npvalue_is_a_copy():
    e = dy.inputVector([1.0, 2.0])
    v = e.npvalue()
    v[0] = 99.0
    assert e.value() == [1.0, 2.0]


# ----------------------------------------------------------- value types (as DyNet)
@pytest.mark.parametrize("shape, kind", [
    ((1,), float), ((4,), list), ((2, 3), np.ndarray), ((1, 1), np.ndarray), ((3, 1), np.ndarray),
    ((2, 3, 4), np.ndarray),
])
def test_value_type_and_dim(shape, kind):
    arr = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    e = dy.inputTensor(arr)
    v = e.value()
    assert type(v) is kind
    assert e.dim() == (shape, 1)
    assert e.npvalue().shape == shape and isinstance(e.npvalue(), np.ndarray)
    np.testing.assert_array_equal(np.asarray(v).reshape(shape), arr)


def test_scalar_value():
    assert dy.scalarInput(2.5).scalar_value() == 2.5
    assert isinstance(dy.scalarInput(2).scalar_value(), float)
    assert dy.sum_elems(dy.inputVector([1.0, 2.0])).scalar_value() == 3.0


@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (2, 3, 4)])
def test_vec_value_is_column_major(shape):
    arr = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    v = dy.inputTensor(arr).vec_value()
    assert isinstance(v, list)
    assert v == arr.flatten(order="F").tolist()


def test_vec_value_of_vector_and_scalar():
    assert dy.inputVector([3.0, 1.0, 2.0]).vec_value() == [3.0, 1.0, 2.0]
    assert dy.scalarInput(4.0).vec_value() == [4.0]


def test_input_matrix_is_column_major():
    m = dy.inputMatrix([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (2, 3))
    np.testing.assert_array_equal(m.npvalue(), [[1, 3, 5], [2, 4, 6]])


# ---------------------------------------------------------------- backward/gradient
def test_backward_then_gradient(pc):
    W = pc.add_parameters((2, 3), init=np.arange(6.0).reshape(2, 3))
    b = pc.add_parameters(2, init=np.array([0.5, -0.5]))
    x = dy.inputVector([1.0, 2.0, 3.0])
    h = W * x + b
    loss = dy.sum_elems(dy.cmult(h, h))
    loss.backward()
    hv = np.arange(6.0).reshape(2, 3) @ [1, 2, 3] + [0.5, -0.5]
    np.testing.assert_allclose(h.gradient(), 2 * hv, rtol=1e-6)
    np.testing.assert_allclose(loss.gradient(), [1.0])
    np.testing.assert_allclose(W.grad_as_array(), np.outer(2 * hv, [1, 2, 3]), rtol=1e-6)
    np.testing.assert_allclose(b.grad_as_array(), 2 * hv, rtol=1e-6)
    assert isinstance(h.gradient(), np.ndarray) and h.gradient().shape == (2,)


def test_input_gradient_needs_full(pc):
    """As in DyNet: nodes that no parameter depends on get a gradient only with full=True."""
    W = pc.add_parameters((2, 3), init=np.arange(6.0).reshape(2, 3))
    x = dy.inputVector([1.0, 2.0, 3.0])
    loss = dy.sum_elems(W * x)
    loss.backward()
    np.testing.assert_array_equal(x.gradient(), np.zeros(3))
    loss.backward(full=True)
    np.testing.assert_allclose(x.gradient(), [3.0, 5.0, 7.0])


def test_gradient_before_backward_raises():
    e = dy.tanh(dy.inputVector([1.0]))
    e.value()
    with pytest.raises(dy.DynagraphError, match="backward"):
        e.gradient()


def test_backward_on_non_scalar_raises(pc):
    W = pc.add_parameters((2, 3))
    h = W * dy.inputVector([1.0, 2.0, 3.0])
    with pytest.raises(dy.DynagraphError) as ei:
        h.backward()
    msg = str(ei.value)
    assert "scalar" in msg and "(2,)" in msg
    assert not W.grad_as_array().any()


def test_gradient_of_node_evaluated_after_backward_is_zero(pc):
    W = pc.add_parameters((2, 3))
    h = W * dy.inputVector([1.0, 2.0, 3.0])
    dy.sum_elems(h).backward()
    late = dy.tanh(h)
    late.value()
    np.testing.assert_array_equal(late.gradient(), np.zeros(2))


def test_recalculate_after_parameter_change(pc):
    W = pc.add_parameters((1, 2), init=np.array([[1.0, 2.0]]))
    y = W * dy.inputVector([3.0, 4.0])
    assert y.value() == 11.0
    W.set_value(np.array([[0.0, 1.0]]))
    assert y.value() == 11.0  # cached, as in DyNet
    assert y.value(recalculate=True) == 4.0
    assert y.npvalue().tolist() == [4.0]
    W.set_value(np.array([[1.0, 1.0]]))
    assert y.scalar_value(recalculate=True) == 7.0
    assert y.vec_value(recalculate=True) == [7.0]


def test_backward_after_recalculate_uses_new_values(pc):
    W = pc.add_parameters(2, init=np.array([1.0, 2.0]))
    loss = dy.sum_elems(dy.cmult(W, W))
    assert loss.value() == 5.0
    W.set_value(np.array([3.0, -1.0]))
    loss.forward(recalculate=True)
    loss.backward()
    np.testing.assert_allclose(W.grad_as_array(), [6.0, -2.0])


def test_gradients_accumulate_until_reset(pc):
    W = pc.add_parameters((2, 2), init=np.eye(2))
    E = pc.add_lookup_parameters((3, 2), init=np.ones((3, 2)))
    loss = dy.sum_elems(W * E[1])
    loss.backward()
    g1, e1 = W.grad_as_array(), E.grad_as_array()
    assert g1.any() and e1[1].any() and not e1[0].any()
    loss.backward()
    np.testing.assert_allclose(W.grad_as_array(), 2 * g1)
    np.testing.assert_allclose(E.grad_as_array(), 2 * e1)
    dy.renew_cg()  # accumulation spans graphs too
    dy.sum_elems(W * E[1]).backward()
    np.testing.assert_allclose(W.grad_as_array(), 3 * g1)
    pc.reset_gradient()
    assert not W.grad_as_array().any() and not E.grad_as_array().any()


# ------------------------------------------------------------------ graph lifecycle
def test_renew_cg_retires_the_default_graph():
    old = dy.inputVector([1.0, 2.0])
    old_cg = dy.cg()
    new_cg = dy.renew_cg()
    assert new_cg is dy.cg() and new_cg is not old_cg
    assert old_cg.retired and not new_cg.retired
    fresh = dy.inputVector([3.0, 4.0])
    stale_uses = [
        lambda: old.value(),
        lambda: old.npvalue(),
        lambda: dy.tanh(old),
        lambda: old + 1,
        lambda: old + fresh,
        lambda: fresh + old,
        lambda: dy.cmult(fresh, old),
        lambda: dy.esum([fresh, old]),
        lambda: dy.concatenate([old, fresh]),
    ]
    for use in stale_uses:
        with pytest.raises(dy.StaleExpressionError, match="stale"):
            use()
    assert fresh.value() == [3.0, 4.0]  # the new graph is unharmed


def test_stale_error_is_a_dynagraph_error():
    assert issubclass(dy.StaleExpressionError, dy.DynagraphError)
    assert issubclass(dy.DynagraphError, ValueError)


def test_stale_parameter_expression(pc):
    W = pc.add_parameters((2, 2))
    We = dy.parameter(W)
    dy.renew_cg()
    with pytest.raises(dy.StaleExpressionError):
        We * dy.inputVector([1.0, 2.0])
    assert (W * dy.inputVector([1.0, 2.0])).dim() == ((2,), 1)  # Parameters themselves never go stale


def test_cg_version_changes_on_renew():
    v0 = dy.cg_version()
    assert dy.cg_version() == v0
    dy.renew_cg()
    v1 = dy.cg_version()
    assert v1 != v0
    dy.renew_cg()
    assert dy.cg_version() not in (v0, v1)


def test_parameter_expression_is_one_node_per_graph(pc):
    cg = dy.cg()
    W = pc.add_parameters((2, 2))
    a = dy.parameter(W)
    n = len(cg)
    b = dy.parameter(W)
    assert a.i == b.i and len(cg) == n
    ws = dy.parameter(W, W)
    assert isinstance(ws, list) and len(ws) == 2


def test_explicit_graphs_are_independent(probe):
    g1, g2 = dy.ComputationGraph(), dy.ComputationGraph()
    default = dy.cg()
    with g1:
        assert dy.cg() is g1 and dy.cg_version() == g1.version
        a = probe(dy.inputVector([1.0, 2.0]))
        with g2:
            assert dy.cg() is g2
            b = probe(dy.inputVector([3.0]))
        assert dy.cg() is g1
    assert dy.cg() is default
    assert a.cg is g1 and b.cg is g2 and len(default) == 0
    assert (a + 1).cg is g1  # new nodes follow their arguments, not the current graph
    assert a.value() == [1.0, 2.0]
    assert g2.stats.nodes == 0 and g2.done == 0 and probe.rows == 1
    assert b.value() == 3.0 and probe.rows == 2
    assert g1.stats.nodes == 2  # input + probe; g2's work is not counted here


def test_renew_cg_does_not_retire_explicit_graphs():
    g = dy.ComputationGraph()
    with g:
        x = dy.inputVector([1.0])
    dy.renew_cg()
    assert not g.retired
    assert dy.tanh(x).value() == pytest.approx(np.tanh(1.0))


def test_mixing_live_graphs_raises():
    g1, g2 = dy.ComputationGraph(), dy.ComputationGraph()
    with g1:
        a = dy.inputVector([1.0, 2.0])
    with g2:
        b = dy.inputVector([3.0, 4.0])
    for use in (lambda: a + b, lambda: dy.cmult(a, b), lambda: dy.esum([a, b]), lambda: dy.concatenate([b, a])):
        with pytest.raises(dy.DynagraphError, match="different ComputationGraphs") as ei:
            use()
        assert not isinstance(ei.value, dy.StaleExpressionError)
    assert len(g1) == 1 and len(g2) == 1  # nothing half-recorded


def test_parameters_join_the_graph_of_their_expression_operand(pc):
    W = pc.add_parameters((2, 3), init=np.ones((2, 3)))
    b = pc.add_parameters(2, init=np.ones(2))
    g = dy.ComputationGraph()
    with g:
        x = dy.inputVector([1.0, 2.0, 3.0])
    y = dy.affine_transform([b, W, x])  # the parameters join x's graph
    assert y.cg is g and y.value() == [7.0, 7.0]
    z = y + b  # Expression on the left: b joins y's graph
    assert z.cg is g and z.value() == [8.0, 8.0]
    assert len(dy.cg()) == 0


def test_parameter_on_left_joins_operand_graph(pc):
    W = pc.add_parameters((2, 3), init=np.ones((2, 3)))
    b = pc.add_parameters(2, init=np.ones(2))
    g = dy.ComputationGraph()
    with g:
        x = dy.inputVector([1.0, 2.0, 3.0])
    y = W * x + b
    assert y.cg is g and y.value() == [7.0, 7.0]


def test_immediate_compute_evaluates_eagerly(probe):
    cg = dy.renew_cg(immediate_compute=True)
    x = dy.inputVector([1.0, 2.0])
    assert cg.done == len(cg)
    y = probe(x)
    assert probe.rows == 1 and cg.done == len(cg)
    snapshot = counters(cg)
    assert y.value() == [1.0, 2.0] and counters(cg) == snapshot


@pytest.mark.parametrize("kw, name", [
    ({"scheduler": "depth"}, "depth"), ({"scheduler": "none"}, "none"), ({"scheduler": "agenda"}, "agenda"),
    ({"autobatching": False}, "none"),
])
def test_renew_cg_scheduler(kw, name, pc):
    W = pc.add_parameters((3, 2), init=np.arange(6.0).reshape(3, 2))
    cg = dy.renew_cg(**kw)
    assert cg.scheduler == name
    losses = [dy.sum_elems(dy.tanh(W * dy.inputVector([float(i), 1.0]))) for i in range(4)]
    total = dy.esum(losses)
    expected = sum(np.tanh(np.arange(6.0).reshape(3, 2) @ [i, 1.0]).sum() for i in range(4))
    assert total.value() == pytest.approx(expected, rel=1e-5)
    total.backward()
    assert W.grad_as_array().shape == (3, 2) and W.grad_as_array().any()


def test_identical_nodes_are_batched_under_agenda():
    cg = dy.renew_cg(scheduler="agenda")
    ys = [dy.tanh(dy.inputVector([float(i)])) for i in range(5)]
    dy.esum(ys).value()
    assert cg.stats.by_op()["tanh"] == (5, 1)
    cg = dy.renew_cg(scheduler="none")
    ys = [dy.tanh(dy.inputVector([float(i)])) for i in range(5)]
    dy.esum(ys).value()
    assert cg.stats.by_op()["tanh"] == (5, 5)


# ------------------------------------------------------------------- parameters API
def test_init_from_numpy_keeps_row_major_shape(pc):
    arr = np.arange(6.0).reshape(2, 3)
    W = pc.add_parameters((2, 3), init=arr)
    assert W.shape() == (2, 3)
    np.testing.assert_array_equal(W.as_array(), arr)
    np.testing.assert_array_equal(dy.parameter(W).npvalue(), arr)
    assert dy.parameter(W)[1].value() == [3.0, 4.0, 5.0]  # row 1: DyNet picks along dim 0
    P = pc.parameters_from_numpy(arr.T)
    assert P.shape() == (3, 2)
    np.testing.assert_array_equal(P.as_array(), arr.T)


def test_init_array_of_wrong_shape_raises(pc):
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        pc.add_parameters((2, 3), init=np.ones((3, 2)))


@pytest.mark.parametrize("shape, bound", [
    ((30, 50), np.sqrt(6 / 80)),      # matrices: uniform(+-sqrt(6/(rows+cols)))
    ((3000,), np.sqrt(3 / 3000)),     # vectors: uniform(+-sqrt(3/n))
    ((10, 20, 30), np.sqrt(9 / 60)),  # DyNet's general rule: sqrt(3*nd/sum(dims))
])
def test_glorot_default_bounds(pc, shape, bound):
    for init in (None, "glorot", dy.GlorotInitializer()):
        v = pc.add_parameters(shape, init=init).as_array()
        assert v.shape == shape
        assert np.abs(v).max() <= bound * (1 + 1e-6)
        assert np.abs(v).max() > 0.9 * bound  # spread over the whole interval
        assert abs(v.mean()) < 0.1 * bound


def test_lookup_glorot_default_matches_dynet(pc):
    v = pc.add_lookup_parameters((1000, 40)).as_array()
    bound = np.sqrt(6 / 1040)
    assert np.abs(v).max() <= bound * (1 + 1e-6) and np.abs(v).max() > 0.9 * bound


def test_uniform_normal_and_constant_inits(pc):
    u = pc.add_parameters((4000,), init="uniform", scale=0.3).as_array()
    assert np.abs(u).max() <= 0.3 and np.abs(u).max() > 0.29
    u2 = pc.add_parameters((4000,), init=dy.UniformInitializer(2.0)).as_array()
    assert np.abs(u2).max() <= 2.0 and np.abs(u2).max() > 1.9
    n = pc.add_parameters((20000,), init="normal").as_array()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1.0) < 0.05
    n2 = pc.add_parameters((20000,), init=dy.NormalInitializer(2.0, 4.0)).as_array()  # (mean, var)
    assert abs(n2.mean() - 2.0) < 0.1 and abs(n2.std() - 2.0) < 0.1
    np.testing.assert_array_equal(pc.add_parameters((2, 2), init=0.25).as_array(), np.full((2, 2), 0.25))
    np.testing.assert_array_equal(pc.add_parameters(3, init=2).as_array(), [2, 2, 2])
    np.testing.assert_array_equal(pc.add_parameters(3, init=dy.ConstInitializer(-1.5)).as_array(), [-1.5] * 3)


def test_identity_and_saxe_inits(pc):
    np.testing.assert_array_equal(pc.add_parameters((3, 3), init="identity").as_array(), np.eye(3))
    np.testing.assert_array_equal(pc.add_parameters((2, 2), init=dy.IdentityInitializer()).as_array(), np.eye(2))
    with pytest.raises(ValueError, match="square"):
        pc.add_parameters((2, 3), init="identity")
    q = pc.add_parameters((4, 4), init=dy.SaxeInitializer()).as_array()
    np.testing.assert_allclose(q @ q.T, np.eye(4), atol=1e-5)


def test_unknown_init_name_raises(pc):
    with pytest.raises(ValueError, match="bogus"):
        pc.add_parameters(3, init="bogus")


def test_parameter_names_follow_dynet(pc):
    a, b = pc.add_parameters(2), pc.add_parameters(2)
    w = pc.add_parameters(2, name="W")
    w1 = pc.add_parameters(2, name="W")
    sub = pc.add_subcollection("enc")
    sw = sub.add_parameters(2, name="W")
    se = sub.add_lookup_parameters((3, 2))
    s1 = sub.add_parameters(2)
    assert [p.name() for p in (a, b, w, w1)] == ["/_0", "/_1", "/W", "/W_1"]
    assert sub.name() == "/enc/"
    assert [sw.name(), se.name(), s1.name()] == ["/enc/W", "/enc/_0", "/enc/_1"]  # one counter per collection


def test_unnamed_subcollection_names_follow_dynet(pc):
    pc.add_parameters(2), pc.add_parameters(2)
    s0, s1 = pc.add_subcollection(), pc.add_subcollection()
    assert (s0.name(), s1.name()) == ("/_0/", "/_1/")
    assert s0.add_parameters(2).name() == "/_0/_0"


def test_parameters_list_is_creation_order(pc):
    a = pc.add_parameters(2)
    sub = pc.add_subcollection("s")
    e1 = sub.add_lookup_parameters((3, 2))
    b = sub.add_parameters(2)
    c = pc.add_parameters(2)
    e2 = pc.add_lookup_parameters((4, 2))
    d = sub.add_parameters(2)
    assert pc.parameters_list() == [a, b, c, d]
    assert pc.lookup_parameters_list() == [e1, e2]
    assert sub.parameters_list() == [b, d] and sub.lookup_parameters_list() == [e1]
    assert pc.parameter_count() == 2 * 4 + 3 * 2 + 4 * 2


def test_parameter_storage_methods(pc):
    W = pc.add_parameters((2, 2), init=np.array([[1.0, 2.0], [3.0, 4.0]]))
    v = W.as_array()
    v[0, 0] = 100.0  # a copy, as in DyNet
    assert W.as_array()[0, 0] == 1.0
    W.scale(2.0)
    np.testing.assert_array_equal(W.as_array(), [[2, 4], [6, 8]])
    W.set_value(np.array([[0.0, 1.0], [1.0, 0.0]]))
    np.testing.assert_array_equal(W.as_array(), [[0, 1], [1, 0]])
    with pytest.raises(ValueError):
        W.set_value(np.ones((3, 2)))
    W.zero()
    assert not W.as_array().any()
    assert W.grad_as_array().shape == (2, 2) and not W.grad_as_array().any()


def test_set_value_is_seen_by_a_live_graph(pc):
    W = pc.add_parameters(2, init=np.array([1.0, 2.0]))
    e = dy.parameter(W)
    W.set_value(np.array([5.0, 6.0]))  # before evaluation: the graph reads current storage
    assert e.value() == [5.0, 6.0]


def test_lookup_parameter_rows(pc):
    E = pc.add_lookup_parameters((4, 3), init=np.zeros((4, 3)))
    E.init_row(2, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(E.row_as_array(2), [1, 2, 3])
    np.testing.assert_array_equal(E.as_array()[2], [1, 2, 3])
    table = np.arange(12.0).reshape(4, 3)
    E.init_from_array(table)
    np.testing.assert_array_equal(E.as_array(), table)
    assert E.shape() == (4, 3)
    with pytest.raises(IndexError):
        E.row_as_array(4)
    with pytest.raises(ValueError):
        E.init_row(0, [1.0, 2.0])


def test_lookup_forms_agree(pc):
    table = np.arange(12.0).reshape(4, 3)
    E = pc.add_lookup_parameters((4, 3), init=table)
    for e in (E[1], dy.lookup(E, 1), dy.const_lookup(E, 1), dy.lookup(E, np.int64(1), update=False)):
        assert e.dim() == ((3,), 1)
        assert e.value() == table[1].tolist()


def test_const_lookup_and_const_parameter_get_no_gradient(pc):
    W = pc.add_parameters((2, 3), init=np.arange(6.0).reshape(2, 3))
    E = pc.add_lookup_parameters((4, 3), init=np.arange(12.0).reshape(4, 3))
    loss = dy.sum_elems(dy.const_parameter(W) * dy.const_lookup(E, 1)) + dy.sum_elems(dy.lookup(E, 2, update=False))
    assert loss.value() == pytest.approx(np.arange(6.0).reshape(2, 3).dot([3, 4, 5]).sum() + 6 + 7 + 8)
    loss.backward()
    assert not W.grad_as_array().any() and not E.grad_as_array().any()


@pytest.mark.parametrize("scheduler", ["agenda", "depth", "none"])
@pytest.mark.parametrize("const_first", [True, False])
def test_const_and_updated_uses_of_one_parameter_in_one_graph(pc, scheduler, const_first):
    """The two matmuls have equal shapes: batching them must not mix up the const and trained leaves."""
    W = pc.add_parameters((2, 3), init=np.arange(6.0).reshape(2, 3))
    E = pc.add_lookup_parameters((4, 3), init=np.ones((4, 3)))
    dy.renew_cg(scheduler=scheduler)
    const = dy.sum_elems(dy.const_parameter(W) * dy.const_lookup(E, 0))
    trained = dy.sum_elems(W * E[1])
    loss = const + trained if const_first else trained + const
    loss.backward()
    np.testing.assert_allclose(W.grad_as_array(), np.ones((2, 3)))
    np.testing.assert_allclose(E.grad_as_array(), [[0, 0, 0], [3, 5, 7], [0, 0, 0], [0, 0, 0]])


def test_expr_is_constant_unless_asked(pc):
    """DyNet: W.expr() is const_parameter(W); W.expr(True), dy.parameter(W) and plain W are trained."""
    W = pc.add_parameters(2, init=np.array([1.0, 2.0]))
    for e, trained in ((W.expr(), False), (W.expr(True), True), (dy.parameter(W), True), (W + 0, True)):
        dy.sum_elems(e).backward()
        np.testing.assert_array_equal(W.grad_as_array(), [float(trained)] * 2)
        pc.reset_gradient()


def test_parameters_in_arithmetic(pc):
    Wv, bv, xv = np.arange(6.0).reshape(2, 3) / 10, np.array([0.5, -1.0]), np.array([1.0, -2.0, 3.0])
    W, b = pc.add_parameters((2, 3), init=Wv), pc.add_parameters(2, init=bv)
    x = dy.inputVector(xv)
    y = W * x + b
    ref = Wv @ xv + bv
    np.testing.assert_allclose(y.npvalue(), ref, rtol=1e-6)
    np.testing.assert_allclose((dy.parameter(W) * x + dy.parameter(b)).npvalue(), ref, rtol=1e-6)
    forms = {"x + b": (x[0:2] + b, xv[:2] + bv), "b - 1": (b - 1, bv - 1), "1 - b": (1 - b, 1 - bv),
             "-b": (-b, -bv), "b / 2": (b / 2, bv / 2), "2 * b": (2 * b, 2 * bv), "b + b": (b + b, 2 * bv),
             "W[1]": (W[1], Wv[1])}
    for name, (e, want) in forms.items():
        np.testing.assert_allclose(e.npvalue(), want, rtol=1e-6, err_msg=name)
    dy.sum_elems(y).backward()
    np.testing.assert_allclose(W.grad_as_array(), np.outer([1, 1], xv), rtol=1e-6)
    np.testing.assert_allclose(b.grad_as_array(), [1, 1])


# ------------------------------------------------------------------------ operators
X, Y = np.array([1.0, -2.0, 0.5, 4.0]), np.array([2.0, 0.5, -1.0, 3.0])
M = np.arange(8.0).reshape(2, 4) - 3

OPERATOR_CASES = {
    "x + y": (lambda x, y, m: x + y, X + Y),
    "x - y": (lambda x, y, m: x - y, X - Y),
    "x / y": (lambda x, y, m: x / y, X / Y),
    "m * y (matmul)": (lambda x, y, m: m * y, M @ Y),
    "x + 2": (lambda x, y, m: x + 2, X + 2),
    "2 + x": (lambda x, y, m: 2 + x, X + 2),
    "x - 1.5": (lambda x, y, m: x - 1.5, X - 1.5),
    "1.5 - x": (lambda x, y, m: 1.5 - x, 1.5 - X),
    "x * 3": (lambda x, y, m: x * 3, X * 3),
    "3 * x": (lambda x, y, m: 3 * x, X * 3),
    "x / 4": (lambda x, y, m: x / 4, X / 4),
    "4 / y": (lambda x, y, m: 4 / y, 4 / Y),
    "np.float32 * x": (lambda x, y, m: np.float32(0.5) * x, X * 0.5),
    "x * np.int64": (lambda x, y, m: x * np.int64(2), X * 2),
    "np.float64 - x": (lambda x, y, m: np.float64(1.0) - x, 1.0 - X),
    "-x": (lambda x, y, m: -x, -X),
    "+x": (lambda x, y, m: +x, X),
    "m / 2 + 1": (lambda x, y, m: m / 2 + 1, M / 2 + 1),
    "x ** 2": (lambda x, y, m: x ** 2, X ** 2),
    "y ** 3": (lambda x, y, m: y ** 3, Y ** 3),
    "|y| ** x": (lambda x, y, m: dy.abs(y) ** x, np.abs(Y) ** X),
    "x[2]": (lambda x, y, m: x[2], X[2:3]),
    "x[np.int64(1)]": (lambda x, y, m: x[np.int64(1)], X[1:2]),
    "x[1:3]": (lambda x, y, m: x[1:3], X[1:3]),
    "x[:2]": (lambda x, y, m: x[:2], X[:2]),
    "x[2:]": (lambda x, y, m: x[2:], X[2:]),
    "x[None:None]": (lambda x, y, m: x[None:None], X),
    "x[1:-1]": (lambda x, y, m: x[1:-1], X[1:-1]),
    "x[-2:]": (lambda x, y, m: x[-2:], X[-2:]),
    "m[1] (row)": (lambda x, y, m: m[1], M[1]),
    "m[0:1]": (lambda x, y, m: m[0:1], M[0:1]),
    "x[-1]": pytest.param(lambda x, y, m: x[-1], X[-1:]),
}


@pytest.mark.parametrize("build, want", list(OPERATOR_CASES.values()), ids=list(OPERATOR_CASES))
def test_operator_values(build, want):
    e = build(dy.inputVector(X), dy.inputVector(Y), dy.inputTensor(M))
    np.testing.assert_allclose(e.npvalue(), want, rtol=1e-6)
    assert e.dim() == (np.shape(want), 1)


def test_slice_with_step_is_a_clear_error():
    with pytest.raises(dy.DynagraphError, match="step"):
        dy.inputVector(X)[::2]


def test_index_of_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="int or a slice"):
        dy.inputVector(X)[1.0]


@pytest.mark.parametrize("name, build, dloss", [
    ("1.5 - p", lambda p: 1.5 - p, lambda v: -np.ones_like(v)),
    ("4 / p", lambda p: 4 / p, lambda v: -4 / v ** 2),
    ("p / 4", lambda p: p / 4, lambda v: np.full_like(v, 0.25)),
    ("-p", lambda p: -p, lambda v: -np.ones_like(v)),
    ("p ** 3", lambda p: p ** 3, lambda v: 3 * v ** 2),
    ("2 ** p", lambda p: dy.constant(4, 2.0) ** p, lambda v: np.log(2) * 2 ** v),
    ("p - 1", lambda p: p - 1, lambda v: np.ones_like(v)),
    ("2 * p", lambda p: 2 * p, lambda v: np.full_like(v, 2.0)),
])
def test_operator_gradients(name, build, dloss, pc):
    """Which argument is which matters for the reflected forms: check d(sum)/dp."""
    v = np.array([0.5, 1.0, 2.0, 3.0])
    p = pc.add_parameters(4, init=v)
    dy.sum_elems(build(dy.parameter(p))).backward()
    np.testing.assert_allclose(p.grad_as_array(), dloss(v), rtol=1e-5)


def test_cg_checkpoint_and_revert_drop_later_nodes():
    """DyNet's beam-search idiom: score hypotheses after a checkpoint, then forget them."""
    dy.renew_cg()
    pc = dy.ParameterCollection()
    W = pc.add_parameters((2, 2), init=np.array([[1.0, 2.0], [3.0, 4.0]]))
    x = dy.inputVector([1.0, -1.0])
    kept = dy.tanh(W * x)                       # recorded, not yet evaluated
    n = len(dy.cg())
    dy.cg_checkpoint()
    hyp = dy.sum_elems(dy.tanh(W * x) * 2.0)    # the same signatures: batched with `kept`
    assert hyp.value() == pytest.approx(2 * np.tanh([-1.0, -1.0]).sum())
    dy.cg_revert()
    assert len(dy.cg()) == n
    np.testing.assert_allclose(kept.npvalue(), np.tanh([-1.0, -1.0]), rtol=1e-6)
    loss = dy.sum_elems(kept)                   # recording goes on after the revert
    loss.backward()
    np.testing.assert_allclose(W.grad_as_array(), np.outer(1 - np.tanh([-1.0, -1.0]) ** 2, [1.0, -1.0]),
                               rtol=1e-5)


def test_cg_checkpoints_nest_and_revert_needs_one():
    dy.renew_cg()
    a = dy.inputVector([1.0])
    dy.cg_checkpoint()
    b = a + 1.0
    dy.cg_checkpoint()
    _ = b * 3.0
    dy.cg_revert()
    assert len(dy.cg()) == b.i + 1 and b.value() == pytest.approx(2.0)
    dy.cg_revert()
    assert len(dy.cg()) == a.i + 1
    with pytest.raises(dy.DynagraphError, match="cg_checkpoint"):
        dy.cg_revert()


def test_block_calls_after_a_revert_record_their_parameters_again():
    pc = dy.ParameterCollection()
    W = pc.add_parameters((2, 2), init=np.eye(2))
    f = dy.block(lambda x: dy.tanh(W * x))
    dy.renew_cg()
    x = dy.inputVector([0.5, -0.5])
    dy.cg_checkpoint()
    f(x).value()                                # records W's node after the checkpoint
    dy.cg_revert()
    np.testing.assert_allclose(f(x).npvalue(), np.tanh([0.5, -0.5]), rtol=1e-6)


def test_a_retired_graph_is_freed_without_the_cyclic_gc(pc):
    """renew_cg frees the old graph and what it saved for backward at once: a reference
    cycle would hold every buffer until the collector ran."""
    import gc
    import weakref
    W = pc.add_parameters((3, 4))
    gc.disable()
    try:
        dy.renew_cg()
        loss = dy.sum_elems(dy.tanh(W * dy.inputVector([1.0, 2.0, 3.0, 4.0])))
        loss.value()
        loss.backward()
        _ = loss.cg.stats.lower_bound
        ref = weakref.ref(loss.cg)
        del loss
        dy.renew_cg()
        assert ref() is None
    finally:
        gc.enable()
