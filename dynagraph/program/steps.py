"""One traced step run over the batch, and its gradient: the unbatched path that every
unit kind must agree with (and what a block with no program runs)."""
from __future__ import annotations

from typing import Callable

from .grads import Grads


def step_forward(be, kernels: dict, step: tuple, vals: dict, data_of: Callable) -> tuple:
    """Run one traced step over the batch, store its value; returns what backward needs."""
    i, op, args, a, spec, shape = step
    d = data_of(spec) if op.uses_data else None
    ins = [vals[j] for j in args]
    y = kernels.get(op.name, op.forward)(be.xp, a, d, *ins)
    vals[i] = y = y.reshape((y.shape[0],) + shape)
    return ins, y, d


def step_backward(be, kernels: dict, step: tuple, saved: tuple, acc: Grads, needs: dict,
                  divert: Callable | None = None, n: int = -1) -> None:
    """The gradient of one step's inputs from its output gradient in `acc`.
    `divert(n, args, ins, g, want)` may clear entries of `want` to take them elsewhere."""
    i, op, args, a, spec, shape = step
    gi = acc.pop(i)
    if gi is None or op.backward is None or not needs.get(i, False):
        return
    ins, y, d = saved
    want = [needs.get(j, False) for j in args]
    if divert is not None:
        divert(n, args, ins, gi, want)
    gxs = kernels.get(op.name, op.backward)(be.xp, a, d, ins, y, gi, tuple(want))
    for j, x, gx, w in zip(args, ins, gxs, want):
        if gx is not None and w:
            acc.add(j, gx, x.shape)
