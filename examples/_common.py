"""What the training examples share: their command-line options."""
from __future__ import annotations

import argparse
import time
from typing import Callable

import dynagraph as dy


def parse_example_args(doc: str, argv=None, **defaults) -> argparse.Namespace:
    """An option per keyword (`batch_size=32` -> `--batch-size`, typed by its default), plus --quiet."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, value in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value,
                        help=f"(default {value})")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    return ap.parse_args(argv)


def train_epoch(items: list, batch_size: int, losses_of: Callable, trainer) -> tuple[list, float]:
    """One SGD pass: per minibatch a fresh graph, the mean of `losses_of(batch)`, backward,
    update. Returns the minibatch losses and the seconds it took."""
    t0, out = time.perf_counter(), []
    for k in range(0, len(items), batch_size):
        dy.renew_cg()
        parts = losses_of(items[k:k + batch_size])
        loss = dy.esum(parts) * (1.0 / len(parts))
        out.append(loss.value())
        loss.backward()
        trainer.update()
    return out, time.perf_counter() - t0
