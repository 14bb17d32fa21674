"""Helpers for the backend tests."""
from __future__ import annotations

import numpy as np
import pytest

DTYPES = [np.float32, np.float64]


def tol(dt) -> dict:
    """Tolerances for comparing a C kernel with numpy: float32 kernels use their own
    vectorized exp/tanh/logistic (<= 2.25 ulp), float64 kernels call libm like numpy does."""
    return dict(rtol=2e-5, atol=2e-6) if np.dtype(dt) == np.float32 else dict(rtol=1e-12, atol=1e-13)


def close(a, b, dt) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == np.dtype(dt), a.dtype
    np.testing.assert_allclose(a, b, **tol(dt))


def kernels():
    """The compiled module, or skip the test (the numpy fallback is tested separately)."""
    return pytest.importorskip("dynagraph._kernels", reason="compiled kernels not built")
