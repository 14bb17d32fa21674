"""dynagraph._bookkeeping (kernels/cpython/) against its pure-Python twins.

Every compiled function must give exactly what its twin gives, and bad input must
raise, never crash. Recording is compared column by column with a subprocess that
runs with DYNAGRAPH_BOOKKEEPING=python, and a slice of the suite runs there too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dynagraph as dy
from dynagraph import engine, executor, recording
from dynagraph.errors import DynagraphError, DynagraphIndexError, StaleExpressionError
from dynagraph.schedulers import simple

NATIVE = recording.NATIVE
needs_native = pytest.mark.skipif(NATIVE is None, reason="dynagraph._bookkeeping is not built")
ROOT = Path(__file__).resolve().parents[1]
_SETTINGS = dict(deadline=None, derandomize=True, database=None, max_examples=60,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

sys.path.insert(0, str(Path(__file__).resolve().parent / "schedulers"))
import _random_graph as rg  # noqa: E402

# ------------------------------------------------------------------ recording
DUMP = r"""
import json, sys
sys.path.insert(0, {sched!r})
import dynagraph as dy
import _random_graph as rg
def part(p, ids):  # a shared parameter's part holds id(p): number them in order of appearance
    return repr((p[0], ids.setdefault(p[1], len(ids)), p[2]) if p and p[0] == "shared" else p)
def dump(spec):
    dy.config.set(random_seed=0, dtype="float64")
    cg = dy.renew_cg()
    losses = rg.record(dy.ParameterCollection(), spec)
    total = dy.esum(losses)
    value = total.value()
    ids = {{}}
    return dict(op=[o.name for o in cg.op], args=[list(a) for a in cg.args], attrs=[repr(a) for a in cg.attrs],
                data=[repr(d) for d in cg.data], shape=[list(s) for s in cg.shape], depth=cg.depth, sig=cg.sig,
                sig_part=[part(p, ids) for p in cg.sig_part], needs_grad=cg.needs_grad, value=value)
specs = json.loads(sys.stdin.read())
print(json.dumps([dump((tuple((list(map(tuple, p)), o) for p, o in s), r)) for s, r in specs]))
"""


def _dump(specs: list, pure: bool) -> list:
    env = dict(os.environ)
    env.pop("DYNAGRAPH_BOOKKEEPING", None)
    if pure:
        env["DYNAGRAPH_BOOKKEEPING"] = "python"
    script = DUMP.format(sched=str(ROOT / "tests" / "schedulers"))
    r = subprocess.run([sys.executable, "-c", script], input=json.dumps(specs), capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_native
def test_compiled_and_python_recording_build_the_same_graph():
    """Every column of every node (ids, attrs, data including random keys, shapes, depths,
    signatures, needs_grad) and the value, on graphs reaching every opcode and branch."""
    import random
    rnd = random.Random(7)
    specs = [rg.every_branch_spec()]
    for _ in range(6):
        prog = [(rnd.choice(rg.OPCODES), rnd.randrange(64), rnd.randrange(64), rnd.randrange(64))
                for _ in range(rnd.randrange(1, 20))]
        specs.append(([(prog, [rnd.randrange(64) for _ in range(3)])], rnd.randrange(1, 3)))
    specs = [([(list(map(list, p)), o) for p, o in s], r) for s, r in specs]
    fast, pure = _dump(specs, pure=False), _dump(specs, pure=True)
    assert len(fast) == len(pure) == len(specs)
    for a, b in zip(fast, pure):
        assert a["op"]
        assert a == b


def test_the_python_twins_pass_the_graph_and_scheduler_tests():
    """The pure-Python path is what runs where the extension is not built."""
    env = dict(os.environ, DYNAGRAPH_BOOKKEEPING="python")
    files = ["tests/test_graph.py", "tests/test_errors.py", "tests/schedulers/test_models.py",
             "tests/test_autodiff.py"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout


def test_the_environment_switch_disables_the_extension():
    env = dict(os.environ, DYNAGRAPH_BOOKKEEPING="python")
    code = "import dynagraph.recording as r, dynagraph as dy; print(r.NATIVE, type(dy.tanh).__name__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "function"]
    code = "import dynagraph as dy; print(dy.config.get()['bookkeeping'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.stdout.split() == ["python"]
    assert dy.config.get()["bookkeeping"] == ("compiled" if NATIVE is not None else "python")


def test_recorders_fall_back_for_anything_but_live_expressions(pc):
    W = pc.add_parameters((3, 3))
    x = dy.inputVector([1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="numpy array"):
        dy.tanh(__import__("numpy").ones(3))
    y = dy.cmult(x, x)
    assert y.npvalue().tolist() == [1.0, 4.0, 9.0]
    z = dy.affine_transform([dy.inputVector([0.0] * 3), W, x])  # parameters mixed with expressions
    assert z.shape == (3,)
    assert dy.esum((x, x)).npvalue().tolist() == [2.0, 4.0, 6.0]  # a tuple takes the general path
    assert dy.esum(e for e in [x, y]).npvalue().tolist() == [2.0, 6.0, 12.0]
    with pytest.raises(DynagraphError, match="at least one"):
        dy.esum([])
    old = x
    dy.renew_cg()
    with pytest.raises(StaleExpressionError):
        dy.tanh(old)
    with pytest.raises(StaleExpressionError):
        dy.cmult(old, old)
    with pytest.raises(StaleExpressionError):
        dy.esum([old])
    a = dy.inputVector([1.0])
    with dy.ComputationGraph() as other:
        b = dy.inputVector([2.0])
    assert b.cg is other
    with pytest.raises(DynagraphError, match="two different"):
        dy.cmult(a, b)


def test_recorders_look_like_functions():
    assert dy.tanh.__name__ == "tanh" and "tanh" in dy.tanh.__doc__
    assert dy.affine_transform.__name__ == "affine_transform"
    assert dy.esum.__module__ == "dynagraph.expressions"

    class Holder:
        f = dy.tanh
    x = dy.inputVector([0.5])
    with pytest.raises(TypeError):
        Holder().f(x)  # stored on a class, it binds like a function: Holder().f(x) is tanh(self, x)


def test_int_attribute_recorders_take_exact_ints_and_fall_back_otherwise():
    """pick_range(x, s, e, d=0): exact ints fill the attrs (d keeps its default); a bool,
    a numpy int, a keyword or a missing argument goes to the Python function (which
    refuses the bool: indices are integers)."""
    x = dy.inputVector([0.0, 1.0, 2.0, 3.0])
    cg = x.cg
    for call, want in [(lambda: dy.pick_range(x, 1, 3), (1, 3, 0)),
                       (lambda: dy.pick_range(x, 1, 3, 0), (1, 3, 0)),
                       (lambda: dy.pick_range(x, np.int64(0), np.int32(1)), (0, 1, 0)),
                       (lambda: dy.pick_range(x, 2, e=4), (2, 4, 0))]:
        e = call()
        assert cg.attrs[e.i] == want and all(type(v) is int for v in cg.attrs[e.i])
    np.testing.assert_allclose(dy.pick_range(x, 1, 3).npvalue(), [1.0, 2.0])
    with pytest.raises(TypeError, match="pick_range"):
        dy.pick_range(x, 1)
    with pytest.raises(TypeError, match="pick_range: indices must be integers"):
        dy.pick_range(x, 0, True)
    with pytest.raises(DynagraphError, match="pick_range"):
        dy.pick_range(x, 3, 9)
    assert dy.pick_range.__name__ == "pick_range" and "pick_range" in dy.pick_range.__doc__


def test_fast_path_errors_are_the_python_ones():
    """A failing per-node check in the compiled path is re-run by Python for its message."""
    x = dy.inputVector([1.0, 2.0])
    dy.pick(x, 1)  # the signature is known now: the next pick takes the fast path
    with pytest.raises(DynagraphIndexError, match="pick") as e:
        dy.pick(x, 5)
    assert "test_bookkeeping.py" in str(e.value)
    assert len(x.cg.op) == 2  # nothing half-recorded


def test_immediate_compute_and_random_keys_go_through_add():
    cg = dy.renew_cg(immediate_compute=True)
    x = dy.inputVector([1.0, -1.0])
    y = dy.tanh(x)
    assert cg.done == len(cg.op)  # evaluated as recorded
    d1, d2 = dy.dropout(y, 0.5), dy.dropout(y, 0.5)
    assert cg.data[d1.i] != cg.data[d2.i]  # a distinct random key per node
    assert d1.npvalue().shape == (2,)


@needs_native
def test_configure_rejects_expression_classes_with_fields():
    class Fat(recording.ExprBase):
        __slots__ = ("extra",)
    with pytest.raises(TypeError):
        NATIVE.configure(Fat, object, object())


# ------------------------------------------------------------------ executor
ids_st = st.lists(st.integers(0, 39), min_size=1, max_size=30)
table_st = st.tuples(st.lists(st.integers(0, 3), min_size=40, max_size=40),
                     st.lists(st.integers(0, 9), min_size=40, max_size=40))


@needs_native
@settings(**_SETTINGS)
@given(table=table_st, ids=ids_st, start=st.integers(0, 30), run=st.integers(1, 10))
def test_locate_matches_python(table, ids, start, run):
    blk, row = table
    assert NATIVE.locate(blk, row, ids) == executor._locate_py(blk, row, ids)
    consecutive = list(range(start, min(start + run, 40)))
    blk2 = [7] * 40
    row2 = list(range(40))
    assert NATIVE.locate(blk2, row2, consecutive) == executor._locate_py(blk2, row2, consecutive)
    assert NATIVE.locate(blk2, row2, consecutive)[0] == executor.SLICE


@needs_native
@settings(**_SETTINGS)
@given(ids=ids_st, shift=st.sampled_from([2 ** 30 - 20, 2 ** 30, 2 ** 62]), same=st.booleans())
def test_locate_reads_rows_past_one_int_digit_like_python(ids, shift, same):
    """Rows and blocks are read inline when they fit one digit of CPython's ints (2**30):
    values across that boundary and far past it read the same as the Python twin's."""
    blk = [shift + (0 if same else i % 3) for i in range(40)]
    row = [shift + i for i in range(40)]
    assert NATIVE.locate(blk, row, ids) == executor._locate_py(blk, row, ids)


@needs_native
@settings(**_SETTINGS)
@given(ids=ids_st, arity=st.integers(0, 4), flags=st.lists(st.booleans(), min_size=40, max_size=40))
def test_columns_place_any_true_match_python(ids, arity, flags):
    args = [tuple((i * 7 + k) % 40 for k in range(arity)) for i in range(40)]
    assert NATIVE.columns(args, ids) == executor._columns_py(args, ids)
    assert NATIVE.any_true(flags, ids) == executor._any_true_py(flags, ids)
    a, b = [-1] * 40, [0] * 40
    c, d = [-1] * 40, [0] * 40
    NATIVE.place(a, b, ids, 5)
    executor._place_py(c, d, ids, 5)
    assert (a, b) == (c, d)
    assert NATIVE.pending(a, 0, 40) == engine._pending_py(c, 0, 40)


@needs_native
@settings(**_SETTINGS)
@given(blk=st.lists(st.sampled_from([-1, -2, 0, 1, 255, 256, 2 ** 30 - 1, 2 ** 30, 2 ** 40, -(2 ** 31)]),
                    max_size=60), data=st.data())
def test_pending_matches_python_on_any_ints(blk, data):
    """pending() counts before it fills and reads ints inline (one digit, either sign): the same
    nodes as the Python twin for values of every size; a non-int raises without a partial list."""
    lo = data.draw(st.integers(0, len(blk)))
    hi = data.draw(st.integers(lo, len(blk)))
    assert NATIVE.pending(blk, lo, hi) == engine._pending_py(blk, lo, hi)
    if hi > lo:
        with pytest.raises(TypeError):
            NATIVE.pending(blk[:lo] + ["x"] + blk[lo + 1:], lo, hi)


@needs_native
@pytest.mark.parametrize("bad", [[40], [-1], [3, 99], ["x"], [2 ** 70]])
def test_bad_node_ids_raise_instead_of_reading_out_of_bounds(bad):
    blk, row, args = [0] * 40, list(range(40)), [(1,)] * 40
    for call in (lambda: NATIVE.locate(blk, row, bad), lambda: NATIVE.columns(args, bad),
                 lambda: NATIVE.place(blk, row, bad, 1), lambda: NATIVE.any_true([True] * 40, bad),
                 lambda: NATIVE.depth_batches([0] * 40, [0] * 40, [True], bad),
                 lambda: NATIVE.agenda_batches(args, [0] * 40, [0] * 40, [True], [1], [0] + bad)):
        with pytest.raises((IndexError, TypeError, OverflowError)):
            call()
    with pytest.raises(IndexError):
        NATIVE.pending(blk, 0, 41)
    with pytest.raises(IndexError):
        NATIVE.node_arrays(args, [0] * 40, [0] * 40, 30, 20)
    with pytest.raises(ValueError):
        NATIVE.columns([(1,), (1, 2)], [0, 1])  # a batch's nodes share their arity
    with pytest.raises(TypeError):
        NATIVE.locate((0, 1), row, [0])  # lists only


# ----------------------------------------------------------------- scheduling
@needs_native
@settings(**dict(_SETTINGS, max_examples=25))
@given(spec=rg.graph_spec)
def test_depth_agenda_and_node_arrays_match_python(spec):
    cg = dy.renew_cg()
    rg.record(dy.ParameterCollection(), spec)
    cg._sync_values()
    nodes = engine._pending_py(cg.blk, 0, len(cg.op))
    for sched in (simple.DepthBatching(), simple.AgendaBatching(), simple.LookaheadBatching()):
        assert sched.schedule(cg, nodes) == sched.schedule_py(cg, nodes)
        part = nodes[len(nodes) // 3:]  # a later chunk: arguments outside it count as evaluated
        assert sched.schedule(cg, part) == sched.schedule_py(cg, part)
        # a dy.autobatch_map round: a few early nodes (deferred ones a read needs) and the new
        # ones, far apart in the id range; and every other node
        for sparse in (sorted(set(nodes[:2] + nodes[len(nodes) * 3 // 4:])), nodes[::2]):
            assert sched.schedule(cg, sparse) == sched.schedule_py(cg, sparse)
    lo, n = nodes[0], nodes[-1] + 1 - nodes[0]
    for a, b in zip(simple._node_arrays_c(cg, lo, n), simple._node_arrays(cg, lo, n)):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()


@needs_native
@pytest.mark.parametrize("chains,longest", [(300, 7), (40, 3), (300, 40), (2000, 60)])
def test_buckets_filled_out_of_order_sort_like_python(chains, longest):
    """Chains of 1-`longest` tanh steps, each ended by a logistic: the logistic bucket fills in
    order of chain length, not of recording, as one ascending run per length (dg_sort_ids: up to
    16 runs are merged, 7 and 3 here; more take the radix sort, whose 300 nodes over thousands of
    ids take two byte passes)."""
    from dynagraph.schedulers import typewise
    cg = dy.renew_cg()
    ends = []
    for i in range(chains):
        x = dy.inputVector([0.1 * (i % 5), 0.2])
        for _ in range(1 + (i * 37) % longest):
            x = dy.tanh(x)
        ends.append(dy.logistic(x))
    dy.esum(ends)
    cg._sync_values()
    nodes = engine._pending_py(cg.blk, 0, len(cg.op))
    for sched in (simple.AgendaBatching(), simple.LookaheadBatching(), typewise.TypewiseBatching()):
        got = sched.schedule(cg, nodes)
        assert got == sched.schedule_py(cg, nodes)
        assert any(len(b) == chains for b in got) and all(list(b) == sorted(b) for b in got)


def _graph_with_python_nodes(pc, scheduler=None):
    """A graph recorded in C around nodes Python adds (_add_py, a leaf made in Python) and a
    revert() whose dropped ids are recorded again with other wiring; returns (cg, loss)."""
    from dynagraph.expression import Expression
    cg = dy.renew_cg(scheduler=scheduler)
    x = dy.inputVector([0.1, 0.2, 0.3])
    hs = [dy.tanh(x)]
    for _ in range(6):
        hs.append(dy.logistic(hs[-1]) + x)
    assert cg._node_table() == cg.args
    cg.checkpoint()
    dropped = [dy.cmult(h, h) for h in hs]
    cg.revert()
    del dropped
    again = [dy.cmult(hs[k], hs[-1 - k]) for k in range(len(hs))]  # the dropped ids, other wiring
    assert cg._node_table() == cg.args
    by_python = Expression(cg, cg._add_py(cg.op[hs[0].i], (again[2].i,), cg.attrs[hs[0].i], None))
    p = pc.parameters_list()[0] if pc.parameters_list() else pc.add_parameters((3,))
    leaf = Expression(cg, cg._leaf_py(p))
    tail = [dy.cmult(by_python, dy.parameter(p)), dy.cmult(leaf, again[0]), dy.tanh(by_python)]
    return cg, dy.sum_elems(dy.esum(again + tail))  # recorded in C after the Python nodes


@needs_native
def test_node_table_mirrors_args_through_python_adds_revert_and_replacement(pc):
    """The compiled recorder keeps each node's argument ids in a C table beside cg.args
    (kernels/cpython/node_table.c), which the agenda and the run tables read instead of the
    tuples. It must hold what args holds after nodes added by Python, after revert() and after
    the args list is replaced; the agenda must schedule alike reading it or the tuples, and the
    graph's value equal the unbatched one."""
    _graph_with_python_nodes(pc)  # its signatures known: the second graph's nodes are recorded in C
    cg, loss = _graph_with_python_nodes(pc)
    assert cg._node_table() == cg.args
    cg._sync_values()
    nodes = engine._pending_py(cg.blk, 0, len(cg.op))
    tables = (simple._per_signature(cg, "batchable"), simple._per_signature(cg, "cost"))
    for lookahead in (False, True):
        plain = NATIVE.agenda_batches(cg.args, cg.sig, cg.depth, *tables, nodes, lookahead)
        assert NATIVE.agenda_batches(cg.args, cg.sig, cg.depth, *tables, nodes, lookahead, cg) == plain
        part = nodes[len(nodes) // 2:]
        assert NATIVE.agenda_batches(cg.args, cg.sig, cg.depth, *tables, part, lookahead, cg) == \
            NATIVE.agenda_batches(cg.args, cg.sig, cg.depth, *tables, part, lookahead)
        # a list that is not the graph's: its tuples are read
        assert NATIVE.agenda_batches(list(cg.args), cg.sig, cg.depth, *tables, nodes, lookahead, cg) == plain
    got = loss.value()
    cg.args = list(cg.args)  # replaced: the table starts over from the new list
    assert cg._node_table() == cg.args
    _, ref = _graph_with_python_nodes(pc, scheduler="none")
    assert got == ref.value()


@needs_native
def test_depth_batches_defers_unknown_signatures_to_python():
    assert NATIVE.depth_batches([1, 1], [0, -1], [True], [0, 1]) is None
    assert NATIVE.depth_batches([1, 1, 2], [0, 0, 0], [True], [0, 1, 2]) == [[0, 1], [2]]
    assert NATIVE.depth_batches([1, 1, 2], [0, 0, 0], [False], [0, 1, 2]) == [[0], [1], [2]]


@needs_native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_depth_batches_match_python_across_table_growth(data):
    """The compiled depth pass keys its groups in a hash table that starts small and grows as
    groups appear: graphs of up to thousands of (depth, signature) groups, many depths sharing a
    signature (which once shared a probe chain) and unbatchable signatures, give the Python
    twin's schedule exactly, for any subset of the nodes in id order (as the engine hands them)."""
    from types import SimpleNamespace
    n = data.draw(st.integers(1, 4000))
    n_sig = data.draw(st.integers(1, 6))
    max_depth = data.draw(st.sampled_from([1, 5, 300, 3000]))
    seed = data.draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    depth = rng.integers(0, max_depth + 1, n).tolist()
    sig = rng.integers(0, n_sig, n).tolist()
    batchable = [bool(b) for b in rng.integers(0, 4, n_sig) > 0]
    nodes = sorted(rng.choice(n, data.draw(st.integers(0, n)), replace=False).tolist())
    ops = [SimpleNamespace(batchable=b) for b in batchable]
    cg = SimpleNamespace(depth=depth, sig=sig, op=[ops[s] for s in sig])  # what schedule_py reads
    assert NATIVE.depth_batches(depth, sig, batchable, nodes) == simple.DepthBatching().schedule_py(cg, nodes)


@needs_native
def test_signature_cache_agrees_with_the_dictionary(pc):
    """The compiled recorder remembers recent signature lookups by identity. A node must get
    the signature the dictionary gives: for equal attrs of another identity or type, after
    revert() drops the nodes a cached entry was made from, and after _sig_id is replaced."""
    import gc
    cg = dy.renew_cg()
    x = dy.inputVector([0.0, 1.0, 2.0, 3.0])
    a, b = dy.pick_range(x, 1, 3), dy.pick_range(x, 1, 3)
    c = graph_record1(x, (1.0, 3.0, 0))  # equal to (1, 3, 0): the same signature, as in a dict
    d = dy.pick_range(x, 0, 2)
    assert cg.sig[a.i] == cg.sig[b.i] == cg.sig[c.i] != cg.sig[d.i]
    assert not gc.is_tracked(cg.args[b.i])  # a tuple of node ids is not scanned by the collector
    p1 = pc.add_parameters((4,))
    cg.checkpoint()
    u = dy.cmult(dy.parameter(p1), x)
    cg.revert()  # u and p1's leaf are gone; the cache still holds what it compared against
    p2 = pc.add_parameters((4,))
    v = dy.cmult(dy.parameter(p2), x)
    w = dy.cmult(dy.parameter(p2), x)
    assert cg.sig_part[cg.args[v.i][0]] == ("shared", id(p2), True)
    assert cg.sig[v.i] == cg.sig[w.i] and cg.signatures[cg.sig[v.i]][2][0] == ("shared", id(p2), True)
    del u
    cg._sig_id = {}  # a replaced dictionary: nothing cached from the old one may be used
    e = dy.pick_range(x, 1, 3)
    assert cg.sig[e.i] != cg.sig[a.i] and cg._sig_id
    np.testing.assert_allclose(e.npvalue(), [1.0, 2.0])


def graph_record1(x, attrs):
    from dynagraph.expression import record1
    from dynagraph.ops import OPS
    return record1(OPS["pick_range"], x, attrs)
