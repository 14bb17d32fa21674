"""Lazy graph recording: ComputationGraph (and the current graph of each thread or sample).

Recording a node infers its shape, checks its arguments, computes its depth and
its signature, and computes nothing. Nodes live in parallel lists (not objects)
because recording is on every user's hot path.

Evaluation is delegated to an *engine* installed by a higher layer
(dynagraph.engine): schedulers, the executor and autodiff sit above this file.
Expression, the user's handle to a node, and record() are in expression.py.
"""
from __future__ import annotations

import itertools
import math
import time
from contextvars import ContextVar
from typing import Any

import numpy as np

from . import overlap
from .backends import to_numpy
from .config import config
from .errors import (
    DynagraphError,
    DynagraphIndexError,
    NonFiniteError,
    StaleExpressionError,
    op_error,
    user_line,
)
from .ops import OpDef
from .ops.base import one_row
from .ops.inputs import LOOKUP_TABLE, PARAMETER
from .recording import COMPILED, SHAPES, SHAPES_LIMIT, ExprBase, GraphBase
from .stats import Stats

_engine: Any = None  # set by dynagraph.engine: forward(cg, upto), backward(cg, nid, full)


_NP_DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}


def set_engine(engine) -> None:
    global _engine
    _engine = engine


class ComputationGraph(GraphBase):
    """One recorded computation. Several graphs may coexist; `renew_cg` retires the default one."""

    _serial = itertools.count(1)  # next() is atomic under the GIL: versions stay unique across threads

    # Defaults every graph starts with, as class attributes: renew_cg() runs once per sentence in
    # per-sentence programs, so a new graph sets only what differs (an instance attribute
    # then shadows these).
    done = 0                    # nodes [0, done) are evaluated
    grad_blocks: list | None = None
    grad_full = False
    tracing = False             # a static subgraph's trace: recorded, never evaluated
    reverts = 0                 # bumped by revert(): node ids may be reused after it
    check_validity = False

    def __init__(self, scheduler=None, immediate_compute: bool = False, check_validity: bool = False):
        self.version = next(ComputationGraph._serial)
        self.scheduler = scheduler if scheduler is not None else config.scheduler
        if immediate_compute:
            self.immediate_compute = True
        if check_validity:
            self.check_validity = check_validity
        self.dtype = _NP_DTYPES.get(config.dtype) or config.np_dtype  # np.dtype() parses its name
        # Node storage: parallel lists indexed by node id (GraphBase._start makes them in C):
        #   op, args, attrs, data, shape, depth,
        #   sig            signature id per node; see `signatures`
        #   signatures     id -> (op, attrs, per-arg shape or shared id); _sig_id: key -> id, ...
        #   sig_part       how a node appears inside its users' signatures
        #   needs_grad
        #   blk, row       values: node -> (block, row); blocks are the batched outputs
        #   blocks
        #   _leaves        parameter (or (parameter, False)) -> its leaf node
        #   _block_param   leaf value block -> parameter object
        self._start()
        self.executed: list = []        # forward batches in execution order (for backward)
        # the batches as scheduled, in execution order (executed_batches()); None once an
        # evaluation ran another way (coarsened groups) or set() dropped some of them
        self.scheduled: list | None = []
        self._stats = Stats.fresh()
        self._t_last = time.perf_counter()

    def _start_py(self) -> None:
        self.op: list[OpDef] = []
        self.args: list[tuple] = []
        self.attrs: list[tuple] = []
        self.data: list = []
        self.shape: list[tuple] = []
        self.depth: list[int] = []
        self.sig: list[int] = []
        self.signatures: list[tuple] = []
        self._sig_id: dict = {}
        self.sig_part: list = []
        self.needs_grad: list[bool] = []
        self.blk: list[int] = []
        self.row: list[int] = []
        self.blocks: list = []
        self._leaves: dict = {}
        self._block_param: dict = {}

    if not COMPILED:
        _start = _start_py

        @property
        def _rand_base(self) -> int:
            """Node 0's random key (node i's is this + i), drawn when the graph first needs it."""
            base = self.__dict__.get("_rand_base_drawn")
            if base is None:
                base = self.__dict__["_rand_base_drawn"] = draw_rand_base()
            return base

    # ------------------------------------------------------------------ recording
    def _add_py(self, op: OpDef, ids: tuple, attrs: tuple = (), data: Any = None) -> int:
        """Record one node. The hot path of every model: keep it allocation-light.
        This is `add` without the compiled recorder, and the reference it falls back
        to for anything but the common case (dynagraph/recording.py).

        A node's shape is a function of its signature key (op, attrs, argument
        parts), so the key is looked up first and the op's shape rule runs only
        for a key this graph has not seen; per-node checks (indices) always run.
        """
        part, dep, ng = self.sig_part, self.depth, self.needs_grad
        if len(ids) == 1:
            i = ids[0]
            key = (op, attrs, part[i])
            depth, needs = dep[i], ng[i]
        elif len(ids) == 2:  # binary ops: no loop
            i, j = ids
            key = (op, attrs, (part[i], part[j]))
            depth = dep[i] if dep[i] > dep[j] else dep[j]
            needs = ng[i] or ng[j]
        else:
            plist, depth, needs = [], 0, False
            for i in ids:  # one plain loop: comprehensions cost a frame each
                plist.append(part[i])
                if dep[i] > depth:
                    depth = dep[i]
                if ng[i]:
                    needs = True
            key = (op, attrs, tuple(plist))
        known = self._sig_id.get(key)
        if known is None:
            known = self._new_signature(op, ids, attrs, key)
        check = op.check
        if check is not None and type(data) is not IndexSlot:
            try:  # free in Python 3.11 unless it raises
                if len(ids) == 1:
                    check(attrs, data, self.shape[ids[0]])
                else:
                    check(attrs, data, *[self.shape[i] for i in ids])
            except (IndexError, ValueError) as e:
                raise self._op_error(op, ids, e) from None
        # known[2], the interned attrs: equal, and one fewer object kept per node
        sid, shape, attrs = known[0], known[1], known[2]
        nid = len(self.op)
        self.op.append(op)
        self.args.append(ids)
        self.attrs.append(attrs)
        self.data.append(self._rand_base + nid if data is _RANDOM_KEY else data)
        self.shape.append(shape)
        dep.append(depth + 1)
        self.sig.append(sid)
        part.append(shape)
        ng.append(needs and not op.blocks_grad)
        if self.immediate_compute:
            self.forward_to(nid)
        return nid

    if not COMPILED:
        add = _add_py

    def _new_signature(self, op: OpDef, ids: tuple, attrs: tuple, key: tuple) -> tuple:
        """(signature id, output shape, attrs) for a key not seen yet: runs the op's shape
        rule unless an earlier graph did (recording.SHAPES). Interned, one tuple per distinct
        signature, which keeps GC pressure low."""
        shapes = tuple([self.shape[i] for i in ids])
        skey = (op, attrs, shapes)
        shape = SHAPES.get(skey)
        if shape is None:
            try:
                shape = op.shape(attrs, *shapes)
            except (IndexError, ValueError) as e:
                raise self._op_error(op, ids, e) from None
            if len(SHAPES) >= SHAPES_LIMIT:
                SHAPES.clear()
            SHAPES[skey] = shape
        # check and blocks_grad ride along for the compiled recorder (one lookup per node)
        known = self._sig_id[key] = (len(self.signatures), shape, attrs, op.check, op.blocks_grad)
        self.signatures.append(key)
        return known

    def _op_error(self, op: OpDef, ids: tuple, e: Exception) -> DynagraphError:
        kind = DynagraphIndexError if isinstance(e, IndexError) else DynagraphError
        return op_error(kind, op.name, [self.shape[i] for i in ids], str(e))

    @property
    def stats(self) -> Stats:
        """Counters and time split; waits for a backward() of this graph on the overlap thread."""
        overlap.wait_for(self)
        return self._stats

    def _sync_values(self) -> None:
        """Value slots are allocated lazily, at evaluation, not per recorded node. Evaluation,
        gradient(), revert(), invalidate() and set_data() pass here: first wait for a backward()
        of this graph still running on the overlap thread."""
        overlap.wait_for(self)
        k = len(self.op) - len(self.blk)
        if k:
            self.blk.extend([-1] * k)
            self.row.extend([0] * k)

    def placeholder(self, op: OpDef, shape: tuple) -> int:
        """An input of a static subgraph being traced: stands for a coarse node's argument."""
        nid = len(self.op)
        self.op.append(op)
        self.args.append(())
        self.attrs.append((shape,))
        self.data.append(None)
        self.shape.append(shape)
        self.depth.append(0)
        self.sig.append(-1)
        self.sig_part.append(shape)
        self.needs_grad.append(True)
        return nid

    def _leaf_py(self, p, update: bool = True) -> int:
        """The node standing for a parameter in this graph (one per parameter and mode).
        Made once per parameter per graph, so several per sentence: written out flat. This
        is `leaf` without the compiled recorder (kernels/cpython/recorder.c), which makes
        the leaf of an ordinary parameter the same way and hands anything else here."""
        key = p if update else (p, False)
        nid = self._leaves.get(key)
        if nid is not None:
            return nid
        nid = len(self.op)
        blk, row = self.blk, self.row
        k = nid - len(blk)
        if k:  # _sync_values(), inline
            blk.extend([-1] * k)
            row.extend([0] * k)
        values = overlap.storage(p, "values")  # a view; no wait for a step still updating it
        shape = values.shape
        self.op.append(LOOKUP_TABLE if p.is_lookup else PARAMETER)
        self.args.append(())
        self.attrs.append((shape, p))
        self.data.append(None)
        self.shape.append(shape)
        self.depth.append(0)
        self.sig.append(-1)  # leaves are bound, never scheduled
        self.sig_part.append(("shared", id(p), update))  # shared arguments batch by identity and mode
        self.needs_grad.append(update and p.updated)
        blocks = self.blocks
        b = len(blocks)
        self._block_param[b] = p
        blk.append(b)
        row.append(0)
        blocks.append(one_row(values))
        self._leaves[key] = nid
        return nid

    if not COMPILED:
        leaf = _leaf_py

    def checkpoint(self) -> None:
        """DyNet's cg_checkpoint(): remember the graph's size for a later revert()."""
        sample = SAMPLE.get()
        if sample is not None and sample.park is not None:  # a concurrent sample keeps its own (dy.autobatch_map)
            return sample.checkpoint(self)
        self.__dict__.setdefault("_checkpoints", []).append(len(self.op))

    def revert(self) -> None:
        """DyNet's cg_revert(): drop every node recorded since the last checkpoint (a
        beam search scores hypotheses, then forgets them). Their expressions must not be
        used again; values of the kept nodes stay computed."""
        sample = SAMPLE.get()
        if sample is not None and sample.park is not None:
            n = sample.revert_to(self)  # never below another sample's nodes; None: nothing to drop
            if n is None:
                return
        else:
            checkpoints = self.__dict__.get("_checkpoints")
            if not checkpoints:
                raise DynagraphError(f"cg_revert() without a matching cg_checkpoint()\n  at {user_line()}")
            n = checkpoints.pop()
        self._sync_values()
        for column in (self.op, self.args, self.attrs, self.data, self.shape, self.depth, self.sig,
                       self.sig_part, self.needs_grad, self.blk, self.row):
            del column[n:]
        if COMPILED:
            self._truncate_table(n)  # the C node table mirrors args (kernels/cpython/node_table.c)
        self._leaves = {k: v for k, v in self._leaves.items() if v < n}
        self.reverts += 1
        self.grad_blocks = None
        if any(max(b.nodes) >= n for b in self.executed):
            self.invalidate()  # a batch mixed kept and dropped nodes: recompute when asked
        self.done = min(self.done, n)

    def rebind(self, params) -> None:
        """Point this graph's nodes of `params` at their current storage (after a planned
        dy.block stacked their values into one array)."""
        self._sync_values()
        for p in params:
            for key in (p, (p, False)):
                nid = self._leaves.get(key)
                if nid is not None:
                    self.blocks[self.blk[nid]] = one_row(p.values)

    # ----------------------------------------------------------------- evaluation
    def forward_to(self, nid: int) -> None:
        """Evaluate every pending node with id <= nid (DyNet's incremental_forward)."""
        if self.tracing:
            raise DynagraphError(f"a static subgraph is traced once and cannot read values: no .value(), "
                                 f"backward() or data-dependent control flow inside a block\n  at {user_line()}")
        if self.retired:
            raise StaleExpressionError(f"stale expression: its graph (version {self.version}) was "
                                       f"replaced by renew_cg()\n  used at {user_line()}")
        if nid >= self.done:
            if nid < len(self.blk) and self.blk[nid] >= 0:
                return  # evaluated: `done` stays at an earlier node that dy.phase deferred
            sample = SAMPLE.get()
            if sample is not None and sample.park is not None:
                sample.park(self, nid)  # a concurrent sample waits for the shared chunk (dy.autobatch_map)
                if nid < self.done or (nid < len(self.blk) and self.blk[nid] >= 0):
                    return
            self._sync_values()
            _engine.forward(self, nid)

    def forward(self, expr: "ExprBase | None" = None) -> None:
        """Evaluate all pending nodes (or those up to `expr`) as one scheduled chunk."""
        if len(self.op):
            self.forward_to(expr.i if expr is not None else len(self.op) - 1)

    evaluate_pending = forward

    def evaluate_pending_except(self, defer: set, targets=()) -> None:
        """evaluate_pending(), leaving the nodes in `defer` and their pending users pending
        unless `targets` need them (dy.phase inside dy.autobatch_map)."""
        n = len(self.op)
        if not n or n <= self.done:
            return
        sample = SAMPLE.get()
        if sample is not None and sample.park is not None:  # nested map: wait for the outer chunk
            sample.park(self, n - 1)
            if n <= self.done:
                return
        if self.tracing or self.retired:
            return self.forward_to(n - 1)  # the same errors
        self._sync_values()
        _engine.forward(self, n - 1, defer, targets)

    def invalidate(self) -> None:
        """Forget computed values so the next evaluation recomputes (after parameter changes)."""
        self._sync_values()
        leaves = [i for i, op in enumerate(self.op) if op.leaf]
        # parameters re-read their storage: a planned dy.block may have moved it (stacked weights)
        self.blocks = [one_row(self.attrs[i][1].values) if self.op[i] is PARAMETER or self.op[i] is LOOKUP_TABLE
                       else self.blocks[self.blk[i]] for i in leaves]
        self._block_param = {k: self.attrs[i][1] for k, i in enumerate(leaves)}
        self.blk = [-1] * len(self.op)
        for k, i in enumerate(leaves):
            self.blk[i] = k
        self.done = 0
        self.executed = []
        self.scheduled = []
        self.grad_blocks = None

    def set_data(self, nid: int, data: Any) -> None:
        """Replace node nid's payload (an input's values, a lookup's or pick's index) and
        forget the values of nid and of every node computed from it, so the next evaluation
        recomputes only those (DyNet's Expression.set on a graph built once)."""
        if self.retired:
            raise StaleExpressionError(f"stale expression: its graph (version {self.version}) was "
                                       f"replaced by renew_cg()\n  used at {user_line()}")
        op = self.op[nid]
        if op.check is not None:
            try:
                op.check(self.attrs[nid], data, *[self.shape[i] for i in self.args[nid]])
            except (IndexError, ValueError) as e:
                raise self._op_error(op, self.args[nid], e) from None
        self._sync_values()
        self.data[nid] = data
        # A trainer may have updated the parameters since the last evaluation: like DyNet
        # (whose set() invalidates the whole graph), nodes computed from updatable
        # parameters recompute too. Leaves re-read their storage and are never recomputed.
        affected = {nid}
        for key, leaf in self._leaves.items():
            self.blocks[self.blk[leaf]] = one_row(self.attrs[leaf][1].values)
            if self.needs_grad[leaf]:
                affected.add(leaf)
        args = self.args
        for j in range(min(affected) + 1, len(self.op)):
            for a in args[j]:
                if a in affected:
                    affected.add(j)
                    break
        for j in affected:
            if not self.op[j].leaf:
                self.blk[j] = -1
        # a batch all of whose nodes are stale is dropped (its value block with it), so a graph
        # re-evaluated many times does not grow; a mixed batch stays for its valid rows, and
        # its stale rows only ever receive zero gradient (their users are recomputed elsewhere)
        kept = []
        for rec in self.executed:
            nodes = rec.nodes
            if all(n in affected for n in nodes):
                for b in (rec.bids if hasattr(rec, "bids") else (rec.block,)):
                    self.blocks[b] = None
            else:
                kept.append(rec)
        self.executed = kept
        self.scheduled = None  # executed_batches() reads the kept records
        self.done = min(self.done, min(j for j in affected if not self.op[j].leaf))
        self.grad_blocks = None

    def backward(self, expr: "ExprBase", full: bool = False) -> None:
        overlap.wait_for(self)  # a second backward() of this graph: the first must finish
        sample = SAMPLE.get()
        if sample is not None and sample.park is not None:  # other samples are still recording
            raise DynagraphError(f"backward() inside a concurrent dy.autobatch_map sample: return the loss "
                                 f"and call backward() on their sum after the map\n  at {user_line()}")
        self.forward_to(expr.i)
        if self.shape[expr.i] != (1,):
            raise DynagraphError(f"backward() needs a scalar expression, got shape {self.shape[expr.i]}"
                                 f"\n  called at {user_line()}")
        loss = self.host_scalar(expr.i)
        if loss is None:  # a device value: one scalar to the host
            loss = float(to_numpy(self.value(expr.i)).reshape(-1)[0])
        if not math.isfinite(loss):
            # A gradient from an infinite or nan loss is meaningless; stop here, before any
            # parameter gradient is accumulated (check_validity finds the producing op).
            raise NonFiniteError(f"backward() from a non-finite loss ({loss}) computed by "
                                 f"{self.op[expr.i].name}; no gradient was accumulated (renew_cg("
                                 f"check_validity=True) names the op that first produced it)"
                                 f"\n  called at {user_line()}")
        self.grad_full = full
        _engine.backward(self, expr.i, full)

    def leaf_param(self, block: int):
        """The Parameters/LookupParameters whose storage is value block `block`."""
        return self._block_param[block]

    def value(self, nid: int):
        return self.blocks[self.blk[nid]][self.row[nid]]

    def host_scalar(self, nid: int) -> float | None:
        """The first element of evaluated node nid as a float (a loss: its only one), read
        straight from its block when that is a host array (once per sentence in per-sentence
        programs); None for a device array, which the caller transfers explicitly."""
        block = self.blocks[self.blk[nid]]
        if type(block) is np.ndarray:  # row r's first element is flat index r * (elements per row)
            return float(block.item(self.row[nid] * (block.size // block.shape[0])))
        return None

    def gradient(self, nid: int):
        self._sync_values()
        if self.grad_blocks is None:
            raise DynagraphError("gradient() needs a backward() call on this graph first")
        b = self.blk[nid]  # a block made after the last backward() has no gradient: zero
        g = self.grad_blocks[b] if 0 <= b < len(self.grad_blocks) else None
        # A batch may compute rows that need no gradient; like DyNet (and "none"), report zero.
        if g is None or not (self.needs_grad[nid] or self.grad_full):
            return np.zeros(self.shape[nid], dtype=self.dtype)
        return np.array(to_numpy(g[self.row[nid]])).reshape(self.shape[nid])

    def __len__(self) -> int:
        return len(self.op)

    # ------------------------------------------------------------ default graph
    def __enter__(self) -> "ComputationGraph":
        _, stack, default = _state.get() or _EMPTY
        _state.set((self, stack + (self,), default))
        return self

    def __exit__(self, *exc) -> None:
        _, stack, default = _state.get() or _EMPTY
        k = len(stack) - 1 - stack[::-1].index(self)  # the innermost entry of this graph
        stack = stack[:k] + stack[k + 1:]
        _state.set((stack[-1] if stack else default, stack, default))

    def renew(self, *a, **k) -> "ComputationGraph":
        return renew_cg(*a, **k)

    def print_batches(self, limit: int = 200) -> None:
        """Print each executed batch with its op and size (what was and was not batched)."""
        print(self.stats.describe_batches(limit))

    def pending_nodes(self) -> list[int]:
        """Recorded non-leaf nodes without a value: what the next evaluation schedules."""
        self._sync_values()
        return [i for i in range(self.done, len(self.op)) if not self.op[i].leaf and self.blk[i] < 0]

    def executed_batches(self) -> list[list[int]]:
        """Node ids of every forward batch run so far, in execution order, as the scheduler made
        them: a batch the backend ran in parts (executor.SPLIT_MAX, GROUP_MAX) is one batch here
        and in stats.batches, its parts are counted in stats.kernel_calls; a fused run
        contributes each of its batches. What dy.viz draws for an evaluated graph."""
        if self.scheduled is not None:
            return [list(b) for b in self.scheduled]
        out: list[list[int]] = []
        for record in self.executed:
            steps = getattr(record, "steps", None)  # a run (runs.ExecutedRun) holds several batches
            out.extend([list(s) for s in steps] if steps is not None else [list(record.nodes)])
        return out

    def print_graph(self) -> str:
        lines = []
        for i, op in enumerate(self.op):
            lines.append(f"N{i} = {op.name}({', '.join(f'N{a}' for a in self.args[i])}) {self.shape[i]}"
                         f" depth={self.depth[i]}")
        return "\n".join(lines)


_RANDOM_KEY = object()  # data placeholder replaced by a per-node random key


def draw_rand_base() -> int:
    """A graph's random key base, drawn from the seeded stream when it first records a random op."""
    return int(config.rng.integers(1, 2 ** 40)) << 20


def needed_within(args, within: set, targets) -> set:
    """The nodes of `within` that `targets` need: the targets in it and, walked back through
    `args`, every node of it they read (dy.phase: the deferred nodes a value read waits for)."""
    needed = {t for t in targets if t in within}
    stack = list(needed)
    while stack:
        for a in args[stack.pop()]:
            if a in within and a not in needed:
                needed.add(a)
                stack.append(a)
    return needed


def random_key():
    """The data of a random op: a per-node key, or inside a dy.autobatch_map sample the next key
    of that sample's own stream, so a sample draws the same masks whatever runs beside it."""
    sample = SAMPLE.get()
    return _RANDOM_KEY if sample is None else sample.next_key()
class IndexSlot:
    """A runtime index (word id, label) inside a static subgraph being traced."""
    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k

    def __repr__(self) -> str:
        return f"<index slot {self.k}>"


# ----------------------------------------------------------------- default graph
# Context-local, so per thread, per greenlet (greenlet >= 1.0) and per asyncio task: two threads
# each with its own graph never see each other's `with cg:` or renew_cg(). A new thread starts
# with no `with` graph and its own default graph. Immutable values (a tuple, a graph), so a
# copied context (asyncio, dy.autobatch_map's samples) never shares a mutable stack.
# One value, (current graph, `with` stack, default graph), so current() is a single lookup.
# The default graph is made on first use (None until then).
_state: ContextVar[tuple | None] = ContextVar("dynagraph_graph_state", default=None)
GRAPH_STATE = _state  # read by the compiled leaf recorder (recording.leaf_recorder)
_EMPTY = (None, (), None)
# The dy.autobatch_map sample this code runs as (None outside a map): an object with
# park(cg, nid) (None when samples run one by one) and next_key() (its random stream).
SAMPLE: ContextVar[Any] = ContextVar("dynagraph_sample", default=None)


def current() -> ComputationGraph:
    """The graph that new leaf expressions go to: innermost `with cg:` or the default."""
    state = _state.get()
    if state is not None and state[0] is not None:
        return state[0]
    g = ComputationGraph()  # no `with` graph and no default yet: this context's own default
    _state.set((g, (), g))
    return g


def renew_cg(immediate_compute: bool = False, check_validity: bool = False, autobatching=None,
             scheduler=None) -> ComputationGraph:
    """Retire the default graph and start a new one. `scheduler` picks the batching policy."""
    if autobatching is not None and scheduler is None:
        scheduler = config.scheduler if autobatching else "none"
    _, stack, old = _state.get() or _EMPTY
    if old is not None:
        old.retired = True
    g = ComputationGraph(scheduler, immediate_compute, check_validity)
    _state.set((stack[-1] if stack else g, stack, g))
    return g


def cg() -> ComputationGraph:
    return current()


def cg_checkpoint() -> None:
    current().checkpoint()


def cg_revert() -> None:
    current().revert()


def cg_version() -> int:
    return current().version
