"""Row movers and embedding kernels against numpy, and their index validation."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynagraph.backends.numpy_backend import NumpyBackend

from ._util import DTYPES, kernels

kernels()
from dynagraph.backends import cpu  # noqa: E402

REF = NumpyBackend(np)


def _blocks(rng, dt, k=4, rows=6, tail=(5,)):
    return [rng.standard_normal((rows,) + tail).astype(dt) for _ in range(k)]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B", [1, 2, 17])
@pytest.mark.parametrize("tail", [(5,), (3, 4)])
def test_gather_rows_matches_numpy(dt, B, tail):
    rng = np.random.default_rng(B)
    blocks = _blocks(rng, dt, tail=tail)
    blks = [int(b) for b in rng.integers(0, 4, B)]
    rows = [int(r) for r in rng.integers(0, 6, B)]
    out = cpu.gather_rows(blocks, blks, rows)
    np.testing.assert_array_equal(out, REF.gather_rows(blocks, blks, rows))
    assert out.dtype == np.dtype(dt) and out.flags.c_contiguous


def test_gather_rows_non_contiguous_sources_are_copied():
    rng = np.random.default_rng(0)
    big = rng.standard_normal((6, 10))
    blocks = [big[:, ::2], np.asfortranarray(rng.standard_normal((6, 5)))]
    blks, rows = [0, 1, 0, 1], [5, 0, 2, 3]
    np.testing.assert_array_equal(cpu.gather_rows(blocks, blks, rows), REF.gather_rows(blocks, blks, rows))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B", [1, 3, 40])
def test_scatter_rows_with_repeats_matches_sequential_sum(dt, B):
    rng = np.random.default_rng(B)
    shape = (4, 3, 2)
    grads = [np.zeros(shape, dt) for _ in range(3)]
    blks = [int(b) for b in rng.integers(0, 3, B)]
    rows = [int(r) for r in rng.integers(0, 4, B)]  # B = 40 repeats (block, row) pairs
    vals = rng.standard_normal((B,) + shape[1:]).astype(dt)
    expect = [np.zeros(shape, np.float64) for _ in range(3)]
    for j, (b, r) in enumerate(zip(blks, rows)):
        expect[b][r] += vals[j]
    cpu.scatter_add_rows(grads.__getitem__, blks, rows, vals)
    for g, e in zip(grads, expect):
        np.testing.assert_allclose(g, e, rtol=1e-5 if dt == np.float32 else 1e-12, atol=1e-6)


def test_scatter_rows_broadcast_values_and_block_list():
    vals = np.broadcast_to(np.arange(3.0), (4, 3))  # stride 0 on the batch axis
    grads = [np.zeros((2, 3)), np.zeros((2, 3))]
    cpu.scatter_add_rows(grads, [0, 1, 1, 1], [1, 0, 0, 1], vals)
    np.testing.assert_array_equal(grads[0], [[0, 0, 0], [0, 1, 2]])
    np.testing.assert_array_equal(grads[1], [[0, 2, 4], [0, 1, 2]])


def test_backend_scatter_rows_matches_numpy_backend():
    rng = np.random.default_rng(1)
    blks, rows = [2, 0, 2, 1, 0], [1, 0, 1, 2, 0]
    vals = rng.standard_normal((5, 4))
    a = [np.zeros((3, 4)) for _ in range(3)]
    b = [np.zeros((3, 4)) for _ in range(3)]
    REF.scatter_rows(a.__getitem__, blks, rows, vals)
    cpu.CpuBackend().scatter_rows(b.__getitem__, blks, rows, vals)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-14)


@pytest.mark.parametrize("dt", DTYPES)
def test_take_and_add_rows(dt):
    rng = np.random.default_rng(2)
    table = rng.standard_normal((7, 3)).astype(dt)
    idx = [6, 0, 6, 2]
    np.testing.assert_array_equal(cpu.take_rows(table, idx), table[idx])
    assert cpu.take_rows(table, []).shape == (0, 3)
    g, ref = np.zeros_like(table), np.zeros_like(table)
    vals = rng.standard_normal((4, 3)).astype(dt)
    cpu.add_rows(g, idx, vals)
    np.add.at(ref, np.array(idx), vals)
    np.testing.assert_allclose(g, ref, rtol=1e-6)
    cpu.add_rows(g, [], np.zeros((0, 3), dt))  # empty batch: a no-op
    np.testing.assert_allclose(g, ref, rtol=1e-6)


def test_backend_add_rows_small_and_large_paths_agree():
    rng = np.random.default_rng(3)
    be = cpu.CpuBackend()
    for rows in ([3, 1], [2, 2, 2], list(rng.integers(0, 100, 200))):
        vals = rng.standard_normal((len(rows), 4))
        a, b = np.zeros((100, 4)), np.zeros((100, 4))
        REF.add_rows(a, [int(r) for r in rows], vals)
        be.add_rows(b, [int(r) for r in rows], vals)
        np.testing.assert_allclose(a, b, rtol=1e-13)


@pytest.mark.parametrize("dt", DTYPES)
def test_embedding_backward_accumulates_and_marks_touched(dt):
    rng = np.random.default_rng(4)
    grad = np.zeros((6, 2, 2), dt)
    touched = np.zeros(6, bool)
    idx = np.array([5, 1, 5, 5])
    vals = rng.standard_normal((4, 2, 2)).astype(dt)
    cpu.embedding_backward(grad, touched, idx, vals)
    ref = np.zeros((6, 2, 2), np.float64)
    np.add.at(ref, idx, vals)
    np.testing.assert_allclose(grad, ref, rtol=1e-6)
    np.testing.assert_array_equal(touched, [False, True, False, False, False, True])


# ------------------------------------------------------------------ validation
def test_out_of_range_indices_raise_before_c():
    blocks = [np.zeros((3, 2)), np.zeros((5, 2))]
    with pytest.raises(IndexError):
        cpu.gather_rows(blocks, [0, 1], [3, 0])  # block 0 has 3 rows
    with pytest.raises(IndexError):
        cpu.gather_rows(blocks, [0, 1], [0, -1])
    with pytest.raises(IndexError):
        cpu.gather_rows(blocks, [0, 2], [0, 0])  # no block 2
    with pytest.raises(IndexError):
        cpu.gather_rows(blocks, [-1, 0], [0, 0])
    with pytest.raises(IndexError):
        cpu.scatter_add_rows(blocks, [1, 0], [4, 3], np.ones((2, 2)))
    with pytest.raises(IndexError):
        cpu.take_rows(np.zeros((4, 2)), [0, 4])
    with pytest.raises(IndexError):
        cpu.add_rows(np.zeros((4, 2)), np.array([-2]), np.ones((1, 2)))
    with pytest.raises(IndexError):
        cpu.embedding_backward(np.zeros((4, 2)), np.zeros(4, bool), [9], np.ones((1, 2)))
    with pytest.raises(IndexError):
        cpu.add_rows(np.zeros((4, 2)), np.array([2**63], dtype=np.uint64), np.ones((1, 2)))


def test_bad_index_types_and_shapes_raise():
    with pytest.raises(TypeError):
        cpu.take_rows(np.zeros((4, 2)), [0.5])
    with pytest.raises(TypeError):
        cpu.take_rows(np.zeros((4, 2)), np.array([[0]]))
    with pytest.raises(ValueError):
        cpu.add_rows(np.zeros((4, 2)), [0, 1], np.ones((3, 2)))  # 3 value rows for 2 indices
    with pytest.raises(ValueError):
        cpu.gather_rows([np.zeros((3, 2)), np.zeros((3, 4))], [0, 1], [0, 0])  # row shapes differ
    with pytest.raises(ValueError):
        cpu.gather_rows([np.zeros((3, 2))], [], [])


def test_in_place_targets_must_be_contiguous_and_typed():
    with pytest.raises(ValueError):
        cpu.add_rows(np.zeros((4, 4))[:, ::2], [0], np.ones((1, 2)))
    with pytest.raises(ValueError):
        cpu.add_rows(np.zeros((4, 2), np.float32).astype(np.float64)[::2], [0], np.ones((1, 2)))
    ro = np.zeros((4, 2))
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        cpu.scatter_add_rows([ro], [0], [0], np.ones((1, 2)))
    with pytest.raises(TypeError):
        cpu.add_rows(np.zeros((4, 2), np.int32), [0], np.ones((1, 2)))


def test_values_aliasing_the_target_are_copied_first():
    g = np.arange(8.0).reshape(4, 2)
    expect = g.copy()
    np.add.at(expect, np.array([1, 0]), g[0:2].copy())
    cpu.add_rows(g, [1, 0], g[0:2])
    np.testing.assert_array_equal(g, expect)


# ------------------------------------------------------------------ row indices
@pytest.mark.parametrize("be", [REF, cpu.CpuBackend()], ids=["numpy", "cpu"])
@pytest.mark.parametrize("B", [1, 7, 300])
def test_row_index_gather_then_scatter_round_trip(be, B):
    """The executor's pattern: one checked index for the forward gather and the backward scatter."""
    rng = np.random.default_rng(B)
    blocks = [rng.standard_normal((n, 3)) for n in (4, 9, 2, 6)]
    blks = tuple(int(b) for b in rng.integers(0, 4, B))
    rows = tuple(int(rng.integers(0, len(blocks[b]))) for b in blks)  # repeats at B = 300
    ix = be.row_index(blocks, blks, rows)
    np.testing.assert_array_equal(be.gather_indexed(blocks, ix), np.stack([blocks[b][r] for b, r in zip(blks, rows)]))
    grads = [np.zeros_like(b) for b in blocks]
    vals = rng.standard_normal((B, 3))
    be.scatter_indexed(grads.__getitem__, ix, vals)
    expect = [np.zeros_like(b) for b in blocks]
    for j, (b, r) in enumerate(zip(blks, rows)):
        expect[b][r] += vals[j]
    for g, e in zip(grads, expect):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_row_index_is_checked_once_and_guards_its_blocks():
    blocks = [np.zeros((3, 2)), np.zeros((5, 2))]
    with pytest.raises(IndexError, match="block 0 of 3 rows"):
        cpu.row_index(lambda i: blocks[i].shape, 2, (1, 0), (4, 3))
    with pytest.raises(IndexError):
        cpu.row_index(lambda i: blocks[i].shape, 2, (0, 2), (0, 0))
    with pytest.raises(TypeError):
        cpu.row_index(lambda i: blocks[i].shape, 2, [0, 1], [0.5, 1])
    with pytest.raises(ValueError):
        cpu.row_index(lambda i: blocks[i].shape, 2, (0, 1), (0,))
    ix = cpu.row_index(lambda i: blocks[i].shape, 2, (1, 0), (4, 2))
    with pytest.raises(ValueError, match="checked for"):  # a smaller block than the index was checked for
        cpu.scatter_indexed([np.zeros((3, 2)), np.zeros((4, 2))], ix, np.ones((2, 2)))
    with pytest.raises(ValueError, match="checked for"):
        cpu.gather_indexed([np.zeros((3, 2)), np.zeros((5, 3))], ix)


def test_strided_index_arrays_are_made_contiguous():
    blocks = [np.arange(12.0).reshape(6, 2), np.arange(12.0, 24.0).reshape(6, 2)]
    b, r = np.array([0, 9, 1, 9, 0, 9]), np.array([5, 99, 0, 99, 2, 99])
    np.testing.assert_array_equal(cpu.gather_rows(blocks, b[::2], r[::2]), [blocks[0][5], blocks[1][0], blocks[0][2]])


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(-1, 4), st.integers(-1, 7)), min_size=1, max_size=70),
       odd_tail=st.booleans())
def test_small_row_index_equals_the_vectorised_one(pairs, odd_tail):
    """row_index's Python path for a few rows (tuples of ints, as the executor passes them)
    builds the same checked index, and rejects the same inputs, as the vectorised path."""
    from dynagraph.backends.cpu import rows as cpu_rows
    shapes = [(6, 5), (3, 5), (7, 5), (1, 4) if odd_tail else (2, 5)]
    blks, rws = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)

    def build(b, r):
        try:
            return cpu_rows.row_index(lambda i: shapes[i], len(shapes), b, r, "gather_rows", ints=True)
        except (IndexError, ValueError) as e:
            return type(e)
    small, vectorised = build(blks, rws), build(list(blks), list(rws))
    if len(pairs) > cpu_rows._SMALL or isinstance(vectorised, type):
        assert small == vectorised
        return
    assert small.ids == vectorised.ids and small.shapes == vectorised.shapes
    np.testing.assert_array_equal(small.local, vectorised.local)
    np.testing.assert_array_equal(small.rows, vectorised.rows)
    assert not small.rows.flags.writeable and not small.local.flags.writeable


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B", [1, 5, 40])
def test_block_table_path_matches_the_per_block_path(monkeypatch, dt, B):
    """gather_indexed / scatter_indexed through one compiled address table (rows._block_table)
    give exactly what the per-block Python path gives, also when the values overlap a target
    (copied first) and when a block is not C-contiguous or read-only (the Python path decides)."""
    from dynagraph.backends.cpu import rows as rows_mod
    if rows_mod._block_table is None:
        pytest.skip("dynagraph._bookkeeping is not built")
    rng = np.random.default_rng(B)
    base = [rng.standard_normal((n, 3)).astype(dt) for n in (4, 9, 2, 6)]
    blks = tuple(int(b) for b in rng.integers(0, 4, B))
    rows = tuple(int(rng.integers(0, len(base[b]))) for b in blks)
    ix = cpu.row_index(lambda i: base[i].shape, 4, blks, rows)

    def both(fn):
        got = []
        for table in (rows_mod._block_table, None):
            monkeypatch.setattr(rows_mod, "_block_table", table)
            got.append(fn())
        return got
    fast, slow = both(lambda: cpu.gather_indexed(base, ix))
    np.testing.assert_array_equal(fast, slow)
    odd = list(base)
    odd[1] = np.asfortranarray(np.repeat(base[1], 2, axis=1))[:, ::2]  # not C-contiguous: copied by _in
    fast, slow = both(lambda: cpu.gather_indexed(odd, ix))
    np.testing.assert_array_equal(fast, slow)

    def scatter(overlap: bool):
        grads = [np.ones_like(b) for b in base]
        vals = grads[blks[0]][:1].reshape(-1)[:3].reshape(1, 3) if overlap and B == 1 else \
            rng.standard_normal((B, 3)).astype(dt)
        cpu.scatter_indexed(grads.__getitem__, ix, vals)
        return grads
    monkeypatch.undo()  # the table again
    assert rows_mod._block_table is not None
    for overlap in (False, True):
        state = rng.bit_generator.state
        fast = scatter(overlap)
        rng.bit_generator.state = state
        monkeypatch.setattr(rows_mod, "_block_table", None)
        slow = scatter(overlap)
        monkeypatch.undo()
        for a, b in zip(fast, slow):
            np.testing.assert_array_equal(a, b)
    frozen = [np.zeros_like(b) for b in base]
    frozen[blks[0]].flags.writeable = False
    with pytest.raises(ValueError):  # a read-only target: the Python path's error
        cpu.scatter_indexed(frozen.__getitem__, ix, np.ones((B, 3), dt))


@pytest.mark.parametrize("B", [1, 3, 64, 65])
def test_row_index_small_matches_the_python_index(monkeypatch, B):
    """cpu row_index for the executor's (block, row) tuples: the compiled small index
    (rows._row_index_c) is the Python one's ids, local positions, rows and shapes; anything
    out of range or odd (bools, a row shape that differs) goes to the Python checks and errors."""
    from dynagraph.backends.cpu import rows as rows_mod
    if rows_mod._row_index_c is None:
        pytest.skip("dynagraph._bookkeeping is not built")
    rng = np.random.default_rng(B)
    blocks = [rng.standard_normal((n, 3)) for n in (4, 9, 2, 6, 1)]
    blks = tuple(int(b) for b in rng.integers(0, 5, B))
    rows = tuple(int(rng.integers(0, len(blocks[b]))) for b in blks)
    be = cpu.CpuBackend()
    fast = be.row_index(blocks, blks, rows)
    monkeypatch.setattr(rows_mod, "_row_index_c", None)
    slow = be.row_index(blocks, blks, rows)
    monkeypatch.undo()
    assert fast.ids == slow.ids and fast.shapes == slow.shapes
    np.testing.assert_array_equal(fast.local, slow.local)
    np.testing.assert_array_equal(fast.rows, slow.rows)
    assert not fast.rows.flags.writeable and not fast.local.flags.writeable
    with pytest.raises(ValueError):
        fast.rows.flags.writeable = True  # immutable memory: the kernels trust these rows
    np.testing.assert_array_equal(be.gather_indexed(blocks, fast), np.stack([blocks[b][r] for b, r in zip(blks, rows)]))
    for bad_b, bad_r, err in (((0, 7), (0, 0), IndexError), ((0, 1), (0, 9), IndexError), ((0, -1), (0, 0), IndexError),
                              ((0, 1), (0, -2), IndexError), ((True, 1), (0, 0), None)):
        if err is None:
            be.row_index(blocks, bad_b, bad_r)  # a bool id: the Python path takes it
            continue
        with pytest.raises(err):
            be.row_index(blocks, bad_b, bad_r)
    odd = blocks + [np.zeros((3, 4))]
    with pytest.raises(ValueError, match="rows of shape"):
        be.row_index(odd, (0, 5), (0, 0))
    assert rows_mod._row_index_c(blocks, (), ()) is None
    with pytest.raises(TypeError):
        rows_mod._row_index_c(tuple(blocks), (0,), (0,))
