"""Runs (dynagraph/runs.py): consecutive elementwise batches executed by one C call.

Random per-sample programs of every run-able op (hypothesis) give the numpy
backend's values and gradients under every scheduler; finite differences check a run
directly; the bookkeeping that forms the row pointers is checked against its Python
twin and on bad input; a block that cannot be read in place falls back to batch by
batch; intermediate gradients, revert() and check_validity see what they would without
runs."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refcheck import check_op, run_graph, using

import dynagraph as dy
from dynagraph import executor, graph, runs
from dynagraph.backends import get_backend
from dynagraph.errors import NonFiniteError
from dynagraph.recording import NATIVE


@pytest.fixture(autouse=True)
def _two_step_runs(monkeypatch):
    """These tests drive the run machinery with small graphs: every stretch of two or more
    batches becomes a run here (the default skips two-step stretches, a speed policy tested below)."""
    monkeypatch.setattr(executor, "RUN_MIN_STEPS", 2)

needs_runs = pytest.mark.skipif(get_backend("cpu").elementwise_runs is None,
                                reason="compiled kernels (with runs) not built")
needs_native = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "run_table"),
                                  reason="dynagraph._bookkeeping not built")
pytestmark = needs_runs
N = 5  # elements per vector

UNARY = ["tanh", "logistic", "rectify", "neg", "square", "cube", "abs", "softsign", "exp", "elu", "selu",
         "nobackprop", "flip_gradient", "log", "sqrt"]
BINARY = ["add", "sub", "cmult", "cdiv", "bmax", "bmin", "pow"]
NARY = ["esum", "average", "emax", "logsumexp"]
CONST = ["addc", "mulc", "rsubc", "rdivc", "powc"]


def _apply(kind: str, xs: list, pick: int):
    """One step of a random program on the values xs computed so far."""
    a, b, c = xs[pick % len(xs)], xs[(pick * 7 + 1) % len(xs)], xs[(pick * 3 + 2) % len(xs)]
    if kind in ("log", "sqrt"):
        return getattr(dy, kind)(dy.exp(a * 0.3) + 0.5)
    if kind == "elu":
        return dy.elu(a, 0.7)
    if kind == "neg":
        return -a
    if kind in UNARY:
        return getattr(dy, kind)(a)
    if kind == "cdiv":
        return dy.cdiv(a, dy.exp(b * 0.2) + 1.0)
    if kind == "pow":
        return dy.pow(dy.exp(a * 0.2) + 0.5, dy.tanh(b))
    if kind in BINARY:
        return {"add": a + b, "sub": a - b, "cmult": dy.cmult(a, b),
                "bmax": dy.bmax(a, b), "bmin": dy.bmin(a, b)}[kind]
    if kind in NARY:
        return getattr(dy, kind)([a, b, c])
    if kind == "addc":
        return a + 0.25
    if kind == "mulc":
        return a * -1.5
    if kind == "rsubc":
        return 2.0 - a
    if kind == "rdivc":
        return 1.5 / (dy.exp(a * 0.2) + 0.5)
    if kind == "powc":
        return (dy.exp(a * 0.2) + 0.5) ** 1.7
    if kind == "pick":  # a contiguous slice of a wider vector: a COPY step
        return dy.pick_range(dy.concatenate([a, b]), N // 2, N // 2 + N)
    raise AssertionError(kind)


program_st = st.lists(st.tuples(st.sampled_from(UNARY + BINARY + NARY + CONST + ["pick", "pick"]),
                                st.integers(0, 50)), min_size=2, max_size=14)


def _model(programs: list, shared: bool):
    def build(pc):
        W = pc.add_parameters((N, N), name="W")
        s = pc.add_parameters((N,), name="s")
        outs = []
        for k, prog in enumerate(programs):
            x = dy.inputTensor(np.linspace(-1.5, 1.5, N) * (k + 1) / len(programs))
            xs = [dy.tanh(W * x), dy.parameter(s) if shared else dy.logistic(x + dy.parameter(s))]
            for kind, pick in prog:
                xs.append(_apply(kind, xs, pick))
            outs.append(xs[-1] + xs[len(xs) // 2])
        return outs
    return build


@contextmanager
def _backend(name: str, fuse: bool = True):
    saved = dy.config.get()["backend"], dy.config.get()["fuse"]
    dy.config.set(backend=name, fuse=fuse)
    try:
        yield
    finally:
        dy.config.set(backend=saved[0], fuse=saved[1])


def _run(backend: str, scheduler: str, build, dtype="float64", fuse=True):
    with _backend(backend, fuse):
        return run_graph(scheduler, build, dtype=dtype)


def _same(a, b, rtol, atol):
    for x, y in zip(a.values, b.values):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
    assert a.grads.keys() == b.grads.keys()
    for k in a.grads:
        np.testing.assert_allclose(a.grads[k], b.grads[k], rtol=rtol, atol=atol, err_msg=k)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs=st.lists(program_st, min_size=1, max_size=4), shared=st.booleans(),
       scheduler=st.sampled_from(dy.schedulers.available()))
def test_random_programs_match_the_numpy_backend(programs, shared, scheduler):
    build = _model(programs, shared)
    with np.errstate(all="ignore"):
        ref = _run("numpy", scheduler, build)
        got = _run("cpu", scheduler, build)
    assert ref.cg.stats.runs == 0
    assert got.cg.stats.runs > 0
    _same(got, ref, 1e-9, 1e-11)


@pytest.mark.parametrize("scheduler", ["agenda", "depth", "none"])
def test_float32_runs_are_close_to_the_reference(scheduler):
    build = _model([[("tanh", 0), ("cmult", 1), ("logistic", 2), ("pick", 3), ("esum", 4), ("cdiv", 5)]] * 3,
                   False)
    ref = _run("numpy", scheduler, build, dtype="float32")
    got = _run("cpu", scheduler, build, dtype="float32")
    assert got.cg.stats.runs > 0
    _same(got, ref, 2e-5, 1e-6)


def test_fuse_off_runs_batch_by_batch():
    build = _model([[("tanh", 0), ("cmult", 1)]] * 3, False)
    before = dy.config.get()["fuse"]
    off = _run("cpu", "agenda", build, fuse=False)
    on = _run("cpu", "agenda", build)
    assert off.cg.stats.runs == 0 and on.cg.stats.runs > 0
    assert dy.config.get()["fuse"] is before  # the setting is restored
    _same(on, off, 1e-12, 1e-14)


def _chain(x, y):
    h = dy.tanh(dy.cmult(dy.logistic(x), y))
    return dy.esum([dy.pick_range(h, 1, 4), dy.sqrt(dy.square(dy.pick_range(x, 0, 3)) + 1.0),
                    dy.emax([dy.pick_range(y, 2, 5), dy.pick_range(h, 0, 3)])])


def test_a_run_matches_finite_differences():
    x, y = np.array([0.3, -1.2, 0.8, 2.0, -0.4]), np.array([1.1, 0.2, -0.7, 0.5, 1.3])
    with _backend("cpu"):
        check_op(_chain, [x, y], scheduler="none")  # one node per batch: the chain is one long run
        assert graph.current().stats.runs > 0
        check_op(_chain, [x.reshape(5, 1) * np.ones((1, 2)), y.reshape(5, 1) * np.ones((1, 2))],
                 scheduler="agenda")


def test_only_contiguous_pick_ranges_are_steps():
    with _backend("cpu"), using("float64"):
        cg = dy.renew_cg()
        m = dy.inputTensor(np.arange(9.0).reshape(3, 3))
        rows = dy.pick_range(m, 1, 3, 0)   # rows 1-2 of a row-major matrix: contiguous
        cols = dy.pick_range(m, 1, 3, 1)   # columns: strided, not a step
        assert runs.step_spec(cg, rows.i).code == runs.COPY
        assert runs.step_spec(cg, rows.i).offs == (3,)
        assert runs.step_spec(cg, cols.i) is None
        out = dy.tanh(rows) + dy.tanh(dy.transpose(cols))
        a = np.arange(9.0).reshape(3, 3)
        np.testing.assert_allclose(out.npvalue(), np.tanh(a[1:3]) + np.tanh(a[:, 1:3].T))


def test_intermediate_gradients_and_revert_see_run_blocks():
    def build(pc):
        p = pc.add_parameters((N,), name="p")
        xs = [dy.tanh(dy.parameter(p) * float(k + 1)) for k in range(4)]
        mids = [dy.cmult(x, x) for x in xs]
        build.mids = mids
        return [dy.logistic(m) + m for m in mids]
    got = _run("cpu", "agenda", build)
    mine = [m.gradient() for m in build.mids]
    _run("numpy", "agenda", build)
    theirs = [m.gradient() for m in build.mids]
    assert got.cg.stats.runs > 0
    for a, b in zip(mine, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    with _backend("cpu"), using("float64"):
        cg = dy.renew_cg()
        x = dy.inputTensor(np.linspace(-1, 1, N))
        keep = dy.tanh(x) + 1.0
        keep.value()
        cg.checkpoint()
        drop = dy.logistic(keep) * 2.0
        drop.value()
        assert cg.stats.runs >= 1
        cg.revert()
        np.testing.assert_allclose(keep.npvalue(), np.tanh(np.linspace(-1, 1, N)) + 1.0)
        again = dy.cmult(keep, keep)
        np.testing.assert_allclose(again.npvalue(), (np.tanh(np.linspace(-1, 1, N)) + 1.0) ** 2)


def test_check_validity_names_the_op_inside_a_run():
    with _backend("cpu"), using("float64"):
        dy.renew_cg(check_validity=True)
        x = dy.inputTensor(-np.ones(N))
        y = dy.log(dy.tanh(x) * 2.0)
        with pytest.raises(NonFiniteError, match="log"), np.errstate(all="ignore"):
            y.value()
        cg = y.cg
        assert all(cg.blk[i] < 0 for i in range(x.i + 1, y.i + 1))  # as batch by batch: no value kept
        assert len(cg.blocks) == cg.blk[x.i] + 1


def test_a_block_that_cannot_be_read_in_place_falls_back():
    with _backend("cpu"), using("float64"):
        pc = dy.ParameterCollection()
        p = pc.add_parameters((N,), init=dy.NumpyInitializer(np.linspace(-1, 1, N)))
        cg = dy.renew_cg()
        e = dy.parameter(p)
        b = cg.blk[e.i]
        cg.blocks[b] = np.repeat(cg.blocks[b], 2, axis=1)[:, ::2]  # same values, strided rows
        assert not cg.blocks[b].flags.c_contiguous
        out = dy.logistic(dy.tanh(e) * 3.0)
        np.testing.assert_allclose(out.npvalue(), 1 / (1 + np.exp(-np.tanh(np.linspace(-1, 1, N)) * 3.0)))
        assert cg.stats.runs == 0 and cg.stats.batches == 3
        dy.sum_elems(out).backward()
        y = np.tanh(np.linspace(-1, 1, N))
        s = 1 / (1 + np.exp(-3 * y))
        np.testing.assert_allclose(p.grad_as_array(), s * (1 - s) * 3 * (1 - y * y), rtol=1e-12)


# ------------------------------------------------------------ the row-pointer table
def _graph_with_run():
    """A recorded graph, its steps placed as execute_run places them, and the table inputs."""
    with using("float64"):
        cg = dy.renew_cg()
        pc = dy.ParameterCollection()
        p = pc.add_parameters((2 * N,))
        xs = [dy.inputTensor(np.arange(2.0 * N) + k) for k in range(3)]
        for x in xs:
            x.value()
        a = [dy.pick_range(x, 2, 2 + N) for x in xs] + [dy.pick_range(dy.parameter(p), 0, N)]
        b = [dy.tanh(v) for v in a]
        steps = [[v.i for v in a], [v.i for v in b]]
        cg._sync_values()
        for nodes in steps:
            bid = len(cg.blocks)
            cg.blocks.append(np.zeros((len(nodes), N)))
            for r, n in enumerate(nodes):
                cg.blk[n], cg.row[n] = bid, r
        specs = [runs.step_spec(cg, s[0]) for s in steps]
        offs = [o for s in specs for o in s.offs]
        reach = [r for s in specs for r in s.reach]
        return cg, steps, offs, reach


def _table_args(cg, steps, offs, reach, fmt="d"):
    return [cg.blk, cg.row, cg.args, cg.needs_grad, steps, cg.blocks, offs, reach, fmt]


@needs_native
def test_run_table_matches_its_python_twin():
    cg, steps, offs, reach = _graph_with_run()
    args = _table_args(cg, steps, offs, reach)
    got, ref = NATIVE.run_table(*args), runs._table_py(*args)
    assert [bytes(x) if not isinstance(x, list) else x for x in got] == \
        [bytes(x) if not isinstance(x, list) else x for x in ref]
    # given the graph, the argument ids come from its node table (node_table.c): the same table
    assert cg._node_table() == cg.args
    assert [bytes(x) if not isinstance(x, list) else x for x in NATIVE.run_table(*args, cg)] == \
        [bytes(x) if not isinstance(x, list) else x for x in ref]
    src, pslot, poff, slots, need, slot_last = got
    # both steps need a gradient (a parameter's slice is upstream of each); the inputs and
    # the parameter are last read by step 0, the first step's block by step 1
    assert len(np.frombuffer(src, np.int64)) == 8 and need == b"\x01\x01"
    assert len(slots) == 5 and list(np.frombuffer(slot_last, np.int64)) == [0, 0, 0, 0, 1]
    # the pick_range of input k reads its row at element 2
    first = np.frombuffer(poff, np.int64)[0]
    assert first == 2 * 8


@needs_native
@pytest.mark.parametrize("twin", ["native", "python"])
def test_run_table_rejects_bad_bookkeeping(twin):
    table = NATIVE.run_table if twin == "native" else runs._table_py
    cg, steps, offs, reach = _graph_with_run()
    with pytest.raises(IndexError):
        table(*_table_args(cg, [[len(cg.op) + 3]], [0], [N]))
    src_node = cg.args[steps[0][0]][0]
    saved = cg.row[src_node]
    cg.row[src_node] = 99  # a row beyond its block
    with pytest.raises(ValueError, match="row"):
        table(*_table_args(cg, steps, offs, reach))
    cg.row[src_node] = saved
    with pytest.raises(ValueError):
        table(*_table_args(cg, steps, offs, [r + 2 * N for r in reach]))  # more elements than a row holds
    cg.blk[src_node] = -1  # an argument without a value
    with pytest.raises(ValueError, match="no value"):
        table(*_table_args(cg, steps, offs, reach))
    cg.blk[src_node] = len(cg.blocks) + 5
    with pytest.raises(ValueError, match="no value"):
        table(*_table_args(cg, steps, offs, reach))


@needs_native
@pytest.mark.parametrize("twin", ["native", "python"])
def test_run_table_declines_blocks_it_cannot_read_in_place(twin):
    table = NATIVE.run_table if twin == "native" else runs._table_py
    cg, steps, offs, reach = _graph_with_run()
    assert table(*_table_args(cg, steps, offs, reach, fmt="f")) is None  # float64 blocks
    b = cg.blk[cg.args[steps[0][0]][0]]
    cg.blocks[b] = np.asfortranarray(np.repeat(cg.blocks[b], 2, axis=0))[::2]
    assert table(*_table_args(cg, steps, offs, reach)) is None


@needs_native
@pytest.mark.parametrize("twin", ["native", "python"])
def test_place_steps_makes_and_places_each_steps_block(twin):
    """A run's output blocks: one per step, shaped (nodes, *node shape), appended after the
    graph's blocks, each node at its row, addresses and row counts handed back."""
    place_steps = NATIVE.place_steps if twin == "native" else runs._place_steps_py
    cg, steps, _, _ = _graph_with_run()
    first = len(cg.blocks)
    blk, row = list(cg.blk), list(cg.row)
    outs, counts = place_steps(cg.blk, cg.row, cg.shape, steps, cg.blocks, np.empty, np.dtype(np.float64), "d")
    assert len(cg.blocks) == first + 2 and list(np.frombuffer(counts, np.int64)) == [4, 4]
    assert [cg.blocks[first + m].shape for m in range(2)] == [(4, N), (4, N)]
    assert list(np.frombuffer(outs, np.int64)) == [cg.blocks[first + m].ctypes.data for m in range(2)]
    for m, nodes in enumerate(steps):
        assert [(cg.blk[n], cg.row[n]) for n in nodes] == [(first + m, r) for r in range(len(nodes))]
    untouched = set(range(len(blk))) - {n for nodes in steps for n in nodes}
    assert all(cg.blk[n] == blk[n] and cg.row[n] == row[n] for n in untouched)
    with pytest.raises(IndexError):
        place_steps(cg.blk, cg.row, cg.shape, [[len(cg.op) + 3]], cg.blocks, np.empty, np.dtype(np.float64), "d")
    with pytest.raises((ValueError, TypeError)):  # blocks of another dtype than the run's format
        place_steps(cg.blk, cg.row, cg.shape, steps, cg.blocks, np.empty, np.dtype(np.float32), "d")


@needs_native
@pytest.mark.parametrize("twin", ["native", "python"])
def test_addresses_checks_what_it_hands_out(twin):
    addresses = NATIVE.addresses if twin == "native" else runs._addresses_py
    a, b = np.zeros((2, 3)), np.zeros((2, 3), np.float32)
    got = np.frombuffer(addresses([a, None], "d"), np.int64)
    assert got[0] == a.ctypes.data and got[1] == 0
    with pytest.raises(ValueError):
        addresses([b], "d")
    with pytest.raises((ValueError, BufferError)):
        addresses([np.zeros((3, 4))[:, ::2]], "d")
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        addresses([ro], "d")


@needs_native
@pytest.mark.parametrize("twin", ["native", "python"])
def test_grad_addresses_checks_gradient_blocks_against_their_values(twin):
    grad_addresses = NATIVE.grad_addresses if twin == "native" else runs._grad_addresses_py
    v, g = np.zeros((2, 3)), np.zeros((2, 3))
    got = np.frombuffer(grad_addresses([g, None], [v, v], "d"), np.int64)
    assert got[0] == g.ctypes.data and got[1] == 0
    # per pair: slot 0 rows 1 and 0, slot 1 (None: an argument whose gradient is not needed) -> 0
    slot, off = np.array([0, 0, 1], np.int64).tobytes(), np.array([24, 0, 8], np.int64).tobytes()
    got = np.frombuffer(grad_addresses([g, None], [v, v], "d", slot, off), np.int64)
    assert list(got) == [g.ctypes.data + 24, g.ctypes.data, 0]
    for bad in (np.zeros((3, 2)), np.zeros((2, 4)), np.zeros((2, 3), np.float32), np.zeros((2, 6))[:, ::2]):
        with pytest.raises((ValueError, BufferError)):  # unlike its value block: never written through
            grad_addresses([bad], [v], "d")
    ro = np.zeros((2, 3))
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        grad_addresses([ro], [v], "d")
    with pytest.raises(ValueError):
        grad_addresses([g], [v, v], "d")
    for slot, off in (([2], [0]), ([-1], [0]), ([0], [-8]), ([0], [48]), ([0, 0], [0])):
        with pytest.raises(ValueError):
            grad_addresses([g, None], [v, v], "d", np.array(slot, np.int64).tobytes(),
                           np.array(off, np.int64).tobytes())


def test_full_backward_gives_every_run_node_its_gradient():
    """backward(full=True): gradients reach nodes that need none (inputs), through runs too."""
    def grads(backend):
        with _backend(backend), using("float64"):
            dy.renew_cg()
            xs = [dy.inputTensor(np.linspace(-1, 1, N) * (k + 1)) for k in range(3)]
            mids = [dy.tanh(x) for x in xs]
            outs = [dy.cmult(dy.logistic(m), m) + 0.5 for m in mids]
            loss = dy.sum_elems(dy.esum(outs))
            loss.backward(full=True)
            return [x.gradient() for x in xs] + [m.gradient() for m in mids], loss.cg.stats.runs
    (mine, runs_on), (ref, runs_off) = grads("cpu"), grads("numpy")
    assert runs_on > 0 and runs_off == 0
    assert all(np.abs(g).sum() > 0 for g in mine)
    for a, b in zip(mine, ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_runs_read_matrices_lookup_tables_and_looked_up_rows():
    """Run steps over whole matrices: a dense lookup table, a looked-up row, a matrix slice."""
    def build(pc):
        E = pc.add_lookup_parameters((6, 4), name="E")
        M = pc.add_parameters((3, 4), name="M")
        dense = dy.tanh(dy.parameter(E)) * 2.0 + 0.5            # (6, 4): the whole table
        rows = dy.pick_range(dy.logistic(dy.parameter(M)), 1, 3)  # (2, 4): rows 1-2, contiguous
        looked = [dy.cmult(dy.tanh(dy.lookup(E, k)), dy.lookup(E, k + 1)) for k in range(4)]
        return [dense, dy.square(rows) - rows] + looked
    got, ref = _run("cpu", "agenda", build), _run("numpy", "agenda", build)
    assert got.cg.stats.runs > 0
    _same(got, ref, 1e-12, 1e-14)


def test_graphs_with_equal_runs_share_one_read_only_program():
    """Per-sentence programs repeat the same runs graph after graph: their op codes and
    constants are built once, shared, and cannot be written; values stay those of a
    program built from scratch."""
    build = _model([[("tanh", 0), ("cmult", 1), ("logistic", 2)]] * 2, False)
    runs._PROGRAMS.clear()
    first = _run("cpu", "agenda", build)
    programs = dict(runs._PROGRAMS)
    assert programs and first.cg.stats.runs > 0
    again = _run("cpu", "agenda", build)
    assert runs._PROGRAMS == programs  # the second graph found its programs
    for prog in programs.values():
        assert len(prog[0]) == len(prog[1]) == int(prog[2][1::2].sum())  # one offset per step argument
        for a in prog[2:5]:  # code, consts, widths (then the max width and the specs)
            assert not a.flags.writeable
            with pytest.raises(ValueError):
                a[0] = 0
    runs._PROGRAMS.clear()
    fresh = _run("cpu", "agenda", build)
    _same(again, fresh, 0.0, 0.0)
    _same(again, first, 0.0, 0.0)


def test_step_specs_shared_across_graphs_follow_shapes_and_parameters():
    """Step specs are kept across graphs by signature key and shapes: graphs that differ only
    in a vector size or a pick_range get their own specs, graphs over new parameters (run_graph
    makes a new collection each time) reuse equal ones, and every graph matches the numpy backend."""
    def build(n, lo):
        def f(pc):
            W = pc.add_parameters((n, n), name="W")
            s = pc.add_parameters((n,), name="s")
            x = dy.inputTensor(np.linspace(-1, 1, n))
            h = dy.tanh(W * x)
            g = dy.cmult(dy.logistic(h + dy.parameter(s)), h)
            return [dy.pick_range(g, lo, n) * 2.0 + dy.pick_range(h, lo, n), g + 0.5]
        return f
    for n, lo in ((5, 1), (7, 1), (5, 2), (7, 3), (5, 1)):
        c, ref = _run("cpu", "agenda", build(n, lo)), _run("numpy", "agenda", build(n, lo))
        _same(c, ref, 1e-12, 1e-14)
        assert c.cg.stats.runs > 0


def test_two_step_stretches_run_batch_by_batch_by_default(monkeypatch):
    """A run's fixed cost exceeds two one-node batches' (per-sentence CBOW: 18 us a run):
    by default a stretch runs as a run only from RUN_MIN_STEPS batches; values are the same."""
    def build(pc):  # addc, tanh: a two-step stretch, ended by sum_elems
        return dy.sum_elems(dy.tanh(dy.inputVector([0.5, -1.0, 2.0]) + 1.0))
    with _backend("cpu"):
        monkeypatch.setattr(executor, "RUN_MIN_STEPS", 3)
        two = run_graph("agenda", build, backward=False)
        monkeypatch.setattr(executor, "RUN_MIN_STEPS", 2)
        as_run = run_graph("agenda", build, backward=False)
    assert (two.cg.stats.runs, as_run.cg.stats.runs) == (0, 1)
    np.testing.assert_allclose(two.values[0], as_run.values[0], rtol=1e-12, atol=0)
