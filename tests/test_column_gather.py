"""Gathered argument columns made in C (kernels/cpython/column_gather.c) against executor.gather.

A batch whose argument rows lie in one block out of order (TAKE) or in several blocks (MANY)
is gathered by the compiled batch step itself: the same copy, the same plan and, for MANY,
the backend's own checked row index, so the backward scatters exactly as before. A column of
per-sample matrices that the op reads in place (OpDef.rows_args) still goes to the Python
gather, which leaves it in place.
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import autodiff, executor, recording
from dynagraph.backends import get_backend
from dynagraph.backends.cpu import RowIndex, RowsOperand
from dynagraph.config import config as dynagraph_config
from refcheck import assert_same_grads_and_blocks, native_and_python_runs, run_graph

NATIVE = recording.NATIVE
needs_native = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "run_batch_native"),
                                  reason="dynagraph._bookkeeping is not built")

@pytest.fixture(autouse=True)
def cpu_backend(monkeypatch):
    """The cpu backend, whose direct kernels give the row index maker (whatever ran before)."""
    monkeypatch.setattr(dynagraph_config, "backend", "cpu")
    if getattr(get_backend().direct_kernels, "row_index_maker", None) is None:
        pytest.skip("the cpu backend's compiled kernels are not built")


_ACTIVATIONS = (dy.tanh, dy.logistic, dy.rectify, dy.square, dy.cube, dy.softsign)


def _vectors_in_six_blocks(pc, n: int = 6, H: int = 3) -> list:
    """columns[k][i]: the i-th vector made by activation k; agenda batches each k into one block."""
    W = dy.parameter(pc.add_parameters((H, H)))
    return [[act(W * dy.inputVector([0.1 * (i + 1), -0.2 * k] + [0.3] * (H - 2))) for i in range(n)]
            for k, act in enumerate(_ACTIVATIONS)]


def _concatenations(pc) -> list:
    cols = _vectors_in_six_blocks(pc)
    n = len(cols[0])
    taken = [dy.concatenate([cols[0][i], cols[1][n - 1 - i]]) for i in range(n)]  # TAKE: block 1 reversed
    mixed = [dy.concatenate([cols[i % 6][i], cols[2][i]]) for i in range(n)]       # MANY: six blocks
    return taken + mixed


def _run(monkeypatch, build, dtype: str, native: bool):
    with monkeypatch.context() as m:
        if native:  # every TAKE and MANY column must be made in C: the Python gather refuses
            def refuse(*a, **k):
                raise AssertionError("a gathered column went to the Python gather")
            m.setattr(executor, "_gather_arg", refuse)
        else:
            m.setattr(executor, "_run_batch_native", None)
            m.setattr(autodiff, "_backward_native", None, raising=False)
        return run_graph("agenda", build, dtype=dtype)


def _plans(run, kind: int) -> list:
    return [(r, k) for r in run.cg.executed if type(r) is executor.ExecutedBatch
            for k, p in enumerate(r.plans) if p[0] == kind]


@needs_native
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gathered_columns_are_made_in_c_as_the_reference(monkeypatch, dtype):
    a = _run(monkeypatch, _concatenations, dtype, native=True)
    b = _run(monkeypatch, _concatenations, dtype, native=False)
    for x, y in zip(a.values, b.values):
        np.testing.assert_array_equal(x, y)
    assert a.grads.keys() == b.grads.keys()
    for k in a.grads:
        np.testing.assert_array_equal(a.grads[k], b.grads[k], err_msg=k)
    for kind in (executor.TAKE, executor.MANY):
        made, ref = _plans(a, kind), _plans(b, kind)
        assert made and len(made) == len(ref), kind
        for (ra, k), (rb, _) in zip(made, ref):
            pa, pb = ra.plans[k], rb.plans[k]
            xa, xb = ra.xs[k], rb.xs[k]
            assert type(xa) is np.ndarray and xa.flags.c_contiguous and xa.dtype == xb.dtype
            np.testing.assert_array_equal(xa, xb)
            if kind == executor.TAKE:
                assert pa == pb
            else:  # the backend's checked row index, field by field, and as immutable as row_index's
                ia, ib = pa[1], pb[1]
                assert type(ia) is RowIndex and pa[2] is None
                assert ia.ids == ib.ids and ia.shapes == ib.shapes
                for f in ("local", "rows"):
                    u, v = getattr(ia, f), getattr(ib, f)
                    assert u.dtype == np.int64 and not u.flags.writeable
                    np.testing.assert_array_equal(u, v)
                    with pytest.raises(ValueError):
                        u.flags.writeable = True
                with pytest.raises(AttributeError):
                    ia.rows = ib.rows
    sa, sb = a.cg.stats, b.cg.stats
    assert sa.gathers == sb.gathers > 0 and sa.gather_bytes == sb.gather_bytes


def _matrix_concatenations(pc) -> list:
    """Per-sample matrices from six blocks: a concatenation reads them in place (rows_args)."""
    cols = _vectors_in_six_blocks(pc, H=4)
    mats = [[dy.reshape(v, (2, 2)) for v in col] for col in cols]
    return [dy.concatenate([mats[i % 6][i], mats[(i + 1) % 6][i]]) for i in range(6)]


@needs_native
def test_matrices_read_in_place_still_take_the_python_gather(monkeypatch):
    seen = []
    gather_arg = executor._gather_arg

    def spy(cg, be, ids, k, op, stats):
        x, plan = gather_arg(cg, be, ids, k, op, stats)
        seen.append(type(x))
        return x, plan
    with monkeypatch.context() as m:
        m.setattr(executor, "_gather_arg", spy)
        got = run_graph("agenda", _matrix_concatenations)
    assert RowsOperand in seen
    with monkeypatch.context() as m:
        m.setattr(executor, "_run_batch_native", None)
        m.setattr(autodiff, "_backward_native", None, raising=False)
        ref = run_graph("agenda", _matrix_concatenations)
    for x, y in zip(got.values, ref.values):
        np.testing.assert_array_equal(x, y)
    for k in got.grads:
        np.testing.assert_array_equal(got.grads[k], ref.grads[k], err_msg=k)


@needs_native
def test_a_block_the_c_gather_cannot_read_goes_to_python(monkeypatch):
    """A non-contiguous block (a Python kernel's output left as is) is not read in C; the
    Python gather takes the column and the values stay the reference's."""
    calls = []
    gather_arg = executor._gather_arg

    def spy(cg, be, ids, k, op, stats):
        calls.append(k)
        return gather_arg(cg, be, ids, k, op, stats)
    dy.renew_cg(scheduler="agenda")
    pc = dy.ParameterCollection()
    cols = _vectors_in_six_blocks(pc)
    outs = [dy.concatenate([cols[i % 6][i], cols[2][i]]) for i in range(6)]
    cg = dy.cg()
    cols[-1][-1].value()  # every activation's block made, one per activation
    b = cg.blk[cols[3][0].i]
    assert cg.blk[cols[3][3].i] == b
    cg.blocks[b] = np.asfortranarray(np.repeat(cg.blocks[b], 2, axis=1))[:, ::2]  # same values, strided
    assert not cg.blocks[b].flags.c_contiguous
    monkeypatch.setattr(executor, "_gather_arg", spy)
    outs[-1].value()  # the six concatenations in one evaluation: one batch
    got = [o.npvalue() for o in outs]
    assert calls, "the strided block's column should have gone to the Python gather"
    for i, o in enumerate(got):
        want = np.concatenate([cols[i % 6][i].npvalue(), cols[2][i].npvalue()])
        np.testing.assert_array_equal(o, want)


@needs_native
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_concatenation_backward_runs_in_c_as_the_reference(monkeypatch, dtype):
    """Concatenations of vectors take backward_ops.c's NB_CONCAT (no Python frame of the op's
    backward) and leave the gradients and gradient blocks the op's own backward leaves."""
    runs, called = native_and_python_runs(monkeypatch, _concatenations, dtype, {"Concatenate.backward"})
    calls = [c["Concatenate.backward"] for c in called]
    assert calls[0] == 0 and calls[1] > 0
    assert_same_grads_and_blocks(*runs)
