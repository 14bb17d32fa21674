"""Binary TreeLSTM sentiment classifier written as Cavs vertex functions.

Instead of walking each tree node by node, the model declares what ONE vertex
does, once, and dy.cavs.run evaluates it over every tree of the minibatch:
all activated vertices (those whose children are done) of all trees at once.

    python examples/cavs_treelstm.py                 # SST if ../shared/data is present
    python examples/cavs_treelstm.py --hidden 256    # bigger cells

Cell (Tai et al., 2015, N-ary TreeLSTM with N = 2), as in examples/treelstm.py:
    leaf:  [i, o, u] = W_iou x + b_iou;  c = sig(i) tanh(u);  h = sig(o) tanh(c)
    node:  [i, f_l, f_r, o, u] = U_l h_l + U_r h_r + b
           c = sig(i) tanh(u) + sig(f_l) c_l + sig(f_r) c_r;  h = sig(o) tanh(c)
Each vertex scatters (h, c) to its parent and pushes h; the loss is the softmax
cross-entropy of the root's pushed h, built with ordinary imperative dy.* code.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Tree, Vocab

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parse_example_args  # noqa: E402
from treelstm import load_trees, minibatches  # noqa: E402  (same data as the op-level example)


class FlatTree:
    """A tree as plain data: post-order children lists, vertex types and word ids (-1: none).
    Unary nodes pass their child through; n-ary nodes fold left, as examples/treelstm.py does."""
    __slots__ = ("children", "types", "words", "label")

    def __init__(self, tree: Tree, vocab: Vocab):
        self.children, self.types, self.words, self.label = [], [], [], tree.label
        at: dict = {}
        for n in tree.nodes_postorder():
            if n.is_leaf():
                at[id(n)] = self._add([], "leaf", vocab[n.word])
                continue
            acc = at[id(n.children[0])]
            for c in n.children[1:]:
                acc = self._add([acc, at[id(c)]], "node", -1)
            at[id(n)] = acc

    def _add(self, kids: list, kind: str, word: int) -> int:
        self.children.append(kids)
        self.types.append(kind)
        self.words.append(word)
        return len(self.children) - 1

    def graph(self) -> dy.cavs.Graph:
        return dy.cavs.Graph(self.children, self.types)


class CavsTreeLSTM:
    """Parameters plus the two vertex functions; same layout as examples/treelstm.TreeLSTM."""

    def __init__(self, pc: dy.ParameterCollection, n_words: int, emb_dim: int, hidden: int, n_labels: int):
        H = self.h = hidden
        self.E = pc.add_lookup_parameters((n_words, emb_dim), name="E")
        self.W_iou = pc.add_parameters((3 * H, emb_dim), name="W_iou")
        self.b_iou = pc.add_parameters((3 * H,), init=dy.ConstInitializer(0.0), name="b_iou")
        self.U_l = pc.add_parameters((5 * H, H), name="U_l")
        self.U_r = pc.add_parameters((5 * H, H), name="U_r")
        self.b = pc.add_parameters((5 * H,), init=dy.ConstInitializer(0.0), name="b")
        self.W_out = pc.add_parameters((n_labels, H), name="W_out")
        self.b_out = pc.add_parameters((n_labels,), init=dy.ConstInitializer(0.0), name="b_out")
        self._declare()

    @classmethod
    def sharing(cls, model) -> "CavsTreeLSTM":
        """The vertex-function form of an op-level examples/treelstm.TreeLSTM, on its parameters."""
        self = cls.__new__(cls)
        self.h = model.h
        for name in ("E", "W_iou", "b_iou", "U_l", "U_r", "b", "W_out", "b_out"):
            setattr(self, name, getattr(model, name))
        self._declare()
        return self

    def _declare(self) -> None:
        self.functions = {"leaf": dy.cavs.vertex_function(self.leaf_cell, arity=0, name="leaf"),
                          "node": dy.cavs.vertex_function(self.node_cell, arity=2, name="node")}

    # ---------------------------------------------------------------- cells (plain dy ops)
    def leaf_math(self, x):
        return dy.tree_lstm_update(dy.affine_transform([self.b_iou, self.W_iou, x]), [], self.h)

    def node_math(self, h_l, c_l, h_r, c_r):
        g = dy.affine_transform([self.b, self.U_l, h_l, self.U_r, h_r])
        return dy.tree_lstm_update(g, [c_l, c_r], self.h)

    # ---------------------------------------------------------------- vertex functions
    def leaf_cell(self, v) -> None:
        h, c = self.leaf_math(v.pull())      # pull: this vertex's word embedding
        v.scatter(h, c)                      # what the parent gathers
        v.push(h)                            # what imperative code reads

    def node_cell(self, v) -> None:
        (h_l, c_l), (h_r, c_r) = v.gather(0), v.gather(1)
        h, c = self.node_math(h_l, c_l, h_r, c_r)
        v.scatter(h, c)
        v.push(h)

    # ---------------------------------------------------------------- a minibatch
    def run(self, trees: list[FlatTree]) -> dy.cavs.CavsOutput:
        return dy.cavs.run(self.functions, [t.graph() for t in trees], pull=(self.E, [t.words for t in trees]))

    def scores(self, trees: list[FlatTree]) -> list:
        out = self.run(trees)
        return [dy.affine_transform([self.b_out, self.W_out, h]) for h in out.roots()]

    def losses(self, trees: list[FlatTree]) -> list:
        return [dy.pickneglogsoftmax(s, t.label) for s, t in zip(self.scores(trees), trees)]


# ------------------------------------------------------------------------ training
def train_epoch(model: CavsTreeLSTM, trainer, trees: list[FlatTree], batch_size: int) -> list[float]:
    losses = []
    for batch in minibatches(trees, batch_size):
        dy.renew_cg()
        loss = dy.esum(model.losses(batch)) * (1.0 / len(batch))
        losses.append(loss.value())
        loss.backward()
        trainer.update()
    return losses


def accuracy(model: CavsTreeLSTM, trees: list[FlatTree], batch_size: int = 64) -> float:
    correct = 0
    for batch in minibatches(trees, batch_size):
        dy.renew_cg()
        scores = model.scores(batch)
        dy.cg().forward()
        correct += sum(int(np.argmax(s.npvalue())) == t.label for s, t in zip(scores, batch))
    return correct / max(len(trees), 1)


def parse_args(argv=None) -> argparse.Namespace:
    return parse_example_args(__doc__, argv, train=400, dev=200, epochs=2, batch_size=32, emb_dim=64, hidden=64, lr=0.05, seed=1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    say = (lambda *a: None) if args.quiet else print
    train, dev, source = load_trees(args.train, args.dev, args.seed)
    dy.reset_random_seed(args.seed)
    vocab = Vocab.build(w for t in train for w in t.words())
    pc = dy.ParameterCollection()
    model = CavsTreeLSTM(pc, len(vocab), args.emb_dim, args.hidden, n_labels=5)
    trainer = dy.AdagradTrainer(pc, learning_rate=args.lr)
    flat_train = [FlatTree(t, vocab) for t in train]
    flat_dev = [FlatTree(t, vocab) for t in dev]
    say(f"{source}: {len(train)} train / {len(dev)} dev trees, vocab {len(vocab)}, "
        f"{pc.parameter_count()} parameters, backend {dy.get_backend().name}")
    history = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        losses = train_epoch(model, trainer, flat_train, args.batch_size)
        dt = time.perf_counter() - t0
        acc = accuracy(model, flat_dev)
        history.append({"loss": float(np.mean(losses)), "dev_acc": acc, "seconds": dt})
        say(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}  dev acc {acc:.3f}  {len(train) / dt:.0f} trees/s")
    return {"history": history, "source": source, "vocab": len(vocab)}


if __name__ == "__main__":
    main(sys.argv[1:])
