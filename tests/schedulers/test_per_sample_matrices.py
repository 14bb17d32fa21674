"""Products whose both sides vary per sample (MV-RNN's `A[r] * a[l]`) batch into one
stacked product per batch, forward and backward, and give the values and gradients of
node-by-node execution (float64, 1e-10) under every scheduler."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dynagraph as dy
from dynagraph.backends import get_backend
from refcheck import Table, check_op

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


# ---------------------------------------------------------------- products read in place
# On a backend with the rows_operand capability (cpu), per-sample matrices gathered from
# several blocks are read where they lie and their gradients added into the rows in place
# (backends/cpu/rowmm.py); elsewhere the same batch takes the gathered copy.

@contextlib.contextmanager
def _rows_operands_seen():
    """Counts the rows operands the executor takes from the current backend."""
    be = get_backend()
    seen = []
    if be.rows_operand is None:
        yield seen
        return
    real = be.rows_operand

    def spy(blocks, index):
        out = real(blocks, index)
        seen.append(out)
        return out
    be.rows_operand = spy
    try:
        yield seen
    finally:
        del be.rows_operand  # back to the class's (or __init__'s) attribute
        be.rows_operand = real


def _two_source_products(pc, r: int, c: int, uses: list, shared_x: bool):
    """Products A_j x_j whose matrices come from two blocks at one depth (tanh and logistic
    of lookups), each matrix used by the products listed in `uses` (repeats: one matrix,
    several products, whose gradients must add up)."""
    T = pc.add_lookup_parameters((3, r, c))
    X = pc.add_lookup_parameters((len(uses), c))
    mats = [dy.tanh(dy.lookup(T, 0)), dy.logistic(dy.lookup(T, 1)), dy.tanh(dy.lookup(T, 2))]
    xs = [dy.tanh(dy.lookup(X, 0))] * len(uses) if shared_x else [dy.tanh(dy.lookup(X, j)) for j in range(len(uses))]
    outs = [dy.sum_elems(dy.square(mats[m] * xs[j])) for j, m in enumerate(uses)]
    return dy.esum(outs)


@pytest.mark.parametrize("name", ["depth", "agenda"])
def test_mvrnn_products_read_in_place(name, backend):
    def build(pc):
        m = MVRNN(pc, "reshape", h=4)
        return dy.esum([m.loss(t, y) for t, y in TREES])
    with _rows_operands_seen() as seen:
        compare_with_none(name, build)
    if get_backend().rows_operand is not None:
        assert any(s is not None for s in seen), "no product read its matrices in place"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(r=st.integers(1, 5), c=st.integers(1, 6), uses=st.lists(st.integers(0, 2), min_size=2, max_size=9),
       shared_x=st.booleans())
def test_random_row_patterns_match_unbatched(backend, r, c, uses, shared_x):
    with _rows_operands_seen() as seen:
        compare_with_none("agenda", lambda pc: _two_source_products(pc, r, c, uses, shared_x))
    if get_backend().rows_operand is not None and len(set(u % 2 for u in uses)) == 2:
        assert any(s is not None for s in seen)


def test_in_place_products_against_finite_differences(backend):
    """float64 gradients of the table (repeated rows) and of the vectors by central differences."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((3, 3, 4))
    vecs = rng.standard_normal((4, 4))
    uses = [0, 1, 0, 2]

    def build(T, V):
        mats = [dy.tanh(dy.lookup(T, 0)), dy.logistic(dy.lookup(T, 1)), dy.tanh(dy.lookup(T, 2))]
        return dy.concatenate([mats[m] * dy.tanh(dy.pick(V, j, 1)) for j, m in enumerate(uses)])

    def expected(t, v):
        mats = [np.tanh(t[0]), 1 / (1 + np.exp(-t[1])), np.tanh(t[2])]
        return np.concatenate([mats[m] @ np.tanh(v[:, j]) for j, m in enumerate(uses)])

    with _rows_operands_seen() as seen:
        check_op(build, [Table(table), vecs], expected, scheduler="agenda")
    if get_backend().rows_operand is not None:
        assert any(s is not None for s in seen)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(r=st.integers(1, 4), c=st.integers(1, 4), picks=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)),
                                                                 min_size=2, max_size=7), axis=st.integers(0, 1))
def test_concatenations_of_matrices_from_several_blocks(backend, r, c, picks, axis):
    """concatenate([A, B]) of per-sample matrices from several blocks (the rows operand's
    copy into each slice on cpu; repeats: one matrix in several concatenations or twice in one)."""
    def build(pc):
        T = pc.add_lookup_parameters((3, r, c))
        mats = [dy.tanh(dy.lookup(T, 0)), dy.logistic(dy.lookup(T, 1)), dy.tanh(dy.lookup(T, 2))]
        W = dy.parameter(pc.add_parameters((2, 2 * r if axis == 0 else r)))
        outs = []
        for a, b in picks:
            m = dy.concatenate([mats[a], mats[b]], d=axis) if axis == 0 else dy.concatenate_cols([mats[a], mats[b]])
            outs.append(dy.sum_elems(dy.square(W * m)))
        return dy.esum(outs)
    with _rows_operands_seen() as seen:
        compare_with_none("agenda", build)
    mixed = any(len({pr[k] % 2 for pr in picks}) == 2 for k in (0, 1))  # one argument from two blocks
    if get_backend().rows_operand is not None and axis == 0 and mixed:
        assert any(s is not None for s in seen)


def test_in_place_concatenation_against_finite_differences(backend):
    """float64: WM * concatenate([A, B]) with A, B from two blocks, one matrix used twice."""
    rng = np.random.default_rng(6)
    table, wm = rng.standard_normal((3, 3, 2)), rng.standard_normal((2, 6))
    pairs = [(0, 1), (1, 2), (2, 2)]

    def build(T, WM):
        mats = [dy.tanh(dy.lookup(T, 0)), dy.logistic(dy.lookup(T, 1)), dy.tanh(dy.lookup(T, 2))]
        return dy.concatenate_cols([WM * dy.concatenate([mats[a], mats[b]]) for a, b in pairs])

    def expected(t, w):
        mats = [np.tanh(t[0]), 1 / (1 + np.exp(-t[1])), np.tanh(t[2])]
        return np.concatenate([w @ np.concatenate([mats[a], mats[b]]) for a, b in pairs], axis=1)

    with _rows_operands_seen() as seen:
        check_op(build, [Table(table), wm], expected, scheduler="agenda")
    if get_backend().rows_operand is not None:
        assert any(s is not None for s in seen)
