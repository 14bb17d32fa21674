"""An early-exit sentiment classifier over SST sentences: one shared-weight layer applied up to L times.

After each application a shared classifier reads its confidence; a sentence stops as soon as the
top class is more likely than --threshold. The read is inside each sentence's loop, so run one
sentence after another nothing batches; inside dy.autobatch_map every sentence's layer k runs as
one batch, and sentences that exit early drop out. Training supervises every layer (the sum of
the layer losses), teacher-forced to all L layers.

    python examples/early_exit.py                     # SST if ../shared/data is present
    python examples/early_exit.py --sequential 1      # the same code one sentence at a time
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Vocab, read_sst, shared_data_path, synthetic_trees

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse_example_args  # noqa: E402

DEFAULTS = dict(train=800, dev=200, epochs=3, batch_size=32, hidden=32, layers=6, threshold=0.4, seed=1,
                sequential=0)


class EarlyExit:
    def __init__(self, pc: dy.ParameterCollection, n_words: int, hidden: int, layers: int, n_labels: int = 5):
        self.layers = layers
        self.E = pc.add_lookup_parameters((n_words, hidden))
        self.W, self.b = pc.add_parameters((hidden, hidden)), pc.add_parameters(hidden, init=0.0)
        self.O, self.o = pc.add_parameters((n_labels, hidden)), pc.add_parameters(n_labels, init=0.0)

    def layer_outputs(self, words: list[int]):
        """The input (mean embedding) and the shared layer applied again and again, lazily."""
        h = dy.average([self.E[w] for w in words])
        for _ in range(self.layers):
            h = dy.tanh(self.W * h + self.b) + h  # a residual: deeper layers refine, not replace
            yield h, self.O * h + self.o

    def loss(self, sample) -> dy.Expression:
        words, label = sample
        return dy.esum([dy.pickneglogsoftmax(scores, label) for _, scores in self.layer_outputs(words)])

    def predict(self, words: list[int], threshold: float) -> tuple[int, int]:
        """(label, layers used): exit at the first layer whose top probability passes threshold."""
        for depth, (_, scores) in enumerate(self.layer_outputs(words), 1):
            probs = dy.softmax(scores).npvalue()  # a read: parks this sentence
            if probs.max() > threshold:
                break
        return int(probs.argmax()), depth


def load(n_train: int, n_dev: int, seed: int):
    rng = np.random.default_rng(seed)
    train_path, dev_path = shared_data_path("sst", "train.txt"), shared_data_path("sst", "dev.txt")
    if train_path and dev_path:
        pick = lambda xs, n: [xs[i] for i in rng.permutation(len(xs))[:n]]  # noqa: E731
        return pick(read_sst(train_path), n_train), pick(read_sst(dev_path), n_dev), "SST"
    trees = synthetic_trees(n_train + n_dev, vocab_size=300, max_len=15, seed=seed)
    for t in trees:  # learnable synthetic labels: a function of the words
        t.label = sum(int(w[1:]) % 5 for w in t.words()) % 5 if t.words()[0][1:].isdigit() else 0
    return trees[:n_train], trees[n_train:], "synthetic"


def parse_args(argv=None):
    return parse_example_args(__doc__, argv, **DEFAULTS)


def main(argv=None) -> dict:
    args = parse_args(argv)
    dy.config.set(random_seed=args.seed)
    train, dev, source = load(args.train, args.dev, args.seed)
    vocab = Vocab.build(w for t in train for w in t.words())
    data = lambda trees: [([vocab[w] for w in t.words()], t.label) for t in trees]  # noqa: E731
    train, dev = data(train), data(dev)
    pc = dy.ParameterCollection()
    model = EarlyExit(pc, len(vocab), args.hidden, args.layers)
    trainer = dy.AdamTrainer(pc, 0.005)
    concurrent, losses = not args.sequential, []
    for epoch in range(args.epochs):
        for k in range(0, len(train), args.batch_size):
            batch = train[k:k + args.batch_size]
            dy.renew_cg()
            loss = dy.esum(dy.autobatch_map(model.loss, batch, concurrent=concurrent)) * (1.0 / len(batch))
            losses.append(loss.value())
            loss.backward()
            trainer.update()
        if not args.quiet:
            print(f"[{source}] epoch {epoch}: loss {np.mean(losses[-(len(train) // args.batch_size):]):.3f}")
    t0, preds, batches = time.perf_counter(), [], 0
    for k in range(0, len(dev), args.batch_size):
        dy.renew_cg()
        preds += dy.autobatch_map(lambda s: model.predict(s[0], args.threshold), dev[k:k + args.batch_size],
                                  concurrent=concurrent)
        batches += dy.cg().stats.batches
    out = {"losses": losses, "source": source, "preds": preds, "batches": batches,
           "accuracy": float(np.mean([p == s[1] for (p, _), s in zip(preds, dev)])),
           "mean_layers": float(np.mean([d for _, d in preds])), "rate": len(dev) / (time.perf_counter() - t0)}
    if not args.quiet:
        print(f"dev: accuracy {out['accuracy']:.1%}, {out['mean_layers']:.2f} of {args.layers} layers on average, "
              f"{batches} batches, {out['rate']:.0f} sentences/s ({'one by one' if args.sequential else 'concurrent'})")
    return out


if __name__ == "__main__":
    main()
