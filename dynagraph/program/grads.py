"""The gradients of a plan's variables: per variable (`Grads`), and with one buffer per
group or piece-major unit (`UnitGrads`) so that in-place readers add back in one call."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..ops.base import Sliced, SparseRows, reduce_to
from .units import GROUP, PIECES


class ProgramUnits(Protocol):
    """What UnitGrads reads of a `build.Program` (named here so that this lower module
    does not import the one that uses it)."""
    plan: object
    units: list
    home: dict


class Grads:
    """Gradients of a plan's variables. Buffers it allocated are updated in place;
    arrays handed over by an op (which may alias its output gradient) are copied on write."""

    def __init__(self, xp):
        self.xp = xp
        self.g: dict = {}
        self.owned: set = set()
        self.sparse: dict = {}

    def add(self, i: int, gx, shape: tuple | None = None) -> None:
        if isinstance(gx, SparseRows):
            self.sparse.setdefault(i, []).append(gx)
            return
        if isinstance(gx, Sliced):
            buf = self._own(i, gx.shape if shape is None or shape[0] != 1 else shape, gx.vals.dtype)
            buf[(slice(None),) + gx.index] += gx.vals if buf.shape[0] == gx.vals.shape[0] \
                else gx.vals.sum(axis=0, keepdims=True)
            return
        if shape is not None and shape[0] == 1 and gx.shape[0] != 1:
            gx = reduce_to(gx, shape)  # a shared argument: sum over the batch
        old = self.g.get(i)
        if old is None:
            self.g[i] = gx
        elif i in self.owned and old.shape == np.broadcast_shapes(old.shape, gx.shape):
            old += gx
        else:
            self.g[i] = old + gx
            self.owned.add(i)

    def _own(self, i: int, shape: tuple, dtype):
        old = self.g.get(i)
        if old is None:
            buf = self.xp.zeros(shape, dtype=dtype)
        elif i in self.owned:
            return old
        else:
            buf = old.copy()
        self.g[i] = buf
        self.owned.add(i)
        return buf

    def pop(self, i: int):
        self.owned.discard(i)
        return self.g.pop(i, None)

    def result(self, i: int):
        if i in self.sparse:
            parts = self.sparse[i]
            return SparseRows(np.concatenate([p.idx for p in parts]),
                              self.xp.concatenate([p.vals for p in parts]))
        return self.g.get(i)


class UnitGrads(Grads):
    """Grads whose group members and slices live in one buffer per unit, so a
    consumer that read a group in place adds its gradient back in one call."""

    def __init__(self, xp, program: ProgramUnits, B: int, dtype):
        super().__init__(xp)
        self.program, self.B, self.dtype = program, B, dtype
        self.buf: dict = {}

    def _buffer(self, k: int):
        buf = self.buf.get(k)
        if buf is None:
            u = self.program.units[k]
            shape = self.program.plan.steps[u.steps[0]][5]
            if u.kind == PIECES:
                shape = (shape[0] // u.pieces,)
            rows = (len(u.steps) if u.kind == GROUP else u.pieces) * self.B
            buf = self.buf[k] = self.xp.zeros((rows,) + tuple(shape), dtype=self.dtype)
        return buf

    def add(self, i: int, gx, shape: tuple | None = None) -> None:
        home = self.program.home.get(i)
        if home is None:
            return super().add(i, gx, shape)
        k, m = home
        view = self._buffer(k)[m * self.B:(m + 1) * self.B]
        if isinstance(gx, Sliced):
            view[(slice(None),) + gx.index] += gx.vals
        else:
            view += gx

    def add_range(self, k: int, start: int, gx) -> None:
        self._buffer(k)[start:start + gx.shape[0]] += gx

    def take(self, k: int):
        return self.buf.pop(k, None)
