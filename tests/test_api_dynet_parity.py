"""DyNet programs run unchanged under `import dynet` and `import dynagraph`.

Two whole programs (an MLP over looked-up embeddings with a softmax loss, and a
tree-structured recursion) get the same weights, copied in `parameters_list()`
order; losses and every gradient must agree to 1e-4 relative in float32. Then a
table of expression kinds compares value(), its Python type, vec_value() and dim().
Skipped when DyNet is not installed.
"""
from __future__ import annotations

from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

import dynagraph as dy
from refcheck import using

dn = pytest.importorskip("dynet")

RTOL = 1e-4
VOCAB, EMB, HID, CLASSES = 7, 4, 5, 3


@pytest.fixture(autouse=True)
def _float32():
    with using(dtype="float32", seed=0):
        dy.renew_cg()
        yield


# ----------------------------------------------------------------------- the model
def make_model(m: ModuleType) -> SimpleNamespace:
    """The same DyNet code for both libraries; creation order fixes parameters_list()."""
    pc = m.ParameterCollection()
    P = SimpleNamespace(pc=pc)
    P.E = pc.add_lookup_parameters((VOCAB, EMB))
    P.W1, P.b1 = pc.add_parameters((HID, 2 * EMB)), pc.add_parameters(HID)
    P.W2, P.b2 = pc.add_parameters((CLASSES, HID)), pc.add_parameters(CLASSES)
    P.Wt, P.bt = pc.add_parameters((EMB, 2 * EMB)), pc.add_parameters(EMB)
    P.Wo = pc.add_parameters((CLASSES, EMB))
    return P


def copy_weights(theirs: SimpleNamespace, ours: SimpleNamespace) -> None:
    """Random float32 values into DyNet, then DyNet's values into ours, list by list."""
    rng = np.random.default_rng(0)
    ps, qs = theirs.pc.parameters_list(), ours.pc.parameters_list()
    assert len(ps) == len(qs) == 7
    for p, q in zip(ps, qs):
        assert tuple(p.shape()) == q.shape()
        p.set_value(rng.uniform(-0.8, 0.8, p.shape()))
        q.set_value(p.as_array())
    ls, ms = theirs.pc.lookup_parameters_list(), ours.pc.lookup_parameters_list()
    assert len(ls) == len(ms) == 1
    for p, q in zip(ls, ms):
        p.init_from_array(rng.uniform(-1.0, 1.0, p.shape()))
        q.init_from_array(p.as_array())


# -------------------------------------------------------------------- the programs
MLP_DATA = [((0, 3), 2), ((1, 1), 0), ((6, 2), 1), ((4, 5), 2), ((3, 0), 0)]


def mlp_loss(m: ModuleType, P: SimpleNamespace):
    """Classic DyNet style: lookups, concatenate, tanh layer, softmax losses, esum."""
    losses = []
    for (w1, w2), label in MLP_DATA:
        x = m.concatenate([P.E[w1], m.lookup(P.E, w2)])
        h = m.tanh(m.parameter(P.W1) * x + m.parameter(P.b1))
        losses.append(m.pickneglogsoftmax(P.W2 * h + P.b2, label))
    # The same loss spelled with softmax, to exercise it under backward too.
    (w1, w2), label = MLP_DATA[0]
    h = m.tanh(m.affine_transform([P.b1, P.W1, m.concatenate([P.E[w1], P.E[w2]])]))
    losses.append(-m.log(m.pick(m.softmax(P.W2 * h + P.b2), label)))
    return m.esum(losses)


TREES = [((0, 1), (2, (3, 4))), (5, 6), (((1, 2), 3), 0), ((4, 4), (4, 4))]
TREE_LABELS = [1, 0, 2, 1]


def encode(m: ModuleType, P: SimpleNamespace, t):
    """Recursive encoder: a leaf is an embedding, a node combines its two children."""
    if isinstance(t, int):
        return P.E[t]
    left, right = encode(m, P, t[0]), encode(m, P, t[1])
    return m.tanh(P.Wt * m.concatenate([left, right]) + P.bt)


def tree_loss(m: ModuleType, P: SimpleNamespace):
    losses = [m.pickneglogsoftmax(P.Wo * encode(m, P, t), y) for t, y in zip(TREES, TREE_LABELS)]
    return m.esum(losses) / len(losses)


# The parameters each program reaches (the others must get exactly zero gradient).
USES = {"mlp_loss": {"/_0", "/_1", "/_2", "/_3", "/_4"}, "tree_loss": {"/_0", "/_5", "/_6", "/_7"}}


def run(m: ModuleType, P: SimpleNamespace, program, **renew) -> tuple[float, list]:
    m.renew_cg(**renew)
    loss = program(m, P)
    value = loss.value()
    loss.backward()
    grads = [p.grad_as_array() for p in P.pc.parameters_list() + P.pc.lookup_parameters_list()]
    return value, grads


def close(ours, theirs, what: str) -> None:
    theirs = np.asarray(theirs, dtype=np.float64)
    finite = np.abs(theirs[np.isfinite(theirs)])  # log_softmax(restrict) has -inf entries
    scale = max(float(finite.max()) if finite.size else 0.0, 1e-6)
    np.testing.assert_allclose(np.asarray(ours, dtype=np.float64), theirs, rtol=RTOL, atol=RTOL * scale,
                               err_msg=what)


@pytest.mark.parametrize("scheduler", ["agenda", "depth", "none"])
@pytest.mark.parametrize("program", [mlp_loss, tree_loss], ids=["mlp", "tree"])
def test_program_matches_dynet(program, scheduler):
    theirs, ours = make_model(dn), make_model(dy)
    copy_weights(theirs, ours)
    loss_dn, grads_dn = run(dn, theirs, program)
    loss_dy, grads_dy = run(dy, ours, program, scheduler=scheduler)
    assert isinstance(loss_dy, float) and loss_dy > 0
    close(loss_dy, loss_dn, "loss")
    names = [p.name() for p in ours.pc.parameters_list() + ours.pc.lookup_parameters_list()]
    assert set(names) >= USES[program.__name__]
    for name, g_dy, g_dn in zip(names, grads_dy, grads_dn):
        assert g_dy.shape == g_dn.shape, name
        assert (np.abs(g_dn).max() > 0) == (name in USES[program.__name__]), name
        close(g_dy, g_dn, name)


def test_parameter_names_and_order_match_dynet():
    theirs, ours = make_model(dn), make_model(dy)
    for get in (lambda P: P.pc.parameters_list(), lambda P: P.pc.lookup_parameters_list()):
        assert [p.name() for p in get(ours)] == [p.name() for p in get(theirs)]
        assert [tuple(p.shape()) for p in get(ours)] == [tuple(p.shape()) for p in get(theirs)]


def test_gradient_accumulation_matches_dynet():
    """Two backward passes (on two graphs) accumulate into the same gradients in both."""
    theirs, ours = make_model(dn), make_model(dy)
    copy_weights(theirs, ours)
    for m, P in ((dn, theirs), (dy, ours)):
        run(m, P, mlp_loss)
        run(m, P, tree_loss)
    for p, q in zip(theirs.pc.parameters_list(), ours.pc.parameters_list()):
        close(q.grad_as_array(), p.grad_as_array(), q.name())
    close(ours.E.grad_as_array(), theirs.E.grad_as_array(), "E")
    assert ours.W1.grad_as_array().any() and ours.Wt.grad_as_array().any()


# ------------------------------------------------------- expression kinds, one by one
def _arr(shape, lo=-1.0, hi=1.0, seed=0):
    """float32-representable values, so both libraries see identical inputs."""
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32).astype(np.float64)


V, U = _arr(5, seed=1), _arr(5, seed=2)
POS = _arr(5, 0.2, 2.0, seed=3)
PROB = _arr(5, 0.05, 0.95, seed=4)
M, N = _arr((3, 4), seed=5), _arr((4, 2), seed=6)
C3 = _arr(3, seed=7)


def _in(m, a):
    return m.inputTensor(a)


KINDS = {
    # elementwise
    "tanh": lambda m: m.tanh(_in(m, V)),
    "logistic": lambda m: m.logistic(_in(m, V)),
    "rectify": lambda m: m.rectify(_in(m, V)),
    "elu": lambda m: m.elu(_in(m, V), 0.7),
    "selu": lambda m: m.selu(_in(m, V)),
    "exp": lambda m: m.exp(_in(m, M)),
    "log": lambda m: m.log(_in(m, POS)),
    "sqrt": lambda m: m.sqrt(_in(m, POS)),
    "square_cube_abs": lambda m: m.square(_in(m, V)) + m.cube(_in(m, V)) + m.abs(_in(m, V)),
    "softsign": lambda m: m.softsign(_in(m, V)),
    "pow": lambda m: m.pow(_in(m, POS), m.scalarInput(1.5)),
    "cmult": lambda m: m.cmult(_in(m, V), _in(m, U)),
    "cdiv": lambda m: m.cdiv(_in(m, V), _in(m, POS)),
    "bmax_bmin": lambda m: m.bmax(_in(m, V), _in(m, U)) - m.bmin(_in(m, V), _in(m, U)),
    "nobackprop_flip": lambda m: m.nobackprop(_in(m, V)) + m.flip_gradient(_in(m, U)),
    # n-ary
    "esum": lambda m: m.esum([_in(m, V), _in(m, U), _in(m, POS)]),
    "average": lambda m: m.average([_in(m, M), _in(m, M * 2)]),
    "emax": lambda m: m.emax([_in(m, V), _in(m, U)]),
    "logsumexp": lambda m: m.logsumexp([_in(m, V), _in(m, U)]),
    "concatenate": lambda m: m.concatenate([_in(m, V), _in(m, C3)]),
    "concatenate_cols": lambda m: m.concatenate_cols([_in(m, V), _in(m, U)]),
    "concatenate_d1": lambda m: m.concatenate([_in(m, M), _in(m, M)], d=1),
    # linear algebra
    "matmul_mv": lambda m: _in(m, M) * _in(m, N[:, 0].copy()),
    "matmul_mm": lambda m: _in(m, M) * _in(m, N),
    "affine_transform": lambda m: m.affine_transform([_in(m, C3), _in(m, M), _in(m, N[:, 1].copy())]),
    "dot_product": lambda m: m.dot_product(_in(m, V), _in(m, U)),
    "transpose_matrix": lambda m: m.transpose(_in(m, M)),
    "transpose_vector": lambda m: m.transpose(_in(m, V)),
    "colwise_add": lambda m: m.colwise_add(_in(m, M), _in(m, C3)),
    "broadcast_add": lambda m: _in(m, M) + _in(m, C3),
    # shape and selection
    "reshape": lambda m: m.reshape(_in(m, M), (2, 6)),
    "reshape_vector": lambda m: m.reshape(_in(m, M), (12,)),
    "pick_vector": lambda m: m.pick(_in(m, V), 3),
    "pick_matrix_d1": lambda m: m.pick(_in(m, M), 2, 1),
    "getitem_int": lambda m: _in(m, V)[1],
    "getitem_matrix_row": lambda m: _in(m, M)[2],
    "getitem_slice": lambda m: _in(m, V)[1:4],
    "getitem_open_slices": lambda m: m.concatenate([_in(m, V)[:2], _in(m, V)[3:]]),
    "pick_range": lambda m: m.pick_range(_in(m, V), 1, 3),
    "pickrange": lambda m: m.pickrange(_in(m, V), 0, 4),
    "select_rows": lambda m: m.select_rows(_in(m, M), [2, 0]),
    "select_cols": lambda m: m.select_cols(_in(m, M), [3, 1, 1]),
    # reductions
    "sum_elems": lambda m: m.sum_elems(_in(m, M)),
    "mean_elems": lambda m: m.mean_elems(_in(m, M)),
    "sum_dim": lambda m: m.sum_dim(_in(m, M), [1]),
    "mean_dim": lambda m: m.mean_dim(_in(m, M), [0], False),
    "max_dim": lambda m: m.max_dim(_in(m, M), 1),
    "min_dim": lambda m: m.min_dim(_in(m, M)),
    # softmax and losses
    "softmax": lambda m: m.softmax(_in(m, V)),
    "softmax_matrix": lambda m: m.softmax(_in(m, M)),
    "log_softmax": lambda m: m.log_softmax(_in(m, V)),
    "log_softmax_restrict": lambda m: m.log_softmax(_in(m, V), [0, 2, 4]),
    "pickneglogsoftmax": lambda m: m.pickneglogsoftmax(_in(m, V), 2),
    "hinge": lambda m: m.hinge(_in(m, V), 1, 0.5),
    "binary_log_loss": lambda m: m.binary_log_loss(_in(m, PROB), _in(m, PROB[::-1].copy())),
    "squared_distance": lambda m: m.squared_distance(_in(m, V), _in(m, U)),
    "squared_norm": lambda m: m.squared_norm(_in(m, V)),
    "l2_norm": lambda m: m.l2_norm(_in(m, V)),
    # inputs and operators
    "scalarInput": lambda m: m.scalarInput(2.5),
    "inputVector": lambda m: m.inputVector([1.0, -2.0, 3.0]),
    "zeros_ones_constant": lambda m: m.zeros((2, 3)) + m.ones((2, 3)) + m.constant((2, 3), 0.5),
    "scalar_operators": lambda m: -(_in(m, M) * 2.0 - 1.0) / 4.0 + _in(m, M) ** 2,
    # (DyNet has no `expression / expression`: cdiv spells it)
    "expression_operators": lambda m: _in(m, V) - m.cdiv(_in(m, U), _in(m, POS)) + (-_in(m, V)),
    "matrix_1x1_value": lambda m: m.reshape(m.sum_elems(_in(m, V)), (1, 1)),
}


KINDS_XFAIL = {
    "getitem_negative": pytest.param(lambda m: _in(m, V)[-1] + _in(m, V)[-5]),
}


@pytest.mark.parametrize("build", list(KINDS.values()) + list(KINDS_XFAIL.values()),
                         ids=list(KINDS) + list(KINDS_XFAIL))
def test_expression_kind_matches_dynet(build):
    dn.renew_cg()
    dy.renew_cg()
    theirs, ours = build(dn), build(dy)
    assert ours.dim() == theirs.dim()
    v_dn, v_dy = theirs.value(), ours.value()
    assert type(v_dy) is type(v_dn), (type(v_dy), type(v_dn))
    close(v_dy, v_dn, "value")
    close(ours.vec_value(), theirs.vec_value(), "vec_value")
    close(ours.npvalue(), theirs.npvalue(), "npvalue")


def test_table_is_large_enough():
    assert len(KINDS) >= 40


PARAM_KINDS = {
    "parameter": lambda m, W, E: m.parameter(W),
    "const_parameter": lambda m, W, E: m.const_parameter(W),
    "lookup": lambda m, W, E: m.lookup(E, 2),
    "lookup_const": lambda m, W, E: m.lookup(E, 1, update=False),
    "getitem_lookup": lambda m, W, E: E[3],
    "parameter_arithmetic": lambda m, W, E: m.tanh(W * E[0] + E[1][0]),
}


@pytest.mark.parametrize("build", list(PARAM_KINDS.values()), ids=list(PARAM_KINDS))
def test_parameter_expression_kind_matches_dynet(build):
    table, weights = _arr((4, 3), seed=8), _arr((2, 3), seed=9)
    values = []
    for m in (dn, dy):
        m.renew_cg()
        pc = m.ParameterCollection()
        W, E = pc.add_parameters((2, 3), init=weights), pc.add_lookup_parameters((4, 3), init=table)
        e = build(m, W, E)
        values.append((e.dim(), type(e.value()), e.npvalue()))
    (d_dn, t_dn, v_dn), (d_dy, t_dy, v_dy) = values
    assert d_dy == d_dn and t_dy is t_dn
    close(v_dy, v_dn, "value")
