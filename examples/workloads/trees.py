"""Tree workloads on synthetic SST-like binary trees (dynagraph.datasets.synthetic_trees).

Every tree is encoded bottom-up (post-order, so deep trees do not recurse) and
scored at the root with a softmax cross-entropy on the root label.

* TreeLSTM: binary N-ary TreeLSTM (Tai et al., 2015).
* TreeGRU: a binary tree GRU (gates from both children, reset per child).
* TreeLSTM-2Type: two internal TreeLSTM cells with separate parameters; each
  internal node uses one of them, drawn uniformly at random per node (seeded).
* MV-RNN (Socher et al., 2012): a word is a vector a and a matrix A; a parent of
  (a, A), (b, B) is p = tanh(W [B a; A b] + bias), P = W_M [A; B].
"""
from __future__ import annotations

import numpy as np

import dynagraph as dy
from dynagraph.datasets import synthetic_trees

from .base import Workload

VOCAB, LABELS = 1000, 5


def _trees(n: int, seed: int) -> list:
    return synthetic_trees(n, vocab_size=VOCAB, n_labels=LABELS, seed=seed)


def _word_id(leaf) -> int:
    return int(leaf.word[1:]) % VOCAB  # synthetic words are "w<id>"


class _TreeModel(Workload):
    kind = "tree"

    def _build(self, pc, hidden):
        self.E = pc.add_lookup_parameters((VOCAB, hidden), name="E")
        self.W_out = pc.add_parameters((LABELS, hidden), name="W_out")
        self.b_out = pc.add_parameters((LABELS,), init=dy.ConstInitializer(0.0), name="b_out")
        self._build_cells(pc, hidden)

    def instances(self, n: int, seed: int = 1) -> list:
        return _trees(n, seed)

    def encode(self, tree, node_kind=None):
        """The root's state; node_kind(k) picks the cell of the k-th internal node."""
        state: dict = {}
        k = 0
        for n in tree.nodes_postorder():
            if n.is_leaf():
                state[id(n)] = self.leaf(dy.lookup(self.E, _word_id(n)), n)
            else:
                left = state[id(n.children[0])]
                for child in n.children[1:]:
                    left = self.node(left, state[id(child)], node_kind(k) if node_kind else 0)
                state[id(n)] = left
                k += 1
        return state[id(tree)]

    def loss(self, tree):
        h = self.root_vector(self.encode(tree))
        return dy.pickneglogsoftmax(dy.affine_transform([self.b_out, self.W_out, h]), tree.label)

    @staticmethod
    def root_vector(state):
        return state[0]


class TreeLSTM(_TreeModel):
    name = "treelstm"

    def _build_cells(self, pc, h):
        zero = dy.ConstInitializer(0.0)
        self.W_iou = pc.add_parameters((3 * h, h), name="W_iou")
        self.b_iou = pc.add_parameters((3 * h,), init=zero, name="b_iou")
        self.cells = [self._internal_params(pc, h, "")]

    @staticmethod
    def _internal_params(pc, h, tag):
        return (pc.add_parameters((5 * h,), init=dy.ConstInitializer(0.0), name=f"b{tag}"),
                pc.add_parameters((5 * h, h), name=f"U_l{tag}"), pc.add_parameters((5 * h, h), name=f"U_r{tag}"))

    def leaf(self, x, _n):
        h = self.hidden
        g = dy.affine_transform([self.b_iou, self.W_iou, x])
        return dy.tree_lstm_update(g, [], h)

    def node(self, left, right, kind: int = 0):
        (h_l, c_l), (h_r, c_r), h = left, right, self.hidden
        b, U_l, U_r = self.cells[kind]
        g = dy.affine_transform([b, U_l, h_l, U_r, h_r])
        return dy.tree_lstm_update(g, [c_l, c_r], h)


class TreeLSTM2Type(TreeLSTM):
    """Two internal cell types; instances are (tree, per-internal-node cell choice)."""
    name = "treelstm2type"

    def _build_cells(self, pc, h):
        super()._build_cells(pc, h)
        self.cells.append(self._internal_params(pc, h, "_2"))

    def instances(self, n: int, seed: int = 1) -> list:
        rng = np.random.default_rng(seed + 7919)
        trees = _trees(n, seed)
        return [(t, rng.integers(2, size=max(len(t) - 1, 0)).tolist()) for t in trees]

    def loss(self, x):
        tree, kinds = x
        h = self.encode(tree, kinds.__getitem__)[0]
        return dy.pickneglogsoftmax(dy.affine_transform([self.b_out, self.W_out, h]), tree.label)


class TreeGRU(_TreeModel):
    name = "treegru"

    def _build_cells(self, pc, h):
        zero = dy.ConstInitializer(0.0)
        self.W_x = pc.add_parameters((h, h), name="W_x")
        self.b_x = pc.add_parameters((h,), init=zero, name="b_x")
        self.U_l = pc.add_parameters((3 * h, h), name="U_l")
        self.U_r = pc.add_parameters((3 * h, h), name="U_r")
        self.b = pc.add_parameters((3 * h,), init=zero, name="b")
        self.V_l = pc.add_parameters((h, h), name="V_l")
        self.V_r = pc.add_parameters((h, h), name="V_r")
        self.b_c = pc.add_parameters((h,), init=zero, name="b_c")

    def leaf(self, x, _n):
        return (dy.tanh(dy.affine_transform([self.b_x, self.W_x, x])),)

    def node(self, left, right, kind: int = 0):
        (h_l,), (h_r,), h = left, right, self.hidden
        g = dy.affine_transform([self.b, self.U_l, h_l, self.U_r, h_r])
        z = dy.logistic(dy.pick_range(g, 0, h))
        r_l = dy.logistic(dy.pick_range(g, h, 2 * h))
        r_r = dy.logistic(dy.pick_range(g, 2 * h, 3 * h))
        cand = dy.tanh(dy.affine_transform([self.b_c, self.V_l, dy.cmult(r_l, h_l), self.V_r, dy.cmult(r_r, h_r)]))
        return (dy.cmult(1.0 - z, h_l + h_r) + dy.cmult(z, cand),)


class MVRNN(_TreeModel):
    name = "mvrnn"

    def _build_cells(self, pc, h):
        self.M = pc.add_lookup_parameters((VOCAB, h, h), init=dy.NormalInitializer(0.0, 1.0 / h), name="M")
        self.W = pc.add_parameters((h, 2 * h), name="W")
        self.bias = pc.add_parameters((h,), init=dy.ConstInitializer(0.0), name="bias")
        self.W_M = pc.add_parameters((h, 2 * h), name="W_M")

    def leaf(self, x, n):
        return x, dy.lookup(self.M, _word_id(n))

    def node(self, left, right, kind: int = 0):
        (a, A), (b, B) = left, right
        p = dy.tanh(dy.affine_transform([self.bias, self.W, dy.concatenate([B * a, A * b])]))
        return p, self.W_M * dy.concatenate([A, B])
