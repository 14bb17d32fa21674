"""Instructions per sentence, phase by phase, of the per-sentence import-swap programs (callgrind).

    python bench/instruction_counts.py                              # every per-sentence workload
    python bench/instruction_counts.py --workloads cbow --sentences 200 --systems dynagraph,dynet

On a shared machine a per-sentence epoch's time moves by more than most changes do; the
instruction count does not. Each program of `bench/swap/` (the same text `import_swap.py` runs)
runs under `valgrind --tool=callgrind` four times per system, stopped after recording, after
`value()`, after `backward()` and after `update()`; a phase's count is the difference of two
runs divided by the sentences, so it includes freeing what the phase made when the next graph
replaces it. Only the timed sentences are counted (collection is toggled on around them); the
warm-up sentences before run every phase. Needs valgrind (`apt-get install valgrind`); DyNet
only where `dynet38` is installed. Prints a Markdown table in thousands of instructions.
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
TOGGLE = "functools_reduce"  # the C function callgrind collects inside: the timed sentences' reduce


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


def count(workload: str, system: str, upto: int, args, valgrind: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT)
        cmd = [valgrind, "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={TOGGLE}",
               f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__), "--worker",
               workload, system, str(upto), str(args.sentences), str(args.warmup), str(args.hidden)]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{system} {workload} (phases to {upto}) failed:\n{done.stderr[-2000:]}")
        with open(out) as f:
            return parse_total(f.read())


def table(rows: list[dict]) -> str:
    head = "| workload | system | " + " | ".join(PHASES) + " | all |\n|---|---|" + "---:|" * (len(PHASES) + 1)
    lines = [head]
    for r in rows:
        cells = " | ".join(f"{r[p] / 1e3:.0f}" for p in PHASES + ("all",))
        lines.append(f"| {r['workload']} | {r['system']} | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    from bench import import_swap
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(import_swap.SENTENCE))
    ap.add_argument("--systems", default="dynagraph,dynet")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=64)
    args = ap.parse_args(argv)
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    rows = []
    for workload in args.workloads.split(","):
        if workload not in import_swap.SENTENCE:
            sys.exit(f"unknown per-sentence workload {workload!r}; one of {', '.join(import_swap.SENTENCE)}")
        for system in args.systems.split(","):
            if system == "dynet" and importlib.util.find_spec("dynet") is None:
                print(f"skipped DyNet for {workload}: dynet38 is not installed", file=sys.stderr)
                continue
            totals = [count(workload, system, upto, args, valgrind) for upto in range(len(PHASES))]
            rows.append({"workload": workload, "system": system, **per_phase(totals, args.sentences)})
    print(f"thousands of instructions a sentence, H={args.hidden}, {args.sentences} sentences after "
          f"{args.warmup} warm-up (callgrind)\n")
    print(table(rows))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        w, system, upto, n, warm, hidden = sys.argv[2:8]
        worker(w, system, int(upto), int(n), int(warm), int(hidden))
    else:
        main()
