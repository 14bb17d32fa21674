"""What the evaluation rounds of dy.autobatch_map cost, per ACROBAT model (bench/acrobat_models.py).

    python bench/acrobat_floor.py                                  # DRNN, early exit, StackRNN; H=128, batch 64
    python bench/acrobat_floor.py --models drnn --hidden 512 --steps 10

For each model and mode it times, in this process, CPU time per mini-batch step (best of
`--rounds`, each the mean of `--steps` fresh mini-batches):
  concurrent  the model as the bench runs it: every read parks its sample, one evaluation a round;
  no rounds   the same program with every read inside the samples answered without evaluating
              (0.0, or zeros of the value's shape) and the whole graph evaluated once after them.
The models take their decisions from seeded pseudo-random streams, never from the values read,
so both record the same graph and run the same nodes: the difference is everything the rounds
cost (parking, dy.phase, the per-round split and schedule, the engine's per-evaluation cost,
smaller batches and their gathers), and "no rounds" is the floor that cheaper rounds approach.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class _NoReads:
    """While active, Expression.value()/npvalue() return placeholders instead of evaluating, and
    bench.acrobat_models.run_all runs the samples in a plain loop, then evaluates the graph once."""

    def __init__(self, dy):
        import numpy as np

        from bench import acrobat_models
        from dynagraph.expression import Expression
        self.dy, self.np, self.models, self.expr = dy, np, acrobat_models, Expression
        self.value, self.npvalue, self.run_all = Expression.value, Expression.npvalue, acrobat_models.run_all
        self.inside = False

    def __enter__(self) -> "_NoReads":
        outer = self
        value, npvalue = self.value, self.npvalue

        def fake_value(e, recalculate: bool = False):
            return 0.0 if outer.inside else value(e, recalculate)

        def fake_npvalue(e, recalculate: bool = False):
            return outer.np.zeros(e.dim()[0]) if outer.inside else npvalue(e, recalculate)

        def run_all(dy, fn, samples, concurrent=True):
            outer.inside = True
            try:
                out = [fn(s) for s in samples]
            finally:
                outer.inside = False
            dy.cg().forward()  # every node the samples recorded, as one chunk
            return out

        self.expr.value, self.expr.npvalue, self.models.run_all = fake_value, fake_npvalue, run_all
        return self

    def __exit__(self, *exc) -> None:
        self.expr.value, self.expr.npvalue, self.models.run_all = self.value, self.npvalue, self.run_all


def _step_ms(model, train: bool, batch: int, steps: int, rounds: int) -> float:
    best = float("inf")
    for r in range(rounds):
        seeds = [[10 ** 6 * (r + 1) + 1000 * s + i for i in range(batch)] for s in range(steps + 1)]
        model.step(seeds[0], train)  # warm-up
        t = time.process_time()
        for s in seeds[1:]:
            model.step(s, train)
        best = min(best, (time.process_time() - t) / steps * 1e3)
    return best


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="drnn,earlyexit,stackrnn")
    ap.add_argument("--modes", default="train,infer")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import dynagraph as dy
    from bench.acrobat_models import Model
    dy.config.set(threads=1)
    print(f"dy.autobatch_map's rounds, H={a.hidden}, batch {a.batch}, one thread, CPU ms per step "
          f"(best of {a.rounds} rounds of {a.steps} steps)")
    print(f"{'model':10} {'mode':5} {'concurrent':>10} {'no rounds':>10} {'rounds cost':>11} {'share':>6}")
    rows = []
    for kind in a.models.split(","):
        model = Model(dy, kind, a.hidden)
        for mode in a.modes.split(","):
            train = mode == "train"
            conc = _step_ms(model, train, a.batch, a.steps, a.rounds)
            with _NoReads(dy):
                floor = _step_ms(model, train, a.batch, a.steps, a.rounds)
            rows.append((kind, mode, conc, floor))
            share = (conc - floor) / conc
            print(f"{kind:10} {mode:5} {conc:>10.2f} {floor:>10.2f} {conc - floor:>11.2f} {share:>6.0%}")
    return rows


if __name__ == "__main__":
    main()
