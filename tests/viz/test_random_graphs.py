"""Property test: on random recorded graphs (the schedulers' random-graph generator), every
view draws each non-leaf node once, its edges, and exactly the batches the scheduler runs;
the built-in layout puts arguments above users without overlapping boxes."""
from __future__ import annotations

import importlib.util
import os
import re

from hypothesis import HealthCheck, given, settings

import dynagraph as dy
from dynagraph.viz import layout as L
from dynagraph.viz.model import picture

_spec = importlib.util.spec_from_file_location(
    "viz_random_graph", os.path.join(os.path.dirname(os.path.dirname(__file__)), "schedulers", "_random_graph.py"))
rg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rg)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=rg.graph_spec)
def test_views_of_random_graphs(spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("rg")
    dy.renew_cg(scheduler="agenda")
    losses = rg.record(dy.ParameterCollection(), spec)
    roots = losses  # each output a column
    cg = dy.cg()
    pic = picture(cg, roots)
    drawn = [i for i in range(len(cg.op)) if not cg.op[i].leaf]
    assert pic.nodes == drawn
    lay = L.place(pic, "layered")
    assert set(lay.pos) == set(drawn)
    for a, u in pic.edges:
        assert lay.pos[a][1] < lay.pos[u][1]
    boxes = list(lay.pos.values())
    for i, (x0, y0) in enumerate(boxes):
        for x1, y1 in boxes[i + 1:]:
            assert abs(x0 - x1) >= L.NODE_W - 1e-6 or abs(y0 - y1) >= L.NODE_H - 1e-6
    planned = dy.viz.schedule_of(cg)
    info = dy.viz.schedule(cg, str(out / "s.html"), samples=roots, layout_engine="layered")
    assert info["nodes"] == len(drawn) and info["batches"] == len(planned) >= info["lower_bound"]
    text = (out / "s.html").read_text()
    assert len(re.findall(r'<g class="node"', text)) == len(drawn)
    assert len(re.findall(r'<path class="edge"', text)) == len(pic.edges)
    cg.forward()  # evaluate every recorded node, adding none
    assert cg.executed_batches() == planned  # what was drawn is what ran
