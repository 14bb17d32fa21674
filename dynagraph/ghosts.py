"""Ghost operators (ACROBAT): both arms of a data-dependent branch keep the schedule aligned.

    with dy.ghost():                  # one branch site: the arms are padded to one length
        if shift:
            h = tanh(Wx * E[w] + Wh * top + b)     # 4 ops deep over `top`
        else:
            h = tanh(Wl * left + Wr * top + b)     # 3 ops deep over `top`
    scores = A * h                    # at one depth in every sample, whichever arm it took

Depth is how a depth-grouping scheduler (DyNet's autobatch=2, TF Fold) batches, and how the
agenda ranks signatures. A sample that took the shorter arm sees every later op at a
smaller depth than a sample that took the longer one, so their later ops never share a
batch again. ACROBAT pads the shorter arm with ghost operators: placeholder ops that do
nothing but take up depth. Here a ghost records no node at all: the arm's outputs (its
nodes that no other node of the arm reads) get `depth += longest arm - this arm`, where
the longest arm is learned per site (the `with` line, or `site=`) over every sample and
call so far. Values and gradients cannot change: only depths move, and only upwards,
keeping every node deeper than its arguments.

Only schedulers that group by depth (they declare `groups_by_depth`: `depth`) need ghosts;
under `agenda`, `typewise` and `fsm`, which batch by signature, a ghost block does nothing.
Inside dy.autobatch_map the samples of one round may take the longer arm after the
shorter one was padded, so the map pads again before each evaluation with the longest arm
of the round (align_depths), and lifts the later nodes that read a padded output.
"""
from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Any

from . import schedulers
from .errors import DynagraphError
from .graph import SAMPLE, current

__all__ = ["align_depths", "ghost", "groups_by_depth"]

_sites: dict = {}  # site key -> longest arm seen, in depth levels
_by_depth: dict = {}  # scheduler spec -> whether it groups by depth


def groups_by_depth(spec) -> bool:
    """Whether the scheduler `spec` (a name or an object) batches by depth, so that ghosts and
    per-round depths matter to it (a capability it declares: `groups_by_depth = True`)."""
    known = _by_depth.get(spec)
    if known is None:
        known = _by_depth[spec] = bool(getattr(schedulers.get(spec), "groups_by_depth", False))
    return known


class _Arm:
    """What one execution of one arm recorded: its nodes, its outputs, its length."""
    __slots__ = ("site", "length", "nodes", "outputs")

    def __init__(self, site: Hashable, length: int, nodes: list, outputs: list):
        self.site, self.length, self.nodes, self.outputs = site, length, nodes, outputs

    def extra(self) -> int:
        """The ghost operators this arm needs now: the site's longest arm minus this one."""
        return _sites[self.site] - self.length


class ghost:
    """`with dy.ghost():` around a data-dependent branch (both arms inside the block): the
    arm each sample takes is padded with no-cost ghost operators to the longest arm seen at
    this site, so the ops after the branch stay at one depth across samples. `site` names
    the branch when one `with` line serves several (default: the file and line of the `with`)."""
    __slots__ = ("site", "graph", "since", "segments", "sample")

    def __init__(self, site: Hashable | None = None):
        self.site = site  # None: the `with` line, found on entering under a depth scheduler
        self.graph = None  # set (with since, segments, sample) on entering under a depth scheduler

    def __enter__(self) -> "ghost":
        cg = current()
        by_depth = _by_depth.get(cg.scheduler)  # groups_by_depth, inline: on every branch taken
        if not (by_depth if by_depth is not None else groups_by_depth(cg.scheduler)):
            return self  # a signature scheduler (agenda, typewise, fsm) needs no ghosts
        if self.graph is not None:  # shared by samples, one arm's nodes would mix with another's
            raise DynagraphError("a dy.ghost() object is entered once at a time: "
                                 "write `with dy.ghost():` around the branch")
        if self.site is None:  # only here: frame inspection costs ~1 us per branch taken
            f = sys._getframe(1)  # the frame running the `with` statement
            self.site = (f.f_code.co_filename, f.f_lineno)
        self.graph = cg
        self.since, self.segments, self.sample = len(cg), [], None
        sample = SAMPLE.get()
        if sample is not None and sample.park is not None:  # its recording pauses at every park
            self.sample = sample
            sample.ghosts.append(self)
        return self

    def pause(self) -> None:
        """A park: other samples record next, so close this arm's segment."""
        if len(self.graph) > self.since:
            self.segments.append((self.since, len(self.graph)))

    def resume(self) -> None:
        self.since = len(self.graph)

    def __exit__(self, et, ev, tb) -> None:  # no *exc: one tuple less per branch
        cg = self.graph
        if cg is None:
            return
        sample = self.sample
        self.graph, self.sample = None, None
        if sample is not None:
            sample.ghosts.remove(self)
        if et is not None:
            return
        if len(cg) > self.since:
            self.segments.append((self.since, len(cg)))
        arm = _measure(cg, self.site, self.segments)
        if arm is None:
            return
        extra = arm.extra()
        if extra:  # nothing reads the outputs yet: raising them keeps every depth consistent
            depth = cg.depth
            for n in arm.outputs:
                depth[n] += extra
        if sample is not None and sample.arms is not None:
            sample.arms.setdefault(cg, []).append(arm)


def _measure(cg, site: Hashable, segments: list) -> _Arm | None:
    """The arm's nodes, outputs and length; records the length at the site. Leaves
    (parameters) are not part of an arm. One pass per segment (usually one): on the
    recording path of every branch."""
    op, args, depth = cg.op, cg.args, cg.depth
    nodes, outputs = [], []
    start = deepest = 0
    for lo, hi in segments:
        read = bytearray(hi - lo)  # 1: read by a later node of the segment, or a leaf
        for n in range(lo, hi):
            if op[n].leaf:
                read[n - lo] = 1
                continue
            nodes.append(n)
            if depth[n] > deepest:
                deepest = depth[n]
            for a in args[n]:
                if a >= lo:
                    read[a - lo] = 1
                elif depth[a] > start:
                    start = depth[a]
        outputs.extend(n for n in range(lo, hi) if not read[n - lo])
    if len(segments) > 1:  # an arm with a read inside: earlier segments' nodes read later
        inside = set(nodes)
        later = {a for n in nodes for a in args[n] if a in inside}
        outputs = [n for n in outputs if n not in later]
        start = max((depth[a] for n in nodes for a in args[n] if a not in inside), default=0)
    arm = _Arm(site, max(deepest - start, 0), nodes, outputs)
    if arm.length > _sites.get(site, -1):
        _sites[site] = arm.length
    return arm if outputs else None


def _length(cg, arm: _Arm, inside: set, rebase: bool) -> None:
    """Set the arm's length, its deepest node minus the deepest argument it reads from
    outside (with `rebase`: evaluated nodes count as depth 0), and the site's longest."""
    args, depth, blk = cg.args, cg.depth, cg.blk
    nb = len(blk)
    start = deepest = 0
    for n in arm.nodes:
        if rebase and n < nb and blk[n] >= 0:
            continue
        if depth[n] > deepest:
            deepest = depth[n]
        for a in args[n]:
            if a not in inside and depth[a] > start and not (rebase and a < nb and blk[a] >= 0):
                start = depth[a]
    arm.length = max(deepest - start, 0)
    if arm.length > _sites.get(arm.site, -1):
        _sites[arm.site] = arm.length


def align_depths(cg, arms: list, rebase: bool) -> None:
    """Before an evaluation inside dy.autobatch_map: pad the round's arms to their sites'
    longest arm and lift every pending node that reads a padded one (arguments first: node
    ids are a topological order). With `rebase`, pending depths restart at the round (an
    evaluated argument counts as depth 0), so that samples whose histories differ in length
    (a tree walked in a data-dependent order, a stack of older states) meet at one depth in
    every round: ACROBAT's depth inline in the round, for schedulers that group by depth.
    Arm lengths are then measured again in the round's depths, the ones the scheduler sees."""
    if rebase:
        _relax(cg, cg.done, {}, True)
        for arm in arms:
            _length(cg, arm, set(arm.nodes), True)
    pads: dict = {}
    for arm in arms:
        extra = arm.extra()
        if extra:
            for n in arm.outputs:
                if extra > pads.get(n, 0):
                    pads[n] = extra
    if pads:
        _relax(cg, cg.done if rebase else min(pads), pads, rebase)


def _relax(cg, lo: int, pads: dict, rebase: bool) -> None:
    """One pass over the pending nodes from `lo`: depth = 1 + deepest argument + pad. Without
    `rebase` depths only grow; with it an evaluated argument counts as 0."""
    depth, args, blk = cg.depth, cg.args, cg.blk
    nb = len(blk)  # nodes past the value table's end are pending
    for n in range(lo, len(depth)):
        if n < nb and blk[n] >= 0:
            continue
        ids = args[n]
        if not ids:
            continue  # inputs and constants keep theirs
        d = 0
        for a in ids:
            if depth[a] > d and (not rebase or a >= nb or blk[a] < 0):
                d = depth[a]
        d += 1 + pads.get(n, 0)
        if rebase or d > depth[n]:
            depth[n] = d


def reset_sites() -> None:
    """Forget every site's longest arm (tests; a model whose branches changed shape)."""
    _sites.clear()


def site_lengths() -> dict[Any, int]:
    """The longest arm learned per site, in depth levels."""
    return dict(_sites)
