"""The memory strip and the dy.cavs view, read back from their files."""
from __future__ import annotations

import json
import re

import pytest

import dynagraph as dy
from dynagraph.memory.layout import block_layouts

from .conftest import CAVS_GRAPHS, CAVS_TASKS, cavs_run, traced_lstm_block


def _steps(text: str, pid: str) -> list:
    return json.loads(re.search(rf'data-for="{pid}"[^>]*>(.*?)</script>', text, re.S).group(1))


def test_memory_strip_follows_the_planned_order(tmp_path):
    blk = traced_lstm_block()
    lay = block_layouts(blk)[0]
    info = dy.viz.memory(blk, str(tmp_path / "m.html"))
    assert info == {"variables": len(lay.order), "batches": len(lay.batches), "copies": len(lay.gathers),
                    "in_place": len(lay.aligned), "naive_copies": lay.naive_kernels, "path": str(tmp_path / "m.html")}
    text = (tmp_path / "m.html").read_text()
    drawn = [int(v) for v in re.findall(r'<g class="node" data-node="(\d+)"', text)]
    assert drawn == list(lay.order)  # left to right in memory order
    steps = _steps(text, "memory")
    assert [s[0] for s in steps] == [b.results for b in lay.batches]
    assert dy.viz.memory(lay, str(tmp_path / "m2.html"))["variables"] == len(lay.order)  # a layout directly


def test_memory_strip_shows_remaining_copies(tmp_path):
    """A list the planner cannot make consecutive is drawn as a copy."""
    @dy.block
    def crossed(a, b):  # [a, b] and [b, a] cannot both be in place
        return dy.cmult(dy.tanh(a), dy.tanh(b)), dy.cmult(dy.tanh(b), dy.tanh(a))
    crossed(dy.zeros(4), dy.zeros(4))
    info = dy.viz.memory(crossed, str(tmp_path / "m.html"))
    text = (tmp_path / "m.html").read_text()
    assert info["copies"] == 1 and info["naive_copies"] == 3
    assert text.count('data-state="copy"') == info["copies"]
    assert text.count('data-state="in-place"') == info["in_place"]


def test_memory_of_untraced_block(tmp_path):
    @dy.block
    def f(x):
        return dy.tanh(x)
    with pytest.raises(ValueError, match="not been traced"):
        dy.viz.memory(f, str(tmp_path / "m.html"))


def test_cavs_tasks_and_view(tmp_path):
    out = cavs_run()
    tasks = out.task_vertices()
    assert len(tasks) == out.tasks == CAVS_TASKS
    assert [sorted(m) for _, m in tasks] == [
        [(0, 0), (0, 1), (0, 3), (1, 0), (2, 0), (2, 1)], [(0, 2), (2, 2)], [(0, 4)]]
    info = dy.viz.cavs(out, CAVS_GRAPHS, str(tmp_path / "v.html"))
    assert (info["vertices"], info["edges"], info["tasks"]) == (9, 6, CAVS_TASKS)
    steps = _steps((tmp_path / "v.html").read_text(), "cavs")
    assert [len(s[0]) for s in steps] == [6, 2, 1] and [len(s[1]) for s in steps] == [0, 4, 2]
    with pytest.raises(ValueError, match="not the input graphs"):
        dy.viz.cavs(out, CAVS_GRAPHS[:1], str(tmp_path / "w.html"))
