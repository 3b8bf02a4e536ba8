"""`foldline demo --backend distributed`: loop → Kafka → projector process → Redis → dispatcher → emulator,
images in S3; then `foldline verify --backend distributed` proves every request against its digest.

Everything is real and local (deploy/local): the Kafka broker, Redis, SeaweedFS S3, and `foldline projector`
processes started by the demo. Each run uses its own topic, fold key prefix, S3 bucket and data directory.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import redis
from typer.testing import CliRunner

from foldline.adapters.kafka_log import KafkaEventLog
from foldline.adapters.redis_folds import RedisFoldStore
from foldline.cli.main import app
from foldline.core.content import ImageBlock
from foldline.core.events import AssistantMessage, RequestDispatch, UserMessage
from foldline.core.fold import fold_state
from foldline.core.projection import Session

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3]


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is unset: run `bash deploy/local/up.sh` and `source .local/env.sh`")
    return value


@pytest.fixture
def distributed_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A topic, fold prefix and bucket of this test only; deleted afterwards."""
    run = uuid.uuid4().hex[:10]
    env = {
        "FOLDLINE_KAFKA_TOPIC": f"test.distributed.{run}",
        "FOLDLINE_FOLD_PREFIX": f"test:fold:{run}:",
        "FOLDLINE_S3_BUCKET": f"foldline-dist-{run}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bootstrap, redis_url = _env("FOLDLINE_KAFKA_BOOTSTRAP"), _env("FOLDLINE_REDIS_URL")
    yield {**env, "bootstrap": bootstrap, "redis": redis_url}

    from confluent_kafka.admin import AdminClient

    topic = env["FOLDLINE_KAFKA_TOPIC"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    doomed = [t for t in (topic, topic + ".index", topic + ".dlq") if t in admin.list_topics(timeout=10).topics]
    if doomed:
        for fut in admin.delete_topics(doomed, operation_timeout=10).values():
            fut.result(timeout=20)
    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(match=env["FOLDLINE_FOLD_PREFIX"] + "*", count=1000):
        r.delete(key)
    r.close()
    s3 = boto3.session.Session().client("s3", endpoint_url=_env("FOLDLINE_S3_ENDPOINT"))
    bucket = env["FOLDLINE_S3_BUCKET"]
    if any(b["Name"] == bucket for b in s3.list_buckets().get("Buckets", [])):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)
    s3.close()


def test_distributed_demo_then_verify(distributed_env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--backend", "distributed", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "4", "--steps", "8", "--json", *args])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [s["id"] for s in out["sessions"]] == ["demo-000", "demo-001", "demo-002", "demo-003"]
    assert all(len(s["steps"]) == 8 and s["verified"] for s in out["sessions"])
    assert "projector ready" in (tmp_path / "logs" / "projector-0.log").read_text()

    log = KafkaEventLog(distributed_env["bootstrap"], topic=distributed_env["FOLDLINE_KAFKA_TOPIC"])
    folds = RedisFoldStore(distributed_env["redis"], prefix=distributed_env["FOLDLINE_FOLD_PREFIX"])
    s3 = boto3.session.Session().client("s3", endpoint_url=_env("FOLDLINE_S3_ENDPOINT"))
    try:
        checked = 0
        for sid in log.sessions():
            events = log.read(sid)
            dispatches = [e for e in events if isinstance(e.data, RequestDispatch)]
            checked += len(dispatches)
            # every request/dispatch is answered right after it (the dispatcher's two appends)
            seqs = {e.seq for e in events}
            assert all(isinstance(events[d.seq + 1].data, AssistantMessage) for d in dispatches if d.seq + 1 in seqs)
            # the projector's fold is the fold of the log
            fold = folds.wait_for(sid, events[-1].seq, 30)
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

    res = runner.invoke(app, ["verify", "--json", *args])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"checked": checked, "matched": checked, "mismatched": [], "unreconstructable": []}


def test_distributed_demo_with_a_dispatcher_process(distributed_env: dict[str, str], tmp_path: Path) -> None:
    """Steps handed over the Redis stream to a `foldline dispatcher` process, which writes to Kafka too."""
    runner = CliRunner()
    args = ["--backend", "distributed", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "2", "--steps", "3", "--dispatchers", "1", "--json", *args])
    assert res.exit_code == 0, res.output + (tmp_path / "logs" / "dispatcher-0.log").read_text()
    out = json.loads(res.stdout)
    assert all(len(s["steps"]) == 3 and s["verified"] for s in out["sessions"])
    assert "answering 6 step(s)" in (tmp_path / "logs" / "dispatcher-0.log").read_text()
    res = runner.invoke(app, ["verify", "--json", *args])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["matched"] == 6
