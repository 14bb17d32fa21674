"""The baseline schedulers: none (node by node), depth (TF Fold) and agenda (DyNet)."""
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

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        """In C when dynagraph._bookkeeping is built; schedule_py is its twin."""
        if NATIVE is not None and nodes:
            out = NATIVE.agenda_batches(cg.args, cg.sig, cg.depth, _per_signature(cg, "batchable"),
                                        _per_signature(cg, "cost"), nodes)
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
            s = heapq.heappop(heap)[3]
            parts = buckets[s]
            buckets[s] = []
            # recording order keeps later users contiguous
            batch = parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))
            ids = (batch + g.lo).tolist()
            batches.extend([[i] for i in ids] if not ops[s].batchable else [ids])
            push(g.release(batch, indeg))
        return batches


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

    def release(self, batch: np.ndarray, indeg: np.ndarray):
        """Decrement the in-degree of the batch's users; return those that became ready
        (a user of several batch nodes may appear more than once), or None."""
        begin, counts = self.starts[batch], self.degree[batch]
        total = int(counts.sum())
        if total == 0:
            return None
        if total == len(batch) and counts.max() == 1:  # one user each: no ranges to expand
            offsets = begin
        else:
            ends = np.cumsum(counts)
            offsets = np.repeat(begin - ends + counts, counts) + np.arange(total)
        users = self.users[offsets]
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
