"""The recording fast paths added for per-sentence programs (issue 17): the shape cache
shared by every graph, the compiled parameter/lookup expression recorder, and the
signature cache handed from one graph to the next. Each must record exactly what the
Python reference records and raise the same errors."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import graph as graph_mod
from dynagraph import recording
from dynagraph.errors import DynagraphError, DynagraphIndexError, StaleExpressionError
from dynagraph.expression import _expression_of, expression_of
from dynagraph.ops import OPS

COLUMNS = ("op", "args", "attrs", "data", "shape", "depth", "sig", "sig_part", "needs_grad")


def _columns(cg) -> dict:
    return {c: list(getattr(cg, c)) for c in COLUMNS} | {"signatures": list(cg.signatures)}


def _program(pc_parts):
    E, W, b = pc_parts
    xs = [E[w] for w in (3, 1, 4, 1, 5)]
    h = dy.tanh(dy.parameter(W) * xs[0] + dy.parameter(b))
    for x in xs[1:]:
        h = dy.tanh(dy.affine_transform([dy.parameter(b), dy.parameter(W), x]) + h)
    return dy.pickneglogsoftmax(h, 2)


@pytest.fixture
def parts():
    pc = dy.ParameterCollection()
    return pc.add_lookup_parameters((10, 6)), pc.add_parameters((6, 6)), pc.add_parameters(6)


def test_a_new_graph_takes_known_shapes_from_the_shared_cache(parts, monkeypatch):
    """After renew_cg the same program runs no shape rule, and records the same columns."""
    cg1 = dy.renew_cg()
    v1 = _program(parts).value()
    first = _columns(cg1)
    calls = []
    for name in ("tanh", "matmul", "add", "affine", "pickneglogsoftmax", "lookup"):
        op = OPS[name]
        monkeypatch.setattr(op, "shape", (lambda rule: lambda *a: calls.append(a) or rule(*a))(op.shape))
    cg2 = dy.renew_cg()
    v2 = _program(parts).value()
    assert calls == []
    second = _columns(cg2)
    for c in ("op", "args", "attrs", "shape", "depth", "sig", "needs_grad", "data", "signatures", "sig_part"):
        assert first[c] == second[c], c  # the same parameters: even the shared parts agree
    assert v1 == v2


def test_the_shape_cache_never_hides_an_error(parts):
    """Shapes the cache knows are valid ones; a bad call in a later graph still raises,
    naming the op and shapes."""
    dy.renew_cg()
    _program(parts)
    dy.renew_cg()
    x, y = dy.inputVector([1.0, 2.0]), dy.inputVector([1.0, 2.0, 3.0])
    with pytest.raises(DynagraphError, match=r"cmult.*\(2,\).*\(3,\)"):
        dy.cmult(x, y)
    E = parts[0]
    with pytest.raises(DynagraphIndexError, match="lookup"):
        E[10]  # the signature is cached from the earlier graph; the per-node check still runs


def test_the_shape_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(graph_mod, "SHAPES_LIMIT", 8)
    for n in range(1, 30):  # each length a new signature
        dy.renew_cg()
        dy.tanh(dy.inputVector([0.5] * n)).value()
    assert 0 < len(recording.SHAPES) <= 8
    dy.renew_cg()
    np.testing.assert_allclose(dy.tanh(dy.inputVector([0.5] * 3)).npvalue(), np.tanh([0.5] * 3))


def test_expression_of_matches_the_python_twin(parts):
    """The compiled parameter/lookup recorder gives the node the Python one gives, for
    every way a program spells it."""
    E, W, b = parts

    def build(f):
        cg = dy.renew_cg()
        out = [f(W), f(W), f(b), f(E, lookup=2), f(E, lookup=2), f(W, True, None, cg), f(E, True, 7),
               f(W, update=False), f(E, False, 3), f(E, lookup=np.int64(4))]
        return cg, [(e.cg is cg, e.i) for e in out]
    cg_c, ids_c = build(expression_of)
    cg_p, ids_p = build(_expression_of)
    assert ids_c == ids_p
    a, b_ = _columns(cg_c), _columns(cg_p)
    for c in ("op", "args", "attrs", "data", "shape", "depth", "sig", "needs_grad"):
        assert a[c] == b_[c], c
    first = E[5]
    assert first.cg is dy.cg() and dy.lookup(E, 5).i == first.i + 1


def test_expression_of_in_another_graph_and_errors(parts):
    E, W, _ = parts
    cg = dy.renew_cg()
    W.expr(True)
    other = dy.ComputationGraph()
    e = expression_of(W, graph=other)
    assert e.cg is other and e.i == 0
    with other:
        assert E[1].cg is other
    assert E[1].cg is cg
    with pytest.raises(TypeError, match="int"):
        E[True]
    with pytest.raises(TypeError):
        E[1.5]
    with pytest.raises(DynagraphIndexError, match="out of range"):
        E[-1]
    x = E[1]
    dy.renew_cg()
    with pytest.raises(StaleExpressionError):
        expression_of(E, lookup=1, graph=cg)
    with pytest.raises(StaleExpressionError):
        x + x


def test_many_graphs_reuse_the_signature_cache_correctly(parts):
    """Graphs made and dropped one after another (the cache block passes from one to the
    next): every node's signature is the one the dictionary holds."""
    E, W, b = parts
    for k in range(40):
        cg = dy.renew_cg()
        xs = [E[(k + j) % 10] for j in range(1 + k % 4)]
        h = dy.esum(xs) if len(xs) > 1 else xs[0]
        y = dy.logistic(dy.pick_range(dy.concatenate([h, xs[0]]), k % 5, 6 + k % 5))
        for n in range(len(cg.op)):
            if cg.sig[n] >= 0:
                key = cg.signatures[cg.sig[n]]
                assert cg._sig_id[key][0] == cg.sig[n]
        ref = np.concatenate([sum(E.as_array()[(k + j) % 10] for j in range(len(xs))),
                              E.as_array()[k % 10]])[k % 5:6 + k % 5]
        np.testing.assert_allclose(y.npvalue(), 1 / (1 + np.exp(-ref)), rtol=1e-6)


def test_a_new_graph_reads_check_and_blocks_grad_from_the_op(parts, monkeypatch):
    """The shared cache holds shapes only: an op's per-node check and blocks_grad are read
    from the op when a graph first meets the signature, as the Python path reads them."""
    E = parts[0]
    dy.renew_cg()
    E[3]
    seen = []
    original = OPS["lookup"].check
    monkeypatch.setattr(OPS["lookup"], "check", lambda *a: seen.append(a[1]) or original(*a))
    dy.renew_cg()
    E[4]
    assert seen == [4]
    monkeypatch.setattr(OPS["tanh"], "blocks_grad", True)
    cg = dy.renew_cg()
    y = dy.tanh(E[2])
    assert cg.needs_grad[y.i] is False


def test_long_columns_grow_and_shrink_correctly():
    """Columns past 4096 entries grow by half in C; revert() shrinks them in Python; every
    node keeps its entries and values."""
    cg = dy.renew_cg()
    x = dy.inputVector([0.5, -0.25])
    ys = [dy.tanh(x)]
    for k in range(6000):
        ys.append(ys[-1] * 0.5 + x if k % 2 else dy.tanh(ys[-1]))
    n = len(cg.op)
    assert all(len(getattr(cg, c)) == n for c in ("op", "args", "attrs", "data", "shape", "depth", "sig",
                                                   "sig_part", "needs_grad"))
    cg.checkpoint()
    for _ in range(5000):
        dy.tanh(x)
    cg.revert()
    z = dy.tanh(ys[-1])
    assert z.i == n and len(cg.op) == n + 1 and cg.depth[z.i] == cg.depth[ys[-1].i] + 1
    ref = np.array([0.5, -0.25])
    v = np.tanh(ref)
    for k in range(6000):
        v = (v * 0.5 + ref) if k % 2 else np.tanh(v)
    np.testing.assert_allclose(z.npvalue(), np.tanh(v), rtol=1e-6)
