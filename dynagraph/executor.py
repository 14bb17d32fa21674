"""Runs scheduled batches: gather arguments, one kernel per batch, one output block.

A node's value is (block, row). An argument list that covers consecutive rows
of one block, in order, is used in place; a shared parameter is broadcast; any
other argument is brought together by one gather call.
"""
from __future__ import annotations

import time
from operator import itemgetter
from typing import NamedTuple, Sequence


from .errors import NonFiniteError


class ExecutedBatch(NamedTuple):
    """What backward needs from one forward batch."""
    nodes: Sequence[int]
    xs: list          # the gathered arguments
    block: int        # output block id
    plans: list       # how each argument was gathered (see gather)
    cols: tuple       # per argument position, the argument node ids (autodiff derives `need`)
    ctx: object = None  # what a saves_ctx op (a static subgraph) keeps for its backward


# How argument k of a batch was assembled; autodiff reuses it to scatter gradients back:
# (LEAF, block, None), (SLICE, block, first row), (TAKE, block, rows), (MANY, row index, None).
LEAF, SLICE, TAKE, MANY = 0, 1, 2, 3


def pick(values: list, ids: Sequence[int]) -> tuple:
    """values[i] for i in ids, as a tuple; itemgetter does the loop in C."""
    return itemgetter(*ids)(values) if len(ids) > 1 else (values[ids[0]],)


def gather(cg, be, ids: Sequence[int], stats) -> tuple:
    """The batch's argument list `ids` as one (B, ...) array (or (1, ...) if shared), and its plan."""
    blk = cg.blk
    first = ids[0]
    b = blk[first]
    if cg.op[first].leaf:
        return cg.blocks[b], (LEAF, b, None)  # the signature guarantees every node shares it
    r0 = cg.row[first]
    B = len(ids)
    blks = pick(blk, ids)
    rows = pick(cg.row, ids)
    if blks.count(b) == B:
        if rows[-1] - r0 == B - 1 and rows == tuple(range(r0, r0 + B)):
            return cg.blocks[b][r0:r0 + B], (SLICE, b, r0)
        out, plan = be.take_rows(cg.blocks[b], rows), (TAKE, b, rows)
    else:
        index = be.row_index(cg.blocks, blks, rows)  # checked once: backward scatters with it
        out, plan = be.gather_indexed(cg.blocks, index), (MANY, index, None)
    stats.gathers += 1
    stats.gather_bytes += out.nbytes
    return out, plan


def run_batch(cg, be, nodes: Sequence[int]) -> None:
    stats = cg.stats
    xp = be.xp
    n0 = nodes[0]
    op = cg.op[n0]
    t0 = time.perf_counter()
    cols = tuple(zip(*pick(cg.args, nodes)))  # cols[k]: argument k of every node
    xs, plans = [], []
    for ids in cols:
        x, plan = gather(cg, be, ids, stats)
        xs.append(x)
        plans.append(plan)
    data = list(pick(cg.data, nodes)) if op.uses_data else None
    t1 = time.perf_counter()
    y = be.forward_kernels.get(op.name, op.forward)(xp, cg.attrs[n0], data, *xs)
    ctx = None
    if op.saves_ctx:
        y, ctx = y
    B = len(nodes)
    if y.shape[0] != B:  # every node computed the same thing from shared arguments
        y = xp.broadcast_to(y, (B,) + y.shape[1:])
    y = xp.ascontiguousarray(y.reshape((B,) + cg.shape[n0]), dtype=cg.dtype)
    if cg.check_validity and not bool(xp.isfinite(y).all()):
        raise NonFiniteError(f"{op.name} produced a non-finite value (nodes {list(nodes)[:5]}...)")
    t2 = time.perf_counter()
    bid = len(cg.blocks)
    cg.blocks.append(y)
    blk, row = cg.blk, cg.row
    for r, n in enumerate(nodes):  # a plain loop: list stores are specialised bytecodes, map() is not
        blk[n] = bid
        row[n] = r
    cg.executed.append(ExecutedBatch(nodes, xs, bid, plans, cols, ctx))
    stats.kernel_calls += op.inner_kernels
    stats.batches += 1
    stats.nodes += B
    stats.t_memory += (t1 - t0) + (time.perf_counter() - t2)
    stats.t_execute += t2 - t1
    if stats.batch_log is not None and len(stats.batch_log) < 100_000:
        stats.batch_log.append((op.name, B))


def execute(cg, be, batches: Sequence[Sequence[int]]) -> None:
    for nodes in batches:
        run_batch(cg, be, nodes)


