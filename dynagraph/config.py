"""Global settings: seed, dtype, backend, default scheduler, debug level.

`dynagraph.config.set(...)` mirrors `dynet_config.set(...)`; DyNet-only keys
(mem, requested_gpus, ...) are accepted and ignored so old scripts still run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

# DyNet's --dynet-autobatch values mapped onto our scheduler names.
AUTOBATCH_SCHEDULERS = {0: "none", 1: "lookahead", 2: "depth"}  # 1: the agenda, with lookahead
_DYNET_IGNORED = {"mem", "requested_gpus", "profiling", "weight_decay", "shared_parameters", "device"}


def _plan_env(v: str | None) -> str | None:
    return None if v in (None, "", "none", "None") else v


@dataclass
class Config:
    seed: int = 0
    dtype: str = "float32"
    backend: str = field(default_factory=lambda: os.environ.get("DYNAGRAPH_BACKEND", "cpu"))
    scheduler: str = field(default_factory=lambda: os.environ.get("DYNAGRAPH_SCHEDULER", "lookahead"))
    debug: int = 0
    # How dy.block runs its steps over a batch of calls: "planned", "naive" or None.
    block_plan: str | None = field(default_factory=lambda: _plan_env(os.environ.get("DYNAGRAPH_BLOCK_PLAN", "planned")))
    threads: int | None = None  # BLAS threads; None leaves numpy's default alone
    # Consecutive elementwise batches run as one C call on the cpu backend (dynagraph/runs.py).
    fuse: bool = field(default_factory=lambda: os.environ.get("DYNAGRAPH_FUSE", "1") not in ("0", "false", "no"))
    # Repeated subgraphs of op-level code run as compiled blocks (dynagraph/coarsen).
    coarsen: bool = field(default_factory=lambda: os.environ.get("DYNAGRAPH_COARSEN", "0") in ("1", "true", "yes"))
    # Replay the schedule of a small graph structured like one scheduled before (schedule_cache.py).
    schedule_cache: bool = field(default_factory=lambda: os.environ.get("DYNAGRAPH_SCHEDULE_CACHE", "1")
                                 not in ("0", "false", "no"))
    # backward() and update() on a worker thread while the next graph records (dynagraph/overlap.py)
    # Opt-in: measured slower than in place on a busy 2-core machine (README, "The second core").
    overlap: bool = field(default_factory=lambda: os.environ.get("DYNAGRAPH_OVERLAP", "0") not in ("0", "false", "no"))
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)


config = Config()


def set(random_seed: int | None = None, dtype: str | None = None, backend: str | None = None,
        scheduler: str | None = None, autobatch: int | None = None, debug: int | None = None,
        threads: int | None = None, block_plan: str | None = "", fuse: bool | None = None,
        coarsen: bool | None = None, overlap: bool | None = None, **dynet_keys) -> None:
    """Change global settings. Affects graphs and parameters created afterwards."""
    unknown = [k for k in dynet_keys if k not in _DYNET_IGNORED]
    if unknown:
        raise TypeError(f"config.set() got unknown settings {sorted(unknown)}")
    if random_seed is not None:
        reset_random_seed(random_seed)
    if dtype is not None:
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
        config.dtype = np.dtype(dtype).name
    if backend is not None:
        config.backend = backend
    if autobatch is not None:
        if autobatch not in AUTOBATCH_SCHEDULERS:
            raise ValueError(f"autobatch must be one of {sorted(AUTOBATCH_SCHEDULERS)}, got {autobatch!r}")
        config.scheduler = AUTOBATCH_SCHEDULERS[autobatch]
    if scheduler is not None:
        config.scheduler = scheduler
    if debug is not None:
        config.debug = int(debug)
    if threads is not None:
        set_threads(threads)
    if fuse is not None:
        config.fuse = bool(fuse)
    if coarsen is not None:
        config.coarsen = bool(coarsen)
    if overlap is not None:
        config.overlap = bool(overlap)
    if block_plan != "":
        if _plan_env(block_plan) not in (None, "naive", "planned"):
            raise ValueError(f"block_plan must be 'planned', 'naive' or None, got {block_plan!r}")
        config.block_plan = _plan_env(block_plan)


_limiter = None


def set_threads(n: int) -> None:
    """Cap BLAS threads. Batched GEMMs here are small; on a shared 2-core machine
    OpenBLAS's spinning threads can make them 10-20x slower than one thread."""
    global _limiter
    from threadpoolctl import threadpool_limits
    config.threads = int(n)
    _limiter = threadpool_limits(limits=int(n), user_api="blas")


def reset_random_seed(seed: int) -> None:
    """Seeds parameter initialisation and the graph-level random ops (dropout, noise)."""
    config.seed = int(seed)
    config.rng = np.random.default_rng(int(seed))


def get() -> dict:
    from .recording import COMPILED  # no import cycle: recording imports nothing of ours
    return {"seed": config.seed, "dtype": config.dtype, "backend": config.backend,
            "scheduler": config.scheduler, "debug": config.debug, "threads": config.threads,
            "block_plan": config.block_plan, "fuse": config.fuse, "coarsen": config.coarsen,
            "overlap": config.overlap,
            # recording and per-node bookkeeping: "compiled" (dynagraph._bookkeeping) or "python"
            "bookkeeping": "compiled" if COMPILED else "python"}


if os.environ.get("DYNAGRAPH_THREADS"):
    set_threads(int(os.environ["DYNAGRAPH_THREADS"]))
