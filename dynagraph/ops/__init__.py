"""Every op, defined once. Import order does not matter; names must be unique."""
from .base import OPS, OpDef, SparseRows, as_shape, size_of  # noqa: F401
from . import elementwise, linalg, shape, loss, inputs, conv, special, cells  # noqa: F401
