"""Helpers for the scheduler tests.

`run_recorded(name, build_fn)` evaluates `build_fn(pc)` under one scheduler via
the shared `refcheck.run_graph` and also keeps what the scheduler returned on
every call. That way every invariance test checks the structure of the schedules
as well as the values and gradients.
`schedule_of(name, build)` only records and runs the forward pass, for
structural tests that count batches.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

import dynagraph as dy
from dynagraph import schedulers
from dynagraph.backends import to_numpy
from refcheck import Run, run_graph, using

TOL = 1e-10  # float64: batching may only reorder roundings, never change results
SCHEDULERS = schedulers.available()  # collected once: new schedulers get tested automatically


class Recorder:
    """Wraps a scheduler (a registered name or an object) and keeps (pending nodes, batches) of each call."""

    def __init__(self, name):
        self.inner = schedulers.get(name)
        self.name = name
        # Same code path as production: built-in (trusted) schedulers skip the engine's validation,
        # so our own checks below are what catches their mistakes.
        self.trusted = getattr(self.inner, "trusted", False)
        self.calls: list[tuple[list[int], list[list[int]]]] = []

    def schedule(self, cg, nodes: Sequence[int]) -> list[list[int]]:
        nodes = list(nodes)
        batches = self.inner.schedule(cg, list(nodes))
        self.calls.append((nodes, [list(b) for b in batches]))
        return batches

    @property
    def batches(self) -> list[list[int]]:
        return [b for _, bs in self.calls for b in bs]


def check_schedule(cg, nodes: Sequence[int], batches: Sequence[Sequence[int]]) -> None:
    """One call's schedule: each pending node once, one signature per batch, arguments first."""
    pending = set(nodes)
    pos: dict[int, int] = {}
    for k, batch in enumerate(batches):
        assert len(batch) > 0, f"batch {k} is empty"
        sigs = {cg.sig[n] for n in batch}
        assert len(sigs) == 1, f"batch {k} mixes signatures: {[cg.op[n].name for n in batch]}"
        if not cg.op[batch[0]].batchable:
            assert len(batch) == 1, f"batch {k} batches the unbatchable op {cg.op[batch[0]].name}"
        for n in batch:
            assert n in pending, f"node {n} was not pending"
            assert n not in pos, f"node {n} scheduled twice"
            pos[n] = k
    assert len(pos) == len(pending), f"{sorted(pending - set(pos))} never scheduled"
    for n, k in pos.items():
        for a in cg.args[n]:
            if a in pos:
                assert pos[a] < k, f"node {n} ({cg.op[n].name}) in batch {k} before its argument {a}"
            else:  # not pending: evaluated by an earlier call, or a parameter
                assert a < min(nodes) or cg.op[a].leaf, f"argument {a} of {n} is neither pending nor done"
    lb = schedulers.lower_bound(cg, list(nodes))
    assert len(batches) >= lb, f"{len(batches)} batches beat the lower bound {lb}"


def _epochs(calls: list) -> list[list[int]]:
    """Scheduled nodes per evaluation epoch; a call restarting below the last one follows invalidate()."""
    epochs: list[list[int]] = []
    last = -1
    for nodes, batches in calls:
        if not nodes:
            continue
        if not epochs or min(nodes) <= last:
            epochs.append([])
        epochs[-1].extend(n for b in batches for n in b)
        last = max(nodes)
    return epochs


def check_all_calls(cg, rec: Recorder) -> None:
    """Every call is a valid schedule, and in each evaluation epoch (recalculation starts a
    new one) every non-leaf node up to the last one evaluated is scheduled exactly once."""
    for nodes, batches in rec.calls:
        check_schedule(cg, nodes, batches)
    epochs = _epochs(rec.calls)
    for ep in epochs:
        assert sorted(ep) == [i for i in range(max(ep) + 1) if not cg.op[i].leaf]
    last = max((i for i in range(len(cg)) if not cg.op[i].leaf), default=-1)
    assert (max(epochs[-1]) if epochs else -1) == last, "the whole graph was not evaluated"


class Recorded(NamedTuple):
    run: Run
    rec: Recorder
    values: list        # the value of every node of the graph, by node id
    node_grads: dict    # node id -> gradient, for the nodes that need one


def run_recorded(name, build_fn: Callable, backward: bool = True) -> Recorded:
    """refcheck.run_graph under `name`, plus all node values/gradients and checked schedules."""
    rec = Recorder(name)
    run = run_graph(rec, build_fn, backward=backward)
    cg = run.cg
    check_all_calls(cg, rec)
    values = [to_numpy(cg.value(i)).reshape(cg.shape[i]) for i in range(len(cg))]
    grads = {i: cg.gradient(i) for i in range(len(cg)) if backward and cg.needs_grad[i]}
    return Recorded(run, rec, values, grads)


def assert_invariant(ref: Recorded, got: Recorded, tol: float = TOL) -> None:
    """Same graph, same values of ALL nodes, same node and parameter gradients."""
    ca, cb = ref.run.cg, got.run.cg
    assert [o.name for o in ca.op] == [o.name for o in cb.op], "recording differs between runs"
    for i, (x, y) in enumerate(zip(ref.values, got.values)):
        np.testing.assert_allclose(y, x, rtol=tol, atol=tol, err_msg=f"value of node {i} ({ca.op[i].name})")
    assert ref.node_grads.keys() == got.node_grads.keys()
    for i, g in ref.node_grads.items():
        np.testing.assert_allclose(got.node_grads[i], g, rtol=tol, atol=tol,
                                   err_msg=f"gradient of node {i} ({ca.op[i].name})")
    assert ref.run.grads.keys() == got.run.grads.keys()
    for k, g in ref.run.grads.items():
        np.testing.assert_allclose(got.run.grads[k], g, rtol=tol, atol=tol, err_msg=f"gradient of parameter {k}")


def compare_with_none(name, build_fn: Callable) -> tuple[Recorded, Recorded]:
    ref = run_recorded("none", build_fn)
    got = run_recorded(name, build_fn)
    assert_invariant(ref, got)
    return ref, got


def schedule_of(name: str, build: Callable[[], object]) -> tuple[object, Recorder]:
    """Record build() under `name`, run the forward pass, check and return (cg, recorder)."""
    with using("float64", 0):
        rec = Recorder(name)
        cg = dy.renew_cg(scheduler=rec)
        build()
        cg.forward()
    check_all_calls(cg, rec)
    return cg, rec


def n_batches(name: str, build: Callable[[], object]) -> int:
    return len(schedule_of(name, build)[1].batches)


def all_lower_bound(cg) -> int:
    return schedulers.lower_bound(cg, [i for i in range(len(cg)) if not cg.op[i].leaf])
