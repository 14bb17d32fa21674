"""Compare batching schedulers on the workloads of examples/workloads.

    python bench/compare_schedulers.py                          # every workload, every scheduler
    python bench/compare_schedulers.py --workloads treelstm,latticelstm --instances 16
    python bench/compare_schedulers.py --quick                  # small graphs, few episodes
    python bench/compare_schedulers.py --workloads nerlattice,latticelstm,latticegru --encodings chain
                                      # the real NER lattices: DYNAGRAPH_DATA=/path/to/shared/data

For each workload, FSM policies (one per encoding) are trained on one graph of
`--instances` samples (data seed 1); every scheduler is then measured on a
*different* graph of the same size (data seed 2), so FSM numbers include states
the policy never saw. Columns:

    batches      forward batches of the schedule of the whole graph
    x LB         batches / lower bound (schedulers.lower_bound)
    sched ms     one schedule() call on the recorded graph, CPU time (best of --reps); "x agenda" per node
    exec ms      the forward pass of that graph with its schedule given (computed beforehand), CPU time, best
                 of --reps: what the schedule's batches cost to run, apart from finding them
    record/forward/backward/step ms
                 one training step (renew_cg + record, forward, backward, then freeing its graph,
                 counted in step), CPU time (process_time: stable under load, where wall time
                 measures the neighbours), best of --reps rounds interleaved across schedulers;
                 "step x agenda" is the ratio; "wall ms" the same step's wall time. Python's cycle
                 collector runs between steps, untimed: where its full passes fell (10+ ms on
                 a lattice graph) had moved one scheduler's record time by 2x within a run
    NAME+merge   NAME followed by the batch-merging post-pass (schedulers/merge.py); fsm-ENC+merge with --merge
    fsm-ENC      the learned policy itself; "fsm-ENC>agenda" (or >depth, >agenda+merge) is the FSM scheduler as
                 a user gets it when dy.fsm.train measured the policy's step slower than that
                 baseline's on the training graph (Policy.defer_to)
    hit %        FSM decisions found in the policy table (the rest use the fallback);
                 "-" when settling left no decision to make
    train s      FSM training CPU time, timing its expected step included (episodes run in parentheses)

Prints a Markdown table and writes bench/results/compare_schedulers.{md,json}.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python bench/compare_schedulers.py` puts bench/, not the repo, on the path
    sys.path.insert(0, ROOT)

import dynagraph as dy  # noqa: E402
import dynagraph.fsm as fsm  # noqa: E402
from dynagraph import schedulers  # noqa: E402
from dynagraph.schedulers import typewise  # noqa: E402,F401  (registers "typewise")
from examples.workloads import WORKLOADS  # noqa: E402

BASELINES = ["none", "depth", "agenda", "lookahead", "agenda+merge", "typewise"]


def pending(cg) -> list[int]:
    cg._sync_values()
    return [i for i in range(cg.done, len(cg)) if not cg.op[i].leaf]


def train_policies(w, xs, encodings, args) -> dict:
    out = {}
    for enc in encodings:
        t0 = time.process_time()
        pol = fsm.train(lambda: w.graph(xs), encoding=enc, episodes=args.episodes, seed=0,
                        time_limit=args.time_limit, progress=not args.quiet)
        out[enc] = (pol, time.process_time() - t0)
    return out


def schedule_stats(w, xs, name, sched, reps: int) -> dict:
    """Batches and scheduling time (best of reps) of one scheduler on the recorded graph of xs."""
    cg = w.graph(xs)
    nodes = pending(cg)
    best = float("inf")
    for _ in range(reps):
        if hasattr(sched, "hits"):
            sched.hits = sched.misses = 0
        t0 = time.process_time()
        batches = sched.schedule(cg, nodes)
        best = min(best, time.process_time() - t0)
    schedulers.validate(cg, nodes, batches, name)
    extra = {}
    if hasattr(sched, "hits"):  # FSM: share of decisions found in the table (None: no decision left)
        decisions = sched.hits + sched.misses
        extra = {"hit_rate": sched.hits / decisions if decisions else None, "decisions": decisions}
    extra["exec_ms"] = 1e3 * execute_given(w, xs, batches, reps)
    return {"batches": len(batches), "nodes": len(nodes), "sched_ms": 1e3 * best,
            "sched_us_node": 1e6 * best / max(len(nodes), 1), **extra}


class _Given:
    """A scheduler that hands out a schedule computed beforehand for the same recording (node ids
    repeat), so that a forward pass times execution alone. It checks the schedule against the
    graph's pending nodes on its first call (an untimed warm-up pass)."""
    name = "given"

    def __init__(self, batches):
        self.batches = [list(b) for b in batches]
        self.trusted = False

    def schedule(self, cg, nodes):
        out = [list(b) for b in self.batches]
        if not self.trusted:
            schedulers.validate(cg, nodes, out, self.name)
            self.trusted = True
        return out


def execute_given(w, xs, batches, reps: int) -> float:
    """CPU seconds of the forward pass of xs's graph run with `batches` as its schedule (best of
    reps, after one untimed pass that checks the schedule fits the graph)."""
    given, best = _Given(batches), float("inf")
    for k in range(reps + 1):
        gc.collect()
        w.graph(xs, scheduler=given)
        t0 = time.process_time()
        w.last_loss.value()
        if k:
            best = min(best, time.process_time() - t0)
        w.last_loss = None
        dy.renew_cg()
    return best


def step_times(w, xs, sched) -> dict:
    """One training step: record (renew_cg + record), forward, backward and freeing the step's
    graph; CPU milliseconds of each (time.process_time: on a shared machine wall time mostly
    measures the neighbours; with one BLAS thread the step is single-threaded) and the wall
    milliseconds of the whole step. The graph is freed inside the step that made it (not in the
    next scheduler's record) and the cycle collector runs before the step, untimed, so that where
    its passes fall does not decide which scheduler looks faster."""
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    w.graph(xs, scheduler=sched)
    c1 = time.process_time()
    w.last_loss.value()
    c2 = time.process_time()
    w.last_loss.backward()
    c3 = time.process_time()
    w.last_loss = None
    dy.renew_cg()  # drops the step's graph: its blocks, records and gradients are freed here
    c4, w4 = time.process_time(), time.perf_counter()
    return {"record_ms": 1e3 * (c1 - c0), "forward_ms": 1e3 * (c2 - c1), "backward_ms": 1e3 * (c3 - c2),
            "free_ms": 1e3 * (c4 - c3), "e2e_ms": 1e3 * (c4 - c0), "wall_ms": 1e3 * (w4 - w0)}


def measure_steps(w, xs, scheds: list, reps: int) -> dict:
    """Best of reps per scheduler, rounds interleaved (every scheduler once per round) so load
    changes on a shared machine hit all of them alike."""
    best: dict = {}
    for _ in range(reps):
        for sname, sched in scheds:
            r = step_times(w, xs, sched)
            if sname not in best or r["e2e_ms"] < best[sname]["e2e_ms"]:
                best[sname] = r
    return best


def run_workload(name: str, args) -> list[dict]:
    w = WORKLOADS[name](hidden=args.hidden, seed=0)
    train_xs = w.instances(args.instances, seed=1)
    test_xs = w.instances(args.instances, seed=2)
    cg = w.graph(test_xs)
    lb = schedulers.lower_bound(cg, pending(cg))
    policies = train_policies(w, train_xs, args.encodings, args)
    rows = []
    scheds = [(s, schedulers.get(s)) for s in args.baselines]
    for enc, (pol, _) in policies.items():
        own = fsm.Policy(pol.encoding, pol.types, pol.table, pol.q, pol.meta, pol.settle,
                         hold_tail=pol.hold_tail)  # never defers
        scheds.append((f"fsm-{enc}", fsm.Scheduler(own)))
        if args.merge:
            scheds.append((f"fsm-{enc}+merge", schedulers.merge.Merged(fsm.Scheduler(own))))
        if pol.defer_to:
            scheds.append((f"fsm-{enc}>{pol.defer_to}", fsm.Scheduler(pol)))
    steps = measure_steps(w, test_xs, scheds, args.reps)
    for sname, sched in scheds:
        r = {"workload": name, "kind": w.kind, "scheduler": sname, "lower_bound": lb}
        r.update(schedule_stats(w, test_xs, sname, sched, args.reps))
        r.update(steps[sname])
        r["x_lb"] = r["batches"] / max(lb, 1)
        if sname.startswith("fsm-"):
            pol, secs = policies[sname[4:].partition(">")[0].partition("+")[0]]
            r.update({"train_s": secs, "episodes": pol.meta["episodes"],
                      "train_batches": pol.meta["batches"], "train_lower_bound": pol.meta["lower_bound"],
                      "states": len(pol)})
        rows.append(r)
    agenda = next((r for r in rows if r["scheduler"] == "agenda"), None)
    for r in rows:
        if agenda:
            r["x_agenda_e2e"] = r["e2e_ms"] / agenda["e2e_ms"]
            r["x_agenda_sched_node"] = r["sched_us_node"] / agenda["sched_us_node"]
        if not args.quiet:
            print(f"  {name:<14} {r['scheduler']:<10} {r['batches']:>6} batches (x{r['x_lb']:.2f} LB) "
                  f"{r['e2e_ms']:.0f} ms/step", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| workload | scheduler | batches | LB | x LB | sched ms | sched x agenda (per node) | exec ms | "
            "record ms | forward ms | backward ms | step ms | step x agenda | wall ms | hit % | train s (episodes) |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    lines = [head]
    for r in rows:
        hit = "" if "hit_rate" not in r else "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.0f}"
        tr = f"{r['train_s']:.1f} ({r['episodes']})" if "train_s" in r else ""
        lines.append(f"| {r['workload']} | {r['scheduler']} | {r['batches']} | {r['lower_bound']} | "
                     f"{r['x_lb']:.3f} | {r['sched_ms']:.1f} | {r.get('x_agenda_sched_node', float('nan')):.2f} | "
                     f"{r['exec_ms']:.1f} | {r['record_ms']:.0f} | {r['forward_ms']:.0f} | {r['backward_ms']:.0f} | {r['e2e_ms']:.0f} | "
                     f"{r.get('x_agenda_e2e', float('nan')):.2f} | {r['wall_ms']:.0f} | {hit} | {tr} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """Per workload: best FSM (fewest batches) against the lower bound, agenda's step and the better
    of agenda and depth end to end."""
    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        rs = {r["scheduler"]: r for r in rows if r["workload"] == name}
        fsms = [r for k, r in rs.items() if k.startswith("fsm-") and ">" not in k]
        if not fsms or "agenda" not in rs:
            continue
        best = min(fsms, key=lambda r: r["batches"])
        line = (f"- {name}: {best['scheduler']} {best['batches']} batches = x{best['x_lb']:.3f} LB; "
                f"step x{best['e2e_ms'] / rs['agenda']['e2e_ms']:.2f} agenda's")
        if "depth" in rs:
            line += f", x{best['e2e_ms'] / min(rs['agenda']['e2e_ms'], rs['depth']['e2e_ms']):.2f} min(agenda, depth)"
        defer = [k for k in rs if k.startswith(best["scheduler"] + ">")]
        if defer:
            line += f"; deferring ({defer[0]}): step x{rs[defer[0]]['e2e_ms'] / rs['agenda']['e2e_ms']:.2f} agenda's"
        if "agenda+merge" in rs:
            am = rs["agenda+merge"]
            line += f"; agenda+merge {am['batches']} batches = x{am['x_lb']:.3f} LB, step x{am['x_agenda_e2e']:.2f} agenda's"
        if "typewise" in rs:
            line += f"; typewise {rs['typewise']['batches']} batches"
        out.append(line)
    return "\n".join(out)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated (default: all)")
    ap.add_argument("--encodings", default="chain,base", help="FSM state encodings, comma-separated "
                    "(default chain,base: dy.fsm.train's default and ED-Batch's type set)")
    ap.add_argument("--baselines", default=",".join(BASELINES), help=f"comma-separated (default {BASELINES})")
    ap.add_argument("--merge", action="store_true", help="also each FSM policy followed by the batch-merging "
                    "post-pass (fsm-ENC+merge; schedulers/merge.py); agenda+merge is among the default baselines")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1, the project convention)")
    ap.add_argument("--instances", type=int, default=32, help="samples per graph (default 32)")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--episodes", type=int, default=1000, help="FSM training episodes at most")
    ap.add_argument("--time-limit", type=float, default=60.0, help="FSM training CPU seconds at most")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, interleaved across schedulers (best kept)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--quick", action="store_true", help="8 instances, 100 episodes, 1 rep")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--plot", default=None, help="also draw batches / lower bound as a chart (.png/.svg; "
                    "needs pip install -e '.[plot]')")
    args = ap.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.encodings = [e for e in args.encodings.split(",") if e]
    args.baselines = [b for b in args.baselines.split(",") if b]
    if args.quick:
        args.instances, args.episodes, args.reps = 8, 100, 1
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    dy.config.set(threads=args.threads)
    rows = []
    for name in args.workloads:
        rows += run_workload(name, args)
    text = (f"# Scheduler comparison\n\n{args.instances} instances per graph, hidden {args.hidden}, "
            f"FSM trained on another graph of the model ({platform.processor() or platform.machine()}, "
            f"python {platform.python_version()})\n\n{table(rows)}\n\n{summary(rows)}\n")
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare_schedulers.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "compare_schedulers.json"), "w") as f:
        json.dump({"config": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}, f, indent=1)
    if args.plot:
        from bench.plot import grouped_bars
        grouped_bars(args.plot, rows, "workload", "scheduler", "x_lb", ylabel="batches / lower bound",
                     title=f"Batches per scheduler ({args.instances} instances per graph)", hline=1.0, log=True,
                     hline_label="lower bound")
        print(f"chart -> {args.plot}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
