"""Runs: consecutive elementwise batches of a schedule executed by one C call.

Op-level code records a cell as a dozen small elementwise ops (gate slices,
logistic, tanh, products, sums). Scheduled, they are a dozen batches per tree
level, and each pays tens of microseconds of Python for its argument gathers, its
bookkeeping and its kernel call, forward and again backward. A run takes the
scheduler's batches as they come: consecutive batches whose op is elementwise over
equal shapes (or a contiguous pick_range) become the steps of one program for
dg_run_fwd/dg_run_bwd (kernels/fused.inc), which read every argument row in place
through a table of row pointers: no gathers, no temporaries, one call.

Each step keeps its own output block and its nodes their (block, row), so autodiff,
gradient(), revert() and later batches see exactly what batch-by-batch execution
leaves. The pointers are formed here from (block, row) pairs that are checked
against each block's size first: the C code never sees an index.

Runs are used where the backend has the `elementwise_runs` capability (the cpu
backend with its compiled kernels; the numpy backend is the op-by-op reference they
are tested against); `dy.config.set(fuse=False)` or DYNAGRAPH_FUSE=0 turns them off.
"""
from __future__ import annotations

import time
from array import array
from typing import NamedTuple

import numpy as np

from .backends.optable import OPCODE, RUN_COPY as COPY, RUN_MAX_ARGS as MAX_ARGS
from .errors import NonFiniteError
from .fusion import _constant, fusable
from .ops.base import OPS, size_of
from .recording import NATIVE

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
_PICK_RANGE = OPS["pick_range"]


class StepSpec(NamedTuple):
    """How one batch's op runs as a run step (the same for every batch of a signature)."""
    code: int          # enum dg_fused_op, or COPY
    nargs: int
    const: float       # the op's scalar (addc's c, 1/k for average, ...)
    width: int         # output elements per node
    offs: tuple        # per argument: first element read (a pick_range's start)
    reach: tuple       # per argument: elements a source row must hold (off + width)
    name: str = ""     # the op's name (for stats.batch_log)


def _may_step(op) -> bool:
    """Whether a batch of op can be a run step for some attributes and shapes: a pick_range, or an
    op with a run opcode that reads no per-node data."""
    return op is _PICK_RANGE or (not op.uses_data and op.name in OPCODE)


def _spec(cg, n: int) -> StepSpec | None:
    op, attrs, shape = cg.op[n], cg.attrs[n], cg.shape[n]
    arg_shapes = [cg.shape[a] for a in cg.args[n]]
    width = size_of(shape)
    if width == 0 or not arg_shapes or len(arg_shapes) > MAX_ARGS:
        return None
    if op is _PICK_RANGE:
        start, _, d = attrs
        src = arg_shapes[0]
        if d != 0 or not src:  # only a range of the first axis is contiguous in a row
            return None
        off = start * size_of(src[1:])
        return StepSpec(COPY, 1, 0.0, width, (off,), (off + width,), op.name)
    if not _may_step(op) or not fusable(op, attrs, arg_shapes, shape):
        return None
    k = len(arg_shapes)
    return StepSpec(OPCODE[op.name], k, _constant(op.name, attrs, k), width, (0,) * k, (width,) * k, op.name)


def spec_cache(cg) -> dict:
    """The graph's step specs by signature id (step_spec fills it); the executor reads it
    directly, one dict lookup per scheduled batch."""
    specs = cg.__dict__.get("_run_specs")
    if specs is None:
        specs = cg.__dict__["_run_specs"] = {}
    return specs


def step_spec(cg, n: int) -> StepSpec | None:
    """The step spec of node n's batch, or None when its op cannot be a run step.
    Cached per graph and signature: this is asked once per scheduled batch."""
    specs = spec_cache(cg)
    sid = cg.sig[n]
    if sid not in specs:
        if sid < 0 or not _may_step(cg.op[n]):
            specs[sid] = None  # never a step, whatever its attributes and shapes: no key to build
            return None        # (a signature key hashed per new graph, ~1 us a batch)
        # Across graphs by everything _spec reads (signature key: op, attrs and shared arguments;
        # the output and argument shapes): a per-sentence program asks for the same dozen specs
        # in every graph it records.
        key = (cg.signatures[sid], cg.shape[n], tuple([cg.shape[a] for a in cg.args[n]]))
        spec = _BY_KEY.get(key, _NONE)
        if spec is _NONE:
            spec = _spec(cg, n)
            if spec is not None:  # one object per distinct spec: _program keys runs by identity
                spec = _INTERNED.setdefault(spec, spec)
            if len(_BY_KEY) >= 8192:  # a bound; live graphs and programs keep their spec objects,
                _BY_KEY.clear()       # only the sharing across graphs starts again from empty
                _INTERNED.clear()
            _BY_KEY[key] = spec
        specs[sid] = spec
    return specs[sid]


_INTERNED: dict = {}  # spec -> the one object equal to it (bounded with _BY_KEY)
_BY_KEY: dict = {}    # (signature key, shape, argument shapes) -> interned spec, or None: not a run step
_NONE = object()


def enabled(cg, be) -> bool:
    runs = getattr(be, "elementwise_runs", None)
    return runs is not None and cg.dtype in runs.dtypes


def _table_py(blk: list, row: list, args: list, needs_grad: list, steps: list, blocks: list, offs: list,
              reach: list, fmt: str, cg=None):
    """Twin of _bookkeeping.run_table (see kernels/cpython/run_reads.c for the fields):
    where every argument row of a run is read, checked against its block's size. (cg: the
    compiled twin reads its node table, which holds what `args` holds.)"""
    dt = np.dtype(fmt)
    slot_of, views, slots = {}, [], []
    pair_slot, pair_off, need = [], [], bytearray()
    j = 0
    for nodes in steps:
        k = len(args[nodes[0]])
        if any(len(args[n]) != k for n in nodes):
            raise ValueError("run_table: a node's arguments differ from its step's")
        for c in range(k):
            col = [args[n][c] for n in nodes]
            for x in col:
                b = blk[x]
                if not 0 <= b < len(blocks):
                    raise ValueError(f"run_table: argument node {x} has no value (block {b})")
                if b not in slot_of:
                    a = blocks[b]
                    if type(a) is not np.ndarray or a.dtype != dt or a.ndim < 1 or not a.flags.c_contiguous \
                            or not a.size:
                        return None
                    slot_of[b] = len(slots)
                    slots.append(b)
                    views.append(a)
                a = views[slot_of[b]]
                width = a.size // a.shape[0]
                if not 0 <= row[x] < a.shape[0] or reach[j + c] > width:
                    raise ValueError(f"run_table: node {x} reads row {row[x]} of a block of {a.shape[0]} rows")
                pair_slot.append(slot_of[b])
                pair_off.append((row[x] * width + offs[j + c]) * dt.itemsize)
            need.append(any(needs_grad[x] for x in col))
        j += k
    pair_slot, pair_off = np.array(pair_slot, np.int64), np.array(pair_off, np.int64)
    base = np.array([a.ctypes.data for a in views], np.int64)
    src = base[pair_slot] + pair_off if len(pair_slot) else pair_off
    counts = [len(nodes) for nodes in steps for _ in range(len(args[nodes[0]]))]
    flags = np.repeat(np.frombuffer(bytes(need), np.uint8).astype(bool), counts)
    step_of = np.repeat([m for m, nodes in enumerate(steps) for _ in range(len(args[nodes[0]]))], counts)
    slot_last = np.full(len(slots), -1, np.int64)
    np.maximum.at(slot_last, pair_slot[flags], step_of[flags])
    return src.tobytes(), pair_slot.tobytes(), pair_off.tobytes(), slots, bytes(need), slot_last.tobytes()


def _addresses_py(arrays: list, fmt: str) -> bytes:
    """Twin of _bookkeeping.addresses: each array's data address (0 for None), checked
    to be a writable C-contiguous array of `fmt` elements."""
    out = []
    for a in arrays:
        if a is None:
            out.append(0)
            continue
        if type(a) is not np.ndarray or a.dtype.char != fmt or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"addresses: array {len(out)} is not a writable C-contiguous '{fmt}' array")
        out.append(a.ctypes.data)
    return np.array(out, np.int64).tobytes()


def _grad_addresses_py(grads: list, values: list, fmt: str, pair_slot=None, pair_off=None) -> bytes:
    """Twin of _bookkeeping.grad_addresses: grads[i] (None or the gradient block of values[i],
    checked to be a writable C-contiguous `fmt` array shaped like it) by data address (0 for
    None); with pair_slot/pair_off (a run table's), the address of byte pair_off[p] of
    grads[pair_slot[p]] per pair p, 0 where that gradient block is None."""
    if len(grads) != len(values):
        raise ValueError("grad_addresses: one value block per gradient block")
    at, size = [], []
    for i, (g, v) in enumerate(zip(grads, values)):
        if g is None:
            at.append(0)
            size.append(0)
            continue
        if type(g) is not np.ndarray or g.dtype.char != fmt or not g.flags.c_contiguous or not g.flags.writeable \
                or g.nbytes != v.nbytes or g.ndim < 1 or g.shape[0] != v.shape[0]:
            raise ValueError(f"grad_addresses: gradient block {i} is not a '{fmt}' array shaped like its value block")
        at.append(g.ctypes.data)
        size.append(g.nbytes)
    if pair_slot is None:
        return np.array(at, np.int64).tobytes()
    slot, off = _arr(pair_slot), _arr(pair_off)
    if len(slot) != len(off):
        raise ValueError("grad_addresses: pair_slot and pair_off must be int64 of equal length")
    at_, size_ = np.array(at + [0], np.int64), np.array(size + [0], np.int64)
    bad = (slot < 0) | (slot >= len(at)) | (off < 0)
    s = np.where(bad, len(at), slot)
    bad |= (at_[s] != 0) & (off >= size_[s])
    if bad.any():
        p = int(np.flatnonzero(bad)[0])
        raise ValueError(f"grad_addresses: pair {p} (slot {slot[p]}, byte {off[p]}) is out of range")
    return np.where(at_[s] != 0, at_[s] + off, 0).astype(np.int64).tobytes()


def _place_steps_py(blk: list, row: list, shape: list, steps: list, blocks: list, empty, dtype, fmt: str) -> tuple:
    """Twin of _bookkeeping.place_steps (kernels/cpython/run_tables.c): each step's output
    block empty((len(nodes),) + shape[nodes[0]], dtype) appended to blocks and its nodes placed
    in it (blk[n], row[n]); (addresses, row counts) as int64 bytes."""
    first = len(blocks)
    for nodes in steps:
        bid = len(blocks)
        blocks.append(empty((len(nodes),) + shape[nodes[0]], dtype))
        for r, n in enumerate(nodes):
            blk[n], row[n] = bid, r
    return _addresses_py(blocks[first:], fmt), np.array([len(nodes) for nodes in steps], np.int64).tobytes()


_place_steps = NATIVE.place_steps if NATIVE is not None and hasattr(NATIVE, "place_steps") else _place_steps_py
_grad_addresses = NATIVE.grad_addresses if NATIVE is not None and hasattr(NATIVE, "grad_addresses") \
    else _grad_addresses_py
_untracked = NATIVE.untrack_record if NATIVE is not None and hasattr(NATIVE, "untrack_record") else lambda r: r
_table = NATIVE.run_table if NATIVE is not None and hasattr(NATIVE, "run_table") else _table_py
_FORMAT = {F32: "f", F64: "d"}
_MINUS_ONE = (-1,)


class ExecutedRun(NamedTuple):
    """What backward needs from one run (cg.executed holds it beside ExecutedBatch). Like an
    ExecutedBatch it lives as long as its graph and can hold no reference cycle, so it is made
    untracked by the collector (_untracked): left tracked, a BiLSTM mini-batch's ~150 runs a
    forward and their lists were still young when the next graph was recorded, reached the
    oldest generation and set off a full collection every few steps."""
    steps: list              # the steps' node lists (the scheduler's, untracked)
    bids: range              # the steps' output block ids
    code: np.ndarray
    consts: np.ndarray
    rows: np.ndarray         # nodes per step (no base: a frombuffer view would hold a tracked memoryview)
    width: np.ndarray
    max_width: int
    slots: list              # the blocks the row addresses point into
    keep: list               # those blocks, held so that no rebinding frees one before backward
    outs: list               # the output blocks, held so backward need not look them up again
    out_addresses: bytes
    src: bytes
    pair_slot: bytes
    pair_off: bytes
    need: bytes
    slot_last: bytes

    @property
    def nodes(self) -> list:
        return [n for nodes in self.steps for n in nodes]

    def slot_last_all(self) -> list:
        """slot_last as if every argument needed its gradient (backward(full=True))."""
        nargs = self.code[1::2]
        step_of = np.repeat(np.repeat(np.arange(len(self.steps)), nargs), np.repeat(self.rows, nargs))
        last = np.full(len(self.slots), -1, np.int64)
        np.maximum.at(last, np.frombuffer(self.pair_slot, np.int64), step_of)
        return last.tolist()


def _arr(buf) -> np.ndarray:
    return np.frombuffer(buf, np.int64)


def _unplace(cg, steps: list, first: int) -> None:
    """Undo execute_run's placement: the steps' nodes have no value, their blocks go."""
    for nodes in steps:
        for n in nodes:
            cg.blk[n] = -1
    del cg.blocks[first:]


_PROGRAMS: dict = {}  # step specs -> their arrays: per-sentence graphs repeat the same runs


def _program(specs: list) -> tuple:
    """(offs, reach, code, consts, widths, max width, specs, op names) of a run of these step specs,
    shared by every run of equal specs (in any graph); the arrays are read-only, as the
    kernels only read them. Keyed by the specs' identities (step_spec interns them): a tuple
    of ints hashes in a fraction of the time of the specs themselves; the program holds its
    specs, so no id in a key can be reused by another object while the key exists."""
    key = tuple(map(id, specs))
    prog = _PROGRAMS.get(key)
    if prog is None:
        if len(_PROGRAMS) >= 4096:  # a bound, not an LRU: programs with many distinct runs rebuild
            _PROGRAMS.clear()
        code = np.array([v for s in specs for v in (s.code, s.nargs)], np.int64)
        consts = np.array([s.const for s in specs], np.float64)
        widths = np.array([s.width for s in specs], np.int64)
        for a in (code, consts, widths):
            a.flags.writeable = False
        prog = _PROGRAMS[key] = ([o for s in specs for o in s.offs], [r for s in specs for r in s.reach],
                                 code, consts, widths, max(s.width for s in specs), tuple(specs),
                                 tuple(s.name for s in specs))
    return prog


def execute_run(cg, be, steps: list, specs: list | None = None) -> bool:
    """Run `steps` (scheduled node lists, in order) as one program; specs: the steps'
    step_spec where the caller has them. False, with the graph untouched, when some
    argument's block cannot be read in place."""
    t0 = time.perf_counter()
    if specs is None:
        specs = [step_spec(cg, nodes[0]) for nodes in steps]
    dt = cg.dtype
    blocks = cg.blocks
    first = len(blocks)
    outs, counts = _place_steps(cg.blk, cg.row, cg.shape, steps, blocks, np.empty, dt, _FORMAT[dt])
    offs, reach, code, consts, widths, max_width, _, names = _program(specs)
    table = _table(cg.blk, cg.row, cg.args, cg.needs_grad, steps, blocks, offs, reach, _FORMAT[dt], cg)
    if table is None:
        _unplace(cg, steps, first)
        return False
    bids = range(first, len(blocks))
    out_blocks = blocks[first:]
    rows = np.frombuffer(counts, np.int64).copy()
    t1 = time.perf_counter()
    be.elementwise_runs.forward(dt, code, consts, rows, widths, outs, table[0])
    t2 = time.perf_counter()
    if cg.check_validity:
        for m, nodes in enumerate(steps):
            if not np.isfinite(blocks[first + m]).all():
                _unplace(cg, steps, first)  # as batch by batch: no value is left for any of them
                raise NonFiniteError(f"{cg.op[nodes[0]].name} produced a non-finite value "
                                     f"(nodes {list(nodes)[:5]}...)")
    slots = table[3]
    # the blocks the row addresses point into, held so that no rebinding frees one before backward
    keep = [blocks[b] for b in slots]
    src, pair_slot, pair_off, _, need, slot_last = table
    cg.executed.append(_untracked(ExecutedRun(steps, bids, code, consts, rows, widths, max_width, slots, keep,
                                              out_blocks, outs, src, pair_slot, pair_off, need, slot_last)))
    stats = cg.stats
    stats.runs += 1
    stats.kernel_calls += 1
    stats.batches += len(steps)
    stats.nodes += int(rows.sum())
    stats.t_memory += (t1 - t0) + (time.perf_counter() - t2)
    stats.t_execute += t2 - t1
    if stats.batch_log is not None and len(stats.batch_log) < 100_000:
        stats.batch_log.extend(zip(names, rows.tolist()))
    return True


def backward_run(cg, be, gb, run: ExecutedRun, full: bool, grad_block) -> None:
    """Reverse mode over one run: gradients are added straight into the gradient
    blocks of every row the run read (grad_block(b) makes block b's writable)."""
    t0 = time.perf_counter()
    need = run.need if not full else b"\x01" * len(run.need)
    if 1 not in need:
        return
    # full: every argument needs its gradient, so each slot's last reader is the last step reading it at all
    last = np.frombuffer(run.slot_last, np.int64).tolist() if not full else run.slot_last_all()
    blocks = cg.blocks
    # The run's own blocks that receive gradient only from later steps: one uninitialised
    # buffer, each zeroed by the kernel when its last reader begins (-1: keep as is).
    first = run.bids[0]
    zero_at = array("q", _MINUS_ONE) * len(run.bids)
    fresh, total = [], 0
    for s, b in enumerate(run.slots):
        if b >= first and last[s] >= 0 and gb[b] is None:
            fresh.append((s, b))
            total += blocks[b].size
    if fresh:
        buf = np.empty(total, cg.dtype)
        at = 0
        for s, b in fresh:
            v = blocks[b]
            gb[b] = np.ndarray(v.shape, buf.dtype, buf, at)  # a view of the shared buffer at byte `at`
            zero_at[b - first] = last[s]
            at += v.nbytes
    fmt = _FORMAT[cg.dtype]
    # checked against the value blocks in C: a gradient block shaped unlike its value block is a ValueError
    written, borrowed = [], gb.borrowed
    for t, b in zip(last, run.slots):
        if t < 0:
            written.append(None)  # no step of this run adds into block b
            continue
        g = gb[b]
        if g is None or b in borrowed:  # grad_block's two cases: allocate, or copy before writing
            g = grad_block(b)
        written.append(g)
    gsrc = _grad_addresses(written, [blocks[b] for b in run.slots], fmt, run.pair_slot, run.pair_off)
    gout = _grad_addresses([gb[b] for b in run.bids], run.outs, fmt)
    work = np.empty(run.max_width, cg.dtype)
    t1 = time.perf_counter()
    be.elementwise_runs.backward(cg.dtype, run.code, run.consts, run.rows, run.width, run.out_addresses, gout,
                                 run.src, gsrc, need, zero_at, work)
    t2 = time.perf_counter()
    stats = cg.stats
    stats.kernel_calls += 1
    stats.t_backward += t2 - t1
    stats.t_memory += t1 - t0
