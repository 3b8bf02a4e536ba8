"""`foldline diff`, `foldline fork` and `foldline resume` end to end on the embedded default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core.content import ImageBlock
from foldline.core.events import CompactionStart, SessionEndSeed, StepEnd, StepStart, UserMessage

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-session") / "data"
    res = runner.invoke(app, ["demo", "--sessions", "4", "--steps", "20", "--data-dir", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert all(s["verified"] for s in json.loads(res.stdout)["sessions"])
    return path


def _json(args: list[str], data: Path, code: int = 0) -> dict[str, Any]:
    res = runner.invoke(app, [*args, "--data-dir", str(data), "--json"])
    assert res.exit_code == code, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_demo_has_a_compaction_an_image_and_a_fork(data: Path) -> None:
    with SqliteEventLog(data) as log:
        assert any(isinstance(e.data, CompactionStart) for e in log.read("demo-000"))
        first = next(e.data for e in log.read("demo-001") if isinstance(e.data, UserMessage))
        assert any(isinstance(b, ImageBlock) for b in first.content)
        seed = [e.data for e in log.read("demo-003") if isinstance(e.data, SessionEndSeed)]
        assert [(s.parent_id, s.seed_length is not None) for s in seed] == [("demo-000", True)]
    res = runner.invoke(app, ["verify", "--data-dir", str(data), "--json"])
    assert res.exit_code == 0, res.output


def test_diff_lists_snapshots_with_reason_and_lineage(data: Path) -> None:
    out = _json(["diff", "demo-003"], data)
    assert out["lineage"] == {"parentId": "demo-000", "seedLength": out["lineage"]["seedLength"]}
    snaps = out["snapshots"]
    assert isinstance(snaps, list)
    assert [s["reason"] for s in snaps] == ["initial", "resume"]
    assert snaps[1]["diff"] == {"config": {}, "system": [], "toolsAdded": [], "toolsRemoved": [], "toolsChanged": []}
    res = runner.invoke(app, ["diff", "demo-003", "--data-dir", str(data)])
    assert res.exit_code == 0
    assert "fork of demo-000" in res.stdout
    assert "no change" in res.stdout


def test_fork_with_overrides_then_resume_shows_the_drift_once(data: Path, tmp_path: Path) -> None:
    system = tmp_path / "system.txt"
    system.write_text("You are terse.\n")
    with SqliteEventLog(data) as log:
        at = next(e.seq for e in log.read("demo-002") if isinstance(e.data, StepEnd))
    out = _json(
        ["fork", "demo-002", "--at", str(at), "--model", "claude-other", "--system-file", str(system), "--as", "kid"],
        data,
    )
    assert out["child"] == "kid"
    assert out["seedLength"] == at + 1
    drift = out["drift"]
    assert isinstance(drift, dict)
    assert drift["config"] == {"model": {"old": "claude-emulated", "new": "claude-other"}}
    assert "+You are terse." in drift["system"]
    assert out["verify"] == {"checked": 1, "matched": 1, "mismatched": [], "unreconstructable": []}

    resumed = _json(["resume", "kid", "--steps", "3"], data)
    steps = resumed["steps"]
    assert isinstance(steps, list)
    assert len(steps) == 3
    assert steps[0]["header"] == "resume"
    assert resumed["drift"] == {"config": {}, "system": [], "toolsAdded": [], "toolsRemoved": [], "toolsChanged": []}
    assert resumed["verified"] is True
    snaps = _json(["diff", "kid"], data)["snapshots"]
    assert isinstance(snaps, list)
    assert [s["reason"] for s in snaps] == ["initial", "resume", "resume"]


def test_resume_with_another_model_is_a_logged_drift(data: Path) -> None:
    out = _json(["resume", "demo-001", "--model", "claude-emulated-2", "--steps", "2"], data)
    assert out["drift"]["config"] == {"model": {"old": "claude-emulated", "new": "claude-emulated-2"}}
    assert out["verified"] is True


def test_resume_under_a_budget_compacts(data: Path) -> None:
    out = _json(["resume", "demo-002", "--steps", "6", "--budget", "300"], data)
    assert out["verified"] is True
    with SqliteEventLog(data) as log:
        events = log.read("demo-002")
    assert any(isinstance(e.data, CompactionStart) and e.seq > int(out["resumeSeq"]) for e in events)


def test_fork_bad_input_is_a_clear_error(data: Path) -> None:
    with SqliteEventLog(data) as log:
        events = log.read("demo-001")
    inside = next(e.seq for e in events if isinstance(e.data, StepStart)) + 1
    for at, message in ((inside, "inside turn 0 step 0"), (len(events), "past the end"), (-1, "past the end")):
        res = runner.invoke(app, ["fork", "demo-001", "--at", str(at), "--data-dir", str(data)])
        assert res.exit_code == 2, res.output
        assert "ForkError" in res.stderr
        assert message in res.stderr
    res = runner.invoke(app, ["fork", "demo-001", "--at", "2", "--as", "demo-000", "--data-dir", str(data)])
    assert res.exit_code == 2
    assert "SessionExists" in res.stderr
    res = runner.invoke(app, ["fork", "nope", "--at", "0", "--data-dir", str(data)])
    assert res.exit_code == 2
    assert "SessionNotFound" in res.stderr
    res = runner.invoke(app, ["resume", "nope", "--data-dir", str(data)])
    assert res.exit_code == 2
    assert "SessionNotFound" in res.stderr


def test_a_session_locked_by_another_writer_is_one_typed_line_and_nothing_is_written(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the embedded log's write lock: resume and fork give StoreBusy, no traceback."""
    import sqlite3

    monkeypatch.setenv("FOLDLINE_SQLITE_BUSY_TIMEOUT", "0.2")
    with SqliteEventLog(data) as log:
        before = {sid: log.head(sid) for sid in log.sessions()}
    holder = sqlite3.connect(str(data / "log.sqlite3"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        for args in (["resume", "demo-001", "--steps", "1"], ["fork", "demo-001", "--at", "0", "--as", "locked-fork"]):
            res = runner.invoke(app, [*args, "--data-dir", str(data)])
            assert res.exit_code == 2, res.output
            lines = [line for line in res.output.splitlines() if line.strip()]
            assert len(lines) == 1, res.output
            assert lines[0].startswith("error: StoreBusy:")
            assert "locked by another writer" in lines[0]
            assert "Traceback" not in res.output
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with SqliteEventLog(data) as log:
        assert {sid: log.head(sid) for sid in log.sessions()} == before
