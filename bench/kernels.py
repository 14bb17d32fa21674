"""Compiled kernels (the "cpu" backend) against the numpy backend.

    python bench/kernels.py                 # kernel table, float32, all sizes
    python bench/kernels.py --dtype float64
    python bench/kernels.py --quick         # fewer sizes (a smoke run)
    python bench/kernels.py --treelstm      # + TreeLSTM training, numpy vs cpu backend

Prints one row per (kernel, sizes): numpy µs, C µs and numpy/C (> 1: C is faster),
each the best of several repeats (the machine is shared: best-of-N is the stable
statistic). CpuBackend installs an op's kernel only where this table shows a win at
the batch sizes that occur (B in 1..700, H in 64..512); see INSTALLED_* in
dynagraph/backends/cpu.py. BLAS is capped at one thread so both sides compare alike.
"""
from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dynagraph as dy  # noqa: E402
from dynagraph.backends import cpu  # noqa: E402
from dynagraph.backends.numpy_backend import NumpyBackend  # noqa: E402
from dynagraph.ops.base import OPS  # noqa: E402

BATCHES = (1, 16, 64, 700)
HIDDEN = (64, 256, 512)


def best_us(f: Callable, repeat: int = 5, budget_s: float = 0.02) -> float:
    """Best per-call time in µs; the call count is scaled to ~budget_s per repeat."""
    n, t = 1, 0.0
    while True:
        t = timeit.timeit(f, number=n)
        if t > budget_s / 4 or n >= 1 << 16:
            break
        n *= 4
    n = max(1, int(n * budget_s / max(t, 1e-9)))
    return min(timeit.repeat(f, number=n, repeat=repeat)) / n * 1e6


class Table:
    def __init__(self):
        self.rows: list = []
        print(f"{'kernel':<26}{'sizes':<22}{'numpy us':>10}{'C us':>10}{'ratio':>8}")

    def add(self, kernel: str, sizes: str, f_numpy: Callable, f_c: Callable) -> None:
        tn, tc = best_us(f_numpy), best_us(f_c)
        self.rows.append((kernel, sizes, tn, tc))
        print(f"{kernel:<26}{sizes:<22}{tn:>10.1f}{tc:>10.1f}{tn / tc:>8.2f}", flush=True)

    def summary(self) -> None:
        by: dict = {}
        for kernel, _, tn, tc in self.rows:
            by.setdefault(kernel, []).append(tn / tc)
        print("\nper kernel: geometric-mean ratio (min..max) numpy/C")
        for kernel, r in by.items():
            g = float(np.exp(np.mean(np.log(r))))
            print(f"  {kernel:<26}{g:6.2f}  ({min(r):.2f}..{max(r):.2f})")


# ------------------------------------------------------------------ row movers
def _blocks(rng, k: int, rows: int, H: int, dt) -> list:
    return [rng.standard_normal((rows, H)).astype(dt) for _ in range(k)]


def bench_rows(t: Table, rng, dt, batches, hidden) -> None:
    ref = NumpyBackend(np)
    for B in batches:
        for H in hidden:
            for k in sorted({min(B, 2), min(B, 8), min(B, 32)}):
                blocks = _blocks(rng, k, max(B, 4), H, dt)
                blks = [int(b) for b in rng.integers(0, k, B)]
                rows = [int(r) for r in rng.integers(0, max(B, 4), B)]
                sizes = f"B={B} H={H} k={k}"
                t.add("gather_rows", sizes, lambda: ref.gather_rows(blocks, blks, rows),
                      lambda: cpu.gather_rows(blocks, blks, rows))
                vals = rng.standard_normal((B, H)).astype(dt)
                grads = [np.zeros_like(b) for b in blocks]
                t.add("scatter_rows", sizes, lambda: ref.scatter_rows(grads.__getitem__, blks, rows, vals),
                      lambda: cpu.scatter_add_rows(grads.__getitem__, blks, rows, vals))
            table = rng.standard_normal((5000, H)).astype(dt)
            idx = [int(i) for i in rng.integers(0, 5000, B)]
            vals = rng.standard_normal((B, H)).astype(dt)
            g = np.zeros_like(table)
            touched = np.zeros(5000, bool)
            t.add("take_rows (lookup)", f"B={B} H={H}", lambda: ref.take_rows(table, idx),
                  lambda: cpu.take_rows(table, idx))
            t.add("add_rows", f"B={B} H={H}", lambda: ref.add_rows(g, idx, vals), lambda: cpu.add_rows(g, idx, vals))

            def np_embed_bwd():
                np.add.at(g, np.asarray(idx), vals)
                touched[idx] = True
            t.add("embedding_backward", f"B={B} H={H}", np_embed_bwd,
                  lambda: cpu.embedding_backward(g, touched, idx, vals))


# --------------------------------------------------------------- op adapters
def _op_pair(name: str, backward: bool):
    op = OPS[name]
    kernels = cpu.all_backward_kernels() if backward else cpu.all_forward_kernels()
    return (op.backward if backward else op.forward), kernels[name]


def bench_unary_binary(t: Table, rng, dt, batches, hidden) -> None:
    for B in batches:
        for H in hidden:
            x = rng.standard_normal((B, H)).astype(dt)
            pos = np.abs(x) + dt(0.5)
            g = rng.standard_normal((B, H)).astype(dt)
            sizes = f"B={B} H={H}"
            for name in ("tanh", "logistic", "rectify", "exp", "log"):
                arg = pos if name == "log" else x
                ref, fast = _op_pair(name, False)
                t.add(f"{name} fwd", sizes, lambda: ref(np, (), None, arg), lambda: fast(np, (), None, arg))
                y = ref(np, (), None, arg)
                refb, fastb = _op_pair(name, True)
                t.add(f"{name} bwd", sizes, lambda: refb(np, (), None, (arg,), y, g, (True,)),
                      lambda: fastb(np, (), None, (arg,), y, g, (True,)))
            bias = rng.standard_normal((1, H)).astype(dt)
            for name in ("add", "cmult", "sub"):
                for other, tag in ((x[::-1].copy(), ""), (bias, " shared")):
                    ref, fast = _op_pair(name, False)
                    t.add(f"{name}{tag} fwd", sizes, lambda: ref(np, (), None, x, other),
                          lambda: fast(np, (), None, x, other))
                    out = ref(np, (), None, x, other)
                    refb, fastb = _op_pair(name, True)
                    t.add(f"{name}{tag} bwd", sizes, lambda: refb(np, (), None, (x, other), out, g, (True, True)),
                          lambda: fastb(np, (), None, (x, other), out, g, (True, True)))
            ref, fast = _op_pair("esum", False)
            t.add("esum(3) fwd", sizes, lambda: ref(np, (), None, x, g, x), lambda: fast(np, (), None, x, g, x))
            ref, fast = _op_pair("sum_elems", False)
            t.add("sum_elems fwd", sizes, lambda: ref(np, (), None, x), lambda: fast(np, (), None, x))


def bench_softmax(t: Table, rng, dt, batches) -> None:
    for B in batches:
        for n in (5, 100, 5000):
            x = rng.standard_normal((B, n)).astype(dt)
            g = rng.standard_normal((B, n)).astype(dt)
            sizes = f"B={B} n={n}"
            for name, attrs in (("softmax", (0,)), ("log_softmax", (None,))):
                ref, fast = _op_pair(name, False)
                t.add(f"{name} fwd", sizes, lambda: ref(np, attrs, None, x), lambda: fast(np, attrs, None, x))
                y = ref(np, attrs, None, x)
                refb, fastb = _op_pair(name, True)
                t.add(f"{name} bwd", sizes, lambda: refb(np, attrs, None, (x,), y, g, (True,)),
                      lambda: fastb(np, attrs, None, (x,), y, g, (True,)))
            labels = [int(i) for i in rng.integers(0, n, B)]
            gl = rng.standard_normal((B, 1)).astype(dt)
            ref, fast = _op_pair("pickneglogsoftmax", False)
            t.add("pickneglogsoftmax fwd", sizes, lambda: ref(np, (), labels, x), lambda: fast(np, (), labels, x))
            y = ref(np, (), labels, x)
            refb, fastb = _op_pair("pickneglogsoftmax", True)
            t.add("pickneglogsoftmax bwd", sizes, lambda: refb(np, (), labels, (x,), y, gl, (True,)),
                  lambda: fastb(np, (), labels, (x,), y, gl, (True,)))


def _np_lstm(pre, cp, fb):
    H = pre.shape[1] // 4
    sig = lambda v: 0.5 * np.tanh(0.5 * v) + 0.5  # noqa: E731
    i, f, o, g = sig(pre[:, :H]), sig(pre[:, H:2 * H] + fb), sig(pre[:, 2 * H:3 * H]), np.tanh(pre[:, 3 * H:])
    c = f * cp + i * g
    return o * np.tanh(c), c


def _np_tree(pre, kids):
    N = len(kids)
    H = pre.shape[1] // (N + 3)
    sig = lambda v: 0.5 * np.tanh(0.5 * v) + 0.5  # noqa: E731
    c = sig(pre[:, :H]) * np.tanh(pre[:, (N + 2) * H:])
    for k, ck in enumerate(kids):
        c = c + sig(pre[:, (k + 1) * H:(k + 2) * H]) * ck
    return sig(pre[:, (N + 1) * H:(N + 2) * H]) * np.tanh(c), c


def bench_cells(t: Table, rng, dt, batches, hidden) -> None:
    for B in batches:
        for H in hidden:
            sizes = f"B={B} H={H}"
            pre = rng.standard_normal((B, 4 * H)).astype(dt)
            cp = rng.standard_normal((B, H)).astype(dt)
            t.add("lstm cell fwd", sizes, lambda: _np_lstm(pre, cp, 1.0), lambda: cpu.lstm_forward(pre, cp, 1.0))
            pre5 = rng.standard_normal((B, 5 * H)).astype(dt)
            kids = [cp, cp[::-1].copy()]
            t.add("treelstm(2) cell fwd", sizes, lambda: _np_tree(pre5, kids), lambda: cpu.treelstm_forward(pre5, kids))


def bench_trainers(t: Table, rng, dt, hidden) -> None:
    for H in hidden:
        w = rng.standard_normal((5 * H, H)).astype(dt)
        g = rng.standard_normal(w.shape).astype(dt)
        h, m, v = np.abs(g), np.zeros_like(w), np.zeros_like(w)
        sizes = f"{5 * H}x{H}"

        def np_adagrad():
            gs = g * 0.5
            h[...] += np.square(gs)
            w[...] -= gs / np.sqrt(h + 1e-20) * 0.05

        def np_adam():
            gs = g * 0.5
            m[...] *= 0.9
            m[...] += gs * (1 - 0.9)
            v[...] *= 0.999
            v[...] += np.square(gs) * (1 - 0.999)
            w[...] -= m / (np.sqrt(v) + 1e-8) * 0.001
        t.add("adagrad update", sizes, np_adagrad, lambda: cpu.adagrad_update(w, g, h, 0.05, 1e-20, 0.5))
        t.add("adam update", sizes, np_adam, lambda: cpu.adam_update(w, g, m, v, 0.9, 0.999, 1e-8, 0.001, 0.5))
        t.add("sgd update", sizes, lambda: w.__isub__(g * 0.05), lambda: cpu.sgd_update(w, g, 0.05))
    # a lookup table's sparse update: the touched rows (sorted, as touched_rows() gives),
    # numpy's gather / apply / scatter against the compiled rule on those rows only
    for H in hidden:
        E, gE = rng.standard_normal((10000, H)).astype(dt), rng.standard_normal((10000, H)).astype(dt)
        rows = np.flatnonzero(rng.random(10000) < 0.1)

        def np_sparse(E=E, gE=gE, rows=rows):
            w = E[rows]
            w -= gE[rows] * 0.05
            E[rows] = w
        t.add("sgd sparse rows", f"10000x{H} {len(rows)} rows", np_sparse,
              lambda E=E, gE=gE, rows=rows: cpu.sgd_update(E, gE, 0.05, rows))


def bench_cell_gemm(t: Table, rng, dt, hidden) -> None:
    """dy.cavs's TreeLSTM cell GEMM X @ W^T over a step's twelve task sizes (M = 2..398):
    W^T as a view (the "numpy" column) against a contiguous copy made once a pass, the copy
    included (the "C" column); cavs._CellRec.weights copies only where this wins."""
    sizes = (398, 244, 157, 103, 78, 62, 40, 25, 14, 8, 4, 2)
    for H in hidden:
        W = rng.standard_normal((5 * H, 2 * H)).astype(dt)
        Xs = [rng.standard_normal((M, 2 * H)).astype(dt) for M in sizes]
        outs = [np.empty((M, 5 * H), dt) for M in sizes]

        def view(W=W, Xs=Xs, outs=outs):
            for X, o in zip(Xs, outs):
                np.matmul(X, W.T, out=o)

        def copied(W=W, Xs=Xs, outs=outs):
            WT = np.ascontiguousarray(W.T)
            for X, o in zip(Xs, outs):
                np.matmul(X, WT, out=o)
        t.add("cell GEMM, W^T copied", f"H={H} 12 tasks", view, copied)


# ---------------------------------------------------------------- TreeLSTM training
def bench_treelstm(hidden=(64, 256), n_trees: int = 256, batch: int = 64, rounds: int = 6) -> None:
    """Epoch time per backend. One model per backend, epochs interleaved (numpy, cpu,
    numpy, ...) so that load changes on the shared machine hit both alike; best of N."""
    sys.path.insert(0, str(ROOT / "examples"))
    import treelstm as T
    print(f"\nTreeLSTM training, {n_trees} synthetic trees, batch {batch}, best of {rounds} interleaved epochs")
    print(f"{'H':>5}{'numpy s':>10}{'cpu s':>10}{'numpy/cpu':>11}")
    train, _, _ = T.load_trees(n_trees, 1, 0)
    for H in hidden:
        models, best = {}, {}
        for be in ("numpy", "cpu"):
            dy.config.set(backend=be)
            models[be] = T.build(train, H, H, 0.05, 1)
            best[be] = float("inf")
        for _ in range(rounds):
            for be, (_, model, trainer, vocab) in models.items():
                dy.config.set(backend=be)
                t0 = time.perf_counter()
                T.train_epoch(model, trainer, train, vocab, batch, progress=False)
                best[be] = min(best[be], time.perf_counter() - t0)
        dy.config.set(backend="numpy")
        print(f"{H:>5}{best['numpy']:>10.3f}{best['cpu']:>10.3f}{best['numpy'] / best['cpu']:>11.2f}", flush=True)


def _run_step(name: str, xs: list, out: np.ndarray) -> Callable:
    """One run of one step (dg_run_fwd) of op `name` over the rows of xs, as
    dynagraph.runs calls it (the row-pointer table built once, outside the timing)."""
    from dynagraph import runs
    from dynagraph.fusion import OPCODE
    B, n = out.shape
    code = np.array([runs.COPY if name == "copy" else OPCODE[name], len(xs)], np.int64)
    consts, rows, width = np.zeros(1), np.array([B], np.int64), np.array([n], np.int64)
    src = np.concatenate([x.ctypes.data + np.arange(B, dtype=np.int64) * x.strides[0] for x in xs])
    outs = np.array([out.ctypes.data], np.int64)
    ptr = "float **" if out.dtype == np.float32 else "double **"
    from dynagraph._kernels import ffi, lib  # the bench times the C entry point itself
    fwd = lib.dg_run_fwd_f32 if out.dtype == np.float32 else lib.dg_run_fwd_f64
    args = (ffi.from_buffer("int64_t[]", code), ffi.from_buffer("double[]", consts), 1,
            ffi.from_buffer("int64_t[]", rows), ffi.from_buffer("int64_t[]", width),
            ffi.cast(ptr, outs.ctypes.data), ffi.cast(ptr, src.ctypes.data))
    keep = (xs, out, src, outs, code, consts, rows, width)  # the pointers above are into these

    def call(keep=keep):
        fwd(*args)
    return call


def bench_runs(t: Table, rng, dt, batches, hidden) -> None:
    """A run's per-element cost against the op's own numpy code, one step at a time: a
    run wins by the Python per batch it removes, not by faster loops (runs.py)."""
    from dynagraph.backends import get_backend
    if get_backend("cpu").elementwise_runs is None:
        print("runs: compiled kernels not built")
        return
    npb = NumpyBackend(np)
    for name in ("logistic", "tanh", "cmult", "add", "copy"):
        for B in batches:
            for H in hidden:
                xs = [rng.standard_normal((B, H)).astype(dt) for _ in range(2 if name in ("cmult", "add") else 1)]
                out = np.empty((B, H), dt)
                if name == "copy":
                    f_np = xs[0].copy
                else:
                    op = OPS[name]
                    f_np = (lambda op=op, xs=xs: op.forward(npb.xp, (), None, *xs))
                t.add(f"run step {name}", f"B={B} H={H}", f_np, _run_step(name, xs, out))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--quick", action="store_true", help="B in {1, 64}, H in {64, 256}")
    ap.add_argument("--only", default="",
                    help="comma list of: rows,elementwise,softmax,cells,trainers,runs,cellgemm")
    ap.add_argument("--treelstm", action="store_true", help="also time TreeLSTM training per backend")
    ap.add_argument("--treelstm-only", action="store_true")
    args = ap.parse_args(argv)
    dy.config.set(threads=1)
    if args.treelstm_only:
        bench_treelstm()
        return
    dt = np.dtype(args.dtype).type
    batches, hidden = ((1, 64), (64, 256)) if args.quick else (BATCHES, HIDDEN)
    only = set(args.only.split(",")) if args.only else {"rows", "elementwise", "softmax", "cells", "trainers",
                                                         "runs", "cellgemm"}
    rng = np.random.default_rng(0)
    t = Table()
    if "rows" in only:
        bench_rows(t, rng, dt, batches, hidden)
    if "elementwise" in only:
        bench_unary_binary(t, rng, dt, batches, hidden)
    if "softmax" in only:
        bench_softmax(t, rng, dt, batches)
    if "cells" in only:
        bench_cells(t, rng, dt, batches, hidden)
    if "trainers" in only:
        bench_trainers(t, rng, dt, hidden)
    if "runs" in only:
        bench_runs(t, rng, dt, batches, hidden)
    if "cellgemm" in only:
        bench_cell_gemm(t, rng, dt, (32, 64, 128, 256))
    t.summary()
    if args.treelstm:
        bench_treelstm()


if __name__ == "__main__":
    main()
