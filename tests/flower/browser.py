"""Headless Chromium from Debian (``chromium`` + ``chromium-driver``), driven by Selenium.

Nothing downloads a browser: the executable and the driver are the system's.
Screenshots go to ``artifacts/flower/`` (ignored by git; CI keeps the folder)
or to ``LANES_TEST_ARTIFACTS`` when set.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path


from tests.conftest import missing_service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ROOT = Path(__file__).resolve().parents[2]

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000")


def artifacts_dir() -> Path:
    folder = Path(os.environ.get("LANES_TEST_ARTIFACTS") or ROOT / "artifacts") / "flower"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def chromium(profile: Path, *, login: tuple[str, str] | None = None):
    """A headless Chromium with a new empty profile; ``login`` sent as basic auth on every request."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        missing_service("Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
    except ImportError:  # a skip here would let CI pass without the browser test (LANES_TEST_REQUIRE_SERVICES)
        missing_service("selenium is not installed (the dev extra of pyproject.toml installs it)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    if login is not None:
        token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
    return driver
