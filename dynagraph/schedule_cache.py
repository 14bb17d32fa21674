"""Schedules kept by graph structure and replayed for an equal one (the small-graph path).

A per-sentence program records a graph of the same structure for every sentence of one
length (a served model, one for every repeated input shape). Scheduling such a graph
costs the agenda scheduler a fixed amount per node every time: 0.13-0.4 ms CPU for a
1,700-node BiRNN tagger graph, 5-8% of its forward. A schedule is a function of what
the scheduler reads: the pending nodes, their argument lists, depths and signature ids,
and the graph's signature keys (each signature's op, attributes and argument shapes or
shared parameters). When all of those equal the ones a schedule was computed for, the
same schedule is valid and is replayed.

Only the built-in deterministic schedulers are cached ("agenda", "lookahead", "depth"): the FSM's
policy can change while it trains, and a scheduler object can read anything. Graphs
larger than `max_nodes` are not cached: a mini-batch's structure rarely repeats, and
keying 40,000 nodes would cost more than the rare hit saves. The first-level key is
(scheduler, first and last pending node, number pending); under it up to MAX_CANDIDATES
graphs (most recent first) are compared in full: signature ids, pending nodes, argument
lists, depths (one C pass each, _bookkeeping.same_slice) and signature keys. A graph that
differs in any op, attribute, shape or wiring is a miss. (Hashing the signature ids of a
900-node graph as the key, then comparing its argument tuples in Python, cost a tenth of
its forward.)
"""
from __future__ import annotations

from collections import OrderedDict

from .recording import NATIVE


def _same_slice_py(items: list, lo: int, was: list) -> bool:
    """Twin of _bookkeeping.same_slice: items[lo:lo + len(was)] == was."""
    return items[lo:lo + len(was)] == was


_same_slice = getattr(NATIVE, "same_slice", None) or _same_slice_py
MAX_CANDIDATES = 8  # graphs kept under one first-level key (same span and size, other structure)

CACHED = frozenset({"agenda", "lookahead", "depth"})


class Schedule(list):
    """A cached schedule (its batches, as a list) and what the executor derived from it once:
    `plans` maps the executor's key (backend, dtype, fuse) to its execution plan, so a
    replayed graph skips the per-batch derivations (executor._plan_of)."""
    __slots__ = ("plans",)

    def __init__(self, batches):
        super().__init__(batches)
        self.plans: dict = {}


class ScheduleCache:
    def __init__(self, capacity: int = 128, max_nodes: int = 4096):
        self.capacity, self.max_nodes = capacity, max_nodes
        self.entries: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def _key(self, cg, pending: list):
        if not pending or type(cg.scheduler) is not str or cg.scheduler not in CACHED:
            return None
        lo, hi = pending[0], pending[-1] + 1
        if hi - lo > self.max_nodes:
            return None
        return cg.scheduler, lo, hi, len(pending)

    def get(self, cg, pending: list) -> Schedule | None:
        """The schedule computed for a graph whose pending nodes are structurally equal, or None."""
        key = self._key(cg, pending)
        if key is None:
            return None
        candidates = self.entries.get(key)
        if candidates:
            lo = key[1]
            for i, entry in enumerate(candidates):
                sig, was_pending, args, depth, signatures, batches = entry
                if _same_slice(cg.sig, lo, sig) and _same_slice(pending, 0, was_pending) \
                        and _same_slice(cg.args, lo, args) and _same_slice(cg.depth, lo, depth) \
                        and cg.signatures == signatures:
                    self.entries.move_to_end(key)
                    if i:
                        candidates.insert(0, candidates.pop(i))
                    self.hits += 1
                    return batches
        self.misses += 1
        return None

    def put(self, cg, pending: list, batches: list) -> list:
        """Keeps `batches` for graphs structured like cg; returns the Schedule kept (or batches
        when this graph is not cached), which the caller executes."""
        key = self._key(cg, pending)
        if key is None:
            return batches
        batches = Schedule(batches)
        lo, hi = key[1], key[2]
        # Every graph that replays the schedule shares its node lists: the executor, autodiff
        # and the stats only read them (nothing in the package mutates a scheduled batch).
        candidates = self.entries.setdefault(key, [])
        candidates.insert(0, (cg.sig[lo:hi], list(pending), cg.args[lo:hi], cg.depth[lo:hi], list(cg.signatures),
                              batches))
        del candidates[MAX_CANDIDATES:]
        self.entries.move_to_end(key)
        if len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
        return batches

    def clear(self) -> None:
        self.entries.clear()
        self.hits = self.misses = 0


SCHEDULES = ScheduleCache()
