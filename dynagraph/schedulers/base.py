"""The scheduler protocol and registry.

A scheduler receives the pending (non-leaf, unevaluated) node ids of a graph in
increasing order and returns an ordered list of batches: lists of node ids that
share a signature and whose arguments are evaluated earlier. It never touches
arrays; the executor never decides what to batch.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from ..errors import DynagraphError

_REGISTRY: dict[str, Callable[[], "Scheduler"]] = {}
_POST_PASSES: dict[str, Callable[["Scheduler"], "Scheduler"]] = {}  # "NAME" + suffix -> wrap(NAME's scheduler)


class Scheduler(Protocol):
    name: str

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        ...


def register(name: str, factory: Callable[[], Scheduler]) -> None:
    """Make a scheduler available by name: `dy.renew_cg(scheduler=name)`."""
    _REGISTRY[name] = factory


def register_post_pass(suffix: str, wrap: Callable[[Scheduler], Scheduler]) -> None:
    """Make "NAME<suffix>" mean NAME's schedule followed by a post-pass: wrap(NAME's scheduler)
    (schedulers/merge.py registers "+merge")."""
    _POST_PASSES[suffix] = wrap


def available() -> list[str]:
    return sorted(_REGISTRY)


def batchable_by_sig(cg) -> list:
    """op.batchable per signature id (the op is a signature's first part): the compiled paths' table."""
    return [key[0].batchable for key in cg.signatures]


def get(spec) -> Scheduler:
    """A scheduler from a name or an object with a `schedule` method; "NAME+merge" is NAME followed
    by the batch-merging post-pass (schedulers/merge.py)."""
    if hasattr(spec, "schedule"):
        return spec
    if isinstance(spec, str):
        for suffix, wrap in _POST_PASSES.items():  # any scheduler, then a post-pass
            if spec.endswith(suffix):
                return wrap(get(spec[:-len(suffix)]))
    name, sep, arg = spec.partition(":")  # "fsm:policy.json" passes an argument to the factory
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown scheduler {spec!r}; available: {', '.join(available())}")
    return factory(arg) if sep else factory()


def validate(cg, nodes: Sequence[int], batches: list[list[int]], name: str) -> None:
    """Check a schedule: each pending node once, one signature per batch, arguments first."""
    pending = set(nodes)
    seen: set = set()
    for k, batch in enumerate(batches):
        if not batch:
            raise DynagraphError(f"scheduler {name}: batch {k} is empty")
        sigs = {cg.sig[n] for n in batch}
        if len(sigs) != 1 or (len(batch) > 1 and not cg.op[batch[0]].batchable):
            raise DynagraphError(f"scheduler {name}: batch {k} mixes signatures or batches an unbatchable op "
                                 f"({sorted({cg.op[n].name for n in batch})})")
        for n in batch:
            if n not in pending or n in seen:
                raise DynagraphError(f"scheduler {name}: node {n} is not pending or is scheduled twice")
            late = [a for a in cg.args[n] if a in pending and a not in seen]
            if late:
                raise DynagraphError(f"scheduler {name}: node {n} ({cg.op[n].name}) runs before its argument {late[0]}")
        seen.update(batch)
    if len(seen) != len(pending):
        raise DynagraphError(f"scheduler {name}: {len(pending) - len(seen)} pending nodes were not scheduled")


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
