"""A sequence LSTM tagger as a Cavs chain graph: token t's only child is token t-1.

One vertex function, declared once, is the whole LSTM step; dy.cavs.run batches
step t of every sentence of the minibatch (a task per position), and the tag
scores, which only push() needs, are computed after the recursion for all tokens
at once (lazy batching). Word projections W x (pull only) are hoisted the same way.

    [i, f, o, u] = W x_t + U h_{t-1} + b;  c = s(f) c_{t-1} + s(i) t(u);  h = s(o) t(c)
    scores_t = W_out h_t + b_out  ->  softmax cross-entropy against tag_t

    python examples/chain_lstm.py              # WikiNER if ../shared/data is present, else synthetic
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Vocab, read_wikiner, shared_data_path, synthetic_tagging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parse_example_args, train_epoch  # noqa: E402


class ChainLSTM:
    def __init__(self, pc: dy.ParameterCollection, n_words: int, n_tags: int, emb: int, hidden: int):
        H = self.H = hidden
        self.E = pc.add_lookup_parameters((n_words, emb), name="E")
        self.W = pc.add_parameters((4 * H, emb), name="W")
        self.U = pc.add_parameters((4 * H, H), name="U")
        self.b = pc.add_parameters((4 * H,), init=dy.ConstInitializer(0.0), name="b")
        self.W_out = pc.add_parameters((n_tags, H), name="W_out")
        self.b_out = pc.add_parameters((n_tags,), init=dy.ConstInitializer(0.0), name="b_out")
        # The state (h, c) is declared: no function scatters it without gathering it first.
        self.step = dy.cavs.vertex_function(self._step, arity=1, state=[H, H], name="lstm")

    def _step(self, v) -> None:
        H = self.H
        h_prev, c_prev = v.gather(0)              # zeros at the first token
        g = self.W * v.pull() + self.U * h_prev + self.b
        i, f = dy.logistic(dy.pick_range(g, 0, H)), dy.logistic(dy.pick_range(g, H, 2 * H))
        o, u = dy.logistic(dy.pick_range(g, 2 * H, 3 * H)), dy.tanh(dy.pick_range(g, 3 * H, 4 * H))
        c = dy.cmult(i, u) + dy.cmult(f, c_prev)
        h = dy.cmult(o, dy.tanh(c))
        v.scatter(h, c)
        v.push(dy.affine_transform([self.b_out, self.W_out, h]))

    def scores(self, sents: list) -> list:
        """Per sentence, the pushed tag scores of every token."""
        chains = [[[]] + [[t - 1] for t in range(1, len(ws))] for ws, _ in sents]
        out = dy.cavs.run(self.step, chains, pull=(self.E, [ws for ws, _ in sents]))
        return [out.pushed(k) for k in range(len(sents))]

    def accuracy(self, sents: list) -> float:
        dy.renew_cg()
        scores = self.scores(sents)
        dy.cg().forward()
        hits = [int(np.argmax(s.npvalue())) == t for ss, (_, tags) in zip(scores, sents) for s, t in zip(ss, tags)]
        return float(np.mean(hits)) if hits else 0.0

    def losses(self, sents: list) -> list:
        return [dy.pickneglogsoftmax(s, tag) for ss, (_, tags) in zip(self.scores(sents), sents)
                for s, tag in zip(ss, tags)]


def load(n_train: int, n_test: int, seed: int):
    path = shared_data_path("wikiner", "dev.txt")
    if path:
        sents = read_wikiner(path)
        order = np.random.default_rng(seed).permutation(len(sents))
        sents, source = [sents[i] for i in order[:n_train + n_test]], "WikiNER"
    else:
        sents, source = synthetic_tagging(n_train + n_test, min_len=5, max_len=30, vocab_size=2000,
                                          n_tags=10, seed=seed), "synthetic"
    words = Vocab.build(w.lower() for s in sents[:n_train] for w, _ in s)
    tags = Vocab.build((t for s in sents for _, t in s), unk="<none>")
    data = [([words[w.lower()] for w, _ in s], [tags[t] for _, t in s]) for s in sents]
    return data[:n_train], data[n_train:], len(words), len(tags), source


def parse_args(argv=None) -> argparse.Namespace:
    return parse_example_args(__doc__, argv, train=300, test=100, epochs=2, batch_size=32, emb_dim=32, hidden=64, lr=0.1, seed=1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    say = (lambda *a: None) if args.quiet else print
    train, test, n_words, n_tags, source = load(args.train, args.test, args.seed)
    dy.reset_random_seed(args.seed)
    pc = dy.ParameterCollection()
    model = ChainLSTM(pc, n_words, n_tags, args.emb_dim, args.hidden)
    trainer = dy.AdagradTrainer(pc, learning_rate=args.lr)
    say(f"{source}: {len(train)} train / {len(test)} test sentences, {n_tags} tags")
    history = []
    for epoch in range(args.epochs):
        losses, dt = train_epoch(train, args.batch_size, model.losses, trainer)
        acc = model.accuracy(test)
        history.append({"loss": float(np.mean(losses)), "test_acc": acc, "seconds": dt})
        say(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}  test acc {acc:.3f}  "
            f"{sum(len(w) for w, _ in train) / dt:.0f} tokens/s")
    return {"history": history, "source": source}


if __name__ == "__main__":
    main(sys.argv[1:])
