"""Array backends. Every op is written once against an `xp` module (numpy or CuPy);
a backend adds row-movement kernels and, where measured to pay, per-op overrides."""
from __future__ import annotations

import warnings

import numpy as np

from ..config import config
from .numpy_backend import NumpyBackend

_cache: dict = {}


def get_backend(name: str | None = None) -> NumpyBackend:
    name = name or config.backend
    be = _cache.get(name)
    if be is None:
        be = _cache[name] = _make(name)
    return be


def _make(name: str) -> NumpyBackend:
    if name == "numpy":
        return NumpyBackend(np)
    if name == "cpu":
        try:
            from .cpu import CpuBackend
        except ImportError as e:  # the C extension was not built: keep working, say so once
            warnings.warn(f"dynagraph: compiled kernels unavailable ({e}); using the numpy backend",
                          RuntimeWarning, stacklevel=3)
            return NumpyBackend(np)
        return CpuBackend()
    if name == "cuda":
        try:
            import cupy
        except ImportError:
            raise RuntimeError("backend 'cuda' needs CuPy: pip install dynagraph[gpu]") from None
        be = NumpyBackend(cupy)
        be.name = "cuda"
        return be
    raise ValueError(f"unknown backend {name!r}; use numpy, cpu or cuda")


def xp_for(name: str | None = None):
    return get_backend(name).xp


def to_numpy(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)
