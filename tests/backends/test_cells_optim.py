"""Fused LSTM/GRU/TreeLSTM cells (against numpy formulas and finite differences) and
the trainer rules (against dynagraph's numpy trainers, bit for bit)."""
from __future__ import annotations

import numpy as np
import pytest
from refcheck import numeric_grad

import dynagraph as dy

from ._util import DTYPES, close, kernels

kernels()
from dynagraph.backends import cpu  # noqa: E402


def sig(v):
    return 0.5 * np.tanh(0.5 * v) + 0.5


def np_lstm(pre, cp, fb):
    H = pre.shape[1] // 4
    i, f, o, g = sig(pre[:, :H]), sig(pre[:, H:2 * H] + fb), sig(pre[:, 2 * H:3 * H]), np.tanh(pre[:, 3 * H:])
    c = i * g if cp is None else f * cp + i * g
    return o * np.tanh(c), c


def np_tree(pre, kids):
    N = len(kids)
    H = pre.shape[1] // (N + 3)
    c = sig(pre[:, :H]) * np.tanh(pre[:, (N + 2) * H:])
    for k, ck in enumerate(kids):
        c = c + sig(pre[:, (k + 1) * H:(k + 2) * H]) * ck
    return sig(pre[:, (N + 1) * H:(N + 2) * H]) * np.tanh(c), c


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,H", [(1, 1), (3, 5), (2, 70)])
@pytest.mark.parametrize("first", [False, True])
def test_lstm_forward(dt, B, H, first):
    rng = np.random.default_rng(0)
    pre = rng.standard_normal((B, 4 * H)).astype(dt)
    cp = None if first else rng.standard_normal((B, H)).astype(dt)
    h, c, act = cpu.lstm_forward(pre, cp, forget_bias=1.0)
    h_ref, c_ref = np_lstm(pre, cp, 1.0)
    close(h, h_ref.astype(dt), dt)
    close(c, c_ref.astype(dt), dt)
    assert act.shape == (B, 5 * H)


@pytest.mark.parametrize("first,with_dc", [(False, True), (False, False), (True, True)])
def test_lstm_backward_finite_differences(first, with_dc):
    rng = np.random.default_rng(1)
    B, H = 2, 3
    pre = rng.standard_normal((B, 4 * H))
    cp = None if first else rng.standard_normal((B, H))
    wh, wc = rng.standard_normal((B, H)), rng.standard_normal((B, H)) if with_dc else np.zeros((B, H))

    def loss():
        h, c = np_lstm(pre, cp, 0.5)
        return float((h * wh).sum() + (c * wc).sum())
    _, _, act = cpu.lstm_forward(pre, cp, 0.5)
    dpre, dcp = cpu.lstm_backward(act, cp, wh, wc if with_dc else None)
    np.testing.assert_allclose(dpre, numeric_grad(loss, pre), rtol=1e-6, atol=1e-8)
    if first:
        assert dcp is None
    else:
        np.testing.assert_allclose(dcp, numeric_grad(loss, cp), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("N", [0, 1, 2, 3])
@pytest.mark.parametrize("B,H", [(1, 1), (4, 9), (0, 3)])
def test_treelstm_forward(dt, N, B, H):
    rng = np.random.default_rng(2)
    pre = rng.standard_normal((B, (N + 3) * H)).astype(dt)
    kids = [rng.standard_normal((B, H)).astype(dt) for _ in range(N)]
    h, c, act = cpu.treelstm_forward(pre, kids)
    h_ref, c_ref = np_tree(pre, kids)
    close(h, h_ref.astype(dt), dt)
    close(c, c_ref.astype(dt), dt)
    if N:  # a stacked (N, B, H) array is the same as a list
        close(cpu.treelstm_forward(pre, np.stack(kids))[0], h, dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("N", [0, 2])
@pytest.mark.parametrize("B", [1, 5, 0])
def test_treelstm_forward_bias_and_outputs_in_place(dt, N, B):
    """The in-kernel bias is the same rounding as adding it first; h and c can be written
    straight into column blocks of a wider buffer, act and dpre into given arrays."""
    rng = np.random.default_rng(7)
    H = 4
    pre = rng.standard_normal((B, (N + 3) * H)).astype(dt)
    bias = rng.standard_normal((N + 3) * H).astype(dt)
    kids = rng.standard_normal((N, B, H)).astype(dt)
    h0, c0, a0 = cpu.treelstm_forward(pre + bias, kids)
    wide = np.full((B, 3 * H), -7, dt)
    act = np.empty((B, (N + 4) * H), dt)
    h, c, a = cpu.treelstm_forward(pre, kids, bias=bias, out=(wide[:, H:2 * H], wide[:, 2 * H:], act))
    assert h.base is wide and a is act
    np.testing.assert_array_equal(wide[:, H:2 * H], h0)
    np.testing.assert_array_equal(wide[:, 2 * H:], c0)
    np.testing.assert_array_equal(act, a0)
    assert (wide[:, :H] == -7).all()  # nothing outside the given columns is touched
    dh = rng.standard_normal((B, H)).astype(dt)
    dpre0, dk0 = cpu.treelstm_backward(a0, kids, dh)
    dpre = np.empty_like(dpre0)
    got, dk = cpu.treelstm_backward(a0, kids, dh, dpre=dpre)
    assert got is dpre
    np.testing.assert_array_equal(dpre, dpre0)
    np.testing.assert_array_equal(dk, dk0)


def test_treelstm_outputs_in_place_are_checked():
    pre, kids = np.zeros((3, 16)), np.zeros((1, 3, 4))  # N = 1, H = 4
    wide = np.zeros((3, 8))
    with pytest.raises(ValueError, match="overlaps"):
        cpu.treelstm_forward(pre, kids, out=(wide[:, :4], wide[:, 2:6], None))
    with pytest.raises(ValueError, match="overlaps"):
        cpu.treelstm_forward(pre, kids, out=(pre[:, :4], None, None))
    with pytest.raises(ValueError, match="unit-stride"):
        cpu.treelstm_forward(pre, kids, out=(np.zeros((3, 8))[:, ::2], None, None))
    with pytest.raises(ValueError, match="unit-stride"):
        cpu.treelstm_forward(pre, kids, out=(np.zeros((3, 4))[::-1], None, None))
    with pytest.raises(ValueError, match="shape"):
        cpu.treelstm_forward(pre, kids, out=(np.zeros((2, 4)), None, None))
    with pytest.raises(ValueError, match="float64"):
        cpu.treelstm_forward(pre, kids, out=(np.zeros((3, 4), np.float32), None, None))
    with pytest.raises(ValueError, match="bias"):
        cpu.treelstm_forward(pre, kids, bias=np.zeros(15))
    _, _, act = cpu.treelstm_forward(pre, kids)
    with pytest.raises(ValueError, match="dpre"):
        cpu.treelstm_backward(act, kids, np.zeros((3, 4)), dpre=np.zeros((3, 15)))
    with pytest.raises(ValueError, match="overlaps"):
        cpu.treelstm_backward(act, kids, np.zeros((3, 4)), dpre=act.reshape(-1)[:48].reshape(3, 16))
    # disjoint=True (dy.cavs, which checks its whole buffers once a pass) skips only the
    # overlap test: shapes, strides and dtypes are still checked
    with pytest.raises(ValueError, match="unit-stride"):
        cpu.treelstm_forward(pre, kids, out=(np.zeros((3, 8))[:, ::2], None, None), disjoint=True)
    with pytest.raises(ValueError, match="dpre"):
        cpu.treelstm_backward(act, kids, np.zeros((3, 4)), dpre=np.zeros((3, 15)), disjoint=True)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("N", [1, 2, 3])
@pytest.mark.parametrize("B", [1, 4, 0])
def test_treelstm_children_read_from_a_state_table(dt, N, B):
    """kid_rows: the children are rows of a state table, read in place; the backward adds
    their cell gradients into those rows of a gradient table (repeated rows too), which
    is the dense kernel plus np.add.at. The outputs may be other rows of the same table."""
    rng = np.random.default_rng(11)
    H, R = 5, 9
    table = rng.standard_normal((R, H)).astype(dt)
    rows = rng.integers(0, 4, (N, B))  # rows 0..3: children; rows 4.. are written
    if B > 1:
        rows[0, 1] = rows[0, 0]  # a repeated child
    kr = cpu.KidRows(rows, R)
    pre = rng.standard_normal((B, (N + 3) * H)).astype(dt)
    bias = rng.standard_normal((N + 3) * H).astype(dt)
    h0, c0, a0 = cpu.treelstm_forward(pre, table[rows], bias=bias)
    act = np.empty_like(a0)
    h, c, _ = cpu.treelstm_forward(pre, table, bias=bias, kid_rows=kr,
                                   out=(table[4:4 + B], table[4 + B:4 + 2 * B] if B < 3 else None, act))
    np.testing.assert_array_equal(h, h0)
    np.testing.assert_array_equal(c, c0)
    np.testing.assert_array_equal(act, a0)
    gtable = rng.standard_normal((R, H)).astype(dt)
    dh, dc = gtable[5:5 + B].copy(), rng.standard_normal((B, H)).astype(dt)
    dpre0, dk0 = cpu.treelstm_backward(a0, table[rows], dh, dc)
    want = gtable.copy()
    np.add.at(want, rows.reshape(-1), dk0.reshape(-1, H))
    dpre, got = cpu.treelstm_backward(a0, table, gtable[5:5 + B], dc, kid_rows=kr, dc_table=gtable)
    assert got is gtable
    np.testing.assert_array_equal(dpre, dpre0)
    close(gtable, want, dt)
    dpre2, none = cpu.treelstm_backward(a0, table, dh, dc, kid_rows=kr)  # no cell gradients wanted
    assert none is None
    np.testing.assert_array_equal(dpre2, dpre0)


@pytest.mark.parametrize("dt", DTYPES)
def test_kid_rows_windows_of_one_checked_array(dt):
    """KidRows.windows: spans of one array checked once; a column window reads its
    children with the array's row stride, as a standalone KidRows of the same rows."""
    rng = np.random.default_rng(13)
    N, H, R, T = 2, 3, 6, 7
    table = rng.standard_normal((R, H)).astype(dt)
    rows = rng.integers(0, R, (N, T))
    wins = cpu.KidRows.windows(rows, R, [(0, 3), (3, 7), (7, 7)], axis=1)
    assert [(w.N, w.B, w.ld) for w in wins] == [(N, 3, T), (N, 4, T), (N, 0, T)]
    for w, (s, e) in zip(wins[:2], [(0, 3), (3, 7)]):
        pre = rng.standard_normal((e - s, (N + 3) * H)).astype(dt)
        want = cpu.treelstm_forward(pre, table, kid_rows=cpu.KidRows(rows[:, s:e], R))
        for a, b in zip(cpu.treelstm_forward(pre, table, kid_rows=w), want):
            np.testing.assert_array_equal(a, b)
        g = np.zeros((R, H), dt)
        g0 = np.zeros((R, H), dt)
        dh = rng.standard_normal((e - s, H)).astype(dt)
        np.testing.assert_array_equal(cpu.treelstm_backward(want[2], table, dh, kid_rows=w, dc_table=g)[0],
                                      cpu.treelstm_backward(want[2], table, dh, kid_rows=cpu.KidRows(rows[:, s:e], R),
                                                            dc_table=g0)[0])
        np.testing.assert_array_equal(g, g0)
    by_row = cpu.KidRows.windows(rows.T, R, [(2, 5)], axis=0)[0]
    assert (by_row.N, by_row.B, by_row.ld) == (3, N, N)
    np.testing.assert_array_equal(by_row.rows, rows.T[2:5])
    with pytest.raises(ValueError, match="span"):
        cpu.KidRows.windows(rows, R, [(5, 8)], axis=1)
    with pytest.raises(IndexError, match="out of range"):
        cpu.KidRows.windows(np.array([[0, R]]), R, [(0, 1)], axis=1)  # a row outside any window still counts


def test_treelstm_kid_rows_are_checked():
    table, pre = np.zeros((4, 3)), np.zeros((2, 15))  # N = 2, H = 3
    with pytest.raises(IndexError, match="out of range"):
        cpu.KidRows([[0, 4], [1, 2]], 4)
    with pytest.raises(IndexError, match="out of range"):
        cpu.KidRows([[0, -1], [1, 2]], 4)
    with pytest.raises(ValueError, match="N, B"):
        cpu.KidRows([0, 1], 4)
    kr = cpu.KidRows(np.array([[0, 1], [1, 3]]), 4)
    assert not kr.rows.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        kr.rows[0, 0] = 100
    with pytest.raises(ValueError, match=">= 4 rows"):
        cpu.treelstm_forward(pre, np.zeros((3, 3)), kid_rows=kr)  # a table shorter than the check
    with pytest.raises(ValueError, match="rows of 3"):
        cpu.treelstm_forward(pre, np.zeros((4, 4)), kid_rows=kr)
    with pytest.raises(ValueError, match="batch rows"):
        cpu.treelstm_forward(np.zeros((3, 15)), table, kid_rows=kr)
    with pytest.raises(ValueError, match="contiguous"):
        cpu.treelstm_forward(pre, np.zeros((4, 6))[:, ::2], kid_rows=kr)
    with pytest.raises(TypeError, match="KidRows"):
        cpu.treelstm_forward(pre, table, kid_rows=np.array([[0, 1], [1, 3]]))
    with pytest.raises(ValueError, match="child's row"):  # c written over a child it reads
        cpu.treelstm_forward(pre, table, kid_rows=kr, out=(None, table[2:4], None))
    cpu.treelstm_forward(pre, table, kid_rows=kr, out=(None, table[2:4], None), disjoint=True)  # caller's word
    _, _, act = cpu.treelstm_forward(pre, table, kid_rows=kr)
    with pytest.raises(ValueError, match="overlaps"):  # the gradients added into the values read
        cpu.treelstm_backward(act, table, np.zeros((2, 3)), kid_rows=kr, dc_table=table)
    gtable = np.zeros((4, 3))
    with pytest.raises(ValueError, match="child's row"):  # dh read from rows the adds change
        cpu.treelstm_backward(act, table, gtable[0:2], kid_rows=kr, dc_table=gtable)
    with pytest.raises(ValueError, match="writeable"):
        ro = np.zeros((4, 3))
        ro.flags.writeable = False
        cpu.treelstm_backward(act, table, np.zeros((2, 3)), kid_rows=kr, dc_table=ro)


def _plan_setup(dt, N=2, H=4, R=12, V=9):
    rng = np.random.default_rng(5)
    G = (N + 3) * H
    return dict(N=N, H=H, G=G, rng=rng, pre=np.zeros(V * G, dt), bias=rng.standard_normal(G).astype(dt),
                hs=np.zeros((R, H), dt), cs=rng.standard_normal((R, H)).astype(dt),
                act=np.zeros((V, (N + 4) * H), dt), lz=np.zeros((V, 3 * H), dt))


@pytest.mark.parametrize("dt", DTYPES)
def test_tree_cell_plan_matches_the_checked_calls(dt):
    """A TreeCellPlan (buffers checked once, per call only row ranges) computes what
    treelstm_forward/backward compute with the same children, task after task."""
    d = _plan_setup(dt)
    N, H, G, rng = d["N"], d["H"], d["G"], d["rng"]
    plan = cpu.TreeCellPlan(N, H, d["pre"], d["bias"], d["cs"], d["act"], [d["hs"], d["cs"], d["lz"]])
    tasks = [(0, 3, 8), (3, 4, 4)]  # (l0, M, first state row written): children are rows below
    want = []
    for l0, M, r0 in tasks:
        kr = cpu.KidRows(rng.integers(0, r0, (N, M)), 12)
        pre = rng.standard_normal((M, G)).astype(dt)
        d["pre"][:M * G] = pre.reshape(-1)
        h0, c0, a0 = cpu.treelstm_forward(pre, d["cs"], bias=d["bias"], kid_rows=kr)
        plan.forward(l0, M, kr, (2, l0, H), (1, r0, 0))  # h into lz's middle columns, c into the state
        np.testing.assert_array_equal(d["lz"][l0:l0 + M, H:2 * H], h0)
        np.testing.assert_array_equal(d["cs"][r0:r0 + M], c0)
        np.testing.assert_array_equal(d["act"][l0:l0 + M], a0)
        want.append((l0, M, kr, a0))
    gcs, dP, ghs = np.zeros_like(d["cs"]), np.zeros((9, G), dt), np.zeros_like(d["hs"])
    bplan = cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"], [], dpre=dP, gkids=gcs, gx=ghs)
    fresh = cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"], [])
    gref = np.zeros_like(gcs)
    for l0, M, kr, a0 in want:
        dh, dc = rng.standard_normal((M, H)).astype(dt), rng.standard_normal((M, H)).astype(dt)
        dpre0, _ = cpu.treelstm_backward(a0, d["cs"], dh, dc, kid_rows=kr, dc_table=gref)
        got = bplan.backward(l0, M, kr, dh, dc)
        assert got.base is dP
        np.testing.assert_array_equal(got, dpre0)
        np.testing.assert_array_equal(fresh.backward(l0, M, kr, dh, dc), dpre0)  # no dpre buffer: a fresh array
        np.testing.assert_array_equal(gcs, gref)
    xr = cpu.KidRows([[3, 3], [0, 5]], 12)  # a repeated row
    vals = rng.standard_normal((4, H)).astype(dt)
    d["pre"][:4 * H] = vals.reshape(-1)
    bplan.add_inputs_grad(xr)
    want_x = np.zeros_like(ghs)
    np.add.at(want_x, [3, 3, 0, 5], vals)
    close(ghs, want_x, dt)


def test_tree_cell_plan_checks():
    d = _plan_setup(np.float64)
    N, H = d["N"], d["H"]
    plan = cpu.TreeCellPlan(N, H, d["pre"], d["bias"], d["cs"], d["act"], [d["hs"], d["cs"]])
    kr = cpu.KidRows(np.zeros((N, 3), np.int64), 12)
    with pytest.raises(ValueError, match="beyond act"):
        plan.forward(7, 3, kr, (0, 0, 0), (1, 4, 0))
    with pytest.raises(ValueError, match="KidRows of 2 x 4"):
        plan.forward(0, 4, kr, (0, 0, 0), (1, 4, 0))
    with pytest.raises(ValueError, match="KidRows"):
        plan.forward(0, 3, cpu.KidRows(np.zeros((N, 3), np.int64), 13), (0, 0, 0), (1, 4, 0))  # a longer table
    with pytest.raises(ValueError, match="output rows"):
        plan.forward(0, 3, kr, (0, 10, 0), (1, 4, 0))
    with pytest.raises(ValueError, match="columns"):
        plan.forward(0, 3, kr, (0, 0, 1), (1, 4, 0))
    with pytest.raises(ValueError, match="h and c overlap"):
        plan.forward(0, 3, kr, (1, 4, 0), (1, 5, 0))
    with pytest.raises(ValueError, match="no gx"):
        plan.add_inputs_grad(kr)
    bp = cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"], [], gx=np.zeros((12, H)))
    with pytest.raises(TypeError, match="KidRows"):
        bp.add_inputs_grad(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="do not fit"):
        bp.add_inputs_grad(cpu.KidRows(np.zeros((50, 2), np.int64), 12))  # more rows than the scratch holds
    with pytest.raises(ValueError, match="dh must have shape"):
        bp.backward(0, 3, kr, np.zeros((2, H)))
    # the buffers, once: overlaps, shapes, dtypes, contiguity
    with pytest.raises(ValueError, match="overlaps"):
        cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"], [d["act"][:, :H].copy(), d["pre"].reshape(-1, H)])
    with pytest.raises(ValueError, match="overlaps"):
        over = d["act"].reshape(-1)[:9 * d["G"]].reshape(9, -1)  # contiguous, inside act
        cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"], [], dpre=over)
    with pytest.raises(ValueError, match="overlaps"):
        cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"], [], gkids=d["cs"])
    with pytest.raises(ValueError, match="act"):
        cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"][:, :5], [])
    with pytest.raises(ValueError, match="contiguous"):
        cpu.TreeCellPlan(N, H, d["pre"], None, d["cs"], d["act"], [np.zeros((4, 8))[:, ::2]])
    with pytest.raises(ValueError, match="float64"):
        cpu.TreeCellPlan(N, H, d["pre"].astype(np.float32), None, d["cs"], d["act"], [])
    with pytest.raises(ValueError, match="bias"):
        cpu.TreeCellPlan(N, H, d["pre"], np.zeros(3), d["cs"], d["act"], [])


def test_cavs_checks_its_buffers_apart_once_a_pass():
    from dynagraph.cavs import _apart
    big = np.zeros((6, 8))
    assert _apart([big[:3], None], [big[3:], np.zeros(4), None])
    assert not _apart([big[:, :4]], [np.zeros(3), big[2:4, 3:5]])


@pytest.mark.parametrize("N", [0, 2, 3])
@pytest.mark.parametrize("with_dc", [True, False])
def test_treelstm_backward_finite_differences(N, with_dc):
    rng = np.random.default_rng(3)
    B, H = 2, 3
    pre = rng.standard_normal((B, (N + 3) * H))
    kids = rng.standard_normal((N, B, H))
    wh, wc = rng.standard_normal((B, H)), rng.standard_normal((B, H)) if with_dc else np.zeros((B, H))

    def loss():
        h, c = np_tree(pre, list(kids))
        return float((h * wh).sum() + (c * wc).sum())
    _, _, act = cpu.treelstm_forward(pre, kids)
    dpre, dkids = cpu.treelstm_backward(act, kids, wh, wc if with_dc else None)
    np.testing.assert_allclose(dpre, numeric_grad(loss, pre), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dkids, numeric_grad(loss, kids), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dt", DTYPES)
def test_gru_stages_forward(dt):
    rng = np.random.default_rng(4)
    B, H = 3, 6
    pre_zr, pre_c = rng.standard_normal((B, 2 * H)).astype(dt), rng.standard_normal((B, H)).astype(dt)
    hp = rng.standard_normal((B, H)).astype(dt)
    zr, rh = cpu.gru_gates_forward(pre_zr, hp)
    z, r = sig(pre_zr[:, :H]), sig(pre_zr[:, H:])
    close(zr, np.concatenate([z, r], 1).astype(dt), dt)
    close(rh, (r * hp).astype(dt), dt)
    h, cand = cpu.gru_output_forward(pre_c, zr, hp)
    close(cand, np.tanh(pre_c), dt)
    close(h, ((1 - zr[:, :H]) * hp + zr[:, :H] * np.tanh(pre_c)).astype(dt), dt)


def test_gru_backward_finite_differences():
    rng = np.random.default_rng(5)
    B, H = 2, 3
    pre_zr, pre_c, hp = rng.standard_normal((B, 2 * H)), rng.standard_normal((B, H)), rng.standard_normal((B, H))
    wz, wr, wh = (rng.standard_normal((B, H)) for _ in range(3))

    def stage1():
        z, r = sig(pre_zr[:, :H]), sig(pre_zr[:, H:])
        return float((z * wz).sum() + (r * hp * wr).sum())
    zr, _ = cpu.gru_gates_forward(pre_zr, hp)
    dh_prev = np.zeros((B, H))
    dpre_zr = cpu.gru_gates_backward(zr, hp, wz, wr, dh_prev)
    np.testing.assert_allclose(dpre_zr, numeric_grad(stage1, pre_zr), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dh_prev, numeric_grad(stage1, hp), rtol=1e-6, atol=1e-8)

    zr = zr.copy()

    def stage2():
        z = zr[:, :H]
        return float((((1 - z) * hp + z * np.tanh(pre_c)) * wh).sum())
    _, cand = cpu.gru_output_forward(pre_c, zr, hp)
    dpre_c, dz, dhp = cpu.gru_output_backward(zr, hp, cand, wh)
    np.testing.assert_allclose(dpre_c, numeric_grad(stage2, pre_c), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dz, numeric_grad(stage2, zr)[:, :H], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dhp, numeric_grad(stage2, hp), rtol=1e-6, atol=1e-8)


def test_cell_shape_validation():
    with pytest.raises(ValueError):
        cpu.lstm_forward(np.zeros((2, 10)))  # not a multiple of 4
    with pytest.raises(ValueError):
        cpu.lstm_forward(np.zeros((2, 8)), np.zeros((2, 3)))
    with pytest.raises(ValueError):
        cpu.treelstm_forward(np.zeros((2, 12)), [np.zeros((2, 4))])  # N = 1 and 4H = 12: H = 3
    with pytest.raises(ValueError):
        cpu.gru_gates_backward(np.zeros((2, 4)), np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)),
                               np.zeros((2, 2))[:, ::2])


# ------------------------------------------------------------------ trainers
def _trainer(cls, **kw):
    return cls(dy.ParameterCollection(), **kw)


def _rule_cases(dt):
    rng = np.random.default_rng(6)
    w = rng.standard_normal((9, 4)).astype(dt)
    g = rng.standard_normal((9, 4)).astype(dt)
    return w, g


RULES = [
    ("sgd", dy.SimpleSGDTrainer, dict(learning_rate=0.1), 0),
    ("momentum", dy.MomentumSGDTrainer, dict(learning_rate=0.05, mom=0.8), 1),
    ("adagrad", dy.AdagradTrainer, dict(learning_rate=0.1, eps=1e-20), 1),
    ("adam", dy.AdamTrainer, dict(alpha=0.01), 2),
]


def _c_update(kind, tr, w, g, states, gscale, rows=None):
    if kind == "sgd":
        cpu.sgd_update(w, g, tr.learning_rate * gscale, rows)
    elif kind == "momentum":
        cpu.momentum_update(w, g, states[0], tr.momentum, tr.learning_rate * gscale, rows)
    elif kind == "adagrad":
        cpu.adagrad_update(w, g, states[0], tr.learning_rate, tr.epsilon, gscale, rows)
    else:
        t = tr.updates + 1
        lr_t = tr.learning_rate * np.sqrt(1 - tr.beta_2 ** t) / (1 - tr.beta_1 ** t)
        cpu.adam_update(w, g, states[0], states[1], tr.beta_1, tr.beta_2, tr.epsilon, lr_t, gscale, rows)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind,cls,kw,n_states", RULES)
@pytest.mark.parametrize("gscale", [1.0, 0.37])
def test_dense_rules_match_numpy_trainers_exactly(dt, kind, cls, kw, n_states, gscale):
    tr = _trainer(cls, **kw)
    w, g = _rule_cases(dt)
    w_ref, s_ref = w.copy(), [np.full_like(w, 0.25) for _ in range(n_states)]
    s = [x.copy() for x in s_ref]
    for _ in range(3):  # a few steps, so states feed back
        tr._rule(w_ref, g, s_ref, gscale)
        _c_update(kind, tr, w, g, s, gscale)
        tr.updates += 1
    np.testing.assert_array_equal(w, w_ref)
    for a, b in zip(s, s_ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind,cls,kw,n_states", RULES)
def test_sparse_rules_touch_only_listed_rows(kind, cls, kw, n_states):
    tr = _trainer(cls, **kw)
    w, g = _rule_cases(np.float32)
    rows = np.array([7, 2, 4])
    w_ref, s_ref = w.copy(), [np.full_like(w, 0.25) for _ in range(n_states)]
    s = [x.copy() for x in s_ref]
    # the numpy trainers' sparse path: gather the rows, apply the rule, scatter back
    sub_w, sub_s = w_ref[rows], [x[rows] for x in s_ref]
    tr._rule(sub_w, g[rows], sub_s, 0.5)
    w_ref[rows] = sub_w
    for x, y in zip(s_ref, sub_s):
        x[rows] = y
    _c_update(kind, tr, w, g, s, 0.5, rows)
    np.testing.assert_array_equal(w, w_ref)
    for a, b in zip(s, s_ref):
        np.testing.assert_array_equal(a, b)


def test_rule_validation():
    w = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError):
        cpu.sgd_update(w[:, :1], np.zeros((4, 1)), 0.1)  # weights not contiguous
    with pytest.raises(ValueError):
        cpu.adagrad_update(w, np.zeros((4, 2)), np.zeros((4, 2)), 0.1, 1e-8, 1.0)  # float64 state
    with pytest.raises(IndexError):
        cpu.sgd_update(w, np.zeros((4, 2)), 0.1, rows=[4])
    with pytest.raises(ValueError):
        cpu.sgd_update(w, np.zeros((4, 2)), 0.1, rows=[1, 1])
    with pytest.raises(ValueError):
        cpu.sgd_update(w, np.zeros((3, 2)), 0.1)


@pytest.mark.parametrize("rows, ok", [([0, 2, 3], True), ([3, 0, 2], True), ([2, 0, 2], False), ([1, 1], False)])
def test_sparse_rule_rows_must_be_distinct(rows, ok):
    """A row listed twice would be updated twice: rejected, whether or not the rows are sorted."""
    w, g = np.ones((4, 3)), np.full((4, 3), 0.5)
    if not ok:
        with pytest.raises(ValueError, match="distinct"):
            cpu.sgd_update(w, g, 0.1, rows=np.array(rows))
        assert (w == 1).all()
        return
    cpu.sgd_update(w, g, 0.1, rows=np.array(rows))
    np.testing.assert_allclose(w[rows], 0.95)
    assert (w[[r for r in range(4) if r not in rows]] == 1).all()
