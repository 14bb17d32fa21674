"""Fused elementwise chains: a straight-line program of elementwise ops in one C call.

A static subgraph's cell is mostly elementwise after its GEMM (a TreeLSTM cell: five
gate nonlinearities, products, sums, tanh, ...). Op by op, numpy pays a call and a
temporary per op; `FusedChain` runs the whole program forward in one call of
kernels/fused.inc and its backward in another, over tiles of each row so every op is
a short vectorized loop on values still in L1.

    chain = FusedChain([(OPS["logistic"], (), [0]), (OPS["tanh"], (), [1]),
                        (OPS["cmult"], (), [2, 3])], n_inputs=2)
    i, u, c = chain.forward(be, [g[:, :H], g[:, H:2*H]])     # strided slices: not copied
    gi, gu = chain.backward(be, ins, [i, u, c], [None, None, dc], [True, True])

Registers: input k is register k, step m's value is register n_inputs + m.

Inputs have a leading batch axis B or 1 (shared by the batch, e.g. a parameter); a
per-row input may be a 2-D view whose rows are contiguous but further apart than
their length (a column slice of a GEMM output), which the C path reads in place.

The reference path runs every op's own forward and backward step by step, as
Plan.run_steps/grad_steps do (a step whose arguments are all shared keeps a leading
axis of 1; a shared argument's gradient is summed over the batch where it is used;
unlike Plan, a shared step's gradient from outside is summed over the batch on arrival).
It runs where the backend lacks the `fused_chains` capability (the numpy backend,
or the cpu backend without its compiled module), for dtypes the capability does not
take, and it is what the C path (backends/cpu/chains.py) is tested against.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .ops.base import OPS, reduce_to, size_of

from .backends.optable import ARITY, BINARY, FUSED_MAX_REGS as MAX_REGS, FUSED_TILE as TILE, NARY, OPCODE  # noqa: F401
from .backends.optable import UNARY, WITH_CONST  # noqa: F401  (the op table lives with the backends)

if TYPE_CHECKING:
    from .graph import ComputationGraph


def _const_ok(attrs) -> bool:
    # Only Python numbers: numpy mixes them into float32 arrays as float32 (a weak
    # scalar), whereas a numpy float64 scalar would promote the op to float64.
    return isinstance(attrs, tuple) and len(attrs) >= 1 and type(attrs[0]) in (int, float)


def fusable(op, attrs: tuple, arg_shapes: list, out_shape: tuple) -> bool:
    """True when this op can be a step of a FusedChain: an elementwise op of
    ops/elementwise.py whose argument shapes all equal out_shape (per-instance shapes,
    without the batch axis), i.e. no broadcasting inside an instance."""
    name = getattr(op, "name", None)
    arity = ARITY.get(name)
    if arity is None or OPS.get(name) is not op:
        return False
    if len(arg_shapes) != arity if arity else not arg_shapes:
        return False
    out = tuple(out_shape)
    if any(tuple(s) != out for s in arg_shapes):
        return False
    return _const_ok(attrs) if name in WITH_CONST else True


def _constant(name: str, attrs: tuple, nargs: int) -> float:
    if name in WITH_CONST:
        return float(attrs[0])
    return 1.0 / nargs if name == "average" else 0.0


class FusedChain:
    """A straight-line elementwise program: steps[m] = (op, attrs, args), where arg k
    < n_inputs is input k and k >= n_inputs the output of step k - n_inputs. Every
    value has the same per-instance size; `shape` is the per-instance shape of the
    outputs (default: that of the first input)."""

    def __init__(self, steps: list, n_inputs: int, shape: tuple | None = None):
        if int(n_inputs) < 1 or not steps:
            raise ValueError(f"a fused chain needs at least one input and one step, got {n_inputs} and {len(steps)}")
        self.n_inputs = nin = int(n_inputs)
        if nin + len(steps) > MAX_REGS:
            raise ValueError(f"a fused chain holds at most {MAX_REGS} values, got {nin + len(steps)}")
        self.shape = None if shape is None else tuple(int(s) for s in shape)
        self.steps: list = []
        code: list = []
        consts: list = []
        for m, step in enumerate(steps):
            op, attrs, args = step
            args = [_reg(a, nin + m, m) for a in args]
            if not fusable(op, attrs, [()] * len(args), ()):
                raise ValueError(f"step {m}: {getattr(op, 'name', op)!r} with {len(args)} argument(s) "
                                 f"and attrs {attrs!r} is not a fusable elementwise op")
            self.steps.append((op, attrs, args))
            code += [OPCODE.get(op.name, -1), len(args), *args]
            consts.append(_constant(op.name, attrs, len(args)))
        # nobackprop blocks gradients (Plan._needs); an op without backward passes none
        self._blocks = [op.blocks_grad for op, _, _ in self.steps]
        self._nograd = [op.backward is None for op, _, _ in self.steps]
        self._code = np.array(code, np.int64)
        self._consts = np.array(consts, np.float64)
        self._live_cache: dict = {}
        self._records: dict = {}  # id(first output) -> _Record of a compiled forward
        self._kernel = self._kernel_of = None  # the program compiled by a backend's fused_chains

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        return f"FusedChain({' '.join(op.name for op, _, _ in self.steps)}; {self.n_inputs} inputs)"

    # ------------------------------------------------------------------ API
    def forward(self, be, ins: list) -> list:
        """One array per step, (B, *shape), C-contiguous; B the largest leading axis."""
        B, shape, n = self._geometry(ins)
        dt = self._c_dtype(be, ins) if B and n else None
        if dt is None:
            return self._forward_ref(be.xp, ins, B, shape)
        return self._forward_c(self._compiled(be), ins, B, shape, n, dt)

    def backward(self, be, ins: list, outs: list, gouts: list, need: list) -> list:
        """Per input: None where need[k] is false, else its gradient with the input's own
        leading axis (a shared input's gradient summed over the batch). gouts[m] is the
        gradient of step m's output from outside the chain, or None."""
        B, shape, n = self._geometry(ins)
        ns = len(self.steps)
        if len(outs) != ns or len(gouts) != ns or len(need) != self.n_inputs:
            raise ValueError(f"backward of {ns} steps over {self.n_inputs} inputs got {len(outs)} outputs, "
                             f"{len(gouts)} output gradients and {len(need)} need flags")
        rec = self._own_block(outs)
        # the forward's own outputs are views of one block: checking the first checks all
        _check_rows(outs[:1] if rec is not None else outs, (B,), n, "output")
        _check_rows(gouts, (1, B), n, "output gradient")
        need = tuple(bool(x) for x in need)
        if not any(need):
            return [None] * self.n_inputs
        present = [g for g in gouts if g is not None]
        dt = self._c_dtype(be, list(ins) + present + ([rec.block()] if rec is not None else list(outs))) \
            if B and n else None
        if dt is None:
            return self._backward_ref(be.xp, ins, outs, gouts, need, B, shape)
        return self._backward_c(self._compiled(be), ins, outs, rec, gouts, need, B, n, dt)

    def _compiled(self, be):
        """This program compiled by be.fused_chains (once per backend object)."""
        chains = be.fused_chains
        if self._kernel_of is not chains:
            self._kernel = chains.compile(self._code, self._consts, self.n_inputs, len(self.steps))
            self._kernel_of = chains
        return self._kernel

    def _own_block(self, outs: list):
        """The record of the forward that returned `outs` (the same objects, in order),
        or None: then their layout is known without inspecting each."""
        if not outs:
            return None
        rec = self._records.get(id(outs[0]))
        if rec is None or rec.block() is None or any(r() is not o for r, o in zip(rec.outs, outs)):
            return None
        return rec

    # ------------------------------------------------------------- checking
    def _geometry(self, ins: Sequence) -> tuple:
        if len(ins) != self.n_inputs:
            raise ValueError(f"fused chain takes {self.n_inputs} inputs, got {len(ins)}")
        try:
            leads = [x.shape[0] for x in ins]
        except (AttributeError, IndexError, TypeError):
            raise ValueError("fused chain inputs must be arrays with a leading batch axis") from None
        B = max(leads)
        shape = self.shape if self.shape is not None else tuple(ins[0].shape[1:])
        n = size_of(shape)
        for k, (x, lead) in enumerate(zip(ins, leads)):
            if (lead != B and lead != 1) or (x.size != lead * n if lead else size_of(x.shape[1:]) != n):
                raise ValueError(f"input {k} has shape {x.shape}; expected a leading axis of 1 or {B} "
                                 f"and {n} elements per instance")
        return B, shape, n

    def _c_dtype(self, be, arrays: list):
        """The array dtype when the C kernel can run all of `arrays`, else None."""
        chains = getattr(be, "fused_chains", None)
        if chains is None:
            return None
        dt = getattr(arrays[0], "dtype", None)
        if dt not in chains.dtypes:
            return None
        kind = chains.array_type
        for a in arrays:
            if type(a) is not kind or a.dtype != dt:
                return None
        return dt

    # ------------------------------------------------------------------ C path
    def _forward_c(self, kernel, ins: list, B: int, shape: tuple, n: int, dt) -> list:
        block, handles, copied = kernel.forward(ins, B, shape, n, dt)
        outs = list(block)
        recs = self._records
        if len(recs) >= _MAX_RECORDS:  # forwards never followed by a backward (inference)
            del recs[next(iter(recs))]
        recs[id(outs[0])] = _Record(None if copied else ins, handles, block, outs)
        return outs

    def _backward_c(self, kernel, ins, outs, rec, gouts, need, B, n, dt) -> list:
        if rec is not None:
            del self._records[id(outs[0])]  # each forward is differentiated once, as a rule
        same_ins = rec is not None and rec.ins is not None and all(r() is x for r, x in zip(rec.ins, ins))
        live = self._live(tuple(g is not None for g in gouts), need)
        return kernel.backward(ins, rec.handles if same_ins else None, rec.block() if rec is not None else None,
                               outs, gouts, live, need, B, n, dt)

    def _live(self, has_gout: tuple, need: tuple) -> np.ndarray:
        """Which registers carry a gradient, as Plan.grad_steps decides: a step's when
        it leads to an input that needs one and some gradient reaches it."""
        key = (has_gout, need)
        hit = self._live_cache.get(key)
        if hit is None:
            needed = self._needed(need)
            nin = self.n_inputs
            reached = list(has_gout)
            live = np.zeros(nin + len(self.steps), np.uint8)
            live[:nin] = need
            for m in range(len(self.steps) - 1, -1, -1):
                if not (reached[m] and needed[nin + m] and not self._nograd[m]):
                    continue
                live[nin + m] = 1
                for a in self.steps[m][2]:
                    if a >= nin:
                        reached[a - nin] = True
            hit = self._live_cache[key] = live
        return hit

    def _needed(self, need: tuple) -> list:
        """Plan._needs: a value needs a gradient when an input that needs one reaches it
        through ops that do not block gradients."""
        needed = list(need)
        for m, (op, attrs, args) in enumerate(self.steps):
            needed.append(not self._blocks[m] and any(needed[a] for a in args))
        return needed

    # -------------------------------------------------------- reference path
    def _values(self, xp, ins: list, B: int, shape: tuple) -> tuple:
        return [x.reshape((x.shape[0],) + shape) for x in ins], [x.shape[0] for x in ins]

    def _forward_ref(self, xp, ins: list, B: int, shape: tuple) -> list:
        vals, _ = self._values(xp, ins, B, shape)
        outs = []
        for op, attrs, args in self.steps:
            y = op.forward(xp, attrs, None, *[vals[a] for a in args])
            outs.append(_fresh(xp, y, (B,) + shape, vals))
            vals.append(y)
        return outs

    def _backward_ref(self, xp, ins, outs, gouts, need, B, shape) -> list:
        nin = self.n_inputs
        vals, leads = self._values(xp, ins, B, shape)
        for (op, attrs, args), y in zip(self.steps, outs):
            # a step over shared values only has a leading axis of 1 in Plan.run_steps
            lead = 1 if all(leads[a] == 1 for a in args) else B
            leads.append(lead)
            vals.append(y.reshape((y.shape[0],) + shape)[:lead])
        needed = self._needed(need)
        acc: dict = {}
        for m, g in enumerate(gouts):
            if g is None:
                continue
            g, lead = g.reshape((g.shape[0],) + shape), leads[nin + m]
            if g.shape[0] != lead:
                # a shared step's outside gradient is summed over the batch first: kept
                # with B rows, the batch sums of later contributions would broadcast
                # into every row and be counted B times. A (1, ...) gradient of a
                # per-row step applies to every row.
                g = reduce_to(g, (1,) + shape) if lead == 1 else xp.broadcast_to(g, (lead,) + shape)
            acc[nin + m] = g
        for m in range(len(self.steps) - 1, -1, -1):
            op, attrs, args = self.steps[m]
            gi = acc.pop(nin + m, None)
            if gi is None or op.backward is None or not needed[nin + m]:
                continue
            xs = [vals[a] for a in args]
            want = tuple(needed[a] for a in args)
            gxs = op.backward(xp, attrs, None, xs, vals[nin + m], gi, want)
            for a, x, gx, w in zip(args, xs, gxs, want):
                if gx is None or not w:
                    continue
                if x.shape[0] == 1 and gx.shape[0] != 1:
                    gx = reduce_to(gx, x.shape)  # a shared value: sum over the batch
                old = acc.get(a)
                acc[a] = gx if old is None else old + gx
        grads: list = []
        avoid = list(ins) + list(outs) + [g for g in gouts if g is not None]
        for k, x in enumerate(ins):
            if not need[k]:
                grads.append(None)
                continue
            g = acc.get(k)
            full = tuple(x.shape)
            grads.append(xp.zeros(full, x.dtype) if g is None else _fresh(xp, g, full, avoid + grads))
        return grads


# ------------------------------------------------------------------- helpers
_MAX_RECORDS = 64


class _Record:
    """What backward can reuse from a compiled forward, held weakly so that it keeps
    nothing alive: the inputs (when none was copied, the kernel's handles -- its pointer
    arrays -- stay valid while they live), the output block and each output view
    (outputs are recognised by identity)."""
    __slots__ = ("ins", "handles", "block", "outs")

    def __init__(self, ins: list | None, handles, block, outs: list):
        self.ins = None if ins is None else [weakref.ref(x) for x in ins]
        self.handles = handles
        self.block = weakref.ref(block)
        self.outs = [weakref.ref(o) for o in outs]


def _reg(a, bound: int, m: int) -> int:
    if isinstance(a, bool) or not hasattr(a, "__index__"):
        raise TypeError(f"step {m}: argument {a!r} is not a register index")
    a = int(a)
    if not 0 <= a < bound:
        raise ValueError(f"step {m}: argument {a} must name an input or an earlier step (0 <= arg < {bound})")
    return a


def _check_rows(arrs: list, leads: tuple, n: int, what: str) -> None:
    """Each array (or None) has a leading axis in `leads` and n elements per row."""
    for m, a in enumerate(arrs):
        if a is None:
            continue
        lead = a.shape[0] if getattr(a, "ndim", 0) else -1
        if lead not in leads or a.size != lead * n:
            raise ValueError(f"{what} {m} has shape {getattr(a, 'shape', None)}; expected a leading axis in "
                             f"{leads} and {n} elements per row")


def _fresh(xp, y, full: tuple, avoid: list):
    """y as a C-contiguous array of shape `full` that aliases nothing in `avoid` (an op
    may return its argument itself, or a view of it)."""
    if tuple(y.shape) == full and y.flags.c_contiguous and y.base is None and not any(y is a for a in avoid):
        return y
    return xp.array(xp.broadcast_to(y, full), order="C", copy=True)


# ------------------------------------------------------- spelling-independent traces
def _non_slice_use(T: "ComputationGraph", keep: Sequence[int], pick) -> list:
    """Per node of T, whether anything but a slice (`pick`) reads it, or it must survive (`keep`)."""
    non_slice_use = [False] * len(T.op)
    for i in range(len(T.op)):
        for a in T.args[i]:
            if T.op[i] is not pick:
                non_slice_use[a] = True
    for i in keep:
        non_slice_use[i] = True
    return non_slice_use


def slices_first(T: "ComputationGraph", keep: Sequence[int]) -> "tuple[ComputationGraph, dict] | None":
    """Trace T re-recorded with every slice taken before the elementwise ops it follows:
    pick_range(f(x), a, b) -> f(pick_range(x, a, b)) for a unary elementwise f, and
    pick_range(pick_range(x, a, b), c, d) -> pick_range(x, a + c, a + d).

    One nonlinearity over all gates followed by slices is then the same trace as one
    nonlinearity per gate slice, and a gate chain reads its slices straight from the
    GEMM output: the fusers (FusedChain regions, the TreeLSTM cell) see one spelling.
    Values are the same numbers (an elementwise op commutes with slicing); f(x) itself
    is kept where anything but a slice reads it, and is then not duplicated per slice.

    keep: the node ids that must survive (a block's inputs and outputs). Returns
    (new trace, old id -> new id), or None when nothing was rewritten."""
    from .graph import ComputationGraph
    pick = OPS["pick_range"]
    n = len(T.op)
    non_slice_use = _non_slice_use(T, keep, pick)

    def commutes(i: int) -> bool:
        op = T.op[i]
        return (ARITY.get(op.name) == 1 and OPS.get(op.name) is op and not op.uses_data and not op.leaf
                and len(T.args[i]) == 1 and T.shape[T.args[i][0]] == T.shape[i] and not non_slice_use[i])

    if not any(T.op[i] is pick and (T.op[T.args[i][0]] is pick or commutes(T.args[i][0])) for i in range(n)):
        return None
    new = ComputationGraph(scheduler="none")
    new.tracing = True
    m: dict = {}
    memo: dict = {}

    def sliced(i: int, start: int, end: int, d: int) -> int:
        """The new node for rows start:end (along d) of old node i."""
        key = (i, start, end, d)
        hit = memo.get(key)
        if hit is None:
            if T.op[i] is pick and T.attrs[i][2] == d:
                s0 = T.attrs[i][0]
                hit = sliced(T.args[i][0], s0 + start, s0 + end, d)
            elif commutes(i):
                hit = new.add(T.op[i], (sliced(T.args[i][0], start, end, d),), T.attrs[i], T.data[i])
            else:
                hit = new.add(pick, (m[i],), (start, end, d))
            memo[key] = hit
        return hit

    for i in range(n):
        op, part = T.op[i], T.sig_part[i]
        if op.leaf and isinstance(part, tuple) and part[:1] == ("shared",):
            m[i] = new.leaf(T.attrs[i][1], part[2])
        elif op.leaf:
            m[i] = new.placeholder(op, T.shape[i])
        elif op is pick:
            m[i] = sliced(T.args[i][0], *T.attrs[i])
        elif commutes(i):
            continue  # read only through slices: recorded per slice by `sliced`
        else:
            m[i] = new.add(op, tuple(m[a] for a in T.args[i]), T.attrs[i], T.data[i])
    return new, m
