"""The one reference-check helper shared by every test.

    check_op(build, inputs, expected)   forward value vs an independent numpy
                                        formula, gradients vs central differences
    run_under(scheduler, build_fn)      values and parameter gradients of a graph
                                        evaluated under one scheduler
    using(dtype=..., seed=...)          temporarily change the global config
    memory_growth(round_)               bytes a repeated round keeps after warming up

Everything runs in float64 by default so gradient checks can be tight.
The numpy reference must be written in the test itself: comparing dynagraph
against its own op code would check nothing.
"""
from __future__ import annotations

import collections
import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

import dynagraph as dy
from dynagraph import autodiff
from dynagraph.config import config

VALUE_RTOL, VALUE_ATOL = 1e-9, 1e-12
GRAD_RTOL, GRAD_ATOL = 1e-6, 1e-8
FD_STEP = 1e-5  # central differences in float64: truncation ~h^2, round-off ~eps/h


# --------------------------------------------------------------------- config
@contextlib.contextmanager
def using(dtype: str = "float64", seed: int | None = 0, scheduler: str | None = None) -> Iterator[None]:
    """Set dtype/seed/scheduler for the block, then restore the previous global settings
    (the backend too: a test that switched it once left every later test on it)."""
    saved = (config.dtype, config.scheduler, config.seed, config.rng, config.fuse, config.backend)
    dy.config.set(dtype=dtype, random_seed=seed, scheduler=scheduler)
    try:
        yield
    finally:
        config.dtype, config.scheduler, config.seed, config.rng, config.fuse, config.backend = saved


# --------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Const:
    """An input fed through dy.inputTensor: it has a value but no gradient."""
    value: Any


@dataclass(frozen=True)
class Table:
    """A LookupParameters table of shape (rows, *dim); `build` receives the table itself."""
    value: Any


def _as_array(v) -> np.ndarray:
    a = np.array(v, dtype=np.float64)
    return a.reshape(1) if a.ndim == 0 else a


def make_inputs(pc, inputs: Sequence) -> tuple[list, list]:
    """Turn arrays into Parameters expressions, Table into LookupParameters, Const into inputs.

    Returns (arguments for build, the trainable object per input or None).
    Arrays are copied: finite differences perturb parameter storage in place.
    """
    args, params = [], []
    for v in inputs:
        if isinstance(v, Const):
            args.append(dy.inputTensor(_as_array(v.value)))
            params.append(None)
        elif isinstance(v, Table):
            a = _as_array(v.value)
            p = pc.add_lookup_parameters(a.shape, init=a.copy())
            args.append(p)
            params.append(p)
        else:
            a = _as_array(v)
            p = pc.add_parameters(a.shape, init=a.copy())
            args.append(dy.parameter(p))
            params.append(p)
    return args, params


def loss_weights(shape: tuple, seed: int = 1234) -> np.ndarray:
    """Fixed random weights w: the checked scalar loss is sum(output * w)."""
    return np.random.default_rng(seed).normal(size=shape)


def weighted_loss(out, w: np.ndarray):
    return dy.sum_elems(dy.cmult(out, dy.inputTensor(w)))


# ------------------------------------------------------------- finite differences
def numeric_grad(f: Callable[[], float], x: np.ndarray, h: float = FD_STEP) -> np.ndarray:
    """Central differences of f() w.r.t. every entry of x, perturbing x in place."""
    if x.size == 0:
        return np.zeros(x.shape)
    flat = x.reshape(-1)
    if not np.shares_memory(flat, x):
        raise ValueError("numeric_grad needs a contiguous array it can perturb in place")
    g = np.zeros(flat.shape, dtype=np.float64)
    for i in range(flat.size):
        old = flat[i].copy()  # CuPy's flat[i] is a 0-d view: it would follow the perturbation
        flat[i] = old + h
        fp = f()
        flat[i] = old - h
        fm = f()
        flat[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g.reshape(x.shape)


class Checked(NamedTuple):
    value: np.ndarray
    grads: list          # analytic gradient per input (None for Const inputs or grad=False)
    params: list         # Parameters / LookupParameters per input (None for Const)


def check_op(build: Callable, inputs: Sequence, expected=None, *, grad: bool = True,
             grad_factor: float = 1.0, op: str | None = None, scheduler: str = "none",
             dtype: str = "float64", seed: int = 0, rtol: float = VALUE_RTOL, atol: float = VALUE_ATOL,
             grad_rtol: float = GRAD_RTOL, grad_atol: float = GRAD_ATOL) -> Checked:
    """Record build(*inputs) and check it.

    inputs: arrays (become Parameters, differentiated), Const(array) (inputTensor)
      or Table(array) (LookupParameters, passed to build as the table).
    expected: an array, or a callable on the input arrays (an independent numpy formula).
    grad_factor: the analytic gradient must equal grad_factor * finite differences
      (0 for nobackprop, -1 for flip_gradient).
    op: if given, the output node must be recorded with that op.
    """
    arrays = [_as_array(v.value if isinstance(v, (Const, Table)) else v) for v in inputs]
    with using(dtype, seed):
        pc = dy.ParameterCollection()
        cg = dy.renew_cg(scheduler=scheduler)
        args, params = make_inputs(pc, inputs)
        out = build(*args)
        if op is not None:
            assert cg.op[out.i].name == op, f"recorded {cg.op[out.i].name!r}, expected op {op!r}"
        value = out.npvalue()
        assert value.shape == tuple(out.shape), f"value shape {value.shape} != recorded shape {out.shape}"
        if expected is not None:
            want = np.asarray(expected(*[a.copy() for a in arrays]) if callable(expected) else expected)
            assert value.shape == want.shape, f"shape {value.shape}, expected {want.shape}"
            np.testing.assert_allclose(value, want, rtol=rtol, atol=atol, err_msg="forward value")
        grads = [None] * len(inputs)
        if grad and any(p is not None for p in params):
            grads = _check_grads(out, params, grad_factor, grad_rtol, grad_atol)
        return Checked(value, grads, params)


def _check_grads(out, params, factor, rtol, atol) -> list:
    w = loss_weights(tuple(out.shape))
    weighted_loss(out, w).backward()
    analytic = [None if p is None else p.grad_as_array() for p in params]

    def f() -> float:
        return float(np.sum(out.npvalue(recalculate=True) * w))

    for k, p in enumerate(params):
        if p is None:
            continue
        num = numeric_grad(f, p.values)
        np.testing.assert_allclose(analytic[k], factor * num, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {k} vs finite differences")
    return analytic


# ------------------------------------------------------------------ schedulers
class Run(NamedTuple):
    values: list          # npvalue() of every output, in order
    grads: dict           # parameter name -> gradient (Parameters and LookupParameters)
    cg: Any               # the graph, for inspecting cg.executed / cg.stats
    outputs: list         # node ids of the outputs


def run_graph(scheduler, build_fn: Callable, *, seed: int = 0, dtype: str = "float64",
              backward: bool = True) -> Run:
    """Evaluate build_fn(pc) -> Expression | list[Expression] under `scheduler`.

    The seed is reset first, so parameters created inside build_fn and the graph's
    random keys are the same for every scheduler. All outputs are evaluated as one
    chunk; the loss is sum_i sum(out_i * w_i) with fixed weights w_i.
    """
    with using(dtype, seed):
        pc = dy.ParameterCollection()
        cg = dy.renew_cg(scheduler=scheduler)
        outs = build_fn(pc)
        outs = [outs] if isinstance(outs, dy.Expression) else list(outs)
        loss = None
        if backward:
            loss = dy.esum([weighted_loss(o, loss_weights(tuple(o.shape), 1000 + i)) for i, o in enumerate(outs)])
        cg.forward()
        values = [o.npvalue() for o in outs]
        grads = {}
        if loss is not None:
            loss.backward()
            grads = {p.name(): p.grad_as_array() for p in pc.parameters_list() + pc.lookup_parameters_list()}
        return Run(values, grads, cg, [o.i for o in outs])


def run_under(scheduler, build_fn: Callable, **kw) -> tuple[list, dict]:
    """(values, grads) of build_fn(pc) evaluated under `scheduler`; see run_graph."""
    r = run_graph(scheduler, build_fn, **kw)
    return r.values, r.grads


def assert_same_run(a: Run | tuple, b: Run | tuple, rtol: float = 1e-12, atol: float = 1e-14) -> None:
    """Values and gradients of two runs agree (scheduler invariance)."""
    (va, ga), (vb, gb) = a[:2], b[:2]
    assert len(va) == len(vb)
    for i, (x, y) in enumerate(zip(va, vb)):
        assert x.shape == y.shape, f"output {i}: shape {x.shape} vs {y.shape}"
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"output {i}")
    assert ga.keys() == gb.keys()
    for k in ga:
        np.testing.assert_allclose(ga[k], gb[k], rtol=rtol, atol=atol, err_msg=f"gradient of {k}")


def executed_batches(cg) -> list:
    """The node list of every executed forward batch, a run's steps one by one."""
    return [nodes for e in cg.executed for nodes in getattr(e, "steps", [e.nodes])]


def batch_sizes(cg, op_name: str) -> list[int]:
    """Sizes of the executed forward batches of one op (to prove batching happened)."""
    return [len(nodes) for nodes in executed_batches(cg) if cg.op[nodes[0]].name == op_name]


def batch_of(cg, nid: int) -> list[int]:
    """The executed forward batch that computed node nid."""
    for nodes in executed_batches(cg):
        if nid in nodes:
            return list(nodes)
    raise KeyError(f"node {nid} was not executed")


# --------------------------------------------------------------------- memory
def memory_growth(round_: Callable[[], None], rounds: int = 3, settle: int = 3) -> tuple[int, int]:
    """(traced bytes after `settle` traced rounds, after `rounds` more): a round that frees
    what it made leaves the two about equal. One untraced round first fills caches; the
    traced settling rounds let pooled storage made before tracing (the graph's column lists,
    kernels/cpython/columns.c, which take turns) be replaced by traced storage once."""
    import gc
    import tracemalloc
    round_()
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(settle):
            round_()
            gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        for _ in range(rounds):
            round_()
            gc.collect()
        last, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return first, last


def native_and_python_runs(monkeypatch, build, dtype: str, watched: set, **settings) -> tuple[list, list]:
    """The graph run on the cpu backend with autodiff's compiled backward step and without it
    (each op's Python backward): both runs, and per run a Counter of the Python calls of the
    functions named in watched (by qualified name). settings: config values for both runs."""
    runs, called = [], []
    for native in (True, False):
        seen = collections.Counter()

        def profile(frame, event, arg):
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            if event == "call" and name in watched:
                seen[name] += 1
        with monkeypatch.context() as m:
            m.setattr(config, "backend", "cpu")
            for key, value in settings.items():
                m.setattr(config, key, value)
            if not native:
                m.setattr(autodiff, "_backward_native", None)
            sys.setprofile(profile)
            try:
                runs.append(run_graph("agenda", build, dtype=dtype))
            finally:
                sys.setprofile(None)
        called.append(seen)
    return runs, called


def assert_same_grads_and_blocks(a: Run, b: Run) -> None:
    """Two runs' parameter gradients and gradient blocks are bit-identical."""
    for k in a.grads:
        np.testing.assert_array_equal(a.grads[k], b.grads[k], err_msg=k)
    for x, y in zip(a.cg.grad_blocks, b.cg.grad_blocks):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_array_equal(x, y)
