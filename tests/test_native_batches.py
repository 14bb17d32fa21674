"""The compiled per-batch paths (kernels/cpython/batch_run.c) against the Python reference.

run_batch_native must leave exactly what executor.run_batch leaves: the same values,
blocks, (block, row) of every node and ExecutedBatch records, so the backward pass and
every gradient are bit-identical. Random graphs (tests/schedulers/_random_graph.py)
under every built-in scheduler, float32 and float64, with and without runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

import dynagraph as dy
from dynagraph import autodiff, executor, recording
from dynagraph.backends import to_numpy
from dynagraph.config import config as dynagraph_config
from backend_params import BACKENDS, use_backend
from refcheck import assert_same_grads_and_blocks, native_and_python_runs, run_graph, using

sys.path.insert(0, str(Path(__file__).resolve().parent / "schedulers"))
import _random_graph as rg  # noqa: E402

NATIVE = recording.NATIVE
needs_native = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "run_batch_native"),
                                  reason="dynagraph._bookkeeping is not built")
_SETTINGS = dict(deadline=None, derandomize=True, database=None, max_examples=25,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _run(monkeypatch, spec, scheduler: str, dtype: str, native: bool, fuse: bool, backend: str | None = "cpu"):
    """backend None: the one configured (the every-backend test sets it)."""
    with monkeypatch.context() as m:
        if backend is not None:
            m.setattr(dynagraph_config, "backend", backend)
        if not native:
            m.setattr(executor, "_run_batch_native", None)
            m.setattr(autodiff, "_backward_native", None, raising=False)
        old = dynagraph_config.fuse
        dy.config.set(fuse=fuse)
        try:
            return run_graph(scheduler, lambda pc: rg.record(pc, spec), dtype=dtype)
        finally:
            dy.config.set(fuse=old)


def _same(a, b, host: bool = False) -> None:
    """host: arrays may live on a device (checked, cuda): compared through explicit host copies."""
    h = to_numpy if host else (lambda x: x)
    for x, y in zip(a.values, b.values):
        np.testing.assert_array_equal(x, y)
    assert a.grads.keys() == b.grads.keys()
    for k in a.grads:
        np.testing.assert_array_equal(a.grads[k], b.grads[k], err_msg=k)
    assert a.cg.blk == b.cg.blk and a.cg.row == b.cg.row
    assert len(a.cg.blocks) == len(b.cg.blocks)
    for x, y in zip(a.cg.blocks, b.cg.blocks):
        assert type(x) is type(y) and x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(h(x), h(y))
    ra = [r for r in a.cg.executed if type(r) is executor.ExecutedBatch]
    rb = [r for r in b.cg.executed if type(r) is executor.ExecutedBatch]
    assert len(ra) == len(rb)
    for p, q in zip(ra, rb):
        assert tuple(p.nodes) == tuple(q.nodes) and p.block == q.block and p.cols == q.cols
        assert [pl[0] for pl in p.plans] == [pl[0] for pl in q.plans]
        for pl, ql in zip(p.plans, q.plans):
            if pl[0] != executor.MANY:  # MANY holds a backend row index (an array)
                assert pl == ql
        for x, y in zip(p.xs, q.xs):
            assert type(x) is type(y)
            hx, hy = np.asarray(h(x)), np.asarray(h(y))
            if hx.dtype != object:  # not a backend's in-place operand (rows_operand)
                np.testing.assert_array_equal(hx, hy)
    sa, sb = a.cg.stats, b.cg.stats
    for k in ("batches", "nodes", "kernel_calls", "gathers", "gather_bytes", "runs", "scatters", "scatter_bytes"):
        assert getattr(sa, k) == getattr(sb, k), k


@needs_native
@pytest.mark.parametrize("scheduler", ["none", "depth", "agenda"])
@settings(**_SETTINGS)
@given(spec=rg.graph_spec)
@example(spec=rg.every_branch_spec())
def test_native_batches_match_run_batch(monkeypatch, scheduler, spec):
    for dtype, fuse in (("float64", True), ("float32", False)):
        _same(_run(monkeypatch, spec, scheduler, dtype, True, fuse),
              _run(monkeypatch, spec, scheduler, dtype, False, fuse))


@pytest.fixture(params=BACKENDS)
def backend(request):
    yield from use_backend(request.param)


@needs_native
@settings(**{**_SETTINGS, "max_examples": 8})
@given(spec=rg.graph_spec)
def test_native_batches_match_run_batch_on_every_backend(monkeypatch, backend, spec):
    """The compiled steps ask nothing of a backend but its kernels and xp: on numpy, checked
    (a device boundary) and cuda they leave what the reference leaves."""
    _same(_run(monkeypatch, spec, "agenda", "float64", True, True, None),
          _run(monkeypatch, spec, "agenda", "float64", False, True, None), host=backend != "cpu")


@needs_native
def test_native_batches_add_their_counts_and_times_to_stats():
    dy.renew_cg()
    pc = dy.ParameterCollection()
    W = dy.parameter(pc.add_parameters((3, 3)))
    xs = [dy.tanh(W * dy.inputVector([1.0, 2.0, float(i)])) for i in range(4)]
    cg = dy.cg()
    dy.esum(xs).value()
    assert cg.stats.batches >= 3 and cg.stats.nodes >= 9 and cg.stats.kernel_calls >= 3
    assert cg.stats.t_execute > 0 and cg.stats.t_memory > 0


def _context(cg, be, **change):
    ctx = list(executor._NativeBatches(cg, be).ctx)
    for k, v in change.items():
        ctx[int(k[1:])] = v
    return tuple(ctx)


@needs_native
def test_native_batch_rejects_malformed_input_without_touching_the_graph():
    from dynagraph.backends import get_backend
    dy.renew_cg()
    x = dy.inputVector([1.0, 2.0])
    y = dy.tanh(x)
    cg = dy.cg()
    x.value()
    be = get_backend()
    before = (list(cg.blk), len(cg.blocks), len(cg.executed))
    run = NATIVE.run_batch_native
    with pytest.raises(TypeError):
        run(_context(cg, be)[:5], (y.i,))
    with pytest.raises(TypeError):
        run(_context(cg, be, c1=tuple(cg.blk)), (y.i,))
    with pytest.raises(IndexError):
        run(_context(cg, be), (len(cg.op) + 5,))
    with pytest.raises(ValueError):
        run(_context(cg, be), ())
    with pytest.raises(TypeError):  # the record type must be a tuple subclass
        run(_context(cg, be, c14=list), (y.i,))
    assert (cg.blk, len(cg.blocks), len(cg.executed)) == before

    def broken(*a):
        raise RuntimeError("kernel failed")
    # its own infos (c9): the shared ones (executor._op_infos, kept across evaluations) hold tanh's
    ctx = _context(cg, be, c9={}, c10=lambda op: (False, False, False, 1, broken, "tanh"))
    with pytest.raises(RuntimeError):
        run(ctx, (y.i,))
    assert (cg.blk, len(cg.blocks), len(cg.executed)) == before


@needs_native
def test_native_batch_hands_odd_outputs_to_finish():
    """A kernel result that is not already the block (a list, another dtype, a shared row)
    goes through executor._finish: the block is what run_batch makes of it."""
    from dynagraph.backends import get_backend
    be = get_backend()
    for result, want in ((lambda B: [[0.5, 0.25]] * B, np.float64),
                         (lambda B: np.ones((B, 2), np.float32), np.float64),
                         (lambda B: np.ones((1, 2)), np.float64)):
        with using("float64", 0):
            dy.renew_cg()
            a, b = dy.inputVector([1.0, 2.0]), dy.inputVector([3.0, 4.0])
            ta, tb = dy.tanh(a), dy.tanh(b)
            cg = dy.cg()
            a.value()
            b.value()
            ctx = _context(cg, be, c9={}, c10=lambda op, r=result: (False, False, False, 1,
                                                             lambda xp, at, d, x: np.asarray(r(x.shape[0])), "tanh"))
            NATIVE.run_batch_native(ctx, (ta.i, tb.i))
            blk = cg.blocks[cg.blk[ta.i]]
            assert blk.shape == (2, 2) and blk.dtype == want and blk.flags.c_contiguous
            assert (cg.row[ta.i], cg.row[tb.i]) == (0, 1)


@needs_native
def test_native_backward_rejects_malformed_input():
    """backward_batch_native checks its context and record; a bad one is a Python error, and
    a batch whose gradient is absent is skipped without touching anything."""
    from dynagraph.backends import get_backend
    with using("float64", 0):
        dy.renew_cg()
        pc = dy.ParameterCollection()
        W = dy.parameter(pc.add_parameters((2, 2)))
        y = dy.sum_elems(dy.tanh(W * dy.inputVector([1.0, 2.0])))
        cg = dy.cg()
        y.value()
        be = get_backend()
        gb = autodiff.Grads(len(cg.blocks), be.xp.zeros)
        deferred, sums = {}, {}
        ctx = autodiff._NativeBackward(cg, be, gb, False, deferred, sums).ctx
        record = next(r for r in cg.executed if type(r) is executor.ExecutedBatch)
        run = autodiff._backward_native
        with pytest.raises(TypeError):
            run(ctx[:-1], record)
        with pytest.raises(TypeError):
            run(ctx, tuple(record)[:5])
        with pytest.raises(TypeError):
            run(ctx[:14] + (None,) + ctx[15:], record)  # leaf_sums must be a dict
        bad = tuple(record)
        with pytest.raises(IndexError):
            run(ctx, bad[:2] + (len(gb) + 3,) + bad[3:])
        run(ctx, record)  # no gradient for its block yet: nothing to do
        assert all(g is None for g in gb) and not deferred and not sums
        many = NATIVE.backward_batches_native
        records = list(cg.executed)
        with pytest.raises(TypeError):
            many(ctx, tuple(records), len(records), executor.ExecutedBatch)
        with pytest.raises(TypeError):
            many(ctx[:-1], records, len(records), executor.ExecutedBatch)
        with pytest.raises(IndexError):
            many(ctx, records, len(records) + 1, executor.ExecutedBatch)
        with pytest.raises(TypeError):  # a record of the type asked for, but not a record
            many(ctx, records + [("x",)], len(records) + 1, tuple)
        # it stops at the first record of another type, from the end, and says where
        assert many(ctx, records + [object()], len(records) + 1, executor.ExecutedBatch) == len(records) + 1
        assert many(ctx, records, len(records), executor.ExecutedBatch) == 0
        assert all(g is None for g in gb) and not deferred and not sums


@settings(**{**_SETTINGS, "max_examples": 15})
@given(spec=rg.graph_spec)
def test_replayed_execution_plans_match_fresh_execution(monkeypatch, spec):
    """A graph that replays a cached schedule also replays its execution plan (executor._plan_of):
    which batches form runs, their step specs. Every replay leaves exactly what a graph executed
    without the cache leaves, with and without runs, compiled batches or not. The graphs share
    their parameters (a graph over other parameters is structured differently), which the
    first graph's collection holds: the others compare values, blocks and records."""
    from dynagraph.schedule_cache import SCHEDULES
    for dtype, fuse, native in (("float64", True, True), ("float32", True, False), ("float64", False, True)):
        shared: list = []
        with monkeypatch.context() as m:
            m.setattr(rg, "Params", _SharedParams(rg.Params, shared))
            SCHEDULES.clear()
            try:
                _run(monkeypatch, spec, "agenda", dtype, native, fuse)  # scheduled, kept, its plan made
                m.setattr(dynagraph_config, "schedule_cache", False)
                fresh = _run(monkeypatch, spec, "agenda", dtype, native, fuse)
                m.setattr(dynagraph_config, "schedule_cache", True)
                hits = SCHEDULES.hits
                for _ in range(2):
                    _same(_run(monkeypatch, spec, "agenda", dtype, native, fuse), fresh)
                assert SCHEDULES.hits - hits == 2 or not SCHEDULES.entries  # a graph too large is not kept
            finally:
                SCHEDULES.clear()


def _cbow_sentence(pc, words, H: int = 5):
    """A per-sentence deep CBOW graph (bench/swap/cbow.py's shape): an esum of lookups (columns
    that are one-row slices of the lookup's block), products with shared weights, biases."""
    if not hasattr(pc, "cbow"):
        rng = np.random.default_rng(3)
        pc.cbow = (pc.lookup_parameters_from_numpy(rng.uniform(-1, 1, (9, H))),
                   [pc.parameters_from_numpy(rng.uniform(-1, 1, (H, H))) for _ in range(2)],
                   [pc.parameters_from_numpy(rng.uniform(-1, 1, H)) for _ in range(2)],
                   pc.parameters_from_numpy(rng.uniform(-1, 1, (3, H))))
    E, Ws, bs, V = pc.cbow
    h = dy.esum([dy.lookup(E, w) for w in words])
    for W, b in zip(Ws, bs):
        h = dy.tanh(dy.parameter(W) * h + dy.parameter(b))
    return dy.pickneglogsoftmax(dy.parameter(V) * h, words[0] % 3)


def _sentence_steps(pc, words, extra_blocks: int = 0):
    """One sentence's graph: forward, backward; the graph, its loss and every gradient."""
    dy.renew_cg()
    cg = dy.cg()
    for _ in range(extra_blocks):  # blocks no node reads: the replayed plans' block ids shift
        cg.blocks.append(np.zeros((1, 1), cg.dtype))
    loss = _cbow_sentence(pc, words)
    value = loss.value()
    loss.backward()
    E, Ws, bs, V = pc.cbow
    grads = [p.grad.copy() for p in (E, *Ws, *bs, V)]
    for p in (E, *Ws, *bs, V):
        p.grad[...] = 0
        if p.is_lookup:
            p.touched[:] = False
    return cg, value, grads


@needs_native
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("extra_blocks", [0, 2])
def test_compiled_replay_leaves_what_batch_by_batch_execution_leaves(monkeypatch, dtype, extra_blocks):
    """A cached schedule's later graphs run as one replay_native call (executor._replay_compiled,
    replay.c): the same values, gradients, blocks, (block, row) and records (plans with the
    shifted block ids where the graph held other blocks before) as the same sentence run batch by
    batch without the cache. Other words each time: a lookup's data is read per graph."""
    from dynagraph.schedule_cache import SCHEDULES
    calls = []
    monkeypatch.setattr(executor, "_replay_native", lambda ctx, prog: calls.append(prog) or NATIVE.replay_native(ctx, prog))
    with using(dtype=dtype):
        pc = dy.ParameterCollection()
        SCHEDULES.clear()
        try:
            sentences = [(1, 4, 2, 7), (3, 3, 8, 0), (5, 1, 6, 2), (2, 2, 2, 2)]
            _sentence_steps(pc, sentences[0])  # scheduled, kept, run batch by batch: its program compiled
            for words in sentences[1:]:
                got = _sentence_steps(pc, words, extra_blocks)
                with monkeypatch.context() as m:
                    m.setattr(dynagraph_config, "schedule_cache", False)
                    fresh = _sentence_steps(pc, words, extra_blocks)
                assert got[1] == fresh[1]
                for g, f in zip(got[2], fresh[2]):
                    np.testing.assert_array_equal(g, f)
                a, b = got[0], fresh[0]
                assert a.blk == b.blk and a.row == b.row and len(a.blocks) == len(b.blocks)
                for x, y in zip(a.blocks, b.blocks):
                    np.testing.assert_array_equal(x, y)
                assert len(a.executed) == len(b.executed)
                for p, q in zip(a.executed, b.executed):
                    assert tuple(p.nodes) == tuple(q.nodes) and p.block == q.block and p.cols == q.cols
                    assert list(p.plans) == list(q.plans)
                    for x, y, where in zip(p.xs, q.xs, p.plans):  # a whole block is itself, rows a view
                        assert (x is a.blocks[where[1]]) == (y is b.blocks[where[1]])
                        np.testing.assert_array_equal(x, y)
        finally:
            SCHEDULES.clear()
    assert len(calls) == len(sentences) - 1  # every graph after the first
    base, steps = calls[0]
    specs = [np.frombuffer(s[2], np.int64).reshape(-1, 4) for s in steps]
    assert len(steps) == len(a.executed) and sum(len(s) for s in specs) == sum(len(r.cols) for r in a.executed)
    assert any(((s[:, 0] == executor.SLICE) & (s[:, 2] >= 0)).any() for s in specs)  # the esum's one-row columns


@needs_native
@settings(**{**_SETTINGS, "max_examples": 15})
@given(spec=rg.graph_spec)
def test_compile_program_is_its_python_twin(monkeypatch, spec):
    """compile_program (replay.c) and executor._compile_program_py make equal programs from the
    records of random graphs' evaluations, None for the same ones (gathers, runs, parts); and
    both say None when the records are not the plan's (a batch missing, another node order)."""
    made = []

    def capture(blocks, executed, plan, base, first):
        py = executor._compile_program_py(blocks, executed, plan, base, first)
        c = NATIVE.compile_program(blocks, executed, plan, base, first)
        made.append((py, c))
        if plan:
            assert NATIVE.compile_program(blocks, executed, plan[:-1], base, first) is None
            swapped = [tuple(reversed(plan[0]))] + plan[1:]
            if len(plan[0]) > 1:
                assert NATIVE.compile_program(blocks, executed, swapped, base, first) is None
                assert executor._compile_program_py(blocks, executed, swapped, base, first) is None
        return c
    from dynagraph.schedule_cache import SCHEDULES
    monkeypatch.setattr(executor, "compile_program", capture)
    SCHEDULES.clear()
    try:
        for fuse in (True, False):
            _run(monkeypatch, spec, "agenda", "float64", True, fuse)
    finally:
        SCHEDULES.clear()
    assert made  # every graph that replays its schedule made one, or None
    for py, c in made:
        assert py == c


@needs_native
def test_replay_native_rejects_malformed_programs():
    """replay_native checks the program's form, and that each step reads only blocks made before it."""
    from dynagraph.schedule_cache import SCHEDULES
    pc = dy.ParameterCollection()
    SCHEDULES.clear()
    seen = {}
    real = executor._replay_native
    try:
        for _ in range(3):
            _sentence_steps(pc, (1, 2, 3))
        program = next(v for c in SCHEDULES.entries.values() for e in c for k, v in e[5].plans.items()
                       if k[0] == "program")
        assert program
        dy.renew_cg()
        loss = _cbow_sentence(pc, (1, 2, 3))

        def capture(ctx, prog):
            seen["ctx"] = ctx
            real(ctx, prog)
        executor._replay_native = capture
        loss.value()
    finally:
        executor._replay_native = real
        SCHEDULES.clear()
    ctx = seen["ctx"]
    base, steps = program
    nodes, cols, specs, plans = steps[1]
    for bad in ((base,), (base, list(steps)), ("0", steps), (base, steps[:1] + ((1, 2, 3),)),
                (base, ((nodes, cols, specs[:-8], plans),)), (base, ((nodes, cols, tuple(specs), plans),)),
                (base, ((nodes, cols, specs, plans[:1] + (("x",),) + plans[2:]),))):
        with pytest.raises(TypeError):
            NATIVE.replay_native(ctx, bad)
    with pytest.raises(TypeError):
        NATIVE.replay_native(ctx[:-1], program)
    ahead = np.frombuffer(specs, np.int64).reshape(-1, 4).copy()
    ahead[:] = (executor.SLICE, 5, -1, 1)  # every column reads a block not made yet
    blocks = len(ctx[4])
    with pytest.raises(ValueError, match="not made yet"):
        NATIVE.replay_native(ctx, (blocks, ((nodes, cols, ahead.tobytes(), plans),)))
    assert len(ctx[4]) == blocks


class _SharedParams:
    """rg.Params made once and handed to every later graph."""

    def __init__(self, make, shared: list):
        self.make, self.shared = make, shared

    def __call__(self, pc):
        if not self.shared:
            self.shared.append(self.make(pc))
        return self.shared[0]


def _gathered_graph(pc, H: int = 4, steps: bool = False):
    """Per-sentence tagger outputs: every position's product reads its LSTM state from the
    step's own block (a MANY gather over many blocks; the last state is read twice, a row
    repeated in one gather). The LSTM's gates are lstm_c / lstm_h nodes, its input products
    a batch of affine nodes with a shared bias, the outputs a batch of matmul nodes; the
    esum of ten rows of one block takes the one-add path (autodiff._one_row_add); a lookup,
    an add and a pickneglogsoftmax; concatenations and a transpose, whose arguments' gradients
    are strided views. steps: the LSTM as lstm_step nodes (transduce's whole steps) instead."""
    lstm = dy.VanillaLSTMBuilder(1, 3, H, pc)
    lstm.fused_step = steps
    W = dy.parameter(pc.add_parameters((2, H)))
    E = pc.add_lookup_parameters((7, 3))
    hs = lstm.initial_state().transduce([dy.lookup(E, w) for w in (1, 4, 2, 6, 1, 3, 5, 0, 2, 4)])
    outs = [W * h for h in hs]
    return outs + [W * hs[-1], dy.cmult(hs[1], hs[0]), dy.esum([dy.sum_elems(o) for o in outs]),
                   dy.pickneglogsoftmax(outs[0] + outs[1], 1),
                   dy.cmult(dy.transpose(dy.concatenate_cols([hs[2], hs[3]])),
                            dy.transpose(dy.concatenate_cols([hs[3], hs[2]]))),
                   dy.concatenate([hs[4], hs[5]])]


# what backward_ops.c and grad_rows.c stand in for
_NATIVE_OPS = {"_lstm_c_backward", "_lstm_h_backward", "mm_grads", "ESum.backward", "_one_row_add",
               "Lookup.backward", "embedding_backward", "_pnls_backward", "_binary.<locals>.backward"}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("H", [4, 200])
def test_native_backward_scatters_and_ops_as_the_reference(monkeypatch, dtype, H):
    """A gathered argument's gradient (plan MANY) is added into every source block's rows in C
    (grad_rows.c) and the products' and LSTM gates' backward run in C (backward_ops.c) when
    the backend offers them (native_backward): bit-identical gradients, blocks and counts to
    autodiff's Python and the ops' own backward. H=200 in float64 is past the override's
    LSTM_F64_MAX: the gates take the op's numpy code there, in both runs."""
    from dynagraph.backends import get_backend
    assert get_backend("cpu").native_backward is not None
    runs, called = native_and_python_runs(monkeypatch, lambda pc: _gathered_graph(pc, H), dtype, _NATIVE_OPS)
    assert set(called[1]) == _NATIVE_OPS  # the reference ran each op's Python backward
    for name in ("mm_grads", "ESum.backward", "Lookup.backward", "embedding_backward", "_pnls_backward"):
        assert not called[0][name], name  # ... which the native step did not
    assert called[0]["_binary.<locals>.backward"] < called[1]["_binary.<locals>.backward"]
    # the graph's esum of ten rows is added in C; run_graph's esum of the outputs is not that case
    assert called[0]["_one_row_add"] == called[1]["_one_row_add"] - 1
    assert ("_lstm_c_backward" in called[0]) == (H == 200 and dtype == "float64")
    a, b = runs
    assert any(pl[0] == executor.MANY for r in a.cg.executed if type(r) is executor.ExecutedBatch for pl in r.plans)
    assert a.cg.stats.scatters == b.cg.stats.scatters > 0
    assert a.cg.stats.scatter_bytes == b.cg.stats.scatter_bytes
    assert_same_grads_and_blocks(a, b)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("H", [4, 200])
def test_native_backward_of_lstm_steps_as_the_reference(monkeypatch, dtype, H):
    """lstm_step's backward in C (backward_step.c), its W_h products deferred as the Python
    step defers them (a WeightProduct): bit-identical gradients and blocks to autodiff's Python
    and the cpu backend's lstm_step_backward."""
    runs, called = native_and_python_runs(monkeypatch, lambda pc: _gathered_graph(pc, H, steps=True), dtype,
                                          {"lstm_step_backward"})
    assert called[1]["lstm_step_backward"] > 0 and not called[0]["lstm_step_backward"]
    a, b = runs
    assert "lstm_step" in {op.name for op in a.cg.op}
    assert_same_grads_and_blocks(a, b)


def _birnn_graph(pc, H: int):
    """Two sentences through a two-layer BiRNNBuilder: each layer's steps as two-chain lstm_step
    nodes (both directions at once), their outputs sliced and concatenated, a loss on top."""
    birnn = dy.BiRNNBuilder(2, 3, 2 * H, pc, dy.VanillaLSTMBuilder)
    E = pc.add_lookup_parameters((7, 3))
    W = dy.parameter(pc.add_parameters((2, 2 * H)))
    outs = []
    for sent in ((1, 4, 2, 6, 1), (3, 5, 0)):
        outs += [dy.pickneglogsoftmax(W * h, k % 2) for k, h in enumerate(birnn.transduce([dy.lookup(E, w) for w in sent]))]
    return outs


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("H", [4, 200])
def test_native_backward_of_bidirectional_steps_as_the_reference(monkeypatch, dtype, H):
    """Two chains per lstm_step node (BiRNNBuilder): the compiled forward and backward steps
    against the cpu backend's Python twins, bit for bit, each direction's W_h deferred."""
    runs, called = native_and_python_runs(monkeypatch, lambda pc: _birnn_graph(pc, H), dtype, {"lstm_step_backward"})
    assert called[1]["lstm_step_backward"] > 0 and not called[0]["lstm_step_backward"]
    a, b = runs
    assert any(op.name == "lstm_step" and len(at) == 3 for op, at in zip(a.cg.op, a.cg.attrs))
    assert_same_grads_and_blocks(a, b)


def _squashed_graph(pc, n: int):
    """tanh and logistic of products (per sentence: one node each), and of a batch of
    n-wide rows: past backward_ops.c's NB_UNARY_MAX the cpu adapter's C kernel runs instead."""
    W = dy.parameter(pc.add_parameters((6, 5)))
    V = dy.parameter(pc.add_parameters((n, 5)))
    xs = [dy.inputVector([0.1 * i, -0.2, 0.3, 0.05 * i, -0.4]) for i in range(4)]
    return [dy.tanh(W * x) for x in xs] + [dy.logistic(W * xs[0]), dy.tanh(V * xs[1]), dy.logistic(V * xs[2])]


@needs_native
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n", [7, 17000])
def test_native_tanh_and_logistic_backward_as_the_reference(monkeypatch, dtype, n):
    """tanh's and logistic's backward run in backward_ops.c below the adapter's threshold
    (no Python _tanh_grad / _logistic_grad call) with bit-identical gradients; above it the
    adapter's C kernel runs in both passes."""
    from dynagraph.backends import get_backend
    from dynagraph.backends.cpu import backward as cpu_backward, overrides
    assert overrides.UNARY_BWD_MIN["tanh"] == overrides.UNARY_BWD_MIN["logistic"] == cpu_backward.NB_UNARY_MAX
    assert get_backend("cpu").native_backward is not None
    # fuse=False: batch by batch, not one elementwise run
    runs, called = native_and_python_runs(monkeypatch, lambda pc: _squashed_graph(pc, n), dtype,
                                          {"_tanh_grad", "_logistic_grad"}, fuse=False)
    small = n < cpu_backward.NB_UNARY_MAX
    assert called[1] == {"_tanh_grad": 1 + small, "_logistic_grad": 1 + small}
    assert not called[0]  # natively: backward_ops.c below the threshold, the adapter's kernel above
    a, b = runs
    assert_same_grads_and_blocks(a, b)


def _attention_graph(pc, H: int, T: int):
    """DyNet's attention step, three times over T encoder columns: colwise_add, tanh of a matrix,
    transpose of a row, softmax of a column, the context (a matrix times that column) beside a
    vector (concatenate pads the vector) and reshaped into a vector; the kinds of direct_shaped.c
    and backward_shaped.c, and the padded concatenation and N-d tanh of direct_batch.c and
    backward_ops.c."""
    E = pc.add_lookup_parameters((9, H))
    W1, W2 = dy.parameter(pc.add_parameters((H, H))), dy.parameter(pc.add_parameters((H, H)))
    v = dy.parameter(pc.add_parameters((1, H)))
    enc = dy.concatenate_cols([dy.lookup(E, w % 9) for w in range(T)])
    w1enc, s, outs = W1 * enc, dy.lookup(E, 2), []
    for step in range(3):
        scores = dy.transpose(v * dy.tanh(dy.colwise_add(w1enc, W2 * s)))
        context = enc * dy.softmax(scores)
        x = dy.reshape(dy.concatenate([context, dy.lookup(E, step)]), (2 * H,))
        s = dy.tanh(dy.pick_range(x, 0, H) + dy.pick_range(x, H, 2 * H))
        outs += [x, scores]
    return outs


_SHAPED_BACKWARD = {"Reshape.backward", "Transpose.backward", "Concatenate.backward", "_softmax_backward",
                    "_colwise_add_backward", "_tanh_grad", "small_matmul_grads", "mm_grads"}
_SHAPED_FORWARD = {"Reshape.forward", "Transpose.forward", "_softmax_forward", "ColwiseAdd.forward", "small_matmul"}


@needs_native
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("H,T", [(4, 3), (64, 14), (16, 300)])
def test_native_attention_steps_as_the_reference(monkeypatch, dtype, H, T):
    """An attention step's batches run in C both ways (direct_shaped.c forward, backward_shaped.c
    and backward_ops.c backward: none of the ops' Python backward is called) and leave the values,
    blocks and gradients of the Python batch step and backward, bit for bit. T = 300 sums g's rows
    past numpy's pairwise block of 128 (colwise_add's, softmax's) and puts W1 * enc past the small
    products' bound."""
    from dynagraph.backends.cpu.direct import PRODUCT_MACS_MAX
    fwd = []
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                m.setattr(executor, "_run_batch_native", None)
            runs, called = native_and_python_runs(monkeypatch, lambda pc: _attention_graph(pc, H, T), dtype,
                                                  _SHAPED_BACKWARD | _SHAPED_FORWARD, fuse=False)
        fwd.append(runs[0])
        forward_calls = [sum(c[k] for k in _SHAPED_FORWARD) for c in called]
        assert forward_calls == [0, 0] if native else min(forward_calls) > 0
        # natively only concatenate_cols' backward (along the second axis) is Python's, and W1 * enc's
        # past the small products' bound (numpy's matmul)
        over = H * H * T > PRODUCT_MACS_MAX
        assert {k: v for k, v in called[0].items() if k in _SHAPED_BACKWARD} == \
            {"Concatenate.backward": 1, **({"small_matmul_grads": 1, "mm_grads": 1} if over else {})}
        assert called[1]["_softmax_backward"] == called[1]["_colwise_add_backward"] == 3
        assert called[1]["small_matmul_grads"] == 10  # every product's Python backward asks it first
        assert_same_grads_and_blocks(*runs)
        for x, y in zip(runs[0].values, runs[1].values):
            np.testing.assert_array_equal(x, y)
    for x, y in zip(fwd[0].values, fwd[1].values):  # the compiled forward against the Python batch step
        np.testing.assert_array_equal(x, y)
    assert_same_grads_and_blocks(*fwd)
    names = {op.name for op in fwd[0].cg.op}
    assert {"colwise_add", "transpose", "softmax", "reshape", "concatenate"} <= names


def _matrix_products_graph(pc, r: int, k: int, c: int):
    """Batches of three products of per-node matrices, both operands rows of lookup tables reshaped
    (so both need gradients), and one with a shared parameter matrix on the left."""
    EA, EX = pc.add_lookup_parameters((5, r * k)), pc.add_lookup_parameters((5, k * c))
    W = dy.parameter(pc.add_parameters((r, k)))
    outs = []
    for i in range(3):
        A, X = dy.reshape(dy.lookup(EA, i), (r, k)), dy.reshape(dy.lookup(EX, i + 1), (k, c))
        outs += [dy.tanh(A * X), W * X]
    return outs


@needs_native
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("r,k,c", [(1, 30, 7), (6, 5, 1), (5, 8, 9), (4, 100, 100)])
def test_native_matrix_products_as_the_reference(monkeypatch, dtype, r, k, c):
    """Products of per-node matrices batched three at a time, forward and backward, compiled and
    Python, bit for bit: dg_small_matmul's every loop order ((4, 100, 100): past the kernels' bound,
    numpy's)."""
    from dynagraph.backends.cpu.direct import PRODUCT_MACS_MAX
    fwd = []
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                m.setattr(executor, "_run_batch_native", None)
            runs, called = native_and_python_runs(monkeypatch, lambda pc: _matrix_products_graph(pc, r, k, c), dtype,
                                                  {"small_matmul_grads", "small_matmul"}, fuse=False)
        # natively the Python backward sees W * X (its shared W's gradient sums over the batch: the
        # op's own) and, past PRODUCT_MACS_MAX, A * X; the Python forward takes the kernel for both
        over = 3 * r * k * c > PRODUCT_MACS_MAX
        assert called[0]["small_matmul_grads"] == 1 + over and called[1]["small_matmul_grads"] == 2
        assert called[0]["small_matmul"] == (0 if native else 0 if over else 2)
        assert_same_grads_and_blocks(*runs)
        fwd.append(runs[0])
    for x, y in zip(fwd[0].values, fwd[1].values):
        np.testing.assert_array_equal(x, y)
    assert_same_grads_and_blocks(*fwd)


def _products_graph(pc, r: int, c: int, rows: int):
    """rows products W x (+ b) per batch with W (r, c): matmul and affine, forward and backward
    (x from a lookup table, so its gradient g @ W is needed)."""
    W = dy.parameter(pc.add_parameters((r, c)))
    b = dy.parameter(pc.add_parameters(r))
    E = pc.add_lookup_parameters((rows, c))
    xs = [dy.lookup(E, i) for i in range(rows)]
    return [dy.tanh(W * x) for x in xs] + [dy.logistic(dy.affine_transform([b, W, x])) for x in xs]


@needs_native
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("r,c,rows", [(256, 256, 1), (256, 257, 1), (16, 8, 4), (16, 8, 5), (256, 257, 2), (256, 257, 4)])
def test_small_products_as_the_reference_at_their_bounds(monkeypatch, dtype, r, c, rows):
    """A shared W's products and their input gradients take the small-rows kernels (direct_batch.c,
    backward_ops.c) exactly where the backend's twins do (direct.PRODUCT_ROWS_MAX, PRODUCT_MACS_MAX;
    the C side's MATVEC_ROWS_MAX, NB_PRODUCT_*; two to four rows take the forward kernel at any
    size): bit-identical values and gradients either side of each bound, the compiled steps
    against the Python ones."""
    from dynagraph.backends.cpu import direct
    assert (r * c <= direct.PRODUCT_MACS_MAX) == (c == 256 or r == 16)
    runs = []
    for native in (True, False):
        with monkeypatch.context() as m:
            m.setattr(dynagraph_config, "backend", "cpu")
            if not native:
                m.setattr(executor, "_run_batch_native", None)
                m.setattr(autodiff, "_backward_native", None)
            runs.append(run_graph("agenda", lambda pc: _products_graph(pc, r, c, rows), dtype=dtype))
    _same(*runs)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_outer_product_is_numpys_and_checks_its_operands(dtype):
    """autodiff._outer (a one-row weight gradient g^T x) equals numpy's product bit for bit; the
    C function refuses anything it does not take instead of reading past a buffer."""
    rng = np.random.default_rng(3)
    G, X = rng.standard_normal((1, 7)).astype(dtype), rng.standard_normal((1, 5)).astype(dtype)
    np.testing.assert_array_equal(autodiff._outer(np, G, X), (G.T @ X)[None])
    np.testing.assert_array_equal(autodiff._outer(np, G, X[:, ::-1]), (G.T @ X[:, ::-1])[None])  # numpy's path
    run = NATIVE.outer_product
    with pytest.raises(TypeError):
        run(np.empty((7, 4), dtype), G, X)  # wrong size
    with pytest.raises(TypeError):
        run(np.empty((7, 5), np.float32 if dtype == np.float64 else np.float64), G, X)  # mixed dtypes
    with pytest.raises(TypeError):
        run(G, G, G)  # overlapping


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_arrays_is_numpys_add_and_checks_every_pair_first(dtype):
    """autodiff._add_grads (each parameter's gradient block into its gradient) adds like numpy's
    in-place add, bit for bit; a pair it does not take leaves every array as it was."""
    add = NATIVE.add_arrays
    rng = np.random.default_rng(3)
    dsts = [rng.standard_normal(s).astype(dtype) for s in ((4, 5), (7,), (2, 3, 2))]
    srcs = [rng.standard_normal((1,) + d.shape).astype(dtype) for d in dsts]
    want = [d + s[0] for d, s in zip(dsts, srcs)]
    add(dsts, srcs)
    for d, w in zip(dsts, want):
        np.testing.assert_array_equal(d, w)
    before = [d.copy() for d in dsts]
    for bad_src in (srcs[2].astype(np.float32 if dtype == np.float64 else np.float64),  # another dtype
                    srcs[2][..., :1],                                                   # another length
                    rng.standard_normal((1, 2, 3, 4)).astype(dtype)[..., :2]):  # strided: not contiguous
        with pytest.raises(TypeError):
            add(dsts, srcs[:2] + [bad_src])
    with pytest.raises(TypeError):
        add([dsts[0]], [dsts[0]])  # overlapping
    with pytest.raises(TypeError):
        add(dsts, srcs[:2])
    for d, b in zip(dsts, before):
        np.testing.assert_array_equal(d, b)  # nothing was added by a refused call
