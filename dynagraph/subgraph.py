"""Static subgraphs: a block is traced once, and each call adds one coarse node.

    @dy.block
    def cell(x, h_prev, c_prev):          # expressions in, expressions out
        ...                                # plain dy.* code, parameters by closure
        return h, c

    h, c = cell(x, h, c)                   # in per-sample code: one node, not ~17

Tracing runs the function once per distinct argument signature in a private
graph, with placeholders for expression arguments and index slots for int
arguments (word ids, labels). The trace becomes a `Plan`: an ordered list of op
steps. A batch of B calls runs every step once over all B instances, forward
and backward, so recording, scheduling and executor overhead are paid per call
instead of per op. Parameters used inside the block become shared arguments of
the coarse node, so its signature includes their identity and schedulers batch
calls like any other node. Indices are checked against the traced shapes when
the call is recorded, never inside a kernel.

A coarse node's value is the concatenation of the block's outputs, flattened;
each output is a cheap `block_output` view node that batches across calls. A
block with one output needs no view: its coarse node's value is that output, so
a call adds one node, not two (recording, scheduling and the executor's batches
all scale with the node count).
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from .backends import get_backend
from .config import config
from .errors import DynagraphError, DynagraphIndexError, user_line
from .expression import Expression, record
from .fusion import slices_first
from .graph import ComputationGraph, IndexSlot, current
from .memory.layout import plan_layout
from .ops.base import CHEAP, GEMM, OpDef, Sliced, size_of
from .program import MODES, Grads as _Grads, Program, UnitGrads, step_backward, step_forward
from .stats import count_block_copies

try:  # optional, compiled beside the coarsening pass (setup.py); its twin is Block._call_py
    if os.environ.get("DYNAGRAPH_BOOKKEEPING", "").lower() == "python":
        raise ImportError("DYNAGRAPH_BOOKKEEPING=python")
    from . import _coarsen as _native
    _BlockBase = _native.BlockCall
except (ImportError, AttributeError):
    _native = None
    _BlockBase = object

PLACEHOLDER = OpDef("placeholder", lambda a, *s: a[0], None, None, leaf=True, batchable=False, cost=CHEAP)

_RANDOM_STRIDE = 1 << 12  # random keys of a call's inner nodes: call key * stride + step (mod 2^64)
_MASK64 = (1 << 64) - 1


def _output_forward(xp, a, data, x):
    start, shape = a
    return x[:, start:start + size_of(shape)].reshape((x.shape[0],) + shape)


def _output_backward(xp, a, data, xs, y, g, need):
    start, shape = a
    n = size_of(shape)
    return (Sliced((slice(start, start + n),), g.reshape(g.shape[0], n), xs[0].shape),)


BLOCK_OUTPUT = OpDef("block_output", lambda a, s: a[1], _output_forward, _output_backward, cost=CHEAP)
if _native is not None:
    _native.block_configure(Expression, current, BLOCK_OUTPUT)


class Plan:
    """One traced block for one argument signature: the steps, run over a whole batch."""

    def __init__(self, name: str, trace: ComputationGraph, inputs: list[int], outputs: list[int],
                 mode: str | None = None, fuse: bool = False, piece_major: bool = True,
                 direct: bool = False):
        """direct: a plan with one output makes its coarse node's value that output
        (shape and all) instead of the flattened concatenation read through views."""
        self.name = name
        self.inputs = inputs
        self.in_shapes = [trace.shape[i] for i in inputs]  # lets dynagraph.memory plan a layout
        self.outputs = outputs
        live = _reachable(trace, outputs)
        self.leaves = [i for i in live if trace.op[i].leaf and trace.op[i] is not PLACEHOLDER]
        self.leaf_params = [trace.attrs[i][1] for i in self.leaves]
        self.leaf_update = [_leaf_update(trace, i) for i in self.leaves]
        self.steps = []
        self.checks = []
        self.random = False
        for i in live:
            op = trace.op[i]
            if op.leaf:
                continue
            d = trace.data[i]
            if type(d) is IndexSlot:
                spec = ("slot", d.k)
                if op.check is not None:
                    self.checks.append((op, trace.attrs[i], d.k, [trace.shape[a] for a in trace.args[i]]))
            elif op.uses_data and isinstance(d, (int, np.integer)) and op.name in _RANDOM_OPS:
                spec = ("random", len(self.steps))
                self.random = True
            else:
                spec = ("const", d)
            self.steps.append((i, op, trace.args[i], trace.attrs[i], spec, trace.shape[i]))
        # no expression argument and no randomness: a call's outputs are a function of its int
        # indices alone (a leaf cell of a word id), so a batch runs once per distinct index tuple
        self.by_index = not inputs and not self.random
        self.out_shapes = [trace.shape[o] for o in outputs]
        self.out_sizes = [size_of(s) for s in self.out_shapes]
        self.total = sum(self.out_sizes)
        self.direct = direct and len(outputs) == 1
        starts = np.cumsum([0] + self.out_sizes[:-1]).tolist()
        self.out_attrs = [(int(st), shape) for st, shape in zip(starts, self.out_shapes)]  # block_output attrs
        self.blocks_grad = {i for i in live if trace.op[i].blocks_grad}
        self._leaf_cache = None
        self._needs_memo: dict = {}
        self._checked: set = set()  # index tuples that passed check(): a word id is checked once
        self._calls = [0, 0, {}]  # by_index: [graph version, reverts, {index tuple: the call's node ids}]
        self.single = False       # Block._trace: the traced function returned one expression
        self.piece_major = piece_major   # see program.Program
        self.set_mode(mode, fuse)

    def set_mode(self, mode: str | None, fuse: bool = False) -> None:
        """How the steps run over a batch (see dynagraph.program): None = one kernel per
        step; "naive" = same-signature steps batched, operands copied together;
        "planned" = batched in the PQ-tree layout's order, operands read in place.
        fuse: with "planned", chains of elementwise steps run as one fused kernel."""
        if mode not in MODES:
            raise DynagraphError(f"block {self.name}: plan must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.layout = plan_layout(self) if mode == "planned" else None
        self.program = Program(self, mode, self.layout, fuse and mode == "planned",
                               self.piece_major) if mode is not None else None
        kernels = len(self.program.units) if self.program is not None else len(self.steps)
        node_shape = self.out_shapes[0] if self.direct else (self.total,)
        self.op = OpDef(f"block:{self.name}", lambda a, *s: node_shape, self.forward, self.backward,
                        uses_data=True, saves_ctx=True, cost=GEMM, inner_kernels=max(1, kernels))
        self.refresh_fast()

    def refresh_fast(self) -> None:
        """What the compiled call path (kernels/cpython/block_call.c) reads of this plan."""
        self._fast = (self.op, bool(self.checks), self._checked, self.by_index, self.direct, self.single,
                      tuple(self.out_attrs), self.random)

    # ------------------------------------------------------------------ running
    def _data(self, spec, data: list):
        kind, v = spec
        if kind == "slot":
            return [call[v] for call in data]
        if kind == "random":
            return [(call[-1] * _RANDOM_STRIDE + v) & _MASK64 for call in data]
        return [v] * len(data)

    def run_steps(self, be, xs, data_of: Callable) -> tuple[dict, list]:
        """Every step once over the batch; xs are the inputs then the leaves.
        Returns the values by trace id and what backward needs per step."""
        vals = dict(zip(self.inputs + self.leaves, xs))
        kernels = be.forward_kernels  # the backend's measured-faster overrides
        return vals, [step_forward(be, kernels, step, vals, data_of) for step in self.steps]

    def grad_steps(self, be, acc: "_Grads", saved: list, need: tuple, divert: Callable | None = None) -> list:
        """Replay the steps in reverse from the output gradients in `acc`; returns the
        gradients of the inputs then the leaves (see program.step_backward for `divert`)."""
        needs, kernels = self._needs(need), be.backward_kernels
        for n in range(len(self.steps) - 1, -1, -1):
            step_backward(be, kernels, self.steps[n], saved[n], acc, needs, divert, n)
        return [acc.result(i) for i in self.inputs + self.leaves]

    def forward(self, xp, attrs, data, *xs):
        inverse = None
        if self.by_index and len(data) > 1 and xp is np:
            data, inverse = _distinct_calls(data)
        y, saved, leads = self._forward_calls(xp, data, xs)
        if inverse is not None:
            y = xp.take(y, inverse, axis=0)  # distinct calls' rows -> every call: one copy
        return y, (saved, leads, inverse)

    def _forward_calls(self, xp, data: list, xs: tuple) -> tuple:
        B = len(data)
        data_of = lambda spec: self._data(spec, data)  # noqa: E731
        if self.program is not None:
            vals, saved = self.program.run(get_backend(), xs, data_of, B)
            c = self.program.counts
            count_block_copies(c.forward_copies, c.forward_bytes, self.program.saved(B, _itemsize(xs)))
        else:
            vals, saved = self.run_steps(get_backend(), xs, data_of)
        if self.direct:
            v = vals[self.outputs[0]]
            return xp.broadcast_to(v, (B,) + v.shape[1:]), saved, [v.shape[0]]
        outs = [xp.broadcast_to(vals[o], (B,) + vals[o].shape[1:]).reshape(B, -1) for o in self.outputs]
        # an output computed from parameters alone has one shared row: backward sums into it
        return xp.concatenate(outs, axis=1), saved, [vals[o].shape[0] for o in self.outputs]

    def backward(self, xp, attrs, data, xs, y, g, need, ctx=None):
        B = len(data)
        g = g.reshape(B, -1)  # (B, total), or (B,) + the output's shape for a direct plan
        ctx, leads, inverse = ctx
        if inverse is not None:  # the forward ran once per distinct call: sum its calls' gradients
            g = _sum_per_call(g, inverse)
            B = g.shape[0]
        acc = _Grads(xp) if self.program is None else UnitGrads(xp, self.program, B, g.dtype)
        start = 0
        for o, n, shape, lead in zip(self.outputs, self.out_sizes, self.out_shapes, leads):
            acc.add(o, g[:, start:start + n].reshape((B,) + shape), (lead,) + shape)
            start += n
        if self.program is not None:
            grads = tuple(self.program.grad(get_backend(), acc, ctx, need))
            c = self.program.counts
            count_block_copies(c.backward_copies, c.backward_bytes, self.program.saved(B, g.dtype.itemsize, True))
            return grads
        return tuple(self.grad_steps(get_backend(), acc, ctx, need))

    def _needs(self, need: tuple) -> dict:
        """Which trace nodes need a gradient, given which coarse arguments do (memoised:
        a model asks the same few questions every step). Callers must not modify it."""
        key = tuple(bool(n) for n in need)
        needs = self._needs_memo.get(key)
        if needs is None:
            needs = {i: n for i, n in zip(self.inputs + self.leaves, key)}
            for i, op, args, a, spec, shape in self.steps:
                needs[i] = i not in self.blocks_grad and any(needs.get(j, False) for j in args)
            self._needs_memo[key] = needs
        return needs

    def leaf_ids(self, cg: ComputationGraph) -> tuple:
        """The graph's node ids of this plan's parameters, cached per graph (serial numbers
        are unique; a cg_revert() may drop the nodes, so it counts too)."""
        cached = self._leaf_cache
        if cached is not None and cached[0] == cg.version and cached[1] == cg.reverts:
            return cached[2]
        ids = tuple(cg.leaf(p, upd) for p, upd in zip(self.leaf_params, self.leaf_update))
        self._leaf_cache = (cg.version, cg.reverts, ids)
        return ids

    def check(self, values: tuple) -> None:
        """Raise DynagraphIndexError naming the op and user line if an index is out of range.
        The checks depend only on the traced shapes, so a tuple that passed once passes again."""
        checked = self._checked
        if values in checked:
            return
        for op, a, k, shapes in self.checks:
            try:
                op.check(a, values[k], *shapes)
            except (IndexError, ValueError) as e:
                raise DynagraphIndexError(f"block {self.name}: {op.name}({', '.join(map(str, shapes))}) "
                                          f"index argument {k}: {e}\n  recorded at {user_line()}") from None
        if len(checked) < _CHECKED_MAX:
            checked.add(values)


def _itemsize(xs: tuple) -> int:
    """The element size of a call's arrays (its parameters' where it has no expression argument)."""
    for x in xs:
        dt = getattr(x, "dtype", None)
        if dt is not None:
            return dt.itemsize
    return 8


def _distinct_calls(data: list) -> tuple:
    """(the distinct calls' data in first-seen order, each call's position among them), or
    (data, None) where too few calls repeat for the gather and the gradient sum to pay."""
    pos: dict = {}
    at = [pos.setdefault(d, len(pos)) for d in data]
    if len(pos) > 0.9 * len(data):
        return data, None
    return list(pos), np.array(at, dtype=np.intp)


def _sum_per_call(g: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """Per distinct call, the sum of its calls' gradient rows (in call order)."""
    out = np.zeros((int(inverse.max()) + 1,) + g.shape[1:], dtype=g.dtype)
    row_add = get_backend().row_add
    if row_add is not None and g.dtype in (np.float32, np.float64):
        row_add(out, inverse, np.ascontiguousarray(g))  # one pass in C, repeated rows included
    else:
        np.add.at(out, inverse, g)
    return out


_CHECKED_MAX = 1 << 16  # remembered valid index tuples per plan (a vocabulary's worth)

_RANDOM_OPS = {"dropout", "dropout_dim", "dropout_batch", "noise", "random_normal", "random_uniform",
               "random_bernoulli"}


def _leaf_update(trace: ComputationGraph, i: int) -> bool:
    """Was leaf i recorded as a trained use (W) or a constant one (const_parameter(W))?"""
    return trace.sig_part[i][2]


def _reachable(trace: ComputationGraph, outputs: list[int]) -> list[int]:
    seen = set()
    stack = list(outputs)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(trace.args[i])
    return sorted(seen)


class Block(_BlockBase):
    """A function traced once per argument signature and called as one coarse node.

    Calling it is the hot path of per-sample code (thousands of calls per graph): where
    dynagraph._coarsen is built, the call is its base type's, compiled with no Python frame
    (kernels/cpython/block_call.c); the cases it leaves (a new argument signature to trace,
    numpy integers, several graphs, a retired graph, random steps) come to `_call_py`."""

    def __init__(self, fn: Callable, name: str | None = None, plan: str | None = "default", fuse: bool = True,
                 share: bool = True):
        if plan == "default":
            plan = config.block_plan
        if plan not in MODES:
            raise DynagraphError(f"dy.block: plan must be one of {MODES}, got {plan!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "block")
        self.mode, self.fuse, self.share = plan, fuse, share
        self._plans: dict = {}

    def _trace(self, key: tuple) -> Plan:
        trace = ComputationGraph(scheduler="none")
        trace.tracing = True
        inputs, slot_args = [], []
        with trace:
            for k, spec in enumerate(key):
                if spec == "index":
                    slot_args.append(IndexSlot(len([s for s in key[:k] if s == "index"])))
                else:
                    nid = trace.placeholder(PLACEHOLDER, spec)
                    inputs.append(nid)
                    slot_args.append(Expression(trace, nid))
            result = self.fn(*slot_args)
        single = type(result) is Expression
        outs = [result] if single else list(result) if isinstance(result, (tuple, list)) else [result]
        if not outs or any(type(o) is not Expression or o.cg is not trace for o in outs):
            raise DynagraphError(f"block {self.name} must return expressions computed from its arguments")
        out_ids = [o.i for o in outs]
        canon = slices_first(trace, inputs + out_ids) if self.fuse else None  # one spelling for the fusers
        if canon is not None:
            trace, m = canon
            inputs, out_ids = [m[i] for i in inputs], [m[o] for o in out_ids]
        plan = Plan(self.name, trace, inputs, out_ids, self.mode, self.fuse, direct=True)
        plan.single = single
        plan.refresh_fast()
        return plan

    if _BlockBase is object:  # no compiled call: the Python twin does every call
        def __call__(self, *args):
            return self._call_py(args)

    def _call_py(self, args: tuple):
        """__call__'s Python twin: one pass over the arguments, then one dict lookup for the
        plan; everything else is cached on it."""
        cg, ids, key, values, mixed = None, [], [], [], False
        for a in args:  # argument ids, the trace key, the int indices, one graph or several
            if type(a) is Expression:
                acg = a.cg
                if cg is None:
                    cg = acg
                elif acg is not cg:
                    mixed = True
                ids.append(a.i)
                key.append(acg.shape[a.i])
            elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                values.append(int(a))
                key.append("index")
            else:
                raise TypeError(f"block {self.name}: arguments must be expressions or int indices, "
                                f"got {type(a).__name__}\n  at {user_line()}")
        key = tuple(key)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._trace(key)
            if plan.program is not None and plan.program.rehomed:
                (cg or current()).rebind(plan.program.rehomed)
        values = tuple(values)
        if cg is None:
            cg = current()
        if plan.by_index and self.share:  # a repeat of an earlier call in this graph (see below)
            memo = plan._calls
            if memo[0] == cg.version and memo[1] == cg.reverts and not cg.retired:
                nids = memo[2].get(values)
                if nids is not None:
                    if type(nids) is int:
                        return Expression(cg, nids)
                    if len(nids) == 2:
                        return Expression(cg, nids[0]), Expression(cg, nids[1])
                    return tuple([Expression(cg, i) for i in nids])
        if plan.checks:
            plan.check(values)
        if plan.random:
            values = values + (cg._rand_base + len(cg.op),)
        if mixed or cg.retired:
            node = record(plan.op, [a for a in args if type(a) is Expression] + self._leaves(plan, cg), (), values)
            cg, nid = node.cg, node.i
        elif plan.by_index and self.share:
            # outputs that are a function of the indices alone: a repeated call in this graph
            # returns the first call's expressions (one node, its gradient the users' sum)
            # (repeats returned above); node ids, not expressions: no reference to a retired graph
            memo = plan._calls
            if memo[0] != cg.version or memo[1] != cg.reverts:
                memo = plan._calls = [cg.version, cg.reverts, {}]
            out = self._record(plan, cg, ids, values)
            memo[2][values] = out.i if type(out) is Expression else tuple(o.i for o in out)
            return out
        else:
            return self._record(plan, cg, ids, values)
        return self._outputs(plan, cg, nid)

    @classmethod
    def _record(cls, plan, cg, ids: list, values: tuple):
        """Block.__call__'s recording of one call into cg (not mixed, not retired)."""
        cached = plan._leaf_cache  # plan.leaf_ids(cg), inline: it is asked once per call
        if cached is None or cached[0] != cg.version or cached[1] != cg.reverts:
            plan.leaf_ids(cg)
            cached = plan._leaf_cache
        return cls._outputs(plan, cg, cg.add(plan.op, tuple(ids) + cached[2], (), values))

    @staticmethod
    def _outputs(plan, cg, nid: int):
        """The call's outputs: the block node itself, or one BLOCK_OUTPUT view per output."""
        if plan.direct:
            out = Expression(cg, nid)
            return out if plan.single else (out,)
        add, src, attrs = cg.add, (nid,), plan.out_attrs
        if len(attrs) == 2:  # (h, c) of an LSTM cell: the common case, without a loop
            return (Expression(cg, add(BLOCK_OUTPUT, src, attrs[0])),
                    Expression(cg, add(BLOCK_OUTPUT, src, attrs[1])))
        outs = [Expression(cg, add(BLOCK_OUTPUT, src, a)) for a in attrs]
        return outs[0] if plan.single else tuple(outs)

    @staticmethod
    def _leaves(plan, cg) -> list:
        return [Expression(cg, cg.leaf(p, upd)) for p, upd in zip(plan.leaf_params, plan.leaf_update)]


def block(fn: Callable | None = None, *, name: str | None = None, plan: str | None = "default",
          fuse: bool = True, share: bool = True):
    """Decorator: `@dy.block` or `@dy.block(name="cell", plan="naive")`. `plan` chooses how
    the block's steps run over a batch of calls: "planned", "naive" or None (one kernel per
    step); the default is `dy.config.set(block_plan=...)` (initially "planned"). With
    "planned", `fuse` runs chains of elementwise steps as one fused kernel. `share`: a block
    whose arguments are all int indices and that draws no random numbers (a leaf cell of a
    word id) returns, for a call repeating an earlier call's indices in the same graph, that
    call's expressions (same values; one node whose gradient is its users' sum)."""
    if fn is None:
        return lambda f: Block(f, name, plan, fuse, share)
    return Block(fn, name, plan, fuse, share)
