"""Remake the README's pictures of dy.viz: run the teaching walk-throughs into a temporary
folder and screenshot their pages in headless Chromium (needs selenium, chromium and
chromium-driver; Graphviz is used for layout when installed).

    python docs/screenshots.py            # writes docs/viz_*.png
"""
from __future__ import annotations

import importlib.util
import os
import tempfile

import dynagraph as dy
from dynagraph.viz.browser import open_browser, screenshot

HERE = os.path.dirname(os.path.abspath(__file__))
TEACH = os.path.join(HERE, "..", "examples", "teach")

# (walk-through, file it writes, picture, slider step: 999 = the last, every batch coloured)
SHOTS = [("01_lazy_recording", "01_recorded.svg", "viz_graph.png", None),
         ("01_lazy_recording", "01_schedule.html", "viz_schedule.png", 4),
         ("02_depth_vs_agenda", "02_compare.html", "viz_depth_vs_agenda.png", 999),
         (None, "four_schedulers.html", "viz_compare.png", 999),
         ("04_cavs_vertex_functions", "04_cavs.html", "viz_cavs.png", 1),
         ("05_memory_planning", "05_lstm_memory.html", "viz_memory.png", 1),
         ("05_memory_planning", "05_crossed_memory.html", "viz_memory_copy.png", 1)]


def load(name: str):
    spec = importlib.util.spec_from_file_location("teach_" + name[:2], os.path.join(TEACH, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def four_schedulers(out: str) -> None:
    """Walk-through 2's trees under all four schedulers (03's model is too big to read on a page)."""
    import random
    t2 = load("02_depth_vs_agenda")
    rng = random.Random(3)
    trees = [t2.random_tree(rng, rng.randint(2, 5)) for _ in range(3)]
    dy.viz.compare(t2.make_recorder(trees, "agenda"), os.path.join(out, "four_schedulers.html"), fsm_episodes=50)


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        for name in dict.fromkeys(s[0] for s in SHOTS):
            if name is None:
                four_schedulers(out)
            else:
                load(name).main(["--out", out])
        drv = open_browser()
        try:
            for _, page, png, step in SHOTS:
                print("wrote", screenshot(os.path.join(out, page), os.path.join(HERE, png), step, drv))
        finally:
            drv.quit()


if __name__ == "__main__":
    main()
