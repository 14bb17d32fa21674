"""The second core: a training step with backward()+update() on the overlap thread vs in place.

    python bench/overlap_bench.py --workload treelstm --H 256 --rounds 3

One process, one BLAS thread, the import-swap bench's DyNet program text (bench/swap/) run on
dynagraph; the two settings alternate round by round and the best samples/s of each is kept
(the machine is shared: quote the ratio). The split columns are ms per mini-batch; with overlap,
"forward" includes waiting for the previous step, and "backward"/"update" only hand it over.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import import_swap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="treelstm", choices=sorted(import_swap.MINIBATCH))
    ap.add_argument("--H", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=4, help="timed mini-batches of 64 per run")
    args = ap.parse_args()
    import_swap.setup("dynagraph", "", 1)  # one BLAS thread; the second core is the overlap thread's
    import dynagraph as dy
    from tqdm import tqdm
    cfg = {"workload": args.workload, "n": 64 * (args.batches + 1), "seed": 1, "H": args.H, "lr": 0.05,
           "suite": "minibatch", "batch_size": 64, "mode": "train", "warmup": 1}
    best: dict = {}
    runs = [(r, ov) for r in range(args.rounds) for ov in (False, True)]
    for _, use_overlap in tqdm(runs, desc=f"{args.workload} H={args.H}"):
        dy.config.config.overlap = use_overlap
        dy.config.config.threads = None if use_overlap else 1  # threads=1 is what turns overlap off
        r = import_swap.run_config(cfg)
        if r["samples_per_sec"] > best.get(use_overlap, {}).get("samples_per_sec", 0):
            best[use_overlap] = r
    print(f"{'setting':<10} {'samples/s':>10}  ms/batch rec/fwd/bwd/upd")
    for ov, name in ((False, "in place"), (True, "overlap")):
        r = best[ov]
        split = "/".join(f"{v * 1000 / args.batches:.1f}" for v in r["split"].values())
        print(f"{name:<10} {r['samples_per_sec']:>10.1f}  {split}")
    print(f"overlap / in place: {best[True]['samples_per_sec'] / best[False]['samples_per_sec']:.2f}x "
          f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
