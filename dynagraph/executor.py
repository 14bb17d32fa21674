"""Runs scheduled batches: gather arguments, one kernel per batch, one output block.

A node's value is (block, row). An argument list that covers consecutive rows
of one block, in order, is used in place; a shared parameter is broadcast; any
other argument is brought together by one gather call.
"""
from __future__ import annotations

import time
from functools import partial
from operator import itemgetter
from typing import NamedTuple, Sequence

import numpy as np

from . import runs
from .config import config
from .errors import NonFiniteError
from .recording import NATIVE
from .stats import add_accumulated


class ExecutedBatch(NamedTuple):
    """What backward needs from one forward batch."""
    nodes: Sequence[int]
    xs: list          # the gathered arguments
    block: int        # output block id
    plans: list       # how each argument was gathered (see gather)
    cols: tuple       # per argument position, the argument node ids (autodiff derives `need`)
    ctx: object = None  # what a saves_ctx op (a static subgraph) keeps for its backward


_new_tuple = tuple.__new__

# How argument k of a batch was assembled; autodiff reuses it to scatter gradients back:
# (LEAF, block, None), (SLICE, block, first row), (TAKE, block, rows), (MANY, row index, None).
LEAF, SLICE, TAKE, MANY = 0, 1, 2, 3


def pick(values: list, ids: Sequence[int]) -> tuple:
    """values[i] for i in ids, as a tuple; itemgetter does the loop in C."""
    return itemgetter(*ids)(values) if len(ids) > 1 else (values[ids[0]],)


# Per-node bookkeeping, compiled in dynagraph._bookkeeping (kernels/cpython/executor.c)
# when it was built; these are the reference twins.
def _columns_py(args: list, nodes: Sequence[int]) -> tuple:
    """cols[k]: argument k of every node of the batch."""
    return tuple(zip(*pick(args, nodes)))


def _place_py(blk: list, row: list, nodes: Sequence[int], bid: int) -> None:
    """The batch's output block is bid; node nodes[r] is its row r."""
    for r, n in enumerate(nodes):  # a plain loop: list stores are specialised bytecodes, map() is not
        blk[n] = bid
        row[n] = r


def _locate_py(blk: list, row: list, ids: Sequence[int]) -> tuple:
    """Where the values of ids live: (SLICE, b, r0) for rows r0, r0+1, ... of block b;
    (TAKE, b, rows) for other rows of one block; (MANY, blks, rows) across blocks."""
    first = ids[0]
    b, r0, B = blk[first], row[first], len(ids)
    blks, rows = pick(blk, ids), pick(row, ids)
    if blks.count(b) == B:
        if rows[-1] - r0 == B - 1 and rows == tuple(range(r0, r0 + B)):
            return SLICE, b, r0
        return TAKE, b, rows
    return MANY, blks, rows


def _any_true_py(flags: list, ids: Sequence[int]) -> bool:
    return True in pick(flags, ids)


columns = NATIVE.columns if NATIVE else _columns_py
place = NATIVE.place if NATIVE else _place_py
locate = NATIVE.locate if NATIVE else _locate_py
any_true = NATIVE.any_true if NATIVE else _any_true_py
_run_batch_native = getattr(NATIVE, "run_batch_native", None)
_NDARRAY = np.ndarray
_FORMAT = {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


def gather(cg, be, ids: Sequence[int], stats, in_place: bool = False) -> tuple:
    """The batch's argument list `ids` as one (B, ...) array (or (1, ...) if shared), and its plan.
    in_place: rows from several blocks may stay where they are, as the backend's rows_operand."""
    first = ids[0]
    if cg.op[first].leaf:
        b = cg.blk[first]
        return cg.blocks[b], (LEAF, b, None)  # the signature guarantees every node shares it
    kind, b, rows = locate(cg.blk, cg.row, ids)
    if kind == SLICE:
        return cg.blocks[b][rows:rows + len(ids)], (SLICE, b, rows)
    if kind == TAKE and not in_place:
        out, plan = be.take_rows(cg.blocks[b], rows), (TAKE, b, rows)
    else:
        if kind == TAKE:  # rows of one block read in place too (a copy saved: MV-RNN's first level)
            b = (b,) * len(rows)
        index = be.row_index(cg.blocks, b, rows)  # checked once: backward scatters with it
        if in_place:
            out = be.rows_operand(cg.blocks, index)
            if out is not None:
                return out, (MANY, index, None)
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
    cols = columns(cg.args, nodes)
    xs, plans = [], []
    ops, blocks = cg.op, cg.blocks
    for ids in cols:
        if ops[ids[0]].leaf:  # a shared parameter, as in gather(), without the call
            b = cg.blk[ids[0]]
            xs.append(blocks[b])
            plans.append((LEAF, b, None))
            continue
        x, plan = _gather_arg(cg, be, ids, len(xs), op, stats)
        xs.append(x)
        plans.append(plan)
    data = list(pick(cg.data, nodes)) if op.uses_data else None
    t1 = time.perf_counter()
    y = be.forward_kernels.get(op.name, op.forward)(xp, cg.attrs[n0], data, *xs)
    ctx = None
    if op.saves_ctx:
        y, ctx = y
    B = len(nodes)
    y = _finish(cg, be, y, nodes)
    if cg.check_validity and not bool(be.to_host(xp.isfinite(y).all())):  # one explicit scalar copy
        raise NonFiniteError(f"{op.name} produced a non-finite value (nodes {list(nodes)[:5]}...)")
    t2 = time.perf_counter()
    bid = len(cg.blocks)
    cg.blocks.append(y)
    place(cg.blk, cg.row, nodes, bid)
    # tuple.__new__: a NamedTuple's own constructor is Python code, a measurable share of a small batch
    cg.executed.append(_new_tuple(ExecutedBatch, (nodes, xs, bid, plans, cols, ctx)))
    stats.kernel_calls += op.inner_kernels
    stats.batches += 1
    stats.nodes += B
    stats.t_memory += (t1 - t0) + (time.perf_counter() - t2)
    stats.t_execute += t2 - t1
    if stats.batch_log is not None and len(stats.batch_log) < 100_000:
        stats.batch_log.append((op.name, B))


def _op_info(be, op) -> tuple:
    """What run_batch reads from an op, for run_batch_native (one tuple per op and evaluation)."""
    return (op.leaf, op.uses_data, op.saves_ctx, op.inner_kernels, be.forward_kernels.get(op.name, op.forward),
            op.name)


def _gather_arg(cg, be, ids: Sequence[int], k: int, op, stats) -> tuple:
    """gather() of argument k of a batch of `op`, as run_batch does it (rows in place where the
    backend reads them so and the op takes them: OpDef.rows_args)."""
    in_place = op.rows_args if be.rows_operand is not None else ()
    return gather(cg, be, ids, stats, in_place is True or k in in_place) if in_place else gather(cg, be, ids, stats)


def _finish(cg, be, y, nodes: Sequence[int]):
    """run_batch's output block from a kernel's result that is not already one (run_batch_native's
    uncommon case: broadcast from shared arguments, reshaped, cast or made contiguous)."""
    xp, B = be.xp, len(nodes)
    if y.shape[0] != B:  # every node computed the same thing from shared arguments
        y = xp.broadcast_to(y, (B,) + y.shape[1:])
    return xp.ascontiguousarray(y.reshape((B,) + cg.shape[nodes[0]]), dtype=cg.dtype)


_ACC = ("kernel_calls", "batches", "nodes", "t_memory", "t_execute")  # run_batch_native's accumulator


class _NativeBatches:
    """run_batch for every batch of one evaluation through _bookkeeping.run_batch_native
    (kernels/cpython/batch_run.c, which documents the context); the counters it keeps in
    a bytearray go to stats once, at close()."""

    def __init__(self, cg, be):
        stats = cg.stats
        self.acc = bytearray(8 * len(_ACC))
        infos: dict = {}
        self.ctx = (cg.op, cg.blk, cg.row, cg.args, cg.blocks, cg.attrs, cg.data, cg.shape, cg.executed, infos,
                    lambda op: _op_info(be, op), be.xp, lambda ids, k, op: _gather_arg(cg, be, ids, k, op, stats),
                    lambda y, nodes: _finish(cg, be, y, nodes), ExecutedBatch, _NDARRAY,
                    _FORMAT.get(cg.dtype, ""), stats.batch_log, self.acc)
        self.stats = stats

    def close(self) -> None:
        add_accumulated(self.stats, _ACC, self.acc)


def _batch_runner(cg, be):
    """(run(nodes), close()) for one evaluation: the compiled per-batch path where it is
    built and no per-batch check asks for the reference (check_validity), else run_batch."""
    if _run_batch_native is None or cg.check_validity:
        return (lambda nodes: run_batch(cg, be, nodes)), (lambda: None)
    native = _NativeBatches(cg, be)
    return partial(_run_batch_native, native.ctx), native.close  # partial: no Python frame per batch


def execute(cg, be, batches: Sequence[Sequence[int]]) -> None:
    run_one, close = _batch_runner(cg, be)
    try:
        _execute(cg, be, batches, run_one)
    finally:
        close()


def _execute(cg, be, batches: Sequence[Sequence[int]], run_one) -> None:
    if not (config.fuse and runs.enabled(cg, be)):
        for nodes in batches:
            run_one(nodes)
        return
    stretch: list = []  # consecutive batches that can be steps of one run
    specs: list = []    # their step specs, handed to the run (asked once per batch)
    cache, sig, missing = runs.spec_cache(cg), cg.sig, _MISSING
    for nodes in batches:
        s = cache.get(sig[nodes[0]], missing)
        if s is missing:
            s = runs.step_spec(cg, nodes[0])
        if s is not None:
            stretch.append(nodes)
            specs.append(s)
            continue
        if stretch:
            _flush(cg, be, stretch, specs, run_one)
            stretch, specs = [], []
        run_one(nodes)
    if stretch:
        _flush(cg, be, stretch, specs, run_one)


_MISSING = object()


RUN_MIN_STEPS = 3  # shorter stretches run batch by batch: a run's fixed cost (~20 us) exceeds two batches'


def _flush(cg, be, stretch: list, specs: list, run_one) -> None:
    # a lone batch gains nothing from a run: numpy's ufuncs are as fast for one op
    if len(stretch) >= RUN_MIN_STEPS and runs.execute_run(cg, be, stretch, place, specs):
        return
    for nodes in stretch:
        run_one(nodes)


