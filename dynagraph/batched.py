"""DyNet's minibatch dimension as sugar over per-sample graphs.

A DyNet program that batches by hand (`dy.lookup_batch`, `inputTensor(batched=True)`,
`pickneglogsoftmax_batch`, ...) gets a BatchedExpression: B ordinary Expressions of
one per-sample shape. Every op applied to it is recorded once per sample, broadcasting
ordinary expressions (DyNet's batch size 1), and the autobatcher batches those
per-sample nodes back together, so nothing below the recording layer knows about it.

A batch of one is never wrapped: `batched([e])` is `e`, as DyNet's batch size 1 is an
ordinary expression.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import numpy as np

from .errors import DynagraphError, user_line
from .expression import Expression, record as _record

__all__ = ["BatchedExpression"]


class BatchedExpression:
    """B per-sample Expressions of one shape, seen as one DyNet expression of batch size B."""
    __slots__ = ("samples",)
    _dy_batched = True  # Expression's operators return NotImplemented for it (no import cycle)
    __array_priority__ = 1000  # numpy scalars on the left defer to our reflected operators

    def __init__(self, samples: Sequence[Expression]):
        self.samples = list(samples)

    # --- what DyNet's Expression reports
    @property
    def cg(self):
        return self.samples[0].cg

    @property
    def shape(self) -> tuple:
        """The per-sample shape (dynagraph's Expression.shape; DyNet's dim()[0])."""
        return self.samples[0].shape

    def batch_size(self) -> int:
        return len(self.samples)

    def dim(self) -> tuple:
        return (self.shape, len(self.samples))

    def __repr__(self) -> str:
        return f"batched expression ({self.shape}, batch {len(self.samples)}) of {self.samples[0]!r}, ..."

    # --- values in DyNet's layout: the batch is the last axis
    def forward(self, recalculate: bool = False) -> "BatchedExpression":
        cg = self.cg
        if recalculate:
            cg.invalidate()
        cg.forward_to(max(e.i for e in self.samples))  # every sample in one scheduled chunk
        return self

    def npvalue(self, recalculate: bool = False) -> np.ndarray:
        self.forward(recalculate)
        return np.stack([e.npvalue() for e in self.samples], axis=-1)

    def tensor_value(self, recalculate: bool = False) -> np.ndarray:
        return self.npvalue(recalculate)

    def vec_value(self, recalculate: bool = False) -> list:
        """Column-major over dims then batch, like DyNet: sample 0's values first."""
        return self.npvalue(recalculate).flatten(order="F").tolist()

    def value(self, recalculate: bool = False):
        """DyNet: a batched vector or scalar gives the flat list of all values, else an array."""
        if len(self.shape) == 1:
            return self.vec_value(recalculate)
        return self.npvalue(recalculate)

    def scalar_value(self, recalculate: bool = False) -> float:
        raise DynagraphError(f"scalar_value() of an expression with batch size {len(self.samples)} "
                             f"(DyNet aborts here): use dy.sum_batches() or .value()\n  at {user_line()}")

    def backward(self, full: bool = False) -> None:
        # DyNet refuses too: backward() needs one scalar, batch elements included.
        raise DynagraphError(f"backward() needs a scalar expression, got shape {self.shape} with batch size "
                             f"{len(self.samples)}: call dy.sum_batches(loss).backward()\n  called at {user_line()}")

    def gradient(self) -> np.ndarray:
        return np.stack([e.gradient() for e in self.samples], axis=-1)

    # --- operators: applied per sample, with DyNet's broadcasting of batch size 1
    def __add__(self, o): return map_samples(operator.add, "operator +", self, o)
    def __radd__(self, o): return map_samples(operator.add, "operator +", o, self)
    def __sub__(self, o): return map_samples(operator.sub, "operator -", self, o)
    def __rsub__(self, o): return map_samples(operator.sub, "operator -", o, self)
    def __mul__(self, o): return map_samples(operator.mul, "operator *", self, o)
    def __rmul__(self, o): return map_samples(operator.mul, "operator *", o, self)
    def __truediv__(self, o): return map_samples(operator.truediv, "operator /", self, o)
    def __rtruediv__(self, o): return map_samples(operator.truediv, "operator /", o, self)
    def __pow__(self, o): return map_samples(operator.pow, "operator **", self, o)
    def __rpow__(self, o): return map_samples(operator.pow, "operator **", o, self)
    def __neg__(self): return BatchedExpression([-e for e in self.samples])
    def __pos__(self): return self

    def __getitem__(self, i):
        return BatchedExpression([e[i] for e in self.samples])


def batched(samples: Sequence) -> Any:
    """The expression for these samples: a BatchedExpression, or the expression itself for one."""
    return samples[0] if len(samples) == 1 else BatchedExpression(samples)


def is_batched(x) -> bool:
    return type(x) is BatchedExpression


def _size_of(x) -> int:
    return len(x.samples) if type(x) is BatchedExpression else 1


def _describe(args) -> str:
    return ", ".join(f"{a.shape} batch {len(a.samples)}" if type(a) is BatchedExpression else
                     f"{a.shape}" if type(a) is Expression else type(a).__name__ for a in args)


def batch_size_of(what: str, args: Sequence) -> int:
    """The common batch size of args: DyNet needs equal batch sizes, or 1 (broadcast)."""
    size = 1
    for a in args:
        b = _size_of(a)
        if b != 1:
            if size not in (1, b):
                raise DynagraphError(f"{what}({_describe(args)}): batch sizes {size} and {b} differ; DyNet "
                                     f"needs equal batch sizes or 1\n  recorded at {user_line()}")
            size = b
    return size


def sample(x, b: int):
    """Sample b of x; an ordinary expression (or a parameter, a number) is every sample."""
    return x.samples[b] if type(x) is BatchedExpression else x


def map_samples(fn: Callable, what: str, *args) -> Any:
    """fn applied to each sample of args (broadcasting batch size 1)."""
    n = batch_size_of(what, args)
    return batched([fn(*[sample(a, b) for a in args]) for b in range(n)])


def map_record(op, args: Sequence, attrs: tuple = (), data: Any = None) -> Any:
    """expression.record(op, args, ...) once per sample: the generic path of every dy.* function."""
    n = batch_size_of(op.name, args)
    return batched([_record(op, [sample(a, b) for a in args], attrs, data) for b in range(n)])


def samples_of(x) -> list:
    """x's samples; an ordinary expression is a batch of one."""
    return list(x.samples) if type(x) is BatchedExpression else [x]
