"""Matrix products. A shared weight (leading axis 1) against a batch of vectors
is a single GEMM, forward and backward: that is where batching pays most."""
from __future__ import annotations

from .base import GEMM, ELEMWISE, broadcast_shape, in_place, one_row, op, pad_to, reduce_to


def _as_matrix(s: tuple) -> tuple:
    if len(s) == 1:
        return (s[0], 1)
    if len(s) == 2:
        return s
    raise ValueError(f"matrix product needs vectors or matrices, got shape {s}")


def mm_shape(a, sa, sx):
    ma, mx = _as_matrix(sa), _as_matrix(sx)
    if ma[1] != mx[0]:
        raise ValueError(f"inner dimensions differ: {sa} * {sx} ({ma[1]} != {mx[0]})")
    return (ma[0],) if len(sx) == 1 else (ma[0], mx[1])


def mm(xp, A, X):
    """A: (La, r[, c]) ; X: (Lx, c) batched vectors or (Lx, c, k) batched matrices."""
    if A.ndim == 2:
        A = A[:, :, None]
    if X.ndim == 2:
        if A.shape[0] == 1:
            return X @ A[0].T
        return xp.matmul(A, X[:, :, None])[:, :, 0]
    if A.shape[2] == 1:
        # inner dimension 1, an outer product: one multiply per entry, the same as matmul's.
        # numpy's matmul runs its own loop there, not BLAS, at any strides: 3.9 us against
        # 2.0 for broadcasting (64, 1) x (1, 15)
        return A * X
    if A.shape[0] == 1 and X.shape[0] > 1:
        # one shared matrix against a stack: matmul broadcasts it without a copy and
        # writes a contiguous (L, r, k) result; a flattened (c, L*k) GEMM needs two
        # transposing copies and was 2.3-2.7x slower (MV-RNN's (64, 128) x 375 (128, 64))
        return xp.matmul(A[0], X)
    return xp.matmul(A, X)


_CHUNK = 16  # stacked products per GEMM in _sum_of_products: the operands stay in cache


def _sum_of_products(xp, G, X):
    """sum_b G_b X_b^T for stacks G (L, r, k) and X (L, c, k), as (1, r, c): a shared
    matrix's gradient over a batch of matrix products. Chunks of the stack are laid side
    by side, (c, n*k) @ (n*k, r) = (sum_b X_b G_b^T)^T, so each GEMM is large and its copies
    small and cached; in this orientation both GEMM operands are plain row-major (no
    transposed operand), 7% faster than (r, n*k) @ (c, n*k)^T (MV-RNN, 1,118 products)."""
    L, r, k = G.shape
    c = X.shape[1]
    out = None
    for i in range(0, L, _CHUNK):
        g, x = G[i:i + _CHUNK], X[i:i + _CHUNK]
        n = g.shape[0]
        xs, gs = x.transpose(1, 0, 2).reshape(c, n * k), g.transpose(0, 2, 1).reshape(n * k, r)
        p = xs * gs if n * k == 1 else xs @ gs  # one term: an outer product (see mm)
        if out is None:
            out = p
        else:
            out += p
    return one_row(xp.ascontiguousarray(out.T))


def mm_grads(xp, A, X, G, need):
    """Gradients of mm; a shared A gets dA = sum_b G_b X_b^T already summed (one GEMM
    against a batch of vectors, chunked GEMMs against a stack of matrices)."""
    A3 = A[:, :, None] if A.ndim == 2 else A
    if A.shape[0] == 1 and X.shape[0] == 1 and G.shape[0] > 1:
        G = G.sum(axis=0, keepdims=True)  # every node computed the same product
    gA = gX = None
    if X.ndim == 2:
        if need[0]:
            gA = one_row(G.T @ X) if A3.shape[0] == 1 else G[:, :, None] * X[:, None, :]
        if need[1]:
            gX = G @ A3[0] if A3.shape[0] == 1 else xp.matmul(A3.transpose(0, 2, 1), G[:, :, None])[:, :, 0]
    else:
        if need[0]:
            if A3.shape[0] == 1:
                gA = _sum_of_products(xp, G, X)
            else:
                gA = xp.matmul(G, X.transpose(0, 2, 1))
        if need[1]:
            gX = mm(xp, A3.transpose(0, 2, 1), G)
    if gA is not None:
        gA = reduce_to(gA.reshape(gA.shape[0], *A.shape[1:]) if A.ndim == 2 else gA, A.shape)
    if gX is not None:
        gX = reduce_to(gX, X.shape)
    return gA, gX


def _matmul_products(n_args: int) -> tuple:
    return ((0, 1),)


def _affine_products(n_args: int) -> tuple:
    return tuple((i, i + 1) for i in range(1, n_args, 2))


@op("matmul", mm_shape, cost=GEMM, weight_products=_matmul_products, rows_args=(0,))
class MatMul:
    """A x. Per-sample matrices A from several blocks (MV-RNN's A[r] * a[l]: a lookup
    table's rows and earlier outputs) may arrive as a rows operand: the products read
    each A_j in place and the backward adds g_j x_j^T into A's gradient rows in place
    (no (B, r, c) copy either way); a case its kernel does not cover takes the dense
    copy, the gather the executor would otherwise have made."""
    def forward(xp, a, data, A, X):
        if in_place(A):
            y = A.matvec(X)
            if y is not None:
                return y
            A = A.dense()
        return mm(xp, A, X)

    def backward(xp, a, data, xs, y, g, need):
        A, X = xs
        if in_place(A):
            grads = A.matvec_grads(X, g, need)
            if grads is not None:
                return grads
            A = A.dense()
        return mm_grads(xp, A, X, g, need)


def _affine_shape(a, sb, *rest):
    if len(rest) % 2:
        raise ValueError("affine_transform takes [b, W1, x1, W2, x2, ...]")
    prod = None
    for i in range(0, len(rest), 2):
        p = mm_shape(a, rest[i], rest[i + 1])
        if prod is not None and p != prod:
            raise ValueError(f"products have different shapes {prod} and {p}")
        prod = p
    if prod is None or prod == sb:
        return sb
    return broadcast_shape(sb, prod)


@op("affine", _affine_shape, cost=GEMM, weight_products=_affine_products)
class Affine:
    """b + W1 x1 + W2 x2 + ...: one GEMM per (shared W, batch of x)."""
    def forward(xp, a, data, b, *wx):
        y = None
        for i in range(0, len(wx), 2):
            p = mm(xp, wx[i], wx[i + 1])
            if y is None:
                y = p
            elif y.shape == p.shape:
                y += p  # y is a fresh product: accumulate in place
            else:
                y = y + p
        if y is None:  # affine_transform([b])
            return b.copy()
        nd = max(y.ndim, b.ndim) - 1
        y, b = pad_to(y, nd), pad_to(b, nd)
        # y += b where b broadcasts into y; the common cases decided without broadcast_shapes (~3 us)
        if (b.shape[1:] == y.shape[1:] and b.shape[0] in (1, y.shape[0])) \
                or y.shape == xp.broadcast_shapes(y.shape, b.shape):
            y += b
            return y
        return y + b

    def backward(xp, a, data, xs, y, g, need):
        b, wx = xs[0], xs[1:]
        out = [reduce_to(g, b.shape) if need[0] else None]
        if wx:
            p = mm_shape(None, wx[0].shape[1:], wx[1].shape[1:])
            gp = reduce_to(g, (g.shape[0],) + p)
            for i in range(0, len(wx), 2):
                out += mm_grads(xp, wx[i], wx[i + 1], gp, need[1 + i:3 + i])
        return tuple(out)


def _dot_shape(a, sx, sy):
    if sx != sy:
        raise ValueError(f"dot_product needs equal shapes, got {sx} and {sy}")
    return (1,)


@op("dot_product", _dot_shape, cost=ELEMWISE)
class DotProduct:
    def forward(xp, a, data, x, y):
        p = x * y
        return p.reshape(p.shape[0], -1).sum(axis=1, keepdims=True)

    def backward(xp, a, data, xs, out, g, need):
        x, y = xs
        gg = g.reshape((g.shape[0],) + (1,) * (x.ndim - 1))
        return (reduce_to(gg * y, x.shape) if need[0] else None,
                reduce_to(gg * x, y.shape) if need[1] else None)


def _transpose_shape(a, s):
    dims = a[0]
    if sorted(dims) != list(range(len(dims))) or len(s) > len(dims):
        raise ValueError(f"transpose dims {list(dims)} do not fit shape {s}")
    padded = tuple(s) + (1,) * (len(dims) - len(s))
    return tuple(padded[d] for d in dims)


@op("transpose", _transpose_shape, cost=ELEMWISE)
class Transpose:
    def forward(xp, a, data, x):
        dims = a[0]
        x = pad_to(x, len(dims))
        return x.transpose((0,) + tuple(d + 1 for d in dims))

    def backward(xp, a, data, xs, y, g, need):
        dims = a[0]
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        return (g.transpose((0,) + tuple(d + 1 for d in inv)).reshape(g.shape[:1] + xs[0].shape[1:]),)


def _colwise_shape(a, sx, sb):
    if len(sx) != 2 or sb not in ((sx[0],), (sx[0], 1)):
        raise ValueError(f"colwise_add needs a matrix (r, c) and a vector (r,), got {sx} and {sb}")
    return sx


@op("colwise_add", _colwise_shape)
class ColwiseAdd:
    def forward(xp, a, data, x, b):
        return x + b.reshape(b.shape[0], -1, 1)

    def backward(xp, a, data, xs, y, g, need):
        x, b = xs
        gb = reduce_to(g.sum(axis=2), (g.shape[0], b.shape[1])).reshape(-1, *b.shape[1:]) if need[1] else None
        return (reduce_to(g, x.shape) if need[0] else None,
                reduce_to(gb, b.shape) if gb is not None else None)
