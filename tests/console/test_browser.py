"""The console in a real browser: Debian's headless Chromium driven through Selenium (tests/console/browser.py),
against ``foldline console`` started as a command over a copy of the console's demo data directory.

Each page loads with nothing in the browser console (no script error, no CSP violation, no missing asset), the
charts draw, the hostile session runs nothing and shows its text, the tampered session shows its mismatch, and a
session that grows updates its open page without a reload. With ``FOLDLINE_CONSOLE_SCREENSHOTS=<dir>`` the main
pages are also saved as PNGs there (docs/images/ holds the README's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app as cli

from .browser import chromium, console_problems, install
from .logs import HOSTILE_ID, TAMPERED_ID

pytestmark = pytest.mark.browser
runner = CliRunner()
T = TypeVar("T")


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    return install()


@pytest.fixture(scope="module")
def served(console_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``foldline console --port 0 --json`` over a copy of the data directory: its URL and that directory."""
    data = tmp_path_factory.mktemp("browser") / "data"
    shutil.copytree(console_dir, data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDLINE_CONSOLE_")}
    errors = data.parent / "console.stderr"
    with (
        errors.open("w") as stderr,
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "foldline"),
                "console",
                "--port",
                "0",
                "--data-dir",
                str(data),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"foldline console did not start: {errors.read_text()}")
            announced = json.loads(line)
            assert announced["readOnly"] is True
            assert announced["bind"] == "127.0.0.1"
            yield announced["url"].rstrip("/"), data
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def page(browser_paths: tuple[str, str]) -> Iterator[Any]:
    with chromium(*browser_paths) as session:
        yield session


def _until(what: str, check: Callable[[], T | None], timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _open(session: Any, url: str, path: str, **params: object) -> None:
    session.get(url + path + ("?" + urlencode(params) if params else ""))
    _until("the page to load", lambda: session.execute_script("return document.readyState") == "complete")


def _shot(session: Any, name: str) -> None:
    where = os.environ.get("FOLDLINE_CONSOLE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        session.save_screenshot(str(Path(where) / f"console-{name}.png"))


def _chart_drawn(session: Any, chart_id: str) -> bool:
    """The chart's canvas exists, has a size, and holds painted pixels (not a blank canvas)."""
    return bool(
        session.execute_script(
            """
            const c = document.querySelector('#' + arguments[0] + ' canvas');
            if (!c || c.width < 100 || c.height < 100) return false;
            const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let painted = 0;
            for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) painted++;
            return painted > 500;
            """,
            chart_id,
        )
    )


def _chart_labels(session: Any, chart_id: str) -> set[str]:
    """The series names of the chart's legend (uPlot draws the axes on the canvas)."""
    found = session.execute_script(
        """
        const el = document.getElementById(arguments[0]);
        return Array.from(el.querySelectorAll('.u-label'), n => n.textContent.trim());
        """,
        chart_id,
    )
    return {str(t) for t in found}


def test_the_pages_load_without_console_errors_and_the_charts_draw(served: tuple[str, Path], page: Any) -> None:
    url, _ = served
    _open(page, url, "/sessions")
    rows = page.execute_script("return document.querySelectorAll('#sessions tbody tr[data-session]').length")
    assert rows >= 8
    _shot(page, "sessions")
    assert console_problems(page) == []

    _open(page, url, "/session", id="demo-003")
    _until("the step chart", lambda: _chart_drawn(page, "step-chart"))
    assert _chart_labels(page, "step-chart") >= {"cache read", "output", "spend (USD)"}  # the money series
    spend = page.execute_script("return JSON.parse(document.getElementById('step-chart').dataset.chart).columns[5]")
    assert spend
    assert all(isinstance(v, float | int) and v > 0 for v in spend)  # every demo step is priced
    _until("the verify status", lambda: page.execute_script("return document.getElementById('verify-status')"))
    status = page.execute_script("return document.getElementById('verify-status').textContent")
    assert status == "verified"
    _shot(page, "session")
    assert console_problems(page) == []

    page.find_element("css selector", "#timeline-rows a[href*='/session/request']").click()
    _until("the request body", lambda: page.execute_script("return document.getElementById('request-body')"))
    assert page.execute_script("return document.getElementById('proof-status').textContent") == "verified"
    _shot(page, "request")
    assert console_problems(page) == []

    _open(page, url, "/fleet")
    _until("the fleet chart", lambda: _chart_drawn(page, "fleet-chart"))
    assert _chart_labels(page, "fleet-chart") >= {"spend (USD)", "cache-read ratio"}
    assert page.execute_script("return document.getElementById('fleet-spend').textContent").startswith("$")
    _shot(page, "fleet")
    assert console_problems(page) == []

    # the list's filters go through htmx: the table is replaced in place, the address follows
    _open(page, url, "/sessions")
    box = page.find_element("css selector", "input[name='q']")
    box.send_keys("demo-00")
    box.submit()
    _until("the filtered list", lambda: "q=demo-00" in page.current_url)
    ids = page.execute_script(
        "return Array.from(document.querySelectorAll('#sessions tbody tr[data-session]'), r => r.dataset.session)"
    )
    assert ids
    assert all("demo-00" in i for i in ids)
    assert console_problems(page) == []


def test_a_hostile_session_runs_nothing_and_shows_its_text(served: tuple[str, Path], page: Any) -> None:
    url, _ = served
    _open(page, url, "/session", id=HOSTILE_ID)
    steps = page.execute_script(
        "return Array.from(document.querySelectorAll('#timeline-rows a[href^=\"/session/step\"]'), a => a.href)"
    )
    assert steps
    shown = []
    for address in [url + "/sessions?q=onerror", url + "/session?" + urlencode({"id": HOSTILE_ID}), *steps]:
        page.get(address)
        _until("the page to load", lambda: page.execute_script("return document.readyState") == "complete")
        time.sleep(0.3)  # any handler a hostile text could have installed has had its chance
        assert page.execute_script("return window.__pwned === undefined"), address
        assert HOSTILE_ID in page.execute_script("return document.body.innerText"), address
        links = page.execute_script("return Array.from(document.links, a => a.getAttribute('href'))")
        assert not [h for h in links if h.lower().lstrip().startswith("javascript:")], address
        assert console_problems(page) == [], address
        shown.append(page.execute_script("return document.body.innerText"))
    text = "\n".join(shown)
    assert "<script>window.__pwned='message'</script>" in text
    assert "<img src=x onerror=\"window.__pwned='tool'\">" in text
    assert "\\u202eevil-rtl\\u202c" in text  # the override shown as its escape, not applied
    assert "\u202e" not in text


def test_a_tampered_session_shows_its_mismatch(served: tuple[str, Path], page: Any) -> None:
    url, _ = served
    _open(page, url, "/session", id=TAMPERED_ID)
    _until("the verify status", lambda: page.execute_script("return document.getElementById('verify-status')"))
    assert page.execute_script("return document.getElementById('verify-status').textContent") == "mismatched"
    page.find_element("css selector", "#verify-problems a").click()
    _until("the proof", lambda: page.execute_script("return document.getElementById('proof-status')"))
    assert page.execute_script("return document.getElementById('proof-status').textContent") == "mismatched"
    assert page.execute_script("return document.getElementById('diff-offset')") is not None
    _shot(page, "mismatch")
    assert console_problems(page) == []


def test_a_growing_session_updates_its_open_page(served: tuple[str, Path], page: Any) -> None:
    url, data = served
    _open(page, url, "/session", id="demo-002")
    _until("the step chart", lambda: _chart_drawn(page, "step-chart"))
    steps = page.execute_script("return document.querySelectorAll('#timeline-rows tr[data-index]').length")
    head = page.execute_script("return document.getElementById('head').textContent")
    spend = page.execute_script("return document.getElementById('spend').textContent")
    assert spend.startswith("$")
    res = runner.invoke(cli, ["resume", "demo-002", "--steps", "2", "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    _until(
        "the new steps' rows",
        lambda: (
            page.execute_script("return document.querySelectorAll('#timeline-rows tr[data-index]').length") >= steps + 2
        ),
    )
    _until("the new head", lambda: page.execute_script("return document.getElementById('head').textContent") != head)
    _until("the new spend", lambda: page.execute_script("return document.getElementById('spend').textContent") != spend)
    new_row = page.execute_script(f"return document.querySelector('#timeline-rows tr[data-index=\"{steps}\"]')")
    assert new_row is not None
    assert page.execute_script("return performance.getEntriesByType('navigation').length") == 1  # no reload
    assert console_problems(page) == []
