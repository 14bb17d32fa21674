"""Every HTML view rendered in a real headless Chromium (skipped without one): a
screenshot, the batch and node counts read from the DOM, and the slider moving the
highlighted batch."""
from __future__ import annotations

import os

import pytest

import dynagraph as dy
from dynagraph.viz.browser import full_screenshot

from .conftest import KNOWN_BATCHES, KNOWN_EDGES, KNOWN_NODES

pytest.importorskip("selenium")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402


def _load(browser, path: str, tmp_path) -> None:
    browser.get("file://" + os.path.abspath(path))
    shot = str(tmp_path / (os.path.basename(path) + ".png"))
    full_screenshot(browser, shot)
    assert os.path.getsize(shot) > 5000  # a real picture, not an empty page


def _highlighted(browser, panel_id: str) -> set:
    return {int(g.get_attribute("data-batch"))
            for g in browser.find_elements(By.CSS_SELECTOR, f"#{panel_id} .node.running")}


def _check_known_panel(browser, panel_id: str, batches: int) -> None:
    svg = browser.find_element(By.ID, panel_id)
    assert int(svg.get_attribute("data-batches")) == batches
    assert len(svg.find_elements(By.CSS_SELECTOR, ".node")) == KNOWN_NODES
    assert len(svg.find_elements(By.CSS_SELECTOR, ".edge")) == KNOWN_EDGES
    shown = {g.get_attribute("data-batch") for g in svg.find_elements(By.CSS_SELECTOR, ".node")}
    assert len(shown) == batches


def _slide(browser, panel_id: str) -> None:
    """Step 0 highlights batch 0; the arrow key on the slider (a real input event) and the
    step button each move the highlight to the next batch, and a drag to the end to the last."""
    slider = browser.find_element(By.ID, "dg-step")
    assert _highlighted(browser, panel_id) == {0}
    slider.send_keys(Keys.ARROW_RIGHT)
    assert _highlighted(browser, panel_id) == {1}
    assert browser.find_element(By.ID, "dg-info").get_attribute("data-step") == "1"
    browser.find_element(By.ID, "dg-next").click()
    assert _highlighted(browser, panel_id) == {2}
    slider.send_keys(Keys.END)
    last = int(slider.get_attribute("max"))
    assert _highlighted(browser, panel_id) == {last}
    reads = browser.find_elements(By.CSS_SELECTOR, f"#{panel_id} .node.read")
    assert reads and all(int(g.get_attribute("data-batch")) < last for g in reads)


def test_schedule_viewer(browser, known, tmp_path):
    cg, _ = known
    path = str(tmp_path / "schedule.html")
    dy.viz.schedule(cg, path)
    _load(browser, path, tmp_path)
    _check_known_panel(browser, "graph", KNOWN_BATCHES)
    assert "step 0 of 10" in browser.find_element(By.ID, "dg-info").text
    _slide(browser, "graph")


def test_schedule_viewer_after_evaluation(browser, known, tmp_path):
    """An evaluated graph shows the batches that ran (here the same as the plan)."""
    cg, loss = known
    loss.value()
    path = str(tmp_path / "ran.html")
    dy.viz.schedule(cg, path)
    _load(browser, path, tmp_path)
    _check_known_panel(browser, "graph", KNOWN_BATCHES)
    _slide(browser, "graph")


def test_graph_view_html(browser, known, tmp_path):
    cg, _ = known
    path = str(tmp_path / "graph.html")
    dy.viz.graph(cg, path, scheduler="none")
    _load(browser, path, tmp_path)
    _check_known_panel(browser, "graph", KNOWN_NODES)  # no batching: one batch per node
    _slide(browser, "graph")


def test_compare_view(browser, known, tmp_path):
    cg, _ = known
    path = str(tmp_path / "compare.html")
    counts = dy.viz.compare(cg, path, fsm_episodes=30)
    _load(browser, path, tmp_path)
    for name in ("depth", "agenda", "typewise", "fsm"):
        _check_known_panel(browser, f"panel-{name}", counts[name])
        row = browser.find_element(By.CSS_SELECTOR, f'#dg-counts tr[data-scheduler="{name}"]')
        assert row.find_elements(By.TAG_NAME, "td")[1].text == str(counts[name])
    assert counts["agenda"] == KNOWN_BATCHES and counts["lower_bound"] == KNOWN_BATCHES
    _slide(browser, "panel-agenda")
    # every panel follows the one slider
    assert _highlighted(browser, "panel-depth") == {int(browser.find_element(By.ID, "dg-step").get_attribute("value"))}


def test_memory_view(browser, tmp_path):
    from .conftest import traced_lstm_block
    path = str(tmp_path / "memory.html")
    info = dy.viz.memory(traced_lstm_block(), path)
    _load(browser, path, tmp_path)
    svg = browser.find_element(By.ID, "memory")
    assert svg.get_attribute("data-batches") == "2" and svg.get_attribute("data-copies") == "0"
    assert len(svg.find_elements(By.CSS_SELECTOR, ".node")) == info["variables"] == 19
    lists = svg.find_elements(By.CSS_SELECTOR, ".dg-list")
    assert len(lists) == 5 and all(r.get_attribute("data-state") == "in-place" for r in lists)
    assert {r.get_attribute("data-batch") for r in svg.find_elements(By.CSS_SELECTOR, ".dg-list.current")} == {"0"}
    assert _highlighted(browser, "memory") == {0}
    browser.find_element(By.ID, "dg-step").send_keys(Keys.ARROW_RIGHT)
    assert _highlighted(browser, "memory") == {1}
    assert {r.get_attribute("data-batch") for r in svg.find_elements(By.CSS_SELECTOR, ".dg-list.current")} == {"1"}


def test_cavs_view(browser, tmp_path):
    from .conftest import CAVS_GRAPHS, CAVS_TASKS, cavs_run
    path = str(tmp_path / "cavs.html")
    dy.viz.cavs(cavs_run(), CAVS_GRAPHS, path)
    _load(browser, path, tmp_path)
    svg = browser.find_element(By.ID, "cavs")
    assert int(svg.get_attribute("data-batches")) == CAVS_TASKS
    assert len(svg.find_elements(By.CSS_SELECTOR, ".node")) == 9
    assert len(svg.find_elements(By.CSS_SELECTOR, ".edge")) == 6
    assert _highlighted(browser, "cavs") == {0}
    assert len(svg.find_elements(By.CSS_SELECTOR, ".node.running")) == 6  # every leaf of every graph
    browser.find_element(By.ID, "dg-step").send_keys(Keys.ARROW_RIGHT)
    assert _highlighted(browser, "cavs") == {1}
    assert len(svg.find_elements(By.CSS_SELECTOR, ".node.read")) == 4  # the two inner nodes' children


def test_screenshot_helper(browser, known, tmp_path):
    cg, _ = known
    page = dy.viz.schedule(cg, str(tmp_path / "s.html"))["path"]
    png = dy.viz.screenshot(page, str(tmp_path / "s.png"), step=3, drv=browser)
    assert open(png, "rb").read(4) == b"\x89PNG"
    assert _highlighted(browser, "graph") == {3}
