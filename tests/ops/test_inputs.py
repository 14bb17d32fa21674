"""Reference checks for the inputs ops: value vs numpy, gradients vs finite differences."""
from __future__ import annotations

import pytest

from cases_inputs import CASES
from opcases import params, run_reference


@pytest.mark.parametrize("case", params(CASES))
def test_reference(case):
    run_reference(case)
