"""Tree-FC (a recursive neural network) as Cavs vertex functions.

    leaf:  h = E[word]                                   (pull only: hoisted)
    node:  h = tanh(W_l h_l + W_r h_r + b)               (once per task of the recursion)
    loss:  softmax cross-entropy of W_out h_root + b_out (imperative code on the pushed h)

    python examples/tree_fc.py                 # SST if ../shared/data is present, else synthetic
    python examples/tree_fc.py --hidden 256 --epochs 3
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Vocab

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parse_example_args  # noqa: E402
from cavs_treelstm import FlatTree  # noqa: E402
from treelstm import load_trees, minibatches  # noqa: E402


class TreeFC:
    def __init__(self, pc: dy.ParameterCollection, n_words: int, hidden: int, n_labels: int):
        self.E = pc.add_lookup_parameters((n_words, hidden), name="E")
        self.W_l = pc.add_parameters((hidden, hidden), name="W_l")
        self.W_r = pc.add_parameters((hidden, hidden), name="W_r")
        self.b = pc.add_parameters((hidden,), init=dy.ConstInitializer(0.0), name="b")
        self.W_out = pc.add_parameters((n_labels, hidden), name="W_out")
        self.b_out = pc.add_parameters((n_labels,), init=dy.ConstInitializer(0.0), name="b_out")

        @dy.cavs.vertex_function(arity=0)
        def leaf(v):
            h = v.pull()
            v.scatter(h)
            v.push(h)

        @dy.cavs.vertex_function(arity=2)
        def node(v):
            h = dy.tanh(dy.affine_transform([self.b, self.W_l, v.gather(0), self.W_r, v.gather(1)]))
            v.scatter(h)
            v.push(h)
        self.functions = {"leaf": leaf, "node": node}

    def scores(self, trees: list[FlatTree]) -> list:
        out = dy.cavs.run(self.functions, [t.graph() for t in trees], pull=(self.E, [t.words for t in trees]))
        return [dy.affine_transform([self.b_out, self.W_out, h]) for h in out.roots()]

    def loss(self, trees: list[FlatTree]):
        return dy.esum([dy.pickneglogsoftmax(s, t.label) for s, t in zip(self.scores(trees), trees)])


def parse_args(argv=None) -> argparse.Namespace:
    return parse_example_args(__doc__, argv, train=400, dev=200, epochs=2, batch_size=32, hidden=64, lr=0.05, seed=1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    say = (lambda *a: None) if args.quiet else print
    train, dev, source = load_trees(args.train, args.dev, args.seed)
    dy.reset_random_seed(args.seed)
    vocab = Vocab.build(w for t in train for w in t.words())
    pc = dy.ParameterCollection()
    model = TreeFC(pc, len(vocab), args.hidden, n_labels=5)
    trainer = dy.AdagradTrainer(pc, learning_rate=args.lr)
    train_f, dev_f = [FlatTree(t, vocab) for t in train], [FlatTree(t, vocab) for t in dev]
    say(f"{source}: {len(train)} train / {len(dev)} dev trees, hidden {args.hidden}")
    history = []
    for epoch in range(args.epochs):
        t0, losses = time.perf_counter(), []
        for batch in minibatches(train_f, args.batch_size):
            dy.renew_cg()
            loss = model.loss(batch) * (1.0 / len(batch))
            losses.append(loss.value())
            loss.backward()
            trainer.update()
        dt = time.perf_counter() - t0
        correct = 0
        for batch in minibatches(dev_f, 64):
            dy.renew_cg()
            scores = model.scores(batch)
            correct += sum(int(np.argmax(s.npvalue())) == t.label for s, t in zip(scores, batch))
        acc = correct / max(len(dev_f), 1)
        history.append({"loss": float(np.mean(losses)), "dev_acc": acc, "seconds": dt})
        say(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}  dev acc {acc:.3f}  {len(train) / dt:.0f} trees/s")
    return {"history": history, "source": source}


if __name__ == "__main__":
    main(sys.argv[1:])
