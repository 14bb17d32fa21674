"""Error types that point at the user's line, not at dynagraph's internals."""
from __future__ import annotations

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


def op_error(kind: type, op: str, shapes, msg: str) -> DynagraphError:
    shp = ", ".join(str(tuple(s)) for s in shapes)
    return kind(f"{op}({shp}): {msg}\n  recorded at {user_line()}")
