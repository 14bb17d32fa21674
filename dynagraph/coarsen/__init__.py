"""Automatic coarsening: repeated subgraphs of op-level code run as compiled blocks.

`dy.config.set(coarsen=True)` turns it on (off by default: see README "Automatic
coarsening" for the measured figures). At each evaluation the pending nodes are cut
into instances of repeated patterns (`detect.py`); each pattern is compiled once into
the plan that `dy.block` would build for it (`subgraph.Plan`, with its memory layout
and fusion), and its instances run as one group per unit depth (`run.py`). Values and
gradients equal op-by-op execution; instances that differ in any signature detail
(shape, op attribute, parameter identity, wiring) never share a pattern.
"""
from __future__ import annotations

import gc
import time

from .. import engine
from ..config import config
from .detect import MAX_NODES, MIN_CALLS, Head, Pattern, find_patterns, plan_native
from .run import Coarsened, CoarseRecord, plan_for

__all__ = ["MAX_NODES", "MIN_CALLS", "CoarseRecord", "Coarsened", "Head", "Pattern", "coarsen", "find_patterns",
           "plan_for"]


def coarsen(cg, pending: list) -> Coarsened | None:
    """The engine's hook: the chunk's coarsened schedule, or None to run it op by op."""
    if not config.coarsen or cg.scheduler == "none" or len(pending) < 4:
        return None
    t0 = time.perf_counter()
    collecting = gc.isenabled()
    gc.disable()  # the pass allocates a few small objects per node, all live: nothing to collect
    try:
        found = plan_native(cg, pending)   # patterns and their unit schedule in one compiled pass
        if found is None:
            patterns, owner = find_patterns(cg, pending)
            batches = None
        else:
            (patterns, batches), owner = found, None
    finally:
        if collecting:
            gc.enable()
    cg.stats.t_coarsen += time.perf_counter() - t0
    if not patterns:
        return None
    return Coarsened(cg, pending, patterns, owner, batches)


engine.set_coarsener(coarsen)
