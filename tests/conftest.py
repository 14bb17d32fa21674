"""Shared fixtures. Every test starts from seed 0 and a fresh default graph, and
global settings changed by a test are restored afterwards."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import refcheck` from any test directory

import dynagraph as dy  # noqa: E402
from refcheck import using  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_state():
    """Reset the seed and the default graph; restore dtype/scheduler/seed afterwards."""
    with using(dtype=dy.config.config.dtype, seed=0):
        dy.renew_cg()
        yield


@pytest.fixture
def float64():
    """Run the test in float64 (gradient checks need it)."""
    with using(dtype="float64", seed=0):
        dy.renew_cg()
        yield


@pytest.fixture
def pc():
    return dy.ParameterCollection()
