"""Memory layout planning for static subgraphs, in the spirit of ED-Batch's Table 2.

For each cell (a dy.block), compare the naive layout (variables in step order, a
gather per batched operand list) with the PQ-tree plan: memory kernels and bytes
copied per call (batch 8, hidden 64, float32), and the planning time.

    .venv/bin/python -m bench.layout_bench [--hidden 64] [--batch 8] [--describe CELL]

Two views of the same question. The *layout model* counts the copies the layout
predicts (inputs and parameters count as placeable, as in ED-Batch). *Executed*
runs one batch of calls through `dynagraph.program` forward and backward and
counts the copies it really made, with best-of latencies: None (one kernel per
step), "naive" (steps batched inside the block, every operand list copied) and
"planned" (batched in the layout's order, consecutive operands read in place,
sliced GEMM outputs written piece-major); "fused" adds fused elementwise chains to
"planned" (dy.block's default).
"""
from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np

import dynagraph as dy
from dynagraph.memory.layout import block_layouts

from bench.cells import CELLS


def layout_of(name: str, H: int, B: int, repeats: int = 5):
    """(layout, median planning ms) for one cell."""
    dy.renew_cg()
    fn, args = CELLS[name](dy.ParameterCollection(), H)
    blk = dy.block(fn, name=name)
    blk(*[3 if a == "index" else dy.zeros(a) for a in args])
    runs = [block_layouts(blk, batch_size=B)[0] for _ in range(repeats)]
    return runs[-1], statistics.median(r.plan_ms for r in runs)


def execute(name: str, H: int, B: int, mode, reps: int = 30, fuse: bool = False) -> dict:
    """Run one batch of B calls of the cell through its program (forward + backward) and
    measure: best-of-`reps` microseconds, and the copies the executor really made."""
    dy.renew_cg()
    fn, specs = CELLS[name](dy.ParameterCollection(), H)
    blk = dy.block(fn, name=name, plan=mode, fuse=fuse)
    blk(*[3 if a == "index" else dy.zeros(a) for a in specs])
    plan = next(iter(blk._plans.values()))
    rng = np.random.default_rng(0)
    dt = dy.config.config.np_dtype
    xs = [rng.normal(size=(B,) + (a if isinstance(a, tuple) else (a,))).astype(dt) for a in specs if a != "index"]
    xs += [p.values[None] for p in plan.leaf_params]
    data = [tuple(int(rng.integers(0, 100)) for a in specs if a == "index") for _ in range(B)]
    xp, need = np, (True,) * len(xs)

    def step():
        y, ctx = plan.forward(xp, (), data, *xs)
        plan.backward(xp, (), data, xs, y, np.ones_like(y), need, ctx=ctx)
    step()
    best = min(timeit.repeat(step, number=5, repeat=reps)) / 5
    c = plan.program.counts if plan.program is not None else None
    return {"us": 1e6 * best, "kernels": plan.op.inner_kernels,
            "copies": f"{c.forward_copies}+{c.backward_copies}" if c else "0",
            "bytes": f"{c.forward_bytes}+{c.backward_bytes}" if c else "0"}


def table(H: int = 64, B: int = 8) -> list:
    rows = []
    for name in CELLS:
        lay, ms = layout_of(name, H, B)
        run = {m: execute(name, H, B, m) for m in (None, "naive", "planned")}
        run["fused"] = execute(name, H, B, "planned", fuse=True)
        rows.append((name, lay, ms, run))
    return rows


def _ratio(a: float, b: float) -> str:
    return "inf" if b == 0 and a else "1.00" if b == 0 else f"{a / b:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--describe", choices=list(CELLS), help="print the planned layout and program of one cell")
    a = ap.parse_args()
    if a.describe:
        print(layout_of(a.describe, a.hidden, a.batch, repeats=1)[0].describe())
        dy.renew_cg()
        fn, specs = CELLS[a.describe](dy.ParameterCollection(), a.hidden)
        blk = dy.block(fn, plan="planned")
        blk(*[3 if s == "index" else dy.zeros(s) for s in specs])
        print(next(iter(blk._plans.values())).program.describe())
        return
    be = dy.config.config.backend
    print(f"batch {a.batch}, hidden {a.hidden}, {dy.config.config.dtype}, backend {be}; "
          f"naive -> planned (ratio naive/planned)")
    print("layout model: memory kernels and bytes the layout predicts for the forward")
    print("executed: one forward+backward of the batch through dynagraph.program (copies counted "
          "by the executor; None = one kernel per step, no batching inside the block)")
    print(f"{'cell':21} {'model kernels':>17} {'model bytes':>24} {'plan ms':>7} | "
          f"{'kernels None/naive/planned':>26} {'exec copies fwd+bwd':>16} {'exec bytes fwd+bwd':>30} "
          f"{'us None':>8} {'us naive':>8} {'us planned':>10} {'naive/planned':>13} {'us fused':>8} {'None/fused':>10}")
    for name, lay, ms, run in table(a.hidden, a.batch):
        n, p, o, f = run["naive"], run["planned"], run[None], run["fused"]
        print(f"{name:21} {lay.naive_kernels:>4} -> {lay.kernels:<3}({_ratio(lay.naive_kernels, lay.kernels):>5}) "
              f"{lay.naive_bytes:>8} -> {lay.bytes:<6}({_ratio(lay.naive_bytes, lay.bytes):>5}) {ms:7.1f} | "
              f"{o['kernels']:>8}/{n['kernels']:>3}/{p['kernels']:<3}          "
              f"{n['copies']:>6} -> {p['copies']:<6} {n['bytes']:>13} -> {p['bytes']:<13} "
              f"{o['us']:8.0f} {n['us']:8.0f} {p['us']:10.0f} {_ratio(n['us'], p['us']):>13} "
              f"{f['us']:8.0f} {_ratio(o['us'], f['us']):>10}")


if __name__ == "__main__":
    main()
