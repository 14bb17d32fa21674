"""dy.cavs API: vertex functions and the symbols they are written with (gather, scatter,
pull, push)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import DynagraphError, DynagraphIndexError, user_line
from ..expression import Expression, record
from ..graph import ComputationGraph
from ..ops import OPS
from ..ops.base import as_shape
from ..subgraph import PLACEHOLDER



# =========================================================================== declaring
class VertexFunction:
    """A function of one vertex, traced once per (state shape, pull shape) and run over tasks."""

    def __init__(self, fn: Callable, arity: int, state=None, name: str | None = None):
        if isinstance(arity, bool) or not isinstance(arity, (int, np.integer)) or arity < 0:
            raise ValueError(f"vertex_function: arity must be a non-negative int, got {arity!r}")
        self.fn = fn
        self.arity = int(arity)
        self.name = name or getattr(fn, "__name__", "vertex")
        self.state = None if state is None else _state_shapes(state)
        self.compiled_cache: dict = {}  # compile.compiled's cache: (state, pull shape, fuse) -> _Compiled

    def __call__(self, *a, **k):
        raise TypeError(f"vertex function {self.name} is not called directly: pass it to dy.cavs.run()")

    def __repr__(self) -> str:
        return f"<vertex function {self.name} arity={self.arity}>"

def vertex_function(fn: Callable | None = None, *, arity: int = 2, state=None, name: str | None = None):
    """Decorator: `@dy.cavs.vertex_function(arity=2)`.

    state: the shape of what scatter() writes (an int or tuple), or a list of shapes
    when several expressions are scattered; inferred from a function that scatters
    without gathering (a leaf function) when omitted."""
    if fn is None:
        return lambda f: VertexFunction(f, arity, state, name)
    return VertexFunction(fn, arity, state, name)


def _state_shapes(state) -> tuple:
    if isinstance(state, list):
        return tuple(as_shape(s) for s in state)
    return (as_shape(state),)


class _NeedState(Exception):
    """gather() was traced before the state's shape is known (inferred from another function)."""


class Vertex:
    """What a vertex function receives while it is traced: gather, scatter, pull, push."""

    def __init__(self, vf: VertexFunction, trace: ComputationGraph, state, pull_shape):
        self._vf, self._trace, self._state, self._pull_shape = vf, trace, state, pull_shape
        self.gathers: dict = {}     # k -> placeholder ids, one per state symbol
        self.pull_id: int | None = None
        self.scattered: list | None = None
        self.pushed: int | None = None

    @property
    def arity(self) -> int:
        return self._vf.arity

    def pull(self) -> Expression:
        if self._pull_shape is None:
            raise DynagraphError(f"vertex function {self._vf.name} calls pull(), but run() got no pull= "
                                 f"input for any of its vertices\n  at {user_line()}")
        if self.pull_id is None:
            self.pull_id = self._trace.placeholder(PLACEHOLDER, self._pull_shape)
        return Expression(self._trace, self.pull_id)

    def gather(self, k: int):
        """The state child k scattered: one expression, or a tuple when several were scattered."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"gather(k): k must be an int, got {type(k).__name__}")
        k = int(k)
        if not 0 <= k < self._vf.arity:
            raise DynagraphIndexError(f"vertex function {self._vf.name}: gather({k}) but its arity is "
                                      f"{self._vf.arity} (children 0..{self._vf.arity - 1}); declare a larger "
                                      f"arity= in vertex_function\n  at {user_line()}")
        if self._state is None:
            raise _NeedState
        ids = self.gathers.get(k)
        if ids is None:
            ids = self.gathers[k] = [self._trace.placeholder(PLACEHOLDER, s) for s in self._state]
        exprs = tuple(Expression(self._trace, i) for i in ids)
        return exprs[0] if len(exprs) == 1 else exprs

    def gather_sum(self):
        """Sum of the states of all children (missing children count as zeros)."""
        states = [self.gather(k) for k in range(self._vf.arity)]
        if not states:
            raise DynagraphError(f"vertex function {self._vf.name}: gather_sum() with arity 0")
        if type(states[0]) is Expression:
            return _esum(states)
        return tuple(_esum(list(s)) for s in zip(*states))

    def scatter(self, *xs) -> None:
        if self.scattered is not None:
            raise DynagraphError(f"vertex function {self._vf.name}: scatter() called twice; scatter several "
                                 f"expressions in one call\n  at {user_line()}")
        if not xs:
            raise DynagraphError(f"vertex function {self._vf.name}: scatter() needs an expression")
        self.scattered = [self._own(x, "scatter") for x in xs]

    def push(self, x) -> None:
        if self.pushed is not None:
            raise DynagraphError(f"vertex function {self._vf.name}: push() called twice\n  at {user_line()}")
        self.pushed = self._own(x, "push")

    def _own(self, x, what: str) -> int:
        if type(x) is not Expression or x.cg is not self._trace:
            raise DynagraphError(f"vertex function {self._vf.name}: {what}() takes an expression computed "
                                 f"inside the vertex function, got {type(x).__name__}\n  at {user_line()}")
        return x.i


def _esum(xs: list) -> Expression:
    return xs[0] if len(xs) == 1 else record(OPS["esum"], xs)
