"""Op tests run in float64; the case modules next to this file are importable."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _ops_float64(float64):
    yield
