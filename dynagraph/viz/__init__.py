"""dy.viz: see what the batcher did.

    dy.viz.graph(cg, "g.svg")          the recorded graph, each node coloured by its batch
    dy.viz.schedule(cg, "s.html")      step-by-step viewer (one self-contained HTML file)
    dy.viz.compare(cg, "c.html")       depth, agenda, typewise, FSM side by side, with the lower bound
    dy.viz.memory(block, "m.html")     a planned dy.block's PQ-tree layout as a memory strip
    dy.viz.cavs(out, graphs, "v.html") a dy.cavs run: input graphs with per-task activation
    dy.viz.screenshot("s.html", "s.png")   a PNG of a written view (selenium + headless chromium)

SVG is written directly; Graphviz `dot` lays graphs out when it is installed, a built-in
layered layout otherwise (layout_engine="layered" forces it).
"""
from .browser import screenshot  # noqa: F401  (needs selenium and chromium; imported only when called)
from .cavs_view import cavs  # noqa: F401
from .layout import Layout, place  # noqa: F401
from .memory_view import memory  # noqa: F401
from .model import Picture, lower_bound, picture, schedule_of  # noqa: F401
from .views import compare, graph, schedule  # noqa: F401
