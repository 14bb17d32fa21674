"""The layout planner on hand-built blocks: which operand lists become copy-free."""
import os
import sys

import dynagraph as dy
from dynagraph.memory.layout import compare, plan_layout

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.cells import CELLS  # noqa: E402  (the cells of the layout bench)

H = 4


def _plan(fn, *shapes):
    """Trace `fn` as a block on inputs of the given shapes; return (plan, shapes)."""
    dy.renew_cg()
    blk = dy.block(fn)
    blk(*[dy.zeros(s) for s in shapes])
    (key, plan), = blk._plans.items()
    return plan, list(key)


def _lstm_cell(pc):
    W, U, b = pc.add_parameters((4 * H, H)), pc.add_parameters((4 * H, H)), pc.add_parameters(4 * H)

    def cell(x, h, c):
        g = dy.affine_transform([b, W, x, U, h])
        i, f, o = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(3))
        u = dy.tanh(g[3 * H:4 * H])
        c2 = dy.cmult(i, u) + dy.cmult(f, c)
        return dy.cmult(o, dy.tanh(c2)), c2
    return cell


def _gate_lstm_cell(pc):
    """One weight matrix per gate: stacking them is what turns four GEMMs into one."""
    return CELLS["LSTMCell (4 weights)"](pc, H)[0]


def _treelstm_node(pc):
    Ul, Ur, b = pc.add_parameters((5 * H, H)), pc.add_parameters((5 * H, H)), pc.add_parameters(5 * H)

    def node(hl, cl, hr, cr):
        g = dy.affine_transform([b, Ul, hl, Ur, hr])
        i, fl, fr, o = (dy.logistic(g[k * H:(k + 1) * H]) for k in range(4))
        u = dy.tanh(g[4 * H:5 * H])
        c = dy.cmult(i, u) + dy.cmult(fl, cl) + dy.cmult(fr, cr)
        return dy.cmult(o, dy.tanh(c)), c
    return node


def _names(lay, batch_k, p):
    b = lay.batches[batch_k]
    vs = b.results if p < 0 else b.operands[p]
    return [lay.names[v] for v in vs]


def _find(lay, op, size):
    return [k for k, b in enumerate(lay.batches) if b.op == op and len(b.steps) == size]


def test_lstm_gates_read_in_place():
    plan, shapes = _plan(_lstm_cell(dy.ParameterCollection()), H, H, H)
    lay = compare(plan, shapes)
    (k,) = _find(lay, "logistic", 3)
    assert (k, 0) in lay.aligned and (k, -1) in lay.aligned  # slices of g, in gate order
    (m,) = _find(lay, "cmult", 2)
    # [i, f] and [u, c_prev]: c_prev is placed right after the u slice of g.
    assert (m, 0) in lay.aligned and (m, 1) in lay.aligned, lay.describe()
    assert lay.gathers == [] and lay.conflicts == []
    assert lay.kernels == 0 < lay.naive_kernels and lay.bytes == 0 < lay.naive_bytes
    # the slices of g stay in g's own order
    pieces = [v for v in lay.order if "pick_range" in lay.names[v]]
    assert [lay.offsets[v] for v in pieces] == sorted(lay.offsets[v] for v in pieces)


def test_gate_weights_are_stacked():
    plan, shapes = _plan(_gate_lstm_cell(dy.ParameterCollection()), H, H, H)
    lay = compare(plan, shapes)
    (k,) = _find(lay, "affine", 4)
    b = lay.batches[k]
    assert b.operands[2] is None and b.operands[4] is None  # x and h are shared by the gates
    for p in (0, 1, 3):  # biases, W's and U's: each one contiguous stacked block, in gate order
        assert (k, p) in lay.aligned, lay.describe()
        offs = [lay.offsets[v] for v in b.operands[p]]
        size = lay.sizes[b.operands[p][0]]
        kernel = sorted(range(4), key=lambda i: lay.offsets[b.results[i]])
        assert [offs[i] for i in kernel] == [offs[kernel[0]] + n * size for n in range(4)]
    assert lay.kernels < lay.naive_kernels


def test_treelstm_child_products():
    plan, shapes = _plan(_treelstm_node(dy.ParameterCollection()), H, H, H, H)
    lay = compare(plan, shapes)
    (k,) = _find(lay, "cmult", 3)
    assert _names(lay, k, 1)[1:] == ["in1", "in3"]  # [u, c_left, c_right]
    assert (k, 0) in lay.aligned and (k, 1) in lay.aligned, lay.describe()
    assert lay.kernels == 0 and lay.naive_kernels == 3  # gate slices; [i, fl, fr]; [u, cl, cr]
    text = lay.describe()
    assert "memory order" in text and "in1" in text and "GATHER" not in text


def test_conflict_is_recorded_not_raised():
    """[a, b], [c, d] (products) and [b, c] (logistics) chain a-b-c-d; then the tanh
    batch wants [a, c] together, which no order allows: dropped and recorded."""
    def cell(a, b, c, d):
        x = dy.cmult(a, c) + dy.cmult(b, d)
        y = dy.logistic(b) + dy.logistic(c)
        z = dy.tanh(a) + dy.tanh(c)
        return x, y, z
    plan, shapes = _plan(cell, *[H] * 4)
    lay = compare(plan, shapes)
    (k,) = _find(lay, "tanh", 2)
    assert (k, 0) in lay.gathers
    assert any(c.startswith(f"batch #{k} operand 0") for c in lay.conflicts), lay.conflicts
    assert (_find(lay, "cmult", 2)[0], 0) in lay.aligned
    assert lay.kernels < lay.naive_kernels
    assert "GATHER" in lay.describe() and "conflict:" in lay.describe()


def test_naive_gathers_every_operand_list():
    plan, shapes = _plan(_treelstm_node(dy.ParameterCollection()), H, H, H, H)
    naive = plan_layout(plan, shapes, mode="naive")
    lists = sum(1 for b in naive.batches for vs in b.operands if vs is not None)
    assert naive.kernels == lists > 0
    assert naive.bytes == sum(naive.sizes[v] for b in naive.batches for vs in b.operands
                              if vs is not None for v in vs) * 8 * 4


def test_planning_is_deterministic_and_fast():
    plan, shapes = _plan(_treelstm_node(dy.ParameterCollection()), H, H, H, H)
    a, b = plan_layout(plan, shapes), plan_layout(plan, shapes)
    assert a.order == b.order and a.gathers == b.gathers and a.describe().split("planned in")[0] == \
        b.describe().split("planned in")[0]
    assert a.plan_ms < 500  # a generous bound for a shared test machine; the bench reports it
