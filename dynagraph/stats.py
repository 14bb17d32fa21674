"""Batching statistics, collected on every evaluation (cheap counters only)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Stats:
    nodes: int = 0               # nodes evaluated (parameters excluded)
    batches: int = 0             # forward kernel launches that came from the scheduler
    lower_bound: int = 0         # batching lower bound of the evaluated graph
    kernel_calls: int = 0        # forward + backward op kernels
    gathers: int = 0             # argument copies (a contiguous argument costs none)
    gather_bytes: int = 0
    scatters: int = 0            # gradient scatter-adds that were not in-place slices
    scatter_bytes: int = 0
    t_record: float = 0.0        # seconds in user code + recording between evaluations
    t_schedule: float = 0.0
    t_execute: float = 0.0       # forward kernels
    t_memory: float = 0.0        # gathers, scatters, block bookkeeping
    t_backward: float = 0.0      # backward kernels
    batch_log: list = field(default_factory=list, repr=False)  # (op name, size) per batch

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "batch_log"}

    def merge(self, other: "Stats") -> None:
        for f in fields(self):
            if f.name != "batch_log":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def __str__(self) -> str:
        t = self.t_record + self.t_schedule + self.t_execute + self.t_memory + self.t_backward
        pct = (lambda x: f"{100 * x / t:.0f}%") if t > 0 else (lambda x: "-")
        return (f"nodes={self.nodes} batches={self.batches} lower_bound={self.lower_bound} "
                f"kernels={self.kernel_calls} gathers={self.gathers} ({self.gather_bytes} B) "
                f"scatters={self.scatters} ({self.scatter_bytes} B) | time: record {pct(self.t_record)} "
                f"schedule {pct(self.t_schedule)} execute {pct(self.t_execute)} memory {pct(self.t_memory)} "
                f"backward {pct(self.t_backward)}")
