"""A graph-structured RNN over DAGs whose vertices have up to K > 2 predecessors.

Cavs calls a vertex's inputs its *children*: here the predecessors in a random
DAG (up to --max-parents of them). The vertex function sums what the children
scattered (missing ones gather zeros), so one function with arity K covers every
in-degree:

    h_v = tanh(W x_v + U sum_k gather(k) + b);  scores_v = W_out h_v + b_out

Task (synthetic, learnable only through the recursion): predict the length of the
longest path from a source to v, capped at --classes - 1.

    python examples/dag_rnn.py
    python examples/dag_rnn.py --max-parents 6 --hidden 128
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import dynagraph as dy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parse_example_args, train_epoch  # noqa: E402


def random_dag(rng: np.random.Generator, n: int, max_parents: int, vocab: int) -> tuple[list, list, list]:
    """(children lists, input tokens, labels = capped longest-path depth); vertices in topological order."""
    children, depth = [], []
    for v in range(n):
        k = int(rng.integers(0, min(v, max_parents) + 1)) if v else 0
        kids = sorted(int(c) for c in rng.choice(v, size=k, replace=False)) if k else []
        children.append(kids)
        depth.append(1 + max(depth[c] for c in kids) if kids else 0)
    return children, [int(t) for t in rng.integers(0, vocab, n)], depth


class DagRNN:
    def __init__(self, pc: dy.ParameterCollection, vocab: int, hidden: int, classes: int, max_parents: int):
        self.E = pc.add_lookup_parameters((vocab, hidden), name="E")
        self.W = pc.add_parameters((hidden, hidden), name="W")
        self.U = pc.add_parameters((hidden, hidden), name="U")
        self.b = pc.add_parameters((hidden,), init=dy.ConstInitializer(0.0), name="b")
        self.W_out = pc.add_parameters((classes, hidden), name="W_out")
        self.b_out = pc.add_parameters((classes,), init=dy.ConstInitializer(0.0), name="b_out")
        self.cell = dy.cavs.vertex_function(self._cell, arity=max_parents, state=hidden, name="dag")

    def _cell(self, v) -> None:
        h = dy.tanh(self.W * v.pull() + self.U * v.gather_sum() + self.b)  # W x: hoisted
        v.scatter(h)
        v.push(dy.affine_transform([self.b_out, self.W_out, h]))            # lazy: after the recursion

    def scores(self, dags: list) -> list:
        out = dy.cavs.run(self.cell, [c for c, _, _ in dags], pull=(self.E, [x for _, x, _ in dags]))
        return [out.pushed(k) for k in range(len(dags))]

    def losses(self, dags: list) -> list:
        """A loss per vertex of every DAG."""
        return [dy.pickneglogsoftmax(s, y) for ss, (_, _, ys) in zip(self.scores(dags), dags)
                for s, y in zip(ss, ys)]


def parse_args(argv=None) -> argparse.Namespace:
    return parse_example_args(__doc__, argv, graphs=200, vertices=20, max_parents=4, classes=4, vocab=50,
                              hidden=32, epochs=3, batch_size=20, lr=0.1, seed=1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    say = (lambda *a: None) if args.quiet else print
    rng = np.random.default_rng(args.seed)
    dags = [random_dag(rng, int(rng.integers(2, args.vertices + 1)), args.max_parents, args.vocab)
            for _ in range(args.graphs)]
    dags = [(c, x, [min(d, args.classes - 1) for d in y]) for c, x, y in dags]
    split = int(0.8 * len(dags))
    train, test = dags[:split], dags[split:]
    dy.reset_random_seed(args.seed)
    pc = dy.ParameterCollection()
    model = DagRNN(pc, args.vocab, args.hidden, args.classes, args.max_parents)
    trainer = dy.AdagradTrainer(pc, learning_rate=args.lr)
    say(f"{len(train)} train / {len(test)} test DAGs, up to {args.max_parents} parents per vertex")
    history = []
    for epoch in range(args.epochs):
        losses, dt = train_epoch(train, args.batch_size, model.losses, trainer)
        dy.renew_cg()
        scores = model.scores(test)
        dy.cg().forward()
        acc = float(np.mean([int(np.argmax(s.npvalue())) == y for ss, (_, _, ys) in zip(scores, test)
                             for s, y in zip(ss, ys)]))
        history.append({"loss": float(np.mean(losses)), "test_acc": acc, "seconds": dt})
        say(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}  test acc {acc:.3f}  {len(train) / dt:.0f} DAGs/s")
    return {"history": history}


if __name__ == "__main__":
    main(sys.argv[1:])
