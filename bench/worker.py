"""One benchmarked system in its own process: reads configs, writes results.

    python -m bench.worker --system dynet --variant 1 --threads 1

Protocol: one JSON config per stdin line; one result per stdout line prefixed
with "@@ " (libraries may print their own lines, which the driver ignores).
The first line announces readiness and library versions. A process per system
keeps them apart: DyNet's autobatch mode is a process-wide init flag, and
torch/numpy thread pools must not interfere with each other.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback

from . import params, workloads

PREFIX = "@@ "

# DyNet's pools (MB: forward, backward, parameters, scratch): enough for every workload at
# H=512, batch 64 (measured). Larger pools cost DyNet nothing but slowed the *other*
# systems: an idle DyNet process holding 3 GB made dynagraph 1.7x slower on this 2-core VM.
DYNET_MEM = "256,256,128,128"


def emit(obj: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------ systems
def setup(system: str, variant: str, threads: int, dynet_mem: str = "") -> dict:
    """Import and configure the system; returns library versions for the record."""
    import numpy as np
    import threadpoolctl
    threadpoolctl.threadpool_limits(threads)  # every system: same BLAS thread count
    versions = {"numpy": np.__version__}
    if system == "dynet":
        import dynet_config
        # Before the first `import dynet`. With autobatching DyNet cannot grow its memory
        # pools, so they are sized up front (MB: forward,backward,parameters,scratch).
        dynet_config.set(autobatch=int(variant), random_seed=1, mem=dynet_mem or DYNET_MEM)
        import dynet
        versions["dynet"] = getattr(dynet, "__version__", "2.x")
    elif system == "torch":
        import torch
        torch.set_num_threads(threads)
        versions["torch"] = torch.__version__
    elif system == "dynagraph":
        import dynagraph
        dynagraph.config.set(threads=threads)
        versions["dynagraph"] = dynagraph.__version__
    return versions


def make_model(system: str, variant: str, kind: str, arrays: dict, lr: float):
    if system == "dynagraph":
        import dynagraph
        from .dy_models import DyModel
        return DyModel(dynagraph, kind, arrays, lr, {"scheduler": variant})
    if system == "dynet":
        import dynet
        from .dy_models import DyModel
        return DyModel(dynet, kind, arrays, lr)
    if system == "torch":
        from .torch_models import TorchModel
        return TorchModel(kind, arrays, lr)
    if system == "numpy":
        from .numpy_batched import NumpyModel
        return NumpyModel(kind, arrays, lr)
    raise ValueError(f"unknown system {system!r}")


# ------------------------------------------------------------------ one config
_DATA: dict = {}


def data_for(cfg: dict) -> tuple[list, int]:
    n = (cfg["warmup"] + cfg["batches"]) * cfg["batch_size"]
    key = (cfg["workload"], n, cfg["seed"])
    if key not in _DATA:
        _DATA.clear()  # one workload at a time: keeps the worker's memory flat
        _DATA[key] = workloads.load(cfg["workload"], n, cfg["seed"])
    return _DATA[key]


def run(system: str, variant: str, cfg: dict) -> dict:
    w = workloads.WORKLOADS[cfg["workload"]]
    samples, vocab = data_for(cfg)
    arrays = params.init_arrays(w.kind, cfg["H"], vocab, w.n_out, seed=cfg["seed"])
    model = make_model(system, variant, w.kind, arrays, cfg["lr"])
    batches = workloads.minibatches(samples, cfg["batch_size"])
    train = cfg["mode"] == "train"
    losses = [model.step(b, train) for b in batches[:cfg["warmup"]]]
    acc = _Accumulator(system)
    gc.collect()
    for b in batches[cfg["warmup"]:]:
        timer: dict = {}
        t0 = time.perf_counter()
        losses.append(model.step(b, train, timer))
        acc.add(time.perf_counter() - t0, timer)
    out = {"losses": losses, "seconds": acc.total, "step_seconds": acc.steps,
           "samples": cfg["batches"] * cfg["batch_size"]}
    out["samples_per_sec"] = out["samples"] / acc.total if acc.total > 0 else None
    out.update(acc.summary())
    return out


class _Accumulator:
    """Wall time per step and, for dynagraph, the graph's own time split and batch counts."""

    def __init__(self, system: str):
        self.system, self.steps, self.total, self.update = system, [], 0.0, 0.0
        self.stats = None
        self.last = None

    def add(self, seconds: float, timer: dict) -> None:
        self.steps.append(seconds)
        self.total += seconds
        self.update += timer.get("update", 0.0)
        if self.system == "dynagraph":
            import dynagraph
            cg = dynagraph.cg()
            self.last = cg.stats
            if self.stats is None:
                self.stats = dynagraph.stats.Stats()
            self.stats.merge(cg.stats)

    def summary(self) -> dict:
        if self.stats is None:
            return {}
        s, n = self.stats, len(self.steps)
        parts = {"record": s.t_record, "schedule": s.t_schedule, "execute": s.t_execute,
                 "memory": s.t_memory, "backward": s.t_backward, "update": self.update}
        parts["other"] = max(self.total - sum(parts.values()), 0.0)
        return {"nodes_per_step": s.nodes / n, "batches_per_step": s.batches / n,
                "kernels_per_step": s.kernel_calls / n,
                "last_step": {"nodes": self.last.nodes, "batches": self.last.batches,
                              "lower_bound": self.last.lower_bound},
                "time_split": {k: v / self.total for k, v in parts.items()},
                "seconds_split": parts}


# ------------------------------------------------------------------ main loop
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="benchmark worker (started by bench/run.py)")
    ap.add_argument("--system", required=True, choices=["dynagraph", "dynet", "torch", "numpy"])
    ap.add_argument("--variant", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dynet-mem", default="", help="DyNet memory pools in MB: forward,backward,parameters,scratch")
    args = ap.parse_args(argv)
    try:
        versions = setup(args.system, args.variant, args.threads, args.dynet_mem)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which skips this system
        emit({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    emit({"ready": True, "versions": versions})
    for line in sys.stdin:
        if not line.strip():
            continue
        cfg = json.loads(line)
        try:
            result = run(args.system, args.variant, cfg)
        except Exception as e:  # noqa: BLE001 - one failing config must not stop the run
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
        emit(result)


if __name__ == "__main__":
    main()
