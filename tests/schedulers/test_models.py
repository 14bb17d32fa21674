"""Hand-written models give the same values (of every node) and gradients under
every scheduler as under "none", in float64 to 1e-10."""
from __future__ import annotations

import numpy as np
import pytest

import dynagraph as dy

from ._util import SCHEDULERS, compare_with_none

BATCHING = {"depth", "agenda"}  # built-ins known to batch; others are only checked for invariance


def _assert_batched(name: str, got) -> None:
    """The comparison is only meaningful if the scheduler really put several nodes together."""
    if name in BATCHING:
        sizes = [len(b) for b in got.rec.batches]
        assert max(sizes) > 1 and len(sizes) < sum(sizes)


# ------------------------------------------------------------------ TreeLSTM
def _random_tree(rng, n_leaves: int, vocab: int):
    if n_leaves == 1:
        return int(rng.integers(vocab))
    k = int(rng.integers(1, n_leaves))
    return (_random_tree(rng, k, vocab), _random_tree(rng, n_leaves - k, vocab))


_rng = np.random.default_rng(7)
TREES = [(_random_tree(_rng, n, 7), int(_rng.integers(2))) for n in (1, 2, 3, 5, 6, 4)]


class TreeLSTM:
    """Binary TreeLSTM (Tai et al.): leaves from a lookup table, one forget gate per child."""

    def __init__(self, pc, vocab: int = 7, x: int = 4, h: int = 3):
        self.h = h
        self.E = pc.add_lookup_parameters((vocab, x))
        self.Wl, self.bl = pc.add_parameters((3 * h, x)), pc.add_parameters(3 * h)
        self.Ul, self.Ur = pc.add_parameters((5 * h, h)), pc.add_parameters((5 * h, h))
        self.bn = pc.add_parameters(5 * h)
        self.Wo, self.bo = pc.add_parameters((2, h)), pc.add_parameters(2)

    def _gates(self, g, k: int):
        h = self.h
        return [dy.pick_range(g, j * h, (j + 1) * h) for j in range(k)]

    def encode(self, tree):
        if isinstance(tree, int):
            i, o, u = self._gates(dy.affine_transform([self.bl, self.Wl, self.E[tree]]), 3)
            c = dy.cmult(dy.logistic(i), dy.tanh(u))
            return dy.cmult(dy.logistic(o), dy.tanh(c)), c
        (hl, cl), (hr, cr) = self.encode(tree[0]), self.encode(tree[1])
        i, fl, fr, o, u = self._gates(dy.affine_transform([self.bn, self.Ul, hl, self.Ur, hr]), 5)
        c = (dy.cmult(dy.logistic(i), dy.tanh(u)) + dy.cmult(dy.logistic(fl), cl)
             + dy.cmult(dy.logistic(fr), cr))
        return dy.cmult(dy.logistic(o), dy.tanh(c)), c

    def loss(self, tree, label: int):
        h, _ = self.encode(tree)
        return dy.pickneglogsoftmax(dy.parameter(self.Wo) * h + self.bo, label)


def _treelstm(pc):
    m = TreeLSTM(pc)
    return dy.esum([m.loss(t, y) for t, y in TREES])


@pytest.mark.parametrize("name", SCHEDULERS)
def test_treelstm(name):
    _, got = compare_with_none(name, _treelstm)
    _assert_batched(name, got)


# ------------------------------------------------------------- sequence LSTM
class LSTM:
    """A one-layer LSTM written with affine_transform: one node computes all four gates."""

    def __init__(self, pc, vocab: int = 9, x: int = 3, h: int = 4):
        self.h = h
        self.E = pc.add_lookup_parameters((vocab, x))
        self.Wx, self.Wh = pc.add_parameters((4 * h, x)), pc.add_parameters((4 * h, h))
        self.b = pc.add_parameters(4 * h)
        self.Wo, self.bo = pc.add_parameters((3, h)), pc.add_parameters(3)

    def step(self, x, h, c):
        g = dy.affine_transform([self.b, self.Wx, x, self.Wh, h])
        i, f, o, u = (dy.pick_range(g, j * self.h, (j + 1) * self.h) for j in range(4))
        c = dy.cmult(dy.logistic(f), c) + dy.cmult(dy.logistic(i), dy.tanh(u))
        return dy.cmult(dy.logistic(o), dy.tanh(c)), c

    def loss(self, words, label: int):
        h = c = dy.zeros(self.h)
        per_step = []
        for w in words:
            h, c = self.step(dy.lookup(self.E, w), h, c)
            per_step.append(dy.squared_norm(h))  # an auxiliary loss at every step
        out = dy.affine_transform([self.bo, self.Wo, h])
        return dy.pickneglogsoftmax(out, label) + 0.1 * dy.esum(per_step)


SEQUENCES = [([1, 4, 2], 0), ([3], 2), ([5, 5, 6, 7, 8, 0], 1), ([2, 8], 2), ([0, 1, 2, 3], 0)]


def _lstm(pc):
    m = LSTM(pc)
    return dy.esum([m.loss(ws, y) for ws, y in SEQUENCES])


@pytest.mark.parametrize("name", SCHEDULERS)
def test_sequence_lstm_different_lengths(name):
    _, got = compare_with_none(name, _lstm)
    _assert_batched(name, got)


# ------------------------------------------------------------- MLP + dropout
def _mlp_dropout(pc):
    W1, b1 = pc.add_parameters((5, 4)), pc.add_parameters(5)
    W2, b2 = pc.add_parameters((3, 5)), pc.add_parameters(3)
    losses = []
    for s in range(6):
        x = dy.inputVector(np.linspace(-1.0, 1.0, 4) * (s + 1))
        h = dy.dropout(dy.tanh(W1 * x + b1), 0.5)
        h2 = dy.dropout(dy.rectify(h), 0.3)
        losses.append(dy.pickneglogsoftmax(W2 * h2 + b2, s % 3))
    return dy.esum(losses)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_mlp_with_dropout(name):
    """Dropout masks are counter-based (node key, element), so batching cannot change them."""
    ref, got = compare_with_none(name, _mlp_dropout)
    _assert_batched(name, got)
    cg = got.run.cg
    drops = [i for i in range(len(cg)) if cg.op[i].name == "dropout"]
    assert len(drops) == 12
    masks = [tuple(got.values[i] == 0) for i in drops[::2]]  # first dropout: tanh is never exactly 0
    assert any(any(m) for m in masks), "dropout(0.5) dropped nothing: the test would be vacuous"
    assert len(set(masks)) > 1, "every sample got the same mask"


# ------------------------------------------------------ incremental forward
def _incremental(seen: list):
    """Sample 0 calls .value() mid-recording; later samples reuse its (already computed) nodes.

    Sample 2 asks for a value in its middle; sample 3 asks for the value of a node
    recorded *before* others that are still pending, which must stay pending.
    """
    def build(pc):
        W, b = pc.add_parameters((3, 3)), pc.add_parameters(3)
        E = pc.add_lookup_parameters((5, 3))
        h0 = dy.tanh(W * E[0] + b)
        seen.append(("h0", h0.i, h0.npvalue()))  # forward now: a first scheduling call
        losses = [dy.sum_elems(h0)]
        for s in range(1, 4):
            h = dy.tanh(W * E[s] + b)
            h = dy.tanh(W * dy.cmult(h, h0) + b)
            if s == 2:
                seen.append(("mid", h.i, h.npvalue()))
            out = dy.tanh(W * h + b)
            if s == 3:
                seen.append(("late", h.i, h.npvalue()))  # `out` is recorded but stays pending
            losses.append(dy.sum_elems(out))
        return dy.esum(losses)
    return build


@pytest.mark.parametrize("name", SCHEDULERS)
def test_value_mid_recording_then_continue(name):
    seen: list = []  # the "none" run appends its three early values first, then the other run
    ref, got = compare_with_none(name, _incremental(seen))
    calls = [nodes for nodes, _ in got.rec.calls]
    assert len(calls) == 4  # h0, mid, late, then the rest at the end
    assert calls == [nodes for nodes, _ in ref.rec.calls]
    assert max(calls[2]) == seen[2][1]  # "late" only evaluated up to its own node
    assert len(seen) == 6
    for (tag, i, early_ref), (_, j, early) in zip(seen[:3], seen[3:]):
        assert i == j
        np.testing.assert_array_equal(early, got.values[i], err_msg=f"{tag} changed after its early value")
        np.testing.assert_allclose(early, early_ref, rtol=1e-10, atol=1e-10)


# --------------------------------------------------- recalculate after an update
def _recalculate(pc):
    """Evaluate, change a weight, then value(recalculate=True): a second full schedule."""
    W, E = pc.add_parameters((3, 3)), pc.add_lookup_parameters((4, 3))
    hs = [dy.tanh(W * dy.tanh(W * E[i])) for i in range(4)]
    loss = dy.esum([dy.sum_elems(h) for h in hs])
    before = loss.value()
    W.set_value(W.as_array() * 0.5)
    after = loss.value(recalculate=True)
    assert after != before
    return loss


@pytest.mark.parametrize("name", SCHEDULERS)
def test_recalculate_after_parameter_change(name):
    _, got = compare_with_none(name, _recalculate)
    # invalidate() makes the final forward schedule every non-leaf node a second time
    first, second = (nodes for nodes, _ in got.rec.calls[:2])
    assert first == second
    _assert_batched(name, got)


# ------------------------------------------------------- library LSTM builder
@pytest.mark.parametrize("name", SCHEDULERS)
def test_vanilla_lstm_builder(name):
    if not hasattr(dy, "VanillaLSTMBuilder"):
        pytest.skip("dy.VanillaLSTMBuilder not available")

    def build(pc):
        rnn = dy.VanillaLSTMBuilder(1, 3, 4, pc)
        E = pc.add_lookup_parameters((9, 3))
        outs = []
        for ws, _ in SEQUENCES:
            hs = rnn.initial_state().transduce([E[w] for w in ws])
            outs.append(dy.sum_elems(hs[-1]))
        return dy.esum(outs)
    _, got = compare_with_none(name, build)
    _assert_batched(name, got)
