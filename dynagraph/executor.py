"""Runs scheduled batches: gather arguments, one kernel per batch, one output block.

A node's value is (block, row). An argument list that covers consecutive rows
of one block, in order, is used in place; a shared parameter is broadcast; any
other argument is brought together by one gather call.
"""
from __future__ import annotations

import struct
import time
from array import array
from functools import partial
from operator import itemgetter
from typing import NamedTuple, Sequence

import numpy as np

from . import runs
from .config import config
from .errors import NonFiniteError
from .recording import NATIVE


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
_DTYPES, _EMPTY = (np.dtype(np.float32), np.dtype(np.float64)), np.empty
_MISSING_DIRECT = object()


# A batch of at most SPLIT_MAX nodes whose op has a direct kernel (backends/cpu/direct.py) runs
# node by node when an argument column would need a gather: a gather costs more (6-10 us: a
# row index, a new block) than the batches it saves (~1.5 us each). A larger one whose column
# reads rows of at most GROUP_MAX blocks runs as one batch per block (then read in place): the
# bidirectional LSTMs' cells (both directions batched, pre-activations in two blocks) are the
# case, per sentence and per mini-batch (a 128-row gather of 4H-wide rows: ~50 us).
SPLIT_MAX = 3
GROUP_MAX = 4


def _block_groups(cg, nodes, ids) -> list | None:
    """The nodes grouped by the block holding their argument in `ids` (groups in order of first
    appearance, nodes in batch order); None when the rows come from more than GROUP_MAX blocks."""
    groups: dict = {}
    blk = cg.blk
    for n, i in zip(nodes, ids):
        g = groups.get(blk[i])
        if g is None:
            if len(groups) == GROUP_MAX:
                return None
            g = groups[blk[i]] = []
        g.append(n)
    return [tuple(g) for g in groups.values()]


def _split_parts(cg, nodes, ids) -> list | None:
    """How a batch whose op may split runs instead of gathering argument column `ids` (twin of
    batch_run.c's column()): node by node (at most SPLIT_MAX nodes), one batch per source block
    (rows of several blocks, at most GROUP_MAX), or None: gather (or read as a slice)."""
    kind = locate(cg.blk, cg.row, ids)[0]
    if kind == SLICE:
        return None
    if len(nodes) <= SPLIT_MAX:
        return [(n,) for n in nodes]
    return _block_groups(cg, nodes, ids) if kind == MANY else None


def gather(cg, be, ids: Sequence[int], stats, in_place: bool = False) -> tuple:
    """The batch's argument list `ids` as one (B, ...) array (or (1, ...) if shared), and its plan.
    in_place: rows from several blocks may stay where they are, as the backend's rows_operand."""
    first = ids[0]
    if cg.op[first].leaf:
        b = cg.blk[first]
        return cg.blocks[b], (LEAF, b, None)  # the signature guarantees every node shares it
    kind, b, rows = locate(cg.blk, cg.row, ids)
    if kind == SLICE:
        block = cg.blocks[b]
        if rows == 0 and len(block) == len(ids):  # all of it (per sentence, the batch before's output)
            return block, (SLICE, b, rows)
        return block[rows:rows + len(ids)], (SLICE, b, rows)
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
    split = _splittable(op, _direct_of(be, op))
    may_split = len(nodes) > 1 and (split == 1 or split == 2 and len(cg.shape[n0]) == 1)
    for ids in cols:
        if ops[ids[0]].leaf:  # a shared parameter, as in gather(), without the call
            b = cg.blk[ids[0]]
            xs.append(blocks[b])
            plans.append((LEAF, b, None))
            continue
        if may_split:
            parts = _split_parts(cg, nodes, ids)
            if parts is not None:
                _run_in_parts(cg, be, nodes, parts, op)
                return
        x, plan = _gather_arg(cg, be, ids, len(xs), op, stats)
        xs.append(x)
        plans.append(plan)
    data = list(pick(cg.data, nodes)) if op.uses_data else None
    t1 = time.perf_counter()
    y = _kernel_of(be, op)(xp, cg.attrs[n0], data, *xs)
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


def _run_in_parts(cg, be, nodes, parts: list, op) -> None:
    """The parts of one scheduled batch, each read in place, counted as that one batch: its
    kernel calls stay counted, and the log has one entry (op name, B) for it (batch_run.c's
    parts_as_one is the twin)."""
    stats = cg.stats
    log = stats.batch_log
    logged = len(log) if log is not None else -1
    for part in parts:
        run_batch(cg, be, part)
    stats.batches -= len(parts) - 1
    if logged >= 0 and len(log) == logged + len(parts) and len(parts) > 1:
        del log[logged:]
        log.append((op.name, len(nodes)))


def _direct_of(be, op):
    """The backend's direct kernel of op (the `direct_kernels` capability): (descriptor, twin,
    splittable) or None."""
    direct = getattr(be, "direct_kernels", None)  # a backend outside backends/ may not declare it
    return direct.get(op.name) if direct is not None and not op.saves_ctx else None


def _kernel_of(be, op, direct=_MISSING_DIRECT):
    """The kernel a batch of op runs: the direct kernel's Python twin where the backend has one
    (the same decision and kernel as run_batch_native's direct call), else the backend's override
    or the op's own forward."""
    if direct is _MISSING_DIRECT:
        direct = _direct_of(be, op)
    return direct[1] if direct is not None else be.forward_kernels.get(op.name, op.forward)


def _splittable(op, direct) -> int:
    """Whether a small batch of op whose arguments would need a gather runs node by node
    (SPLIT_MAX): 0 never, 1 always, 2 where the op's value per node is a vector. The backend
    says so per direct kernel (rows of several blocks that it reads in place need no gather:
    per-sample matrices, OpDef.rows_args)."""
    return direct[2] if direct is not None else 0


def _op_info(be, op) -> tuple:
    """What run_batch reads from an op, for run_batch_native (one tuple per op and evaluation);
    the 7th item is the direct kernel's descriptor (batch_run.c) or None, the 8th _splittable,
    the 9th the columns it may take in place (_in_place_args)."""
    direct = _direct_of(be, op)
    return (op.leaf, op.uses_data, op.saves_ctx, op.inner_kernels, _kernel_of(be, op, direct), op.name,
            direct[0] if direct is not None else None, _splittable(op, direct), _in_place_args(be, op))


def _in_place_args(be, op) -> tuple | bool:
    """OpDef.rows_args where the backend reads rows in place (its rows_operand), else ()."""
    return op.rows_args if be.rows_operand is not None else ()


def _gather_arg(cg, be, ids: Sequence[int], k: int, op, stats) -> tuple:
    """gather() of argument k of a batch of `op`, as run_batch does it: rows in place where the
    backend reads them so, the op takes them (OpDef.rows_args) and they are matrices (per-sample
    matrices; a vector's copy is the cheap part). batch_run.c's in_place_column is the twin."""
    in_place = _in_place_args(be, op)
    if in_place and (in_place is True or k in in_place) and len(cg.shape[ids[0]]) >= 2:
        return gather(cg, be, ids, stats, True)
    return gather(cg, be, ids, stats)


def _finish(cg, be, y, nodes: Sequence[int]):
    """run_batch's output block from a kernel's result that is not already one (run_batch_native's
    uncommon case: broadcast from shared arguments, reshaped, cast or made contiguous)."""
    xp, B = be.xp, len(nodes)
    if y.shape[0] != B:  # every node computed the same thing from shared arguments
        y = xp.broadcast_to(y, (B,) + y.shape[1:])
    return xp.ascontiguousarray(y.reshape((B,) + cg.shape[nodes[0]]), dtype=cg.dtype)


_ACC = ("kernel_calls", "batches", "nodes", "t_memory", "t_execute", "gathers", "gather_bytes")  # run_batch_native's
_UNPACK_ACC = struct.Struct("7d").unpack  # accumulator: its seven doubles, in _ACC's order


class _NativeBatches:
    """run_batch for every batch of one evaluation through _bookkeeping.run_batch_native
    (kernels/cpython/batch_run.c, which documents the context); the counters it keeps in
    a bytearray go to stats once, at close()."""

    def __init__(self, cg, be):
        stats = cg.stats
        self.acc = bytearray(8 * len(_ACC))
        infos = _op_infos(be)
        empty = be.block_pool.empty if be.block_pool is not None else _EMPTY  # outputs of the direct kernels
        self.ctx = (cg.op, cg.blk, cg.row, cg.args, cg.blocks, cg.attrs, cg.data, cg.shape, cg.executed, infos,
                    lambda op: _op_info(be, op), be.xp, lambda ids, k, op: _gather_arg(cg, be, ids, k, op, stats),
                    lambda y, nodes: _finish(cg, be, y, nodes), ExecutedBatch, _NDARRAY,
                    _FORMAT.get(cg.dtype, ""), stats.batch_log, self.acc, _DTYPES, empty, SPLIT_MAX,
                    GROUP_MAX, getattr(getattr(be, "direct_kernels", None), "row_index_maker", None),
                    {},  # the evaluation's transposed shared weights (direct_products.c); dropped with it
                    cg)  # its node table: the argument columns without the tuples (node_table.c)
        self.stats = stats

    def close(self) -> None:
        """The accumulator into stats, unrolled: this runs once per evaluation of every small graph."""
        kernels, batches, nodes, t_memory, t_execute, gathers, gather_bytes = _UNPACK_ACC(self.acc)
        if batches:
            stats = self.stats
            stats.kernel_calls += int(kernels)
            stats.batches += int(batches)
            stats.nodes += int(nodes)
            stats.t_memory += t_memory
            stats.t_execute += t_execute
            if gathers:
                stats.gathers += int(gathers)
                stats.gather_bytes += int(gather_bytes)


_INFOS: dict = {}  # backend -> (its forward_kernels and direct_kernels when made, {op: its info})


def _op_infos(be) -> dict:
    """run_batch_native's per-op infos (_op_info), kept across evaluations while the backend's
    forward kernels and direct kernels stay what they were: a per-sentence program evaluates a
    new graph of the same few ops each time, and made them again per evaluation (~8 a sentence)."""
    kept = _INFOS.get(be)
    direct = getattr(be, "direct_kernels", None)
    if kept is None or kept[1] is not direct or kept[0] != be.forward_kernels:
        kept = _INFOS[be] = (dict(be.forward_kernels), direct, {})
    return kept[2]


def execute(cg, be, batches: Sequence[Sequence[int]]) -> None:
    native = _NativeBatches(cg, be) if _run_batch_native is not None and not cg.check_validity else None
    run_one = partial(_run_batch_native, native.ctx) if native is not None else partial(run_batch, cg, be)
    try:
        keyed = _plan_of(cg, be, batches)
        if keyed is None:
            _execute(cg, be, batches, run_one)
        elif native is None or _replay_native is None:
            _replay(cg, be, keyed[1], run_one)
        else:
            _replay_compiled(cg, be, batches, *keyed, native.ctx, run_one)
    finally:
        if native is not None:
            native.close()


_replay_native = getattr(NATIVE, "replay_native", None)


def _replay_compiled(cg, be, batches, key: tuple, plan: list, ctx: tuple, run_one) -> None:
    """A cached schedule's plan as one replay_native call (kernels/cpython/replay.c) once a
    program was compiled from its first native evaluation; a plan no program can say (runs,
    gathers, batches run in parts) keeps running item by item (its program is False)."""
    key = ("program",) + key
    program = batches.plans.get(key)
    if program:
        _replay_native(ctx, program)
        return
    base, first = len(cg.blocks), len(cg.executed)
    _replay(cg, be, plan, run_one)
    if program is None:
        batches.plans[key] = compile_program(cg.blocks, cg.executed, plan, base, first) or False


def _compile_program_py(blocks: list, executed: list, plan: list, base: int, first: int) -> tuple | None:
    """Twin of _bookkeeping.compile_program: replay_native's program (replay.c documents it)
    from the records one evaluation of `plan` left from executed[first] on, its blocks from
    `base` on; None where a batch did not run as one record whose columns are parameters or
    slices of the plan's own outputs. The column specs are packed int64s, not tuples: a program
    lives as long as its schedule, and every object the collector counts brings Python's next
    (full) collection closer."""
    records = executed[first:]
    if len(records) != len(plan) or len(blocks) != base + len(plan):
        return None
    steps = []
    for j, (item, rec) in enumerate(zip(plan, records)):
        nodes, xs, bid, plans, cols, _ = rec
        if type(item) is not tuple or tuple(nodes) != item or bid != base + j or type(cols) is not tuple:
            return None
        specs = []
        for x, where, ids in zip(xs, plans, cols):
            if where[0] == LEAF:
                specs += (LEAF, ids[0], -1, 0)
            elif where[0] == SLICE and base <= where[1] < bid:
                whole = x is blocks[where[1]]  # else the rows r0:r0 + B of it, as at this evaluation
                specs += (SLICE, where[1] - base, -1 if whole else where[2], len(ids))
            else:
                return None
        steps.append((item, cols, array("q", specs).tobytes(), tuple(plans)))
    return base, tuple(steps)


compile_program = getattr(NATIVE, "compile_program", None) or _compile_program_py


def _plan_of(cg, be, batches) -> tuple | None:
    """(key, plan): the execution plan of a cached schedule (schedule_cache.Schedule) for this backend,
    dtype, whether runs are on and RUN_MIN_STEPS (the key), made at its first evaluation; None for a
    schedule that is not cached.
    A plan is a list of items: a batch's nodes as a tuple (one run_batch), or a _Stretch
    (consecutive batches that are steps of one run, with their step specs). It depends only
    on what the cache compared (ops, attributes, shapes, wiring), so it holds for every graph
    that replays the schedule; whether a run can read its arguments in place is still
    decided per graph (_flush)."""
    plans = getattr(batches, "plans", None)
    if plans is None:
        return None
    fuse = config.fuse and runs.enabled(cg, be)  # asked each time: a capability may be switched off
    key = (be, cg.dtype, fuse, RUN_MIN_STEPS)
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = _make_plan(cg, batches, fuse)
    return key, plan


class _Stretch(NamedTuple):
    steps: list   # the batches' node lists
    specs: list   # their step specs


def _make_plan(cg, batches, fuse: bool) -> list:
    return list(_plan_items(cg, batches)) if fuse else [tuple(nodes) for nodes in batches]


def _plan_items(cg, batches: Sequence[Sequence[int]]):
    """The plan's items in order (a generator: _execute runs each as it comes): consecutive
    batches whose ops are run steps become one _Stretch when there are RUN_MIN_STEPS of them,
    every other batch is its nodes as a tuple."""
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
            yield from _stretch_items(stretch, specs)
            stretch, specs = [], []
        yield tuple(nodes)
    if stretch:
        yield from _stretch_items(stretch, specs)


def _stretch_items(stretch: list, specs: list):
    if len(stretch) >= RUN_MIN_STEPS:
        yield _Stretch(stretch, specs)
    else:  # a run's fixed cost exceeds what it saves on one or two batches
        yield from (tuple(nodes) for nodes in stretch)


def _replay(cg, be, plan, run_one) -> None:
    for item in plan:
        if type(item) is tuple:
            run_one(item)
        else:
            _flush(cg, be, item.steps, item.specs, run_one)


def _execute(cg, be, batches: Sequence[Sequence[int]], run_one) -> None:
    if not (config.fuse and runs.enabled(cg, be)):
        for nodes in batches:
            run_one(nodes)
        return
    _replay(cg, be, _plan_items(cg, batches), run_one)


_MISSING = object()


RUN_MIN_STEPS = 3  # shorter stretches run batch by batch: a run's fixed cost (~20 us) exceeds two batches'


def _flush(cg, be, stretch: list, specs: list, run_one) -> None:
    # a lone batch gains nothing from a run: numpy's ufuncs are as fast for one op
    if len(stretch) >= RUN_MIN_STEPS and runs.execute_run(cg, be, stretch, specs):
        return
    for nodes in stretch:
        run_one(nodes)


