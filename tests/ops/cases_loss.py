"""Softmax family, losses and norms."""
from __future__ import annotations

import numpy as np

import dynagraph as dy
from opcases import A, Case


def _softmax(x, axis=0):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis=0):
    return np.log(_softmax(x, axis))


def _hinge(x, gold, m):
    terms = np.maximum(0.0, m - x[gold] + x)
    terms[gold] = 0.0
    return np.array([terms.sum()])


def _bll(x, y):
    return np.array([-(y * np.log(x) + (1 - y) * np.log(1 - x)).sum()])


V5, M34 = A((5,), -2.0, 2.0), A((3, 4), -2.0, 2.0)
PROB = A((4,), 0.05, 0.95)

SOFTMAX = [
    Case("softmax_vector", "softmax", lambda k, x: dy.softmax(x), [V5], lambda k, x: _softmax(x)),
    # Matrices: softmax over each column (DyNet's d=0), or over rows with d=1.
    Case("softmax_matrix_columns", "softmax", lambda k, x: dy.softmax(x), [M34], lambda k, x: _softmax(x, 0)),
    # attention's scores: one column (n, 1), the kernels' row-wise softmax of its (B, n) view
    Case("softmax_column", "softmax", lambda k, x: dy.softmax(x), [A((5, 1), -2.0, 2.0)], lambda k, x: _softmax(x, 0)),
    Case("softmax_matrix_d1", "softmax", lambda k, x: dy.softmax(x, 1), [M34], lambda k, x: _softmax(x, 1)),
    Case("log_softmax_vector", "log_softmax", lambda k, x: dy.log_softmax(x), [V5], lambda k, x: _log_softmax(x)),
    Case("log_softmax_matrix_columns", "log_softmax", lambda k, x: dy.log_softmax(x), [M34],
         lambda k, x: _log_softmax(x, 0)),
    # Restricted classes are -inf; the checked output selects the finite ones.
    Case("log_softmax_restrict", "select",
         lambda k, x: dy.select_rows(dy.log_softmax(x, [0, 2, 3]), [0, 2, 3]), [V5],
         lambda k, x: _log_softmax(x[[0, 2, 3]]), tags=("log_softmax",)),
    Case("log_softmax_restrict_value", "log_softmax", lambda k, x: dy.log_softmax(x, [1, 4]), [V5],
         lambda k, x: np.where(np.isin(np.arange(5), [1, 4]), x - np.log(np.exp(x[[1, 4]]).sum()), -np.inf),
         grad=None),
    Case("pickneglogsoftmax", "pickneglogsoftmax", lambda k, x: dy.pickneglogsoftmax(x, k), [V5],
         lambda k, x: -_log_softmax(x)[k:k + 1]),
]

LOSSES = [
    Case("hinge", "hinge", lambda k, x: dy.hinge(x, k), [V5], lambda k, x: _hinge(x, k, 1.0)),
    Case("hinge_margin", "hinge", lambda k, x: dy.hinge(x, k + 1, 0.5), [V5], lambda k, x: _hinge(x, k + 1, 0.5)),
    Case("binary_log_loss", "binary_log_loss", lambda k, x, y: dy.binary_log_loss(x, y), [PROB, PROB],
         lambda k, x, y: _bll(x, y)),
    Case("binary_log_loss_hard_labels", "binary_log_loss", lambda k, x, y: dy.binary_log_loss(x, y),
         [PROB, A((4,), 0.0, 2.0, kind="const", integer=True)], lambda k, x, y: _bll(x, y)),
    Case("squared_distance", "squared_distance", lambda k, x, y: dy.squared_distance(x, y), [V5, V5],
         lambda k, x, y: np.array([((x - y) ** 2).sum()])),
    Case("squared_distance_matrix", "squared_distance", lambda k, x, y: dy.squared_distance(x, y), [M34, M34],
         lambda k, x, y: np.array([((x - y) ** 2).sum()])),
    Case("squared_norm", "squared_norm", lambda k, x: dy.squared_norm(x), [V5], lambda k, x: np.array([x @ x])),
    Case("l2_norm", "l2_norm", lambda k, x: dy.l2_norm(x), [V5], lambda k, x: np.array([np.sqrt(x @ x)])),
    Case("l2_norm_matrix", "l2_norm", lambda k, x: dy.l2_norm(x), [M34],
         lambda k, x: np.array([np.sqrt((x * x).sum())])),
]

CASES = SOFTMAX + LOSSES
