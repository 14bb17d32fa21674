"""dy.block's compiled call path (kernels/cpython/block_call.c) against its Python twin
(Block._call_py): the same graph node for node, the same values and gradients, the same
errors, and the cases it leaves to the twin (numpy integers, several graphs, a retired
graph, random steps, a new argument signature)."""
import contextlib
import gc
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dynagraph as dy
from dynagraph import subgraph
from refcheck import assert_same_run, run_graph

H = 3
pytestmark = pytest.mark.skipif(subgraph._native is None, reason="dynagraph._coarsen not built")


def _tree_model(pc, share=True):
    E = pc.add_lookup_parameters((9, H))
    W, b = pc.add_parameters((2 * H, H)), pc.add_parameters(2 * H)
    U = pc.add_parameters((2 * H, 2 * H))

    def leaf(w, y):
        g = dy.affine_transform([b, W, E[w]])
        c = dy.tanh(g[0:H]) + dy.pick(E[y], 1)
        return dy.cmult(dy.logistic(g[H:2 * H]), dy.tanh(c)), c

    def node(hl, cl, hr, cr):
        g = U * dy.concatenate([hl, hr])
        c = dy.cmult(dy.logistic(g[0:H]), cl) + dy.cmult(dy.logistic(g[H:2 * H]), cr)
        return dy.tanh(c), c

    def one(h):
        return dy.tanh(h)
    return dy.block(leaf, share=share), dy.block(node), dy.block(one, name="one")


def _build(words, labels, share=True):
    def build(pc):
        leaf, node, one = _tree_model(pc, share)
        states = [leaf(w, y) for w, y in zip(words, labels)]
        while len(states) > 1:
            states = [node(*states[k], *states[k + 1]) if k + 1 < len(states) else states[k]
                      for k in range(0, len(states), 2)]
        return [one(states[0][0]), states[0][1]]
    return build


@contextlib.contextmanager
def _python_path():
    """Every Block call through Block._call_py, the compiled path's twin (a Python __call__ on
    the class replaces the compiled base type's call until it is deleted)."""
    subgraph.Block.__call__ = lambda self, *args: self._call_py(args)
    try:
        yield
    finally:
        del subgraph.Block.__call__


def _graph_of(run):
    cg = run.cg
    return [(cg.op[i].name, tuple(cg.args[i]), repr(cg.attrs[i]), repr(cg.data[i])) for i in range(len(cg))]


@settings(max_examples=20, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 2)), min_size=1, max_size=12),
       share=st.booleans())
def test_compiled_calls_record_the_twins_graph(pairs, share):
    words, labels = [w for w, _ in pairs], [y for _, y in pairs]
    got = run_graph("agenda", _build(words, labels, share))
    with _python_path():
        ref = run_graph("agenda", _build(words, labels, share))
        none = run_graph("none", _build(words, labels, share))
    assert _graph_of(got) == _graph_of(ref)
    assert_same_run(ref, got, rtol=0, atol=0)
    assert_same_run(none, got, rtol=1e-10, atol=1e-12)


def test_compiled_path_is_taken(monkeypatch):
    calls = []
    real = subgraph.Block._call_py
    monkeypatch.setattr(subgraph.Block, "_call_py", lambda self, args: calls.append(args) or real(self, args))
    pc = dy.ParameterCollection()
    leaf, node, one = _tree_model(pc)
    dy.renew_cg()
    a = leaf(1, 0)                  # first call of a signature: traced by the twin
    b = leaf(2, 1)                  # then compiled
    c = node(*a, *b)
    node(*c, *a)
    assert len(calls) == 2          # leaf's and node's first calls only
    assert leaf(1, 0)[0].i == a[0].i


def test_compiled_call_outputs_and_errors():
    """The compiled call (the base type's, no Python frame) returns plain Expressions of the
    graph and refuses keyword arguments as a Python __call__(*args) would."""
    assert "__call__" not in vars(subgraph.Block)
    pc = dy.ParameterCollection()
    leaf, node, one = _tree_model(pc)
    dy.renew_cg()
    a, b = leaf(1, 0), leaf(2, 1)
    h, c = node(*a, *b)
    assert type(h) is dy.Expression and h.cg is dy.cg() and isinstance(h.i, int)
    assert np.allclose(h.npvalue(), np.tanh(c.npvalue()))
    with pytest.raises(TypeError, match="keyword"):
        node(*a, *b, share=True)


def test_cases_left_to_the_twin(monkeypatch):
    calls = []
    real = subgraph.Block._call_py
    monkeypatch.setattr(subgraph.Block, "_call_py", lambda self, args: calls.append(args) or real(self, args))
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((5, H))
    leaf = dy.block(lambda w: dy.tanh(E[w]))
    drop = dy.block(lambda x: dy.dropout(x, 0.5))
    dy.renew_cg()
    x = leaf(1)
    leaf(np.int64(2))               # a numpy integer
    drop(x)
    drop(x)                         # random steps: the twin draws the key
    assert len(calls) == 4
    other = dy.ComputationGraph()
    with other:
        y = dy.inputVector([0.1, 0.2, 0.3])
    with pytest.raises(dy.DynagraphError, match="two different ComputationGraphs"):  # the twin's error
        dy.block(lambda a, b: a + b)(x, y)
    dy.renew_cg()
    with pytest.raises(dy.StaleExpressionError):  # a retired graph's expression
        drop(x)


def test_no_references_leak_per_call():
    pc = dy.ParameterCollection()
    leaf, node, one = _tree_model(pc)
    dy.renew_cg()
    a, b = leaf(1, 0), leaf(2, 1)
    node(*a, *b)
    plan = next(iter(node._plans.values()))
    gc.collect()
    counts = (sys.getrefcount(plan), sys.getrefcount(dy.cg()), sys.getrefcount(a[0]))
    for _ in range(2000):
        node(*a, *b)
        leaf(1, 0)
    gc.collect()
    assert (sys.getrefcount(plan), sys.getrefcount(dy.cg()), sys.getrefcount(a[0])) == counts
