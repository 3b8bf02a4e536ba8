"""`foldline demo --backend distributed`: loop → Kafka → projector process → Redis → dispatcher → emulator,
images in S3; then `foldline verify --backend distributed` proves every request against its digest.

Everything is real and local (deploy/local): the Kafka broker, Redis, SeaweedFS S3, and `foldline projector`
processes started by the demo. Each run uses its own topic, fold key prefix, S3 bucket and data directory.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import boto3
import pytest
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import content_sealer, fold_store, kafka_log
from foldline.core.content import ImageBlock
from foldline.core.events import AssistantMessage, RequestDispatch, UserMessage
from foldline.core.fold import fold_state
from foldline.core.projection import Session
from foldline.dispatcher import wait_for_fold

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3]


def test_distributed_demo_then_verify(distributed_env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--backend", "distributed", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "4", "--steps", "8", "--json", *args])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [s["id"] for s in out["sessions"]] == ["demo-000", "demo-001", "demo-002", "demo-003"]
    assert all(len(s["steps"]) == 8 and s["verified"] for s in out["sessions"])
    assert "projector ready" in (tmp_path / "logs" / "projector-0.log").read_text()

    # the demo's topic, from the environment the fixture set; its backend and data dir, as the command had them
    config = Config.from_env().overridden(backend="distributed", data_dir=tmp_path)
    log = kafka_log(config, sealer=content_sealer(config))  # the content is sealed: opened with the session keys
    folds = fold_store(
        Config(redis=RedisConfig(distributed_env["redis"]), folds=FoldsConfig(distributed_env["FOLDLINE_FOLD_PREFIX"]))
    )
    s3 = boto3.session.Session().client("s3", endpoint_url=distributed_env["s3"])
    try:
        checked = 0
        for sid in log.sessions():
            events = log.read(sid)
            dispatches = [e for e in events if isinstance(e.data, RequestDispatch)]
            checked += len(dispatches)
            # every request/dispatch is answered right after it
            seqs = {e.seq for e in events}
            assert all(isinstance(events[d.seq + 1].data, AssistantMessage) for d in dispatches if d.seq + 1 in seqs)
            # the projector's fold is the fold of the log
            fold = wait_for_fold(folds, sid, events[-1].seq, 30)
            fresh = fold_state(Session(sid, events), fold.epoch)
            assert (fold.applied_seq, fold.header, fold.messages) == (fresh.applied_seq, fresh.header, fresh.messages)
        # demo-001's image is an object in the S3 bucket, under its digest
        images = [
            b.image
            for e in log.read("demo-001")
            if isinstance(e.data, UserMessage)
            for b in e.data.content
            if isinstance(b, ImageBlock)
        ]
        assert images
        hexd = images[0].attachment_id.removeprefix("sha256:")
        keys = [
            o["Key"]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=distributed_env["FOLDLINE_S3_BUCKET"])
            for o in page.get("Contents", [])
        ]
        assert any(k.endswith(f"{hexd[:2]}/{hexd}") for k in keys)
    finally:
        s3.close()
        folds.close()
        log.close()

    res = runner.invoke(app, ["cost", "--json", *args])  # from the Kafka log, as verify reads it
    assert res.exit_code == 0, res.output
    cost = json.loads(res.stdout, parse_float=Decimal)
    assert [g["session"] for g in cost["groups"]] == ["demo-000", "demo-001", "demo-002", "demo-003"]
    for figure in ("spend", "noCache", "saved", "dropCost"):
        assert cost["fleet"][figure] > 0
        assert sum(g[figure] for g in cost["groups"]) == cost["fleet"][figure]
    assert cost["fleet"]["steps"] == checked

    res = runner.invoke(app, ["verify", "--json", *args])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert {k: report[k] for k in ("checked", "matched", "mismatched", "unreconstructable", "status")} == {
        "checked": checked,
        "matched": checked,
        "mismatched": [],
        "unreconstructable": [],
        "status": "verified",
    }


def test_distributed_demo_with_a_dispatcher_process(distributed_env: dict[str, str], tmp_path: Path) -> None:
    """Steps handed over the Redis stream to a `foldline dispatcher` process, which writes to Kafka too."""
    runner = CliRunner()
    args = ["--backend", "distributed", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "2", "--steps", "3", "--dispatchers", "1", "--json", *args])
    assert res.exit_code == 0, res.output + (tmp_path / "logs" / "dispatcher-0.log").read_text()
    out = json.loads(res.stdout)
    assert all(len(s["steps"]) == 3 and s["verified"] for s in out["sessions"])
    assert "sending 6 step(s)" in (tmp_path / "logs" / "dispatcher-0.log").read_text()
    res = runner.invoke(app, ["verify", "--json", *args])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["matched"] == 6


def test_distributed_demo_on_a_six_partition_topic(
    distributed_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FOLDLINE_KAFKA_PARTITIONS reaches every process: the loop, the projector and a dispatcher process all
    map sessions onto the topic's 6 partitions (a 12 assumed anywhere fails with ConfigError)."""
    monkeypatch.setenv("FOLDLINE_KAFKA_PARTITIONS", "6")
    runner = CliRunner()
    args = ["--backend", "distributed", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "2", "--steps", "3", "--dispatchers", "1", "--json", *args])
    logs = tmp_path / "logs"
    assert res.exit_code == 0, res.output + "".join(p.read_text() for p in logs.glob("*.log"))
    assert all(len(s["steps"]) == 3 and s["verified"] for s in json.loads(res.stdout)["sessions"])
    assert "sending 6 step(s)" in (logs / "dispatcher-0.log").read_text()
    topic = distributed_env["FOLDLINE_KAFKA_TOPIC"]
    metadata = AdminClient({"bootstrap.servers": distributed_env["bootstrap"]}).list_topics(timeout=10)
    assert {t: len(metadata.topics[t].partitions) for t in (topic, f"{topic}.index")} == {topic: 6, f"{topic}.index": 6}
    res = runner.invoke(app, ["verify", "--json", *args])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["matched"] == 6
