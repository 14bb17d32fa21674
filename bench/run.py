"""Benchmark driver: dynagraph (each scheduler) vs DyNet (autobatch 0/1/2) vs PyTorch vs numpy.

    python bench/run.py                       # quick: H=64, every workload and system (a few minutes)
    python bench/run.py --full                # the whole grid: H in {64, 256, 512}, train and inference
    python bench/run.py --workloads treelstm --systems dynagraph,dynet --H 64,256 --batches 5

Prints a table and writes bench/results/<date>.json (and latest.json). Each system
runs in its own worker process (bench/worker.py); configs are interleaved across
systems so that a noisy neighbour affects all systems alike. See bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python bench/run.py` puts bench/, not the repo, on the path
    sys.path.insert(0, ROOT)

from bench import report, workloads  # noqa: E402
from bench.worker import PREFIX  # noqa: E402

QUICK = dict(H=[64], modes=["train", "infer"], batches=2, warmup=1)
FULL = dict(H=[64, 256, 512], modes=["train", "infer"], batches=3, warmup=1)
SYSTEMS = ["dynagraph", "dynet", "torch", "numpy"]
NUMPY_KINDS = ("treelstm", "treefc")  # the hand-batched baseline exists for these models


# ------------------------------------------------------------------ workers
class Worker:
    """A persistent worker process for one (system, variant)."""

    def __init__(self, system: str, variant: str, threads: int, extra: list | None = None):
        self.system, self.variant, self.threads, self.extra = system, variant, threads, extra or []
        self.label = system if not variant else f"{system}:{'ab' if system == 'dynet' else ''}{variant}"
        self.proc = None
        self.versions: dict = {}
        self.error: str | None = None
        self._log = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "bench.worker", "--system", self.system, "--threads", str(self.threads)]
        if self.variant:
            cmd += ["--variant", self.variant]
        cmd += self.extra
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, bufsize=1)

    def wait_ready(self) -> bool:
        hello = self._read()
        if hello.get("ready"):
            self.versions = hello.get("versions", {})
            return True
        self.error = hello.get("error", "worker failed to start")
        self.stop()
        return False

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        self.proc.wait()
        self._log.seek(0)
        tail = self._log.read()[-600:]
        return {"error": f"worker exited with code {self.proc.returncode}: {tail.strip()}", "crashed": True}

    def run(self, cfg: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()  # restarted after a crash (e.g. out of memory on one large config)
            if not self.wait_ready():
                return {"error": self.error}
        self.proc.stdin.write(json.dumps(cfg) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


def start_workers(workers: list) -> list:
    """Start every worker process, wait for each to say it is ready, and note on stderr the
    ones that could not start (an optional system that is absent) and where a package was
    imported from when that was asked for. Returns the live ones, in order."""
    for w in workers:
        w.start()
    live = [w for w in workers if w.wait_ready()]
    for w in workers:
        if w.error:
            print(f"note: {w.label} unavailable: {w.error}", file=sys.stderr)
        elif "from" in w.versions:
            print(f"note: {w.label} imports {w.versions['from']}", file=sys.stderr)
    return live


def dynagraph_schedulers() -> list[str]:
    import dynagraph
    return dynagraph.schedulers.available()


def make_workers(args) -> list[Worker]:
    """Expand --systems into workers; `dynagraph:depth` or `dynet:1` name one variant."""
    out = []
    for spec in args.systems:
        system, _, variant = spec.partition(":")
        if system not in SYSTEMS:
            raise SystemExit(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
        if system in ("dynet", "torch") and importlib.util.find_spec(system) is None:
            print(f"note: {system} is not installed; skipping it", file=sys.stderr)
            continue
        if system == "dynagraph":
            variants = [variant] if variant else (args.schedulers or dynagraph_schedulers())
        elif system == "dynet":
            variants = [variant.removeprefix("ab")] if variant else [str(a) for a in args.autobatch]
        else:
            variants = [""]
        extra = ["--dynet-mem", args.dynet_mem] if system == "dynet" and args.dynet_mem else []
        out += [Worker(system, v, args.threads, extra) for v in variants]
    return out


# ------------------------------------------------------------------ the grid
def configs(args) -> list[dict]:
    out = []
    for name in args.workloads:
        w = workloads.WORKLOADS[name]
        sizes = args.H
        if w.fixed_H is not None:  # MV-RNN has its own size; tiny smoke-test sizes still apply
            sizes = [w.fixed_H] if w.fixed_H in args.H else [min(args.H)]
        for mode in args.modes:
            for H in sizes:
                out.append(dict(workload=name, kind=w.kind, mode=mode, H=H, batch_size=args.batch_size,
                                batches=args.batches, warmup=args.warmup, seed=args.seed, lr=args.lr))
    return out


def supports(worker: Worker, cfg: dict) -> bool:
    return worker.system != "numpy" or cfg["kind"] in NUMPY_KINDS


def run_grid(args, workers: list[Worker]) -> list[dict]:
    from tqdm import tqdm
    grid = configs(args)
    jobs = [(cfg, w) for cfg in grid for w in workers if supports(w, cfg)]
    results = []
    with tqdm(total=len(jobs), disable=args.no_progress, unit="run", dynamic_ncols=True) as bar:
        for cfg, w in jobs:
            bar.set_description(f"{cfg['workload']} {cfg['mode']} H={cfg['H']} {w.label}")
            res = w.run(cfg)
            results.append({**cfg, "system": w.system, "variant": w.variant, "label": w.label, **res})
            bar.update()
    report.add_ratios(results)
    return results


# ------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    ints = lambda s: [int(x) for x in csv(s)]  # noqa: E731
    ap.add_argument("--full", action="store_true", help="whole grid: H 64,256,512, 3 batches, both modes (30-60 min on 2 cores)")
    ap.add_argument("--workloads", type=csv, default=None,
                    help=f"comma list from {','.join(workloads.WORKLOADS)} (default: all available)")
    ap.add_argument("--systems", type=csv, default=SYSTEMS,
                    help="comma list of dynagraph[:sched], dynet[:0|1|2], torch, numpy (default: all)")
    ap.add_argument("--schedulers", type=csv, default=None, help="dynagraph schedulers (default: all registered)")
    ap.add_argument("--autobatch", type=ints, default=[0, 1, 2], help="DyNet autobatch modes (default 0,1,2)")
    ap.add_argument("--dynet-mem", default="", help="DyNet pools in MB, forward,backward,parameters,scratch "
                    "(default 256,256,128,128, enough for every workload at H=512; autobatching DyNet cannot grow them)")
    ap.add_argument("--H", type=ints, default=None, help="hidden sizes, e.g. 64,256 (quick: 64)")
    ap.add_argument("--modes", type=csv, default=None, help="train,infer (default: both)")
    ap.add_argument("--batch-size", type=int, default=64, help="samples per minibatch / renew_cg (default 64)")
    ap.add_argument("--batches", type=int, default=None, help="timed minibatches per run (quick 2, full 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed minibatches first (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS/torch threads per system (default 1)")
    ap.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (loss is a sum over the batch)")
    ap.add_argument("--seed", type=int, default=0, help="data and parameter seed")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/<date>.json)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--quiet", action="store_true", help="no table on stdout")
    args = ap.parse_args(argv)
    preset = FULL if args.full else QUICK
    for key in ("H", "modes", "batches", "warmup"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    if args.workloads is None:
        args.workloads = [n for n, w in workloads.WORKLOADS.items() if w.available()]
    bad = [n for n in args.workloads if n not in workloads.WORKLOADS]
    if bad:
        raise SystemExit(f"unknown workload(s) {bad}; choose from {', '.join(workloads.WORKLOADS)}")
    return args


def meta(args, workers: list[Worker], argv) -> dict:
    versions: dict = {}
    for w in workers:
        versions.update(w.versions)
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": "python bench/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "threads": args.threads, "versions": versions, "git": _git_head(),
            "skipped_systems": {w.label: w.error for w in workers if w.error}}


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv=None) -> dict:
    args = parse_args(argv)
    workers = make_workers(args)
    live = start_workers(workers)
    try:
        results = run_grid(args, live)
    finally:
        for w in workers:
            w.stop()
    doc = {"meta": meta(args, workers, argv), "results": results}
    path = write_json(doc, args.out)
    if not args.quiet:
        print(report.table(results))
        print(f"\nwrote {path}")
    return doc


def write_json(doc: dict, out: str | None) -> str:
    if out is None:
        folder = os.path.join(ROOT, "bench", "results")
        os.makedirs(folder, exist_ok=True)
        out = os.path.join(folder, datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ".json")
        with open(os.path.join(folder, "latest.json"), "w") as f:
            json.dump(doc, f, indent=1)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    return out


if __name__ == "__main__":
    main()
