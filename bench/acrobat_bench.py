"""ACROBAT's models: dynagraph concurrent (dy.autobatch_map) vs the same code one sample at a time vs DyNet.

    python bench/acrobat_bench.py                          # every model, batch 8 and 64, train and infer
    python bench/acrobat_bench.py --models stackrnn,drnn --batches 64 --hidden 256 --rounds 3
    python bench/acrobat_bench.py --systems concurrent --scheduler depth --no-hints   # batches without dy.ghost
    python bench/acrobat_bench.py --batches 64 --clock cpu --baseline /tmp/base    # A/B against another checkout

One program text (bench/acrobat_models.py) for every system, import swap only: DyNet has no
autobatch_map, so its per-sample loop runs sequentially, with its autobatcher on ("dynet",
autobatch=1, ACROBAT's baseline) and off ("dynet-ab0", faster for these loops at small sizes). Each system runs in its own
persistent worker process with one BLAS thread; rounds are interleaved across systems so that a
noisy neighbour affects them alike. Prints samples/s (best round), the ratios, and dynagraph's
scheduled batches against the whole graph's lower bound ("bound", which ignores that a read must be
served before its sample goes on) and against the sum of each evaluated chunk's bound ("rounds"),
and the kernel launches they ran as ("launches", stats.batches: the executor runs a batch of a few
nodes whose arguments would need a gather node by node, and one per source block).
A round times `--reps` steps, each on a fresh mini-batch (seeded by round and step, the same
in every system); the table takes each system's best round.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# system -> (library, concurrent, DyNet's autobatch flag). DyNet runs the per-sample loop either
# way; with autobatch=1 (ACROBAT's baseline) it batches within one sample's evaluation, and
# without (dynet-ab0) it skips the autobatcher's per-evaluation cost, faster at small sizes.
SYSTEMS = {"concurrent": ("dynagraph", True, ""), "one-by-one": ("dynagraph", False, ""),
           "dynet": ("dynet", True, "1"), "dynet-ab0": ("dynet", True, "0"),
           "baseline": ("dynagraph", True, "")}  # concurrent, another checkout's dynagraph (--baseline)
DEFAULT_SYSTEMS = "concurrent,one-by-one,dynet,dynet-ab0"


# ------------------------------------------------------------------ worker
def worker(system: str, hidden: int, scheduler: str, clock: str = "wall") -> None:
    from bench.acrobat_models import Model  # this checkout's program text, whichever dynagraph runs it
    base = os.environ.get("ACROBAT_BASELINE")
    if system == "baseline":  # before the first import of dynagraph (bench.worker imports it)
        sys.path.insert(0, os.path.abspath(base))
    from bench.worker import setup
    lib, concurrent, autobatch = SYSTEMS[system]
    setup(lib, autobatch, 1)
    dy = __import__(lib)
    if system == "baseline" and not os.path.abspath(dy.__file__).startswith(os.path.abspath(base)):
        raise RuntimeError(f"baseline worker imported {dy.__file__}, not the one under {base}")
    if lib == "dynagraph" and scheduler:
        dy.config.set(scheduler=scheduler)
    models: dict = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        kind, batch, train, reps = cmd["model"], cmd["batch"], cmd["train"], cmd["reps"]
        m = models.get(kind) or models.setdefault(kind, Model(dy, kind, hidden))
        # a fresh mini-batch every step (the same ones in every system): repeating one would let
        # dynagraph's schedule cache replay its schedules, which real training never sees
        batches = [[10 ** 6 * cmd["round"] + 1000 * r + i for i in range(batch)] for r in range(reps + 1)]
        m.step(batches[0], train, concurrent)  # warm-up
        extra = {}
        now = time.process_time if clock == "cpu" else time.perf_counter
        t = now()
        for seeds in batches[1:]:
            m.step(seeds, train, concurrent)
        seconds = (now() - t) / reps  # per step, this round's mini-batches
        if lib == "dynagraph":
            launches, bound = dy.cg().stats.batches, _evaluated_bound(dy.cg())
            round_bound, scheduled = _round_bound(m, seeds, train, concurrent)
            extra = {"batches": scheduled, "launches": launches, "lower_bound": bound, "round_bound": round_bound}
        print(json.dumps({"seconds": seconds, **extra}), flush=True)


def _evaluated_bound(cg) -> int:
    """The lower bound over the nodes that ran (a phase-1 node no read needed never runs)."""
    from dynagraph import schedulers
    blk, op = cg.blk, cg.op
    return schedulers.lower_bound(cg, [i for i in range(len(blk)) if blk[i] >= 0 and not op[i].leaf])


class _Counting:
    """A scheduler that counts the batches it schedules (the executor may run a batch as several
    kernel launches: stats.batches counts those)."""

    def __init__(self, inner, total: list):
        self.inner, self.total = inner, total

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def schedule(self, cg, pending):
        batches = self.inner.schedule(cg, pending)
        self.total[1] += len(batches)
        return batches


def _round_bound(model, seeds: list, train: bool, concurrent: bool) -> tuple[int, int]:
    """(the lower bound given the evaluation rounds that the reads force: the sum over evaluated
    chunks of each chunk's bound, the batches the scheduler made), from one untimed step with the
    engine instrumented (and the schedule cache off, so that every chunk is scheduled)."""
    from dynagraph import engine, schedulers
    from dynagraph.config import config
    total = [0, 0]
    forward, get = engine.Engine.forward, schedulers.get

    plain = getattr(engine, "_NO_DEFER", frozenset())  # forward()'s default (a baseline checkout may lack it)

    def counting(self, cg, upto, defer=plain, targets=()):
        pending = engine._pending(cg.blk, cg.done, upto + 1)
        if defer:  # dy.phase: the nodes this chunk leaves pending are counted where they run
            ids = defer.ids() if hasattr(defer, "ids") else defer
            pending = engine._split_deferred(cg, pending, ids, targets)[0]
        total[0] += schedulers.lower_bound(cg, pending)
        return forward(self, cg, upto, defer, targets)

    engine.Engine.forward = counting
    schedulers.get = lambda spec: _Counting(get(spec), total)
    cached = getattr(config, "schedule_cache", None)
    if cached is not None:
        config.schedule_cache = False
    try:
        model.step(seeds, train, concurrent)
    finally:
        engine.Engine.forward, schedulers.get = forward, get
        if cached is not None:
            config.schedule_cache = cached
    return total[0], total[1]


# ------------------------------------------------------------------ driver
def main(argv=None) -> None:
    from bench.acrobat_models import MODELS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--modes", default="train,infer")
    ap.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"of {', '.join(SYSTEMS)}")
    ap.add_argument("--baseline", default=None, help="folder holding another dynagraph package (an older "
                    "commit's, via git archive): its concurrent map runs too, as 'baseline'")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--scheduler", default="", help="dynagraph's scheduler (default: the configured one, agenda)")
    ap.add_argument("--no-hints", action="store_true", help="leave out ACROBAT's hints (dy.ghost) in the models")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: each worker's process time (every system runs on one thread), steadier "
                         "than wall time on a machine shared with other jobs")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a.worker, a.hidden, a.scheduler, a.clock)
    systems = a.systems.split(",")
    if a.baseline and "baseline" not in systems:
        systems.insert(1, "baseline")
    if "baseline" in systems and not a.baseline:
        ap.error("the baseline system needs --baseline DIR")
    # find_spec, not import: importing DyNet initialises it, which changes this process's
    # floating-point exception state (numpy then raises FloatingPointError elsewhere)
    if importlib.util.find_spec("dynet") is None and {"dynet", "dynet-ab0"} & set(systems):
        print("dynet38 not installed: DyNet columns skipped (pip install dynet38)")
        systems = [s for s in systems if SYSTEMS[s][0] != "dynet"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               DYNAGRAPH_HINTS="0" if a.no_hints else "1", ACROBAT_BASELINE=a.baseline or "")
    procs = {s: subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", s, "--hidden", str(a.hidden),
                                  "--clock", a.clock, "--scheduler", a.scheduler],
                                 cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
             for s in systems}
    configs = [(m, int(b), mode) for m in a.models.split(",") for b in a.batches.split(",")
               for mode in a.modes.split(",")]
    best: dict = {}
    try:
        from tqdm import tqdm
        bar = tqdm(total=a.rounds * len(configs) * len(systems), desc="acrobat bench", file=sys.stderr)
        for r in range(a.rounds):
            for model, batch, mode in configs:
                order = systems if r % 2 == 0 else systems[::-1]  # interleaved, alternating order
                for s in order:
                    p = procs[s]
                    p.stdin.write(json.dumps({"model": model, "batch": batch, "train": mode == "train",
                                              "reps": a.reps, "round": r}) + "\n")
                    p.stdin.flush()
                    line = p.stdout.readline()
                    if not line:
                        raise RuntimeError(f"worker {s} died on {model} batch {batch} {mode}")
                    out = json.loads(line)
                    key = (model, batch, mode, s)
                    if key not in best or out["seconds"] < best[key]["seconds"]:
                        best[key] = out
                    bar.update()
        bar.close()
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait()
    _table(best, configs, systems, a)


def _table(best: dict, configs: list, systems: list, a) -> None:
    """samples/s per system, then the concurrent map's speed-up over each other system present
    ("x S": concurrent / S), then its batches against the bounds."""
    print(f"\nACROBAT models, H={a.hidden}, one thread, scheduler {a.scheduler or 'default'}, "
          f"hints {'off' if a.no_hints else 'on'}, samples/s of {a.clock} time (best of {a.rounds} interleaved rounds)")
    others = [s for s in systems if s != "concurrent"] if "concurrent" in systems else []
    head = f"{'model':10} {'B':>3} {'mode':5} " + " ".join(f"{s:>11}" for s in systems)
    head += "".join(f" {'x ' + s:>12}" for s in others)
    head += f" {'batches':>8} {'bound':>6} {'ratio':>6} {'rounds':>6} {'ratio':>6} {'launches':>8}"
    print(head)
    for model, batch, mode in configs:
        rate = {s: batch / best[(model, batch, mode, s)]["seconds"] for s in systems}
        row = f"{model:10} {batch:>3} {mode:5} " + " ".join(f"{rate[s]:>11.0f}" for s in systems)
        row += "".join(f" {rate['concurrent'] / rate[s]:>12.2f}" for s in others)
        c = best.get((model, batch, mode, "concurrent"), {})
        ratio = f"{c['batches'] / c['lower_bound']:.2f}" if c.get("lower_bound") else "-"
        rratio = f"{c['batches'] / c['round_bound']:.2f}" if c.get("round_bound") else "-"
        row += f" {c.get('batches', '-'):>8} {c.get('lower_bound', '-'):>6} {ratio:>6}"
        row += f" {c.get('round_bound', '-'):>6} {rratio:>6} {c.get('launches', '-'):>8}"
        print(row)

if __name__ == "__main__":
    main()
