"""Every backend a suite runs on: numpy (reference), cpu (compiled kernels), cuda
(CuPy on a device) and checked (tests/checked_backend.py: numpy behind a device boundary
that refuses implicit host copies, so every suite proves on any machine that nothing
crosses it implicitly). One that this machine cannot run is a skipped parameter, with
the reason, so the suites stay the same everywhere and a GPU machine runs the cuda rows.

    @pytest.fixture(params=BACKENDS)
    def backend(request): ...
"""
from __future__ import annotations

import functools

import pytest

import checked_backend
import dynagraph as dy
from dynagraph.backends import get_backend

checked_backend.install()
NAMES = ("numpy", "cpu", "cuda", "checked")


@functools.lru_cache(maxsize=None)
def unavailable(name: str) -> str | None:
    """Why `name` cannot run here, or None."""
    if name == "cpu":
        return None if get_backend("cpu").elementwise_runs is not None else "compiled kernels not built"
    if name == "cuda":
        try:
            get_backend("cuda")
        except RuntimeError as e:
            return str(e)
    return None


BACKENDS = [pytest.param(n, id=n, marks=pytest.mark.skipif(unavailable(n) is not None, reason=unavailable(n) or ""))
            for n in NAMES]


def use_backend(name: str):
    """Generator body of a backend fixture: set it, yield its name, restore."""
    old = dy.config.config.backend
    dy.config.set(backend=name)
    try:
        yield name
    finally:
        dy.config.set(backend=old)
