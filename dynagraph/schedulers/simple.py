"""The baseline schedulers: none (node by node), depth (TF Fold) and agenda (DyNet)."""
from __future__ import annotations

import heapq
from typing import Sequence

from .base import register, users_of


class NoBatching:
    """One node per batch, in recording order: the reference schedule."""
    name = "none"

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        return [[n] for n in nodes]


class DepthBatching:
    """Group by (depth, signature). Depth was computed while recording, so this is one pass."""
    name = "depth"

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

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        indeg, users = users_of(cg, nodes)
        depth, sig, op = cg.depth, cg.sig, cg.op
        total: dict = {}
        count: dict = {}
        for n in nodes:
            s = sig[n]
            total[s] = total.get(s, 0) + depth[n]
            count[s] = count.get(s, 0) + 1
        ready: dict = {}
        heap: list = []
        order: dict = {}
        batches: list[list[int]] = []

        def push(n):
            if not op[n].batchable:
                batches.append([n])
                release(n)
                return
            s = sig[n]
            bucket = ready.get(s)
            if not bucket:
                ready[s] = [n]
                if s not in order:
                    order[s] = len(order)
                heapq.heappush(heap, (total[s] / count[s], op[n].cost, order[s], s))
            else:
                bucket.append(n)

        def release(n):
            for u in users[n]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    push(u)

        for n in nodes:
            if indeg[n] == 0:
                push(n)
        while heap:
            _, _, _, s = heapq.heappop(heap)
            batch = ready.pop(s)
            batches.append(batch)
            for n in batch:
                release(n)
        return batches


register("none", NoBatching)
register("depth", DepthBatching)
register("agenda", AgendaBatching)
