"""A policy-independent post-pass that merges batches: each batch, last first, joins the latest
later batch of its signature that still runs before its first user.

Why it is safe. Moving a batch later never runs a node before its arguments; it stays valid
as long as every user of its nodes runs after the batch it joins. Going from the last batch to
the first, every batch after the one at hand already has its final place, so "before its
first user" is known exactly. Each join removes one batch, so the result never has more.

Why it pays. A scheduler that runs a type as soon as nodes of it are ready (agenda, and the FSM
when its chain is ready) runs a sink-side type (a loss layer, a pick) once per wave of a sample
finishing, though nothing needs it until much later: on 32 NER lattices agenda's 3072 batches
become 1595 (lower bound 1453), the FSM's 1594 become 1571.

`merge_batches` is the compiled pass (dynagraph._bookkeeping.merge_batches) when it is built,
and `merge_batches_py` its twin: same batches, tested equal. `Merged(inner)` is any scheduler
followed by the pass; `get("agenda+merge")` names one.
"""
from __future__ import annotations

import bisect
from typing import Sequence

from ..recording import NATIVE
from .base import batchable_by_sig, register_post_pass


def merge_batches_py(cg, batches: Sequence[Sequence[int]], batchable: Sequence[bool]) -> list:
    """The pass in Python (module docstring). batchable[s]: whether signature s may batch
    (base.batchable_by_sig). Unchanged batches are returned as they came; merged ones sorted."""
    B = len(batches)
    if B < 2:
        return list(batches)
    args, sig = cg.args, cg.sig
    pos: dict = {}
    for k, b in enumerate(batches):
        if not b:
            raise ValueError(f"merge_batches: batch {k} is empty")
        for n in b:
            if n in pos:
                raise ValueError(f"merge_batches: node {n} is scheduled twice")
            pos[n] = k
    first_user: dict = {}       # node -> the earliest final batch of its users
    alive: dict = {}            # signature -> negated indices of the batches kept so far (ascending)
    into: list = [None] * B     # batch -> the batches that joined it
    for k in range(B - 1, -1, -1):
        b = batches[k]
        s = sig[b[0]]
        target = k
        if batchable[s]:
            last = min([first_user.get(n, B) for n in b]) - 1  # the latest batch b may join
            neg = alive.setdefault(s, [])
            i = bisect.bisect_left(neg, -last)
            if i < len(neg):    # every kept batch of s comes after k
                target = -neg[i]
                if into[target] is None:
                    into[target] = [k]
                else:
                    into[target].append(k)
            else:
                neg.append(-k)
        for n in b:
            for a in args[n]:
                if a in pos and first_user.get(a, B) > target:
                    first_user[a] = target
    joined = {k for js in into if js for k in js}
    out = []
    for k, b in enumerate(batches):
        if k in joined:
            continue
        js = into[k]
        if js:
            nodes = list(b)
            for j in js:
                nodes.extend(batches[j])
            nodes.sort()
            out.append(nodes)
        else:
            out.append(b)
    return out


def merge_batches(cg, batches: Sequence[Sequence[int]], batchable: Sequence[bool] | None = None) -> list:
    """The pass, compiled when dynagraph._bookkeeping is built (same batches as merge_batches_py)."""
    if batchable is None:
        batchable = batchable_by_sig(cg)
    if NATIVE is not None and hasattr(NATIVE, "merge_batches"):
        if type(batches) is not list or any(type(b) is not list for b in batches):  # a user scheduler's tuples
            batches = [list(b) for b in batches]
        return NATIVE.merge_batches(batches, cg.args, cg.sig, batchable)
    return merge_batches_py(cg, batches, batchable)


class Merged:
    """Any scheduler followed by merge_batches: `schedulers.get("agenda+merge")`."""

    def __init__(self, inner):
        self.inner = inner
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}+merge"
        self.trusted = getattr(inner, "trusted", False)  # the pass keeps a valid schedule valid

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        return merge_batches(cg, self.inner.schedule(cg, nodes))


register_post_pass("+merge", Merged)  # "NAME+merge": NAME, then this pass
