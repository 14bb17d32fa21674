"""Cost of *recording* one node (µs/node), dynagraph vs DyNet, for typical ops.

    python bench/record_cost.py [--n 20000] [--H 64] [--repeats 5] [--json out.json]

Each row records `n` nodes of one op into a fresh graph and evaluates nothing,
so it measures what a user pays per dy.* call before any batching happens:
argument checks, shape inference, signature and depth bookkeeping, plus the
Python call itself. The TreeLSTM row records whole minibatches of trees
(bench/dy_models.py) and divides by the nodes recorded. Best of `repeats`.
DyNet is measured in the same process when `import dynet` works (its autobatch
flag does not change recording).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import params, workloads  # noqa: E402
from bench.dy_models import DyModel  # noqa: E402


def op_cases(dy, H: int) -> dict:
    """name -> (setup(pc) -> state, record(state) -> expression); one node per record call
    except where the name says otherwise."""
    def base(pc):
        W = pc.add_parameters((H, H))
        W5 = pc.add_parameters((5 * H, H))
        b = pc.add_parameters(H)
        E = pc.add_lookup_parameters((1000, H))
        return dict(W=W, W5=W5, b=b, E=E)

    def exprs(s):
        dy.renew_cg()
        s["We"], s["W5e"], s["be"] = s["W"].expr(True), s["W5"].expr(True), s["b"].expr(True)
        s["x"], s["y"] = dy.lookup(s["E"], 1), dy.lookup(s["E"], 2)
        s["g"] = s["W5e"] * s["x"]
        return s

    return {
        "lookup": lambda s: dy.lookup(s["E"], 3),
        "tanh": lambda s: dy.tanh(s["x"]),
        "logistic": lambda s: dy.logistic(s["x"]),
        "cmult": lambda s: dy.cmult(s["x"], s["y"]),
        "x + y": lambda s: s["x"] + s["y"],
        "W * x (matmul)": lambda s: s["We"] * s["x"],
        "affine (b, W, x)": lambda s: dy.affine_transform([s["be"], s["We"], s["x"]]),
        "affine (b, W, x, W, y)": lambda s: dy.affine_transform([s["be"], s["We"], s["x"], s["We"], s["y"]]),
        "pick_range": lambda s: dy.pick_range(s["g"], 0, H),
        "concatenate (2)": lambda s: dy.concatenate([s["x"], s["y"]]),
        "esum (2)": lambda s: dy.esum([s["x"], s["y"]]),
        "pickneglogsoftmax": lambda s: dy.pickneglogsoftmax(s["x"], 1),
    }, base, exprs


def time_op(dy, record, state, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        state = state["_exprs"](state)
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(n):
            record(state)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def time_treelstm(dy, H: int, repeats: int, batch: int = 64) -> tuple[float, int]:
    """µs per recorded node when building one minibatch of TreeLSTM losses (no evaluation)."""
    trees, vocab = workloads.load("treelstm", batch, seed=0)
    model = DyModel(dy, "treelstm", params.init_arrays("treelstm", H, vocab, 5), lr=0.0)
    best, nodes = float("inf"), 0
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        loss = model.graph(trees)
        dt = time.perf_counter() - t0
        nodes = _graph_size(dy, loss)
        best = min(best, dt)
    return best / nodes * 1e6, nodes


def _graph_size(dy, loss) -> int:
    cg = dy.cg()
    if hasattr(cg, "op"):          # dynagraph: parallel node lists
        return len(cg.op)
    return int(str(loss).split()[1].split("/")[0]) + 1  # DyNet prints "expression <index>/<graph>"


def measure(dy, H: int, n: int, repeats: int) -> dict:
    cases, base, exprs = op_cases(dy, H)
    state = base(dy.ParameterCollection())
    state["_exprs"] = exprs
    out = {name: time_op(dy, rec, state, n, repeats) for name, rec in cases.items()}
    out["TreeLSTM minibatch (64 trees)"], out["_treelstm_nodes"] = time_treelstm(dy, H, repeats)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="nodes recorded per op and repeat")
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-dynet", action="store_true")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)
    import dynagraph
    systems = {"dynagraph": measure(dynagraph, args.H, args.n, args.repeats)}
    if not args.no_dynet:
        try:
            import dynet
        except ImportError:
            dynet = None
        if dynet is not None:
            systems["dynet"] = measure(dynet, args.H, args.n, args.repeats)
    print(table(systems))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"H": args.H, "n": args.n, "us_per_node": systems}, f, indent=1)
    return systems


def table(systems: dict) -> str:
    names = [n for n in next(iter(systems.values())) if not n.startswith("_")]
    cols = list(systems)
    width = max(len(n) for n in names) + 2
    lines = [f"{'op (µs per recorded node)':<{width}}" + "".join(f"{c:>12}" for c in cols)
             + (f"  {cols[0]}/{cols[1]}" if len(cols) == 2 else "")]
    for name in names:
        vals = [systems[c][name] for c in cols]
        ratio = f"{vals[0] / vals[1]:7.1f}x" if len(vals) == 2 and vals[1] > 0 else ""
        lines.append(f"{name:<{width}}" + "".join(f"{v:>12.2f}" for v in vals) + "  " + ratio)
    nodes = ", ".join(f"{c} {systems[c]['_treelstm_nodes']}" for c in cols)
    lines.append(f"(TreeLSTM minibatch nodes recorded: {nodes})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
