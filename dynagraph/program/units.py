"""What a block's program is made of: the kinds of unit, a unit, and the copy counters."""
from __future__ import annotations

from dataclasses import dataclass, field

MODES = (None, "naive", "planned")
STEP, GROUP, PIECES, FUSED = 0, 1, 2, 3
LINEAR = ("matmul", "affine")


@dataclass
class Unit:
    kind: int
    steps: list                  # step indices (into plan.steps), in kernel order
    args: list = field(default_factory=list)   # per position: an argument spec (see _arg)
    pieces: int = 1              # PIECES: number of equal slices of the output
    piece_of: dict = field(default_factory=dict)   # PIECES: pick_range step -> slice index
    inputs: list = field(default_factory=list)     # FUSED: the chain's outside arguments
    chain: object = None                           # FUSED: a fusion.FusedChain


@dataclass
class Counts:
    """Memory kernels (copies) and bytes moved by the last forward and backward."""
    forward_copies: int = 0
    forward_bytes: int = 0
    backward_copies: int = 0
    backward_bytes: int = 0

