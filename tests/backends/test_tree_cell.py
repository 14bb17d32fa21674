"""The TreeLSTM cell generated from the op table (cuda_codegen.treelstm_*_program), as
the xp evaluation of backends/tree_cell.py, against the C cell of the cpu backend:
dense children, children as rows of a state table (repeats included), the pass plan
dy.cavs uses, and the CUDA source it renders (compiled with nvcc where installed). The
cuda backend runs the same wrapper with the kernel: tests/backends/test_cuda.py."""
from __future__ import annotations

import re

import numpy as np
import pytest

from dynagraph.backends import cuda_codegen as cg
from dynagraph.backends.tree_cell import KidRows, XpCells

from ._util import DTYPES, close, kernels

kernels()
from dynagraph.backends import cpu  # noqa: E402

from .test_cuda_codegen import _nvcc  # noqa: E402

XP = XpCells(np)


def _same(a, b, dt) -> None:
    if np.dtype(dt) == np.float64:
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    else:
        close(a, b, dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("N", [0, 1, 2, 3])
@pytest.mark.parametrize("with_bias,with_dc", [(False, False), (True, True)])
def test_generated_cell_matches_the_c_cell(dt, N, with_bias, with_dc):
    rng = np.random.default_rng(N)
    B, H = 4, 5
    pre = rng.standard_normal((B, (N + 3) * H)).astype(dt)
    kids = rng.standard_normal((N, B, H)).astype(dt)
    bias = rng.standard_normal((N + 3) * H).astype(dt) if with_bias else None
    want = cpu.treelstm_forward(pre, kids, bias=bias)
    got = XP.treelstm_forward(pre, kids, bias=bias)
    for a, b in zip(got, want):
        _same(a, b, dt)
    dh = rng.standard_normal((B, H)).astype(dt)
    dc = rng.standard_normal((B, H)).astype(dt) if with_dc else None
    want_b = cpu.treelstm_backward(want[2], kids, dh, dc)
    got_b = XP.treelstm_backward(want[2], kids, dh, dc)
    _same(got_b[0], want_b[0], dt)
    if N:
        _same(got_b[1], want_b[1], dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_children_from_a_state_table_and_outputs_in_place(dt):
    rng = np.random.default_rng(11)
    N, B, H, R = 2, 4, 5, 12
    table = rng.standard_normal((R, H)).astype(dt)
    rows = rng.integers(0, 4, (N, B))
    rows[0, 1] = rows[0, 0]  # a repeated child
    pre = rng.standard_normal((B, (N + 3) * H)).astype(dt)
    bias = rng.standard_normal((N + 3) * H).astype(dt)
    h0, c0, a0 = cpu.treelstm_forward(pre, table, bias=bias, kid_rows=cpu.KidRows(rows, R))
    mine, act = table.copy(), np.empty_like(a0)
    h, c, _ = XP.treelstm_forward(pre, mine, bias=bias, kid_rows=XP.KidRows(rows, R),
                                  out=(mine[4:4 + B], mine[4 + B:4 + 2 * B], act))
    _same(h, h0, dt)
    _same(c, c0, dt)
    _same(act, a0, dt)
    g_c, g_x = np.ones((R, H), dt), np.ones((R, H), dt)
    dh, dc = rng.standard_normal((B, H)).astype(dt), rng.standard_normal((B, H)).astype(dt)
    d0, _ = cpu.treelstm_backward(a0, table, dh, dc, kid_rows=cpu.KidRows(rows, R), dc_table=g_c)
    d1, got = XP.treelstm_backward(a0, table, dh, dc, kid_rows=XP.KidRows(rows, R), dc_table=g_x)
    assert got is g_x
    _same(d1, d0, dt)
    _same(g_x, g_c, dt)


def test_kid_rows_are_checked_and_windows_keep_the_row_stride():
    with pytest.raises(IndexError):
        KidRows([[0, 9]], 9)
    with pytest.raises(ValueError):
        KidRows([0, 1], 9)
    rows = np.arange(14).reshape(2, 7) % 6
    wins = XP.KidRows.windows(rows, 6, [(0, 3), (3, 7)], axis=1)
    assert [(w.N, w.B, w.ld) for w in wins] == [(2, 3, 7), (2, 4, 7)]
    np.testing.assert_array_equal(wins[1].rows, rows[:, 3:7])
    rows[0, 0] = 5  # the KidRows keep their own checked copy
    assert wins[0].rows[0, 0] == 0
    with pytest.raises(ValueError):
        wins[0].rows[0, 0] = 1  # read-only


@pytest.mark.parametrize("dt", DTYPES)
def test_pass_plan_matches_the_c_plan(dt):
    """TreeCellPlan (dy.cavs's pass): a task's forward into output tables by (table, row,
    column), its backward into dpre's rows and the kids' gradient table, and the x's
    gradients added from the scratch."""
    N, H, M, R, V, D = 2, 3, 3, 8, 6, 4
    G = (N + 3) * H
    rows = np.array([[7, 0, 1], [2, 7, 1]])  # row 7: a zero state ("no child")

    def plan_run(P, KR):
        kids = np.vstack([rng_t.standard_normal((R - 1, H)), np.zeros((1, H))]).astype(dt)
        pre = np.zeros(M * max(G, N * D) + 5, dt)
        act, outs = np.zeros((V, (N + 4) * H), dt), [kids, np.zeros((V, 2 * H), dt)]
        bias = rng_t.standard_normal(G).astype(dt)
        pre[:M * G] = rng_t.standard_normal(M * G)
        P(N, H, pre, bias, kids, act, outs).forward(2, M, KR(rows, R), (1, 2, 0), (1, 2, H))
        dpre, gk, gx = np.zeros((V, G), dt), np.zeros((R, H), dt), np.zeros((R, D), dt)
        bplan = P(N, H, pre, None, kids, act, [], dpre=dpre, gkids=gk, gx=gx)
        out = bplan.backward(2, M, KR(rows, R), rng_t.standard_normal((M, H)).astype(dt),
                             rng_t.standard_normal((M, H)).astype(dt))
        pre[:M * N * D] = rng_t.standard_normal(M * N * D)
        bplan.add_inputs_grad(KR(np.array([[0, 1], [1, 1], [5, 0]]), R))
        return [act, outs[1], np.asarray(out), dpre, gk, gx]

    rng_t = np.random.default_rng(5)
    want = plan_run(cpu.TreeCellPlan, cpu.KidRows)
    rng_t = np.random.default_rng(5)
    got = plan_run(XP.TreeCellPlan, XP.KidRows)
    for a, b in zip(got, want):
        _same(a, b, dt)


def test_cell_programs_use_only_the_op_tables_formulas():
    """Every statement is one formula of FORWARD/BACKWARD applied to registers (or a plain
    register copy), so adding or fixing an op formula reaches the cell too."""
    forms = list(cg.FORWARD.values()) + [f for fs in cg.BACKWARD.values() for f in fs if f]
    pats = [re.compile(re.sub(r"\b(x|u|v|y|g|c)\b", r"\\w+", re.escape(f))) for f in forms]
    pats.append(re.compile(r"\w+"))
    for N in range(4):
        for flag in (False, True):
            for reg, expr in cg.treelstm_forward_program(N, flag) + cg.treelstm_backward_program(N, flag):
                assert any(p.fullmatch(expr) for p in pats), (reg, expr)
    src = cg.treelstm_source(2, True, True, 2, "float32")
    assert "typedef float T;" in src and "dg_tree_fwd" in src and "dg_tree_bwd" in src
    assert src.count("atomicAdd(&dkids") == 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cell_sources_compile(dtype, tmp_path):
    for N in (0, 1, 2, 3):
        for bias, dc, mode in [(False, False, 0), (True, True, 1), (True, False, 2)]:
            _nvcc(cg.treelstm_source(N, bias, dc, mode, dtype), tmp_path)
