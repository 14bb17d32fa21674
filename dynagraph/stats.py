"""Batching statistics, collected on every evaluation (cheap counters only)."""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import MISSING, dataclass, field, fields
from typing import Callable

_NOT_COUNTERS = ("batch_log", "lower_bound_fn")


@dataclass
class Stats:
    nodes: int = 0               # nodes evaluated (parameters excluded)
    batches: int = 0             # forward kernel launches that came from the scheduler
    kernel_calls: int = 0        # forward + backward op kernels
    runs: int = 0                # stretches of elementwise batches run by one C call (runs.py)
    gathers: int = 0             # argument copies (a contiguous argument costs none)
    gather_bytes: int = 0
    scatters: int = 0            # gradient scatter-adds that were not in-place slices
    scatter_bytes: int = 0
    t_record: float = 0.0        # seconds in user code + recording between evaluations
    t_schedule: float = 0.0
    t_execute: float = 0.0       # forward kernels
    t_memory: float = 0.0        # gathers, scatters, block bookkeeping
    t_backward: float = 0.0      # backward kernels
    policy_hits: int = 0         # FSM scheduler: decisions found in the policy table
    policy_misses: int = 0       # FSM scheduler: decisions made by the fallback rule
    coarse_groups: int = 0       # coarsened groups run (dynagraph/coarsen): one plan call each
    coarse_nodes: int = 0        # recorded nodes those groups computed
    block_copies: int = 0        # copies inside dy.block plans and coarsened groups (forward + backward)
    block_copy_bytes: int = 0
    block_copies_saved: int = 0  # copies the planned layout avoided against the naive plan ("naive" - "planned")
    block_copy_bytes_saved: int = 0
    t_coarsen: float = 0.0       # finding repeated patterns (part of scheduling)
    batch_log: list = field(default_factory=list, repr=False)  # (op name, size) per batch
    # Set by the engine: computing the bound is O(nodes x signatures), so only on demand.
    lower_bound_fn: Callable[[], int] | None = field(default=None, repr=False, compare=False)

    @property
    def lower_bound(self) -> int:
        """Batches no schedule can beat: see schedulers.base.lower_bound."""
        return self.lower_bound_fn() if self.lower_bound_fn is not None else 0

    @classmethod
    def fresh(cls) -> "Stats":
        """Stats() without the generated __init__'s 22 assignments (a graph is made per sentence):
        fields with a plain default read it from the class until first set."""
        s = object.__new__(cls)
        for name, make in _FACTORY_FIELDS:
            setattr(s, name, make())
        return s

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_COUNTERS}
        d["lower_bound"] = self.lower_bound
        return d

    def describe_batches(self, limit: int = 200) -> str:
        """DyNet-style debug listing: one line per executed batch, op and size. A coarsened
        group shows as coarse[its ops]/members x instances."""
        lines = [f"{len(self.batch_log)} batches for {self.nodes} nodes:"]
        if self.coarse_groups:
            lines.append(f"  coarsened: {self.coarse_nodes} nodes in {self.coarse_groups} groups")
        if self.coarse_groups or self.block_copies:
            lines.append(f"  copies inside blocks and coarsened groups: {self.block_copies} "
                         f"({self.block_copy_bytes} B), forward and backward")
        if self.block_copies_saved or self.block_copy_bytes_saved:
            lines.append(f"  saved by the planned layout (against plan=\"naive\"): {self.block_copies_saved} "
                         f"copies ({self.block_copy_bytes_saved} B)")
        for k, (name, size) in enumerate(self.batch_log[:limit]):
            lines.append(f"  batch {k:4d}: {name:<18} x {size}")
        if len(self.batch_log) > limit:
            lines.append(f"  ... {len(self.batch_log) - limit} more")
        return "\n".join(lines)

    def by_op(self) -> dict:
        """op name -> (nodes, batches): shows at a glance what was and was not batched."""
        out: dict = {}
        for name, size in self.batch_log:
            n, b = out.get(name, (0, 0))
            out[name] = (n + size, b + 1)
        return out

    def merge(self, other: "Stats") -> None:
        for f in fields(self):
            if f.name not in _NOT_COUNTERS:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def __str__(self) -> str:
        t = self.t_record + self.t_schedule + self.t_execute + self.t_memory + self.t_backward
        pct = (lambda x: f"{100 * x / t:.0f}%") if t > 0 else (lambda x: "-")
        return (f"nodes={self.nodes} batches={self.batches} lower_bound={self.lower_bound} "
                f"kernels={self.kernel_calls} gathers={self.gathers} ({self.gather_bytes} B) "
                f"scatters={self.scatters} ({self.scatter_bytes} B) block_copies={self.block_copies} "
                f"({self.block_copy_bytes} B) saved={self.block_copies_saved} ({self.block_copy_bytes_saved} B) "
                f"coarse_groups={self.coarse_groups} | time: record {pct(self.t_record)} "
                f"schedule {pct(self.t_schedule)} execute {pct(self.t_execute)} memory {pct(self.t_memory)} "
                f"backward {pct(self.t_backward)}")


# The statistics of the graph being evaluated (set by the engine around forward and backward):
# where code that runs inside one batch (a dy.block plan) reports what it did.
ACTIVE: ContextVar["Stats | None"] = ContextVar("dynagraph_active_stats", default=None)


def count_block_copies(copies: int, nbytes: int, saved: tuple = (0, 0), stats=None) -> None:
    """Copies made inside a block plan or coarsened group, and (copies, bytes) its planned
    layout saved against the naive plan; into `stats`, or the active graph's."""
    if stats is None:
        stats = ACTIVE.get()
    if stats is not None:
        if copies:
            stats.block_copies += copies
            stats.block_copy_bytes += nbytes
        if saved[0] or saved[1]:
            stats.block_copies_saved += saved[0]
            stats.block_copy_bytes_saved += saved[1]


# Stats.fresh(): the fields whose default is made per instance
_FACTORY_FIELDS = tuple((f.name, f.default_factory) for f in fields(Stats) if f.default_factory is not MISSING)
