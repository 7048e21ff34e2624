"""Headless Debian chromium driven by Selenium through chromedriver, for the browser tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@contextlib.contextmanager
def chrome(window: tuple[int, int] = (1280, 1000), page_load_timeout: float = 60) -> Iterator[Any]:
    """A browser, quit afterwards. Its temporary files (chromium leaves a folder of singleton
    files in TMPDIR at every start) go to a folder of its own, removed once it has quit."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={window[0]},{window[1]}"):
        options.add_argument(arg)
    tmp = tempfile.mkdtemp(prefix="skyward-chromium-")
    try:
        service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": tmp})
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(page_load_timeout)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
