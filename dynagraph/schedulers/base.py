"""The scheduler protocol and registry.

A scheduler receives the pending (non-leaf, unevaluated) node ids of a graph in
increasing order and returns an ordered list of batches: lists of node ids that
share a signature and whose arguments are evaluated earlier. It never touches
arrays; the executor never decides what to batch.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

_REGISTRY: dict[str, Callable[[], "Scheduler"]] = {}


class Scheduler(Protocol):
    name: str

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        ...


def register(name: str, factory: Callable[[], Scheduler]) -> None:
    """Make a scheduler available by name: `dy.renew_cg(scheduler=name)`."""
    _REGISTRY[name] = factory


def available() -> list[str]:
    return sorted(_REGISTRY)


def get(spec) -> Scheduler:
    """A scheduler from a name or an object with a `schedule` method."""
    if hasattr(spec, "schedule"):
        return spec
    try:
        return _REGISTRY[spec]()
    except KeyError:
        raise ValueError(f"unknown scheduler {spec!r}; available: {', '.join(available())}") from None


def users_of(cg, nodes: Sequence[int]) -> tuple[list, list, int]:
    """Pending in-degree and user lists, indexed by node id minus `base` (lists beat dicts here)."""
    base = nodes[0] if nodes else 0
    span = (nodes[-1] - base + 1) if nodes else 0
    indeg = [0] * span
    users: list = [None] * span
    args, blk = cg.args, cg.blk
    for n in nodes:
        k = 0
        for a in args[n]:
            if a >= base and blk[a] < 0:  # pending argument
                k += 1
                u = users[a - base]
                if u is None:
                    users[a - base] = [n]
                else:
                    u.append(n)
        indeg[n - base] = k
    return indeg, users, base


def lower_bound(cg, nodes: Sequence[int]) -> int:
    """Unbatchable nodes + sum over signatures of the longest chain of that signature.

    A chain of signature s counts s-nodes along one path; no schedule can put two
    of them in one batch, so every valid schedule needs at least that many.
    """
    chains: dict[int, dict] = {}
    best: dict = {}
    unbatchable = 0
    op, args, sig = cg.op, cg.args, cg.sig
    for n in nodes:
        if not op[n].batchable:
            unbatchable += 1
        acc: dict = {}
        for a in args[n]:
            ca = chains.get(a)
            if ca:
                for s, c in ca.items():
                    if c > acc.get(s, 0):
                        acc[s] = c
        if op[n].batchable:
            s = sig[n]
            acc[s] = acc.get(s, 0) + 1
            if acc[s] > best.get(s, 0):
                best[s] = acc[s]
        chains[n] = acc
    return unbatchable + sum(best.values())
