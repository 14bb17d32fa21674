"""The overlap path in the invariance suite: random graphs whose backward() runs on the overlap
thread (dynagraph/overlap.py) match in-place unbatched execution ("none") at 1e-10 in float64,
on every node value, every node gradient and every parameter gradient."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings

from dynagraph import overlap
from dynagraph.config import config

from . import _random_graph as rg
from ._util import assert_invariant, run_recorded

_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@contextmanager
def _deferred():
    """Overlap on, as on a two-core machine with the default threads; restored afterwards."""
    saved = config.overlap, config.threads, overlap._CORES
    config.overlap, config.threads, overlap._CORES = True, None, 2
    before = overlap._worker.submitted
    try:
        yield
        assert overlap._worker.submitted > before  # backward() was deferred
        assert overlap.pending() is False  # reading the results waited for it
    finally:
        overlap.wait()
        config.overlap, config.threads, overlap._CORES = saved


@pytest.mark.parametrize("name", ["none", "depth", "agenda"])
@settings(max_examples=15, **_SETTINGS)
@given(spec=rg.graph_spec)
def test_deferred_backward_matches_none_in_place(name, spec):
    ref = run_recorded("none", lambda pc: rg.record(pc, spec))
    with _deferred():
        got = run_recorded(name, lambda pc: rg.record(pc, spec))
    assert_invariant(ref, got)
