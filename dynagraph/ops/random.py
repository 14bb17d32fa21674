"""Counter-based random numbers: a value depends only on (node key, element index).

That makes dropout and noise identical under every scheduler and batch order,
and a whole batch draws its randomness in one vectorised call.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def uniform(xp, keys, shape: tuple, stream: int = 0):
    """Uniform [0, 1) floats of shape (len(keys),) + shape, float64."""
    n = 1
    for s in shape:
        n *= s
    k = xp.asarray(np.asarray(keys, dtype=np.uint64))[:, None]
    ctr = xp.arange(n, dtype=np.uint64)[None, :] * np.uint64(2) + np.uint64(stream)
    with np.errstate(over="ignore"):
        z = _mix(_mix(k * _GOLDEN + np.uint64(0x632BE59BD9B4E019)) + ctr * _GOLDEN)
    u = (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return u.reshape((len(keys),) + tuple(shape))


def normal(xp, keys, shape: tuple):
    """Standard normals by Box-Muller over two independent uniform streams."""
    u1 = uniform(xp, keys, shape, 0)
    u2 = uniform(xp, keys, shape, 1)
    return xp.sqrt(-2.0 * xp.log1p(-u1)) * xp.cos(2.0 * np.pi * u2)
