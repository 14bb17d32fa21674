"""Every op also runs in float32 (the default dtype) and agrees with float64 to
float32 precision, batched, with gradients: no dtype promotion errors or overflow."""
from __future__ import annotations

import numpy as np
import pytest

from allcases import ALL
from opcases import batched_builder
from refcheck import run_graph


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in ALL if c.batch])
def test_float32_matches_float64(case):
    build = batched_builder(case, "rows")
    lo = run_graph("agenda", build, dtype="float32", backward=case.grad is not None)
    hi = run_graph("agenda", build, dtype="float64", backward=case.grad is not None)
    for a, b in zip(lo.values, hi.values):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for k in hi.grads:
        assert lo.grads[k].dtype == np.float32
        np.testing.assert_allclose(lo.grads[k], hi.grads[k], rtol=1e-4, atol=1e-5, err_msg=k)
