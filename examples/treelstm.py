"""N-ary (binary) TreeLSTM sentiment classifier on SST, written per sample.

Each tree is processed node by node with plain dy.* ops, exactly as one would in
DyNet; dynagraph records every tree of a minibatch into one graph and batches
nodes with the same signature across trees and across depths.

    python examples/treelstm.py                    # SST if ../shared/data is present
    python examples/treelstm.py --scheduler none   # no batching, for comparison

Cell (Tai et al., 2015, N-ary TreeLSTM with N = 2), at a node with children l, r:
    [i, f_l, f_r, o, u] = U_l h_l + U_r h_r + b
    c = sig(i) * tanh(u) + sig(f_l) * c_l + sig(f_r) * c_r,   h = sig(o) * tanh(c)
A leaf uses W x (x = word embedding) for i, o, u and has no forget gates.
The loss is the softmax cross-entropy of the root label.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Tree, Vocab, read_sst, shared_data_path, synthetic_trees

try:
    from tqdm import tqdm
except ImportError:  # tqdm is a dependency, but keep the example runnable without it
    def tqdm(it, **_):
        return it


class TreeLSTM:
    """Parameters and per-node code of a binary TreeLSTM classifier."""

    def __init__(self, pc: dy.ParameterCollection, n_words: int, emb_dim: int, hidden: int, n_labels: int):
        self.h = hidden
        self.E = pc.add_lookup_parameters((n_words, emb_dim), name="E")
        self.W_iou = pc.add_parameters((3 * hidden, emb_dim), name="W_iou")
        self.b_iou = pc.add_parameters((3 * hidden,), init=dy.ConstInitializer(0.0), name="b_iou")
        self.U_l = pc.add_parameters((5 * hidden, hidden), name="U_l")
        self.U_r = pc.add_parameters((5 * hidden, hidden), name="U_r")
        self.b = pc.add_parameters((5 * hidden,), init=dy.ConstInitializer(0.0), name="b")
        self.W_out = pc.add_parameters((n_labels, hidden), name="W_out")
        self.b_out = pc.add_parameters((n_labels,), init=dy.ConstInitializer(0.0), name="b_out")
        self._op_level = leaf, node = (self.leaf, self.node)
        # The same cells as static subgraphs: traced once, one coarse node per call.
        leaf_block = dy.block(leaf, name="leaf")
        node_block = dy.block(lambda hl, cl, hr, cr: node((hl, cl), (hr, cr)), name="node")
        self._blocked = (leaf_block, lambda left, right: node_block(*left, *right))

    def set_blocked(self, on: bool) -> None:
        """Record each tree node as one dy.block call instead of ~15 ops (same numbers)."""
        self.leaf, self.node = self._blocked if on else self._op_level

    def leaf(self, word_id: int):
        h = self.h
        g = dy.affine_transform([self.b_iou, self.W_iou, dy.lookup(self.E, word_id)])
        return dy.tree_lstm_update(g, [], h)

    def node(self, left, right):
        (h_l, c_l), (h_r, c_r), h = left, right, self.h
        g = dy.affine_transform([self.b, self.U_l, h_l, self.U_r, h_r])
        return dy.tree_lstm_update(g, [c_l, c_r], h)

    def encode(self, tree: Tree, vocab: Vocab):
        """(h, c) of the root. Post-order iteration: SST trees can be 30+ levels deep."""
        state: dict = {}
        for n in tree.nodes_postorder():
            if n.is_leaf():
                state[id(n)] = self.leaf(vocab[n.word])
            elif len(n.children) == 1:  # unary node (not in binarized SST): pass through
                state[id(n)] = state[id(n.children[0])]
            else:
                left = state[id(n.children[0])]
                for child in n.children[1:]:  # n-ary nodes are folded left to right
                    left = self.node(left, state[id(child)])
                state[id(n)] = left
        return state[id(tree)]

    def scores(self, tree: Tree, vocab: Vocab):
        h, _ = self.encode(tree, vocab)
        return dy.affine_transform([self.b_out, self.W_out, h])

    def loss(self, tree: Tree, vocab: Vocab):
        return dy.pickneglogsoftmax(self.scores(tree, vocab), tree.label)


# ----------------------------------------------------------------------------- data
def load_trees(n_train: int, n_dev: int, seed: int = 0) -> tuple[list[Tree], list[Tree], str]:
    """SST from ../shared/data when present, otherwise synthetic SST-like trees.

    Synthetic labels are made learnable: the root label is a function of the words.
    """
    train_path, dev_path = shared_data_path("sst", "train.txt"), shared_data_path("sst", "dev.txt")
    if train_path and dev_path:
        # The files are grouped by label; a seeded shuffle makes a prefix representative.
        rng = np.random.default_rng(seed)
        train, dev = read_sst(train_path), read_sst(dev_path)
        return _sample(train, n_train, rng), _sample(dev, n_dev, rng), "SST"
    trees = synthetic_trees(n_train + n_dev, vocab_size=2000, seed=seed)
    for t in trees:
        t.label = _synthetic_label(t)
    return trees[:n_train], trees[n_train:], "synthetic"


def _sample(items: list, n: int, rng: np.random.Generator) -> list:
    return [items[i] for i in rng.permutation(len(items))[:n]]


def _synthetic_label(t: Tree) -> int:
    # "Sentiment" = fraction of words with an even id, bucketed into 5 classes.
    words = t.words()
    frac = sum(int(w[1:]) % 2 == 0 for w in words) / len(words)
    return min(int(frac * 5), 4)


def minibatches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


# ------------------------------------------------------------------------ training
def train_epoch(model: TreeLSTM, trainer, trees: list[Tree], vocab: Vocab, batch_size: int,
                scheduler: str | None = None, progress: bool = True, stats: dy.stats.Stats | None = None
                ) -> list[float]:
    """One pass; returns the mean loss of each minibatch. Batch statistics go into `stats`."""
    losses = []
    batches = minibatches(trees, batch_size)
    bar = tqdm(batches, desc=f"train[{scheduler or dy.config.config.scheduler}]", unit="batch",
               disable=not progress, leave=False)
    for batch in bar:
        cg = dy.renew_cg(scheduler=scheduler)
        loss = dy.esum([model.loss(t, vocab) for t in batch]) * (1.0 / len(batch))
        value = loss.value()  # one forward over the whole minibatch graph
        loss.backward()
        trainer.update()
        losses.append(value)
        if stats is not None:
            stats.merge(cg.stats)
        if progress:
            bar.set_postfix(loss=f"{value:.3f}")
    return losses


def accuracy(model: TreeLSTM, trees: list[Tree], vocab: Vocab, batch_size: int = 64,
             scheduler: str | None = None) -> float:
    correct = 0
    for batch in minibatches(trees, batch_size):
        dy.renew_cg(scheduler=scheduler)
        scores = [model.scores(t, vocab) for t in batch]
        dy.cg().forward()  # evaluate the whole minibatch at once, then read the values
        correct += sum(int(np.argmax(s.npvalue())) == t.label for s, t in zip(scores, batch))
    return correct / max(len(trees), 1)


def build(train: list[Tree], emb_dim: int, hidden: int, lr: float, seed: int):
    dy.reset_random_seed(seed)
    vocab = Vocab.build(w for t in train for w in t.words())
    pc = dy.ParameterCollection()
    model = TreeLSTM(pc, len(vocab), emb_dim, hidden, n_labels=5)
    trainer = dy.AdagradTrainer(pc, learning_rate=lr)  # Tai et al. (2015) used Adagrad, lr 0.05
    return pc, model, trainer, vocab


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=400, help="training trees (default 400)")
    ap.add_argument("--dev", type=int, default=200, help="dev trees (default 200)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--emb-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--scheduler", default=None, choices=dy.schedulers.available(),
                    help="batching policy (default: dynagraph's configured default)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    ap.add_argument("--plot", default=None, help="draw the loss curve to this .png/.svg (needs matplotlib: "
                    "pip install -e '.[plot]')")
    return ap.parse_args(argv)


def plot_losses(path: str, minibatch_losses: list, history: list) -> str:
    """The training loss per minibatch, with the final dev accuracy in the title."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:  # bench/ holds the shared chart helper
        sys.path.insert(0, root)
    from bench.plot import lines
    per_epoch = max(1, len(minibatch_losses) // max(1, len(history)))
    acc = f"; dev accuracy {history[-1]['dev_acc']:.3f}" if history else ""
    return lines(path, {"train loss": minibatch_losses}, xlabel=f"minibatch ({per_epoch} per epoch)",
                 ylabel="mean loss", title=f"TreeLSTM training{acc}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    train, dev, source = load_trees(args.train, args.dev, args.seed)
    pc, model, trainer, vocab = build(train, args.emb_dim, args.hidden, args.lr, args.seed)
    say = (lambda *a: None) if args.quiet else print
    say(f"{source}: {len(train)} train / {len(dev)} dev trees, vocab {len(vocab)}, "
        f"{pc.parameter_count()} parameters, scheduler {args.scheduler or dy.config.config.scheduler}")
    history, all_losses = [], []
    for epoch in range(args.epochs):
        t0, stats = time.perf_counter(), dy.stats.Stats()
        losses = train_epoch(model, trainer, train, vocab, args.batch_size, args.scheduler,
                             progress=not args.quiet, stats=stats)
        dt = time.perf_counter() - t0
        all_losses += losses
        acc = accuracy(model, dev, vocab, scheduler=args.scheduler)
        history.append({"loss": float(np.mean(losses)), "dev_acc": acc, "seconds": dt,
                        "nodes": stats.nodes, "batches": stats.batches})
        say(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}  dev acc {acc:.3f}  "
            f"{len(train) / dt:.0f} trees/s  {stats.nodes} nodes in {stats.batches} batches")
    if args.plot:
        say(f"loss curve -> {plot_losses(args.plot, all_losses, history)}")
    return {"history": history, "source": source, "vocab": len(vocab)}


if __name__ == "__main__":
    main(sys.argv[1:])
