"""Headless Chromium from Debian's packages, driven through Selenium (no browser download: the driver is
/usr/bin/chromedriver, the browser /usr/bin/chromium, both installed by ``deploy/local/chromium.sh install``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def install() -> tuple[str, str]:
    """``deploy/local/chromium.sh install`` (a no-op when both are there): the driver's and the browser's paths."""
    done = subprocess.run(
        ["bash", str(REPO / "deploy" / "local" / "chromium.sh"), "install"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"`deploy/local/chromium.sh install` failed (exit {done.returncode}); it installs Debian's chromium and "
            f"chromium-driver for the console's browser tests. Its output:\n{done.stderr[-3000:]}"
        )
    driver = done.stdout.strip().splitlines()[-1]
    browser = shutil.which("chromium")
    if browser is None:
        raise RuntimeError("chromium is not on PATH after `deploy/local/chromium.sh install`")
    return driver, browser


@contextmanager
def chromium(driver: str, browser: str) -> Iterator[Any]:
    """A fresh headless Chromium (its own profile directory) whose console log the test reads."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="foldline-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        session = webdriver.Chrome(service=Service(executable_path=driver), options=options)
        try:
            session.set_page_load_timeout(30)
            yield session
        finally:
            session.quit()


def console_problems(session: Any) -> list[str]:
    """The browser console's warnings and errors since the last call (CSP violations, script errors, 404s)."""
    return [
        f"{entry['level']}: {entry['message']}"
        for entry in session.get_log("browser")
        if entry["level"] in ("SEVERE", "WARNING")
    ]
