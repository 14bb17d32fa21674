"""The baseline schedulers: none (node by node), depth (TF Fold) and agenda (DyNet)."""
from __future__ import annotations

import heapq
from typing import Sequence

from .base import register, users_of


class NoBatching:
    """One node per batch, in recording order: the reference schedule."""
    name = "none"
    trusted = True  # validated by the test suite, not on every evaluation

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        return [[n] for n in nodes]


class DepthBatching:
    """Group by (depth, signature). Depth was computed while recording, so this is one pass."""
    name = "depth"
    trusted = True  # validated by the test suite, not on every evaluation

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
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
    """DyNet's agenda: run the ready signature with the lowest mean depth; cheap ops first on ties."""
    name = "agenda"
    trusted = True  # validated by the test suite, not on every evaluation

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        indeg, users, base = users_of(cg, nodes)
        depth, sig, op = cg.depth, cg.sig, cg.op
        total: dict = {}
        for n in nodes:
            s = sig[n]
            t = total.get(s)
            total[s] = (depth[n], 1) if t is None else (t[0] + depth[n], t[1] + 1)
        ready: dict = {}
        heap: list = []
        batches: list[list[int]] = []
        stack = [n for n in nodes if indeg[n - base] == 0]
        while True:
            while stack:  # make newly ready nodes visible; unbatchable ones run at once
                n = stack.pop()
                if not op[n].batchable:
                    batches.append([n])
                    self._release(n, users, indeg, base, stack)
                    continue
                s = sig[n]
                bucket = ready.get(s)
                if bucket is None:
                    ready[s] = [n]
                    t = total[s]
                    heapq.heappush(heap, (t[0] / t[1], op[n].cost, n, s))
                else:
                    bucket.append(n)
            if not heap:
                return batches
            s = heapq.heappop(heap)[3]
            batch = ready.pop(s)
            batch.sort()  # recording order keeps consecutive rows contiguous for later users
            batches.append(batch)
            for n in batch:
                self._release(n, users, indeg, base, stack)

    @staticmethod
    def _release(n, users, indeg, base, stack):
        us = users[n - base]
        if us:
            for u in us:
                k = indeg[u - base] - 1
                indeg[u - base] = k
                if k == 0:
                    stack.append(u)


register("none", NoBatching)
register("depth", DepthBatching)
register("agenda", AgendaBatching)
