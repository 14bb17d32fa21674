"""Leaves: inputs, constants, lookups, and the random ops (values checked statistically elsewhere)."""
from __future__ import annotations

import numpy as np

import dynagraph as dy
from opcases import A, Case

_DATA = np.random.default_rng(5).normal(size=(4, 2, 3))   # per-node input values
_VEC = _DATA.reshape(4, 6)
TABLE = A((6, 3), kind="table")

INPUTS = [
    Case("inputTensor_matrix", "input", lambda k: dy.inputTensor(_DATA[k]), [], lambda k: _DATA[k]),
    Case("inputVector", "input", lambda k: dy.inputVector(list(_VEC[k])), [], lambda k: _VEC[k]),
    Case("scalarInput", "input", lambda k: dy.scalarInput(_VEC[k, 0]), [], lambda k: _VEC[k, :1]),
    # inputMatrix takes its values in column-major order, as DyNet does.
    Case("inputMatrix_column_major", "input", lambda k: dy.inputMatrix(list(_VEC[k]), (2, 3)), [],
         lambda k: _VEC[k].reshape(3, 2).T),
    Case("zeros", "constant", lambda k: dy.zeros((2, 3)), [], lambda k: np.zeros((2, 3))),
    Case("ones", "constant", lambda k: dy.ones(4), [], lambda k: np.ones(4)),
    Case("constant", "constant", lambda k: dy.constant((3,), 2.5), [], lambda k: np.full(3, 2.5)),
    Case("lookup", "lookup", lambda k, E: dy.lookup(E, k + 1), [TABLE], lambda k, E: E[k + 1]),
    Case("lookup_getitem", "lookup", lambda k, E: E[2 * k], [TABLE], lambda k, E: E[2 * k]),
    Case("lookup_matrix_rows", "lookup", lambda k, E: E[k], [A((3, 2, 2), kind="table")], lambda k, E: E[k]),
    Case("const_lookup", "lookup", lambda k, E: dy.const_lookup(E, k), [TABLE], lambda k, E: E[k], grad=0.0),
]

# Random ops: no numpy formula can reproduce the draws; statistics are tested in test_random.py.
RANDOM = [
    Case("random_normal", "random_normal", lambda k: dy.random_normal((3, 2), 0.5, 2.0), [], grad=None),
    Case("random_uniform", "random_uniform", lambda k: dy.random_uniform(4, -1.0, 3.0), [], grad=None),
    Case("random_bernoulli", "random_bernoulli", lambda k: dy.random_bernoulli((5,), 0.3, 2.0), [], grad=None),
    # Gradients are checked against finite differences with the node's mask held fixed.
    Case("dropout", "dropout", lambda k, x: dy.dropout(x, 0.4), [A((6,))]),
    Case("dropout_matrix", "dropout", lambda k, x: dy.dropout(x, 0.5), [A((3, 4))]),
    Case("dropout_dim_columns", "dropout_dim", lambda k, x: dy.dropout_dim(x, 0, 0.5), [A((3, 4))]),
    Case("dropout_dim_rows", "dropout_dim", lambda k, x: dy.dropout_dim(x, 1, 0.4), [A((3, 4))]),
    Case("dropout_dim_vector", "dropout_dim", lambda k, x: dy.dropout_dim(x, 0, 0.3), [A((6,))]),
    Case("dropout_batch", "dropout_batch", lambda k, x: dy.dropout_batch(x, 0.5), [A((2, 3))]),
    Case("noise", "noise", lambda k, x: dy.noise(x, 0.7), [A((5,))]),
]

CASES = INPUTS + RANDOM
