"""`foldline approvals`, `approve`, `inject` and `resume` of a paused turn end to end on the embedded default, and
the lineage `sessions` and `show` draw: demo-approval stops awaiting approval, is decided from the command line
and finished by `foldline resume`; every bad decision is one typed line with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core.events import ApprovalDecision, ApprovalRequest, InboxClaim, ToolResult, TurnEnd, UserMessage
from tests.golden_logs.layout import jsonl_path

runner = CliRunner()


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FOLDLINE_DEMO_MCP_SERVER", "off")
    path = tmp_path / "data"
    res = runner.invoke(app, ["demo", "--sessions", "2", "--steps", "3", "--data-dir", str(path), "--json"])
    assert res.exit_code == 0, res.output
    sessions = {s["id"]: s for s in json.loads(res.stdout)["sessions"]}
    assert sessions["demo-approval"]["verified"]
    assert sessions["demo-approval"]["note"].startswith("paused: publish_note")
    return path


def cli(data: Path, *args: str, code: int = 0) -> Any:
    res = runner.invoke(app, [*args, "--data-dir", str(data), "--json"])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout) if code == 0 else res.output


def one_line_error(data: Path, *args: str, says: str) -> None:
    res = runner.invoke(app, [*args, "--data-dir", str(data)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert says in lines[0], lines[0]


def test_demo_approval_is_listed_allowed_and_finished_by_resume(data: Path) -> None:
    [pending] = cli(data, "approvals")
    assert (pending["session"], pending["tool"], pending["decision"]) == ("demo-approval", "publish_note", None)
    call = pending["callId"]
    decided = cli(data, "approve", "demo-approval", call, "--allow", "--by", "ops@example")
    assert (decided["verdict"], decided["decidedBy"]) == ("allow", "ops@example")
    [still] = cli(data, "approvals")  # listed with its decision until the session's loop takes it
    assert still["decision"]["verdict"] == "allow"
    with SqliteEventLog(data, read_only=True) as log:
        before = log.head("demo-approval")
    out = cli(data, "resume", "demo-approval")
    assert out["continued"]["reason"] == "completed"
    assert out["verified"]
    assert cli(data, "approvals") == []
    with SqliteEventLog(data, read_only=True) as log:
        after = [e.data for e in log.read("demo-approval", before)]
    [taken] = [d for d in after if isinstance(d, ApprovalDecision)]
    assert (taken.call_id, taken.verdict, taken.decided_by) == (call, "allow", "ops@example")
    [result] = [d for d in after if isinstance(d, ToolResult) and d.call_id == call]
    assert not result.is_error
    assert [d.reason for d in after if isinstance(d, TurnEnd)] == ["completed"]
    assert cli(data, "verify")["status"] == "verified"


def test_a_denial_with_a_reason_reaches_the_model(data: Path) -> None:
    [pending] = cli(data, "approvals", "demo-approval")
    cli(data, "approve", "demo-approval", pending["callId"], "--deny", "--reason", "not on a Friday")
    assert cli(data, "resume", "demo-approval")["continued"]["reason"] == "completed"
    with SqliteEventLog(data, read_only=True) as log:
        [result] = [
            e.data
            for e in log.read("demo-approval")
            if isinstance(e.data, ToolResult) and e.data.call_id == pending["callId"]
        ]
    assert result.is_error
    assert "not on a Friday" in result.content[0].text  # type: ignore[union-attr]


def test_resume_of_a_turn_still_waiting_says_what_to_decide(data: Path) -> None:
    [pending] = cli(data, "approvals")
    one_line_error(data, "resume", "demo-approval", says="foldline approve demo-approval CALL_ID")
    assert cli(data, "approvals") == [pending]  # nothing changed


def test_bad_decisions_are_one_typed_line_and_change_nothing(data: Path, tmp_path: Path) -> None:
    [pending] = cli(data, "approvals")
    call = pending["callId"]
    with SqliteEventLog(data, read_only=True) as log:
        head = log.head("demo-approval")
    one_line_error(data, "approve", "no-such-session", call, "--allow", says="SessionNotFound")
    one_line_error(data, "approve", "demo-approval", "no-such-call", "--deny", says="ApprovalNotPending")
    one_line_error(data, "approve", "demo-approval", call, "--allow", "--deny", says="exactly one of --allow or --deny")
    one_line_error(data, "approve", "demo-approval", call, "--deny", "--arguments", "{}", says="a denial carries no")
    bad = tmp_path / "decision.json"
    bad.write_text("{bad json", encoding="utf-8")
    one_line_error(
        data, "approve", "demo-approval", call, "--allow", "--arguments-file", str(bad), says="not valid JSON"
    )
    one_line_error(data, "approve", "demo-approval", call, "--allow", "--arguments", "[1, 2]", says="JSON object")
    one_line_error(tmp_path / "none", "approve", "demo-approval", call, "--allow", says="data")
    assert cli(data, "approvals")[0]["decision"] is None
    cli(data, "approve", "demo-approval", call, "--allow", "--arguments", '{"title": "t", "text": "edited"}')
    one_line_error(data, "approve", "demo-approval", call, "--deny", says="AlreadyDecided")
    with SqliteEventLog(data, read_only=True) as log:
        assert log.head("demo-approval") == head  # decisions go to the inbox; only the session's loop logs them
    cli(data, "resume", "demo-approval")
    with SqliteEventLog(data, read_only=True) as log:
        events = log.read("demo-approval")
    [decision] = [e.data for e in events if isinstance(e.data, ApprovalDecision)]
    assert decision.arguments == '{"text":"edited","title":"t"}'  # canonical JSON
    one_line_error(data, "approve", "demo-approval", call, "--allow", says="decided already (allow, seq")
    assert [e.data.call_id for e in events if isinstance(e.data, ApprovalRequest)] == [call]


def test_inject_enters_the_message_at_the_next_step_once(data: Path) -> None:
    out = cli(data, "inject", "demo-000", "Also mention the archive.")
    assert out["session"] == "demo-000"
    cli(data, "resume", "demo-000", "--steps", "2")
    with SqliteEventLog(data, read_only=True) as log:
        events = [e.data for e in log.read("demo-000")]
    [claim] = [d for d in events if isinstance(d, InboxClaim)]
    entered = [d for d in events if isinstance(d, UserMessage) and d.source == "inject"]
    assert [b.text for d in entered for b in d.content] == ["Also mention the archive."]  # type: ignore[union-attr]
    assert claim.entries == (out["entry"],)
    cli(data, "resume", "demo-000", "--steps", "1")  # a later instance enters nothing again
    with SqliteEventLog(data, read_only=True) as log:
        again = [e.data for e in log.read("demo-000") if isinstance(e.data, UserMessage) and e.data.source == "inject"]
    assert again == entered


def test_sessions_and_show_draw_a_sub_agent_under_its_parent(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for session in ("golden-pauses", "golden-pauses-research"):
        res = runner.invoke(app, ["import", str(jsonl_path(session)), "--data-dir", str(data)])
        assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in cli(data, "sessions")}
    child = rows["golden-pauses-research"]
    assert child["parent"]["kind"] == "subagent"
    assert child["parent"]["parent"] == "golden-pauses"
    assert [c["id"] for c in rows["golden-pauses"]["children"]] == ["golden-pauses-research"]
    assert rows["golden-pauses"]["children"][0]["callId"] == child["parent"]["callId"]
    res = runner.invoke(app, ["sessions", "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    assert "sub-agent of golden-pauses" in res.output
    res = runner.invoke(app, ["show", "golden-pauses-research", "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    assert "sub-agent of golden-pauses" in res.output
    assert cli(data, "verify")["status"] == "verified"
