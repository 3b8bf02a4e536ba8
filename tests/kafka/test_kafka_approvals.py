"""Approvals on the Kafka backend: a turn paused on the real broker is listed by `foldline approvals`, decided by
`foldline approve` (into the session's inbox on the broker) and finished by `foldline resume`; verify passes."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.core.events import ApprovalDecision, TurnEnd
from foldline.demo import APPROVAL_SESSION, run_approval_session
from foldline.providers.emulated import emulated_provider

pytestmark = pytest.mark.kafka


def test_a_paused_turn_on_kafka_is_decided_and_finished_from_the_command_line(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FOLDLINE_KAFKA_TOPIC", f"test.approvals.{uuid.uuid4().hex[:10]}")
    config = Config.from_env().overridden(data_dir=tmp_path, backend="kafka")
    stores = open_stores(config, writer=True)
    try:
        done = asyncio.run(
            run_approval_session(APPROVAL_SESSION, stores, lambda: emulated_provider("anthropic"), lambda: None)
        )
    finally:
        stores.close()
    assert done.note.startswith("paused: publish_note")
    runner = CliRunner()
    args = ["--backend", "kafka", "--data-dir", str(tmp_path), "--json"]
    res = runner.invoke(app, ["approvals", *args])
    assert res.exit_code == 0, res.output
    [pending] = json.loads(res.stdout)
    assert (pending["session"], pending["decision"]) == (APPROVAL_SESSION, None)
    res = runner.invoke(app, ["approve", APPROVAL_SESSION, pending["callId"], "--allow", *args])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["approve", APPROVAL_SESSION, pending["callId"], "--deny", *args])
    assert res.exit_code == 2
    assert "AlreadyDecided" in res.output
    res = runner.invoke(app, ["resume", APPROVAL_SESSION, *args])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["continued"]["reason"] == "completed"
    res = runner.invoke(app, ["approvals", *args])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == []
    res = runner.invoke(app, ["verify", *args])
    assert res.exit_code == 0, res.output
    stores = open_stores(config, read_only=True)
    try:
        events = stores.log.read(APPROVAL_SESSION)
    finally:
        stores.close()
    assert [e.data.verdict for e in events if isinstance(e.data, ApprovalDecision)] == ["allow"]
    assert [e.data.reason for e in events if isinstance(e.data, TurnEnd)] == ["completed"]
