"""dynagraph demo: a per-sample TreeLSTM, batched automatically.

    python examples/demo.py

1. Trains the TreeLSTM of examples/treelstm.py on SST (synthetic SST-like trees
   when ../shared/data is absent) for a short time.
2. Runs one more training epoch from the same weights on the same trees, once per
   scheduler (five by default, --schedulers picks others):
     none    one kernel launch per node (what an unbatched framework does)
     depth   batch nodes with equal depth and signature (TensorFlow Fold)
     agenda  DyNet's agenda-based autobatching
     agenda+block  the same, with each tree node recorded as one dy.block call
     cavs    the same cells as Cavs vertex functions (dy.cavs), run over the
             whole minibatch at once
   and prints time, trees/s, kernel launches vs nodes, and the losses, which
   are the same for every scheduler: batching changes speed, not results.
   The speed-up column is relative to the first row ('none': no batching).
3. When DyNet (dynet38) is installed, also times DyNet with its autobatching and
   dynagraph's agenda scheduler on the same TreeLSTM, written once with plain DyNet
   ops (bench/dy_models.py) and run by each library in its own process, so the
   speed-up against DyNet itself is shown too (--no-dynet skips it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run from anywhere

import dynagraph as dy  # noqa: E402
from dynagraph.schedulers import lower_bound  # noqa: E402
from cavs_treelstm import CavsTreeLSTM, FlatTree  # noqa: E402
from treelstm import accuracy, build, load_trees, minibatches, train_epoch  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--train", type=int, default=1500, help="trees for the warm-up training (default 1500)")
    ap.add_argument("--dev", type=int, default=300, help="dev trees for accuracy (default 300)")
    ap.add_argument("--epochs", type=int, default=1, help="warm-up training epochs (default 1)")
    ap.add_argument("--bench", type=int, default=512, help="trees in the timed epoch (default 512)")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per scheduler; the fastest counts (default 2)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--emb-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--schedulers", default="none,depth,agenda,agenda+block,cavs",
                    help=f"comma-separated, from: {', '.join(dy.schedulers.available())}; "
                         f"append '+block' to record tree nodes as static subgraphs (dy.block); "
                         f"'cavs' runs the cells as Cavs vertex functions (dy.cavs)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-dynet", action="store_true", help="skip the comparison with DyNet itself")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap.parse_args(argv)


def snapshot(pc: dy.ParameterCollection) -> list[np.ndarray]:
    return [p.values.copy() for p in _stored(pc)]


def restore(pc: dy.ParameterCollection, saved: list[np.ndarray]) -> None:
    for p, v in zip(_stored(pc), saved):
        p.values[...] = v  # in place: graphs and trainers hold these arrays


def _stored(pc):
    return list(pc.parameters_list()) + list(pc.lookup_parameters_list())


def bench_lower_bound(model, trees, vocab, batch_size: int) -> int:
    """Fewest kernel launches any schedule could use (per minibatch, summed); recording only."""
    total = 0
    for batch in minibatches(trees, batch_size):
        cg = dy.renew_cg()
        dy.esum([model.loss(t, vocab) for t in batch])
        total += lower_bound(cg, [i for i in range(len(cg)) if not cg.op[i].leaf])
    dy.renew_cg()
    return total


def run_scheduler(name: str, pc, model, vocab, trees, args, saved) -> dict:
    """Timed SGD epochs from the saved weights. SGD has no state, so runs are comparable.

    The fastest of `args.repeat` runs counts: other processes only ever add time.
    """
    seconds = float("inf")
    scheduler, _, mode = name.partition("+")
    model.set_blocked(mode == "block")
    for _ in range(max(args.repeat, 1)):
        restore(pc, saved)
        trainer = dy.SimpleSGDTrainer(pc, learning_rate=args.lr)
        stats = dy.stats.Stats()
        t0 = time.perf_counter()
        if scheduler == "cavs":
            losses = cavs_epoch(CavsTreeLSTM.sharing(model), trainer, trees, vocab, args.batch_size, stats)
        else:
            losses = train_epoch(model, trainer, trees, vocab, args.batch_size, scheduler,
                                 progress=not args.quiet, stats=stats)
        seconds = min(seconds, time.perf_counter() - t0)
    model.set_blocked(False)
    return {"scheduler": name, "seconds": seconds, "trees_per_s": len(trees) / seconds, "nodes": stats.nodes,
            "batches": stats.batches, "kernels": stats.kernel_calls, "losses": np.array(losses),
            "weights": snapshot(pc)}


def cavs_epoch(model: CavsTreeLSTM, trainer, trees: list, vocab, batch_size: int, stats) -> list[float]:
    """One epoch with the vertex functions; turning trees into children lists is timed too."""
    losses = []
    for batch in minibatches(trees, batch_size):
        cg = dy.renew_cg()
        loss = dy.esum(model.losses([FlatTree(t, vocab) for t in batch])) * (1.0 / len(batch))
        losses.append(loss.value())
        loss.backward()
        trainer.update()
        stats.merge(cg.stats)
    return losses


def print_table(rows: list[dict], n_trees: int, bound: int, repeat: int) -> None:
    base = rows[0]
    print(f"\nOne training epoch over {n_trees} trees (forward + backward + SGD update), same start weights "
          f"(best of {repeat} runs):\n")
    head = (f"{'scheduler':<14}{'s/epoch':>9}{'trees/s':>9}{'vs none':>10}{'nodes':>10}{'launches':>10}"
            f"{'nodes/launch':>14}{'mean loss':>11}{'max |dloss|':>13}{'max |dW|':>10}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['scheduler']:<14}{r['seconds']:>9.2f}{r['trees_per_s']:>9.0f}"
              f"{base['seconds'] / r['seconds']:>9.1f}x{r['nodes']:>10}{r['batches']:>10}"
              f"{r['nodes'] / max(r['batches'], 1):>14.1f}{r['losses'].mean():>11.6f}"
              f"{r['loss_diff']:>13.1e}{r['weight_diff']:>10.1e}")
    print(f"\nlaunches = forward batches (cg.stats.batches; a dy.block batch runs its traced ops as one;"
          f" with cavs the vertex functions of the whole minibatch are one node and one launch);"
          f" no op-level schedule can use fewer than {bound}.")
    print(f"max |dloss| and max |dW|: largest difference from '{base['scheduler']}' in any minibatch loss "
          f"and in the weights after the epoch.")


def compare_with_dynet(args, n_trees: int) -> list[dict] | None:
    """DyNet (autobatch 1) and dynagraph (agenda) on one program text, each in its own worker
    process (bench/worker.py), rounds interleaved, one BLAS thread; the best round counts.
    None when DyNet is not installed."""
    import importlib.util
    if importlib.util.find_spec("dynet") is None:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.run import Worker
    cfg = {"workload": "treelstm", "H": args.hidden, "batch_size": args.batch_size, "warmup": 1,
           "batches": max(n_trees // args.batch_size, 1), "seed": args.seed, "lr": args.lr, "mode": "train"}
    workers = {"DyNet autobatch": Worker("dynet", "1", 1), "dynagraph agenda": Worker("dynagraph", "agenda", 1)}
    best: dict = {}
    try:
        for w in workers.values():
            w.start()
            if not w.wait_ready():
                print(f"(DyNet comparison skipped: {w.error})")
                return None
        for _ in range(max(args.repeat, 1)):
            for name, w in workers.items():
                r = w.run(cfg)
                if "error" in r:
                    print(f"(DyNet comparison skipped: {name}: {r['error']})")
                    return None
                if name not in best or r["samples_per_sec"] > best[name]["samples_per_sec"]:
                    best[name] = r
    finally:
        for w in workers.values():
            w.stop()
    base = best["DyNet autobatch"]["samples_per_sec"]
    print(f"\nThe same TreeLSTM (H={args.hidden}, batch {args.batch_size}, {cfg['batches'] * args.batch_size} trees) "
          f"written once with DyNet ops, each library in its own process (best of {args.repeat}):\n")
    print(f"{'system':<20}{'trees/s':>9}{'vs DyNet':>10}")
    rows = []
    for name, r in best.items():
        print(f"{name:<20}{r['samples_per_sec']:>9.0f}{r['samples_per_sec'] / base:>9.2f}x")
        rows.append({"system": name, "trees_per_s": r["samples_per_sec"], "losses": r["losses"]})
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    names = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    train, dev, source = load_trees(args.train, args.dev, args.seed)
    pc, model, trainer, vocab = build(train, args.emb_dim, args.hidden, args.lr, args.seed)
    print(f"TreeLSTM on {source}: {len(train)} training trees, {len(dev)} dev trees, vocabulary {len(vocab)}")

    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        losses = train_epoch(model, trainer, train, vocab, args.batch_size, progress=not args.quiet)
        print(f"  warm-up epoch {epoch + 1}/{args.epochs}: loss {np.mean(losses):.4f}, "
              f"dev accuracy {accuracy(model, dev, vocab):.3f}")
    print(f"  ({time.perf_counter() - t0:.1f} s with the default '{dy.config.config.scheduler}' scheduler)")

    bench = (train * (args.bench // max(len(train), 1) + 1))[:args.bench]
    saved = snapshot(pc)
    train_epoch(model, dy.SimpleSGDTrainer(pc, args.lr), bench[:args.batch_size], vocab, args.batch_size,
                names[0], progress=False)  # untimed warm-up of caches and numpy code paths
    rows = [run_scheduler(name, pc, model, vocab, bench, args, saved) for name in names]
    for r in rows:
        r["loss_diff"] = float(np.max(np.abs(r["losses"] - rows[0]["losses"])))
        r["weight_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(r["weights"], rows[0]["weights"]))
    restore(pc, saved)
    bound = bench_lower_bound(model, bench, vocab, args.batch_size)
    print_table(rows, len(bench), bound, args.repeat)
    dynet_rows = None if args.no_dynet else compare_with_dynet(args, len(bench))
    return {"rows": rows, "lower_bound": bound, "source": source, "dynet": dynet_rows}


if __name__ == "__main__":
    main(sys.argv[1:])
