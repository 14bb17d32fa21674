"""Instructions per sentence (or per mini-batch), phase by phase, of the import-swap programs (callgrind).

    python bench/instruction_counts.py                              # every per-sentence workload
    python bench/instruction_counts.py --workloads cbow --sentences 200 --systems dynagraph,dynet
    python bench/instruction_counts.py --suite minibatch --workloads treelstm,bilstm --baseline DIR

On a shared machine a per-sentence epoch's time moves by more than most changes do; the
instruction count does not. Each program of `bench/swap/` (the same text `import_swap.py` runs)
runs under `valgrind --tool=callgrind` four times per system, stopped after recording, after
`value()`, after `backward()` and after `update()`; a phase's count is the difference of two
runs divided by the sentences, so it includes freeing what the phase made when the next graph
replaces it. Only the timed sentences are counted (collection is toggled on around them); the
warm-up sentences before run every phase. Needs valgrind (`apt-get install valgrind`); DyNet
only where `dynet38` is installed. Prints a Markdown table in thousands of instructions.

`--suite minibatch` counts a mini-batched program's inference instead (`--batch-size` samples a
graph): recording (renew_cg, the parameters, every sample's loss and their esum, which frees the
previous graph) and forward (`loss.value()`), each run collecting only that phase of the timed
mini-batches. `--baseline DIR` adds another checkout's dynagraph (e.g. `git archive` of an older
commit, built in place) as the system "dynagraph@baseline".
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PHASES = ("record", "forward", "backward", "update")
MINIBATCH_PHASES = ("record", "forward")  # inference: what a served model pays per mini-batch
TOGGLE = "functools_reduce"  # the C function callgrind collects inside: the timed sentences' reduce
BASELINE = "dynagraph@baseline"


# ------------------------------------------------------------------ worker (runs under valgrind)
def worker(workload: str, system: str, upto: int, sentences: int, warmup: int, hidden: int) -> None:
    """The program's sentences with phases 0..upto each (0 record, 1 value, 2 backward, 3 update);
    the timed ones inside functools.reduce, which callgrind's toggle collects."""
    from bench import import_swap
    import numpy as np
    import_swap.setup(system, "", 1)
    dy = sys.modules["dynet"]
    program, data = import_swap.SENTENCE[workload]
    mod = importlib.import_module(f"bench.swap.{program}")
    samples, vocab, n_out = import_swap.load_data(data, sentences + warmup, 1)
    pc = dy.ParameterCollection()
    model = mod.Model(pc, hidden, vocab, n_out, np.random.default_rng(1))
    trainer = dy.SimpleSGDTrainer(pc, learning_rate=0.1)

    def step(total: float, s, upto: int = upto) -> float:
        dy.renew_cg()
        loss = model.loss(s)
        if upto >= 1:
            total += loss.value()
        if upto >= 2:
            loss.backward()
        if upto >= 3:
            trainer.update()
        return total

    for s in samples[:warmup]:  # every phase, so that later graphs replay what these made
        step(0.0, s, 3)
    print(functools.reduce(step, samples[warmup:warmup + sentences], 0.0))


def minibatch_worker(workload: str, system: str, phase: str, batches: int, warmup: int, hidden: int,
                     batch_size: int) -> None:
    """The program's mini-batches, recorded and evaluated; the timed ones run `phase` (record or
    forward) inside functools.reduce, which callgrind's toggle collects, and the other phase
    outside it. Recording includes freeing the previous graph (renew_cg), as in the bench."""
    from bench import import_swap
    import numpy as np
    import_swap.setup("dynet" if system == "dynet" else "dynagraph", "1" if system == "dynet" else "", 1)
    dy = sys.modules["dynet"]
    program, data = import_swap.MINIBATCH[workload]
    mod = importlib.import_module(f"bench.swap.{program}")
    samples, vocab, n_out = import_swap.load_data(data, batch_size * (batches + warmup), 1)
    pc = dy.ParameterCollection()
    model = mod.Model(pc, hidden, vocab, n_out, np.random.default_rng(1))
    groups = [samples[i:i + batch_size] for i in range(0, len(samples), batch_size)]

    def record(graphs: list, group) -> list:
        dy.renew_cg()
        model.begin()
        return graphs + [dy.esum([model.loss(s) for s in group])]

    def forward(total: float, loss) -> float:
        return total + loss.value()

    total = 0.0
    for group in groups[:warmup]:
        total += record([], group)[0].value()
    loss = None
    for group in groups[warmup:warmup + batches]:
        loss = None  # the previous graph is freed inside the next recording, as in the bench
        if phase == "record":
            loss = functools.reduce(record, [group], [])[0]
            total += loss.value()
        else:
            loss = record([], group)[0]
            total = functools.reduce(forward, [loss], total)
    print(total)


# ------------------------------------------------------------------ driver
def parse_total(text: str) -> int:
    """The event total of a callgrind output file ("summary:" or "totals:" line)."""
    for line in text.splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError("no 'summary:' or 'totals:' line in the callgrind output")


def per_phase(totals: list[int], sentences: int) -> dict:
    """Cumulative totals of runs stopped after each phase -> instructions a sentence per phase."""
    if len(totals) != len(PHASES):
        raise ValueError(f"need {len(PHASES)} totals, got {len(totals)}")
    prev, out = 0, {}
    for name, total in zip(PHASES, totals):
        out[name] = (total - prev) / sentences
        prev = total
    out["all"] = totals[-1] / sentences
    return out


def count(workload: str, system: str, upto, args, valgrind: str) -> int:
    """The callgrind total of one worker run: per sentence, phases 0..upto; per mini-batch
    (args.suite), the phase named by upto. The baseline's worker imports its checkout first."""
    root = os.path.abspath(args.baseline) if system == BASELINE else ROOT
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=root, DYNAGRAPH_BENCH_ROOT=root)
        if args.suite == "minibatch":
            job = ["--minibatch-worker", workload, system, upto, str(args.batches), str(args.warmup_batches),
                   str(args.hidden), str(args.batch_size)]
        else:
            job = ["--worker", workload, system, str(upto), str(args.sentences), str(args.warmup), str(args.hidden)]
        cmd = [valgrind, "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={TOGGLE}",
               f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__), *job]
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{system} {workload} ({upto}) failed:\n{done.stderr[-2000:]}")
        with open(out) as f:
            return parse_total(f.read())


def table(rows: list[dict], phases: tuple = PHASES) -> str:
    head = "| workload | system | " + " | ".join(phases) + " | all |\n|---|---|" + "---:|" * (len(phases) + 1)
    lines = [head]
    for r in rows:
        cells = " | ".join(f"{r[p] / 1e3:.0f}" for p in phases + ("all",))
        lines.append(f"| {r['workload']} | {r['system']} | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    from bench import import_swap
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=("sentence", "minibatch"), default="sentence")
    ap.add_argument("--workloads", default=None, help="default: every workload of the suite")
    ap.add_argument("--systems", default="dynagraph,dynet")
    ap.add_argument("--baseline", default=None, help="another checkout's folder: adds dynagraph@baseline")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batches", type=int, default=2, help="timed mini-batches (minibatch suite)")
    ap.add_argument("--warmup-batches", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    args = ap.parse_args(argv)
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    known = import_swap.MINIBATCH if args.suite == "minibatch" else import_swap.SENTENCE
    systems = args.systems.split(",") + ([BASELINE] if args.baseline else [])
    rows = []
    for workload in (args.workloads or ",".join(known)).split(","):
        if workload not in known:
            sys.exit(f"unknown {args.suite} workload {workload!r}; one of {', '.join(known)}")
        for system in systems:
            if system == "dynet" and importlib.util.find_spec("dynet") is None:
                print(f"skipped DyNet for {workload}: dynet38 is not installed", file=sys.stderr)
                continue
            if args.suite == "minibatch":
                got = {p: count(workload, system, p, args, valgrind) / args.batches for p in MINIBATCH_PHASES}
                rows.append({"workload": workload, "system": system, **got, "all": sum(got.values())})
                continue
            totals = [count(workload, system, upto, args, valgrind) for upto in range(len(PHASES))]
            rows.append({"workload": workload, "system": system, **per_phase(totals, args.sentences)})
    if args.suite == "minibatch":
        print(f"thousands of instructions a mini-batch of {args.batch_size}, inference, H={args.hidden}, "
              f"{args.batches} mini-batches after {args.warmup_batches} warm-up (callgrind)\n")
        print(table(rows, MINIBATCH_PHASES))
        return rows
    print(f"thousands of instructions a sentence, H={args.hidden}, {args.sentences} sentences after "
          f"{args.warmup} warm-up (callgrind)\n")
    print(table(rows))
    return rows


if __name__ == "__main__":
    if os.environ.get("DYNAGRAPH_BENCH_ROOT"):  # a baseline worker: its checkout before this one
        sys.path.insert(0, os.environ["DYNAGRAPH_BENCH_ROOT"])
    if len(sys.argv) > 1 and sys.argv[1] == "--minibatch-worker":
        w, system, phase, n, warm, hidden, size = sys.argv[2:9]
        minibatch_worker(w, system, phase, int(n), int(warm), int(hidden), int(size))
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker":
        w, system, upto, n, warm, hidden = sys.argv[2:8]
        worker(w, system, int(upto), int(n), int(warm), int(hidden))
    else:
        main()
