"""Fused elementwise chains vs op by op: the elementwise part of a binary TreeLSTM cell.

    python bench/fusion_bench.py [--dtype float32|float64] [--batch 64] [--hidden 64 256 512]

Inputs are what a static subgraph hands the chain: the five gate pre-activations as
column slices of one (B, 5H) GEMM output (strided views, read in place), and the
children's cells c_l, c_r. Twelve steps: logistic x4, tanh, three cmult, two add,
tanh, cmult; gradients flow in from h and c.

"op by op" is FusedChain's reference path on the numpy backend: each op's own
forward/backward in turn, as Plan.run_steps/grad_steps run them. "fused" is one C call
forward and one backward on the cpu backend. Times are the best of 25 short bursts,
the variants taking turns, in microseconds per call.
"""
from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynagraph.backends import get_backend  # noqa: E402
from dynagraph.fusion import FusedChain  # noqa: E402
from dynagraph.ops.base import OPS  # noqa: E402


def treelstm_chain() -> FusedChain:
    """Registers: 0-4 the gate slices [i f_l f_r o u], 5 c_l, 6 c_r; step m is 7 + m."""
    L = OPS
    steps = [(L["logistic"], (), [0]), (L["logistic"], (), [1]), (L["logistic"], (), [2]),  # 7 i, 8 fl, 9 fr
             (L["logistic"], (), [3]), (L["tanh"], (), [4]),                                 # 10 o, 11 u
             (L["cmult"], (), [7, 11]), (L["cmult"], (), [8, 5]), (L["cmult"], (), [9, 6]),  # 12-14
             (L["add"], (), [12, 13]), (L["add"], (), [15, 14]),                             # 15, 16 c
             (L["tanh"], (), [16]), (L["cmult"], (), [10, 17])]                              # 17, 18 h
    return FusedChain(steps, 7)


def measure(B: int, H: int, dt, rounds: int = 25) -> dict:
    """Best time per call of each variant. The variants take turns in short bursts, so
    that load from other processes hits them alike and the minimum finds quiet moments."""
    rng = np.random.default_rng(0)
    chain = treelstm_chain()
    g = rng.standard_normal((B, 5 * H)).astype(dt)
    ins = [g[:, k * H:(k + 1) * H] for k in range(5)] + [rng.standard_normal((B, H)).astype(dt) for _ in range(2)]
    gouts = [None] * len(chain)
    gouts[9] = rng.standard_normal((B, H)).astype(dt)   # dc (c feeds the parent)
    gouts[11] = rng.standard_normal((B, H)).astype(dt)  # dh
    need = [True] * 7

    def fwd(be):
        return lambda: chain.forward(be, ins)

    def fwd_bwd(be):
        def run():
            outs = chain.forward(be, ins)
            return chain.backward(be, ins, outs, gouts, need)
        return run
    variants = {(label, kind): make(be) for label, be in (("op by op", get_backend("numpy")), ("fused", get_backend("cpu")))
                for kind, make in (("fwd", fwd), ("fwd+bwd", fwd_bwd))}
    number = max(5, 20000 // (B * H))
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for key, fn in variants.items():
            best[key] = min(best[key], timeit.timeit(fn, number=number) / number * 1e6)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 256, 512])
    args = ap.parse_args(argv)
    if get_backend("cpu").fused_chains is None:
        sys.exit("compiled kernels with fused.c are not built: pip install -e . first")
    print(f"TreeLSTM cell elementwise chain ({len(treelstm_chain())} steps), B={args.batch}; us per call")
    print(f"{'dtype':8s} {'H':>5s} | {'fwd op-by-op':>12s} {'fwd fused':>10s} {'ratio':>6s} | "
          f"{'f+b op-by-op':>12s} {'f+b fused':>10s} {'ratio':>6s}")
    for dt in args.dtype:
        for H in args.hidden:
            r = measure(args.batch, H, np.dtype(dt))
            f0, fb0, f1, fb1 = (r[("op by op", "fwd")], r[("op by op", "fwd+bwd")], r[("fused", "fwd")],
                                r[("fused", "fwd+bwd")])
            print(f"{dt:8s} {H:5d} | {f0:12.1f} {f1:10.1f} {f0 / f1:5.1f}x | {fb0:12.1f} {fb1:10.1f} {fb0 / fb1:5.1f}x")


if __name__ == "__main__":
    main()
