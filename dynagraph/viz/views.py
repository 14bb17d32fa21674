"""The graph views: a recorded graph coloured by batch, the step-by-step schedule viewer,
and the schedulers side by side."""
from __future__ import annotations

from html import escape
from typing import Sequence

from .. import fsm as _fsm
from .layout import Layout, place
from .model import Picture, lower_bound, picture, schedule_of
from .page import page, write_atomic
from .svg import panel

COMPARED = ("depth", "agenda", "typewise", "fsm")


def steps(pic: Picture, name: str) -> list[tuple]:
    """Per batch of schedule `name`: (its nodes, the drawn nodes it reads, a caption)."""
    out = []
    for k, batch in enumerate(pic.schedules[name]):
        reads = pic.reads(batch)
        ops = sorted({pic.op_of(n) for n in batch})
        cols = sorted({pic.columns[pic.sample[n]] for n in batch})
        caption = f"batch {k}: {'/'.join(ops)} x{len(batch)} from {', '.join(cols)}; reads {len(reads)} node(s)"
        out.append((batch, reads, caption))
    return out


def _prepare(cg, samples, scheduler, engine: str) -> tuple[Picture, Layout, str]:
    pic = picture(cg, samples)
    name = scheduler if isinstance(scheduler, str) else (
        getattr(scheduler, "name", None) or (cg.scheduler if isinstance(cg.scheduler, str) else "schedule"))
    pic.schedules[name] = schedule_of(cg, scheduler)
    pic.lower_bound = lower_bound(cg)
    return pic, place(pic, engine), name


def _summary(pic: Picture, name: str) -> str:
    b = pic.schedules[name]
    return (f"{len(pic.nodes)} nodes, {len(b)} batches ({sum(1 for x in b if len(x) > 1)} of several nodes), "
            f"lower bound {pic.lower_bound}")


def graph(cg, path: str, samples: Sequence | None = None, scheduler=None, layout_engine: str = "auto") -> dict:
    """Draw the recorded graph, each node coloured by its batch, samples side by side.

    path ending in .svg: a standalone picture; .html: the same with the step slider.
    samples: one Expression per sample (e.g. its loss); by default the arguments of the
    graph's final sum. scheduler: draw what this scheduler would run (the graph must not
    be evaluated yet); default the graph's own, or the batches that ran.
    Returns {"nodes", "edges", "batches", "lower_bound", "layout", "path"}.
    """
    pic, lay, name = _prepare(cg, samples, scheduler, layout_engine)
    title = f"{name}: {_summary(pic, name)}"
    svg = panel(pic, lay, name, "graph", title)
    if path.endswith(".html"):
        note = ("Each box is one recorded operation; boxes of one colour ran as one batched kernel "
                "(white: a batch of one). Columns are samples. Move the slider to run the schedule.")
        text = page("dynagraph: recorded graph by batch", note, [("graph", name, svg, steps(pic, name))])
    else:
        text = '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n"
    write_atomic(path, text)
    return {"nodes": len(pic.nodes), "edges": len(pic.edges), "batches": len(pic.schedules[name]),
            "lower_bound": pic.lower_bound, "layout": lay.engine, "path": path}


def schedule(cg, path: str, samples: Sequence | None = None, scheduler=None, layout_engine: str = "auto") -> dict:
    """The step-by-step viewer: one self-contained HTML file. A slider and step buttons walk
    the schedule; the batch that runs is outlined in black, what it reads in dashed red."""
    if not path.endswith((".html", ".htm")):
        raise ValueError(f"dy.viz.schedule writes an HTML file; got {path!r}")
    pic, lay, name = _prepare(cg, samples, scheduler, layout_engine)
    svg = panel(pic, lay, name, "graph", f"{name}: {_summary(pic, name)}")
    rows = "".join(f"<tr><td>{escape(op)}</td><td>{n}</td><td>{b}</td></tr>"
                   for op, (n, b) in sorted(_by_op(pic, name).items()))
    extra = f'<table class="dg" id="dg-byop"><tr><th>op</th><th>nodes</th><th>batches</th></tr>{rows}</table>'
    note = ("Step through the schedule: the batch that runs is outlined in black, the nodes it reads are "
            "outlined in dashed red, batches already run keep their colour, later ones are grey. "
            "Boxes of one colour ran as one kernel; columns are samples. Arrow keys step too.")
    write_atomic(path, page("dynagraph: step-by-step schedule", note, [("graph", name, svg, steps(pic, name))], extra))
    return {"nodes": len(pic.nodes), "edges": len(pic.edges), "batches": len(pic.schedules[name]),
            "lower_bound": pic.lower_bound, "layout": lay.engine, "path": path}


def _by_op(pic: Picture, name: str) -> dict:
    out: dict = {}
    for b in pic.schedules[name]:
        n, k = out.get(pic.label[b[0]], (0, 0))
        out[pic.label[b[0]]] = (n + len(b), k + 1)
    return out


def compare(graph_or_fn, path: str, schedulers: Sequence = COMPARED, samples: Sequence | None = None,
            fsm_policy=None, fsm_episodes: int = 300, layout_engine: str = "auto") -> dict:
    """depth, agenda, typewise and FSM side by side on the same recorded graph, with batch
    counts and the lower bound; one HTML page, one slider stepping all panels at once.

    graph_or_fn: a recorded graph not yet evaluated, or a function recording one. "fsm"
    uses fsm_policy, or trains a policy on this graph first (fsm_episodes, seconds).
    Returns {scheduler name: batch count, "lower_bound": ..., "nodes": ...}.
    """
    cg = graph_or_fn() if callable(graph_or_fn) else graph_or_fn
    if not cg.pending_nodes():
        raise ValueError("dy.viz.compare needs a recorded graph that is not evaluated yet")
    pic = picture(cg, samples)
    pic.lower_bound = lower_bound(cg)
    names = []
    for s in schedulers:
        name = s if isinstance(s, str) else getattr(s, "name", type(s).__name__)
        spec = s
        if s == "fsm":
            policy = fsm_policy if fsm_policy is not None else _fsm.train(cg, encoding="sort", episodes=fsm_episodes,
                                                                            progress=False, time_limit=10.0)
            spec = _fsm.FSMScheduler(policy)
        pic.schedules[name] = schedule_of(cg, spec)
        names.append(name)
    lay = place(pic, layout_engine)
    panels = []
    for name in names:
        title = f"{name}: {len(pic.schedules[name])} batches (lower bound {pic.lower_bound})"
        panels.append((f"panel-{name}", name, panel(pic, lay, name, f"panel-{name}", title), steps(pic, name)))
    rows = "".join(f'<tr data-scheduler="{escape(n)}"><td>{escape(n)}</td><td>{len(pic.schedules[n])}</td>'
                   f"<td>{len(pic.schedules[n]) / max(1, pic.lower_bound):.2f}</td></tr>" for n in names)
    extra = (f'<table class="dg" id="dg-counts"><tr><th>scheduler</th><th>batches</th><th>/ lower bound '
             f"({pic.lower_bound})</th></tr>{rows}</table>")
    note = (f"The same recorded graph ({len(pic.nodes)} nodes) scheduled four ways. Same colour = one batched "
            "kernel. The lower bound counts, per signature, the longest chain of that signature: no schedule "
            "needs fewer batches. The slider runs step k of every schedule at once.")
    write_atomic(path, page("dynagraph: schedulers side by side", note, panels, extra))
    out = {n: len(pic.schedules[n]) for n in names}
    out.update(lower_bound=pic.lower_bound, nodes=len(pic.nodes), layout=lay.engine, path=path)
    return out
