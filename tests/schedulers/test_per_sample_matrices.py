"""Products whose both sides vary per sample (MV-RNN's `A[r] * a[l]`) batch into one
stacked product per batch, forward and backward, and give the values and gradients of
node-by-node execution (float64, 1e-10) under every scheduler."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy

from ._util import SCHEDULERS, compare_with_none
from .test_models import TREES, _assert_batched


class MVRNN:
    """MV-RNN (Socher et al. 2012): a vector and a matrix per word. `matrices` picks how the
    per-word matrix is spelled: a 3-D lookup table, or a vector lookup reshaped (column-major)."""

    def __init__(self, pc, matrices: str, vocab: int = 7, h: int = 3):
        self.h, self.matrices = h, matrices
        self.E = pc.add_lookup_parameters((vocab, h))
        dims = (vocab, h, h) if matrices == "3d" else (vocab, h * h)
        self.M = pc.add_lookup_parameters(dims)
        self.W, self.b = pc.add_parameters((h, 2 * h)), pc.add_parameters(h)
        self.WM = pc.add_parameters((h, 2 * h))
        self.Wo, self.bo = pc.add_parameters((2, h)), pc.add_parameters(2)

    def matrix(self, w: int):
        m = dy.lookup(self.M, w)
        return m if self.matrices == "3d" else dy.reshape(m, (self.h, self.h))

    def encode(self, tree):
        if isinstance(tree, int):
            return dy.lookup(self.E, tree), self.matrix(tree)
        (a, A), (b, B) = self.encode(tree[0]), self.encode(tree[1])
        W, WM = dy.parameter(self.W), dy.parameter(self.WM)
        p = dy.tanh(W * dy.concatenate([B * a, A * b]) + self.b)  # per-sample matrix x computed vector
        P = WM * dy.concatenate([A, B])                          # shared matrix x per-sample matrix
        return p, P

    def loss(self, tree, label: int):
        p, P = self.encode(tree)
        # a product of two computed matrices, and a computed matrix times a computed vector
        q = dy.tanh(P * P) * p
        return dy.pickneglogsoftmax(dy.parameter(self.Wo) * q + self.bo, label)


@pytest.mark.parametrize("matrices", ["3d", "reshape"])
@pytest.mark.parametrize("name", SCHEDULERS)
def test_mvrnn(name, matrices):
    def build(pc):
        m = MVRNN(pc, matrices)
        return dy.esum([m.loss(t, y) for t, y in TREES])
    _, got = compare_with_none(name, build)
    _assert_batched(name, got)


def _stacked_products(pc, n: int, shared_left: bool, matrix_right: bool):
    """n products in one batch (more than one chunk of the shared-matrix gradient)."""
    rng = np.random.default_rng(3)
    L = pc.add_lookup_parameters((n, 4, 5))
    R = pc.add_lookup_parameters((n, 5, 3) if matrix_right else (n, 5))
    Ws = pc.add_parameters((4, 5))
    out = []
    for i in range(n):
        left = dy.parameter(Ws) if shared_left else dy.tanh(dy.lookup(L, i))
        right = dy.lookup(R, int(rng.integers(n)))
        out.append(dy.sum_elems(dy.square(left * dy.tanh(right))))
    return dy.esum(out)


@pytest.mark.parametrize("shared_left", [True, False])
@pytest.mark.parametrize("matrix_right", [True, False])
@pytest.mark.parametrize("name", ["depth", "agenda"])
def test_large_batches_of_products(name, shared_left, matrix_right):
    _, got = compare_with_none(name, lambda pc: _stacked_products(pc, 41, shared_left, matrix_right))
    assert max(len(b) for b in got.rec.batches) >= 41
