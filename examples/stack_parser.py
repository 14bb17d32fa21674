"""A stack-RNN shift-reduce parser over SST trees, samples run concurrently with dy.autobatch_map.

Training follows the gold actions (teacher forcing: SHIFT at a leaf, REDUCE at a binary node,
in post-order) and learns the root's sentiment. Inference picks every action by argmax of the
model's own scores: a value read in the middle of each sample's loop. Inside dy.autobatch_map
each read parks its sample, and one evaluation serves all the parked parsers of the minibatch.

    python examples/stack_parser.py                   # SST if ../shared/data is present
    python examples/stack_parser.py --sequential 1    # the same code one sample at a time

State: shifting word w pushes h = tanh(W_x E[w] + W_h top + b); reducing the two top items
l, r pushes tanh(W_l l + W_r r + b). Actions: softmax(A [top; buffer head] + a).
"""
from __future__ import annotations

import sys
import time

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Tree, Vocab, read_sst, shared_data_path, synthetic_trees

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _common import parse_example_args  # noqa: E402

SHIFT, REDUCE = 0, 1


def gold_actions(tree: Tree) -> list[int]:
    """Post-order: a leaf is shifted, a binary node reduces its two children (unary nodes pass)."""
    acts = []
    for n in tree.nodes_postorder():
        if n.is_leaf():
            acts.append(SHIFT)
        elif len(n.children) == 2:
            acts.append(REDUCE)
    return acts


class StackParser:
    def __init__(self, pc: dy.ParameterCollection, n_words: int, hidden: int, n_labels: int):
        self.h = hidden
        self.E = pc.add_lookup_parameters((n_words, hidden))
        self.Wx, self.Wh, self.Wl, self.Wr = (pc.add_parameters((hidden, hidden)) for _ in range(4))
        self.b = pc.add_parameters(hidden, init=0.0)
        self.A, self.a = pc.add_parameters((2, 2 * hidden)), pc.add_parameters(2, init=0.0)
        self.O, self.o = pc.add_parameters((n_labels, hidden)), pc.add_parameters(n_labels, init=0.0)

    def parse(self, words: list[int], gold: list[int] | None):
        """(loss or None, actions taken, root label scores). gold=None: argmax actions."""
        stack, buf, losses, taken = [], list(reversed(words)), [], []
        empty = dy.zeros(self.h)
        while buf or len(stack) > 1:
            top = stack[-1] if stack else empty
            head = self.E[buf[-1]] if buf else empty
            scores = self.A * dy.concatenate([top, head]) + self.a
            if gold is not None:
                act = gold[len(taken)]
                with dy.phase(1):  # no read needs the loss: one batch after every parse's last read
                    losses.append(dy.pickneglogsoftmax(scores, act))
            elif len(stack) < 2:
                act = SHIFT
            elif not buf:
                act = REDUCE
            else:  # the model decides: a value read, which parks this sample in dy.autobatch_map
                act = int(np.argmax(scores.npvalue()))
            taken.append(act)
            with dy.ghost():  # both arms padded to one length: the next step stays aligned (depth scheduler)
                if act == SHIFT:
                    stack.append(dy.tanh(self.Wx * self.E[buf.pop()] + self.Wh * top + self.b))
                else:
                    r, l_ = stack.pop(), stack.pop()
                    stack.append(dy.tanh(self.Wl * l_ + self.Wr * r + self.b))
        label_scores = self.O * stack[0] + self.o
        return (dy.esum(losses) if losses else None), taken, label_scores


def load(n_train: int, n_dev: int, seed: int):
    train_path, dev_path = shared_data_path("sst", "train.txt"), shared_data_path("sst", "dev.txt")
    rng = np.random.default_rng(seed)
    if train_path and dev_path:
        train, dev = read_sst(train_path), read_sst(dev_path)
        pick = lambda xs, n: [xs[i] for i in rng.permutation(len(xs))[:n]]  # noqa: E731  (files are grouped by label)
        return pick(train, n_train), pick(dev, n_dev), "SST"
    trees = synthetic_trees(n_train + n_dev, vocab_size=500, max_len=20, seed=seed)
    return trees[:n_train], trees[n_train:], "synthetic"


def main(argv=None) -> dict:
    args = parse_example_args(__doc__, argv, train=400, dev=100, epochs=2, batch_size=32, hidden=32,
                              seed=1, sequential=0)
    dy.config.set(random_seed=args.seed)
    train, dev, source = load(args.train, args.dev, args.seed)
    vocab = Vocab.build(w for t in train for w in (leaf.word for leaf in t.leaves()))
    ids = lambda t: [vocab[leaf.word] for leaf in t.leaves()]  # noqa: E731
    pc = dy.ParameterCollection()
    model = StackParser(pc, len(vocab), args.hidden, 5)
    trainer = dy.AdamTrainer(pc, 0.005)
    concurrent = not args.sequential
    losses = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        for k in range(0, len(train), args.batch_size):
            batch = train[k:k + args.batch_size]
            dy.renew_cg()

            def sample_loss(tree):
                act_loss, _, label_scores = model.parse(ids(tree), gold_actions(tree))
                return act_loss + dy.pickneglogsoftmax(label_scores, tree.label)

            loss = dy.esum(dy.autobatch_map(sample_loss, batch, concurrent=concurrent)) * (1.0 / len(batch))
            losses.append(loss.value())
            loss.backward()
            trainer.update()
        if not args.quiet:
            print(f"[{source}] epoch {epoch}: loss {np.mean(losses[-len(train) // args.batch_size:]):.3f}"
                  f" ({len(train) / (time.perf_counter() - t0):.0f} trees/s train)")
    t0, exact, correct, batches = time.perf_counter(), 0, 0, 0
    for k in range(0, len(dev), args.batch_size):
        batch = dev[k:k + args.batch_size]
        dy.renew_cg()

        def predict(tree):
            _, taken, label_scores = model.parse(ids(tree), None)  # argmax actions: reads park
            return taken, int(np.argmax(label_scores.npvalue()))

        for tree, (taken, label) in zip(batch, dy.autobatch_map(predict, batch, concurrent=concurrent)):
            exact += taken == gold_actions(tree)
            correct += label == tree.label
        batches += dy.cg().stats.batches
    rate = len(dev) / (time.perf_counter() - t0)
    out = {"losses": losses, "exact_trees": exact / len(dev), "root_acc": correct / len(dev),
           "dev_batches": batches, "parse_rate": rate, "source": source}
    if not args.quiet:
        print(f"dev: {out['exact_trees']:.1%} trees parsed exactly, root accuracy {out['root_acc']:.1%}, "
              f"{batches} batches, {rate:.0f} trees/s ({'one by one' if args.sequential else 'concurrent'})")
    return out


def parse_args(argv=None):
    return parse_example_args(__doc__, argv, train=400, dev=100, epochs=2, batch_size=32, hidden=32,
                              seed=1, sequential=0)


if __name__ == "__main__":
    main()
