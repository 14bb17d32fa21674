"""Op test cases: one description drives the reference check and the batched check.

A Case records one node with `build(k, *args)` and states its value with an
independent numpy formula `ref(k, *arrays)`. `k` is the node number: it may
only change per-node data (pick indices, labels, input values), never the
signature, so several nodes built with different k can share one batch.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pytest

import dynagraph as dy
from refcheck import Const, Table, batch_of, batch_sizes, check_op, run_graph


@dataclass(frozen=True)
class A:
    """One argument: its shape and value range. `away0` keeps |x| >= 0.2 (kinks at 0)."""
    shape: tuple
    lo: float = -1.0
    hi: float = 1.0
    away0: bool = False
    kind: str = "param"     # "param" (differentiated), "const" (inputTensor), "table" (LookupParameters)
    integer: bool = False   # whole numbers in [lo, hi)

    def draw(self, rng: np.random.Generator, lead: tuple = ()) -> np.ndarray:
        shape = lead + tuple(self.shape)
        if self.away0:
            return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.2, 1.0, size=shape)
        v = rng.uniform(self.lo, self.hi, size=shape)
        return np.floor(v) if self.integer else v


@dataclass
class Case:
    id: str
    op: str                                  # the op the output node must be recorded with
    build: Callable                          # build(k, *args) -> Expression
    args: Sequence[A] = ()
    ref: Callable | None = None              # ref(k, *arrays) -> np.ndarray; None: no value check
    grad: float | None = 1.0                 # analytic = grad * finite differences; None: skip
    batch: bool = True                       # include in the batched-equivalence test
    shared: bool = True                      # batched test also tries each argument as a shared parameter
    k: int = 1
    tags: tuple = field(default_factory=tuple)

    def __repr__(self) -> str:
        return self.id


def rng_for(case_id: str, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(case_id.encode()) + salt)


def inputs_for(case: Case) -> list:
    rng = rng_for(case.id)
    out = []
    for a in case.args:
        v = a.draw(rng)
        out.append(Const(v) if a.kind == "const" else Table(v) if a.kind == "table" else v)
    return out


def run_reference(case: Case):
    """Forward value vs case.ref and gradients vs finite differences, for node k."""
    def build(*xs):
        return case.build(case.k, *xs)

    ref = None if case.ref is None else (lambda *arrs: case.ref(case.k, *arrs))
    return check_op(build, inputs_for(case), ref, grad=case.grad is not None,
                    grad_factor=1.0 if case.grad is None else case.grad, op=case.op)


# ---------------------------------------------------------------------- batched
NODES = 3


def variants(case: Case) -> list[str]:
    """'rows': node k reads row k of a lookup table for every tensor argument;
    'rows_reversed' / 'rows_repeated': rows n-1-k / row 0 (non-contiguous gathers and
    scatter-adds with duplicates); 'shared<i>': argument i is one Parameters object
    used by every node."""
    out = ["rows"]
    if any(a.kind == "param" for a in case.args):
        out += ["rows_reversed", "rows_repeated"]
    if case.shared:
        out += [f"shared{i}" for i, a in enumerate(case.args) if a.kind == "param"]
    return out


def batched_builder(case: Case, variant: str, nodes: int = NODES) -> Callable:
    """build_fn(pc) recording `nodes` nodes of the case that share one signature."""
    rng = rng_for(case.id, salt=7)
    shared = int(variant[6:]) if variant.startswith("shared") else -1
    values = [a.draw(rng, () if i == shared or a.kind == "table" else (nodes,)) for i, a in enumerate(case.args)]

    def build_fn(pc):
        holders = []
        for i, (a, v) in enumerate(zip(case.args, values)):
            if a.kind == "table":  # entries as drawn (lookup_parameters_from_numpy uses DyNet's layout)
                holders.append(pc.add_lookup_parameters(v.shape, init=dy.NumpyInitializer(v.copy())))
            elif i == shared:
                holders.append(pc.parameters_from_numpy(v.copy()))
            elif a.kind == "param":
                holders.append(pc.add_lookup_parameters(v.shape, init=dy.NumpyInitializer(v.copy())))
            else:
                holders.append(v)
        row = {"rows_reversed": lambda k: nodes - 1 - k, "rows_repeated": lambda k: 0}.get(variant, lambda k: k)
        return [case.build(k, *[_arg(a, h, i == shared, row(k)) for i, (a, h) in enumerate(zip(case.args, holders))])
                for k in range(nodes)]
    return build_fn


def _arg(a: A, holder, shared: bool, row: int):
    if a.kind == "table":
        return holder
    if a.kind == "const":
        return dy.inputTensor(holder[row])
    return dy.parameter(holder) if shared else holder[row]


def run_batched(case: Case, variant: str, scheduler: str):
    return run_graph(scheduler, batched_builder(case, variant), backward=case.grad is not None)


def assert_batched(case: Case, run) -> None:
    """Every output node of the case ran in one batch."""
    batch = batch_of(run.cg, run.outputs[0])
    missing = set(run.outputs) - set(batch)
    assert not missing, f"{case.op} nodes were not batched together: batch sizes {batch_sizes(run.cg, case.op)}"


def params(cases: Sequence[Case]) -> list:
    """pytest parameters named by case id."""
    return [pytest.param(c, id=c.id) for c in cases]
