"""Shared fixtures. Every test starts from seed 0 and a fresh default graph, and
global settings changed by a test are restored afterwards."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import refcheck` from any test directory

import dynagraph as dy  # noqa: E402
from refcheck import using  # noqa: E402


def _restore_fp_environment() -> None:
    """Importing DyNet (built with fast-math) turns on flush-to-zero and denormals-are-zero
    for the whole process; every later test would then compute without subnormals (and
    hypothesis refuses to draw floats). Reset the default floating-point environment."""
    libm = ctypes.util.find_library("m")
    if libm and platform.libc_ver()[0] == "glibc":  # FE_DFL_ENV is ((fenv_t *) -1) in glibc only
        ctypes.CDLL(libm).fesetenv(ctypes.c_void_p(-1))


@pytest.fixture(autouse=True)
def _default_fp_environment():
    yield
    if "dynet" in sys.modules:
        _restore_fp_environment()


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
