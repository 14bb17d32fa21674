"""Matrix products, affine transforms, dot products, transposes, colwise_add."""
from __future__ import annotations

import numpy as np

import dynagraph as dy
from opcases import A, Case


def _mm(cid, xs, ys, ref=lambda W, x: W @ x):
    return Case(cid, "matmul", lambda k, W, x: W * x, [A(xs), A(ys)], lambda k, W, x: ref(W, x))


MATMUL = [
    _mm("matmul_matrix_vector", (3, 4), (4,)),
    _mm("matmul_matrix_matrix", (3, 4), (4, 2)),
    # A vector is a column: (n,) * (1, m) is an outer product, (1, n) * (n,) a dot product.
    _mm("matmul_outer", (3,), (1, 2), lambda u, v: u[:, None] @ v),
    _mm("matmul_row_vector", (1, 4), (4,), lambda r, x: r @ x),
    Case("matmul_parameter_operand", "matmul", lambda k, W, x: W * x, [A((2, 3)), A((3, 3))],
         lambda k, W, x: W @ x),
]


def _affine_ref(b, *wx):
    y = sum(wx[i] @ wx[i + 1] for i in range(0, len(wx), 2))
    return y + (b if b.ndim == np.ndim(y) else b[:, None])


def _affine(cid, shapes):
    return Case(cid, "affine", lambda k, *xs: dy.affine_transform(list(xs)), [A(s) for s in shapes],
                lambda k, *xs: _affine_ref(*xs))


AFFINE = [
    _affine("affine_one_pair", [(3,), (3, 4), (4,)]),
    _affine("affine_two_pairs", [(3,), (3, 4), (4,), (3, 2), (2,)]),
    _affine("affine_three_pairs", [(2,), (2, 3), (3,), (2, 2), (2,), (2, 1), (1,)]),
    _affine("affine_matrix_x", [(3, 2), (3, 4), (4, 2)]),
    _affine("affine_matrix_x_vector_bias", [(3,), (3, 4), (4, 2)]),
    Case("affine_bias_only", "affine", lambda k, b: dy.affine_transform([b]), [A((3,))], lambda k, b: b),
]

OTHER = [
    Case("dot_product", "dot_product", lambda k, x, y: dy.dot_product(x, y), [A((5,)), A((5,))],
         lambda k, x, y: np.array([x @ y])),
    Case("transpose_matrix", "transpose", lambda k, x: dy.transpose(x), [A((3, 2))], lambda k, x: x.T),
    Case("transpose_vector_is_row", "transpose", lambda k, x: dy.transpose(x), [A((4,))],
         lambda k, x: x.reshape(1, 4)),
    Case("transpose_3d", "transpose", lambda k, x: dy.transpose(x, [2, 0, 1]), [A((2, 3, 4))],
         lambda k, x: x.transpose(2, 0, 1)),
    Case("colwise_add", "colwise_add", lambda k, x, b: dy.colwise_add(x, b), [A((3, 4)), A((3,))],
         lambda k, x, b: x + b[:, None]),
    Case("colwise_add_column_b", "colwise_add", lambda k, x, b: dy.colwise_add(x, b), [A((3, 4)), A((3, 1))],
         lambda k, x, b: x + b),
    # a row into a column: only an axis of 1 moves, the values keep their order (a copy in C)
    Case("transpose_row_to_column", "transpose", lambda k, x: dy.transpose(x), [A((1, 4))],
         lambda k, x: x.reshape(4, 1)),
]

CASES = MATMUL + AFFINE + OTHER
