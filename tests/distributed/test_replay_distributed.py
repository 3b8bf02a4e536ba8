"""`foldline replay --backend distributed`: sessions a distributed demo recorded (Kafka log, S3 images, requests
built by dispatchers from Redis folds) replay through the loop, unchanged and changed, and a live child is
written to Kafka. Everything is real and local (deploy/local); each run has its own topic, prefix and bucket.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import Config
from foldline.config.factories import content_sealer, kafka_log
from foldline.core.events import SessionEndSeed

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3]


def _replay(runner: CliRunner, *args: str, code: int) -> dict[str, Any]:
    res = runner.invoke(app, ["replay", *args, "--json"])
    assert res.exit_code == code, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_replay_reads_kafka_and_s3_and_writes_a_live_child_there(
    distributed_env: dict[str, str], tmp_path: Path
) -> None:
    runner = CliRunner()
    backend = ["--backend", "distributed", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "4", "--steps", "6", "--json", *backend])
    assert res.exit_code == 0, res.output

    same = _replay(runner, "--all", *backend, code=0)
    assert [(s["session"], s["status"], s["identical"]) for s in same["sessions"]] == [
        ("demo-000", "identical", 6),
        ("demo-001", "identical", 6),  # its image read from S3 for every request
        ("demo-002", "identical", 6),
        ("demo-003", "identical", 6),
    ]

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("You are a terse research agent.")
    changed = _replay(runner, "--all", "--system-file", str(prompt), *backend, code=1)
    assert all(
        (s["divergence"]["request"], [f["path"] for f in s["divergence"]["fields"]]) == (0, ["system"])
        for s in changed["sessions"]
    )

    live = ["--system-file", str(prompt), "--live", "--tools", "foldline.demo:demo_toolset", "--as", "demo-001-terse"]
    out = _replay(runner, "demo-001", *live, *backend, code=1)
    child = out["sessions"][0]["live"]
    assert (child["child"], child["written"]) == ("demo-001-terse", True)
    assert child["verified"] == child["checked"] > 0
    config = Config.from_env().overridden(backend="distributed", data_dir=tmp_path)  # as the commands had it
    with kafka_log(config, sealer=content_sealer(config)) as log:  # the content is sealed: opened with its keys
        events = log.read("demo-001-terse")
    seed = [e.data for e in events if isinstance(e.data, SessionEndSeed)]
    assert [s.parent_id for s in seed] == ["demo-001"]
    assert runner.invoke(app, ["verify", "demo-001-terse", *backend]).exit_code == 0
