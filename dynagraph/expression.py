"""Expression, the handle to one recorded node, and record(): how a user's call becomes a node
of a ComputationGraph (its arguments checked and named in errors, parameters bound as leaves,
lookups on their short path). The dy.* functions built on record() are in expressions.py.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import parameters as _params
from .backends import to_numpy
from .errors import DynagraphError, DynagraphIndexError, StaleExpressionError, as_index, user_line
from .graph import _RANDOM_KEY, GRAPH_STATE, ComputationGraph, IndexSlot, current, draw_rand_base
from .ops import OPS, OpDef
from .ops.inputs import LOOKUP_TABLE, PARAMETER
from .parameters import LookupParameters, Parameters
from .recording import (COMPILED, ONE, TWO, ExprBase, configure, leaf_recorder, operators, plain_expression_type,
                        recorder)

_LOOKUP = OPS["lookup"]
_INPUT, _PICK = OPS["input"], OPS["pick"]
_ADD, _ADDC, _SUB, _RSUBC, _MULC, _MATMUL, _CDIV, _RDIVC, _NEG, _POWC, _POW = (
    OPS[n] for n in ("add", "addc", "sub", "rsubc", "mulc", "matmul", "cdiv", "rdivc", "neg", "powc", "pow"))


class Expression(ExprBase):
    """A handle to one node of one graph: Expression(cg, i). Cheap: two fields, in ExprBase."""
    __slots__ = ()

    # --- values (DyNet semantics)
    def forward(self, recalculate: bool = False):
        if recalculate:
            self.cg.invalidate()
        self.cg.forward_to(self.i)
        return self

    def npvalue(self, recalculate: bool = False) -> np.ndarray:
        self.forward(recalculate)
        return np.array(to_numpy(self.cg.value(self.i)), dtype=self.cg.dtype).reshape(self.cg.shape[self.i])

    def value(self, recalculate: bool = False):
        cg, i = self.cg, self.i
        if cg.shape[i] == (1,) and not recalculate:  # a loss: one float, without the array copy
            cg.forward_to(i)
            v = cg.host_scalar(i)
            return v if v is not None else float(to_numpy(cg.value(i)).reshape(-1)[0])
        v = self.npvalue(recalculate)
        if v.shape == (1,):
            return float(v[0])
        if v.ndim == 1:
            return v.tolist()
        return v

    def scalar_value(self, recalculate: bool = False) -> float:
        v = self.npvalue(recalculate)
        if v.size != 1:  # DyNet aborts the process here
            raise DynagraphError(f"scalar_value() of an expression of shape {v.shape}\n  at {user_line()}")
        return float(v.reshape(-1)[0])

    def __float__(self) -> float:
        return self.scalar_value()

    def vec_value(self, recalculate: bool = False) -> list:
        """Flattened in DyNet's column-major order."""
        return self.npvalue(recalculate).flatten(order="F").tolist()

    def tensor_value(self, recalculate: bool = False) -> np.ndarray:
        return self.npvalue(recalculate)

    def backward(self, full: bool = False) -> None:
        self.cg.backward(self, full)

    def set(self, value) -> None:
        """DyNet's set() on an input (new values, same shape; vecInput/matInput take DyNet's
        column-major list) or a lookup (a new row index). The next evaluation recomputes
        this node and the nodes computed from it; nothing else."""
        cg, op = self.cg, self.cg.op[self.i]
        if op is _INPUT:
            shape = cg.shape[self.i]
            a = np.asarray(value, dtype=np.float64)
            if a.size != int(np.prod(shape)):
                raise DynagraphError(f"set(): {a.size} values for an input of shape {shape}\n  at {user_line()}")
            a = a.reshape(shape, order="F") if a.shape != shape else a.copy()
            if not np.isfinite(a).all():
                raise DynagraphError(f"set(): the values contain NaN or inf\n  at {user_line()}")
            cg.set_data(self.i, a)
        elif op is _LOOKUP or op is _PICK:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"set(): {op.name} index must be an int, got {type(value).__name__} "
                                f"(at {user_line()})")
            cg.set_data(self.i, int(value))
        else:
            raise DynagraphError(f"set() works on inputs and lookups, not on a {op.name} expression"
                                 f"\n  at {user_line()}")

    set_index = set  # DyNet's pick(...).set_index(i)

    def gradient(self) -> np.ndarray:
        return self.cg.gradient(self.i)

    def dim(self) -> tuple:
        return (self.cg.shape[self.i], 1)

    @property
    def shape(self) -> tuple:
        return self.cg.shape[self.i]

    def __repr__(self) -> str:
        return f"expression {self.i}/{self.cg.version} {self.cg.op[self.i].name} {self.cg.shape[self.i]}"

    # --- operators (DyNet: `*` between expressions is a matrix product). +, - and * are C slots of
    # ExprBase when compiled (kernels/cpython/expr_recorder.c); these methods are their twins.
    # A BatchedExpression (DyNet's minibatch dimension) on the right: return NotImplemented so
    # its reflected operator maps over the samples. Checked only after the fast paths fail.
    def _add(self, o):
        if type(o) is Expression:  # the common case first: it is on every model's hot path
            return record2(_ADD, self, o)
        if _is_number(o):
            return record1(_ADDC, self, (float(o),))
        if getattr(o, "_dy_batched", False):
            return NotImplemented
        return record2(_ADD, self, o)

    def _radd(self, o):
        return _binary_or_const(o, self, "add", "addc", 1.0)

    def _sub(self, o):
        if type(o) is Expression:
            return record2(_SUB, self, o)
        if _is_number(o):
            return record1(_ADDC, self, (-float(o),))
        if getattr(o, "_dy_batched", False):
            return NotImplemented
        return record2(_SUB, self, o)

    def _rsub(self, o):
        if _is_number(o):
            return record1(_RSUBC, self, (float(o),))
        return record2(_SUB, o, self)

    def _mul(self, o):
        if type(o) is Expression:
            return record2(_MATMUL, self, o)
        if _is_number(o):
            return record1(_MULC, self, (float(o),))
        if getattr(o, "_dy_batched", False):
            return NotImplemented
        return record2(_MATMUL, self, o)

    def _rmul(self, o):
        if _is_number(o):
            return record1(_MULC, self, (float(o),))
        return record2(_MATMUL, o, self)

    if not COMPILED:  # compiled: ExprBase's C slots, which call _operator(...) below for the rest
        __add__, __radd__, __sub__, __rsub__, __mul__, __rmul__ = _add, _radd, _sub, _rsub, _mul, _rmul

    def __truediv__(self, o):
        if type(o) is Expression:
            return record2(_CDIV, self, o)
        if _is_number(o):
            return record1(_MULC, self, (1.0 / float(o),))  # DyNet: x * (1/y)
        if getattr(o, "_dy_batched", False):
            return NotImplemented
        return record2(_CDIV, self, o)

    def __rtruediv__(self, o):
        if _is_number(o):
            return record1(_RDIVC, self, (float(o),))
        return record2(_CDIV, o, self)

    def __neg__(self):
        return record1(_NEG, self)

    def __pos__(self):
        return self

    def __pow__(self, o):
        if type(o) is Expression:
            return record2(_POW, self, o)
        if _is_number(o):
            return record1(_POWC, self, (float(o),))
        if getattr(o, "_dy_batched", False):
            return NotImplemented
        return record2(_POW, self, o)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return record1(OPS["pick_range"], self, _slice_range(i, self.cg.shape[self.i][0]))
        if type(i) is IndexSlot:
            return record1(OPS["pick"], self, (0,), i)
        i = as_index(i, "expression[i] (i an int or a slice)")
        if i < 0:  # DyNet counts negative indices from the end
            i += self.cg.shape[self.i][0]
        return record1(OPS["pick"], self, (0,), i)

    __array_priority__ = 1000  # numpy scalars on the left defer to our operators


Expression = plain_expression_type(Expression)  # noqa: F811 (the same class, not tracked by the collector)


def _operator(forward: str, reflected: str):
    """The Python twin of a compiled operator slot: called as slot(a, b) for `a op b`, where
    either operand is the Expression (b when Python tried a's type first)."""
    def twin(a, b):
        if isinstance(a, Expression):
            return getattr(a, forward)(b)
        return getattr(b, reflected)(a)
    return twin


def _record1(op: OpDef, x, attrs: tuple = (), data: Any = None) -> Expression:
    return record(op, (x,), attrs, data)


def _record2(op: OpDef, x, y, attrs: tuple = ()) -> Expression:
    return record(op, (x, y), attrs)


# record1(op, x, attrs=(), data=None), record2(op, x, y, attrs=()): record() for one or two
# arguments, with the fast path (live Expressions of one graph) compiled when available.
record1 = recorder(None, ONE, _record1)
record2 = recorder(None, TWO, _record2)


def _is_number(o) -> bool:
    return isinstance(o, (int, float, np.integer, np.floating)) and not isinstance(o, bool)


def _binary_or_const(x, y, op_name: str, const_name: str, sign: float):
    if _is_number(y):
        return record1(OPS[const_name], x, (sign * float(y),))
    if _is_number(x):
        return record1(OPS[const_name], y, (sign * float(x),))
    return record2(OPS[op_name], x, y)


# --------------------------------------------------------------------- recording API
def _arg_id(cg: ComputationGraph, a) -> int:
    if type(a) is Expression:
        if a.cg is cg:
            if cg.retired:
                raise StaleExpressionError(
                    f"stale expression: it belongs to graph version {cg.version}, which renew_cg() retired")
            return a.i
        if a.cg.retired:
            raise StaleExpressionError(f"stale expression: it was created before renew_cg() "
                                       f"(graph version {a.cg.version}, current {current().version})")
        raise DynagraphError(f"expressions from two different ComputationGraphs "
                             f"(versions {a.cg.version} and {cg.version}) cannot be combined")
    if isinstance(a, (Parameters, LookupParameters)):
        return cg.leaf(a)
    if isinstance(a, np.ndarray):
        raise TypeError(f"expected an Expression or Parameters, got a numpy array of shape {a.shape}: "
                        f"wrap it with dy.inputTensor()")
    raise TypeError(f"expected an Expression or Parameters, got {type(a).__name__}")


def _describe(args) -> str:
    """Argument shapes for an error message, whatever the arguments are."""
    return ", ".join(str(a.cg.shape[a.i]) if type(a) is Expression else
                     f"ndarray{a.shape}" if isinstance(a, np.ndarray) else type(a).__name__ for a in args)


def record(op: OpDef, args: Sequence = (), attrs: tuple = (), data: Any = None) -> Expression:
    """Append one node to the graph of its arguments (or the current graph)."""
    cg = None
    for a in args:
        if type(a) is Expression:
            cg = a.cg
            break
    if cg is None:
        cg = current()
    if not cg.retired:  # the common case: live expressions of this graph, no checks to report
        ids = []
        for a in args:
            if type(a) is not Expression or a.cg is not cg:
                break
            ids.append(a.i)
        else:
            return Expression(cg, cg.add(op, tuple(ids), attrs, data))
    try:
        if cg.retired:
            raise StaleExpressionError(f"stale expression: it belongs to graph version {cg.version}, "
                                       f"which renew_cg() retired")
        ids = tuple([a.i if type(a) is Expression and a.cg is cg else _arg_id(cg, a) for a in args])
    except (DynagraphError, TypeError) as e:
        raise type(e)(f"{op.name}({_describe(args)}): {e}\n  recorded at {user_line()}") from None
    return Expression(cg, cg.add(op, ids, attrs, data))



def _expression_of(p, update: bool = True, lookup=None, graph=None) -> Expression:
    cg = graph if graph is not None else current()
    if lookup is None:
        return Expression(cg, cg.leaf(p, update))
    return lookup_in(cg, p, lookup, update)


def lookup_in(cg: ComputationGraph, p, index, update: bool = True) -> Expression:
    """E[i] without the general record() path: lookups are a model's most frequent leaf."""
    if cg.retired:
        raise StaleExpressionError(f"lookup: the graph was retired by renew_cg()\n  at {user_line()}")
    leaf = cg._leaves.get(p if update else (p, False))
    if leaf is None:
        leaf = cg.leaf(p, update)
    return Expression(cg, cg.add(_LOOKUP, (leaf,), (), index if type(index) is int else _index(index)))


def _index(i) -> int:
    if type(i) is IndexSlot:
        return i
    return as_index(i, "lookup")


def _slice_range(sl: slice, n: int) -> tuple:
    """pick_range attributes of x[start:stop] on a length-n vector. Negative bounds count
    from the end (as in Python and DyNet); bounds past the end raise instead of being
    clamped, since a clamped slice silently changes the shape the program expects."""
    if sl.step not in (None, 1):
        raise DynagraphError(f"pick_range: slices with a step are not supported\n  at {user_line()}")
    start = 0 if sl.start is None else as_index(sl.start, "pick_range")
    stop = n if sl.stop is None else as_index(sl.stop, "pick_range")
    start, stop = start + n if start < 0 else start, stop + n if stop < 0 else stop
    if not 0 <= start < stop <= n:
        raise DynagraphIndexError(f"pick_range: slice [{sl.start}:{sl.stop}] is out of range (or empty) for a "
                                  f"vector of size {n}\n  recorded at {user_line()}")
    return (start, stop, 0)


configure(Expression, IndexSlot, _RANDOM_KEY, draw_rand_base)
operators(_ADD, _ADDC, _SUB, _RSUBC, _MATMUL, _MULC, _operator("_add", "_radd"), _operator("_sub", "_rsub"),
          _operator("_mul", "_rmul"))
# expression_of(p, update=True, lookup=None, graph=None): _expression_of, compiled for the
# common case (the parameter already has its leaf in the graph)
expression_of = leaf_recorder(_expression_of, GRAPH_STATE, _LOOKUP, PARAMETER, LOOKUP_TABLE)
_params.expression_hook = expression_of
