"""Array backends. Every op is written once against an `xp` module (numpy or CuPy)."""
from __future__ import annotations

import numpy as np

from ..config import config


def xp_for(name: str | None = None):
    name = name or config.backend
    if name in ("numpy", "cpu"):
        return np
    if name == "cuda":
        try:
            import cupy
        except ImportError:
            raise RuntimeError("backend 'cuda' needs CuPy: pip install dynagraph[gpu]") from None
        return cupy
    raise ValueError(f"unknown backend {name!r}; use numpy, cpu or cuda")


def to_numpy(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)
