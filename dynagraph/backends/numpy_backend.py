"""The reference backend: every kernel is a plain `xp` (numpy or CuPy) expression.

Faster backends subclass this and override only what a measurement shows pays:
the row movers below, or per-op kernels in `forward_kernels`/`backward_kernels`
(keyed by op name, same signatures as the op's own forward/backward).
"""
from __future__ import annotations

import numpy as np


class NumpyBackend:
    """The contract's required part (backends/contract.py); no optional capability."""
    name = "numpy"
    # optional capabilities (backends/contract.py): None = absent, callers take the xp path
    elementwise_runs = None
    fused_chains = None
    fused_cells = None
    row_add = None
    optimizer_rules = None
    rows_operand = None
    direct_kernels = None
    native_backward = None
    block_pool = None

    def __init__(self, xp=np):
        self.xp = xp
        self.forward_kernels: dict = {}
        self.backward_kernels: dict = {}

    # ------------------------------------------------------------ host <-> device
    # The only doors between the host and the backend's arrays. Parameters, gradients and
    # optimizer state stay on the backend's device; `.value()`, `.npvalue()`, `as_array()`,
    # `grad_as_array()`, saving and the trainers' one clipping norm per update use to_host.
    def to_host(self, a) -> np.ndarray:
        """A host (numpy) array with a's values; may share memory with a (copy before writing)."""
        return np.asarray(a)

    def to_device(self, a):
        """An array of this backend holding a host array's (or a number's) values; may share memory."""
        return self.xp.asarray(a)

    def address(self, a) -> int:
        """The address of a's first element: dy.block checks with it that weights still sit
        where it stacked them (same memory, no copy)."""
        return a.__array_interface__["data"][0]

    # ------------------------------------------------------------ row movement
    def take_rows(self, block, rows: list):
        """block[rows] as a new contiguous array (one source block)."""
        return block[self.xp.asarray(rows)]

    def gather_rows(self, blocks: list, blks: list, rows: list):
        """Row j of the result is blocks[blks[j]][rows[j]]: one copy per source block."""
        return self.gather_indexed(blocks, self.row_index(blocks, blks, rows))

    def row_index(self, blocks: list, blks: list, rows: list):
        """(blks, rows) prepared once for gather_indexed and the backward's scatter_indexed:
        here block -> (positions in the batch, rows in that block), as index arrays."""
        xp = self.xp
        return {bb: (xp.asarray(dst), xp.asarray(src), len(set(src)) == len(src))
                for bb, (dst, src) in _group(blks, rows).items()}

    def gather_indexed(self, blocks: list, index):
        xp = self.xp
        first = blocks[next(iter(index))]
        out = xp.empty((sum(len(d) for d, _, _ in index.values()),) + first.shape[1:], dtype=first.dtype)
        for bb, (dst, src, _) in index.items():
            out[dst] = blocks[bb][src]
        return out

    def scatter_indexed(self, grad_block, index, vals) -> None:
        """grad_block(b)[rows[j]] += vals[j] over the index of the forward gather."""
        for bb, (dst, src, distinct) in index.items():
            g = grad_block(bb)
            v = vals[dst].reshape((len(src),) + g.shape[1:])
            if distinct:
                g[src] += v
            else:
                self.xp.add.at(g, src, v)

    def add_rows(self, g, rows: list, vals) -> None:
        """g[rows] += vals; the slow unbuffered add.at only when a row repeats."""
        idx = self.xp.asarray(rows)
        if len(set(rows)) == len(rows):
            g[idx] += vals
        else:
            self.xp.add.at(g, idx, vals)

    def scatter_rows(self, grad_block, blks: list, rows: list, vals) -> None:
        """grad_block(b)[rows[j]] += vals[j] for rows spread over several blocks."""
        self.scatter_indexed(grad_block, self.row_index(None, blks, rows), vals)

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
