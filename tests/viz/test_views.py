"""The views written to files: counts of nodes, edges and batches in the SVG/HTML text,
colours shared exactly by the nodes of one batch, and the schedule drawn is the one run."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

import dynagraph as dy
from dynagraph.viz.svg import SINGLE, batch_colours

from .conftest import KNOWN_BATCHES, KNOWN_EDGES, KNOWN_NODES, record_known

NS = "{http://www.w3.org/2000/svg}"


def _nodes(root):
    return [g for g in root.iter(NS + "g") if g.get("class") == "node"]


def test_graph_svg_counts_and_colours(tmp_path):
    cg, _ = record_known()
    info = dy.viz.graph(cg, str(tmp_path / "g.svg"), layout_engine="layered")
    assert (info["nodes"], info["edges"], info["batches"], info["lower_bound"]) == (
        KNOWN_NODES, KNOWN_EDGES, KNOWN_BATCHES, KNOWN_BATCHES)
    root = ET.parse(tmp_path / "g.svg").getroot()  # well-formed XML
    assert root.get("data-nodes") == str(KNOWN_NODES) and root.get("data-batches") == str(KNOWN_BATCHES)
    nodes = _nodes(root)
    assert len(nodes) == KNOWN_NODES
    assert len([p for p in root.iter(NS + "path") if p.get("class") == "edge"]) == KNOWN_EDGES
    fill = {}
    for g in nodes:
        fill.setdefault(g.get("data-batch"), set()).add(g.find(NS + "rect").get("fill"))
    assert all(len(f) == 1 for f in fill.values())  # one colour per batch
    colours = [next(iter(f)) for f in fill.values()]
    assert len(set(colours)) == len(colours)  # every batch here has 2+ nodes: all colours differ
    by_batch = {}
    for g in nodes:
        by_batch.setdefault(g.get("data-batch"), []).append(g.get("data-sample"))
    assert sum(1 for s in by_batch.values() if {"0", "1"} <= set(s)) == KNOWN_BATCHES - 1  # all but esum span both


def test_drawn_schedule_is_the_one_that_runs():
    for name in ("depth", "agenda", "none"):
        cg, loss = record_known(name)
        planned = dy.viz.schedule_of(cg)
        loss.value()
        assert cg.executed_batches() == planned
        assert dy.viz.schedule_of(cg) == planned
        with pytest.raises(ValueError, match="already evaluated"):
            dy.viz.schedule_of(cg, "depth")


def test_schedule_html_is_self_contained(tmp_path):
    cg, _ = record_known()
    path = tmp_path / "s.html"
    dy.viz.schedule(cg, str(path))
    text = path.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # no CDN, no server
    assert "https://" not in text and "<script src" not in text
    steps = json.loads(re.search(r'<script type="application/json" data-for="graph"[^>]*>(.*?)</script>',
                                 text, re.S).group(1))
    assert len(steps) == KNOWN_BATCHES and sum(len(s[0]) for s in steps) == KNOWN_NODES
    assert steps[-1][0] and len(steps[-1][1]) == 2  # the esum reads the two samples' sums
    with pytest.raises(ValueError, match="HTML"):
        dy.viz.schedule(cg, str(tmp_path / "s.svg"))


def test_compare_counts(tmp_path):
    cg, _ = record_known()
    out = dy.viz.compare(cg, str(tmp_path / "c.html"), fsm_episodes=20)
    assert out["lower_bound"] == KNOWN_BATCHES and out["nodes"] == KNOWN_NODES
    assert all(out[s] >= out["lower_bound"] for s in ("depth", "agenda", "typewise", "fsm"))
    assert out["agenda"] == KNOWN_BATCHES
    text = (tmp_path / "c.html").read_text()
    assert text.count('class="dg-panel"') == 4
    assert cg.pending_nodes()  # drawing evaluates nothing


def test_colours():
    c = batch_colours([[1, 2], [3], [4, 5], [6, 7]])
    assert c[1] == SINGLE and len({c[0], c[2], c[3]}) == 3


def test_writes_atomically(tmp_path):
    cg, _ = record_known()
    dy.viz.graph(cg, str(tmp_path / "sub" / "g.svg"))
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["g.svg"]  # no temporary left behind
