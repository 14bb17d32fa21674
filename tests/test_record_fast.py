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


def test_more_signatures_than_the_cache_holds_keep_their_ids():
    """Hundreds of signatures recorded round after round in one graph (more than the recorder's
    signature cache holds, so its sets fill and evict): every node gets its signature's one id,
    the one the dictionary holds, and the values are right."""
    cg = dy.renew_cg()
    x = dy.inputVector([0.1 * k for k in range(40)])
    spans = [(a, a + w) for w in range(1, 21) for a in range(0, 40 - w, 2)]  # 300 distinct attrs
    ids = {}
    for _ in range(3):
        for a, b in spans:
            y = dy.pick_range(x, a, b)
            assert ids.setdefault((a, b), cg.sig[y.i]) == cg.sig[y.i]
            assert cg._sig_id[cg.signatures[cg.sig[y.i]]][0] == cg.sig[y.i]
    assert len(set(ids.values())) == len(spans)
    np.testing.assert_allclose(dy.pick_range(x, 3, 9).npvalue(), 0.1 * np.arange(3, 9), rtol=1e-6)


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


@pytest.mark.skipif(not recording.COMPILED, reason="the compiled recorder keeps the storage and the ids")
def test_a_large_graph_leaves_its_column_storage_and_node_ids_to_the_next():
    """A mini-batch's graph of thousands of nodes hands its emptied column lists to the next
    graph (no regrowth from empty) and its node ids are ints shared by every graph (none made
    or freed per node); the next graph, of another structure, still records and computes
    only its own nodes."""
    import sys

    def chain(n, scale):
        x = dy.inputVector([0.5, -0.25])
        ys = [dy.tanh(x)]
        for k in range(n):
            ys.append(ys[-1] * scale + x if k % 2 else dy.tanh(ys[-1]))
        return ys

    def reference(n, scale):
        ref = np.array([0.5, -0.25])
        v = np.tanh(ref)
        for k in range(n):
            v = (v * scale + ref) if k % 2 else np.tanh(v)
        return v

    dy.renew_cg()
    first = chain(6000, 0.5)
    np.testing.assert_allclose(first[-1].npvalue(), reference(6000, 0.5), rtol=1e-6)
    ids = [e.i for e in first[4000:4010]]
    del first
    dy.renew_cg()  # the first graph goes now (the new one was made before): its lists are kept
    cg = dy.renew_cg()  # and taken by this one
    assert all(len(getattr(cg, c)) == 0 for c in COLUMNS)
    assert sys.getsizeof(cg.op) >= 8 * 6000  # the storage came with the list
    second = chain(5000, -0.25)
    assert len(cg.op) == second[-1].i + 1
    assert all(a.i is b for a, b in zip(second[4000:4010], ids))  # one int object per id
    np.testing.assert_allclose(second[-1].npvalue(), reference(5000, -0.25), rtol=1e-6)


# ------------------------------------------------- compiled entries (dy.lookup, dy.parameter)
def test_lookup_takes_numpy_integers_and_checks_rows_with_the_python_message(parts):
    E = parts[0]
    cg = dy.renew_cg()
    rows = [dy.lookup(E, k) for k in (np.int64(3), np.int32(1), 4, np.uint8(9))]
    assert [cg.data[e.i] for e in rows] == [3, 1, 4, 9]
    assert all(type(cg.data[e.i]) is int for e in rows)
    np.testing.assert_array_equal(rows[0].npvalue(), E.as_array()[3])
    assert E[np.int64(2)].npvalue().tolist() == E.as_array()[2].tolist()
    for bad in (10, -1, np.int64(10), 2 ** 70):
        with pytest.raises(DynagraphIndexError, match=r"lookup\(\(10, 6\)\): index .* out of range") as e:
            dy.lookup(E, bad)
        assert "test_record_fast.py" in str(e.value)
    for bad in (True, 2.0, np.float64(1.0), "3", None):
        with pytest.raises(TypeError, match="lookup"):
            dy.lookup(E, bad)
    with pytest.raises(TypeError, match="LookupParameters"):
        dy.lookup(parts[1], 0)
    n = len(cg.op)
    assert [len(getattr(cg, c)) for c in COLUMNS] == [n] * len(COLUMNS)  # failed calls appended nothing
    c = dy.const_lookup(E, np.int64(5))
    assert cg.needs_grad[c.i] is False and cg.data[c.i] == 5


def test_leaves_made_in_c_equal_the_python_twins(parts):
    E, W, b = parts
    b.updated = False
    cg1 = dy.renew_cg()
    xs = [dy.parameter(W), dy.parameter(b), dy.lookup(E, 2), dy.const_parameter(W), W.expr(True)]
    cg2 = dy.renew_cg()
    ids = [cg2._leaf_py(W), cg2._leaf_py(b), cg2._leaf_py(E)]
    cg2.add(OPS["lookup"], (ids[2],), (), 2)
    ids += [cg2._leaf_py(W, False)]
    assert [x.i for x in xs] == [0, 1, 3, 4, 0]
    for c in COLUMNS + ("blk", "row"):
        assert list(getattr(cg1, c)) == list(getattr(cg2, c)), c
    assert cg1._leaves == cg2._leaves and cg1._block_param == cg2._block_param
    assert [blk.shape for blk in cg1.blocks] == [blk.shape for blk in cg2.blocks]
    assert all(np.shares_memory(x, y) for x, y in zip(cg1.blocks, cg2.blocks))
    assert cg1.needs_grad[:2] == [True, False]


def test_a_replaced_storage_is_bound_by_the_next_graph(parts):
    _, W, _ = parts
    dy.renew_cg()
    before = dy.parameter(W).npvalue()
    W.values = np.full_like(W.values, 0.5)  # new storage: the view of the old one is not reused
    dy.renew_cg()
    after = dy.parameter(W).npvalue()
    assert not np.array_equal(before, after) and (after == 0.5).all()
    W.values = np.ones((3, 6), dtype=W.values.dtype)  # a new shape: the signature cache must not hide it
    dy.renew_cg()
    y = dy.parameter(W) * dy.inputVector([1.0] * 6)
    assert y.shape == (3,)
    np.testing.assert_allclose(y.npvalue(), [6.0] * 3)


# ------------------------------------------------------------------ compiled operators
def test_operators_record_what_the_python_twins_record(parts):
    _, W, b = parts
    cg = dy.renew_cg()
    x, y = dy.inputVector([1.0, -2.0, 3.0]), dy.inputVector([0.5, 4.0, -1.0])
    forms = [x + y, x - y, x + 2, 2 + x, x - 2, 2 - x, x * 3, 3 * x, x + 2.5, 1.5 - x, 0.5 * x,
             x + np.float64(2), np.float64(2) - x, np.int64(3) * x]
    names = ["add", "sub", "addc", "addc", "addc", "rsubc", "mulc", "mulc", "addc", "rsubc", "mulc",
             "addc", "rsubc", "mulc"]
    assert [cg.op[e.i].name for e in forms] == names
    attrs = [cg.attrs[e.i] for e in forms[2:]]
    assert attrs == [(2.0,), (2.0,), (-2.0,), (2.0,), (3.0,), (3.0,), (2.5,), (1.5,), (0.5,), (2.0,), (2.0,),
                     (3.0,)]
    assert all(type(a[0]) is float for a in attrs)
    xv, yv = np.array([1.0, -2.0, 3.0]), np.array([0.5, 4.0, -1.0])
    want = [xv + yv, xv - yv, xv + 2, 2 + xv, xv - 2, 2 - xv, xv * 3, 3 * xv, xv + 2.5, 1.5 - xv, 0.5 * xv,
            xv + 2, 2 - xv, 3 * xv]
    for e, w in zip(forms, want):
        np.testing.assert_allclose(e.npvalue(), w, rtol=1e-6)
    h = dy.parameter(W) * dy.inputVector([1.0] * 6) + b  # a Parameters operand takes the twin
    assert cg.op[h.i].name == "add" and h.shape == (6,)
    assert (x.__add__(y)).shape == (3,) and (x.__radd__(2)).shape == (3,)


def test_operator_errors_name_the_op_shapes_and_line(parts):
    dy.renew_cg()
    x, m = dy.inputVector([1.0, 2.0]), dy.inputTensor(np.ones((3, 4)))
    with pytest.raises(DynagraphError, match=r"matmul\(\(3, 4\), \(2,\)\)") as e:
        m * x
    assert "test_record_fast.py" in str(e.value)
    with pytest.raises(DynagraphError, match=r"add\(\(2,\), \(3, 4\)\)"):
        x + m
    with pytest.raises(TypeError, match="add"):
        x + "a"
    with pytest.raises(TypeError):
        "a" + x
    with pytest.raises(TypeError, match="add"):
        x + True  # a bool is not a number here, as in the Python operators
    old = x
    dy.renew_cg()
    y = dy.inputVector([1.0, 2.0])
    for f in (lambda: old + old, lambda: old - 1, lambda: 2 * old, lambda: y * old):
        with pytest.raises((StaleExpressionError, DynagraphError)):
            f()


# --------------------------------------------------- compiled concatenate, pickneglogsoftmax
def test_concatenate_and_pickneglogsoftmax_forms(parts):
    cg = dy.renew_cg()
    x, y = dy.inputVector([1.0, 2.0]), dy.inputVector([3.0, 4.0])
    assert dy.concatenate([x, y]).npvalue().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert dy.concatenate([x, y], 0).shape == (4,)
    assert dy.concatenate([x, y], np.int64(0)).shape == (4,)
    assert dy.concatenate_cols([x, y]).shape == (2, 2)
    with pytest.raises(DynagraphError, match="concatenate"):
        dy.concatenate([x, dy.inputVector([1.0, 2.0, 3.0])], 1)
    with pytest.raises(DynagraphError, match="at least one"):
        dy.concatenate([])
    losses = [dy.pickneglogsoftmax(x, k) for k in (0, 1, np.int64(1))]
    assert [cg.data[e.i] for e in losses] == [0, 1, 1]
    z = np.array([1.0, 2.0])
    np.testing.assert_allclose([e.value() for e in losses], [np.log(np.exp(z).sum()) - z[k] for k in (0, 1, 1)],
                               rtol=1e-6)
    n = len(cg.op)
    for bad in (2, -1, 2 ** 70):
        with pytest.raises(DynagraphIndexError, match=r"pickneglogsoftmax\(\(2,\)\): label .* out of range") as e:
            dy.pickneglogsoftmax(x, bad)
        assert "test_record_fast.py" in str(e.value)
    with pytest.raises(TypeError, match="pickneglogsoftmax"):
        dy.pickneglogsoftmax(x, 1.0)
    assert len(cg.op) == n


# ------------------------------------------------------------------------------ renew_cg
def test_a_graph_without_random_ops_draws_no_random_key(parts):
    from dynagraph.config import config
    dy.config.set(random_seed=3)
    state = config.rng.bit_generator.state
    cg = dy.renew_cg()
    _program(parts).value()
    assert config.rng.bit_generator.state == state
    d1 = dy.dropout(dy.inputVector([1.0] * 50), 0.5)
    assert cg.data[d1.i] == cg._rand_base + d1.i
    assert config.rng.bit_generator.state != state  # drawn at the first random op
    v1 = d1.npvalue().tolist()
    dy.config.set(random_seed=3)
    cg = dy.renew_cg()
    _program(parts).value()
    d2 = dy.dropout(dy.inputVector([1.0] * 50), 0.5)
    assert v1 == d2.npvalue().tolist()  # the same seed, the same masks
    assert 0 < v1.count(0.0) < 50


def test_reused_column_storage_never_leaks_between_graphs(parts):
    cg = dy.renew_cg()
    _program(parts)
    kept_ops, n = cg.op, len(cg.op)  # held: this list is not reused
    del cg
    for _ in range(3):
        cg = dy.renew_cg()
        assert all(len(getattr(cg, c)) == 0 for c in COLUMNS + ("blk", "row", "blocks", "signatures"))
        _program(parts).value()
    assert len(kept_ops) == n


def test_transpose_softmax_log_softmax_forms(parts):
    cg = dy.renew_cg()
    m = dy.inputTensor(np.arange(6.0).reshape(2, 3))
    assert dy.transpose(m).shape == (3, 2) and dy.transpose(m, [1, 0]).shape == (3, 2)
    assert cg.attrs[dy.transpose(m).i] == ((1, 0),)
    s0, s1 = dy.softmax(m), dy.softmax(m, 1)
    assert cg.attrs[s0.i] == (0,) and cg.attrs[s1.i] == (1,)
    np.testing.assert_allclose(s1.npvalue().sum(1), [1.0, 1.0], rtol=1e-6)
    assert cg.attrs[dy.softmax(m, np.int64(1)).i] == (1,)
    with pytest.raises(DynagraphError, match=r"softmax\(\(2, 3\)\): dimension 2 out of range"):
        dy.softmax(m, 2)
    with pytest.raises(TypeError, match="softmax: indices must be integers"):
        dy.softmax(m, 1.0)
    v = dy.inputVector([1.0, 2.0, 3.0])
    assert cg.attrs[dy.log_softmax(v).i] == (None,)
    r = dy.log_softmax(v, [0, 2]).npvalue()
    assert np.isneginf(r[1]) and abs(np.exp(r[[0, 2]]).sum() - 1) < 1e-6


def test_table_rows_by_subscript_take_the_compiled_path_and_the_same_errors(parts):
    E = parts[0]
    cg = dy.renew_cg()
    rows = [E[3], E[np.int64(4)], E[np.int16(0)]]
    assert [cg.data[r.i] for r in rows] == [3, 4, 0] and all(type(cg.data[r.i]) is int for r in rows)
    assert cg.op[rows[0].i] is OPS["lookup"] and rows[0].i == rows[1].i - 1  # one shared table leaf
    np.testing.assert_array_equal(rows[1].npvalue(), E.as_array()[4])
    with pytest.raises(DynagraphIndexError, match=r"lookup\(\(10, 6\)\): index 10 out of range") as e:
        E[10]
    assert "test_record_fast.py" in str(e.value)
    for bad in (2.0, True, "1"):
        with pytest.raises(TypeError, match="lookup: indices must be integers"):
            E[bad]
    with dy.renew_cg() as other:  # a `with` graph is the current one
        assert E[1].cg is other


@pytest.mark.skipif(recording.NATIVE is None, reason="the compiled recorder makes the columns")
def test_int_only_columns_are_outside_the_cyclic_gc_and_graphs_still_go(parts):
    """Columns holding only ints, bools and int tuples cannot be on a cycle, so the cyclic GC
    is not asked to walk them (tens of thousands of items in a mini-batch's graph); every
    other column, and a graph caught in a user's reference cycle, is still collected."""
    import gc
    import weakref

    for _ in range(2):  # the second graph gets the first one's pooled lists
        cg = dy.renew_cg()
        loss = _program(parts)
        loss.value()
        for c in ("args", "shape", "depth", "sig", "needs_grad", "blk", "row"):
            assert not gc.is_tracked(getattr(cg, c)), c
        for c in ("op", "attrs", "data", "sig_part", "blocks", "signatures"):
            assert gc.is_tracked(getattr(cg, c)), c

    class Holder:  # a cycle through the user's own object, holding the graph's expression
        pass
    h = Holder()
    h.me, h.loss = h, loss
    gone = weakref.ref(h)
    del h, loss
    dy.renew_cg()
    gc.collect()
    assert gone() is None


# ------------------------------------------ parameters given where expressions go (DyNet 2)
def test_parameters_in_a_list_record_what_the_python_twin_records(parts, monkeypatch):
    """affine_transform([b, W, x, W, h]) and esum/concatenate with Parameters or a lookup table
    among the expressions: the compiled recorder binds their leaves in argument order, as
    expression._arg_id does, without the Python fallback (counted), and the columns, values
    and gradients equal the Python reference's."""
    import dynagraph.expressions as exprs
    from dynagraph import expression as expression_mod
    E, W, b = parts
    U = dy.ParameterCollection().add_parameters((6, 6))

    def program(record):
        x, h = dy.lookup(E, 3), dy.lookup(E, 5)
        g = record("affine", [b, W, x, U, h])    # parameters before the first expression
        g2 = record("affine", [b, W, g])           # leaves already bound are reused
        s = record("esum", [g2, b, g])
        t = record("concatenate", [s, E[1]])
        return dy.pickneglogsoftmax(t, 4)

    fallbacks = []
    real = exprs.record
    monkeypatch.setattr(exprs, "record", lambda *a, **k: fallbacks.append(a[0].name) or real(*a, **k))
    api = {"affine": dy.affine_transform, "esum": dy.esum, "concatenate": dy.concatenate}
    cg1 = dy.renew_cg()
    l1 = program(lambda name, xs: api[name](xs))
    if recording.NATIVE is not None:
        assert fallbacks == []
    v1 = l1.value()
    l1.backward()
    g1 = [p.grad_as_array().copy() for p in (W, b, U)]
    for p in (W, b, U, E):
        p.scale_gradient(0.0)
    cg2 = dy.renew_cg()
    l2 = program(lambda name, xs: expression_mod.record(OPS[name], xs, (0,) if name == "concatenate" else ()))
    assert _columns(cg1) == _columns(cg2)
    assert cg1._leaves == cg2._leaves
    assert l2.value() == v1
    l2.backward()
    for want, p in zip(g1, (W, b, U)):
        np.testing.assert_array_equal(p.grad_as_array(), want)


def test_parameters_in_a_list_keep_the_python_errors(parts):
    """A bad shape, a stale expression after a parameter, or parameters alone: the same worded
    errors (op, shapes, the user's line) as the Python path; parameters alone record too."""
    E, W, b = parts
    dy.renew_cg()
    x = dy.lookup(E, 1)
    with pytest.raises(DynagraphError, match=r"affine\(\(6,\), \(6, 6\), \(10, 6\)\)") as e:
        dy.affine_transform([b, W, E])  # no expression: the fallback words it
    assert "test_record_fast.py" in str(e.value)
    with pytest.raises(DynagraphError, match=r"affine\(\(6,\), \(6, 6\), \(6,\), \(6, 6\), \(10, 6\)\)") as e:
        dy.affine_transform([b, W, x, W, E])
    assert "test_record_fast.py" in str(e.value)
    old = x
    cg = dy.renew_cg()
    y = dy.lookup(E, 2)
    with pytest.raises((StaleExpressionError, DynagraphError), match="stale"):
        dy.affine_transform([b, W, y, W, old])
    n = len(cg.op)
    s = dy.esum([b, b])  # only parameters: the current graph, through Python
    assert s.shape == (6,) and len(cg.op) == n + 1
    np.testing.assert_allclose(s.npvalue(), 2 * b.as_array())
