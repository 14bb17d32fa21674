"""The baseline schedulers: none (node by node), depth (TF Fold), agenda (DyNet) and lookahead
(DyNet's agenda, waiting for near nodes; the default)."""
from __future__ import annotations

import heapq
from itertools import chain
from typing import Sequence

import numpy as np

from ..recording import NATIVE
from .base import register


def _per_signature(cg, field: str) -> list:
    """An op field per signature id (the op is a signature key's first part): the compiled
    schedulers' tables."""
    return [getattr(key[0], field) for key in cg.signatures]


class NoBatching:
    """One node per batch, in recording order: the reference schedule."""
    name = "none"
    trusted = True  # validated by the test suite, not on every evaluation

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        return [[n] for n in nodes]


class DepthBatching:
    """Group by (depth, signature). Depth was computed while recording, so this is one pass
    (in C when dynagraph._bookkeeping is built; schedule_py is its twin)."""
    name = "depth"
    trusted = True  # validated by the test suite, not on every evaluation
    groups_by_depth = True  # dy.autobatch_map restarts pending depths at each round for it

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        if NATIVE is not None:
            out = NATIVE.depth_batches(cg.depth, cg.sig, _per_signature(cg, "batchable"), nodes)
            if out is not None:
                return out
        return self.schedule_py(cg, nodes)

    def schedule_py(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        groups: dict = {}
        out: list[tuple] = []
        depth, sig, op = cg.depth, cg.sig, cg.op
        for n in nodes:
            if not op[n].batchable:
                out.append((depth[n], n, [n]))
                continue
            key = (depth[n], sig[n])
            g = groups.get(key)
            if g is None:
                g = groups[key] = []
                out.append((depth[n], n, g))
            g.append(n)
        out.sort(key=lambda t: (t[0], t[1]))
        return [g for _, _, g in out]


class AgendaBatching:
    """DyNet's agenda: run the ready signature with the lowest mean depth; cheap ops first on ties.

    The frontier bookkeeping is vectorised (CSR user lists, per-batch numpy
    updates), so the Python cost is per batch, not per node; the loop keeps the
    numpy calls per batch few because a graph has hundreds of batches.
    """
    name = "agenda"
    trusted = True  # validated by the test suite, not on every evaluation
    lookahead = False  # LookaheadBatching's rule (a subclass)

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        """In C when dynagraph._bookkeeping is built; schedule_py is its twin."""
        if NATIVE is not None and nodes:
            out = NATIVE.agenda_batches(cg.args, cg.sig, cg.depth, _per_signature(cg, "batchable"),
                                        _per_signature(cg, "cost"), nodes, self.lookahead, cg)
            if out is not None:
                return out
        return self.schedule_py(cg, nodes)

    def schedule_py(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        if not nodes:
            return []
        g = pending_graph(cg, nodes)
        n = g.n
        uniq, inv = np.unique(g.sig[g.loc], return_inverse=True)
        sig_of = np.full(n, -1, dtype=np.int64)
        sig_of[g.loc] = inv
        avg = (np.bincount(inv, weights=g.depth[g.loc]) / np.bincount(inv)).tolist()
        first = np.zeros(len(uniq), dtype=np.int64)
        first[inv[::-1]] = g.loc[::-1]  # a representative node per signature
        ops = [cg.op[g.lo + f] for f in first.tolist()]
        cost = [op.cost for op in ops]
        # One sort key per node, signature-major: sorting a ready set groups it by
        # signature with each group in recording order.
        key_of = sig_of * n + np.arange(n, dtype=np.int64)
        buckets: list = [[] for _ in ops]
        heap: list = []
        indeg = g.indeg.copy()
        batches: list[list[int]] = []
        near = _NearNodes(g, sig_of, indeg, len(ops)) if self.lookahead else None

        def push(ready):
            if ready is None or len(ready) == 0:
                return
            keys = key_of[ready]
            if len(keys) > 1:
                keys.sort()
                keep = keys[1:] != keys[:-1]  # a user of two batch nodes is released once
                if not keep.all():
                    keys = keys[np.concatenate(([True], keep))]
            sigs = keys // n
            local = keys - sigs * n
            if near is not None:
                near.ready(local)
            s0, s1 = int(sigs[0]), int(sigs[-1])
            if s0 == s1:
                parts = ((s0, local),)
            else:
                bounds = [0] + (np.flatnonzero(sigs[1:] != sigs[:-1]) + 1).tolist() + [len(keys)]
                parts = zip(sigs[bounds[:-1]].tolist(), (local[a:b] for a, b in zip(bounds, bounds[1:])))
            for s, part in parts:
                if not buckets[s]:
                    heapq.heappush(heap, (avg[s], cost[s], int(part[0]), s))
                buckets[s].append(part)

        push(g.loc[indeg[g.loc] == 0])
        while heap:
            s = heapq.heappop(heap)[3] if near is None else near.next(heap)
            parts = buckets[s]
            buckets[s] = []
            # recording order keeps later users contiguous
            batch = parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))
            ids = (batch + g.lo).tolist()
            batches.extend([[i] for i in ids] if not ops[s].batchable else [ids])
            if near is None:
                push(g.release(batch, indeg))
            else:
                push(near.release(batch, s))
        return batches


class _NearNodes:
    """LookaheadBatching's bookkeeping for schedule_py (twin of the lookahead in
    kernels/cpython/agenda.c): per pending node, how many of the arguments it waits for are
    ready and of another signature (`other`); it is near when that is all of them, and
    `count[s]` counts signature s's near nodes."""

    def __init__(self, g, sig_of: np.ndarray, indeg: np.ndarray, S: int):
        self.g, self.sig_of, self.indeg = g, sig_of, indeg
        self.other = np.zeros(g.n, dtype=np.int64)
        self.near = np.zeros(g.n, dtype=bool)
        self.count = np.zeros(S, dtype=np.int64)

    def _update(self, touched: np.ndarray) -> None:
        now = (self.indeg[touched] > 0) & (self.other[touched] == self.indeg[touched])
        changed = np.unique(touched[now != self.near[touched]])
        if len(changed):
            flip = ~self.near[changed]
            np.add.at(self.count, self.sig_of[changed], np.where(flip, 1, -1))
            self.near[changed] = flip

    def ready(self, nodes: np.ndarray) -> None:
        got = self.g.users_of(nodes)
        if got is None:
            return
        counts, users = got
        users = users[self.sig_of[users] != np.repeat(self.sig_of[nodes], counts)]
        if len(users):
            np.add.at(self.other, users, 1)
            self._update(users)

    def release(self, batch: np.ndarray, s: int):
        """g.release with the counts kept: the batch (signature s) has run."""
        got = self.g.users_of(batch)
        if got is None:
            return None
        users = got[1]
        np.subtract.at(self.indeg, users, 1)
        np.subtract.at(self.other, users[self.sig_of[users] != s], 1)
        self._update(users)
        return users[self.indeg[users] == 0]

    def next(self, heap: list) -> int:
        """The signature to run (agenda_next in agenda.c): the heap's first unless it has
        near nodes and a later one has none; those held back go back on the heap."""
        held = [heapq.heappop(heap)]
        if self.count[held[0][3]] == 0:
            return held[0][3]
        pick = None
        while heap:
            e = heapq.heappop(heap)
            if self.count[e[3]] == 0:
                pick = e[3]
                break
            held.append(e)
        if pick is None:
            pick = held.pop(0)[3]
        for e in held:
            heapq.heappush(heap, e)
        return pick


class LookaheadBatching(AgendaBatching):
    """DyNet's agenda, except that a signature with *near* nodes waits: nodes that still wait
    for arguments, every one of which is ready and of another signature. Running those
    signatures first makes the near nodes ready, and they join the waiting signature's batch.

    Why. The agenda ranks signatures by their mean depth over the whole graph. A BiLSTM whose
    cell reads pick_range slices of one affine per direction ranks the slices (mean depth 104.8,
    pulled down by every sequence's first step) before the backward direction's affine (108.1):
    each time step then runs the forward direction's slices and gates alone, the backward
    affine, then the backward's slices: twice the elementwise batches, each half as wide.
    A signature waits only while another ready signature has no near nodes of its own; when
    every ready one waits, the agenda's first runs, so the schedule always makes progress."""
    name = "lookahead"
    lookahead = True


class PendingGraph:
    """The pending nodes of a graph as arrays local to [lo, hi), with CSR user lists."""

    def __init__(self, cg, nodes: Sequence[int]):
        self.lo = lo = nodes[0]
        self.n = n = nodes[-1] + 1 - lo
        self.loc = np.asarray(nodes, dtype=np.int64) - lo
        pend = np.zeros(n + 1, dtype=bool)  # slot n stands for "not pending"
        pend[self.loc] = True
        counts, args, self.sig, self.depth = (_node_arrays if NATIVE is None else _node_arrays_c)(cg, lo, n)
        owner = np.repeat(np.arange(n, dtype=np.int64), counts)
        keep = pend[args] & pend[owner]
        src, dst = args[keep], owner[keep]
        self.indeg = np.bincount(dst, minlength=n)
        self.users = dst[np.argsort(src, kind="stable")]
        self.degree = np.bincount(src, minlength=n)  # users per node
        self.starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.degree, out=self.starts[1:])

    def users_of(self, nodes: np.ndarray) -> tuple | None:
        """(users per node, every user of `nodes` in node order), a user of several of them
        once per edge; None when they have none."""
        begin, counts = self.starts[nodes], self.degree[nodes]
        total = int(counts.sum())
        if total == 0:
            return None
        if total == len(nodes) and counts.max() == 1:  # one user each: no ranges to expand
            offsets = begin
        else:
            ends = np.cumsum(counts)
            offsets = np.repeat(begin - ends + counts, counts) + np.arange(total)
        return counts, self.users[offsets]

    def release(self, batch: np.ndarray, indeg: np.ndarray):
        """Decrement the in-degree of the batch's users; return those that became ready
        (a user of several batch nodes may appear more than once), or None."""
        got = self.users_of(batch)
        if got is None:
            return None
        users = got[1]
        np.subtract.at(indeg, users, 1)
        return users[indeg[users] == 0]


def _node_arrays(cg, lo: int, n: int) -> tuple:
    """Nodes [lo, lo+n): argument counts, flat arguments relative to lo (n for any argument
    outside the range: the "not pending" slot), signatures and depths."""
    arg_lists = cg.args[lo:lo + n]
    counts = np.fromiter(map(len, arg_lists), dtype=np.int64, count=n)
    args = np.fromiter(chain.from_iterable(arg_lists), dtype=np.int64, count=int(counts.sum())) - lo
    args[(args < 0) | (args >= n)] = n
    return (counts, args, np.fromiter(cg.sig[lo:lo + n], dtype=np.int64, count=n),
            np.fromiter(cg.depth[lo:lo + n], dtype=np.float64, count=n))


def _node_arrays_c(cg, lo: int, n: int) -> tuple:
    """_node_arrays in C (dynagraph._bookkeeping): numpy views of its buffers."""
    c, a, s, d = NATIVE.node_arrays(cg.args, cg.sig, cg.depth, lo, n)
    return (np.frombuffer(c, np.int64), np.frombuffer(a, np.int64), np.frombuffer(s, np.int64),
            np.frombuffer(d, np.float64))


def pending_graph(cg, nodes: Sequence[int]) -> PendingGraph:
    return PendingGraph(cg, nodes)


register("none", NoBatching)
register("depth", DepthBatching)
register("agenda", AgendaBatching)
register("lookahead", LookaheadBatching)
