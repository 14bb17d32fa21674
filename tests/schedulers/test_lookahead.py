"""The agenda with lookahead (schedulers/simple.py LookaheadBatching, the default): a signature
whose nodes are one batch of other signatures away from ready waits for that batch. Checked on
the graph that motivated it (a BiLSTM whose cell reads pick_range slices of one affine per
direction), on a graph where every ready signature waits, and against its Python twin; values
and gradients equal "none"'s like every registered scheduler's (test_models, test_random_graphs)."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph.recording import NATIVE
from dynagraph.schedulers import simple

from ._util import compare_with_none, schedule_of

H = 3


def _bilstm(pc: dy.ParameterCollection, lengths=(4, 3, 2)):
    """Two directions with their own weights over sequences of `lengths`, the cell written from
    pick_range, logistic, tanh and cmult as DyNet users write it (bench/swap/bilstm.py)."""
    rng = np.random.default_rng(3)
    p = {k: pc.parameters_from_numpy(rng.uniform(-0.5, 0.5, (4 * H, H))) for k in ("Wxf", "Whf", "Wxb", "Whb")}
    p.update({k: pc.parameters_from_numpy(rng.uniform(-0.5, 0.5, 4 * H)) for k in ("bf", "bb")})

    def direction(xs, d):
        h = c = None
        out = []
        for x in xs:
            W = [p["b" + d], p["Wx" + d], x] if h is None else [p["b" + d], p["Wx" + d], x, p["Wh" + d], h]
            g = dy.affine_transform(W)
            i, f, o = (dy.logistic(dy.pick_range(g, k * H, (k + 1) * H)) for k in range(3))
            u = dy.tanh(dy.pick_range(g, 3 * H, 4 * H))
            c = dy.cmult(i, u) if c is None else dy.cmult(f, c) + dy.cmult(i, u)
            h = dy.cmult(o, dy.tanh(c))
            out.append(h)
        return out

    losses = []
    for n, L in enumerate(lengths):
        xs = [dy.inputVector(list(rng.uniform(-1, 1, H))) for _ in range(L)]
        fw, bw = direction(xs, "f"), direction(xs[::-1], "b")
        losses += [dy.sum_elems(dy.cmult(a, b)) for a, b in zip(fw, bw[::-1])]
    return dy.esum(losses)


def _directions_per_batch(cg, batches, op_name: str) -> list[int]:
    """For each batch of `op_name`: how many distinct affine weights its nodes' pick_range
    sources read (1: one direction, 2: both)."""
    out = []
    for b in batches:
        if cg.op[b[0]].name != op_name:
            continue
        affines = {cg.args[n][0] for n in b}
        weights = {cg.args[a][1] for a in affines}  # Wx of the affine: one per direction
        out.append(len(weights))
    return out


def test_each_step_batches_both_directions_where_the_agenda_splits_them():
    pc = dy.ParameterCollection()
    cg_a, rec_a = schedule_of("agenda", lambda: _bilstm(pc))
    cg_l, rec_l = schedule_of("lookahead", lambda: _bilstm(pc))
    agenda, lookahead = rec_a.batches, rec_l.batches
    # the agenda runs a step's forward-direction slices before the backward direction's affine
    assert 1 in _directions_per_batch(cg_a, agenda, "pick_range")
    # lookahead waits for that affine: every step's slices of both directions run together
    assert set(_directions_per_batch(cg_l, lookahead, "pick_range")) == {2}
    assert len(lookahead) < len(agenda)


def test_bilstm_values_and_gradients_equal_unbatched():
    compare_with_none("lookahead", _bilstm)


def _mutual(pc: dy.ParameterCollection):
    """tanh and logistic nodes each of which is one batch of the other signature from ready:
    every ready signature waits, so the agenda's first must run (progress)."""
    x = dy.inputVector([0.3, -0.2])
    a, b = dy.tanh(x), dy.logistic(x)
    ends = [dy.tanh(b), dy.logistic(a), dy.tanh(dy.logistic(dy.tanh(b)))]
    return dy.sum_elems(dy.esum(ends))


@pytest.mark.parametrize("build", [_mutual, _bilstm])
def test_schedule_equals_python_twin_and_finishes(build):
    pc = dy.ParameterCollection()
    cg, rec = schedule_of("lookahead", lambda: build(pc))  # checks every node runs once, after its arguments
    nodes = rec.calls[0][0]
    sched = simple.LookaheadBatching()
    assert sched.schedule_py(cg, nodes) == rec.calls[0][1]
    if NATIVE is not None:
        assert sched.schedule(cg, nodes) == rec.calls[0][1]


def test_mutual_waiting_values_equal_unbatched():
    compare_with_none("lookahead", _mutual)


def test_dynet_autobatch_1_is_the_agenda_with_lookahead():
    old = dy.config.get()
    try:
        dy.config.set(autobatch=1)
        assert dy.renew_cg().scheduler == "lookahead"
    finally:
        dy.config.set(scheduler=old["scheduler"])
