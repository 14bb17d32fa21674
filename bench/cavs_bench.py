"""TreeLSTM training: op level vs dy.block vs Cavs vertex functions vs DyNet autobatch.

    python bench/cavs_bench.py                         # H 64,256,512; threads 1 then default
    python bench/cavs_bench.py --H 64 --threads 1 --rounds 3 --batches 3
    python bench/cavs_bench.py --systems dynagraph:cavs,dynet:1 --H 256

Same workload, parameters and SGD step as bench/run.py (bench/workloads.py,
bench/params.py, bench/dy_models.py): a step is one minibatch of 64 trees, record,
forward, backward, update. Every system runs in its own process; the configs are
interleaved across systems and repeated --rounds times, and each system keeps its
best round (the machine is shared and noisy: ratios of best rounds are what to quote).

Systems: dynagraph:agenda and dynagraph:depth (op level, two schedulers),
dynagraph:block (leaf and node cells as dy.block), dynagraph:cavs (dy.cavs vertex
functions; dynagraph:cavs-plain turns fusion and the measured optimisations off),
"+spelling" after block or cavs picks how the node cell is written (per-gate (default),
one-logistic, esum, helper: dy.tree_lstm_update; dynagraph:cavs+esum), to show that
fusion does not depend on it; dynet:1 and dynet:2 (DyNet autobatch modes, single-threaded as DyNet is), torch
(PyTorch eager, one sample at a time, bench/torch_models.py; opt-in), and numpy
(bench/numpy_batched.py: hand-batched, all nodes of one tree height in one GEMM, the
practical upper bound for batching; "vs numpy" is each system's ratio to it).
A dynagraph system takes a backend after "@" (dynagraph:agenda@numpy: the numpy
reference backend instead of the compiled cpu one, in a process of its own;
@cpu-nofuse: the cpu backend with runs turned off, DYNAGRAPH_FUSE=0).
--threads 0 means the library default (no BLAS thread cap). --baseline DIR runs every
dynagraph system a second time from another checkout (its own package and bench), as
base=dynagraph:..., in the same interleaved rounds.

Reported per system: samples/s (best round), ratio to DyNet's best autobatch mode,
the fastest step's CPU time (robust where wall time is not), kernel calls per step, and the split of step time. For dy.cavs the split is:
build (input graphs -> children lists, validation, scheduling, tracing lookup),
cavs forward and backward (the run node), the imperative rest (root losses:
recording, scheduling, kernels, their backward) and the parameter update.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import params, workloads  # noqa: E402
from bench.dy_models import DyModel  # noqa: E402
from bench.worker import DYNET_MEM, PREFIX, emit  # noqa: E402

SYSTEMS = ["dynagraph:agenda", "dynagraph:depth", "dynagraph:block", "dynagraph:cavs", "dynet:1", "dynet:2", "numpy"]


# =========================================================================== models
class BlockModel(DyModel):
    """The TreeLSTM of dy_models with its leaf and node cells as static subgraphs."""

    def __init__(self, dy: Any, *a, spelling: str = "per-gate", **k):
        super().__init__(dy, *a, **k)
        P, H = self.P, self.H

        def leaf(w):
            g = dy.affine_transform([P["b_iou"], P["W_iou"], dy.lookup(P["E"], w)])
            c = dy.cmult(dy.logistic(dy.pick_range(g, 0, H)), dy.tanh(dy.pick_range(g, 2 * H, 3 * H)))
            return dy.cmult(dy.logistic(dy.pick_range(g, H, 2 * H)), dy.tanh(c)), c
        self.leaf = dy.block(leaf, name="leaf")
        self.node = dy.block(lambda hl, cl, hr, cr: _node(dy, P, H, hl, cl, hr, cr, spelling), name="node")

    def _treelstm(self, t):
        states = []
        for w, l, r in zip(t.words, t.left, t.right):
            states.append(self.leaf(w) if l < 0 else self.node(*states[l], *states[r]))
        return self._root_loss(states[-1][0], t.label)


def _node(dy, P, H, hl, cl, hr, cr, spelling: str = "per-gate"):
    g = dy.affine_transform([P["b"], P["U_l"], hl, P["U_r"], hr])
    if spelling == "helper":
        return dy.tree_lstm_update(g, [cl, cr], H)
    if spelling == "one-logistic":  # one logistic over the four sigmoid gates, then slices
        s = dy.logistic(dy.pick_range(g, 0, 4 * H))
        i, fl, fr, o = (dy.pick_range(s, k * H, (k + 1) * H) for k in range(4))
    else:
        i, fl = dy.logistic(dy.pick_range(g, 0, H)), dy.logistic(dy.pick_range(g, H, 2 * H))
        fr, o = dy.logistic(dy.pick_range(g, 2 * H, 3 * H)), dy.logistic(dy.pick_range(g, 3 * H, 4 * H))
    u = dy.tanh(dy.pick_range(g, 4 * H, 5 * H))
    if spelling == "esum":
        c = dy.esum([dy.cmult(i, u), dy.cmult(fl, cl), dy.cmult(fr, cr)])
    else:
        c = dy.cmult(i, u) + dy.cmult(fl, cl) + dy.cmult(fr, cr)
    return dy.cmult(o, dy.tanh(c)), c


# how a system's variant names the node cell's spelling: dynagraph:cavs+one-logistic
SPELLINGS = ("per-gate", "one-logistic", "esum", "helper")


class CavsModel(DyModel):
    """The same TreeLSTM as two vertex functions over the whole minibatch."""

    def __init__(self, dy: Any, *a, fuse: bool | None = None, spelling: str = "per-gate", **k):
        super().__init__(dy, *a, **k)
        import dynagraph.cavs as cavs
        P, H = self.P, self.H
        self.fuse, self.cavs = fuse, cavs

        @cavs.vertex_function(arity=0)
        def leaf(v):
            g = dy.affine_transform([P["b_iou"], P["W_iou"], v.pull()])
            c = dy.cmult(dy.logistic(dy.pick_range(g, 0, H)), dy.tanh(dy.pick_range(g, 2 * H, 3 * H)))
            h = dy.cmult(dy.logistic(dy.pick_range(g, H, 2 * H)), dy.tanh(c))
            v.scatter(h, c)
            v.push(h)

        @cavs.vertex_function(arity=2)
        def node(v):
            (hl, cl), (hr, cr) = v.gather(0), v.gather(1)
            h, c = _node(dy, P, H, hl, cl, hr, cr, spelling)
            v.scatter(h, c)
            v.push(h)
        self.functions = [leaf, node]
        self.out = None
        self.t_build = 0.0

    def graph(self, batch: list):
        dy = self.dy
        dy.renew_cg(**self.renew_kwargs)
        self.begin()
        t0 = time.perf_counter()
        # FlatTree: post-order; a leaf has left = right = -1 (children [-1, -1]: none). As (n, 2)
        # arrays: run() concatenates them with no Python per vertex (0.2 ms a step at H=64)
        import numpy as np
        graphs = []
        for t in batch:
            lr = np.array((t.left, t.right), dtype=np.int64)
            graphs.append({"children": lr.T, "types": (lr[0] >= 0).astype(np.int64)})
        self.out = self.cavs.run(self.functions, graphs, pull=(self.P["E"], [t.words for t in batch]),
                                 fuse=self.fuse)
        self.t_build = time.perf_counter() - t0
        return dy.esum([self._root_loss(h, t.label) for h, t in zip(self.out.roots(), batch)])


# =========================================================================== worker
def setup(system: str, threads: int) -> dict:
    import numpy as np
    versions = {"numpy": np.__version__}
    if threads > 0:
        import threadpoolctl
        threadpoolctl.threadpool_limits(threads)
    if system == "dynet":
        import dynet_config
        dynet_config.set(autobatch=int(_VARIANT[0]), random_seed=1, mem=DYNET_MEM)
        import dynet
        versions["dynet"] = getattr(dynet, "__version__", "2.x")
    elif system == "numpy":
        pass  # the hand-batched baseline: numpy and BLAS only
    elif system == "torch":
        import torch
        if threads > 0:
            torch.set_num_threads(threads)
        versions["torch"] = torch.__version__
    else:
        import dynagraph
        if threads > 0:
            dynagraph.config.set(threads=threads)
        versions["dynagraph"] = dynagraph.__version__
        versions["backend"] = dynagraph.get_backend().name  # the one actually running
        versions["fuse"] = dynagraph.config.get()["fuse"]
    return versions


_VARIANT = [""]


def make_model(system: str, variant: str, arrays: dict, lr: float):
    if system == "dynet":
        import dynet
        return DyModel(dynet, "treelstm", arrays, lr)
    if system == "numpy":
        from bench.numpy_batched import NumpyModel
        return NumpyModel("treelstm", arrays, lr)
    if system == "torch":
        from bench.torch_models import TorchModel
        return TorchModel("treelstm", arrays, lr)
    import dynagraph
    variant, _, spelling = variant.partition("+")
    if spelling and spelling not in SPELLINGS:
        raise ValueError(f"unknown cell spelling {spelling!r}; one of {', '.join(SPELLINGS)}")
    spelling = spelling or "per-gate"
    if variant == "block":
        return BlockModel(dynagraph, "treelstm", arrays, lr, spelling=spelling)
    if variant in ("cavs", "cavs-plain"):
        import dynagraph.cavs as cavs
        plain = variant == "cavs-plain"
        cavs.DEDUP_HOISTED = not plain
        return CavsModel(dynagraph, "treelstm", arrays, lr, fuse=False if plain else None, spelling=spelling)
    return DyModel(dynagraph, "treelstm", arrays, lr, {"scheduler": variant})


class _Split:
    """Wall time per step and, for dynagraph, where it went."""

    def __init__(self):
        self.t: dict = {}
        self.kernels = 0
        self.steps = 0
        self.cpu = float("inf")  # the round's fastest step in CPU seconds

    def add(self, key: str, v: float) -> None:
        self.t[key] = self.t.get(key, 0.0) + v


def timed_step(system: str, variant: str, model, batch: list, split: _Split) -> tuple[float, float]:
    timer: dict = {}
    c0, t0 = time.process_time(), time.perf_counter()
    loss = model.step(batch, True, timer)
    wall = time.perf_counter() - t0
    split.cpu = min(split.cpu, time.process_time() - c0)  # CPU time: robust on a shared machine
    split.steps += 1
    split.add("update", timer.get("update", 0.0))
    if system == "dynagraph":
        import dynagraph
        st = dynagraph.cg().stats
        split.kernels += st.kernel_calls
        if variant.startswith("cavs"):
            tm = model.out.timing
            split.add("build", model.t_build)
            split.add("cavs_forward", tm["forward"])
            split.add("cavs_backward", tm["backward"])
            split.add("imperative", wall - timer.get("update", 0.0) - model.t_build - tm["forward"] - tm["backward"])
        else:
            for k in ("record", "schedule", "execute", "memory", "backward"):
                split.add(k, getattr(st, "t_" + k))
    return loss, wall


_CACHE: dict = {}


def run_round(system: str, variant: str, cfg: dict) -> dict:
    """One round of cfg["batches"] timed steps; the model persists across rounds of a config."""
    key = json.dumps(cfg, sort_keys=True)
    if key not in _CACHE:
        _CACHE.clear()
        n = (cfg["warmup"] + cfg["batches"]) * cfg["batch_size"]
        samples, vocab = workloads.load(cfg["workload"], n, cfg["seed"])
        arrays = params.init_arrays("treelstm", cfg["H"], vocab, 5, seed=cfg["seed"])
        model = make_model(system, variant, arrays, cfg["lr"])
        batches = workloads.minibatches(samples, cfg["batch_size"])
        first = [model.step(b, True) for b in batches[:cfg["warmup"]]]
        _CACHE[key] = (model, batches[cfg["warmup"]:], first)
    model, batches, first = _CACHE[key]
    split, losses, total = _Split(), [], 0.0
    gc.collect()
    for b in batches:
        loss, wall = timed_step(system, variant, model, b, split)
        losses.append(loss)
        total += wall
    out = {"seconds": total, "samples": len(batches) * cfg["batch_size"], "loss0": first[0] if first else None,
           "losses": losses}
    out["samples_per_sec"] = out["samples"] / total
    out["cpu_ms_per_step"] = 1e3 * split.cpu
    if split.steps and system == "dynagraph":
        out["kernels_per_step"] = split.kernels / split.steps
        out["split"] = {k: v / total for k, v in split.t.items()}
    return out


def worker_main(argv) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True)
    ap.add_argument("--variant", default="")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    _VARIANT[0] = args.variant
    try:
        versions = setup(args.system, args.threads)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which skips the system
        emit({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    emit({"ready": True, "versions": versions})
    for line in sys.stdin:
        if line.strip():
            cfg = json.loads(line)
            try:
                emit(run_round(args.system, args.variant, cfg))
            except Exception as e:  # noqa: BLE001
                emit({"error": f"{type(e).__name__}: {e}"})


# =========================================================================== driver
class Worker:
    def __init__(self, spec: str, threads: int, root: str = ROOT):
        """root: the checkout whose package and bench run the system (--baseline: another one)."""
        self.spec, self.threads, self.root = spec, threads, root
        self.system, _, variant = spec.partition(":")
        if self.system.startswith("base="):  # base=dynagraph:block, the --baseline checkout's
            self.system = self.system[len("base="):]
        self.variant, _, self.backend = variant.partition("@")  # dynagraph:cavs@numpy
        self.proc, self.versions, self.error = None, {}, None

    def start(self) -> None:
        import subprocess
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([self.root, os.environ.get("PYTHONPATH", "")]))
        if self.threads > 0:
            env["DYNAGRAPH_THREADS"] = str(self.threads)
        else:
            env.pop("DYNAGRAPH_THREADS", None)
        if self.backend:  # numpy | cpu | cpu-nofuse (the cpu backend without runs, for A/B)
            env["DYNAGRAPH_BACKEND"] = self.backend.split("-")[0]
            env["DYNAGRAPH_FUSE"] = "0" if self.backend.endswith("-nofuse") else "1"
        cmd = [sys.executable, "-m", "bench.cavs_bench", "--worker", "--system", self.system,
               "--variant", self.variant, "--threads", str(self.threads)]
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        hello = self._read()
        if not hello.get("ready"):
            self.error = hello.get("error", "worker failed to start")
            self.stop()
        else:
            self.versions = hello.get("versions", {})

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        return {"error": f"worker exited with code {self.proc.wait()}"}

    def run(self, cfg: dict) -> dict:
        if self.proc is None:
            return {"error": self.error or "not running"}
        self.proc.stdin.write(json.dumps(cfg) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc = None


def run_threads(args, threads: int, with_baselines: bool) -> list[dict]:
    import importlib.util
    specs = [s for s in args.systems if not s.startswith(("dynet", "torch"))
             or (with_baselines and importlib.util.find_spec(s.partition(":")[0]))]
    workers = [Worker(s, threads if not s.startswith("dynet") else 1) for s in specs]
    if args.baseline:  # every dynagraph system again, run by the baseline checkout's own package
        workers += [Worker("base=" + s, threads, os.path.abspath(args.baseline)) for s in specs
                    if s.startswith("dynagraph")]
    for w in workers:
        w.start()
        if w.error:
            print(f"note: {w.spec} unavailable: {w.error}", file=sys.stderr)
    best: dict = {}
    try:
        for rnd in range(args.rounds):
            for H in args.H:
                cfg = dict(workload=args.workload, H=H, batch_size=args.batch_size, batches=args.batches,
                           warmup=args.warmup, seed=args.seed, lr=args.lr)
                for w in workers:
                    if w.error:
                        continue
                    r = w.run(cfg)
                    if not args.quiet:
                        sps = r.get("samples_per_sec")
                        print(f"  round {rnd + 1} H={H} threads={threads} {w.spec:<18} "
                              + (f"{sps:8.1f} samples/s" if sps else r.get("error", "?")), file=sys.stderr)
                    k = (H, w.spec)
                    if "error" in r or k not in best or r["samples_per_sec"] > best[k]["samples_per_sec"]:
                        best[k] = {**cfg, "system": w.spec, "threads": threads, "round": rnd,
                                   "versions": w.versions, **r}
    finally:
        for w in workers:
            w.stop()
    return list(best.values())


def add_ratios(results: list[dict]) -> None:
    dynet: dict = {}
    for r in results:
        if r["system"].startswith("dynet") and r.get("samples_per_sec"):
            dynet[r["H"]] = max(dynet.get(r["H"], 0.0), r["samples_per_sec"])
    hand = {r["H"]: r["samples_per_sec"] for r in results if r["system"] == "numpy" and r.get("samples_per_sec")}
    for r in results:
        d, n = dynet.get(r["H"]), hand.get(r["H"])
        r["vs_dynet_best"] = r["samples_per_sec"] / d if d and r.get("samples_per_sec") else None
        r["vs_numpy"] = r["samples_per_sec"] / n if n and r.get("samples_per_sec") else None


def table(results: list[dict]) -> str:
    lines = [f"{'H':>4} {'thr':>3}  {'system':<24}{'samples/s':>10}{'vs DyNet':>9}{'vs numpy':>9}{'CPU ms':>8}"
             f"{'kern/step':>10}"
             f"   split (% of step)",
             "-" * 100]
    def order(r: dict) -> tuple:
        base = r["system"].partition("@")[0]
        return r["H"], r["threads"], SYSTEMS.index(base) if base in SYSTEMS else 99, r["system"]
    for r in sorted(results, key=order):
        if r.get("error"):
            lines.append(f"{r['H']:>4} {r['threads']:>3}  {r['system']:<24}error: {r['error'][:80]}")
            continue
        ratio = f"{r['vs_dynet_best']:.2f}x" if r.get("vs_dynet_best") else "-"
        hand = f"{r['vs_numpy']:.2f}x" if r.get("vs_numpy") else "-"
        kern = f"{r['kernels_per_step']:.0f}" if r.get("kernels_per_step") else ""
        split = " ".join(f"{k} {100 * v:.0f}" for k, v in (r.get("split") or {}).items())
        cpu = f"{r['cpu_ms_per_step']:.1f}" if r.get("cpu_ms_per_step") else "-"
        lines.append(f"{r['H']:>4} {r['threads']:>3}  {r['system']:<24}{r['samples_per_sec']:>10.1f}{ratio:>9}"
                     f"{hand:>9}{cpu:>8}{kern:>10}   {split}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--systems", type=csv, default=SYSTEMS)
    ap.add_argument("--H", type=lambda s: [int(x) for x in csv(s)], default=[64, 256, 512])
    ap.add_argument("--threads", type=lambda s: [int(x) for x in csv(s)], default=[1, 0],
                    help="dynagraph BLAS threads, one pass each; 0 = library default (default 1,0)")
    ap.add_argument("--workload", default="treelstm", choices=["treelstm", "treelstm-sst"])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=3, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="best-of-N rounds, interleaved across systems")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/cavs-<date>.json)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="also run every dynagraph system from another checkout (built in place), as base=SYSTEM")
    ap.add_argument("--plot", default=None, help="also draw samples/s per system as a chart (.png/.svg; "
                    "needs pip install -e '.[plot]')")
    return ap.parse_args(argv)


def plot(path: str, results: list) -> str:
    """samples/s per system, one group of bars per (H, threads); log scale (systems differ 100x)."""
    from bench.plot import grouped_bars
    rows = [dict(r, config=f"H={r['H']}, {r['threads'] or 'default'} thr") for r in results
            if r.get("samples_per_sec")]
    return grouped_bars(path, rows, "config", "system", "samples_per_sec", ylabel="samples / s (best round)",
                        title="TreeLSTM training, batch of trees", log=True)


def main(argv=None) -> dict:
    args = parse_args(argv)
    results = []
    for k, threads in enumerate(args.threads):  # DyNet is single-threaded: measured in the first pass
        results += run_threads(args, threads, with_baselines=k == 0)
    for t in args.threads:
        add_ratios([r for r in results if r["threads"] == t or r["system"].startswith("dynet")])
    doc = {"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                    "command": "python bench/cavs_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "python": platform.python_version(), "cpus": os.cpu_count()},
           "results": results}
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   "cavs-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ".json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    if not args.quiet:
        print(table(results))
        print(f"\nwrote {out}")
    if args.plot:
        print(f"chart -> {plot(args.plot, results)}")
    return doc


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.argv.remove("--worker")
        worker_main(sys.argv[1:])
    else:
        main()
