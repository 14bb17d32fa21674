"""Reshape (column-major), concatenation, picking, selection and reductions."""
from __future__ import annotations

import numpy as np

import dynagraph as dy
from opcases import A, Case


def _c(cid, op, f, args, ref, **kw):
    """A case whose node number k may pick an index: f(k, *xs), ref(k, *arrays)."""
    return Case(cid, op, f, [A(s) if isinstance(s, tuple) else s for s in args], ref, **kw)


def _F(x, shape):
    """DyNet stores tensors column-major, so reshape follows Fortran order."""
    return np.reshape(x, shape, order="F")


RESHAPE = [
    _c("reshape_matrix", "reshape", lambda k, x: dy.reshape(x, (4, 3)), [(3, 4)], lambda k, x: _F(x, (4, 3))),
    _c("reshape_vector_to_matrix", "reshape", lambda k, x: dy.reshape(x, (2, 3)), [(6,)],
       lambda k, x: _F(x, (2, 3))),
    _c("reshape_matrix_to_vector", "reshape", lambda k, x: dy.reshape(x, (6,)), [(2, 3)],
       lambda k, x: x.flatten(order="F")),
    _c("reshape_int_dim", "reshape", lambda k, x: dy.reshape(x, 6), [(3, 2)], lambda k, x: x.flatten(order="F")),
    _c("reshape_3d", "reshape", lambda k, x: dy.reshape(x, (3, 2, 2)), [(4, 3)], lambda k, x: _F(x, (3, 2, 2))),
    _c("reshape_column_to_vector", "reshape", lambda k, x: dy.reshape(x, (4,)), [(4, 1)], lambda k, x: x[:, 0]),
]

CONCAT = [
    _c("concatenate_vectors", "concatenate", lambda k, *xs: dy.concatenate(list(xs)), [(2,), (3,), (1,)],
       lambda k, *xs: np.concatenate(xs)),
    _c("concatenate_rows_of_matrices", "concatenate", lambda k, x, y: dy.concatenate([x, y]), [(2, 3), (1, 3)],
       lambda k, x, y: np.concatenate([x, y], axis=0)),
    _c("concatenate_d1_vectors", "concatenate", lambda k, x, y: dy.concatenate([x, y], d=1), [(3,), (3,)],
       lambda k, x, y: np.stack([x, y], axis=1)),
    _c("concatenate_d1_matrices", "concatenate", lambda k, x, y: dy.concatenate([x, y], d=1), [(3, 2), (3, 1)],
       lambda k, x, y: np.concatenate([x, y], axis=1)),
    # attention's context (2H, 1) beside a vector (H,): the vector is padded to (H, 1)
    _c("concatenate_column_and_vector", "concatenate", lambda k, x, y: dy.concatenate([x, y]), [(3, 1), (2,)],
       lambda k, x, y: np.concatenate([x, y[:, None]])),
    _c("concatenate_cols", "concatenate", lambda k, *xs: dy.concatenate_cols(list(xs)), [(3,), (3,), (3,)],
       lambda k, *xs: np.stack(xs, axis=1)),
]

# Picks: the index is per-node data (k), so nodes picking different entries batch.
PICK = [
    _c("pick_vector", "pick", lambda k, x: dy.pick(x, k), [(4,)], lambda k, x: x[k:k + 1]),
    _c("pick_getitem", "pick", lambda k, x: x[k + 1], [(4,)], lambda k, x: x[k + 1:k + 2]),
    _c("pick_matrix_row", "pick", lambda k, x: dy.pick(x, k, 0), [(3, 4)], lambda k, x: x[k, :]),
    _c("pick_matrix_col", "pick", lambda k, x: dy.pick(x, k, 1), [(3, 4)], lambda k, x: x[:, k]),
    _c("pick_range_vector", "pick_range", lambda k, x: dy.pick_range(x, 1, 3), [(5,)], lambda k, x: x[1:3]),
    _c("pick_range_slice", "pick_range", lambda k, x: x[2:5], [(5,)], lambda k, x: x[2:5]),
    _c("pick_range_matrix_d0", "pick_range", lambda k, x: dy.pick_range(x, 0, 2), [(3, 4)],
       lambda k, x: x[0:2, :]),
    _c("pick_range_matrix_d1", "pick_range", lambda k, x: dy.pick_range(x, 1, 3, 1), [(3, 4)],
       lambda k, x: x[:, 1:3]),
    _c("pickrange_alias", "pick_range", lambda k, x: dy.pickrange(x, 0, 1), [(3,)], lambda k, x: x[0:1]),
    _c("select_rows", "select", lambda k, x: dy.select_rows(x, [2, 0]), [(3, 4)], lambda k, x: x[[2, 0], :]),
    _c("select_rows_repeated", "select", lambda k, x: dy.select_rows(x, [1, 1, 0]), [(3, 2)],
       lambda k, x: x[[1, 1, 0], :]),
    _c("select_rows_vector", "select", lambda k, x: dy.select_rows(x, [3, 1]), [(4,)], lambda k, x: x[[3, 1]]),
    _c("select_cols", "select", lambda k, x: dy.select_cols(x, [3, 1]), [(3, 4)], lambda k, x: x[:, [3, 1]]),
    _c("select_cols_repeated", "select", lambda k, x: dy.select_cols(x, [0, 2, 0]), [(2, 3)],
       lambda k, x: x[:, [0, 2, 0]]),
]

REDUCE = [
    _c("sum_elems", "sum_elems", lambda k, x: dy.sum_elems(x), [(3, 4)], lambda k, x: np.array([x.sum()])),
    _c("mean_elems", "mean_elems", lambda k, x: dy.mean_elems(x), [(5,)], lambda k, x: np.array([x.mean()])),
    _c("sum_dim_rows", "sum_dim", lambda k, x: dy.sum_dim(x, [0]), [(3, 4)], lambda k, x: x.sum(axis=0)),
    _c("sum_dim_cols", "sum_dim", lambda k, x: dy.sum_dim(x, [1]), [(3, 4)], lambda k, x: x.sum(axis=1)),
    _c("sum_dim_both", "sum_dim", lambda k, x: dy.sum_dim(x, [0, 1]), [(3, 4)], lambda k, x: np.array([x.sum()])),
    _c("sum_dim_vector", "sum_dim", lambda k, x: dy.sum_dim(x, [0]), [(4,)], lambda k, x: np.array([x.sum()])),
    _c("mean_dim", "mean_dim", lambda k, x: dy.mean_dim(x, [1]), [(3, 4)], lambda k, x: x.mean(axis=1)),
    _c("mean_dim_rows", "mean_dim", lambda k, x: dy.mean_dim(x, [0]), [(3, 4)], lambda k, x: x.mean(axis=0)),
    _c("max_dim_rows", "max_dim", lambda k, x: dy.max_dim(x, 0), [(3, 4)], lambda k, x: x.max(axis=0)),
    _c("max_dim_cols", "max_dim", lambda k, x: dy.max_dim(x, 1), [(3, 4)], lambda k, x: x.max(axis=1)),
    _c("max_dim_vector", "max_dim", lambda k, x: dy.max_dim(x), [(5,)], lambda k, x: np.array([x.max()])),
    _c("min_dim_rows", "min_dim", lambda k, x: dy.min_dim(x, 0), [(3, 4)], lambda k, x: x.min(axis=0)),
    _c("min_dim_cols", "min_dim", lambda k, x: dy.min_dim(x, 1), [(3, 4)], lambda k, x: x.min(axis=1)),
]

CASES = RESHAPE + CONCAT + PICK + REDUCE
