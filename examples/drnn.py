"""DRNN-style top-down tree generation over SST trees (after Alvarez-Melis and Jaakkola, 2017).

A node's state comes from its parent's: h_left = tanh(W_l h + b), h_right = tanh(W_r h + U h_left + b).
At each node the model predicts its sentiment label and whether it expands into two children;
a leaf predicts its word. Training follows the gold trees (teacher forcing). Generation reads
the expansion probability at every node, a value read inside each sample's recursion: inside
dy.autobatch_map every tree's frontier node parks, and one evaluation serves all trees.

    python examples/drnn.py                     # SST if ../shared/data is present
    python examples/drnn.py --sequential 1      # the same code one tree at a time
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Tree, Vocab, read_sst, shared_data_path, synthetic_trees

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse_example_args  # noqa: E402

DEFAULTS = dict(train=400, generate=32, epochs=2, batch_size=32, hidden=32, max_depth=6, seed=1, sequential=0)


class DRNN:
    def __init__(self, pc: dy.ParameterCollection, n_words: int, hidden: int, n_labels: int = 5):
        self.root = pc.add_parameters(hidden)
        self.Wl, self.Wr, self.U = (pc.add_parameters((hidden, hidden)) for _ in range(3))
        self.b = pc.add_parameters(hidden, init=0.0)
        self.label = pc.add_parameters((n_labels, hidden))
        self.expand = pc.add_parameters((1, hidden))
        self.word = pc.add_parameters((n_words, hidden))

    def children(self, h):
        left = dy.tanh(self.Wl * h + self.b)
        return left, dy.tanh(self.Wr * h + self.U * left + self.b)

    def loss(self, tree: Tree, vocab: Vocab):
        """Teacher forced over the gold tree (unary chains collapse to their child)."""
        losses, todo = [], [(tree, dy.tanh(self.root))]
        while todo:
            node, h = todo.pop()
            while len(node.children) == 1:
                node = node.children[0]
            losses.append(dy.pickneglogsoftmax(self.label * h, node.label))
            branch = dy.logistic(self.expand * h)
            if node.is_leaf():
                losses += [-dy.log(1.0 - branch + 1e-9), dy.pickneglogsoftmax(self.word * h, vocab[node.word])]
            else:
                losses.append(-dy.log(branch + 1e-9))
                todo += zip(node.children, self.children(h))
        return dy.esum(losses)

    def generate(self, seed: int, max_depth: int) -> tuple[str, int]:
        """A tree in SST's bracket format, sampled with the sample's own seeded stream; its size."""
        rng = np.random.default_rng(seed)

        def grow(h, depth):
            label_scores = self.label * h  # recorded before the read, so the same chunk computes it
            p = dy.logistic(self.expand * h).scalar_value()  # a read: parks this tree
            label = int(np.argmax(label_scores.npvalue()))
            if depth < max_depth and rng.random() < p:
                left, right = self.children(h)
                (a, na), (b, nb) = grow(left, depth + 1), grow(right, depth + 1)
                return f"({label} {a} {b})", na + nb + 1
            word = int(np.argmax((self.word * h).npvalue()))
            return f"({label} w{word})", 1

        return grow(dy.tanh(self.root), 0)


def load(n: int, seed: int) -> tuple[list[Tree], str]:
    path = shared_data_path("sst", "train.txt")
    if path:
        rng = np.random.default_rng(seed)
        trees = read_sst(path)
        return [trees[i] for i in rng.permutation(len(trees))[:n]], "SST"
    return synthetic_trees(n, vocab_size=300, max_len=12, seed=seed), "synthetic"


def parse_args(argv=None):
    return parse_example_args(__doc__, argv, **DEFAULTS)


def main(argv=None) -> dict:
    args = parse_args(argv)
    dy.config.set(random_seed=args.seed)
    trees, source = load(args.train, args.seed)
    vocab = Vocab.build(w for t in trees for w in t.words())
    pc = dy.ParameterCollection()
    model = DRNN(pc, len(vocab), args.hidden)
    trainer = dy.AdamTrainer(pc, 0.005)
    concurrent, losses = not args.sequential, []
    for epoch in range(args.epochs):
        for k in range(0, len(trees), args.batch_size):
            batch = trees[k:k + args.batch_size]
            dy.renew_cg()
            loss = dy.esum(dy.autobatch_map(lambda t: model.loss(t, vocab), batch, concurrent=concurrent))
            loss = loss * (1.0 / len(batch))
            losses.append(loss.value())
            loss.backward()
            trainer.update()
        if not args.quiet:
            print(f"[{source}] epoch {epoch}: loss per tree {np.mean(losses[-(len(trees) // args.batch_size):]):.2f}")
    dy.renew_cg()
    t0 = time.perf_counter()
    made = dy.autobatch_map(lambda s: model.generate(s, args.max_depth), range(args.generate), concurrent=concurrent)
    out = {"losses": losses, "source": source, "trees": made, "batches": dy.cg().stats.batches,
           "rate": args.generate / (time.perf_counter() - t0)}
    if not args.quiet:
        print(f"generated {args.generate} trees ({np.mean([n for _, n in made]):.1f} nodes on average): "
              f"{out['batches']} batches, {out['rate']:.0f} trees/s "
              f"({'one by one' if args.sequential else 'concurrent'}); e.g. {made[0][0][:100]}")
    return out


if __name__ == "__main__":
    main()
