"""One TreeLSTM written three ways, on the same weights and data:

  1. op level:          per tree, per node, plain dy.* ops (DyNet style); the
                        scheduler batches nodes across trees (agenda or depth);
  2. static subgraphs:  the leaf and node cells as dy.block, one coarse node per
                        tree node, each block traced once;
  3. vertex functions:  dy.cavs: the cells declared once as vertex functions and
                        evaluated over the whole minibatch, task by task.

    python examples/treelstm_three_ways.py                # SST if present, else synthetic
    python examples/treelstm_three_ways.py --hidden 256 --batches 5

Prints, for each way, the loss of every minibatch (identical up to rounding: the
three compute the same function) and the time per training step.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


import dynagraph as dy
from dynagraph.datasets import Vocab

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cavs_treelstm import CavsTreeLSTM, FlatTree  # noqa: E402
from treelstm import load_trees, minibatches  # noqa: E402


def _root_loss(m: CavsTreeLSTM, h, label: int):
    return dy.pickneglogsoftmax(dy.affine_transform([m.b_out, m.W_out, h]), label)


# ------------------------------------------------------------------ 1. op level
def op_level_losses(m: CavsTreeLSTM, trees: list[FlatTree]) -> list:
    losses = []
    for t in trees:
        state: list = []
        for kids, w in zip(t.children, t.words):
            if not kids:
                state.append(m.leaf_math(dy.lookup(m.E, w)))
            else:
                (h_l, c_l), (h_r, c_r) = state[kids[0]], state[kids[1]]
                state.append(m.node_math(h_l, c_l, h_r, c_r))
        losses.append(_root_loss(m, state[-1][0], t.label))
    return losses


# ------------------------------------------------------------------ 2. dy.block
class BlockCells:
    """The same cells as static subgraphs: traced once, then one node per tree node."""

    def __init__(self, m: CavsTreeLSTM):
        self.leaf = dy.block(lambda w: m.leaf_math(dy.lookup(m.E, w)), name="leaf")
        self.node = dy.block(m.node_math, name="node")


def block_losses(m: CavsTreeLSTM, cells: BlockCells, trees: list[FlatTree]) -> list:
    losses = []
    for t in trees:
        state: list = []
        for kids, w in zip(t.children, t.words):
            state.append(cells.leaf(w) if not kids else cells.node(*state[kids[0]], *state[kids[1]]))
        losses.append(_root_loss(m, state[-1][0], t.label))
    return losses


# ------------------------------------------------------------------ 3. vertex functions
def cavs_losses(m: CavsTreeLSTM, trees: list[FlatTree]) -> list:
    return m.losses(trees)


WAYS = ("op-level", "block", "vertex")


def losses_for(way: str, m: CavsTreeLSTM, cells: BlockCells, trees: list[FlatTree]) -> list:
    if way == "op-level":
        return op_level_losses(m, trees)
    if way == "block":
        return block_losses(m, cells, trees)
    return cavs_losses(m, trees)


def step(way: str, m: CavsTreeLSTM, cells: BlockCells, trainer, trees: list[FlatTree],
         scheduler: str | None = None) -> float:
    dy.renew_cg(scheduler=scheduler)
    loss = dy.esum(losses_for(way, m, cells, trees))
    value = loss.value()
    if trainer is not None:
        loss.backward()
        trainer.update()
    return value


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", type=int, default=256, help="training trees (default 256)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=3, help="timed minibatches per way")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--scheduler", default=None, choices=dy.schedulers.available(),
                    help="scheduler of the op-level way (default: dynagraph's default)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    say = (lambda *a: None) if args.quiet else print
    trees, _, source = load_trees(args.trees, 0, args.seed)
    vocab = Vocab.build(w for t in trees for w in t.words())
    flat = [FlatTree(t, vocab) for t in trees]
    batches = minibatches(flat, args.batch_size)[:args.batches + 1]
    dy.reset_random_seed(args.seed)
    pc = dy.ParameterCollection()
    m = CavsTreeLSTM(pc, len(vocab), args.hidden, args.hidden, n_labels=5)
    cells = BlockCells(m)
    initial = {p.name(): p.as_array() for p in pc.parameters_list() + pc.lookup_parameters_list()}
    say(f"{source}: {len(flat)} trees, hidden {args.hidden}, batch {args.batch_size}, "
        f"backend {dy.get_backend().name}")
    result = {"source": source}
    for way in WAYS:
        for p in pc.parameters_list():  # every way starts from the same weights
            p.set_value(initial[p.name()])
        for p in pc.lookup_parameters_list():
            p.init_from_array(initial[p.name()])
        trainer = dy.SimpleSGDTrainer(pc, learning_rate=args.lr)
        sched = args.scheduler if way == "op-level" else None
        step(way, m, cells, trainer, batches[0], sched)  # warm-up: traces blocks and vertex functions
        losses, t0 = [], time.perf_counter()
        for b in batches[1:]:
            losses.append(step(way, m, cells, trainer, b, sched))
        dt = (time.perf_counter() - t0) / max(len(batches) - 1, 1)
        result[way] = {"losses": losses, "seconds_per_step": dt}
        say(f"{way:>9}: losses {' '.join(f'{x:.4f}' for x in losses)}   {dt * 1e3:8.1f} ms/step  "
            f"{args.batch_size / dt:7.0f} trees/s")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
