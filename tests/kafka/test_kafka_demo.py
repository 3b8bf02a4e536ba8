"""`foldline demo --backend kafka` writes through the real broker and `foldline verify` reads it back."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app

pytestmark = pytest.mark.kafka


def test_demo_and_verify_on_kafka(kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOLDLINE_KAFKA_TOPIC", f"test.demo.{uuid.uuid4().hex[:10]}")
    runner = CliRunner()
    args = ["--backend", "kafka", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "2", "--steps", "5", "--json", *args])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [len(s["steps"]) for s in out["sessions"]] == [5, 5]
    assert all(s["verified"] for s in out["sessions"])
    res = runner.invoke(app, ["verify", "--json", *args])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert {k: v for k, v in report.items() if k != "sessions"} == {
        "checked": 10,
        "matched": 10,
        "mismatched": [],
        "unreconstructable": [],
        "status": "verified",
    }
    assert [(s["id"], s["status"]) for s in report["sessions"]] == [("demo-000", "verified"), ("demo-001", "verified")]
    res = runner.invoke(app, ["sessions", "--json", *args])
    assert res.exit_code == 0, res.output
    assert [s["id"] for s in json.loads(res.stdout)] == ["demo-000", "demo-001"]
