"""A dy.cavs run: its input graphs, each vertex coloured by the task that activated it.

Cavs evaluates F once per task: every vertex (of one vertex function, across all input
graphs) whose children are done. Drawn as one column per input graph, children above
parents, the slider steps through the tasks.
"""
from __future__ import annotations

from typing import Sequence

from .layout import place
from .model import Picture
from .page import page, write_atomic
from .svg import panel
from .views import steps


def _children(g) -> list:
    """The children lists of one input graph, in any form dy.cavs.run accepts."""
    if isinstance(g, dict):
        return list(g["children"])
    return list(getattr(g, "children", g))


def picture_of_run(out, graphs: Sequence) -> Picture:
    """Node ids number the vertices in task order (children before parents)."""
    tasks = out.task_vertices()
    gid, label, kind, sample, batches = {}, {}, {}, {}, []
    for name, members in tasks:
        batch = []
        for s, v in members:
            gid[(s, v)] = n = len(gid)
            label[n], kind[n], sample[n] = f"{name} v{v}", name, s
            batch.append(n)
        batches.append(batch)
    edges = [(gid[(s, c)], gid[(s, v)]) for s, g in enumerate(graphs)
             for v, kids in enumerate(_children(g)) for c in kids if c is not None and c >= 0]
    nodes = list(range(len(gid)))
    pic = Picture(nodes=nodes, label=label, shape={n: () for n in nodes},
                  edges=edges, sample=sample, columns=[f"graph {s}" for s in range(len(graphs))],
                  kind=kind)
    pic.schedules["cavs"] = batches
    return pic


def cavs(out, graphs: Sequence, path: str, layout_engine: str = "auto") -> dict:
    """Draw a dy.cavs run (the CavsOutput) over the input graphs it was given, as an HTML page."""
    pic = picture_of_run(out, graphs)
    if len(pic.nodes) != sum(len(_children(g)) for g in graphs):
        raise ValueError("these are not the input graphs of this dy.cavs run (vertex counts differ)")
    lay = place(pic, layout_engine)
    tasks = len(pic.schedules["cavs"])
    title = f"dy.cavs: {len(pic.nodes)} vertices in {len(graphs)} graphs, {tasks} tasks (evaluations of F)"
    svg = panel(pic, lay, "cavs", "cavs", title)
    note = ("Each box is one vertex of an input graph (children above parents). Vertices of one colour were "
            "activated together: one task, one evaluation of the vertex function over all of them, across "
            "graphs. Step through the tasks with the slider; the dashed red boxes are the children a task gathers.")
    write_atomic(path, page("dynagraph: a dy.cavs run", note, [("cavs", "tasks", svg, steps(pic, "cavs"))]))
    return {"vertices": len(pic.nodes), "edges": len(pic.edges), "tasks": tasks, "layout": lay.engine, "path": path}
