"""DyNet programs run unchanged on DyNet and on dynagraph: the import swap bench.

    python bench/import_swap.py --quick --data ../shared/data           # < 3 min on 2 cores
    python bench/import_swap.py --suite sentence --rounds 3             # per-sentence programs only
    python bench/import_swap.py --suite minibatch --H 64,256,512 --modes train,infer --threads 1,0

Each workload is ONE program text in bench/swap/ (``import dynet as dy``). A worker process
puts DyNet or dynagraph into ``sys.modules['dynet']`` before it imports the program, so the two
systems run the same text; weights come from the same seeded numpy arrays
(`parameters_from_numpy`, `lookup_parameters_from_numpy`, builders' `set_value`). DyNet runs
in two processes, autobatch 0 and 1 (`--autobatch`), and is credited with the better of the two;
dynagraph runs its default scheduler, or each of `--scheduler` (e.g. `,depth`: the default and
depth, DyNet's autobatch 2), credited with the best, and the table names the winners. Rounds are
interleaved (every system runs config 1, then every system config 2, ..., then round 2), and
each figure is the best round (the least disturbed by the neighbours of a shared machine).

Mini-batched: one graph per mini-batch of 64 samples, ``esum`` of the per-sample losses;
training (value, backward, update) and inference (value only); samples/s and the phase
split record / forward / backward / update. Per-sentence: one graph per sentence,
``backward()`` and ``update()`` after each; seconds per epoch of `--sentences` sentences.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if os.environ.get("IMPORT_SWAP_DYNAGRAPH"):  # a baseline worker: another checkout's dynagraph package
    sys.path.insert(0, os.environ["IMPORT_SWAP_DYNAGRAPH"])

from bench import run as bench_run  # noqa: E402
from bench.worker import DYNET_MEM, emit  # noqa: E402

# workload -> (program module in bench/swap, data set, suite)
MINIBATCH = {"treelstm": ("treelstm", "sst-trees"), "treefc": ("treefc", "complete64"),
             "bilstm": ("bilstm", "tagging"), "mvrnn": ("mvrnn", "trees1k"),
             "lstm-tagger": ("lstm_tagger", "tagging")}
SENTENCE = {"birnn-tagger": ("birnn_tagger", "tagging"), "sentiment": ("sentiment", "sst-sents"),
            "cbow": ("cbow", "sst-sents"), "attention": ("attention", "copy")}
FIXED_H = {"mvrnn": 64}  # a per-word H x H matrix: 1k words x 512^2 floats would not fit
SPLIT = ("record", "forward", "backward", "update")


# ------------------------------------------------------------------ data (plain Python, no framework)
class Sentence:
    """A tagged or labelled word-id sequence (what the programs read as s.words / s.tags / s.label)."""

    def __init__(self, words, tags=None, label=0):
        self.words, self.tags, self.label = words, tags, label


def load_data(kind: str, n: int, seed: int):
    """(samples, vocabulary size, classes) for a data set; real files where present."""
    from bench import workloads
    from dynagraph import datasets
    if kind in ("sst-trees", "trees1k", "complete64"):
        name = {"sst-trees": "treelstm-sst" if workloads.WORKLOADS["treelstm-sst"].available() else "treelstm",
                "trees1k": "mvrnn", "complete64": "treefc64"}[kind]
        samples, vocab = workloads.load(name, n, seed)
        return samples, vocab, 5
    if kind == "sst-sents":
        path = datasets.shared_data_path("sst", "train.txt")
        trees = datasets.read_sst(path) if path else datasets.synthetic_trees(n, vocab_size=10000, seed=seed)
        vocab = datasets.Vocab.build(w for t in trees for w in t.words())
        sents = [Sentence([vocab[w] for w in t.words()], label=t.label) for t in trees]
        return _pick(sents, n, seed), len(vocab), 5
    path = datasets.shared_data_path("wikiner", "dev.txt")
    sents = (datasets.read_wikiner(path) if path else
             datasets.synthetic_tagging(max(n, 500), min_len=5, max_len=50, vocab_size=10000, n_tags=20, seed=seed))
    words = datasets.Vocab.build((w for s in sents for w, _ in s), min_count=2)
    tags = datasets.Vocab.build(t for s in sents for _, t in s)
    if kind == "tagging":
        out = [Sentence([words[w] for w, _ in s], [tags[t] for _, t in s]) for s in sents]
        return _pick(out, n, seed), len(words), len(tags)
    # copy: an encoder-decoder that learns to reverse the first 15 words, over the 2000 most common.
    cap = 2000
    ids = [[min(words[w], cap - 1) for w, _ in s][:15] for s in sents]
    return _pick([(x, x[::-1]) for x in ids if x], n, seed), cap, cap


def _pick(items: list, n: int, seed: int) -> list:
    import numpy as np
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[order[i % len(items)]] for i in range(n)]


# ------------------------------------------------------------------ worker side
def setup(system: str, variant: str, threads: int) -> dict:
    import numpy as np
    import threadpoolctl
    if threads > 0:
        threadpoolctl.threadpool_limits(threads)
    if system == "dynet":
        import dynet_config
        dynet_config.set(autobatch=int(variant or 0), random_seed=1, mem=DYNET_MEM)
        import dynet
        return {"numpy": np.__version__, "dynet": getattr(dynet, "__version__", "2.x")}
    import dynagraph
    if threads > 0:
        dynagraph.config.set(threads=threads)
    if variant:
        dynagraph.config.set(scheduler=variant)
    sys.modules["dynet"] = dynagraph  # the swap: every `import dynet as dy` below gets dynagraph
    return {"numpy": np.__version__, "dynagraph": dynagraph.__version__, "from": os.path.dirname(dynagraph.__file__)}


_DATA: dict = {}


def _settle(dy) -> None:
    """The clock stops after the last step has landed: dynagraph may still be running its
    backward() and update() on the overlap thread (dynagraph/overlap.py); DyNet has nothing pending."""
    wait = getattr(getattr(dy, "overlap", None), "wait", None)
    if wait is not None:
        wait()


def run_config(cfg: dict) -> dict:
    import numpy as np
    program, data = (MINIBATCH.get(cfg["workload"]) or SENTENCE[cfg["workload"]])
    mod = importlib.import_module(f"bench.swap.{program}")
    loop = importlib.import_module("bench.swap.loop")
    dy = sys.modules["dynet"]
    key = (data, cfg["n"], cfg["seed"])
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = load_data(data, cfg["n"], cfg["seed"])
    samples, vocab, n_out = _DATA[key]
    pc = dy.ParameterCollection()
    model = mod.Model(pc, cfg["H"], vocab, n_out, np.random.default_rng(cfg["seed"]))
    trainer = dy.SimpleSGDTrainer(pc, learning_rate=cfg["lr"])
    split = dict.fromkeys(SPLIT, 0.0)
    if cfg["suite"] == "sentence":
        warm = samples[:cfg["warmup"]]
        first = loop.sentence_epoch(model, trainer, warm, split) if warm else None
        split = dict.fromkeys(SPLIT, 0.0)
        gc.collect()
        t0 = time.perf_counter()
        total = loop.sentence_epoch(model, trainer, samples[cfg["warmup"]:], split)
        _settle(dy)
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "first_loss": first, "loss": total, "split": split,
                "samples": len(samples) - cfg["warmup"]}
    bs = cfg["batch_size"]
    batches = [samples[i:i + bs] for i in range(0, len(samples), bs)]
    train = cfg["mode"] == "train"
    first = [loop.minibatch_step(model, trainer, b, train, split) for b in batches[:cfg["warmup"]]]
    split = dict.fromkeys(SPLIT, 0.0)
    gc.collect()
    t0 = time.perf_counter()
    losses = [loop.minibatch_step(model, trainer, b, train, split) for b in batches[cfg["warmup"]:]]
    _settle(dy)
    seconds = time.perf_counter() - t0
    n = (len(batches) - cfg["warmup"]) * bs
    return {"seconds": seconds, "first_loss": first[0] if first else None, "loss": losses[-1],
            "split": split, "samples": n, "samples_per_sec": n / seconds}


def worker_main(args) -> None:
    try:
        versions = setup(args.system, args.variant, args.worker_threads)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which skips this system
        emit({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    emit({"ready": True, "versions": versions})
    for line in sys.stdin:
        if line.strip():
            try:
                emit(run_config(json.loads(line)))
            except Exception as e:  # noqa: BLE001 - one failing config must not stop the run
                emit({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)})


# ------------------------------------------------------------------ driver side
class SwapWorker(bench_run.Worker):
    """bench/run.py's worker process protocol, started on this module's worker mode."""

    def __init__(self, system: str, variant: str, threads: int, data: str | None, baseline: str | None = None):
        super().__init__(system, variant, threads)
        self.label = f"dynet:ab{variant}" if system == "dynet" else "dynagraph" + (f":{variant}" if variant else "")
        self.data, self.baseline = data, baseline
        if baseline:
            self.system, self.label = "baseline", "dynagraph@baseline"

    def start(self) -> None:
        import subprocess
        import tempfile
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        if self.data:
            env["DYNAGRAPH_DATA"] = os.path.abspath(self.data)
        if self.baseline:
            env["IMPORT_SWAP_DYNAGRAPH"] = os.path.abspath(self.baseline)
            env.update(BASELINE_ENV)
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "bench.import_swap", "--worker", "--system",
               "dynet" if self.system == "dynet" else "dynagraph",
               "--variant", self.variant, "--worker-threads", str(self.threads)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, bufsize=1)


BASELINE_ENV: dict = {}  # --baseline-env: set in the baseline worker only


def configs(args) -> list[dict]:
    out = []
    for name in args.workloads:
        suite = "sentence" if name in SENTENCE else "minibatch"
        sizes = [FIXED_H[name]] if name in FIXED_H else args.H
        modes = ["train"] if suite == "sentence" else args.modes
        for mode in modes:
            for H in sizes:
                if suite == "sentence":
                    n = args.sentences + args.sentence_warmup
                    warm = args.sentence_warmup
                else:
                    n = (args.batches + args.warmup) * args.batch_size
                    warm = args.warmup
                out.append(dict(workload=name, suite=suite, mode=mode, H=H, n=n, warmup=warm,
                                batch_size=args.batch_size, seed=args.seed, lr=args.lr))
    return out


def measure(args, threads: int) -> list[dict]:
    from tqdm import tqdm
    workers = [SwapWorker("dynagraph", sched, threads, args.data) for sched in args.scheduler]
    if args.baseline:
        workers.append(SwapWorker("dynagraph", args.scheduler[0], threads, args.data, args.baseline))
    workers += [SwapWorker("dynet", str(a), threads, args.data) for a in args.autobatch]
    live = bench_run.start_workers(workers)
    grid = configs(args)
    results: dict = {}
    try:
        with tqdm(total=args.rounds * len(grid) * len(live), disable=args.no_progress, unit="run") as bar:
            for rnd in range(args.rounds):
                for cfg in grid:
                    for w in live:
                        bar.set_description(f"r{rnd} {cfg['workload']} {cfg['mode']} H={cfg['H']} {w.label}")
                        res = w.run(cfg)
                        key = (cfg["workload"], cfg["mode"], cfg["H"], w.label)
                        old = results.get(key)
                        if "error" in res:
                            print(f"error: {key}: {res['error']}\n{res.get('traceback', '')}", file=sys.stderr)
                        elif old is None or res["seconds"] < old["seconds"]:
                            results[key] = {**cfg, **res, "label": w.label, "system": w.system, "threads": threads}
                        bar.update()
    finally:
        for w in workers:
            w.stop()
    return list(results.values())


def table(rows: list[dict]) -> str:
    """One line per config: dynagraph vs DyNet's better autobatch mode."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["threads"], r["suite"], r["workload"], r["mode"], r["H"]), []).append(r)
    lines = []
    head_mb = (f"{'thr':>3} {'workload':<13}{'mode':<6}{'H':>4} {'dynagraph/s':>11} {'DyNet/s':>9} {'best':>11} "
               f"{'ratio':>6}  dynagraph ms/batch rec/fwd/bwd/upd | DyNet")
    head_s = (f"{'thr':>3} {'workload':<13}{'mode':<6}{'H':>4} {'dynagraph s':>11} {'DyNet s':>9} {'best':>11} "
              f"{'time x':>6}  dynagraph us/sent rec/fwd/bwd/upd | DyNet   (loss dg / dy)")
    for suite, head in (("minibatch", head_mb), ("sentence", head_s)):
        keys = [k for k in by if k[1] == suite]
        if not keys:
            continue
        lines += [head, "-" * len(head)]
        for k in keys:
            dgs = [r for r in by[k] if r["system"] == "dynagraph"]
            dg = min(dgs, key=lambda r: r["seconds"]) if dgs else None
            dys = [r for r in by[k] if r["system"] == "dynet"]
            dy = min(dys, key=lambda r: r["seconds"]) if dys else None
            if dg is None or dy is None:
                continue
            base = next((r for r in by[k] if r["system"] == "baseline"), None)
            was = f"  (baseline {base['seconds'] / dy['seconds'] if suite == 'sentence' else dy['seconds'] / base['seconds']:.2f}x)" \
                if base else ""
            unit = args_units(dg)

            def ph(r):  # ms a mini-batch; us a sentence (a per-sentence phase is tens of us)
                scale, fmt = (1e3, "{:.1f}") if suite == "minibatch" else (1e6, "{:.0f}")
                return "/".join(fmt.format(r['split'][p] / unit * scale) for p in SPLIT)
            if suite == "minibatch":
                ratio = dg["samples_per_sec"] / dy["samples_per_sec"]
                lines.append(f"{k[0]:>3} {k[2]:<13}{k[3]:<6}{k[4]:>4} {dg['samples_per_sec']:>11.1f} "
                             f"{dy['samples_per_sec']:>9.1f} {best(dg, dy):>11} {ratio:>5.2f}x  {ph(dg)} | {ph(dy)}{was}")
            else:
                ratio = dg["seconds"] / dy["seconds"]
                lines.append(f"{k[0]:>3} {k[2]:<13}{k[3]:<6}{k[4]:>4} {dg['seconds']:>11.2f} {dy['seconds']:>9.2f} "
                             f"{best(dg, dy):>11} {ratio:>5.2f}x  {ph(dg)} | {ph(dy)}   "
                             f"({dg['first_loss']:.4g} / {dy['first_loss']:.4g}){was}")
        lines.append("")
    return "\n".join(lines)


def best(dg: dict, dy: dict) -> str:
    """Which runs won: dynagraph's scheduler ("dflt": its default) / DyNet's autobatch mode."""
    sched = dg["label"].partition(":")[2] or "dflt"
    return f"{sched}/{dy['label'][-3:]}"


def args_units(r: dict) -> float:
    return r["samples"] // r["batch_size"] if r["suite"] == "minibatch" else r["samples"]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    ints = lambda s: [int(x) for x in csv(s)]  # noqa: E731
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", default="dynagraph", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="H=64, training, one round, small epochs (< 3 min)")
    ap.add_argument("--suite", choices=["all", "minibatch", "sentence"], default="all")
    ap.add_argument("--workloads", type=csv, default=None,
                    help=f"comma list from {','.join([*MINIBATCH, *SENTENCE])} (default: the suite's)")
    ap.add_argument("--H", type=ints, default=None, help="hidden sizes (default 64,256,512; quick 64)")
    ap.add_argument("--modes", type=csv, default=None, help="train,infer for mini-batched workloads")
    ap.add_argument("--threads", type=ints, default=[1], help="BLAS threads; 0 = the libraries' default (e.g. 1,0)")
    ap.add_argument("--autobatch", type=ints, default=[0, 1], help="DyNet autobatch modes to run (best is used)")
    ap.add_argument("--scheduler", type=lambda v: v.split(","), default=[""],
                    help="dynagraph schedulers to run, comma list (the best is used, as DyNet's best autobatch "
                         "mode is; empty: the default, e.g. ',depth' runs the default and depth)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds; the best is kept (default 2)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=None, help="timed mini-batches per run (default 3; quick 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed mini-batches first")
    ap.add_argument("--sentences", type=int, default=None, help="sentences per timed epoch (default 300; quick 100)")
    ap.add_argument("--sentence-warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None, help="data folder with sst/ and wikiner/ (default $DYNAGRAPH_DATA, "
                    "../shared/data); synthetic data where absent")
    ap.add_argument("--baseline", default=None, help="folder holding another dynagraph package (e.g. an older "
                    "commit's, via git archive): run it too, as 'dynagraph@baseline'")
    ap.add_argument("--baseline-env", action="append", default=[], metavar="VAR=VALUE",
                    help="environment of the baseline worker only, e.g. --baseline . --baseline-env "
                    "DYNAGRAPH_COARSEN=0 with DYNAGRAPH_COARSEN=1 set: one setting against another")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    quick = args.quick
    args.H = args.H or ([64] if quick else [64, 256, 512])
    args.modes = args.modes or (["train"] if quick else ["train", "infer"])
    args.rounds = args.rounds or (1 if quick else 2)
    args.batches = args.batches or (2 if quick else 3)
    args.sentences = args.sentences or (100 if quick else 300)
    if args.data is None and args.baseline:
        # one data folder for every worker: a baseline elsewhere (git archive into /tmp) would
        # otherwise look for ../shared/data next to its own copy and time another data set
        from dynagraph import datasets
        found = datasets.shared_data_path("sst") or datasets.shared_data_path("wikiner")
        args.data = os.path.dirname(found) if found else ROOT  # ROOT holds no sst/, wikiner/: synthetic for all
    if args.workloads is None:
        args.workloads = ([*MINIBATCH] if args.suite != "sentence" else []) + \
                         ([*SENTENCE] if args.suite != "minibatch" else [])
    bad = [w for w in args.workloads if w not in MINIBATCH and w not in SENTENCE]
    if bad:
        raise SystemExit(f"unknown workload(s) {bad}")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return []
    for kv in args.baseline_env:
        var, _, value = kv.partition("=")
        BASELINE_ENV[var] = value
    rows = []
    for threads in args.threads:
        rows += measure(args, threads)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
