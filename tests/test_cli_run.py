"""The main job and the inspection commands, end to end through the CLI."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core import UserMessage
from foldline.core.codec import digest_bytes
from foldline.core.content import TextBlock
from foldline.core.events import Envelope, RequestDispatch, RequestHeader
from foldline.demo import DemoFinding

runner = CliRunner()


def test_demo_json_verify_and_inspect(tmp_path: Path) -> None:
    data = tmp_path / "data"
    res = runner.invoke(app, ["demo", "--sessions", "3", "--steps", "20", "--data-dir", str(data), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["data_dir"] == str(data)
    ids = ["demo-000", "demo-001", "demo-002", "demo-think", "demo-responses", "demo-structured"]
    assert [s["id"] for s in out["sessions"]] == [*ids[:5], "demo-approval", ids[5]]
    [approval] = [s for s in out["sessions"] if s["id"] == "demo-approval"]
    assert len(approval["steps"]) == 1  # a step that ran a tool; the next one's answer waits for an approval
    assert approval["note"].startswith("paused: publish_note")
    for s in out["sessions"]:
        if s is approval:
            continue
        assert len(s["steps"]) == 20
        assert set(s["steps"][0]) == {
            "step",
            "prompt_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "output_tokens",
        }
    later = [st for s in out["sessions"] for st in s["steps"][1:]]
    ratio = sum(st["cache_read_tokens"] for st in later) / sum(st["prompt_tokens"] for st in later)
    assert ratio >= 0.9

    res = runner.invoke(app, ["verify", "--data-dir", str(data), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    sessions = [{"id": sid, "status": "verified", "checked": 20, "matched": 20} for sid in ids]
    sessions.append({"id": "demo-approval", "status": "verified", "checked": 2, "matched": 2})
    assert report == {  # 6 sessions x 20, and demo-approval's two requests
        "checked": 122,
        "matched": 122,
        "mismatched": [],
        "unreconstructable": [],
        "status": "verified",
        "sessions": sorted(sessions, key=lambda s: str(s["id"])),
    }

    res = runner.invoke(app, ["requests", "demo-001", "--step", "3", "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    body = res.stdout_bytes.rstrip(b"\n")
    with SqliteEventLog(data) as log:
        dispatches = [e.data for e in log.read("demo-001") if isinstance(e.data, RequestDispatch)]
    assert digest_bytes(body) == dispatches[3].digest

    res = runner.invoke(app, ["requests", "demo-001", "--step", "3", "--provider", "openai", "--data-dir", str(data)])
    assert res.exit_code == 0
    assert b'"messages":[{"content":' in res.stdout_bytes

    res = runner.invoke(app, ["show", "demo-000", "--data-dir", str(data)])
    assert res.exit_code == 0
    assert "request/header" in res.stdout
    assert "initial" in res.stdout

    # demo-structured: validated answers, the schema in the header config, the native field in every body
    structured = next(s for s in out["sessions"] if s["id"] == "demo-structured")
    assert structured["verified"]
    assert len(structured["outputs"]) >= 2
    for answer in structured["outputs"]:
        assert DemoFinding.model_validate(answer)
    with SqliteEventLog(data) as log:
        events = log.read("demo-structured")
    config = next(e.data for e in events if isinstance(e.data, RequestHeader)).header.config
    assert config.output_name == "DemoFinding"
    assert config.output_schema is not None
    assert list(config.output_schema["properties"]) == ["topic", "verdict", "confidence", "evidence"]
    for step in (0, 5):
        res = runner.invoke(app, ["requests", "demo-structured", "--step", str(step), "--data-dir", str(data)])
        assert res.exit_code == 0, res.output
        body = json.loads(res.stdout_bytes)
        assert body["output_config"]["format"]["type"] == "json_schema"
        assert next(iter(body["output_config"]["format"]["schema"]["properties"])) == "topic"


def test_verify_reports_a_mismatch_with_offset(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert (
        runner.invoke(app, ["demo", "--sessions", "1", "--steps", "3", "--data-dir", str(data), "--json"]).exit_code
        == 0
    )
    # rewrite history behind the log's back: the first user message changes
    import sqlite3

    from foldline.core.wire import decode_event, encode_event

    db = sqlite3.connect(data / "log.sqlite3")
    for seq, body in db.execute("SELECT seq, body FROM events WHERE session_id='demo-000'").fetchall():
        e = decode_event(body)
        if isinstance(e.data, UserMessage):
            forged = Envelope(e.seq, e.time, UserMessage(e.data.id, (TextBlock("forged"),), e.data.source))
            db.execute("UPDATE events SET body=? WHERE session_id='demo-000' AND seq=?", (encode_event(forged), seq))
            break
    db.commit()
    db.close()
    res = runner.invoke(app, ["verify", "--data-dir", str(data), "--json"])
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert report["checked"] == 14  # demo-000, the reasoning two and demo-structured: 3 steps each; demo-approval 2
    assert report["matched"] == 11  # only demo-000 was forged
    first = report["mismatched"][0]
    assert first["session"] == "demo-000"
    assert first["step"] == 0
    assert isinstance(first["firstDiffOffset"], int)


def test_unknown_session_is_a_clear_error(tmp_path: Path) -> None:
    res = runner.invoke(app, ["show", "nope", "--data-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "SessionNotFound" in res.stderr


def test_quickstart_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parent.parent
    argv = sys.argv
    sys.argv = ["quickstart.py", str(tmp_path / "qs")]
    try:
        with pytest.raises(SystemExit) as info:
            runpy.run_path(str(root / "examples" / "quickstart.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "verified 6/6 requests from the log" in out


def test_streaming_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parent.parent
    argv = sys.argv
    sys.argv = ["streaming.py", str(tmp_path / "st")]
    try:
        with pytest.raises(SystemExit) as info:
            runpy.run_path(str(root / "examples" / "streaming.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "-> forecast(" in out  # a tool call, shown as it was made
    assert "Answer to 'Will it rain in Bergen tomorrow?'" in out  # the text, piece by piece
    assert "turn ended: completed" in out
    assert "verified 3/3 requests from the log" in out


def test_structured_output_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parent.parent
    argv = sys.argv
    sys.argv = ["structured_output.py", str(tmp_path / "so")]
    try:
        with pytest.raises(SystemExit) as info:
            runpy.run_path(str(root / "examples" / "structured_output.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert info.value.code == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]  # the Forecast, printed from its typed fields
    assert " °C, wind " in first
    assert first.split(": ", 1)[1].split(",")[0] in ("clear", "cloudy", "rain", "snow")
    assert "then free text: \"Answer to 'Thanks!'" in out
    assert "verified 6/6 requests from the log" in out
    with SqliteEventLog(tmp_path / "so", read_only=True) as log:
        headers = [e.data for e in log.read("structured") if isinstance(e.data, RequestHeader)]
    assert [h.header.config.output_name for h in headers] == ["Forecast", None]  # the drop is a logged change
