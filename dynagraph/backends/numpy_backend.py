"""The reference backend: every kernel is a plain `xp` (numpy or CuPy) expression.

Faster backends subclass this and override only what a measurement shows pays:
the row movers below, or per-op kernels in `forward_kernels`/`backward_kernels`
(keyed by op name, same signatures as the op's own forward/backward).
"""
from __future__ import annotations

import numpy as np


class NumpyBackend:
    name = "numpy"

    def __init__(self, xp=np):
        self.xp = xp
        self.forward_kernels: dict = {}
        self.backward_kernels: dict = {}

    # ------------------------------------------------------------ row movement
    def take_rows(self, block, rows: list):
        """block[rows] as a new contiguous array (one source block)."""
        return block[self.xp.asarray(rows)]

    def gather_rows(self, blocks: list, blks: list, rows: list):
        """Row j of the result is blocks[blks[j]][rows[j]]: one copy per source block."""
        xp = self.xp
        groups = _group(blks, rows)
        first = blocks[blks[0]]
        out = xp.empty((len(rows),) + first.shape[1:], dtype=first.dtype)
        for bb, (dst, src) in groups.items():
            out[xp.asarray(dst)] = blocks[bb][xp.asarray(src)]
        return out

    def add_rows(self, g, rows: list, vals) -> None:
        """g[rows] += vals; the slow unbuffered add.at only when a row repeats."""
        idx = self.xp.asarray(rows)
        if len(set(rows)) == len(rows):
            g[idx] += vals
        else:
            self.xp.add.at(g, idx, vals)

    def scatter_rows(self, grad_block, blks: list, rows: list, vals) -> None:
        """grad_block(b)[rows[j]] += vals[j] for rows spread over several blocks."""
        xp = self.xp
        for bb, (src, dst) in _group(blks, rows).items():
            g = grad_block(bb)
            self.add_rows(g, dst, vals[xp.asarray(src)].reshape((len(src),) + g.shape[1:]))

    def embedding_backward(self, p, idx, vals) -> None:
        """A lookup table's sparse gradient: p.grad[idx] += vals (repeats add up)."""
        p.add_sparse_grad(idx, vals)


def _group(blks: list, rows: list) -> dict:
    """block -> ([positions in the batch], [rows in that block])."""
    by_block: dict = {}
    for j, (bb, rr) in enumerate(zip(blks, rows)):
        pos = by_block.get(bb)
        if pos is None:
            by_block[bb] = ([j], [rr])
        else:
            pos[0].append(j)
            pos[1].append(rr)
    return by_block
