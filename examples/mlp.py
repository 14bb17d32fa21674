"""A two-layer MLP on the "two spirals" task, written one sample at a time.

    python examples/mlp.py

Every sample records its own small graph of dy.* ops; the minibatch's samples
all share one ComputationGraph, so dynagraph runs each layer as one batched
matrix product instead of one per sample.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import dynagraph as dy

try:
    from tqdm import tqdm
except ImportError:
    def tqdm(it, **_):
        return it


def spirals(n: int, noise: float = 0.1, turns: float = 1.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n points on two interleaved spirals (classes 0 and 1), with Gaussian noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(2, size=n)
    t = np.sqrt(rng.random(n)) * turns * 2 * np.pi  # sqrt: uniform density along the arm
    r = t / (turns * 2 * np.pi)
    angle = t + np.pi * y
    x = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1) + noise * r[:, None] * rng.normal(size=(n, 2))
    return x, y


class MLP:
    def __init__(self, pc: dy.ParameterCollection, n_in: int, hidden: int, n_out: int):
        self.W1 = pc.add_parameters((hidden, n_in))
        self.b1 = pc.add_parameters((hidden,), init=dy.ConstInitializer(0.0))
        self.W2 = pc.add_parameters((hidden, hidden))
        self.b2 = pc.add_parameters((hidden,), init=dy.ConstInitializer(0.0))
        self.W3 = pc.add_parameters((n_out, hidden))
        self.b3 = pc.add_parameters((n_out,), init=dy.ConstInitializer(0.0))

    def __call__(self, x: np.ndarray):
        h = dy.tanh(dy.affine_transform([self.b1, self.W1, dy.inputVector(x)]))
        h = dy.tanh(dy.affine_transform([self.b2, self.W2, h]))
        return dy.affine_transform([self.b3, self.W3, h])


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=1000, help="training points (default 1000)")
    ap.add_argument("--test", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05, help="Adam step size")
    ap.add_argument("--scheduler", default=None, choices=dy.schedulers.available())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def accuracy(mlp: MLP, x: np.ndarray, y: np.ndarray, scheduler=None) -> float:
    dy.renew_cg(scheduler=scheduler)
    outs = [mlp(xi) for xi in x]
    dy.cg().forward()  # one batched evaluation for the whole set
    return float(np.mean([int(np.argmax(o.npvalue())) == yi for o, yi in zip(outs, y)]))


def main(argv=None) -> dict:
    args = parse_args(argv)
    dy.reset_random_seed(args.seed)
    x, y = spirals(args.train + args.test, seed=args.seed)
    xtr, ytr, xte, yte = x[:args.train], y[:args.train], x[args.train:], y[args.train:]
    pc = dy.ParameterCollection()
    mlp = MLP(pc, 2, args.hidden, 2)
    trainer = dy.AdamTrainer(pc, alpha=args.lr)
    rng = np.random.default_rng(args.seed)
    losses = []
    bar = tqdm(range(args.epochs), desc="mlp", unit="epoch", disable=args.quiet)
    for _ in bar:
        order = rng.permutation(args.train)
        total = 0.0
        for s in range(0, args.train, args.batch_size):
            idx = order[s:s + args.batch_size]
            dy.renew_cg(scheduler=args.scheduler)
            loss = dy.esum([dy.pickneglogsoftmax(mlp(xtr[i]), int(ytr[i])) for i in idx]) * (1.0 / len(idx))
            total += loss.value() * len(idx)
            loss.backward()
            trainer.update()
        losses.append(total / args.train)
        if not args.quiet:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    acc = accuracy(mlp, xte, yte, args.scheduler)
    if not args.quiet:
        print(f"final train loss {losses[-1]:.4f}, test accuracy {acc:.3f}")
    return {"losses": losses, "test_acc": acc}


if __name__ == "__main__":
    main(sys.argv[1:])
