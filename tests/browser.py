"""Headless Chromium for the browser tests (the report's, the hub's): skips, naming what to
install, when Chromium or its driver is missing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
APT = "apt-get install -y chromium chromium-driver"


def chrome(tmp_path: Path, *, flags: tuple[str, ...] = (), console_log: bool = False) -> Any:
    """A headless Chromium driver, 1280×1400; ``console_log`` keeps the page's console for ``get_log``."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium not installed: pip install selenium"
    )
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not Path(binary).exists() and not shutil.which(Path(binary).name):
            pytest.skip(f"{binary} not installed: {APT}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,1400",
        f"--user-data-dir={tmp_path / 'chrome-profile'}",
        *flags,
    ):
        options.add_argument(flag)
    if console_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if Path(CHROMEDRIVER).exists() else str(shutil.which("chromedriver"))
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(15)
    return driver
