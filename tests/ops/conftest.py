"""Op tests run in float64, once per backend (tests/backend_params.py: numpy, cpu, cuda
where present); the case modules next to this file are importable."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from backend_params import BACKENDS, use_backend  # noqa: E402


@pytest.fixture(autouse=True, params=BACKENDS)
def backend(request):
    yield from use_backend(request.param)


@pytest.fixture(autouse=True)
def _ops_float64(float64):
    yield
