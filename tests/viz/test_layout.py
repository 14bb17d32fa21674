"""Layout: layers follow dependencies, boxes never overlap, samples keep their own columns,
Graphviz and the built-in layout agree on what is drawn."""
from __future__ import annotations

import shutil

import pytest

from dynagraph.viz import layout as L
from dynagraph.viz.model import picture

from .conftest import KNOWN_EDGES, KNOWN_NODES, record_known


def _overlap(lay) -> bool:
    boxes = sorted(lay.pos.values())
    for i, (x0, y0) in enumerate(boxes):
        for x1, y1 in boxes[i + 1:]:
            if abs(x0 - x1) < L.NODE_W - 1e-6 and abs(y0 - y1) < L.NODE_H - 1e-6:
                return True
    return False


def test_picture_of_known_graph():
    cg, _ = record_known()
    pic = picture(cg)
    assert len(pic.nodes) == KNOWN_NODES and len(pic.edges) == KNOWN_EDGES
    assert pic.columns == ["sample 0", "sample 1", "shared"]
    assert sorted(pic.sample.values()).count(0) == 10 and sorted(pic.sample.values()).count(1) == 10
    assert all(not cg.op[n].leaf for n in pic.nodes)  # parameters are not drawn


def test_explicit_samples():
    cg, _ = record_known()
    tanhs = [n for n in range(len(cg.op)) if cg.op[n].name == "tanh"]
    pic = picture(cg, samples=tanhs[:1])  # first tanh: constant, matmul, lookup, add, tanh
    assert [n for n in pic.nodes if pic.sample[n] == 0] and sum(1 for v in pic.sample.values() if v == 0) == 5


@pytest.mark.parametrize("engine", ["layered", "dot"])
def test_layout_places_every_node_once_without_overlap(engine):
    if engine == "dot" and shutil.which("dot") is None:
        pytest.skip("Graphviz dot is not installed")
    cg, _ = record_known()
    pic = picture(cg)
    lay = L.place(pic, engine)
    assert lay.engine == engine and set(lay.pos) == set(pic.nodes)
    assert not _overlap(lay)
    for a, u in pic.edges:  # arguments above their users
        assert lay.pos[a][1] < lay.pos[u][1]
    layer = L.layers(pic)
    for n in pic.nodes:  # the same step of both samples at the same height
        for m in pic.nodes:
            if layer[n] == layer[m]:
                assert lay.pos[n][1] == pytest.approx(lay.pos[m][1])
    (a0, a1), (b0, b1) = lay.columns[0], lay.columns[1]
    assert a1 <= b0 or b1 <= a0  # sample columns do not overlap
    assert all(0 <= x <= lay.width and 0 <= y <= lay.height for x, y in lay.pos.values())


def test_layers_are_longest_paths():
    cg, _ = record_known()
    pic = picture(cg)
    layer = L.layers(pic)
    assert max(layer.values()) == 8  # constant, matmul, add, tanh, matmul, add, tanh, sum_elems, esum
    assert all(layer[u] > layer[a] for a, u in pic.edges)


def test_parse_plain():
    cg, _ = record_known()
    pic = picture(cg)
    text = "graph 1 2 3\n" + "".join(f"node n{n} {k * 0.5} 1 1 0.5\n" for k, n in enumerate(pic.nodes)) + "stop\n"
    lay = L.parse_plain(text, pic)
    assert lay.width == 2 * 72 + 2 * L.MARGIN and len(lay.pos) == KNOWN_NODES
    with pytest.raises(ValueError, match="placed"):
        L.parse_plain("graph 1 2 3\nstop\n", pic)


def test_unknown_engine():
    cg, _ = record_known()
    with pytest.raises(ValueError, match="layout engine"):
        L.place(picture(cg), "neato")


def test_dot_missing_falls_back(monkeypatch):
    cg, _ = record_known()
    monkeypatch.setattr(L.shutil, "which", lambda name: None)
    assert L.place(picture(cg)).engine == "layered"
    with pytest.raises(RuntimeError, match="dot"):
        L.place(picture(cg), "dot")
