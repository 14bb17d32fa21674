"""Property test: on random graphs every scheduler matches "none" exactly (1e-10,
float64), on the value of every node, every node gradient and every parameter
gradient; every schedule it returns is valid and no shorter than the lower bound."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dynagraph import schedulers

from . import _random_graph as rg
from ._util import SCHEDULERS, compare_with_none, run_recorded

# derandomize: the suite must be deterministic; the autouse fixture only resets global state.
_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("name", SCHEDULERS)
@settings(max_examples=40, **_SETTINGS)
@given(spec=rg.graph_spec)
@example(spec=rg.every_branch_spec())  # every opcode and branch at least once, whatever is drawn
def test_random_graph_matches_none(name, spec):
    compare_with_none(name, lambda pc: rg.record(pc, spec))


# Bigger graphs, forward only: many nodes of each signature ready at once.
_big_spec = st.tuples(st.lists(rg.sample, min_size=3, max_size=6), st.integers(2, 4))


@pytest.mark.parametrize("name", SCHEDULERS)
@settings(max_examples=15, **_SETTINGS)
@given(spec=_big_spec)
def test_random_graph_schedules_are_valid(name, spec):
    got = run_recorded(name, lambda pc: rg.record(pc, spec), backward=False)  # checks every schedule
    n = sum(len(b) for b in got.rec.batches)
    assert len(got.rec.batches) <= n
    if name == "none":
        assert len(got.rec.batches) == n


class Scrambled:
    """A valid but hostile schedule: agenda's batches, rows reversed and interleaved halves
    split apart, so every argument needs a non-contiguous gather and every gradient a scatter."""
    name = "scrambled"

    def schedule(self, cg, nodes):
        out = []
        for b in schedulers.get("agenda").schedule(cg, nodes):
            b = list(reversed(b))
            out += [b[::2], b[1::2]] if len(b) > 2 else [b]
        return out


@settings(max_examples=30, **_SETTINGS)
@given(spec=rg.graph_spec)
@example(spec=rg.every_branch_spec())
def test_any_valid_schedule_matches_none(spec):
    compare_with_none(Scrambled(), lambda pc: rg.record(pc, spec))
