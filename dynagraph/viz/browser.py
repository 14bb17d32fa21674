"""Screenshots of the views in a headless Chromium driven by Selenium (both optional).

`open_browser()` returns a WebDriver or raises Unavailable when selenium, chromium or
chromedriver is missing (the browser tests then skip); `screenshot(page, png)` renders
one written view to a PNG (docs/screenshots.py makes the README's pictures with it).
Chromium runs with --no-sandbox so that it also starts as root (CI containers).
"""
from __future__ import annotations

import os
import shutil


class Unavailable(RuntimeError):
    pass


def _find(*names: str) -> str | None:
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def open_browser(width: int = 1400, height: int = 900):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise Unavailable(f"selenium is not installed ({e})")
    chrome = _find("chromium", "chromium-browser", "google-chrome")
    driver = _find("chromedriver")
    if chrome is None or driver is None:
        raise Unavailable("chromium and chromedriver are not both installed")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(arg)
    try:
        return webdriver.Chrome(service=Service(driver, log_output=os.devnull), options=opts)
    except Exception as e:  # noqa: BLE001 - any start failure means "no browser here"
        raise Unavailable(f"chromium did not start: {type(e).__name__}: {str(e)[:200]}")


def full_screenshot(drv, path: str, max_width: int = 2600, max_height: int = 4000) -> None:
    """Lay the page out in a wide window (panels side by side), then shrink the window to
    what the content uses and take the screenshot."""
    drv.set_window_size(max_width, 1000)
    size = ("const d=document.documentElement, b=document.body||d;"
            "const r=[...document.querySelectorAll('.dg-box, table, svg, #dg-step')].map(e=>e.getBoundingClientRect());"
            "return [Math.max(300, ...r.map(x=>x.right)), Math.max(d.scrollHeight, b.scrollHeight)]")
    w, _ = drv.execute_script(size)
    drv.set_window_size(min(int(w) + 40, max_width), 1000)
    _, h = drv.execute_script(size)
    drv.set_window_size(min(int(w) + 40, max_width), min(int(h) + 140, max_height))
    drv.save_screenshot(path)


def screenshot(page: str, png: str, step: int | None = None, drv=None) -> str:
    """Render an HTML or SVG file written by dy.viz to a PNG; `step` moves the slider first."""
    own = drv is None
    drv = drv or open_browser()
    try:
        drv.get("file://" + os.path.abspath(page))
        if step is not None:
            drv.execute_script("const s=document.getElementById('dg-step');"
                               "s.value=arguments[0]; s.dispatchEvent(new Event('input'));", step)
        full_screenshot(drv, png)
    finally:
        if own:
            drv.quit()
    return png
