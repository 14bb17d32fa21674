"""A graph's records are invisible to Python's cycle collector, and nothing leaks for it.

The compiled scheduler and batch runner (kernels/cpython/bookkeeping.h: dg_untrack_list,
dg_untrack_record) untrack what lives as long as a graph and can hold no cycle: the
scheduler's batches, a batch's gathered arguments and plans, its ExecutedBatch. These tests
check that they are untracked, that a record holding an arbitrary object stays tracked, and
that a loop of training steps frees every graph with the collector switched off (refcounting
alone), which is what untracking relies on.
"""
from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import dynagraph as dy
from dynagraph import executor, overlap, recording, schedulers
from refcheck import run_graph, using

sys.path.insert(0, str(Path(__file__).resolve().parent / "schedulers"))
import _random_graph as rg  # noqa: E402

NATIVE = recording.NATIVE
needs_native = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "run_batch_native"),
                                  reason="dynagraph._bookkeeping is not built")
SCHEDULERS = ("agenda", "depth", "typewise")


def _graph(spec, pc):
    dy.renew_cg()
    return rg.record(pc, spec)


def _every_scheduler_on_random_graphs(test):
    """The test(name, spec) under each compiled scheduler, on hypothesis-drawn random graphs."""
    test = given(spec=rg.graph_spec)(test)
    test = settings(deadline=None, derandomize=True, database=None, max_examples=10,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])(test)
    return needs_native(pytest.mark.parametrize("name", SCHEDULERS)(test))


@_every_scheduler_on_random_graphs
def test_scheduled_batches_are_untracked(name, spec):
    pc = dy.ParameterCollection()
    _graph(spec, pc)
    cg = dy.cg()
    pending = [i for i in range(cg.done, len(cg)) if not cg.op[i].leaf]
    batches = schedulers.get(name).schedule(cg, pending)
    assert batches and not any(gc.is_tracked(b) for b in batches if type(b) is list)
    assert sorted(n for b in batches for n in b) == sorted(pending)  # untracked lists still hold their nodes


@_every_scheduler_on_random_graphs
def test_executed_batches_are_untracked(name, spec):
    run = run_graph(name, lambda pc: rg.record(pc, spec))  # forward and backward read them as before
    records = [r for r in run.cg.executed if isinstance(r, executor.ExecutedBatch)]
    for r in records:
        if r.ctx is None:  # a record holding a saved context may hold anything: it stays tracked
            assert not gc.is_tracked(r), r
        assert not gc.is_tracked(r.xs) and not gc.is_tracked(r.plans)


@needs_native
def test_record_holding_a_saved_context_stays_tracked():
    """CPython's rule for tuples: a record is untracked only when nothing inside it is tracked.
    A dy.block call saves its context for backward (any object): that record stays tracked."""
    pc = dy.ParameterCollection()
    W = pc.add_parameters((4, 4))

    @dy.block
    def cell(x, h):
        return dy.tanh(dy.parameter(W) * x + h)

    dy.renew_cg()
    h = dy.inputTensor([0.1, 0.2, 0.3, 0.4])
    outs = [cell(dy.inputTensor([0.5 * k] * 4), h) for k in range(3)]
    dy.esum([dy.sum_elems(o) for o in outs]).value()
    with_ctx = [r for r in dy.cg().executed if isinstance(r, executor.ExecutedBatch) and gc.is_tracked(r.ctx)]
    assert with_ctx, "no batch saved a tracked context: this test checks nothing"
    assert all(gc.is_tracked(r) for r in with_ctx)


def _step(model, trainer, n: int, scheduler: str):
    dy.renew_cg(scheduler=scheduler)
    W, b = dy.parameter(model["W"]), dy.parameter(model["b"])
    h = dy.inputTensor([0.1 * k for k in range(8)])
    for k in range(n):
        h = dy.tanh(W * h + b) + dy.lookup(model["E"], k % 5)
    loss = dy.squared_norm(h)
    loss.value()
    loss.backward()
    trainer.update()
    return dy.cg()


def test_graphs_are_freed_without_the_collector():
    """Every record a step leaves is freed by refcounting: with the collector off, no graph of a
    finished step survives the next renew_cg (an untracked container in a cycle would keep one)."""
    pc = dy.ParameterCollection()
    model = {"W": pc.add_parameters((8, 8)), "b": pc.add_parameters(8), "E": pc.add_lookup_parameters((5, 8))}
    trainer = dy.SimpleSGDTrainer(pc, learning_rate=0.01)
    for sched in SCHEDULERS:
        _step(model, trainer, 3, sched)
        was = gc.isenabled()
        gc.disable()
        try:
            refs = [weakref.ref(_step(model, trainer, 3 + k % 4, sched)) for k in range(20)]
            overlap.wait()
            dy.renew_cg()
            alive = [r for r in refs if r() is not None]
        finally:
            if was:
                gc.enable()
        assert not alive, f"{len(alive)} of 20 graphs outlived their step under {sched}"


@needs_native
def test_expressions_are_not_gc_objects():
    """Every way of making an expression (leaves, lookups, inputs, recorded ops, the compiled
    operators, the Python ones, slices) gives one the collector never sees; its values are those
    of the same program's numpy reference, and freeing expressions leaves the type's refcount as
    it was (a heap type's instances hold their type: one missing decref would free it)."""
    from dynagraph.expression import Expression
    pc = dy.ParameterCollection()
    W = pc.parameters_from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    E = pc.lookup_parameters_from_numpy(np.eye(5, 4, dtype=np.float32))
    before = sys.getrefcount(Expression)
    dy.renew_cg()
    x = dy.inputVector([1.0, 2.0, 3.0, 4.0])
    e = dy.lookup(E, 2)
    w = dy.parameter(W)
    y = dy.tanh(w * (x + e)) - 0.5
    z = (y / 2.0)[1:3] * 3.0 + (-y)[0]
    made = [x, e, w, y, z, E[1], x ** 2.0, 1.0 - y]
    assert all(type(m) is Expression and not gc.is_tracked(m) for m in made)
    assert not Expression.__flags__ & (1 << 14)  # Py_TPFLAGS_HAVE_GC: its instances have no GC header
    ref = np.tanh(np.arange(12).reshape(3, 4) / 10 @ (np.array([1.0, 2, 3, 4]) + np.eye(5, 4)[2])) - 0.5
    np.testing.assert_allclose(z.npvalue(), ref[1:3] / 2 * 3 - ref[0], rtol=1e-5)
    del made, x, e, w, y, z
    for _ in range(1000):
        dy.tanh(dy.inputVector([1.0]))
    dy.renew_cg()
    assert sys.getrefcount(Expression) == before


@needs_native
def test_a_subclass_of_expression_is_a_normal_python_class():
    """Expression is built from a spec, not a class statement; subclassing it still works the
    Python way (a GC type with its own attributes, its methods inherited), and its instances
    free cleanly."""
    from dynagraph.expression import Expression

    class Named(Expression):
        pass

    dy.renew_cg()
    x = dy.inputVector([1.0, -2.0])
    n = Named(x.cg, x.i)
    n.label = "x"
    assert gc.is_tracked(n) and n.label == "x" and n.npvalue().tolist() == [1.0, -2.0]
    before = sys.getrefcount(Named)
    for _ in range(200):
        Named(x.cg, x.i)
    assert sys.getrefcount(Named) == before
    with pytest.raises(TypeError, match="add no fields"):
        NATIVE.plain_expression_type(int)


@needs_native
def test_runs_are_untracked_and_still_backpropagate():
    """An elementwise run's record (runs.ExecutedRun) and its lists are invisible to the
    collector, like an ExecutedBatch; backward reads them as before (the gradient of a
    chain of runs equals the closed form)."""
    from dynagraph import runs
    with using("float64"):
        pc = dy.ParameterCollection()
        p = pc.parameters_from_numpy(np.linspace(-1.0, 1.0, 6))
        dy.renew_cg()
        xs = [dy.parameter(p) * float(k + 1) for k in range(4)]
        ys = [dy.cmult(dy.tanh(x), dy.logistic(x)) + x for x in xs]  # elementwise steps: one run
        loss = dy.sum_elems(dy.esum(ys))
        loss.value()
        records = [r for r in dy.cg().executed if isinstance(r, runs.ExecutedRun)]
        assert records, "no run was made: this test checks nothing"
        for r in records:
            assert not gc.is_tracked(r) and not any(gc.is_tracked(x) for x in r if isinstance(x, list))
        loss.backward()
    v = np.linspace(-1.0, 1.0, 6)
    want = sum(k * ((1 - np.tanh(k * v) ** 2) / (1 + np.exp(-k * v)) + np.tanh(k * v) * np.exp(-k * v)
                    / (1 + np.exp(-k * v)) ** 2 + 1) for k in (1.0, 2.0, 3.0, 4.0))
    np.testing.assert_allclose(p.grad_as_array(), want, rtol=1e-12)


@needs_native
def test_untrack_record_leaves_what_could_hold_a_cycle_tracked():
    from dynagraph import runs
    plain = runs.ExecutedRun(*([[1, 2]] + [None] * 15))
    assert NATIVE.untrack_record(plain) is plain and not gc.is_tracked(plain) and not gc.is_tracked(plain.steps)
    holder = runs.ExecutedRun(*([[[]]] + [None] * 15))  # a list holding a (tracked) list
    NATIVE.untrack_record(holder)
    assert gc.is_tracked(holder) and gc.is_tracked(holder.steps)
    with pytest.raises(TypeError):
        NATIVE.untrack_record([1])
