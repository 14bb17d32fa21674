"""Automatic coarsening joins the scheduler-invariance suite: with `coarsen=True` every node's
value, every node gradient and every parameter gradient equal op-by-op execution
(scheduler "none") at 1e-10 in float64, on hypothesis-generated graphs whose repeated
patterns differ in one signature detail (shape, op attribute, parameter identity, wiring),
and on the random graphs of the scheduler suite. Instances that differ in any such detail
never share a coarsened group (checked independently of the detector's key)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from refcheck import run_graph

import dynagraph as dy
from dynagraph.coarsen import CoarseRecord, find_patterns
from dynagraph.backends import to_numpy
from dynagraph.config import config

from . import _random_graph as rg
from ._util import TOL

_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
DETAILS = ("none", "shape", "attr", "param", "wiring", "data")


@pytest.fixture(autouse=True)
def coarsen_off_afterwards():
    saved = config.coarsen
    yield
    config.coarsen = saved


def _run(scheduler, build_fn, coarsen: bool):
    config.coarsen = coarsen
    try:
        run = run_graph(scheduler, build_fn)
    finally:
        config.coarsen = False
    cg = run.cg
    values = [to_numpy(cg.value(i)).reshape(cg.shape[i]) for i in range(len(cg))]
    grads = {i: to_numpy(cg.gradient(i)) for i in range(len(cg)) if cg.needs_grad[i]}
    return run, values, grads


def assert_matches_none(build_fn, scheduler="agenda") -> object:
    """Coarsened run vs op-by-op ("none"): every node value and gradient, every parameter gradient."""
    ref, rv, rg_ = _run("none", build_fn, False)
    got, gv, gg = _run(scheduler, build_fn, True)
    ca = ref.cg
    assert [o.name for o in ca.op] == [o.name for o in got.cg.op]
    for i, (x, y) in enumerate(zip(rv, gv)):
        np.testing.assert_allclose(y, x, rtol=TOL, atol=TOL, err_msg=f"value of node {i} ({ca.op[i].name})")
    assert rg_.keys() == gg.keys()
    for i, g in rg_.items():
        np.testing.assert_allclose(gg[i], g, rtol=TOL, atol=TOL, err_msg=f"gradient of node {i} ({ca.op[i].name})")
    assert ref.grads.keys() == got.grads.keys()
    for k, g in ref.grads.items():
        np.testing.assert_allclose(got.grads[k], g, rtol=TOL, atol=TOL, err_msg=f"gradient of parameter {k}")
    _check_groups_are_uniform(got.cg)
    return got.cg


def _check_groups_are_uniform(cg) -> None:
    """Every coarsened group's instances agree on each member's op, attributes, shape, the
    parameters it reads and where each argument comes from (independent of the detector)."""
    for rec in cg.executed:
        if not isinstance(rec, CoarseRecord):
            continue
        B = len(rec.groups[0])
        where = [{} for _ in range(B)]  # node -> position, per instance
        for m, nodes in enumerate(rec.groups):
            for b, n in enumerate(nodes):
                where[b][n] = m
        for m, nodes in enumerate(rec.groups):
            descr = set()
            for b, n in enumerate(nodes):
                refs = []
                for a in cg.args[n]:
                    if a in where[b]:
                        refs.append(("member", where[b][a]))
                    elif cg.op[a].leaf:
                        refs.append(("param", id(cg.attrs[a][1]), cg.sig_part[a]))
                    else:
                        refs.append(("outside", cg.shape[a]))
                descr.add((cg.op[n].name, repr(cg.attrs[n]), cg.shape[n], tuple(refs)))
            assert len(descr) == 1, f"group {rec.plan.name} position {m} mixes {descr}"


# ------------------------------------------------------------------ cells differing in one detail
def _cells(detail: str, odd: int, n_seq: int, length: int, H: int = 3):
    """Sequences of a recurrent cell; instance `odd` of each sequence differs in `detail`."""
    def build(pc):
        u = dy.UniformInitializer(0.5)
        E = pc.add_lookup_parameters((7, H), init=u)
        W, W2 = pc.add_parameters((2 * H, H), init=u), pc.add_parameters((2 * H, H), init=u)
        U = pc.add_parameters((2 * H, H), init=u)
        b = pc.add_parameters(2 * H, init=u)
        E4 = pc.add_lookup_parameters((7, H + 1), init=u)
        W4 = pc.add_parameters((2 * H, H + 1), init=u)
        outs = []
        for s in range(n_seq):
            h = dy.inputVector([0.1 * (s + 1)] * H)
            for t in range(length):
                special = t == odd
                w = (3 * s + t) % 7
                if special and detail == "shape":
                    x, Wx = E4[w], W4
                else:
                    x, Wx = E[w if not (special and detail == "data") else (w + 3) % 7], W
                if special and detail == "param":
                    Wx = W2
                a = dy.affine_transform([b, Wx, x, U, h])
                gate = dy.logistic(dy.pick_range(a, 0, H))
                cand = dy.tanh(dy.pick_range(a, H, 2 * H))
                cand = cand * (3.0 if special and detail == "attr" else 2.0)
                mixed = dy.cmult(gate, gate) if special and detail == "wiring" else dy.cmult(gate, cand)
                h = mixed + dy.cmult(1.0 - gate, h)
                outs.append(h)
        return outs
    return build


@pytest.mark.parametrize("detail", DETAILS)
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_cells_differing_in_one_detail(detail, scheduler):
    cg = assert_matches_none(_cells(detail, 2, 3, 5), scheduler)
    assert cg.stats.coarse_groups > 0


@settings(max_examples=25, **_SETTINGS)
@given(detail=st.sampled_from(DETAILS), odd=st.integers(0, 4), n_seq=st.integers(1, 3),
       length=st.integers(2, 5), H=st.integers(1, 3))
def test_hypothesis_cells(detail, odd, n_seq, length, H):
    assert_matches_none(_cells(detail, odd, n_seq, length, H))


@settings(max_examples=30, **_SETTINGS)
@given(spec=rg.graph_spec)
@example(spec=rg.every_branch_spec())
def test_random_graphs(spec):
    assert_matches_none(lambda pc: rg.record(pc, spec))


# ------------------------------------------------------------------ trees
def _treelstm(H: int = 3, n_trees: int = 4):
    def build(pc):
        u = dy.UniformInitializer(0.5)
        E = pc.add_lookup_parameters((9, H), init=u)
        W, b = pc.add_parameters((3 * H, H), init=u), pc.add_parameters(3 * H, init=u)
        U, c5 = pc.add_parameters((5 * H, 2 * H), init=u), pc.add_parameters(5 * H, init=u)
        rng = np.random.default_rng(3)

        def leaf(w):
            g = dy.affine_transform([b, W, E[w]])
            gates = dy.logistic(dy.pick_range(g, 0, 2 * H))
            c = dy.cmult(dy.pick_range(gates, 0, H), dy.tanh(dy.pick_range(g, 2 * H, 3 * H)))
            return dy.cmult(dy.pick_range(gates, H, 2 * H), dy.tanh(c)), c

        def node(left, right):
            (hl, cl), (hr, cr) = left, right
            g = dy.affine_transform([c5, U, dy.concatenate([hl, hr])])
            gates = dy.logistic(dy.pick_range(g, 0, 4 * H))
            i, fl = dy.pick_range(gates, 0, H), dy.pick_range(gates, H, 2 * H)
            fr, o = dy.pick_range(gates, 2 * H, 3 * H), dy.pick_range(gates, 3 * H, 4 * H)
            c = dy.esum([dy.cmult(i, dy.tanh(dy.pick_range(g, 4 * H, 5 * H))), dy.cmult(fl, cl), dy.cmult(fr, cr)])
            return dy.cmult(o, dy.tanh(c)), c

        def tree(d):
            return leaf(int(rng.integers(9))) if d == 0 or rng.random() < 0.2 else node(tree(d - 1), tree(d - 1))
        return [tree(3)[0] for _ in range(n_trees)]
    return build


@pytest.mark.parametrize("scheduler", ["agenda", "depth", "typewise"])
def test_treelstm(scheduler):
    cg = assert_matches_none(_treelstm(), scheduler)
    assert cg.stats.coarse_groups > 0 and cg.stats.coarse_nodes > len(cg) // 2


def test_python_twin_path(monkeypatch):
    """Without the compiled pass (detect.find_patterns + Coarsened.schedule_py) the same groups run."""
    from dynagraph.coarsen import detect
    monkeypatch.setattr(detect, "_NATIVE", None)
    cg = assert_matches_none(_treelstm())
    assert cg.stats.coarse_groups > 0 and cg.stats.coarse_nodes > len(cg) // 2
    cg = assert_matches_none(_cells("data", 1, 3, 4))
    assert cg.stats.coarse_groups > 0


def test_detection_keeps_different_details_apart():
    """The detector's own view: the odd instances never share a pattern with the others."""
    for detail in DETAILS[1:-1]:
        config.coarsen = False
        with dy.renew_cg(scheduler="agenda"):
            pass
        cg = dy.renew_cg(scheduler="agenda")
        outs = _cells(detail, 1, 3, 4)(dy.ParameterCollection())
        pending = [i for i in range(outs[-1].i + 1) if not cg.op[i].leaf]
        patterns, _ = find_patterns(cg, pending)
        odd_roots = {outs[s * 4 + 1].i for s in range(3)}
        for p in patterns:
            kinds = {r in odd_roots for r in p.roots}
            assert len(kinds) == 1, f"{detail}: odd and regular instances share a pattern"


def test_switch_and_reporting(capsys):
    cg = assert_matches_none(_cells("none", 0, 3, 4))
    assert cg.stats.coarse_groups > 0
    cg.print_batches()
    out = capsys.readouterr().out
    assert "coarse[" in out
    assert "coarse_groups" in cg.stats.as_dict()
    run, _, _ = _run("agenda", _cells("none", 0, 3, 4), False)
    assert run.cg.stats.coarse_groups == 0
    assert not any(isinstance(r, CoarseRecord) for r in run.cg.executed)


def test_value_of_an_inner_node_after_evaluation():
    """Every member keeps its own value block: an inner node read after the evaluation, and a
    node recorded afterwards from it, have their op-level values."""
    H = 2
    seen = []
    for co in (False, True):
        config.coarsen = co
        dy.renew_cg(scheduler="agenda")
        pc = dy.ParameterCollection()
        W = pc.add_parameters((H, H), init=dy.ConstInitializer(0.3))
        inner, h = [], dy.inputVector([0.5, -0.25])
        for _ in range(6):
            z = W * h
            inner.append(z)
            h = dy.tanh(z) + h
        dy.sum_elems(h).value()
        coarse = dy.cg().stats.coarse_groups
        later = dy.sum_elems(inner[2] * 2.0).value()  # recorded after the evaluation
        seen.append(([x.npvalue().copy() for x in inner], later, coarse))
    config.coarsen = False
    (v0, l0, c0), (v1, l1, c1) = seen
    assert c0 == 0 and c1 > 0
    np.testing.assert_allclose(v1, v0, rtol=TOL, atol=TOL)
    assert l1 == pytest.approx(l0, rel=TOL)


def _recorded(spec, detail):
    """(graph, its non-leaf nodes) for a random graph, cells differing in `detail` and a
    TreeLSTM, each recorded afresh; graphs with fewer than two such nodes are skipped."""
    for build in (lambda pc: rg.record(pc, spec), _cells(detail, 1, 2, 4), _treelstm(2, 2)):
        cg = dy.renew_cg(scheduler="agenda")
        with dy.cg():
            build(dy.ParameterCollection())
        pending = [i for i in range(len(cg)) if not cg.op[i].leaf]
        if len(pending) >= 2:
            yield cg, pending


@settings(max_examples=20, **_SETTINGS)
@given(spec=rg.graph_spec, detail=st.sampled_from(DETAILS))
def test_compiled_pass_equals_its_python_twin(spec, detail):
    """dynagraph._coarsen.find and detect.instances_py cut every graph the same way."""
    from dynagraph.coarsen import detect
    if detect._NATIVE is None:
        pytest.skip("dynagraph._coarsen not built")
    for cg, pending in _recorded(spec, detail):
        native = detect._NATIVE.find(cg.args, cg.sig, cg.op, cg.data, pending, detect.MAX_NODES,
                                     detect.MAX_ARGS, len(cg.signatures))
        assert tuple(native) == tuple(detect.instances_py(cg, pending))


@settings(max_examples=20, **_SETTINGS)
@given(spec=rg.graph_spec, detail=st.sampled_from(DETAILS))
def test_compiled_plan_equals_its_python_twins(spec, detail):
    """dynagraph._coarsen.plan gives find_patterns' patterns and the unit schedule of
    Coarsened.schedule_py with each group's node ids, in the same order."""
    from dynagraph.coarsen import Coarsened, detect
    if detect._NATIVE is None:
        pytest.skip("dynagraph._coarsen not built")
    for cg, pending in _recorded(spec, detail):
        patterns, batches = detect.plan_native(cg, pending)
        twin, owner = find_patterns(cg, pending)
        assert patterns == detect.heads(twin)
        if twin:
            assert batches == Coarsened(cg, pending, twin, owner).schedule()


def test_compiled_pass_rejects_bad_ids():
    from dynagraph.coarsen import detect
    if detect._NATIVE is None:
        pytest.skip("dynagraph._coarsen not built")
    ops = [dy.ops.OPS["tanh"]] * 3
    with pytest.raises(IndexError):
        detect._NATIVE.find([(), (0,), (7,)], [0, 0, 0], ops, [None] * 3, [1, 2], 48, 8, 1)
    with pytest.raises(IndexError):
        detect._NATIVE.find([(), (0,), (1,)], [0, 0, 0], ops, [None] * 3, [1, 5], 48, 8, 1)
    with pytest.raises(IndexError):
        detect._NATIVE.plan([(), (0,), (7,)], [0, 0, 0], ops, [None] * 3, [1, 2], 48, 8, 1, 2, 2)


def test_check_validity_names_the_op_inside_a_group():
    config.coarsen = True
    try:
        dy.renew_cg(scheduler="agenda", check_validity=True)
        h = dy.inputVector([1.0, 2.0])
        outs = []
        for k in range(4):
            x = dy.inputVector([float(k), -1.0])
            outs.append(dy.log(dy.cmult(x, h) + 0.0))   # log of a negative entry: nan
        with np.errstate(all="ignore"), pytest.raises(dy.NonFiniteError, match="log.*coarsened group"):
            dy.forward(outs)
    finally:
        config.coarsen = False


def test_viz_and_executed_batches_of_a_coarsened_graph(tmp_path):
    cg = assert_matches_none(_cells("none", 0, 2, 3))
    batches = cg.executed_batches()
    assert sorted(n for b in batches for n in b) == [i for i in range(len(cg)) if not cg.op[i].leaf]


def _naive_and_planned_copies(build) -> dict:
    """block_plan -> (copies, bytes, saved copies, saved bytes) of a coarsened run that
    equals op-by-op execution."""
    saved_plan = config.block_plan
    counts = {}
    try:
        for mode in ("naive", "planned"):
            config.block_plan = mode
            s = assert_matches_none(build).stats
            counts[mode] = (s.block_copies, s.block_copy_bytes, s.block_copies_saved, s.block_copy_bytes_saved)
    finally:
        config.block_plan = saved_plan
    naive, planned = counts["naive"], counts["planned"]
    assert naive[2:] == (0, 0)
    assert planned[0] + planned[2] == naive[0] and planned[1] + planned[3] == naive[1], counts
    return counts


@pytest.mark.parametrize("build", [_treelstm(), _cells("none", 0, 3, 4)], ids=["treelstm", "cells"])
def test_stats_show_what_the_planner_saved_in_groups(build, capsys):
    """Coarsened groups count the copies made inside their plans, and what the planned layout
    saved: the naive plan's copies less the planned one's, forward and backward."""
    counts = _naive_and_planned_copies(build)
    assert counts["naive"][0] > 0 and counts["planned"][2] > 0
    config.coarsen = True
    try:
        cg = run_graph("agenda", build).cg
    finally:
        config.coarsen = False
    cg.print_batches()
    out = capsys.readouterr().out
    assert "coarse[" in out and "saved by the planned layout" in out


@settings(max_examples=10, **_SETTINGS)
@given(detail=st.sampled_from(DETAILS), odd=st.integers(0, 4), n_seq=st.integers(1, 3),
       length=st.integers(2, 5), H=st.integers(1, 3))
def test_hypothesis_saved_copies_are_naive_minus_planned(detail, odd, n_seq, length, H):
    _naive_and_planned_copies(_cells(detail, odd, n_seq, length, H))


@pytest.mark.parametrize("build", [_treelstm(), _cells("wiring", 1, 3, 4)], ids=["treelstm", "cells"])
def test_both_group_backwards_match_op_by_op(build, monkeypatch):
    """A group's backward runs as op-level batches per member position (the default) or as
    the plan's replay (DYNAGRAPH_COARSEN_BACKWARD=replay): both equal op-by-op execution."""
    from dynagraph.coarsen import run as coarse_run
    from dynagraph.executor import ExecutedBatch
    for mode in ("batches", "replay"):
        monkeypatch.setattr(coarse_run, "BACKWARD", mode)
        cg = assert_matches_none(build)
        groups = [r for r in cg.executed if isinstance(r, CoarseRecord)]
        assert groups
        members = sum(len(r.groups) for r in groups)
        batches = [r for r in cg.executed if type(r) is ExecutedBatch]
        if mode == "batches":   # each group's record lists nothing itself; its members follow it
            assert all(not r.steps for r in groups) and len(batches) >= members
        else:
            assert all(r.steps == r.groups for r in groups)
