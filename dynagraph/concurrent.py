"""dy.autobatch_map: per-sample code with data-dependent control flow, batched across samples.

A shift-reduce parser, a decoder that stops at end-of-sentence or an early-exit classifier
reads a value (`.value()`, `float(e)`, `if e.scalar_value() > 0:`) in the middle of its
per-sample loop. Run one sample after another, each read evaluates that one sample's
pending nodes alone, so nothing batches across the mini-batch. ACROBAT (Fegade et al.,
MLSys 2023) runs every sample's code concurrently: each sample runs until it reads a
value and parks there; once every live sample is parked or finished, one scheduled
evaluation over all their pending nodes serves them all, and they resume.

Samples are greenlets, not threads: a park-and-resume round trip measured 2.3-2.9 us with
greenlets against 6.6-13.9 us for a handoff between two threads through a Condition
(bench/switch_cost.py, a busy 2-core machine), and greenlets need no lock around the shared
graph because only one runs at a time.

All samples record into ONE graph (the current one), so their ops batch together.
Each sample draws its randomness (dropout, noise) from a stream of its own, so values
and gradients equal running the samples one by one (`concurrent=False`).
"""
from __future__ import annotations

import functools
import gc
import threading
from bisect import bisect_left
from contextvars import copy_context
from itertools import compress, filterfalse
from typing import Any, Callable, Iterable, Sequence

from .config import config
from .errors import DynagraphError
from .ghosts import align_depths, groups_by_depth
from .graph import SAMPLE, current, needed_within, user_line
from .recording import NATIVE

try:
    from greenlet import getcurrent, greenlet
except ImportError:  # a dependency (setup.py); concurrent=False runs without it
    getcurrent = greenlet = None

__all__ = ["autobatch_map", "phase"]

_PARK, _DONE = object(), object()
_sample_now = SAMPLE.get  # the running sample (None outside a map), without an attribute lookup per call
_STREAM_BITS = 20  # random keys per sample before its stream wraps into the next index's range
_M = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's finaliser: sample streams of nearby indices and seeds land far apart."""
    z = (z + 0x9E3779B97F4A7C15) & _M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return z ^ (z >> 31)


class _Sample:
    """What graph.py sees of a running sample: park(cg, nid) and next_key(); plus its dy.phase
    (phase > 0: nodes recorded since `since` in graph `graph` are deferred)."""
    __slots__ = ("index", "park", "seed", "key_base", "count", "phase", "since", "graph", "deferred",
                 "ghosts", "arms", "parks", "checkpoints", "resumed")

    def __init__(self, index: int, seed: int, park: Callable | None, deferred: dict | None = None,
                 arms: dict | None = None):
        self.index, self.park, self.seed, self.key_base, self.count = index, park, seed, -1, 0
        self.phase, self.since, self.graph, self.deferred = 0, 0, None, deferred
        self.ghosts: list = []  # open dy.ghost blocks: their arms pause at every park
        self.arms = arms        # graph -> the map's dy.ghost arms not evaluated yet
        self.parks = 0          # reads that parked this sample so far
        self.checkpoints: list = []  # this sample's cg_checkpoint()s: (graph, its size, parks then)
        self.resumed: dict = {}  # with checkpoints open: graph -> its size when this sample last resumed

    def next_key(self) -> int:
        if self.key_base < 0:  # on first use: most samples draw no random numbers
            self.key_base = (_mix(self.seed ^ _mix(self.index)) >> (64 - 63 + _STREAM_BITS)) << _STREAM_BITS
        self.count += 1
        return self.key_base + (self.count & ((1 << _STREAM_BITS) - 1))

    def checkpoint(self, cg) -> None:
        """cg_checkpoint() inside the sample: the graph's stack is shared by every sample."""
        self.checkpoints.append((cg, len(cg.op), self.parks))

    def revert_to(self, cg) -> int | None:
        """cg_revert() inside the sample: the size to truncate `cg` to, or None to keep its nodes.
        Only this sample records between its resume and its next park, so the nodes recorded
        since the checkpoint (no read since) or since its last resume (a read since: other
        samples' nodes interleave before) are all this sample's: truncate to there (the map's
        phase and ghost records of them go too). Its nodes recorded before that read stay in the
        graph, unused: evaluated at the read already, they cost memory until renew_cg(), no work."""
        if not self.checkpoints or self.checkpoints[-1][0] is not cg:
            raise DynagraphError(f"cg_revert() without a matching cg_checkpoint() in this sample of "
                                 f"dy.autobatch_map (a checkpoint taken outside the map or by another "
                                 f"sample is not this sample's to revert)\n  at {user_line()}")
        _, n, parks = self.checkpoints.pop()
        if parks != self.parks:
            n = max(n, self.resumed.get(cg, n))
        if not self.checkpoints:
            self.resumed.clear()
        if n >= len(cg.op):
            return None
        self.since = min(self.since, n)
        d = self.deferred.get(cg) if self.deferred is not None else None
        if d is not None:
            d.truncate(n)
        arms = self.arms.get(cg) if self.arms is not None else None
        if arms:
            arms[:] = [a for a in arms if not a.nodes or max(a.nodes) < n]
        return n

    def close_phase(self) -> None:
        """The nodes this sample recorded in its current phase (none of another sample's: only a
        park switches samples, and a park closes the segment) join the map's deferred nodes."""
        graph = self.graph
        if self.phase > 0 and graph is not None and self.deferred is not None:
            n = len(graph)
            if n > self.since:
                d = self.deferred.get(graph)
                if d is None:
                    d = self.deferred[graph] = _Deferred()
                d.add(self.since, n)
            self.since = n


class _Deferred:
    """The nodes of one graph that dy.phase defers, and the split of each chunk into nodes to
    evaluate and nodes left pending, kept from round to round: a round classifies only the nodes
    recorded since the last one, instead of every node left pending so far (engine's stateless
    _split_deferred, the reference, walks them all again each round: quadratic in the rounds).

    Left pending: the deferred nodes and every pending node that reads one, unless a node being
    waited for needs it. A node stays left pending once left (a user of a deferred node that a
    later read needed is not pulled into that read's chunk); the values are the same either way."""
    __slots__ = ("nodes", "cut", "left", "tainted", "seen", "executed", "count", "reverts", "new")

    def __init__(self):
        self.nodes: list = []   # deferred node ids, ascending (dy.phase adds each block's range)
        self.cut = 0            # nodes[cut:] were deferred since the last split
        self.left: list = []    # nodes left pending by the last split, ascending
        self.tainted: set = set()  # the same, as a set
        self.seen = 0           # nodes below were classified by an earlier split
        self.executed, self.count, self.reverts = None, 0, -1  # the graph after this map's last chunk
        self.new = None         # chunk()'s nodes recorded since the last split, for split()

    def evaluated(self, cg) -> None:
        """This map's chunk of `cg` ran: remember the graph's evaluation record, so that chunk()
        can tell whether anything else evaluated, invalidated or reverted nodes since."""
        self.executed, self.count, self.reverts = cg.executed, len(cg.executed), cg.reverts

    def chunk(self, cg, upto: int) -> list:
        """The pending nodes up to `upto` (engine's scan from cg.done): the nodes the last split
        left and the pending nodes recorded since, without walking again every node between them
        (cg.done stays at the first node left, so the scan covered the whole step each round).
        Any evaluation appends to cg.executed; set() and invalidate() replace it; cg_revert()
        counts in cg.reverts: if any happened since this map's last chunk, the full scan."""
        left = self.left
        if left and cg.executed is self.executed and len(cg.executed) == self.count \
                and cg.reverts == self.reverts and cg.done == left[0]:
            self.new = _pending(cg.blk, self.seen, upto + 1)
            return left + self.new
        self.new = None
        return _pending(cg.blk, cg.done, upto + 1)

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def truncate(self, n: int) -> None:
        """cg_revert() to size n: forget the node ids from n on, which later nodes will reuse."""
        cut = bisect_left(self.nodes, n)
        self.cut = min(self.cut, cut)
        del self.nodes[cut:]
        del self.left[bisect_left(self.left, n):]
        self.tainted = {t for t in self.tainted if t < n}
        self.seen = min(self.seen, n)
        self.executed = None  # the next chunk scans the graph again

    def add(self, lo: int, hi: int) -> None:
        self.nodes.extend(range(lo, hi))

    def ids(self) -> set:
        """Every deferred node id (the stateless reference and the bench's bound use it)."""
        return set(self.nodes)

    def split(self, cg, pending: list, targets) -> tuple[list, list]:
        """(nodes to evaluate, nodes left pending) of the chunk `pending` (ascending). Work in
        proportion to the nodes recorded since the last split (and the few nodes a read needs),
        not to every node left pending so far."""
        nodes, new, self.new = self.nodes, self.new, None
        fresh, self.cut = nodes[self.cut:], len(nodes)
        if new is not None and len(pending) == len(self.left) + len(new):
            left = self.left  # chunk()'s list: every node left is still pending, the rest is new
            if fresh:  # deferred since the last split, so recorded since: in `new` unless leaves
                self.tainted.update(compress(fresh, map(_ZERO.__gt__, map(cg.blk.__getitem__, fresh))))
        else:
            k = bisect_left(pending, self.seen)
            left = self.left
            if pending[:k] != left:  # something else evaluated nodes left pending: start over
                k, left, self.tainted = 0, [], set()
                fresh = nodes[bisect_left(nodes, pending[0]):] if pending else []
            new = pending[k:]
            if fresh and new:
                self.tainted.update(set(fresh).intersection(new))
        tainted, args = self.tainted, cg.args
        run = new
        if new:
            if tainted:
                run, new_left = _users_split(args, tainted, new)
                left.extend(new_left)  # in place: the list is this splitter's own
            self.seen = max(self.seen, new[-1] + 1)
        if not tainted.isdisjoint(targets):  # the deferred nodes a read needs, walked back
            needed = _needed_within(args, tainted, targets)
            tainted -= needed
            if len(needed) * 16 < len(left):  # a few: take them out where they are
                for n in needed:
                    i = bisect_left(left, n)
                    if i < len(left) and left[i] == n:
                        del left[i]
            else:
                left = list(filterfalse(needed.__contains__, left))
            run = list(run)
            run.extend(needed)
            run.sort()
        self.left = left
        return run, left


def _users_split_py(args: list, tainted: set, nodes: list) -> tuple[list, list]:
    """(run, left) of `nodes` (ascending): a node in `tainted` or reading one of it is left, and
    joins `tainted` (so its later readers are left too); kernels/cpython/phase_split.c's twin."""
    run, left = [], []
    for n in nodes:
        if n in tainted or not tainted.isdisjoint(args[n]):
            tainted.add(n)
            left.append(n)
        else:
            run.append(n)
    return run, left


_ZERO = 0  # _ZERO.__gt__(b): `0 > b`, the node has no value block yet
_users_split = getattr(NATIVE, "users_split", None) or _users_split_py
_pending = getattr(NATIVE, "pending", None) or (lambda blk, lo, hi: [i for i in range(lo, hi) if blk[i] < 0])
_needed_within = getattr(NATIVE, "needed_within", None) or needed_within


class phase:
    """ACROBAT's program phases: inside dy.autobatch_map, nodes recorded in `with dy.phase(k):`,
    k > 0, are left out of the evaluations that serve the samples' reads (unless a read needs
    them), so they batch later, e.g. every step's output layer of every sample as one batch at the
    final loss. Outside a concurrent map a phase changes nothing. Phases nest; the inner one wins.
    A class, not a generator context: it sits on the per-step recording path."""
    __slots__ = ("k", "sample", "outer")

    def __init__(self, k: int):
        self.k = k if k.__class__ is int else int(k)
        self.sample = None

    def __enter__(self) -> "phase":
        sample = _sample_now()
        if sample is None or sample.park is None:
            return self
        if self.sample is not None:  # one object shared by samples would restore the wrong phase
            raise DynagraphError("a dy.phase(k) object is entered by one sample at a time: "
                                 "write `with dy.phase(k):` where the nodes are recorded")
        self.sample = sample
        outer_phase = sample.phase
        if outer_phase:
            sample.close_phase()
        graph = current()
        self.outer = outer_phase, sample.graph
        sample.phase = self.k
        sample.graph = graph
        sample.since = len(graph.op)  # op: a list, len in C
        return self

    def __exit__(self, et, ev, tb) -> None:  # no *exc: one tuple less per step
        sample = self.sample
        if sample is None:
            return
        self.sample = None
        graph = sample.graph
        n = len(graph.op)
        if n > sample.since and sample.phase > 0:  # close_phase, inline
            deferred = sample.deferred
            if deferred is not None:
                d = deferred.get(graph)
                if d is None:
                    d = deferred[graph] = _Deferred()
                d.nodes.extend(range(sample.since, n))
        sample.phase, outer = self.outer
        sample.graph = outer
        if outer is not None:
            sample.since = n if outer is graph else len(outer.op)


def _seed() -> int:
    outer = SAMPLE.get()  # nested: derived from the outer sample's stream, so independent of timing
    return outer.next_key() if outer is not None else int(config.rng.integers(1, 1 << 62))


def _tag(e: BaseException, index: int) -> None:
    """Name the sample an exception came from, keeping its type."""
    e.add_note(f"raised by sample {index} of dy.autobatch_map")
    try:
        e.sample_index = index
    except AttributeError:  # built-in types without a __dict__: the note still names it
        pass


def autobatch_map(fn: Callable[[Any], Any], samples: Iterable | None = None, *, concurrent: bool = True,
                  seed: int | None = None):
    """fn(sample) for every sample, in order of the samples; with concurrent=True (default) the
    samples run interleaved, every value read parks its sample, and one evaluation of the current
    graph serves all parked samples. concurrent=False runs them one by one (the reference: same
    values, same random streams). Without samples: a decorator, `@dy.autobatch_map`.

    Samples share the current graph. Return losses and call backward() on their sum after the
    map (backward() inside a concurrent sample raises). An exception in a sample is re-raised
    unchanged in type, with a note and `sample_index` naming the sample; the others are stopped."""
    if samples is None:
        @functools.wraps(fn)
        def mapped(samples: Iterable, **kw):
            return autobatch_map(fn, samples, **kw)
        return mapped
    samples = list(samples)
    if seed is None:
        seed = _seed()
    with _fewer_collections:
        if not concurrent:
            return [_one(fn, x, _Sample(i, seed, None)) for i, x in enumerate(samples)]
        return _Map(fn, samples, seed).run()


class _FewerCollections:
    """While any map runs (in any thread, at any nesting), the cyclic garbage collector's
    first threshold is raised to GC_THRESHOLD allocations. A map records tens of thousands of
    graph entries that stay alive until renew_cg(); at the default 700 each one is traversed by
    a young collection and again by the older ones they trigger (a full one walks every live
    object, the parked samples' stacks too), which measured 10-20% of a batch-64 ACROBAT step
    at H=128 (bench/acrobat_bench.py). Reference counting frees as usual; cyclic garbage is
    collected at the raised threshold and after the map at the caller's own. A counter, not
    save-and-restore per map: maps in two threads, or nested in samples that interleave,
    leave in any order, and the last one out restores the caller's threshold."""

    def __init__(self):
        self.lock, self.depth, self.saved = threading.Lock(), 0, None

    def __enter__(self) -> None:
        with self.lock:
            self.depth += 1
            if self.depth == 1:
                self.saved = gc.get_threshold()
                if self.saved[0] and self.saved[0] < GC_THRESHOLD:  # 0: collection is off, keep it so
                    gc.set_threshold(GC_THRESHOLD, *self.saved[1:])

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                if gc.get_threshold()[0] == GC_THRESHOLD:  # unless the caller's code set its own meanwhile
                    gc.set_threshold(*self.saved)
                self.saved = None


GC_THRESHOLD = 100_000
_fewer_collections = _FewerCollections()


def _one(fn: Callable, x, sample: _Sample):
    ctx = copy_context()
    ctx.run(SAMPLE.set, sample)
    try:
        return ctx.run(fn, x)
    except BaseException as e:
        _tag(e, sample.index)
        raise


_NOTHING_DEFERRED = _Deferred()  # falsy: evaluate every pending node
_IDLE, _RAISED = object(), object()  # what a worker greenlet reports: ready for a sample, or it raised
_POOL_MAX = 4096                     # idle workers kept per thread


class _Pool(threading.local):
    """Idle worker greenlets of this thread. A fresh greenlet costs 15-17 us to create, start and
    end (greenlet 3.x, measured), a switch about 1 us: a worker runs sample after sample, map
    after map, so a step of 64 samples does not pay 1 ms for greenlets."""
    def __init__(self):
        self.idle: list = []


_pool = _Pool()


def _worker() -> None:
    """A worker greenlet: runs one sample (m, i, fn, x, ctx) per task, stores its result or
    exception in the map, and reports to its parent (the map's driver), holding nothing of the
    sample while idle. Ends when killed idle (GreenletExit at garbage collection)."""
    me = getcurrent()
    task = me.parent.switch(_IDLE)
    while True:
        m, i, fn, x, ctx = task
        task = None
        try:
            m.results[i] = ctx.run(fn, x)
            kind = _DONE
        except BaseException as e:  # GreenletExit too: a stopped sample's worker stays usable
            m.error = e
            kind = _RAISED
        m = fn = x = ctx = None
        task = me.parent.switch(kind)


def _workers(n: int, driver) -> list:
    """n idle workers reporting to `driver`, from this thread's pool, new ones started by the
    driver itself (a greenlet starts on the stack of whoever switches to it first)."""
    idle = _pool.idle
    take = idle[len(idle) - min(n, len(idle)):]
    del idle[len(idle) - len(take):]
    for w in take:
        w.parent = driver
    while len(take) < n:
        w = greenlet(_worker, parent=driver)
        w.switch()  # runs to its first report, _IDLE
        take.append(w)
    return take


def _release(w) -> None:
    if len(_pool.idle) < _POOL_MAX:
        _pool.idle.append(w)


class _Map:
    """One concurrent map: the calling greenlet (the driver) drives one worker greenlet per
    started, unfinished sample.

    A round runs every live sample in order until it parks or finishes. A parking sample
    switches straight to the next sample of the round (resuming it, or handing its worker the
    sample to start), not back to the driver: one greenlet switch per park instead of two. The
    driver takes over after the round's last sample and when a sample finishes or raises (its
    worker reports to its parent, the driver), and then gives the worker back to the pool."""

    def __init__(self, fn: Callable, samples: Sequence, seed: int):
        if greenlet is None:  # a dependency (setup.py); say what is missing rather than fail obscurely
            raise DynagraphError("dy.autobatch_map(concurrent=True) needs the greenlet package "
                                 "(pip install greenlet); concurrent=False runs without it")
        self.driver = getcurrent()
        n = len(samples)
        self.results: list = [None] * n
        self.error: BaseException | None = None
        self.deferred: dict = {}  # graph -> _Deferred: nodes recorded in a phase > 0 (dy.phase)
        self.arms: dict = {}      # graph -> dy.ghost arms whose outputs are not evaluated yet
        self.round: list = []     # the live samples of the round being run, in order
        self.pos = 0              # round[pos] is the sample running now
        self.parked: list = []    # samples of this round that parked
        self.targets: dict = {}   # graph -> the node ids being waited for, first-parked graph first
        self.lets: list = _workers(n, self.driver)  # sample i's worker; None once it finished
        self.tasks: list = []     # sample i's task until its worker starts it, then None
        park = self._park
        for i, x in enumerate(samples):
            ctx = copy_context()  # the caller's graph stack and default graph, plus this sample
            ctx.run(SAMPLE.set, _Sample(i, seed, park, self.deferred, self.arms))
            self.tasks.append((self, i, fn, x, ctx))

    def _switch_to(self, i: int):
        """Start or resume sample i on its worker."""
        task = self.tasks[i]
        if task is None:
            return self.lets[i].switch()
        self.tasks[i] = None
        return self.lets[i].switch(task)

    def _park(self, cg, nid: int) -> None:
        """Called by graph.forward_to inside a sample: hand over to the next sample of the round
        (the driver after the last) and come back once the chunk serving this read ran."""
        sample = _sample_now()
        if sample.phase:
            sample.close_phase()
        ghosts = sample.ghosts
        if ghosts:
            for g in ghosts:
                g.pause()
        self.parked.append(sample.index)
        sample.parks += 1
        waiting = self.targets.get(cg)
        if waiting is None:
            self.targets[cg] = [nid]  # a dict keeps the order graphs were first waited on in
        else:
            waiting.append(nid)
        pos = self.pos = self.pos + 1
        if pos < len(self.round):  # _switch_to, inline: on the path of every read
            i = self.round[pos]
            task = self.tasks[i]
            if task is None:
                self.lets[i].switch()
            else:
                self.tasks[i] = None
                self.lets[i].switch(task)
        else:  # end of the round
            self.driver.switch(_PARK)
        if sample.graph is not None:
            sample.since = len(sample.graph.op)
        if ghosts:
            for g in ghosts:
                g.resume()
        if sample.checkpoints:  # where a cg_revert() may truncate to: only this sample records now
            for c in sample.checkpoints:
                sample.resumed[c[0]] = len(c[0].op)

    def _run_round(self, live: list) -> None:
        """Run every sample of `live` until it parks or finishes."""
        self.round, self.pos, self.parked, self.targets = live, 0, [], {}
        while self.pos < len(live):
            try:
                msg = self._switch_to(live[self.pos])
            except BaseException as e:  # from the switch itself (a KeyboardInterrupt)
                _tag(e, live[self.pos])
                raise
            if msg is _PARK:  # the samples before round[pos] parked
                continue
            i = live[self.pos]  # the sample running last finished or raised: its worker is idle
            _release(self.lets[i])
            self.lets[i] = None
            if msg is _RAISED:
                e, self.error = self.error, None
                _tag(e, i)
                raise e
            self.pos += 1

    def _evaluate(self) -> None:
        """One chunk per graph that samples wait on serves all of this round's reads."""
        for g, targets in self.targets.items():
            arms = self.arms.get(g)
            by_depth = groups_by_depth(g.scheduler)
            if arms or by_depth:  # a depth-grouping scheduler sees depths inline in the round
                align_depths(g, arms or (), by_depth)
            deferred = self.deferred.get(g)
            try:  # always through the `defer` path, even with nothing deferred: it skips the schedule cache
                g.evaluate_pending_except(deferred or _NOTHING_DEFERRED, targets)
                if deferred:
                    deferred.evaluated(g)
            except BaseException as e:
                parked = self.parked
                e.add_note(f"raised while evaluating samples {parked[:8]}{'...' if len(parked) > 8 else ''}"
                           f" of dy.autobatch_map together")
                raise
            if arms:  # an arm whose outputs were deferred (dy.phase) is padded again next round
                blk = g.blk
                arms[:] = [a for a in arms if any(blk[n] < 0 for n in a.outputs)]

    def run(self) -> list:
        live = list(range(len(self.lets)))
        try:
            while live:
                self._run_round(live)
                self._evaluate()
                live = self.parked
        finally:  # after an error: the parked samples are stopped (GreenletExit), their finally blocks run
            for i, let in enumerate(self.lets):
                if let is None:
                    continue
                if self.tasks[i] is not None:  # never started: its worker is idle
                    _release(let)
                elif let.throw() is not _PARK:  # a sample that reads on after GreenletExit keeps its worker
                    _release(let)
            self.lets = self.error = None
        return self.results
