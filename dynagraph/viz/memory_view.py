"""A planned dy.block's memory layout (ED-Batch's PQ-tree planner) drawn as a memory strip.

The strip is the block's variables in their planned memory order, widths growing with
size. Under it, one row per batched kernel of the block: for its results and each
operand list, a solid green bar where the list is consecutive in memory and in kernel
order (read or written in place), or red dashed boxes under each variable where a copy
remains (a gather, or a scatter for results). The slider steps through the kernels.
"""
from __future__ import annotations

import math
from html import escape

from ..memory.layout import Layout as MemoryLayout
from ..memory.layout import block_layouts
from .page import page, write_atomic
from .svg import FONT, batch_colours

CELL_H, ROW_H, LEFT = 40.0, 22.0, 150.0


def _width(size: int) -> float:
    return 72.0 + 14.0 * math.log2(1 + size / 4)


def _label(name: str) -> str:
    """"%8=logistic" -> "logistic %8"; inputs and parameters keep their names."""
    if name.startswith("%") and "=" in name:
        ref, op = name.split("=", 1)
        return f"{op} {ref}"
    return name


def strip_svg(lay: MemoryLayout, panel_id: str = "memory") -> tuple[str, list]:
    """The panel and its steps (results, operands, caption) per batch."""
    x, xs = LEFT, {}
    for v in lay.order:
        w = _width(lay.sizes[v])
        xs[v] = (x, w)
        x += w + 2
    width = x + 110  # room for the state label right of the last bar
    made = {v: k for k, b in enumerate(lay.batches) for v in b.results}
    colour = batch_colours([b.steps for b in lay.batches])
    rows = [(k, p, vs) for k, b in enumerate(lay.batches) for p, vs in [(-1, b.results)] + list(enumerate(b.operands))
            if vs is not None]
    height = 60 + CELL_H + 20 + len(rows) * (ROW_H + 4) + 40
    copies = len(lay.gathers)
    remain = "copy remains" if copies == 1 else "copies remain"
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="dg-panel" id="{panel_id}" width="{width:.0f}" '
            f'height="{height:.0f}" data-nodes="{len(lay.order)}" data-batches="{len(lay.batches)}" '
            f'data-copies="{copies}" data-in-place="{len(lay.aligned)}" style="{FONT};background:#fff">'),
           (f'<text x="8" y="18" font-size="14" font-weight="bold">memory order: {len(lay.order)} variables, '
            f'{len(lay.batches)} batched kernels, {copies} {remain} (naive layout: {lay.naive_kernels})</text>'),
           f'<text x="8" y="{60 + CELL_H / 2:.0f}" font-size="12">memory →</text>']
    for v in lay.order:
        x0, w = xs[v]
        k = made.get(v, -1)
        fill = colour[k] if k >= 0 else "#e8e8e8"
        out.append(f'<g class="node" data-node="{v}" data-batch="{k}" data-op="{escape(lay.names[v])}">'
                   f'<title>{escape(lay.names[v])}: offset {lay.offsets[v]}, {lay.sizes[v]} elements</title>'
                   f'<rect x="{x0:.1f}" y="60" width="{w:.1f}" height="{CELL_H:.0f}" fill="{fill}" stroke="#333"/>'
                   f'<text x="{x0 + w / 2:.1f}" y="{60 + 16:.0f}" font-size="9" text-anchor="middle">'
                   f'{escape(_label(lay.names[v])[:14])}</text><text x="{x0 + w / 2:.1f}" y="{60 + 31:.0f}" '
                   f'font-size="9" text-anchor="middle" fill="#444">@{lay.offsets[v]} [{lay.sizes[v]}]</text></g>')
    y = 60 + CELL_H + 20
    for k, p, vs in rows:
        out.append(_list_row(lay, k, p, vs, xs, y, width))
        y += ROW_H + 4
    out.append("</svg>")
    steps = []
    for k, b in enumerate(lay.batches):
        ops = [v for vs in b.operands if vs is not None for v in vs]
        kept = sum(1 for (kk, _) in lay.gathers if kk == k)
        state = "all lists in place" if not kept else f"{kept} list(s) copied"
        steps.append((list(b.results), ops, f"kernel {k}: {b.op} x{len(b.steps)}; {state}"))
    return "".join(out), steps


def _list_row(lay: MemoryLayout, k: int, p: int, vs: list, xs: dict, y: float, width: float) -> str:
    """One operand list (p >= 0) or the results (p = -1) of kernel k: a green bar under the strip
    where it is consecutive, else a red dashed box under each variable it copies."""
    b = lay.batches[k]
    ok = (k, p) in lay.aligned
    what = "results" if p < 0 else f"operand {p}"
    state = "in place" if ok else ("scatter (copy)" if p < 0 else "gather (copy)")
    tag = "in-place" if ok else "copy"
    out = [(f'<g class="dg-list dg-step-item" data-batch="{k}" data-pos="{p}" data-state="{tag}">'
            f'<rect class="dg-row" x="0" y="{y - 2:.1f}" width="{width:.0f}" height="{ROW_H + 2:.0f}" fill="none"/>'
            f'<text x="6" y="{y + 15:.1f}" font-size="11">#{k} {escape(b.op)} ×{len(b.steps)}: {what}</text>')]
    placed = [v for v in vs if v in xs]
    if ok and placed:
        x0 = min(xs[v][0] for v in placed)
        x1 = max(xs[v][0] + xs[v][1] for v in placed)
        out.append(f'<rect x="{x0:.1f}" y="{y + 3:.1f}" width="{x1 - x0:.1f}" height="{ROW_H - 6:.0f}" '
                   f'fill="#2ca02c" opacity="0.8"/><text x="{x1 + 6:.1f}" y="{y + 15:.1f}" font-size="10" '
                   f'fill="#1a661a">{state}</text>')
    elif placed:
        slots: dict = {}  # a variable read by several steps of the kernel: one box, every step named
        for i, v in enumerate(placed):
            slots.setdefault(v, []).append(str(i))
        for v, idx in slots.items():
            x0, w = xs[v]
            out.append(f'<rect x="{x0 + 2:.1f}" y="{y + 3:.1f}" width="{w - 4:.1f}" height="{ROW_H - 6:.0f}" '
                       f'fill="#fbdada" stroke="#d62728" stroke-dasharray="4 2"/>'
                       f'<text x="{x0 + w / 2:.1f}" y="{y + 14:.1f}" font-size="9" text-anchor="middle">'
                       f'step {",".join(idx)}</text>')
        x1 = max(xs[v][0] + xs[v][1] for v in placed)
        out.append(f'<text x="{x1 + 6:.1f}" y="{y + 15:.1f}" font-size="10" fill="#b00">{state}</text>')
    out.append("</g>")
    return "".join(out)


def memory(block_or_layout, path: str, batch_size: int = 8) -> dict:
    """Draw a dy.block's planned memory layout (its first traced signature), or a layout from
    dynagraph.memory.layout.compare, as an HTML page with a step slider over its kernels."""
    lay = block_or_layout
    if not isinstance(lay, MemoryLayout):
        found = block_layouts(block_or_layout, batch_size=batch_size)
        if not found:
            raise ValueError("this dy.block has not been traced yet: call it once before drawing its memory layout")
        lay = found[0]
    svg, steps = strip_svg(lay)
    note = ("ED-Batch's PQ-tree planner orders a block's variables in memory so that each batched kernel reads "
            "its operand lists in place. Top: the memory order (colour = the kernel that writes the variable, "
            "grey = inputs and parameters). Below, per kernel and list: a green bar is one consecutive read, red "
            f"dashed boxes are a copy that remains. Copies per call: {lay.kernels} kernels, {lay.bytes} bytes "
            f"(naive layout: {lay.naive_kernels} kernels, {lay.naive_bytes} bytes).")
    write_atomic(path, page("dynagraph: planned memory layout", note, [("memory", "memory", svg, steps)]))
    return {"variables": len(lay.order), "batches": len(lay.batches), "copies": len(lay.gathers),
            "in_place": len(lay.aligned), "naive_copies": lay.naive_kernels, "path": path}
