"""The op registry. An op is defined once: shape rule, forward and backward.

Every forward/backward works on *batches*: each tensor argument arrives with a
leading batch axis of size B, or of size 1 when the argument is shared by the
whole batch (a parameter). The reference backend simply runs batches of one,
so the same code is both the oracle and the batched kernel.

    shape(attrs, *arg_shapes) -> out_shape      raise ValueError on bad input
    check(attrs, data, *arg_shapes)             per-node checks (indices) or None
    forward(xp, attrs, data, *xs) -> y          data: list of per-node payloads
    backward(xp, attrs, data, xs, y, gy, need) -> tuple of grads (None = skip)

A node's *signature* is (op, attrs, per-argument shape or shared-parameter id);
`data` (lookup indices, pick indices, input values, random keys) varies freely
inside a batch because every op consumes it row by row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

OPS: dict[str, "OpDef"] = {}

# Cost classes steer the agenda scheduler's tie-breaking (DyNet defers expensive ops).
CHEAP, ELEMWISE, REDUCE, GEMM = 0, 1, 2, 3


@dataclass(eq=False)
class OpDef:
    name: str
    shape: Callable[..., tuple]
    forward: Callable[..., Any]
    backward: Callable[..., tuple] | None
    check: Callable[..., None] | None = None
    batchable: bool = True
    cost: int = ELEMWISE
    leaf: bool = False          # parameter-like: value bound without a kernel
    uses_data: bool = False     # forward needs the per-node payload list
    blocks_grad: bool = False   # nobackprop: the node never needs a gradient
    saves_ctx: bool = False     # forward returns (y, ctx); backward gets ctx= (static subgraphs)
    inner_kernels: int = 1      # kernels one batch of this op launches (a subgraph runs many)
    # (number of arguments) -> ((weight position, input position), ...): the products W x
    # whose weight gradient is sum_b g_b x_b^T, which autodiff may defer and sum over all
    # batches of a graph as one GEMM (matmul, affine_transform)
    weight_products: Callable[[int], tuple] | None = None
    # argument positions the op can read in place (True: every argument): a per-node matrix
    # gathered from several blocks arrives as the backend's rows_operand (in_place()); a vector
    # is copied (executor._gather_arg: its copy is the cheap part)
    rows_args: tuple | bool = ()
    # (attrs, number of arguments) -> argument positions of shared weights whose gradient the op's
    # backward can hand back as a WeightProduct (G, X) when autodiff passes DEFER in `need` there:
    # products inside the op (lstm_step's W_h h_prev), deferred and summed as weight_products' are
    deferred_weights: Callable[[tuple, int], tuple] | None = None

    def __repr__(self) -> str:
        return f"<op {self.name}>"


def defop(name: str, shape: Callable, forward: Callable, backward: Callable | None, **kw) -> OpDef:
    if name in OPS:
        raise ValueError(f"op {name!r} defined twice")
    op = OpDef(name, shape, forward, backward, **kw)
    OPS[name] = op
    return op


def op(name: str, shape: Callable, **kw):
    """Class decorator: an op is a namespace holding `forward` next to `backward`."""
    def wrap(cls):
        d = cls.__dict__
        return defop(name, shape, d["forward"], d.get("backward"), check=d.get("check"), **kw)
    return wrap


def one_row(x):
    """x as a block of one row, shape (1,) + x.shape, with C strides. x[None] gives the new axis a
    stride of 0, which numpy's contiguity flag ignores but the compiled steps' direct buffer view
    (kernels/cpython/array_view.c) does not take: every export of such a block went through
    numpy's buffer protocol, ~500 instructions, about 45 times per sentence of a CBOW classifier.
    A view, never a copy (a new leading axis of length 1 never needs one)."""
    return x.reshape((1,) + x.shape)


def in_place(x) -> bool:
    """x is a backend's rows operand (OpDef.rows_args): rows of several earlier blocks left
    where they lie, read through a row table (shape, dtype, dense(); see ops/linalg.py)."""
    return getattr(x, "reads_in_place", False)


class _Defer:
    """need[k] for a deferred_weights argument whose gradient autodiff sums at the end of the
    pass (autodiff._mark_deferred): truthy, so code that only asks whether a gradient is
    needed still computes it."""
    __slots__ = ()

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "DEFER"


DEFER = _Defer()


class WeightProduct:
    """A shared weight's gradient sum_b G_b^T X_b not yet summed: G (B, r), X (B, c). autodiff
    adds the pair to the pass's deferred products (one GEMM per parameter at the end)."""
    __slots__ = ("G", "X")

    def __init__(self, G, X):
        self.G, self.X = G, X


class Sliced:
    """Gradient that is zero outside a box of the argument: arg[:, *index] += vals.

    Lets pick_range's backward add into the gate slice of its source instead of
    materialising a zero-filled full-size gradient per slice."""
    __slots__ = ("index", "vals", "shape")

    def __init__(self, index: tuple, vals, shape: tuple):
        self.index, self.vals, self.shape = index, vals, shape

    def dense(self, xp):
        out = xp.zeros(self.shape, dtype=self.vals.dtype)
        out[(slice(None),) + self.index] = self.vals
        return out


class SparseRows:
    """Gradient of a lookup table: rows `idx` receive `vals` (duplicates add up)."""
    __slots__ = ("idx", "vals")

    def __init__(self, idx, vals):
        self.idx, self.vals = idx, vals


# --------------------------------------------------------------------- shape helpers
def as_shape(d) -> tuple:
    """DyNet accepts an int, a list or a tuple for a dimension."""
    if isinstance(d, (int,)) or hasattr(d, "__index__"):
        d = (int(d),)
    d = tuple(int(x) for x in d)
    if not d or any(x <= 0 for x in d):
        raise ValueError(f"invalid dimension {d}: sizes must be positive")
    return d


def size_of(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def same_shape(attrs, x):
    return x


def broadcast_shape(*shapes) -> tuple:
    """DyNet broadcasting: pad with trailing 1s; each dim equal or 1."""
    if shapes.count(shapes[0]) == len(shapes):  # the common case, on the recording hot path
        return shapes[0]
    nd = max(len(s) for s in shapes)
    padded = [tuple(s) + (1,) * (nd - len(s)) for s in shapes]
    out = []
    for dims in zip(*padded):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            raise ValueError(f"shapes {', '.join(map(str, shapes))} cannot be broadcast (dims must match or be 1)")
        out.append(big.pop() if big else 1)
    return tuple(out)


def pad_to(x, nd: int):
    """Append trailing unit axes so a batched array has nd per-node dims."""
    extra = nd - (x.ndim - 1)
    return x.reshape(x.shape + (1,) * extra) if extra > 0 else x


def reduce_to(g, shape: tuple):
    """Sum a broadcast gradient back to an argument's (batched) array shape."""
    if g.shape == shape:
        return g
    nd = len(shape)
    if g.ndim > nd:  # trailing padded axes
        g = g.sum(axis=tuple(range(nd, g.ndim)))
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)
