"""The console's test data: a demo data directory with, beside the demo's sessions, a session full of hostile text,
a tampered copy of a demo session (tests/console/logs.py) and the golden Anthropic session (a compaction, a trim)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.config.prices import load_price_table
from foldline.console.data import ConsoleData

from .logs import TAMPERED_ID, hostile_session, tamper

runner = CliRunner()
GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden-logs" / "v0"


@pytest.fixture(scope="session")
def console_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo data directory plus the hostile and the tampered session."""
    root = tmp_path_factory.mktemp("console")
    data = root / "data"
    res = runner.invoke(app, ["demo", "--sessions", "4", "--steps", "12", "--data-dir", str(data), "--json"])
    assert res.exit_code == 0, res.output
    assert all(s["verified"] for s in json.loads(res.stdout)["sessions"])
    exported = hostile_session(root / "scratch")
    res = runner.invoke(app, ["import", str(exported), "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        app,
        [
            "import",
            str(GOLDEN / "golden-anthropic.jsonl"),
            "--attachments",
            str(GOLDEN / "attachments"),
            "--data-dir",
            str(data),
        ],
    )
    assert res.exit_code == 0, res.output
    assert tamper(data, "demo-001", TAMPERED_ID) >= 0
    res = runner.invoke(app, ["verify", TAMPERED_ID, "--data-dir", str(data), "--json"])
    assert res.exit_code == 1, res.output  # what the console must show: the command's own verdict
    return data


@pytest.fixture
def console_data(console_dir: Path) -> Iterator[ConsoleData]:
    config = Config(data_dir=console_dir)
    data = ConsoleData(open_stores(config, read_only=True), load_price_table(), min_refresh_s=0.0)
    try:
        yield data
    finally:
        data.close()
