"""The scheduler-invariance suite runs once per backend (numpy reference and cpu kernels)."""
import pytest

import dynagraph as dy


@pytest.fixture(autouse=True, params=["numpy", "cpu"])
def backend(request):
    old = dy.config.config.backend
    dy.config.set(backend=request.param)
    yield request.param
    dy.config.set(backend=old)
