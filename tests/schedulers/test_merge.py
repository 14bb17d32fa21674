"""The batch-merging post-pass (schedulers/merge.py): valid, never more batches, the compiled pass
equal to its Python twin, and values and gradients identical to "none" under "NAME+merge"."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dynagraph as dy
from dynagraph import schedulers
from dynagraph.recording import NATIVE
from dynagraph.schedulers.merge import Merged, merge_batches, merge_batches_py
from dynagraph.schedulers.base import batchable_by_sig

from . import _random_graph as rg
from ._util import compare_with_none

_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_big_spec = st.tuples(st.lists(rg.sample, min_size=3, max_size=6), st.integers(2, 4))


def _pending(cg) -> list:
    cg._sync_values()
    return [i for i in range(cg.done, len(cg.op)) if not cg.op[i].leaf]


def _recorded(spec):
    dy.renew_cg()
    pc = dy.ParameterCollection()
    rg.record(pc, spec)
    cg = dy.cg()
    return cg, _pending(cg)


@pytest.mark.parametrize("name", ["agenda+merge", "depth+merge"])
@settings(max_examples=25, **_SETTINGS)
@given(spec=rg.graph_spec)
@example(spec=rg.every_branch_spec())
def test_merged_schedules_match_none(name, spec):
    compare_with_none(name, lambda pc: rg.record(pc, spec))


@settings(max_examples=20, **_SETTINGS)
@given(spec=_big_spec)
def test_merge_is_valid_never_longer_and_compiled_equals_python(spec):
    cg, nodes = _recorded(spec)
    if not nodes:
        return
    bt = batchable_by_sig(cg)
    for name in ("agenda", "depth", "typewise", "none"):
        batches = schedulers.get(name).schedule(cg, nodes)
        py = merge_batches_py(cg, batches, bt)
        schedulers.validate(cg, nodes, py, f"{name}+merge")
        assert len(py) <= len(batches)
        assert len(py) >= schedulers.lower_bound(cg, nodes)
        assert merge_batches(cg, batches, bt) == py
        assert merge_batches_py(cg, py, bt) == py  # a second pass finds nothing more


def test_merge_joins_a_batch_with_its_later_twin():
    """Node by node ("none"), each tanh is its own batch; nothing uses the first tanh before the
    sum, so the pass moves it into the second tanh's batch; the logistic in between must stay."""
    dy.renew_cg()
    pc = dy.ParameterCollection()
    x = dy.parameter(pc.add_parameters((3,), name="x"))
    first = dy.logistic(x)
    a = dy.tanh(first)
    b = dy.tanh(dy.logistic(first))  # same signature as a: both read an unshared vector
    dy.esum([a, b])
    cg = dy.cg()
    nodes = _pending(cg)
    batches = schedulers.get("none").schedule(cg, nodes)
    merged = merge_batches(cg, batches)
    schedulers.validate(cg, nodes, merged, "none+merge")
    names = [[cg.op[n].name for n in m] for m in merged]
    assert len(batches) == 5 and names == [["logistic"], ["logistic"], ["tanh", "tanh"], [names[-1][0]]]
    assert merged == merge_batches_py(cg, batches, batchable_by_sig(cg))


def test_bad_schedules_are_clear_errors():
    dy.renew_cg()
    pc = dy.ParameterCollection()
    x = dy.parameter(pc.add_parameters((2,), name="x"))
    y = dy.tanh(dy.tanh(x))
    cg = dy.cg()
    n = y.vindex if hasattr(y, "vindex") else len(cg.op) - 1
    bt = batchable_by_sig(cg)
    for twin in (merge_batches_py, merge_batches):
        with pytest.raises(ValueError, match="scheduled twice"):
            twin(cg, [[n], [n]], bt)
        with pytest.raises(ValueError):
            twin(cg, [[n], []], bt)
    if NATIVE is not None:
        with pytest.raises(IndexError):
            NATIVE.merge_batches([[n], [len(cg.op) + 5]], cg.args, cg.sig, bt)
        with pytest.raises(TypeError):
            NATIVE.merge_batches([[n], [n - 1]], cg.args, cg.sig, tuple(bt))


class Tuples:
    """A user scheduler that returns tuples (validate accepts any sequences)."""
    name = "tuples"

    def schedule(self, cg, nodes):
        return tuple(tuple(b) for b in schedulers.get("none").schedule(cg, nodes))


def test_merge_takes_any_sequences():
    compare_with_none(Merged(Tuples()), lambda pc: rg.record(pc, rg.every_branch_spec()))


def test_named_merge_wraps_any_scheduler():
    sched = schedulers.get("depth+merge")
    assert isinstance(sched, Merged) and sched.name == "depth+merge" and sched.trusted
    with pytest.raises(ValueError, match="unknown scheduler"):
        schedulers.get("nosuch+merge")
