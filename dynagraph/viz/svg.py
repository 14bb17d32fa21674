"""SVG written directly: one panel = a Picture drawn with a Layout, coloured by one schedule.

Every node is a <g class="node"> carrying data-node, data-batch, data-op and data-sample,
every edge a <path class="edge"> carrying data-from and data-to, so a page script (and a
test) reads the drawing from the DOM. Colours are presentation attributes; a page's CSS
overrides them to show progress through the schedule.
"""
from __future__ import annotations

from html import escape
from typing import Sequence

from .layout import NODE_H, NODE_W, Layout
from .model import SHARED_COLUMNS, Picture

SINGLE = "#ffffff"   # a batch of one node: nothing was batched
FONT = "font-family:DejaVu Sans,Helvetica,Arial,sans-serif"


def batch_colours(batches: Sequence[Sequence[int]]) -> list[str]:
    """One colour per batch: batches of several nodes get well-separated hues (golden angle,
    two lightness levels), batches of one stay white, so "batched together" is "same colour"."""
    out, k = [], 0
    for b in batches:
        if len(b) > 1:
            hue = (k * 137.508) % 360
            out.append(f"hsl({hue:.0f},70%,{62 if k % 2 == 0 else 76}%)")
            k += 1
        else:
            out.append(SINGLE)
    return out


def _edge_path(lay: Layout, a: int, u: int) -> str:
    pts = lay.routes.get((a, u))
    if pts and len(pts) >= 4 and (len(pts) - 1) % 3 == 0:  # dot's B-spline: cubic Bezier pieces
        d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"
        for i in range(1, len(pts), 3):
            d += "C" + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts[i:i + 3])
        return d
    (x0, y0), (x1, y1) = lay.pos[a], lay.pos[u]
    return f"M{x0:.1f},{y0 + NODE_H / 2:.1f}L{x1:.1f},{y1 - NODE_H / 2:.1f}"


def panel(pic: Picture, lay: Layout, schedule: str, panel_id: str, title: str = "") -> str:
    """One <svg> element: nodes, edges, sample column headings and a title."""
    batches = pic.schedules[schedule]
    colour = batch_colours(batches)
    batch_of = pic.batch_of(schedule)
    multi = sum(1 for b in batches if len(b) > 1)
    view = f"0 0 {lay.width:.0f} {lay.height + 20:.0f}"
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="dg-panel" id="{escape(panel_id)}" '
            f'width="{lay.width:.0f}" height="{lay.height + 20:.0f}" viewBox="{view}" '
            f'data-schedule="{escape(schedule)}" data-nodes="{len(pic.nodes)}" data-edges="{len(pic.edges)}" '
            f'data-batches="{len(batches)}" data-multi-batches="{multi}" data-samples="{pic.n_samples}" '
            f'data-layout="{lay.engine}" style="{FONT};background:#fff">')]
    out.append(f'<defs><marker id="{escape(panel_id)}-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="6" '
               'markerHeight="6" orient="auto"><path d="M0,0L8,4L0,8z" fill="#777"/></marker></defs>')
    if title:
        out.append(f'<text x="8" y="16" font-size="14" font-weight="bold" class="dg-title">{escape(title)}</text>')
    for s, (x0, x1) in enumerate(lay.columns):
        name = pic.columns[s]
        ys = [lay.pos[n][1] for n in pic.nodes if pic.sample[n] == s]
        if pic.n_samples > 1 and ys and (name not in SHARED_COLUMNS or lay.engine == "layered"):
            y0, y1 = min(ys) - NODE_H / 2 - 8, max(ys) + NODE_H / 2 + 18  # the box ends under its own nodes
            out.append(f'<rect class="dg-column" x="{x0 - 6:.1f}" y="{y0:.1f}" width="{x1 - x0 + 12:.1f}" '
                       f'height="{y1 - y0:.1f}" fill="#f7f7fb" stroke="#ddd" rx="6"/>'
                       f'<text x="{(x0 + x1) / 2:.1f}" y="{y1 - 5:.1f}" text-anchor="middle" '
                       f'font-size="11" fill="#555">{escape(name)}</text>')
    for a, u in pic.edges:
        out.append(f'<path class="edge" data-from="{a}" data-to="{u}" d="{_edge_path(lay, a, u)}" fill="none" '
                   f'stroke="#888" stroke-width="1.1" marker-end="url(#{escape(panel_id)}-arrow)"/>')
    for n in pic.nodes:
        x, y = lay.pos[n]
        k = batch_of.get(n, -1)
        fill = colour[k] if k >= 0 else "#eeeeee"
        size = len(batches[k]) if k >= 0 else 0
        out.append(f'<g class="node" id="{escape(panel_id)}-n{n}" data-node="{n}" data-batch="{k}" '
                   f'data-op="{escape(pic.op_of(n))}" data-sample="{pic.sample[n]}">'
                   f'<title>node {n}: {escape(pic.label[n])} {pic.shape[n]} | batch {k} ({size} nodes)</title>'
                   f'<rect x="{x - NODE_W / 2:.1f}" y="{y - NODE_H / 2:.1f}" width="{NODE_W:.0f}" height="{NODE_H:.0f}" '
                   f'rx="5" fill="{fill}" stroke="#333" stroke-width="1"/>'
                   f'<text x="{x:.1f}" y="{y - 3:.1f}" text-anchor="middle" font-size="11">{escape(pic.label[n][:12])}</text>'
                   f'<text x="{x:.1f}" y="{y + 11:.1f}" text-anchor="middle" font-size="9" fill="#333">'
                   f'b{k}{"" if size < 2 else f" ×{size}"}</text></g>')
    out.append("</svg>")
    return "".join(out)

