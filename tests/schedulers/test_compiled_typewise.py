"""The compiled typewise/FSM bookkeeping (kernels/cpython/typewise.c) makes exactly the decisions of
its pure-Python twins (Simulation, TypewiseBatching.schedule_py, FSMScheduler.schedule_py): the same
schedule, batch for batch, and the same policy hit and miss counts, on random graphs and workloads."""
from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dynagraph as dy
import dynagraph.fsm as fsm
from dynagraph.recording import NATIVE
from dynagraph.schedulers import validate
from dynagraph.schedulers.fsm import FSMScheduler, Policy
from dynagraph.schedulers.typewise import TypewiseBatching

from . import _random_graph as rg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # examples.workloads
from examples.workloads import WORKLOADS  # noqa: E402

pytestmark = pytest.mark.skipif(NATIVE is None, reason="dynagraph._bookkeeping not built (or forced off)")

_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def pending(cg) -> list[int]:
    cg._sync_values()
    return [i for i in range(cg.done, len(cg)) if not cg.op[i].leaf]


def same_decisions(cg, sched) -> list:
    """Compiled and Python schedules are equal (and valid); so are the FSM's hit and miss counts."""
    nodes = pending(cg)
    counts = []
    out = []
    for fn in (sched.schedule, sched.schedule_py):
        if hasattr(sched, "hits"):
            sched.hits = sched.misses = 0
        out.append(fn(cg, nodes))
        counts.append((getattr(sched, "hits", 0), getattr(sched, "misses", 0)))
    assert out[0] == out[1]
    assert counts[0] == counts[1]
    validate(cg, nodes, out[0], "compiled")
    return out[0]


def policies(cg, seed: int) -> list:
    """Policies with decisions to make: trained per encoding (holding the tail), unsettled and not
    holding it, and one missing a type."""
    out = [FSMScheduler(Policy("base", [], {})), FSMScheduler(Policy("base", [], {}, hold_tail=True))]
    for enc in ("base", "max", "sort", "ratio", "chain"):
        out.append(FSMScheduler(fsm.train(cg, encoding=enc, episodes=8, eval_every=4, seed=seed,
                                          progress=False)))
    # ratio without settling: the compiled path still computes G_a for the encoding
    out.append(FSMScheduler(fsm.train(cg, encoding="ratio", episodes=8, eval_every=4, seed=seed, settle=False,
                                      progress=False)))
    # chain without settling or holding the tail: heights still counted, the fallback is chain_first
    out.append(FSMScheduler(fsm.train(cg, encoding="chain", episodes=8, eval_every=4, seed=seed, settle=False,
                                      progress=False, hold_tail=False)))
    unsettled = fsm.train(cg, encoding="sort", episodes=8, eval_every=4, seed=seed, settle=False, progress=False,
                          hold_tail=False)
    out.append(FSMScheduler(unsettled))
    pol = out[2].policy
    if pol.types:  # the first type unknown: states holding it cannot be seen
        out.append(FSMScheduler(Policy(pol.encoding, ["?"] + pol.types[1:], pol.table, settle=True)))
    return out


_big_spec = st.tuples(st.lists(rg.sample, min_size=2, max_size=6), st.integers(1, 4))


@settings(max_examples=25, **_SETTINGS)
@given(spec=_big_spec, seed=st.integers(0, 3))
@example(spec=(rg.every_branch_spec()[0], 2), seed=0)
def test_random_graphs_compiled_equals_python(spec, seed):
    cg = dy.renew_cg()
    rg.record(dy.ParameterCollection(), spec)
    same_decisions(cg, TypewiseBatching())
    for sched in policies(cg, seed):
        same_decisions(cg, sched)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_compiled_equals_python(name):
    w = WORKLOADS[name](hidden=2, seed=0)
    train_cg = w.graph(w.instances(4, seed=1))
    pols = [fsm.train(train_cg, encoding=enc, episodes=20, eval_every=10, seed=0, progress=False,
                      hold_tail=enc != "max") for enc in ("base", "max", "sort", "ratio", "chain")]
    cg = w.graph(w.instances(6, seed=2))  # another graph of the model: unseen states use the fallback
    same_decisions(cg, TypewiseBatching())
    for pol in pols:
        same_decisions(cg, FSMScheduler(pol))


def test_collided_keys_use_the_python_path():
    """Two signatures with one key (same-named parameters of two collections): Python decides."""
    cg = dy.renew_cg()
    pcs = [dy.ParameterCollection() for _ in range(2)]
    Ws = [pc.add_parameters((2, 3), name="W") for pc in pcs]
    x = dy.inputVector([1.0, 2.0, 3.0])
    dy.esum([dy.tanh(W * x) for W in Ws for _ in range(3)])
    sched = FSMScheduler(Policy("base", [], {}))
    assert sched._vocab_by_sig(cg) is None
    same_decisions(cg, sched)
