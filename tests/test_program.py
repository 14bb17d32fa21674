"""Batching inside a block (dynagraph/program/): every plan mode gives the numbers of
per-sample op-level code, on ED-Batch's cells and on hypothesis-generated blocks."""
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dynagraph as dy
from backend_params import BACKENDS, use_backend
from refcheck import assert_same_run, run_graph

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.cells import CELLS  # noqa: E402

MODES = [None, "naive", "planned"]
# (plan, fuse): every way a block can run its steps
CONFIGS = [(None, False), ("naive", False), ("planned", False), ("planned", True)]
H = 3


@pytest.fixture(params=BACKENDS)
def backend(request):
    yield from use_backend(request.param)


def _arg(pc, spec, k: int, s: int):
    """A per-sample argument with a gradient: a word id, or tanh(input + shared parameter)."""
    if spec == "index":
        return (7 * s + 3 * k) % 50
    shape = spec if isinstance(spec, tuple) else (spec,)
    rng = np.random.default_rng(100 * s + k)
    p = pc.add_parameters(shape, init=rng.normal(size=shape))
    return dy.tanh(dy.inputTensor(rng.normal(size=shape)) + p)


def _cell_model(name: str, config, blocked: bool):
    def build(pc):
        fn, specs = CELLS[name](pc, H)
        f = dy.block(fn, plan=config[0], fuse=config[1]) if blocked else fn
        outs = []
        for s in range(4):
            args = [_arg(pc, spec, k, s) for k, spec in enumerate(specs)]
            for _ in range(1 + s % 2):  # chained calls: a block's output feeds the next call
                res = f(*args)
                res = list(res) if isinstance(res, tuple) else [res]
                outs.extend(res)
                if all(spec != "index" for spec in specs) and len(res) == len(specs):
                    args = res
        return outs
    return build


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("scheduler", ["depth", "agenda"])
def test_cells_match_op_level(backend, name, config, scheduler):
    ref = run_graph("none", _cell_model(name, config, False))
    got = run_graph(scheduler, _cell_model(name, config, True))
    assert_same_run(ref, got, rtol=1e-10, atol=1e-12)


def _plan(name: str, mode, fuse: bool = False):
    fn, specs = CELLS[name](dy.ParameterCollection(), H)
    blk = dy.block(fn, plan=mode, fuse=fuse)
    blk(*[3 if a == "index" else dy.zeros(a) for a in specs])
    return next(iter(blk._plans.values()))


def _forward_copies(name: str, mode) -> int:
    """Memory kernels of one forward of a batch of 5 calls."""
    fn, specs = CELLS[name](dy.ParameterCollection(), H)
    blk = dy.block(fn, plan=mode, fuse=False)
    outs = [blk(*[3 if a == "index" else dy.tanh(dy.inputTensor(np.full(a, 0.1 * s)))
                  for a in specs]) for s in range(5)]
    first = outs[0][0] if isinstance(outs[0], tuple) else outs[0]
    first.value()
    return next(iter(blk._plans.values())).program.counts.forward_copies


def test_planned_lstm_batches_gates_in_place():
    plan = _plan("LSTMCell", "planned")
    text = plan.program.describe()
    assert "piece-major" in text and "logistic x3" in text and "in place" in text
    assert len(plan.program.units) < len(plan.steps)
    assert plan.op.inner_kernels == len(plan.program.units)


def test_planned_copies_less_than_naive():
    for name in ["LSTMCell", "TreeLSTM internal", "LSTMCell (4 weights)"]:
        naive, planned = _forward_copies(name, "naive"), _forward_copies(name, "planned")
        assert planned < naive, (name, naive, planned)


def test_fused_lstm_cell_is_two_kernels():
    plan = _plan("LSTMCell", "planned", fuse=True)
    kinds = [u.kind for u in plan.program.units]
    assert len(kinds) == 2 and "fused [logistic logistic logistic tanh" in plan.program.describe()


def test_fusion_keeps_a_valid_order_around_gemms():
    """tanh(W * (x + y)) * (x + y): the product reads the sum, so the sum's region closes
    before the product and the second chain reads both."""
    pc = dy.ParameterCollection()
    W = pc.add_parameters((H, H))
    blk = dy.block(lambda x, y: dy.cmult(dy.tanh(W * (x + y)), x + y), plan="planned", fuse=True)
    out = blk(dy.inputVector([0.1, 0.2, 0.3]), dy.inputVector([1.0, -1.0, 0.5]))
    s = np.array([1.1, -0.8, 0.8])
    np.testing.assert_allclose(out.npvalue(), np.tanh(W.as_array() @ s) * s, rtol=1e-5)


def test_split_weights_become_one_batched_product():
    plan = _plan("LSTMCell (4 weights)", "planned")
    affine = [u for u in plan.program.units if plan.steps[u.steps[0]][1].name == "affine"]
    assert len(affine) == 1 and len(affine[0].steps) == 4
    assert "stacked weights" in plan.program.describe()


def test_mode_none_runs_one_kernel_per_step():
    plan = _plan("LSTMCell", None)
    assert plan.program is None and plan.op.inner_kernels == len(plan.steps)


def test_bad_plan_mode_is_rejected():
    with pytest.raises(dy.DynagraphError, match="plan must be one of"):
        dy.block(lambda x: x, plan="fastest")


def test_config_default_plan():
    old = dy.config.config.block_plan
    try:
        dy.config.set(block_plan="naive")
        assert dy.block(lambda x: dy.tanh(x)).mode == "naive"
        dy.config.set(block_plan=None)
        assert dy.block(lambda x: dy.tanh(x)).mode is None
        with pytest.raises(ValueError):
            dy.config.set(block_plan="best")
    finally:
        dy.config.config.block_plan = old


def test_parameter_passed_straight_into_a_block():
    """A leaf argument arrives with one shared row; the program broadcasts it per call."""
    def build(blocked, mode=None):
        def f(pc):
            P = pc.add_parameters((H,), init=np.arange(1.0, H + 1))
            W = pc.add_parameters((H, H), init=np.eye(H) * 0.5)

            def cell(x, y):
                return dy.cmult(dy.tanh(W * x), dy.logistic(W * y)) + dy.tanh(x)
            g = dy.block(cell, plan=mode) if blocked else cell
            return [g(dy.parameter(P), dy.inputVector([0.1 * s, 0.2, -0.3])) for s in range(3)]
        return f
    ref = run_graph("none", build(False))
    for mode in MODES:
        assert_same_run(ref, run_graph("agenda", build(True, mode)), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ random blocks
N = 4
UNARY = [dy.tanh, dy.logistic, dy.rectify, lambda x: 1 - x]
BINARY = [dy.cmult, lambda a, b: a + b, lambda a, b: a - b]

step_spec = st.tuples(st.integers(0, 4), st.integers(0, 1 << 16), st.integers(0, 1 << 16), st.integers(0, 1 << 16),
                      st.integers(1, 4))
block_spec = st.tuples(st.integers(1, 3), st.lists(step_spec, min_size=1, max_size=10), st.integers(1, 3))


def _random_body(pc, spec):
    """A straight-line block over vectors of size N: unary, binary, products with a pool of
    weights, two-product affines, and a gate GEMM read back as slices. Each step applies
    the same op `width` times to neighbouring values, so that steps can batch together."""
    n_in, steps, n_out = spec
    rng = np.random.default_rng(len(steps))
    Ws = [pc.add_parameters((N, N), init=rng.normal(size=(N, N)) * 0.5) for _ in range(3)]
    bs = [pc.add_parameters(N, init=rng.normal(size=N)) for _ in range(2)]
    G = pc.add_parameters((3 * N, N), init=rng.normal(size=(3 * N, N)) * 0.5)

    def body(*xs):
        vals = list(xs)
        for kind, a, b, c, width in steps:
            have = list(vals)
            for w in range(width):
                x, y = have[(a + w) % len(have)], have[(b + w) % len(have)]
                if kind == 0:
                    vals.append(UNARY[c % len(UNARY)](x))
                elif kind == 1:
                    vals.append(BINARY[c % len(BINARY)](x, y))
                elif kind == 2:
                    vals.append(Ws[(c + w) % 3] * x)
                elif kind == 3:
                    vals.append(dy.affine_transform([bs[(c + w) % 2], Ws[(c + w) % 3], x, Ws[(c + 1) % 3], y]))
                else:
                    g = G * x
                    vals.extend(g[k * N:(k + 1) * N] for k in range(3))
        outs = vals[n_in:] or vals
        return tuple(outs[-n_out:])
    return body, n_in


def _random_model(spec, config, blocked: bool):
    def build(pc):
        body, n_in = _random_body(pc, spec)
        f = dy.block(body, plan=config[0], fuse=config[1]) if blocked else body
        outs = []
        for s in range(3):
            xs = [_arg(pc, N, k, s) for k in range(n_in)]
            outs.extend(f(*xs))
        return outs
    return build


@settings(max_examples=40, deadline=None)
@given(spec=block_spec)
def test_random_blocks_match_op_level(spec):
    ref = run_graph("none", _random_model(spec, (None, False), False))
    for config in CONFIGS:
        got = run_graph("agenda", _random_model(spec, config, True))
        assert_same_run(ref, got, rtol=1e-10, atol=1e-12)


def test_colocated_weights_train_like_separate_ones():
    """Planned mode stores a group's weights as slices of one stacked array; SGD updates
    must reach them and later graphs must read the updated values."""
    def train(blocked: bool) -> list:
        dy.reset_random_seed(3)
        pc = dy.ParameterCollection()
        fn, specs = CELLS["LSTMCell (4 weights)"](pc, H)
        f = dy.block(fn, plan="planned") if blocked else fn
        trainer = dy.SimpleSGDTrainer(pc, 0.5)
        losses = []
        for step in range(3):
            dy.renew_cg()
            h, c = dy.inputVector([0.1, -0.2, 0.3]), dy.zeros(H)
            for t in range(3):
                h, c = f(dy.inputVector([0.2 * t, 0.1, -0.1 * step]), h, c)
            loss = dy.sum_elems(dy.square(h - 0.5))
            losses.append(loss.value())
            loss.backward()
            trainer.update()
        return losses + [float(p.as_array().sum()) for p in pc.parameters_list()]
    with_block, without = train(True), train(False)
    np.testing.assert_allclose(with_block, without, rtol=1e-5)


def test_program_counts_copies_per_call():
    counts = {m: _forward_copies("TreeLSTM internal", m) for m in ("naive", "planned")}
    assert counts["naive"] == 3 and counts["planned"] == 0


def test_graph_that_used_a_weight_before_tracing_sees_its_new_storage():
    """Tracing a planned block moves its per-gate weights into one stacked array; the
    graph that already held a node for one of them must read the moved storage."""
    pc = dy.ParameterCollection()
    fn, specs = CELLS["LSTMCell (4 weights)"](pc, H)
    W = pc.parameters_list()[0]
    cg = dy.renew_cg()
    y = dy.sum_elems(dy.parameter(W) * dy.inputVector([1.0, 2.0, 3.0]))
    h, c = dy.block(fn, plan="planned")(*[dy.inputVector([0.1, 0.2, 0.3])] * 3)
    assert W.values.base is not None  # now a slice of the stacked weights
    h.value()
    W.set_value(np.ones((H, H)))
    cg.invalidate()
    assert y.value() == pytest.approx(18.0)


@pytest.mark.parametrize("config", CONFIGS)
def test_output_computed_from_parameters_alone(config):
    """An output that depends only on parameters has one shared row per batch; its
    gradient from B calls must be summed, also where the block uses it again."""
    def build(blocked):
        def f(pc):
            W = pc.add_parameters((2, H), init=np.arange(6.0).reshape(2, H) / 10)

            def cell(x):
                t = dy.tanh(dy.parameter(W))
                return t, dy.cmult(t, x)
            g = dy.block(cell, plan=config[0], fuse=config[1]) if blocked else cell
            outs = []
            for s in range(3):
                outs.extend(g(dy.inputTensor(np.full((2, H), 0.5 + s))))
            return outs
        return f
    assert_same_run(run_graph("none", build(False)), run_graph("agenda", build(True)), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------- what the planned layout saved
def _copy_stats(build, scheduler: str = "agenda") -> tuple:
    s = run_graph(scheduler, build).cg.stats
    return s.block_copies, s.block_copy_bytes, s.block_copies_saved, s.block_copy_bytes_saved


def _assert_saved_is_naive_minus_planned(build_for) -> None:
    """block_copies_saved of a planned run is what the naive run of the same blocks copied
    less what the planned run copied, forward and backward, copies and bytes."""
    naive = _copy_stats(build_for(("naive", False)))
    assert naive[2:] == (0, 0)  # nothing to compare a naive plan with
    for config in (("planned", False), ("planned", True)):
        planned = _copy_stats(build_for(config))
        assert planned[0] + planned[2] == naive[0] and planned[1] + planned[3] == naive[1], (config, planned, naive)


@pytest.mark.parametrize("name", list(CELLS))
def test_saved_copies_are_naive_minus_planned_on_cells(name):
    _assert_saved_is_naive_minus_planned(lambda config: _cell_model(name, config, True))


@settings(max_examples=25, deadline=None)
@given(spec=block_spec)
def test_saved_copies_are_naive_minus_planned_on_random_blocks(spec):
    _assert_saved_is_naive_minus_planned(lambda config: _random_model(spec, config, True))


def test_saved_copies_show_in_stats_and_print_batches(capsys):
    cg = run_graph("agenda", _cell_model("LSTMCell (4 weights)", ("planned", False), True)).cg
    s = cg.stats
    assert s.block_copies_saved > 0 and s.block_copy_bytes_saved > 0
    assert f"saved={s.block_copies_saved} ({s.block_copy_bytes_saved} B)" in str(s)
    assert s.as_dict()["block_copies_saved"] == s.block_copies_saved
    cg.print_batches()
    assert f"saved by the planned layout (against plan=\"naive\"): {s.block_copies_saved} copies" \
        in capsys.readouterr().out
