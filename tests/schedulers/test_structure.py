"""Scheduler unit tests on small graphs whose batch counts are worked out by hand.

Every run goes through `schedule_of`, which also checks each schedule (one
signature per batch, arguments first, every node once, >= lower bound).
"""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy
from dynagraph import schedulers
from dynagraph.backends import to_numpy
from dynagraph.expression import Expression
from dynagraph.ops.base import OpDef

from ._util import SCHEDULERS, all_lower_bound, n_batches, schedule_of


# ------------------------------------------------------------------ registry
def test_builtin_schedulers_are_available():
    names = schedulers.available()
    assert {"none", "depth", "agenda"} <= set(names)
    assert names == sorted(names)


def test_get_passes_scheduler_objects_through():
    class Mine:
        def schedule(self, cg, nodes):
            return [[n] for n in nodes]
    obj = Mine()
    assert schedulers.get(obj) is obj
    with pytest.raises(ValueError, match="available: .*none"):
        schedulers.get("no-such-scheduler")


@pytest.mark.parametrize("name", SCHEDULERS)
def test_empty_pending_list_gives_no_batches(name):
    cg = dy.renew_cg()
    assert schedulers.get(name).schedule(cg, []) == []


# ------------------------------------------------------------------ builders
def _chains(k: int, m: int):
    """k independent identical chains: input, then m x (matmul by shared W, tanh)."""
    pc = dy.ParameterCollection()
    W = pc.add_parameters((3, 3))
    for s in range(k):
        h = dy.inputVector([0.1 * s, 0.2, -0.3])
        for _ in range(m):
            h = dy.tanh(W * h)


def _encode(tree, E, W):
    """Leaves: lookup. Internal: tanh(W * [left; right]) = concatenate, matmul, tanh."""
    if isinstance(tree, int):
        return dy.lookup(E, tree)
    left, right = (_encode(t, E, W) for t in tree)
    return dy.tanh(W * dy.concatenate([left, right]))


# Heights 2, 2, 3 and 0 (a lone leaf): an internal node of height h has its
# concatenate at depth 3h-1, its matmul at 3h and its tanh at 3h+1.
FOREST = [((0, 1), 2), ((3, 4), (5, 0)), (1, (2, (3, 4))), 5]


def _forest(with_loss: bool):
    pc = dy.ParameterCollection()
    E = pc.add_lookup_parameters((6, 2))
    W = pc.add_parameters((2, 4))
    roots = [_encode(t, E, W) for t in FOREST]
    if with_loss:
        dy.esum([dy.sum_elems(r) for r in roots])


def _ragged(lengths=(1, 2, 3)):
    """Chains of tanh of different lengths, each summed, then one esum."""
    outs = []
    for n in lengths:
        h = dy.inputVector([0.5, -0.5])
        for _ in range(n):
            h = dy.tanh(h)
        outs.append(dy.sum_elems(h))
    dy.esum(outs)


# ------------------------------------------------------------ lower bound by hand
def test_lower_bound_two_chains():
    def build():
        x, y = dy.inputVector([1.0, 2.0]), dy.inputVector([3.0, 4.0])
        dy.tanh(dy.tanh(x))
        dy.tanh(y)
    cg, _ = schedule_of("none", build)
    assert all_lower_bound(cg) == 1 + 2  # inputs batch together; the longest tanh chain is 2


def test_lower_bound_diamond_and_mixed_signatures():
    def build():
        x = dy.inputVector([1.0, 2.0])
        a, b = dy.tanh(x), dy.tanh(x)  # independent: one batch
        dy.tanh(a + b) + dy.logistic(x)
    cg, _ = schedule_of("none", build)
    # input, tanh (a,b then tanh(a+b): chain of 2), add (a+b then +: chain of 2), logistic
    assert all_lower_bound(cg) == 1 + 2 + 2 + 1


def test_lower_bound_counts_only_what_one_path_forces():
    """x->tanh->logistic and y->logistic->tanh: the bound is 3 but no schedule beats 4."""
    def build():
        dy.logistic(dy.tanh(dy.inputVector([1.0, 2.0])))
        dy.tanh(dy.logistic(dy.inputVector([3.0, 4.0])))
    cg, _ = schedule_of("none", build)
    assert all_lower_bound(cg) == 3
    assert n_batches("agenda", build) == 4  # inputs, then either order of the two sigs forces 3 more
    assert n_batches("depth", build) == 1 + 2 + 2  # tanh and logistic at depth 2 and again at 3
    assert n_batches("none", build) == 6


# ------------------------------------------------------------------ none
def test_none_runs_nodes_one_by_one_in_recording_order():
    cg, rec = schedule_of("none", lambda: _chains(3, 2))
    assert rec.batches == [[n] for n in range(len(cg)) if not cg.op[n].leaf]


# ------------------------------------------------------------------ depth
@pytest.mark.parametrize("k,m", [(1, 1), (4, 1), (5, 3), (8, 6)])
def test_depth_batches_identical_chains_one_batch_per_step(k, m):
    cg, rec = schedule_of("depth", lambda: _chains(k, m))
    length = 1 + 2 * m  # input, then matmul + tanh per step
    assert len(rec.batches) == length
    assert all(len(b) == k for b in rec.batches)
    assert all_lower_bound(cg) == length


def test_depth_splits_a_signature_found_at_several_depths():
    # input (1); tanh at depths 2,3,4 (3); sum_elems at depths 3,4,5 (3); esum (1)
    assert n_batches("depth", _ragged) == 8


def test_depth_on_forest_follows_heights():
    # lookup (1); concat/matmul/tanh at depths 2..10 (9)
    assert n_batches("depth", lambda: _forest(False)) == 10
    # + sum_elems at depths 2 (lone leaf), 8 (two trees), 11 (height 3) + esum
    assert n_batches("depth", lambda: _forest(True)) == 10 + 3 + 1


# ------------------------------------------------------------------ agenda
@pytest.mark.parametrize("k,m", [(4, 1), (5, 3)])
def test_agenda_on_identical_chains_is_optimal(k, m):
    cg, rec = schedule_of("agenda", lambda: _chains(k, m))
    assert len(rec.batches) == all_lower_bound(cg) == 1 + 2 * m


def test_agenda_reaches_lower_bound_on_ragged_chains():
    cg, rec = schedule_of("agenda", _ragged)
    # input, tanh (longest chain 3), sum_elems, esum: sum_elems waits because its mean depth is larger
    assert all_lower_bound(cg) == 1 + 3 + 1 + 1
    assert len(rec.batches) == 6
    assert [len(b) for b in rec.batches] == [3, 3, 2, 1, 3, 1]


@pytest.mark.parametrize("with_loss,expected", [(False, 1 + 3 * 3), (True, 1 + 3 * 3 + 1 + 1)])
def test_agenda_reaches_lower_bound_on_forest(with_loss, expected):
    """Trees of different shapes, one signature per level type: one batch per level.

    With the loss, the roots' sum_elems (mean depth 7.25) always lose against the
    pending concatenate/matmul/tanh (mean depths 3.875/4.875/5.875), so they run
    once, at the end.
    """
    cg, rec = schedule_of("agenda", lambda: _forest(with_loss))
    assert all_lower_bound(cg) == expected
    assert len(rec.batches) == expected


def test_agenda_runs_cheap_ops_first_on_equal_mean_depth():
    def build():
        W = dy.ParameterCollection().add_parameters((2, 2))
        x = dy.inputVector([1.0, 2.0])
        W * x       # GEMM at depth 2
        dy.pick(x, 1)  # CHEAP at depth 2, recorded later
    cg, rec = schedule_of("agenda", build)
    assert [cg.op[b[0]].name for b in rec.batches] == ["input", "pick", "matmul"]


# ------------------------------------------------------------ unbatchable ops
_UNBATCHABLE = OpDef("test_unbatchable_tanh", lambda a, x: x, lambda xp, a, d, x: xp.tanh(x),
                     lambda xp, a, d, xs, y, gy, need: (gy * (1 - y * y),), batchable=False)


def _with_unbatchable():
    outs = []
    for s in range(3):
        x = dy.inputVector([0.1 * s, 0.2])
        cg = x.cg
        u = Expression(cg, cg.add(_UNBATCHABLE, (x.i,)))
        outs.append(dy.tanh(u))
    return outs


@pytest.mark.parametrize("name", SCHEDULERS)
def test_unbatchable_nodes_run_alone(name):
    cg, rec = schedule_of(name, _with_unbatchable)
    alone = [b for b in rec.batches if cg.op[b[0]] is _UNBATCHABLE]
    assert len(alone) == 3 and all(len(b) == 1 for b in alone)
    assert all_lower_bound(cg) == 1 + 3 + 1  # inputs, each unbatchable node, tanh
    if name in ("depth", "agenda"):
        assert len(rec.batches) == 5
    for (n,) in alone:
        np.testing.assert_allclose(to_numpy(cg.value(n)), np.tanh(to_numpy(cg.value(cg.args[n][0]))), rtol=1e-15)


# ------------------------------------------------------------------ validate
def _two_nodes():
    cg = dy.renew_cg(scheduler="none")
    x = dy.inputVector([1.0, 2.0])
    y = dy.tanh(x)
    z = dy.logistic(x)
    return cg, [x.i, y.i, z.i]


@pytest.mark.parametrize("bad,match", [
    (lambda x, y, z: [[x], [y], [z], [y]], "twice"),
    (lambda x, y, z: [[x], [], [y, z]], "empty"),
    (lambda x, y, z: [[x], [y, z]], "mixes"),
    (lambda x, y, z: [[y], [x], [z]], "before its argument"),
    (lambda x, y, z: [[x], [y]], "not scheduled"),
])
def test_validate_rejects_bad_schedules(bad, match):
    cg, (x, y, z) = _two_nodes()
    schedulers.validate(cg, [x, y, z], [[x], [y], [z]], "ok")  # the good one passes
    with pytest.raises(dy.DynagraphError, match=match):
        schedulers.validate(cg, [x, y, z], bad(x, y, z), "bad")
