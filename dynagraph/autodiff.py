"""Batched reverse mode: replay the executed batches backwards.

Each batch's output gradient is its own contiguous block; input gradients are
computed in one call per argument and scatter-added to their source rows.
Parameter gradients arrive already reduced over the batch (one GEMM); lookup
tables receive one sparse row update per batch.
"""
from __future__ import annotations

import time
from typing import Sequence

from .ops.base import SparseRows


def _grad_block(cg, xp, gb, b):
    g = gb[b]
    if g is None:
        g = gb[b] = xp.zeros(cg.blocks[b].shape, dtype=cg.dtype)
    return g


def scatter(cg, be, gb, nodes: Sequence[int], k: int, gx, stats) -> None:
    xp = be.xp
    args, blk, row = cg.args, cg.blk, cg.row
    first = args[nodes[0]][k]
    if isinstance(gx, SparseRows):
        cg.attrs[first][1].add_sparse_grad(gx.idx, gx.vals)
        stats.scatters += 1
        stats.scatter_bytes += gx.vals.nbytes
        return
    if cg.op[first].leaf:
        g = _grad_block(cg, xp, gb, blk[first])
        g += gx.sum(axis=0, keepdims=True) if gx.shape[0] != 1 else gx
        return
    ids = [args[n][k] for n in nodes]
    B = len(ids)
    b, r0 = blk[first], row[first]
    blks = [blk[i] for i in ids]
    rows = [row[i] for i in ids]
    gx = gx if gx.shape[0] == B else xp.broadcast_to(gx, (B,) + gx.shape[1:])
    if blks.count(b) == B:
        g = _grad_block(cg, xp, gb, b)
        if rows[-1] - r0 == B - 1 and rows == list(range(r0, r0 + B)):
            g[r0:r0 + B] += gx.reshape(g[r0:r0 + B].shape)
            return
        be.add_rows(g, rows, gx.reshape((B,) + g.shape[1:]))
    else:
        be.scatter_rows(lambda bb: _grad_block(cg, xp, gb, bb), blks, rows, gx)
    stats.scatters += 1
    stats.scatter_bytes += gx.nbytes


def backward(cg, be, nid: int, full: bool = False) -> None:
    stats = cg.stats
    xp = be.xp
    gb: list = [None] * len(cg.blocks)
    seed = _grad_block(cg, xp, gb, cg.blk[nid])
    seed[cg.row[nid]] = 1
    needs_grad, args = cg.needs_grad, cg.args
    for nodes, xs, bid in reversed(cg.executed):
        g = gb[bid]
        n0 = nodes[0]
        op = cg.op[n0]
        if g is None or op.backward is None:
            continue
        nargs = len(args[n0])
        need = tuple(full or any(needs_grad[args[n][k]] for n in nodes) for k in range(nargs))
        if not any(need):
            continue
        t0 = time.perf_counter()
        data = [cg.data[n] for n in nodes] if op.uses_data else None
        gxs = be.backward_kernels.get(op.name, op.backward)(xp, cg.attrs[n0], data, xs, cg.blocks[bid], g, need)
        t1 = time.perf_counter()
        stats.kernel_calls += 1
        stats.t_backward += t1 - t0
        for k in range(nargs):
            if need[k] and gxs[k] is not None:
                scatter(cg, be, gb, nodes, k, gxs[k], stats)
        stats.t_memory += time.perf_counter() - t1
    for leaf in cg._leaves.values():
        g = gb[cg.blk[leaf]]
        if g is not None and needs_grad[leaf]:
            p = cg.attrs[leaf][1]
            p.grad += g[0]
            if p.is_lookup:
                p.touched[:] = True  # dense use: every row has a gradient (DyNet's all_updated)
    cg.grad_blocks = gb
