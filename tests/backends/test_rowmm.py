"""Per-sample products read in place (kernels/rowmm.c, backends/cpu/rowmm.py): the matrices
are rows of several blocks, read through a row table; the backward adds g_j x_j^T into the
gradient rows in place. Checked against numpy formulas written here, with hypothesis for
random shapes and row patterns (repeated rows must add, never overwrite)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ._util import DTYPES, close, kernels

kernels()
from dynagraph.backends.cpu import OuterRows, RowsOperand, row_index, rows_operand  # noqa: E402


def _blocks(rng, sizes, r, c, dt):
    return [rng.standard_normal((s, r, c)).astype(dt) for s in sizes]


def _operand(blocks, blks, rows):
    ix = row_index(lambda i: blocks[i].shape, len(blocks), list(blks), list(rows))
    return rows_operand(blocks, ix), ix


def _dense(blocks, blks, rows):
    return np.stack([blocks[b][r] for b, r in zip(blks, rows)])


@st.composite
def _layouts(draw):
    r, c = draw(st.integers(1, 9)), draw(st.integers(1, 19))
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    pairs = draw(st.lists(st.tuples(st.integers(0, len(sizes) - 1), st.integers(0, 4)), min_size=1, max_size=12))
    blks = [b for b, _ in pairs]
    rows = [k % sizes[b] for b, k in pairs]  # repeats are likely: few rows per block
    shared_x = draw(st.booleans())
    return r, c, sizes, blks, rows, shared_x, draw(st.integers(0, 2**31))


@pytest.mark.parametrize("dt", DTYPES)
@settings(max_examples=60, deadline=None)
@given(layout=_layouts())
def test_matvec_and_grads_match_numpy(dt, layout):
    r, c, sizes, blks, rows, shared_x, seed = layout
    rng = np.random.default_rng(seed)
    blocks = _blocks(rng, sizes, r, c, dt)
    op, ix = _operand(blocks, blks, rows)
    n = len(rows)
    x = rng.standard_normal((1 if shared_x else n, c)).astype(dt)
    g = rng.standard_normal((n, r)).astype(dt)
    A = _dense(blocks, blks, rows)
    xb = np.broadcast_to(x, (n, c))
    assert op.shape == (n, r, c) and op.dtype == np.dtype(dt)
    close(op.dense(), A, dt)
    close(op.matvec(x), np.einsum("jrc,jc->jr", A, xb), dt)
    gA, gX = op.matvec_grads(x, g, (True, True))
    want_gx = np.einsum("jrc,jr->jc", A, g)
    close(gX, want_gx.sum(axis=0, keepdims=True) if shared_x and n > 1 else want_gx, dt)
    assert type(gA) is OuterRows and gA.shape == (n, r, c)
    close(gA.dense(), g[:, :, None] * xb[:, None, :], dt)
    # in place: every (block, row) receives the sum of its products' outer products
    targets = [rng.standard_normal(b.shape).astype(dt) for b in blocks]
    want = [t.copy() for t in targets]
    for j, (b, rr) in enumerate(zip(blks, rows)):
        want[b][rr] += np.outer(g[j], xb[j])
    gA.add_into([targets[b] for b in ix.ids], ix)
    for t, w in zip(targets, want):
        close(t, w, dt)
    assert op.matvec_grads(x, g, (False, False)) == (None, None)


def test_repeated_row_accumulates_float64_exactly():
    blocks = [np.zeros((2, 2, 3)), np.zeros((1, 2, 3))]
    op, ix = _operand(blocks, [0, 1, 0, 0], [1, 0, 1, 1])
    x = np.array([[1.0, 2, 3], [0, 0, 1], [1, 1, 1], [2, 0, 0]])
    g = np.array([[1.0, 0], [1, 1], [0, 2], [1, 1]])
    gA, _ = op.matvec_grads(x, g, (True, False))
    targets = [np.ones((2, 2, 3)), np.ones((1, 2, 3))]
    gA.add_into(targets, ix)
    want = np.ones((2, 3)) + np.outer(g[0], x[0]) + np.outer(g[2], x[2]) + np.outer(g[3], x[3])
    np.testing.assert_array_equal(targets[0][1], want)
    np.testing.assert_array_equal(targets[0][0], np.ones((2, 3)))
    np.testing.assert_array_equal(targets[1][0], np.ones((2, 3)) + np.outer(g[1], x[1]))


def test_cases_the_kernel_does_not_cover_fall_back():
    rng = np.random.default_rng(0)
    blocks = _blocks(rng, [3, 2], 4, 5, np.float64)
    op, _ = _operand(blocks, [0, 1, 0], [2, 1, 0])
    assert op.matvec(rng.standard_normal((3, 5, 2))) is None        # matrices on the right: dense path
    assert op.matvec(rng.standard_normal((3, 4))) is None           # inner dimension differs
    assert op.matvec(rng.standard_normal((3, 5)).astype(np.float32)) is None  # another dtype
    assert op.matvec_grads(rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), (True, True)) is None
    vec_blocks = [rng.standard_normal((3, 4)), rng.standard_normal((2, 4))]
    vop, _ = _operand(vec_blocks, [0, 1], [0, 1])
    assert vop.matvec(rng.standard_normal((2, 1))) is None          # a vector A: not per-sample matrices


def test_capability_refuses_what_it_cannot_read():
    assert rows_operand([np.zeros((2, 2, 2), np.int64)], row_index(lambda i: (2, 2, 2), 1, [0], [1])) is None
    assert rows_operand([np.zeros((2, 2, 2))], ("not", "a", "RowIndex")) is None
    with pytest.raises(TypeError, match="RowIndex"):
        RowsOperand([np.zeros((2, 2, 2))], ("not", "a", "RowIndex"))


def test_operand_keeps_what_its_forward_read():
    """A re-evaluation may drop a block from the graph's list: the batch's backward still
    reads the arrays its forward read, as it would from a gathered copy."""
    blocks = [np.full((2, 2, 2), 2.0), np.full((2, 2, 2), 3.0)]
    op, ix = _operand(blocks, [0, 1], [1, 0])
    blocks[1] = None
    np.testing.assert_array_equal(op.matvec(np.ones((2, 2))), [[4.0, 4.0], [6.0, 6.0]])
    np.testing.assert_array_equal(op.dense()[1], np.full((2, 2), 3.0))
    with pytest.raises(ValueError, match="row index was checked"):
        OuterRows(np.ones((2, 2)), np.ones((2, 2)), (2, 2, 2)).add_into([np.zeros((2, 2, 2)), np.zeros((1, 2, 2))], ix)
    with pytest.raises(ValueError, match="writeable C-contiguous"):
        OuterRows(np.ones((2, 2)), np.ones((2, 2)), (2, 2, 2)).add_into(
            [np.zeros((2, 2, 2), np.float32), np.zeros((2, 2, 2))], ix)
    assert rows_operand([np.zeros((2, 2, 2)), np.zeros((2, 2, 2), np.float32)], ix) is None


@pytest.mark.parametrize("dt", DTYPES)
@settings(max_examples=40, deadline=None)
@given(layout=_layouts(), lo=st.integers(0, 3), hi=st.integers(0, 3))
def test_copy_into_a_slice(dt, layout, lo, hi):
    """A part of a concatenation: each row copied into its slice of a larger output."""
    r, c, sizes, blks, rows, _, seed = layout
    rng = np.random.default_rng(seed)
    blocks = _blocks(rng, sizes, r, c, dt)
    op, _ = _operand(blocks, blks, rows)
    n = len(rows)
    y = rng.standard_normal((n, lo + r + hi, c)).astype(dt)
    want = y.copy()
    want[:, lo:lo + r] = _dense(blocks, blks, rows)
    op.copy_into(y[:, lo:lo + r])
    np.testing.assert_array_equal(y, want)
    z = np.zeros((n, r, c + 2), dt)  # rows not contiguous: the dense copy
    op.copy_into(z[:, :, 1:1 + c])
    np.testing.assert_array_equal(z[:, :, 1:1 + c], _dense(blocks, blks, rows))
    with pytest.raises(ValueError, match="destination"):
        op.copy_into(np.zeros((n + 1, r, c), dt))


@pytest.mark.parametrize("dt", DTYPES)
def test_scatter_reads_strided_rows_in_place(dt):
    """A slice along the first per-row axis (concatenate's gradient g[:, a:b]) is scattered
    without a contiguous copy, and gives what numpy's add.at gives; repeats add up."""
    from dynagraph.backends.cpu import add_rows, scatter_add_rows
    from dynagraph.backends.cpu.ffi import _rows_operand
    g = np.arange(5 * 6 * 3).reshape(5, 6, 3).astype(dt)
    v = g[:, 2:4]
    span, stride = _rows_operand(v, 5, 6, np.dtype(dt))
    assert stride == 18 and np.shares_memory(span, g)
    blks, rows = [0, 1, 0, 0, 1], [1, 2, 1, 3, 0]
    got = [np.zeros((4, 2, 3), dt), np.zeros((3, 2, 3), dt)]
    scatter_add_rows(got, blks, rows, v)
    want = [np.zeros((4, 2, 3), dt), np.zeros((3, 2, 3), dt)]
    for j, (b, r) in enumerate(zip(blks, rows)):
        want[b][r] += v[j]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    T, W = np.zeros((4, 2, 3), dt), np.zeros((4, 2, 3), dt)
    add_rows(T, [1, 1, 0, 2, 3], v)
    np.add.at(W, [1, 1, 0, 2, 3], v)
    np.testing.assert_array_equal(T, W)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n,r,c", [(1, 5, 3), (2, 9, 13), (3, 70, 40), (4, 130, 19), (2, 7, 300), (1, 150, 257),
                                   (4, 66, 520)])
@pytest.mark.parametrize("shared", [True, False])
def test_small_rows_kernels_against_numpy(dt, n, r, c, shared):
    """dg_rows_matvec and dg_rows_matvec_tgrad called directly, on the shapes that pick their
    paths: one W shared by two to four rows (each block of four W rows serving every row),
    W row counts and widths off the 4- and 8-lane steps, widths on either side of
    TGRAD_WALK_MAX (256) and row counts past TGRAD_ROWS (64); against numpy's products."""
    from dynagraph.backends.cpu.direct import _BASES, _fn, _p, _pi, ffi
    rng = np.random.default_rng(n * 7919 + r * 31 + c)
    dtype = np.dtype(dt)
    blocks = [rng.standard_normal((3, r, c)).astype(dt) for _ in range(2)]
    src = np.array([1] * n if shared else [k % 2 for k in range(n)], np.int64)
    rows = np.array([2] * n if shared else [(k * 2) % 3 for k in range(n)], np.int64)
    A = np.stack([blocks[b][i] for b, i in zip(src, rows)])
    x = rng.standard_normal((n, c)).astype(dt)
    g = rng.standard_normal((n, r)).astype(dt)
    bases = ffi.new(_BASES[dtype].replace("[1]", "[2]"), [_p(b) for b in blocks])
    y = np.full((n, r), np.nan, dt)
    _fn("dg_rows_matvec", dtype)(_p(y), bases, _pi(src), _pi(rows), _p(x), c, n, r, c)
    gx = np.full((n, c), np.nan, dt)
    _fn("dg_rows_matvec_tgrad", dtype)(_p(gx), bases, _pi(src), _pi(rows), _p(g), n, r, c)
    scale = dict(rtol=1e-4, atol=1e-4 * np.sqrt(max(r, c))) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(y, np.einsum("jrc,jc->jr", A, x), **scale)
    np.testing.assert_allclose(gx, np.einsum("jrc,jr->jc", A, g), **scale)
    if shared and n > 1:  # the shared path gives each row the bits it gets alone
        for j in range(n):
            yj = np.empty((1, r), dt)
            _fn("dg_rows_matvec", dtype)(_p(yj), bases, _pi(src[j:j + 1]), _pi(rows[j:j + 1]), _p(x[j:j + 1]), c, 1, r, c)
            np.testing.assert_array_equal(yj[0], y[j])
