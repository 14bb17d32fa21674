"""Connects recording to evaluation: schedule -> execute -> autodiff.

Installed into graph.py at import so the graph layer never imports upward.
"""
from __future__ import annotations

import time
from itertools import compress

from . import autodiff, executor, graph, overlap, schedulers
from .backends import get_backend
from .config import config
from .recording import NATIVE
from .schedule_cache import SCHEDULES
from .stats import ACTIVE

_coarsener = None  # set by dynagraph.coarsen: (cg, pending) -> a coarsened chunk or None


def set_coarsener(fn) -> None:
    global _coarsener
    _coarsener = fn


_ZERO = 0  # _ZERO.__gt__(b) is `0 > b`: the node has no value block yet


def _pending_py(blk: list, lo: int, hi: int) -> list[int]:
    """Nodes in [lo, hi) without a value block: compress() walks both sequences in C."""
    return list(compress(range(lo, hi), map(_ZERO.__gt__, blk[lo:hi])))


_pending = NATIVE.pending if NATIVE is not None else _pending_py


_NO_DEFER = frozenset()  # forward()'s default: a plain evaluation, not a concurrent map's chunk


class Engine:
    def forward(self, cg, upto: int, defer: frozenset | set = _NO_DEFER, targets=()) -> None:
        stats = cg.stats
        token = ACTIVE.set(stats)  # dy.block plans report their inner copies here
        try:
            self._forward(cg, stats, upto, defer, targets)
        finally:
            ACTIVE.reset(token)

    def _forward(self, cg, stats, upto: int, defer, targets) -> None:
        """Evaluate the pending nodes up to `upto`; with `defer` (dy.phase), leave those nodes and
        their pending users out unless `targets` need them (`done` stops at the first left)."""
        overlap.before_execution()  # a deferred backward()/update() may still be writing parameters
        t0 = time.perf_counter()
        stats.t_record += t0 - cg._t_last
        chunk = getattr(defer, "chunk", None)  # dy.autobatch_map's splitter knows the nodes it left pending
        pending = chunk(cg, upto) if chunk is not None else _pending(cg.blk, cg.done, upto + 1)
        left = []
        if defer:  # a splitter that keeps its state across chunks (dy.autobatch_map's) splits itself
            split = getattr(defer, "split", None)
            pending, left = split(cg, pending, targets) if split else _split_deferred(cg, pending, defer, targets)
        coarse = _coarsener(cg, pending) if _coarsener is not None and config.coarsen else None
        if coarse is not None:
            batches = coarse.schedule()
            stats.t_schedule += time.perf_counter() - t0
            coarse.execute(get_backend(), batches)
            cg.scheduled = None  # coarsened groups: executed_batches() reads the records
            self._done(cg, stats, upto, left)
            return
        # the small-graph path: a graph structured like one scheduled before replays its schedule;
        # not a dy.autobatch_map chunk (`defer` given), cut where reads fell: it hardly ever repeats
        cache = SCHEDULES if config.schedule_cache and defer is _NO_DEFER and not config.debug else None
        batches = cache.get(cg, pending) if cache is not None else None
        if batches is None:
            sched = schedulers.get(cg.scheduler)
            batches = sched.schedule(cg, pending)
            if config.debug or not getattr(sched, "trusted", False):
                schedulers.validate(cg, pending, batches, getattr(sched, "name", type(sched).__name__))
            if cache is not None:
                batches = cache.put(cg, pending, batches)
        stats.t_schedule += time.perf_counter() - t0
        executor.execute(cg, get_backend(), batches)
        if cg.scheduled is not None:
            cg.scheduled.extend(batches)
        self._done(cg, stats, upto, left)

    @staticmethod
    def _done(cg, stats, upto: int, left: list) -> None:
        cg.done = left[0] if left else upto + 1
        if stats.lower_bound_fn is None:
            stats.lower_bound_fn = _Bound(cg)
        stats.lower_bound_fn.done = cg.done
        cg._t_last = time.perf_counter()

    def backward(self, cg, nid: int, full: bool) -> None:
        be = get_backend()

        def run() -> None:
            token = ACTIVE.set(cg._stats)  # dy.block plans report their inner copies here
            try:
                autodiff.backward(cg, be, nid, full)
            finally:
                ACTIVE.reset(token)
        # With dy.config.set(overlap=True) the replay runs on the overlap thread while the caller records on.
        if not overlap.defer(run, "loss.backward()", owner=cg):
            run()
        cg._t_last = time.perf_counter()


def _split_deferred(cg, pending: list[int], defer, targets) -> tuple[list[int], list[int]]:
    """(nodes to evaluate, nodes left pending). Left pending: the deferred nodes and every pending
    node that reads one (a finished sample's esum of deferred losses), except what a node in
    `targets` (the values being waited for) needs."""
    args = cg.args
    tainted = set(defer.intersection(pending))  # set operations in C: `pending` grows by a round
    if not tainted:  # of deferred nodes after each read, so this runs once per round over them all
        return pending, []
    for nid in [n for n in pending if n not in tainted]:  # ascending: arguments come first
        if not tainted.isdisjoint(args[nid]):
            tainted.add(nid)
    if tainted.isdisjoint(targets):  # nothing waited for is deferred, so nothing it needs is
        return [n for n in pending if n not in tainted], sorted(tainted)
    tainted -= graph.needed_within(args, tainted, targets)  # and the deferred nodes they read
    return [n for n in pending if n not in tainted], sorted(tainted)


class _Bound:
    """The lower bound on demand, from the graph's node lists but not the graph: a closure
    over the graph made graph -> stats -> closure -> graph a cycle, so a retired graph (and
    every buffer it saved for backward) waited for the cyclic GC instead of going at once."""

    __slots__ = ("op", "args", "sig", "done")

    def __init__(self, cg):
        self.op, self.args, self.sig, self.done = cg.op, cg.args, cg.sig, 0

    def __call__(self) -> int:
        return schedulers.lower_bound(self, [i for i in range(self.done) if not self.op[i].leaf])


graph.set_engine(Engine())
