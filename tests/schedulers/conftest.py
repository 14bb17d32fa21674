"""The scheduler-invariance suite runs once per backend (numpy reference, cpu kernels,
cuda where a device is present: tests/backend_params.py)."""
import pytest
from backend_params import BACKENDS, use_backend


@pytest.fixture(autouse=True, params=BACKENDS)
def backend(request):
    yield from use_backend(request.param)
