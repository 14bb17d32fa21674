"""Error types that point at the user's line, not at dynagraph's internals."""
from __future__ import annotations

import operator
import os
import sys

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def user_line() -> str:
    """'file:line' of the innermost stack frame outside the dynagraph package."""
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno}"


class DynagraphError(ValueError):
    """Raised when recording an op with bad arguments. Names the op, shapes and user line."""


class ShapeError(DynagraphError):
    pass


class DynagraphIndexError(DynagraphError, IndexError):
    pass


class StaleExpressionError(DynagraphError, RuntimeError):
    pass


class NonFiniteError(DynagraphError, FloatingPointError):
    pass


class CheckpointError(DynagraphError):
    """A parameter or model file that is corrupt, hostile, or does not fit the collection."""


def op_error(kind: type, op: str, shapes, msg: str) -> DynagraphError:
    shp = ", ".join(str(tuple(s)) for s in shapes)
    return kind(f"{op}({shp}): {msg}\n  recorded at {user_line()}")


def as_index(i, what: str) -> int:
    """An index, dimension or range bound given to `what`: any integer (numpy's too),
    never a float, bool or string silently truncated."""
    if type(i) is int:
        return i
    if not isinstance(i, bool) and type(i).__name__ != "bool_":
        try:
            return operator.index(i)
        except TypeError:
            pass
    raise TypeError(f"{what}: indices must be integers (int or numpy integer), got "
                    f"{type(i).__name__} {i!r}\n  recorded at {user_line()}")
