"""Reshaping, slicing, picking and reductions."""
from __future__ import annotations

from .base import CHEAP, REDUCE, Sliced, in_place, op, pad_to, reduce_to, size_of


def _bcast_lead(xp, x, n):
    return x if x.shape[0] == n else xp.broadcast_to(x, (n,) + x.shape[1:])


# ------------------------------------------------------------------- reshape (column-major)
def _fortran_flat(x):
    nd = x.ndim - 1
    return x.transpose((0,) + tuple(range(nd, 0, -1))).reshape(x.shape[0], -1)


def _fortran_unflat(flat, shape):
    nd = len(shape)
    return flat.reshape((flat.shape[0],) + tuple(reversed(shape))).transpose((0,) + tuple(range(nd, 0, -1)))


def _reshape_shape(a, s):
    if size_of(a[0]) != size_of(s):
        raise ValueError(f"cannot reshape {s} ({size_of(s)} elements) to {a[0]} ({size_of(a[0])} elements)")
    return a[0]


@op("reshape", _reshape_shape, cost=CHEAP)
class Reshape:
    """DyNet stores column-major, so reshape follows Fortran order."""
    def forward(xp, a, data, x):
        return _fortran_unflat(_fortran_flat(x), a[0])

    def backward(xp, a, data, xs, y, g, need):
        return (_fortran_unflat(_fortran_flat(g), xs[0].shape[1:]),)


# --------------------------------------------------------------------------- concatenate
def _concat_shape(a, *shapes):
    d = a[0]
    nd = max(max(len(s) for s in shapes), d + 1)
    padded = [tuple(s) + (1,) * (nd - len(s)) for s in shapes]
    rest = {p[:d] + p[d + 1:] for p in padded}
    if len(rest) > 1:
        raise ValueError(f"shapes {', '.join(map(str, shapes))} differ outside dimension {d}")
    out = list(padded[0])
    out[d] = sum(p[d] for p in padded)
    return tuple(out)


def _concat_in_place(xp, d: int, xs: tuple):
    """The concatenation written part by part; a part left in place by the backend (rows of
    several blocks, OpDef.rows_args) is copied straight into its slice, not gathered first.
    None where the parts need padding or broadcasting (the general path)."""
    x0 = xs[0]
    B, nd = x0.shape[0], len(x0.shape)
    if nd < d + 2 or any(len(x.shape) != nd or x.shape[0] != B or x.shape[1:d + 1] != x0.shape[1:d + 1]
                         or x.shape[d + 2:] != x0.shape[d + 2:] for x in xs):
        return None
    y = xp.empty(x0.shape[:d + 1] + (sum(x.shape[d + 1] for x in xs),) + x0.shape[d + 2:], dtype=x0.dtype)
    start = 0
    for x in xs:
        w = x.shape[d + 1]
        dst = y[(slice(None),) * (d + 1) + (slice(start, start + w),)]
        if in_place(x):
            x.copy_into(dst)
        else:
            dst[...] = x
        start += w
    return y


@op("concatenate", _concat_shape, cost=CHEAP, rows_args=True)
class Concatenate:
    """Per-sample matrices from several blocks (MV-RNN's concatenate([A, B])) may arrive as
    rows operands: each is copied once, into its slice of the output."""
    def forward(xp, a, data, *xs):
        d = a[0]
        if any(in_place(x) for x in xs):
            y = _concat_in_place(xp, d, xs)
            if y is not None:
                return y
            xs = tuple(x.dense() if in_place(x) else x for x in xs)
        x0 = xs[0]
        if x0.ndim == d + 2 and all(x.ndim == x0.ndim and x.shape[0] == x0.shape[0] for x in xs):
            return xp.concatenate(xs, axis=d + 1)  # nothing to pad or broadcast (the common case)
        nd = max(max(x.ndim - 1 for x in xs), d + 1)
        lead = max(x.shape[0] for x in xs)
        return xp.concatenate([_bcast_lead(xp, pad_to(x, nd), lead) for x in xs], axis=d + 1)

    def backward(xp, a, data, xs, y, g, need):
        d, out, start = a[0], [], 0
        nd = g.ndim - 1
        for x, n in zip(xs, need):
            padded = tuple(x.shape) + (1,) * (nd + 1 - len(x.shape))  # pad_to's shape, without x's data
            w = padded[d + 1]
            if n:
                sl = g[(slice(None),) * (d + 1) + (slice(start, start + w),)]
                out.append(reduce_to(sl, padded).reshape(x.shape))
            else:
                out.append(None)
            start += w
        return tuple(out)


# ----------------------------------------------------------------- pick_range / select
def _pick_range_shape(a, s):
    start, end, d = a
    if d >= len(s) and not (start == 0 and end == 1):
        raise ValueError(f"dimension {d} out of range for shape {s}")
    n = s[d] if d < len(s) else 1
    if not 0 <= start < end <= n:
        raise ValueError(f"range [{start}, {end}) is invalid for dimension {d} of size {n}")
    out = list(s) + [1] * (d + 1 - len(s))
    out[d] = end - start
    return tuple(out)


@op("pick_range", _pick_range_shape, cost=CHEAP)
class PickRange:
    def forward(xp, a, data, x):
        start, end, d = a
        x = pad_to(x, d + 1)
        return x[(slice(None),) * (d + 1) + (slice(start, end),)]

    def backward(xp, a, data, xs, y, g, need):
        start, end, d = a
        if xs[0].ndim > d + 1 and xs[0].shape[0] == g.shape[0]:
            return (Sliced((slice(None),) * d + (slice(start, end),), g, xs[0].shape),)
        x = pad_to(xs[0], d + 1)
        gx = xp.zeros(g.shape[:1] + x.shape[1:], dtype=g.dtype)
        gx[(slice(None),) * (d + 1) + (slice(start, end),)] = g
        return (reduce_to(gx, x.shape).reshape(xs[0].shape),)


def _select_shape(a, s):
    idx, d = a
    padded = tuple(s) + (1,) * (d + 1 - len(s))
    if not idx:
        raise ValueError("empty index list")
    bad = [i for i in idx if not 0 <= i < padded[d]]
    if bad:
        raise IndexError(f"indices {bad} out of range for dimension {d} of size {padded[d]}")
    out = list(padded)
    out[d] = len(idx)
    return tuple(out)


@op("select", _select_shape, cost=CHEAP)
class Select:
    """select_rows (d=0) and select_cols (d=1)."""
    def forward(xp, a, data, x):
        idx, d = a
        return xp.take(pad_to(x, d + 1), xp.asarray(idx), axis=d + 1)

    def backward(xp, a, data, xs, y, g, need):
        idx, d = a
        x = pad_to(xs[0], d + 1)
        gx = xp.zeros(g.shape[:1] + x.shape[1:], dtype=g.dtype)
        moved = xp.moveaxis(gx, d + 1, 0)
        xp.add.at(moved, xp.asarray(idx), xp.moveaxis(g, d + 1, 0))
        return (reduce_to(gx, x.shape).reshape(xs[0].shape),)


# ------------------------------------------------------------------------- pick
def _drop_dim(s, d):
    out = tuple(s[:d]) + tuple(s[d + 1:])
    return out if out else (1,)


def _pick_shape(a, s):
    d = a[0]
    if d >= len(s) and d != 0:
        raise ValueError(f"dimension {d} out of range for shape {s}")
    return _drop_dim(s, d)


def _pick_check(a, index, s):
    d = a[0]
    n = s[d] if d < len(s) else 1
    if not 0 <= index < n:
        raise IndexError(f"index {index} out of range for dimension {d} of size {n}")


@op("pick", _pick_shape, cost=CHEAP, uses_data=True)
class Pick:
    """The picked index is per node (data), so nodes picking different entries batch."""
    check = _pick_check

    def forward(xp, a, data, x):
        d, n = a[0], len(data)
        x = _bcast_lead(xp, x, n)
        moved = xp.moveaxis(pad_to(x, d + 1), d + 1, 1)
        return moved[xp.arange(n), xp.asarray(data)].reshape((n,) + _drop_dim(x.shape[1:], d))

    def backward(xp, a, data, xs, y, g, need):
        d, x, n = a[0], xs[0], len(data)
        gx = xp.zeros((n,) + pad_to(x, d + 1).shape[1:], dtype=g.dtype)
        moved = xp.moveaxis(gx, d + 1, 1)
        moved[xp.arange(n), xp.asarray(data)] = g.reshape((n,) + moved.shape[2:])
        return (reduce_to(gx.reshape((n,) + x.shape[1:]), x.shape),)


# ---------------------------------------------------------------------- reductions
def _scalar_shape(a, s):
    return (1,)


@op("sum_elems", _scalar_shape, cost=REDUCE)
class SumElems:
    def forward(xp, a, data, x):
        return x.reshape(x.shape[0], -1).sum(axis=1, keepdims=True)

    def backward(xp, a, data, xs, y, g, need):
        # Lead axis from g: a shared argument (lead 1) gets one row per node; scatter sums them.
        shape = g.shape[:1] + xs[0].shape[1:]
        return (xp.broadcast_to(g.reshape((-1,) + (1,) * (xs[0].ndim - 1)), shape).copy(),)


@op("mean_elems", _scalar_shape, cost=REDUCE)
class MeanElems:
    def forward(xp, a, data, x):
        return x.reshape(x.shape[0], -1).mean(axis=1, keepdims=True)

    def backward(xp, a, data, xs, y, g, need):
        n = size_of(xs[0].shape[1:])
        return (SumElems.backward(xp, a, data, xs, y, g / n, need)[0],)


def _dims_shape(a, s):
    dims = a[0]
    if not dims or any(not 0 <= d < len(s) for d in dims):
        raise ValueError(f"dimensions {list(dims)} out of range for shape {s}")
    out = tuple(n for i, n in enumerate(s) if i not in dims)
    return out if out else (1,)


def _axes(a):
    return tuple(d + 1 for d in a[0])


@op("sum_dim", _dims_shape, cost=REDUCE)
class SumDim:
    def forward(xp, a, data, x):
        return x.sum(axis=_axes(a)).reshape((x.shape[0],) + _dims_shape(a, x.shape[1:]))

    def backward(xp, a, data, xs, y, g, need):
        x = xs[0]
        keep = tuple(1 if i + 1 in _axes(a) else n for i, n in enumerate(x.shape[1:]))
        return (xp.broadcast_to(g.reshape((g.shape[0],) + keep), g.shape[:1] + x.shape[1:]).copy(),)


@op("mean_dim", _dims_shape, cost=REDUCE)
class MeanDim:
    def forward(xp, a, data, x):
        n = size_of(tuple(x.shape[d] for d in _axes(a)))
        return SumDim.forward(xp, a, data, x) / n

    def backward(xp, a, data, xs, y, g, need):
        n = size_of(tuple(xs[0].shape[d] for d in _axes(a)))
        return SumDim.backward(xp, a, data, xs, y, g / n, need)


def _extreme_shape(a, s):
    d = a[0]
    if d >= len(s):
        raise ValueError(f"dimension {d} out of range for shape {s}")
    return _drop_dim(s, d)


def _extreme(name, pick_fn):
    @op(name, _extreme_shape, cost=REDUCE)
    class Extreme:
        def forward(xp, a, data, x):
            y = getattr(x, pick_fn)(axis=a[0] + 1)
            return y.reshape((x.shape[0],) + _extreme_shape(a, x.shape[1:]))

        def backward(xp, a, data, xs, y, g, need):
            x, ax = _bcast_lead(xp, xs[0], g.shape[0]), a[0] + 1
            win = getattr(x, "arg" + pick_fn)(axis=ax)
            gx = xp.zeros(x.shape, dtype=g.dtype)
            xp.put_along_axis(gx, xp.expand_dims(win, ax), xp.expand_dims(g.reshape(win.shape), ax), axis=ax)
            return (gx,)
    return Extreme


MAX_DIM = _extreme("max_dim", "max")
MIN_DIM = _extreme("min_dim", "min")


# ------------------------------------------------------------------- argmax
def _argmax_shape(a, x):
    if len(x) != 1:
        raise ValueError(f"argmax works on vectors (as DyNet's), got shape {x}")
    return x


@op("argmax", _argmax_shape, cost=REDUCE)
class Argmax:
    """DyNet's argmax(x, gradient_mode): the one-hot vector of x's first maximum.
    attrs = (straight_through,): 'straight_through_gradient' passes the gradient unchanged,
    'zero_gradient' (the derivative almost everywhere) passes zero."""
    def forward(xp, a, data, x):
        first = x.argmax(axis=1)  # ties go to the first maximum, as in DyNet
        return (xp.arange(x.shape[1])[None, :] == first[:, None]).astype(x.dtype)

    def backward(xp, a, data, xs, y, g, need):
        return (g if a[0] else xp.zeros_like(xs[0]),)
