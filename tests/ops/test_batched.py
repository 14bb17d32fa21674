"""Batched equivalence: nodes may share a signature only if running them as one
batch gives exactly their separate results.

Each case records several nodes with the same signature (different lookup rows,
indices or input values per node; optionally one argument as a parameter shared
by every node) and evaluates them batched ("depth", "agenda") and node by node
("none"): values and gradients must agree to 1e-12 in float64.
"""
from __future__ import annotations

import pytest

from allcases import ALL
from opcases import assert_batched, run_batched, variants
from refcheck import assert_same_run

BATCHED = [pytest.param(c, v, id=f"{c.id}-{v}") for c in ALL if c.batch for v in variants(c)]


@pytest.mark.parametrize("case,variant", BATCHED)
@pytest.mark.parametrize("scheduler", ["depth", "agenda"])
def test_batch_equals_separate(case, variant, scheduler):
    separate = run_batched(case, variant, "none")
    batched = run_batched(case, variant, scheduler)
    assert_batched(case, batched)
    assert_same_run(batched, separate)
