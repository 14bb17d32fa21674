"""Node positions for a Picture: Graphviz `dot` when it is installed, else a layered layout.

Both put arguments above their users and each sample in its own column (a Graphviz
cluster), so the same step of different samples sits at the same height and a batch that
spans samples reads as a horizontal band of one colour.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

from .model import SHARED_COLUMNS, Picture

NODE_W, NODE_H = 78.0, 34.0     # pixels
GAP_X, GAP_Y = 14.0, 30.0       # between boxes of one layer, between layers
COLUMN_GAP = 40.0               # between samples
MARGIN = 16.0
DOT_TIMEOUT_S = 20.0
DPI = 72.0                      # Graphviz plain output is in inches


@dataclass
class Layout:
    pos: dict[int, tuple[float, float]]                 # node id -> box centre (pixels)
    width: float
    height: float
    engine: str                                         # "dot" or "layered"
    routes: dict[tuple[int, int], list] = field(default_factory=dict)  # edge -> spline points (dot only)
    columns: list[tuple[float, float]] = field(default_factory=list)   # sample -> (x0, x1)


def layers(pic: Picture) -> dict[int, int]:
    """Longest path from the graph's inputs, counted over drawn edges only."""
    args: dict[int, list] = {n: [] for n in pic.nodes}
    for a, u in pic.edges:
        args[u].append(a)
    layer: dict[int, int] = {}
    for n in pic.nodes:  # node ids are a topological order: arguments are recorded first
        layer[n] = 1 + max((layer[a] for a in args[n]), default=-1)
    return layer


def layered(pic: Picture) -> Layout:
    """Layers by longest path; within a layer, nodes ordered by the mean position of their
    arguments (one barycentre sweep down), so chains stay straight."""
    layer = layers(pic)
    args: dict[int, list] = {n: [] for n in pic.nodes}
    for a, u in pic.edges:
        args[u].append(a)
    depth = 1 + max(layer.values(), default=-1)
    slot: dict[int, float] = {}
    rows: dict[tuple[int, int], list] = {}
    for n in pic.nodes:
        rows.setdefault((pic.sample[n], layer[n]), []).append(n)
    for (s, d) in sorted(rows, key=lambda k: k[1]):
        row = rows[(s, d)]
        key = {n: (sum(slot[a] for a in args[n] if a in slot) / max(1, sum(1 for a in args[n] if a in slot))
                   if any(a in slot for a in args[n]) else float("inf"), n) for n in row}
        row.sort(key=key.__getitem__)
        for k, n in enumerate(row):
            slot[n] = float(k)
    pos: dict[int, tuple[float, float]] = {}
    columns = []
    x0 = MARGIN
    for s in range(pic.n_samples):
        widest = max((len(r) for (c, _), r in rows.items() if c == s), default=0)
        span = widest * NODE_W + max(0, widest - 1) * GAP_X
        for (c, d), row in rows.items():
            if c != s:
                continue
            off = x0 + (span - (len(row) * NODE_W + (len(row) - 1) * GAP_X)) / 2
            for k, n in enumerate(row):
                pos[n] = (off + k * (NODE_W + GAP_X) + NODE_W / 2, MARGIN + 18 + d * (NODE_H + GAP_Y) + NODE_H / 2)
        columns.append((x0, x0 + span))
        x0 += span + COLUMN_GAP
    height = 2 * MARGIN + 18 + depth * (NODE_H + GAP_Y)
    return Layout(pos, max(x0 - COLUMN_GAP + MARGIN, 2 * MARGIN), height, "layered", columns=columns)


def dot_source(pic: Picture) -> str:
    w, h = NODE_W / DPI, NODE_H / DPI
    lines = ["digraph G {", "  rankdir=TB; nodesep=0.2; ranksep=0.4; newrank=true;",
             f'  node [shape=box, fixedsize=true, width={w:.3f}, height={h:.3f}, label=""];']
    for s, name in enumerate(pic.columns):
        members = [f"n{n};" for n in pic.nodes if pic.sample[n] == s]
        if name not in SHARED_COLUMNS:  # the shared loss is not a sample: no cluster box
            lines.append(f"  subgraph cluster_{s} {{ {' '.join(members)} }}")
        else:
            lines.append(f"  {' '.join(members)}")
    by_layer: dict = {}
    for n, d in layers(pic).items():  # the same step of every sample at the same height
        by_layer.setdefault(d, []).append(n)
    lines.extend(f"  {{ rank=same; {' '.join(f'n{n};' for n in ns)} }}" for ns in by_layer.values())
    lines.extend(f"  n{a} -> n{u};" for a, u in pic.edges)
    lines.append("}")
    return "\n".join(lines)


def parse_plain(text: str, pic: Picture) -> Layout:
    """Graphviz `-Tplain`: inches, y upwards; converted to pixels, y downwards."""
    pos, routes = {}, {}
    height = width = 0.0
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "graph":
            width, height = float(f[2]) * DPI, float(f[3]) * DPI
        elif f[0] == "node":
            pos[int(f[1][1:])] = (float(f[2]) * DPI + MARGIN, height - float(f[3]) * DPI + MARGIN + 18)
        elif f[0] == "edge":
            k = int(f[3])
            pts = [(float(f[4 + 2 * i]) * DPI + MARGIN, height - float(f[5 + 2 * i]) * DPI + MARGIN + 18)
                   for i in range(k)]
            routes[(int(f[1][1:]), int(f[2][1:]))] = pts
    missing = [n for n in pic.nodes if n not in pos]
    if missing:
        raise ValueError(f"dot placed {len(pos)} of {len(pic.nodes)} nodes")
    columns = []
    for s in range(pic.n_samples):
        xs = [pos[n][0] for n in pic.nodes if pic.sample[n] == s]
        columns.append((min(xs) - NODE_W / 2, max(xs) + NODE_W / 2) if xs else (0.0, 0.0))
    # dot's bounding box can be wider than what it placed (ranks pinned across clusters): fit the drawing
    right = max([x + NODE_W / 2 for x, _ in pos.values()] + [x for pts in routes.values() for x, _ in pts])
    return Layout(pos, min(width + 2 * MARGIN, right + MARGIN), height + 2 * MARGIN + 18, "dot", routes, columns)


def graphviz(pic: Picture) -> Layout | None:
    """The dot layout, or None when dot is not installed, fails or takes too long."""
    exe = shutil.which("dot")
    if exe is None or not pic.nodes:
        return None
    try:
        out = subprocess.run([exe, "-Tplain"], input=dot_source(pic), capture_output=True, text=True,
                             timeout=DOT_TIMEOUT_S, check=True).stdout
        return parse_plain(out, pic)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def place(pic: Picture, engine: str = "auto") -> Layout:
    """engine: "auto" (dot when installed), "dot" (error without it) or "layered"."""
    if engine not in ("auto", "dot", "layered"):
        raise ValueError(f"layout engine must be 'auto', 'dot' or 'layered', got {engine!r}")
    if engine != "layered":
        found = graphviz(pic)
        if found is not None:
            return found
        if engine == "dot":
            raise RuntimeError("Graphviz 'dot' is not installed or failed; use engine='layered'")
    return layered(pic)
