"""A headless Chromium driven by Selenium for the viz tests (and docs/screenshots.py).

`open_browser()` returns a WebDriver or raises Unavailable when selenium, chromium or
chromedriver is missing: the browser tests skip, the rest of the suite does not care.
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


def full_screenshot(drv, path: str, max_height: int = 4000) -> None:
    """Resize the window to the page's full size, then take the screenshot."""
    size = ("const d=document.documentElement, b=document.body||d;"
            "return [Math.max(d.scrollWidth,b.scrollWidth), Math.max(d.scrollHeight,b.scrollHeight)]")
    w, h = drv.execute_script(size)
    drv.set_window_size(min(max(int(w) + 40, 800), 4000), min(int(h) + 120, max_height))
    drv.save_screenshot(path)
