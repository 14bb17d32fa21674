"""Reference checks for the shape ops: value vs numpy, gradients vs finite differences."""
from __future__ import annotations

import pytest

from cases_shape import CASES
from opcases import params, run_reference


@pytest.mark.parametrize("case", params(CASES))
def test_reference(case):
    run_reference(case)
