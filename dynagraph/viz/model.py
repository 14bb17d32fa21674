"""What a picture shows, read from a recorded graph through its public columns.

A `Picture` is plain data: the nodes to draw (non-leaf nodes: parameters are shared by
every sample and would only tie the samples' drawings together), the edges between
them, the sample each node belongs to, and one or more schedules (lists of batches).
Layout (layout.py) and rendering (svg.py, page.py) never look at the graph again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .. import schedulers

SHARED_COLUMNS = ("shared", "all")  # column names that hold no sample of their own


@dataclass
class Picture:
    nodes: list[int]                      # node ids, increasing
    label: dict[int, str]                 # node id -> op name
    shape: dict[int, tuple]               # node id -> output shape
    edges: list[tuple[int, int]]          # (argument, user), both drawn
    sample: dict[int, int]                # node id -> column index
    columns: list[str]                    # column names: "sample 0", ..., and "shared" for the joint loss
    schedules: dict[str, list[list[int]]] = field(default_factory=dict)  # name -> batches
    lower_bound: int = 0
    kind: dict[int, str] = field(default_factory=dict)  # node id -> op or function name, where label says more

    def op_of(self, n: int) -> str:
        return self.kind.get(n, self.label[n])

    @property
    def n_samples(self) -> int:
        return len(self.columns)

    def batch_of(self, name: str) -> dict[int, int]:
        """node id -> index of its batch in schedule `name`."""
        return {n: k for k, batch in enumerate(self.schedules[name]) for n in batch}

    def reads(self, batch: Sequence[int]) -> list[int]:
        """The drawn nodes a batch reads (its arguments)."""
        ids = set(batch)
        return sorted({a for a, u in self.edges if u in ids})


def _drawn_nodes(cg) -> list[int]:
    return [i for i in range(len(cg.op)) if not cg.op[i].leaf]


def _sample_columns(cg, nodes: list[int], roots: Sequence[int] | None) -> tuple[dict, int]:
    """Assign each node to the first sample root that depends on it. Without roots: when the
    graph ends in one node joining several arguments (the summed loss), its arguments are
    the samples; otherwise everything is one column."""
    drawn = set(nodes)
    if roots is None:
        used = {a for n in nodes for a in cg.args[n]}
        sinks = [n for n in nodes if n not in used]
        roots = []
        if len(sinks) == 1 and len(cg.args[sinks[0]]) > 1:
            roots = [a for a in cg.args[sinks[0]] if a in drawn]
        elif len(sinks) > 1:
            roots = sinks
    sample: dict[int, int] = {}
    for s, r in enumerate(roots):
        stack = [r]
        while stack:
            n = stack.pop()
            if n in sample or n not in drawn:
                continue
            sample[n] = s
            stack.extend(cg.args[n])
    shared = len(roots)
    for n in nodes:
        sample.setdefault(n, shared)
    names = [f"sample {s}" for s in range(shared)]
    if any(v == shared for v in sample.values()):
        names.append("shared" if shared else "all")
    return sample, names


def picture(cg, samples: Sequence | None = None) -> Picture:
    """The drawable content of `cg`. samples: one Expression (or node id) per sample, e.g.
    each sample's loss; by default read from the graph's final sum (see _sample_columns)."""
    nodes = _drawn_nodes(cg)
    drawn = set(nodes)
    roots = None if samples is None else [s if isinstance(s, int) else s.i for s in samples]
    sample, columns = _sample_columns(cg, nodes, roots)
    edges = [(a, n) for n in nodes for a in dict.fromkeys(cg.args[n]) if a in drawn]
    return Picture(nodes=nodes, label={n: cg.op[n].name for n in nodes}, shape={n: tuple(cg.shape[n]) for n in nodes},
                   edges=edges, sample=sample, columns=columns)


def schedule_of(cg, scheduler=None) -> list[list[int]]:
    """The batches of `cg`: for a graph with pending nodes, what `scheduler` (default: the
    graph's own) would run, computed without evaluating anything; for an evaluated graph
    with no scheduler named, the batches that ran."""
    pending = cg.pending_nodes()
    if not pending:
        if scheduler is not None and cg.executed_batches():
            raise ValueError("this graph is already evaluated: draw other schedulers on a graph that is recorded "
                             "but not yet evaluated (call dy.viz before .value())")
        return cg.executed_batches()
    done = cg.executed_batches()
    sched = schedulers.get(scheduler if scheduler is not None else cg.scheduler)
    batches = sched.schedule(cg, pending)
    schedulers.validate(cg, pending, batches, getattr(sched, "name", type(sched).__name__))
    return done + [list(b) for b in batches]


def lower_bound(cg) -> int:
    """Batches no schedule can beat, over every non-leaf node of the graph."""
    return schedulers.lower_bound(cg, _drawn_nodes(cg))
