"""Leaves: parameters, lookups, inputs, constants and random tensors."""
from __future__ import annotations

import numpy as np

from . import random as rnd
from .base import CHEAP, ELEMWISE, SparseRows, defop, op, same_shape


def _attr_shape(a, *arg_shapes):
    return a[0]


def _leaf_forward(xp, a, data):
    raise AssertionError("leaf values are bound by the graph, never computed")


# attrs = (shape, parameter object). Bound to the parameter's storage, never batched.
PARAMETER = defop("parameter", _attr_shape, _leaf_forward, None, leaf=True, batchable=False, cost=CHEAP)
LOOKUP_TABLE = defop("lookup_table", _attr_shape, _leaf_forward, None, leaf=True, batchable=False, cost=CHEAP)


def _lookup_shape(a, table):
    return table[1:]


def _lookup_check(a, index, table):
    if not 0 <= index < table[0]:
        raise IndexError(f"index {index} out of range for a lookup table with {table[0]} rows")


@op("lookup", _lookup_shape, cost=CHEAP, uses_data=True)
class Lookup:
    """Gathers one row per node; the backward is one sparse row update for the batch."""
    check = _lookup_check

    def forward(xp, a, data, table):
        return table[0][xp.asarray(data)]

    def backward(xp, a, data, xs, y, g, need):
        return (SparseRows(np.asarray(data), g),)


@op("input", _attr_shape, cost=CHEAP, uses_data=True)
class Input:
    def forward(xp, a, data):
        return xp.asarray(np.stack(data))


@op("constant", _attr_shape, cost=CHEAP)
class Constant:
    """zeros, ones and constant: attrs = (shape, value)."""
    def forward(xp, a, data):
        return xp.full((1,) + a[0], a[1])


@op("random_normal", _attr_shape, cost=ELEMWISE, uses_data=True)
class RandomNormal:
    def forward(xp, a, data):
        return a[1] + a[2] * rnd.normal(xp, data, a[0])


@op("random_uniform", _attr_shape, cost=ELEMWISE, uses_data=True)
class RandomUniform:
    def forward(xp, a, data):
        return a[1] + (a[2] - a[1]) * rnd.uniform(xp, data, a[0])


@op("random_bernoulli", _attr_shape, cost=ELEMWISE, uses_data=True)
class RandomBernoulli:
    def forward(xp, a, data):
        return (rnd.uniform(xp, data, a[0]) < a[1]) * a[2]


def _dropout_mask(xp, a, data, shape):
    # A module function, not a method: @op replaces the class by its OpDef.
    p = a[0]
    return (rnd.uniform(xp, data, shape) >= p) * (1.0 / (1.0 - p))


@op("dropout", same_shape, cost=ELEMWISE, uses_data=True)
class Dropout:
    """Inverted dropout as in DyNet: keep with prob 1-p and scale by 1/(1-p)."""
    def forward(xp, a, data, x):
        return x * _dropout_mask(xp, a, data, x.shape[1:])

    def backward(xp, a, data, xs, y, g, need):
        return (g * _dropout_mask(xp, a, data, xs[0].shape[1:]),)


def _shared_mask(xp, p: float, data, x, shared_axes):
    """Dropout's mask, drawn once per slice: size 1 (broadcast) along `shared_axes` of a sample."""
    shape = tuple(1 if i in shared_axes else n for i, n in enumerate(x.shape[1:]))
    return _dropout_mask(xp, (p,), data, shape)


def _dropout_dim_shape(a, x):
    if not 0 <= a[1] < len(x):
        raise ValueError(f"dimension {a[1]} out of range for an expression of shape {x}")
    return x


@op("dropout_dim", _dropout_dim_shape, cost=ELEMWISE, uses_data=True)
class DropoutDim:
    """DyNet's dropout_dim(x, d, p): attrs = (p, d). One keep/drop draw per slice along d:
    every element along dimension d shares it (for a matrix, d=0 drops whole columns)."""
    def forward(xp, a, data, x):
        return x * _shared_mask(xp, a[0], data, x, (a[1],))

    def backward(xp, a, data, xs, y, g, need):
        return (g * _shared_mask(xp, a[0], data, xs[0], (a[1],)),)


@op("dropout_batch", same_shape, cost=ELEMWISE, uses_data=True)
class DropoutBatch:
    """DyNet's dropout_batch(x, p): attrs = (p,). Each sample (minibatch element) is kept
    whole, scaled by 1/(1-p), or dropped whole."""
    def forward(xp, a, data, x):
        return x * _shared_mask(xp, a[0], data, x, range(x.ndim - 1))

    def backward(xp, a, data, xs, y, g, need):
        return (g * _shared_mask(xp, a[0], data, xs[0], range(xs[0].ndim - 1)),)


@op("noise", same_shape, cost=ELEMWISE, uses_data=True)
class Noise:
    def forward(xp, a, data, x):
        return x + a[0] * rnd.normal(xp, data, x.shape[1:])

    def backward(xp, a, data, xs, y, g, need):
        return (g,)
