"""The log outlives the topic's retention, on the real broker, S3 and Redis.

A topic whose events expire after a few seconds, in small segments. Sessions are written (``foldline
demo``), an archiver archives them to S3, then the broker deletes their segments — the partitions' log
start offsets move past every one of their events, which the test asserts. After that ``verify``,
``export``, ``resume``, ``fork`` and ``projector --rebuild`` all succeed, with results identical to those
taken before the deletion. The same topic without an archive configured is refused at start-up.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from typer.testing import CliRunner

from foldline.adapters.archive import audit_archive
from foldline.adapters.kafka import partition_for
from foldline.adapters.kafka.records import MAX_MESSAGE_BYTES
from foldline.archiver.factory import open_archive, open_archiver
from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.config.factories import fold_store, kafka_log
from foldline.errors import EventsExpired, UnsafeRetention
from tests.kafka.conftest import MakeLog

pytestmark = [pytest.mark.kafka, pytest.mark.s3, pytest.mark.redis]

PARTITIONS = 2
RETENTION_MS = 8000  # the archive's maximum delay (2 s) fits twice into it: the topic is accepted with an archive


@pytest.fixture
def short_retention(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A log topic that deletes events after 8 s in 250 ms segments, an S3 archive, a fold prefix."""
    import boto3
    import redis

    run = uuid.uuid4().hex[:10]
    topic = f"test.archive.{run}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    wanted = {
        topic: {
            "retention.ms": str(RETENTION_MS),
            "retention.bytes": "-1",
            "segment.ms": "250",
            "cleanup.policy": "delete",
            "max.message.bytes": str(MAX_MESSAGE_BYTES),
        },
        f"{topic}.index": {"cleanup.policy": "compact"},
        f"{topic}.dlq": {"retention.ms": "-1"},
    }
    for fut in admin.create_topics([NewTopic(t, PARTITIONS, 1, config=c) for t, c in wanted.items()]).values():
        fut.result(timeout=30)
    bucket = f"foldline-archive-{run}"
    env = {
        "FOLDLINE_KAFKA_TOPIC": topic,
        "FOLDLINE_KAFKA_PARTITIONS": str(PARTITIONS),
        "FOLDLINE_ARCHIVE": "s3",
        "FOLDLINE_ARCHIVE_BUCKET": bucket,
        "FOLDLINE_ARCHIVE_IDLE": "0.2",
        "FOLDLINE_ARCHIVE_MAX_DELAY": "2",
        "FOLDLINE_ARCHIVE_GROUP": f"test-archivers-{run}",
        "FOLDLINE_FOLD_PREFIX": f"test:archive:{run}:",
        "FOLDLINE_DATA_DIR": str(tmp_path / "data"),
        "FOLDLINE_BACKEND": "kafka",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield topic
    for fut in admin.delete_topics(list(wanted), operation_timeout=10).values():
        fut.result(timeout=30)
    r = redis.Redis.from_url(Config.from_env().redis.url)
    for key in r.scan_iter(match=env["FOLDLINE_FOLD_PREFIX"] + "*", count=1000):
        r.delete(key)
    r.close()
    s3 = boto3.session.Session().client("s3", endpoint_url=Config.from_env().s3.endpoint)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])
    s3.delete_bucket(Bucket=bucket)
    s3.close()


def _invoke(runner: CliRunner, *args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


def _replayed(runner: CliRunner, ids: list[str]) -> list[tuple[str, str, int]]:
    """``foldline replay`` of the sessions, unchanged: (session, status, requests built identically)."""
    out = json.loads(_invoke(runner, "replay", *ids, "--json"))
    return [(s["session"], s["status"], s["identical"]) for s in out["sessions"]]


def _bounds(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        out: dict[int, tuple[int, int]] = {}
        for p in range(PARTITIONS):
            for _ in range(50):
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                    out[p] = (int(low), int(high))
                    break
                except KafkaException:
                    time.sleep(0.2)
        return out
    finally:
        consumer.close()


def test_sessions_outlive_the_topics_retention(
    kafka_bootstrap: str, short_retention: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = short_retention
    runner = CliRunner()
    config = Config.from_env()

    # without an archive the same topic is refused at start-up, before anything is written
    no_archive = config.overridden(archive__store="off")
    with pytest.raises(UnsafeRetention) as refused:
        open_stores(no_archive)
    assert refused.value.setting == "retention.ms"
    assert "no archive is configured" in str(refused.value)
    with monkeypatch.context() as m:
        m.setenv("FOLDLINE_ARCHIVE", "off")
        res = runner.invoke(app, ["demo", "--sessions", "1", "--steps", "1"])
        assert res.exit_code == 2
        assert "UnsafeRetention" in res.output
    assert all(high == 0 for _, high in _bounds(kafka_bootstrap, topic).values())

    # an archiver runs; sessions are written
    ready = threading.Event()
    worker = open_archiver(config, on_ready=lambda _w: ready.set())
    thread = threading.Thread(target=worker.run, name="archiver")
    thread.start()
    try:
        assert ready.wait(30), "the archiver did not start"
        out = json.loads(_invoke(runner, "demo", "--sessions", "2", "--steps", "4", "--json"))
        ids = [s["id"] for s in out["sessions"]]
        assert all(s["verified"] for s in out["sessions"])
        archive = open_archive(config)
        with kafka_log(config, archive=False) as plain:  # Kafka alone, no archive
            heads = {sid: plain.head(sid) for sid in ids}
        deadline = time.monotonic() + 20
        while any(archive.watermark(sid, refresh=True) < heads[sid] for sid in ids):
            assert time.monotonic() < deadline, "the archiver did not archive the sessions within the max delay"
            time.sleep(0.1)

        # the results before the deletion
        verified = _invoke(runner, "verify", *ids, "--json")
        replayed = _replayed(runner, ids)
        assert [status for _, status, _ in replayed] == ["identical"] * len(ids)
        costs = _invoke(runner, "cost", *ids, "--json")
        assert [g["session"] for g in json.loads(costs)["groups"]] == ids
        exports = {}
        for sid in ids:
            _invoke(runner, "export", sid, "-o", str(tmp_path / f"{sid}.before.jsonl"))
            exports[sid] = (tmp_path / f"{sid}.before.jsonl").read_bytes()
        at = next(i for i, e in enumerate(_events(tmp_path / f"{ids[0]}.before.jsonl")) if e["type"] == "step/end")
        forked = json.loads(_invoke(runner, "fork", ids[0], "--at", str(at), "--as", "child-before", "--json"))
        _invoke(runner, "projector", "--rebuild", *ids)
        store = fold_store(config)
        try:
            folds = {sid: store.get(sid) for sid in ids}
            assert all(f is not None and f.applied_seq == heads[sid] - 1 for sid, f in folds.items())
            for sid in ids:
                store.delete(sid)
        finally:
            store.close()
        # the resume a copy of the session gives (the embedded log, which never deletes anything)
        copy = ["--backend", "embedded", "--data-dir", str(tmp_path / "copy")]
        shutil.copytree(tmp_path / "data" / "attachments", tmp_path / "copy" / "attachments")
        _invoke(runner, "import", str(tmp_path / f"{ids[1]}.before.jsonl"), *copy)
        copy_cost = json.loads(_invoke(runner, "cost", ids[1], "--json", *copy))
        assert copy_cost["groups"] == [g for g in json.loads(costs)["groups"] if g["session"] == ids[1]]
        resumed_copy = json.loads(_invoke(runner, "resume", ids[1], "--steps", "2", "--json", *copy))

        # the broker deletes every event of these sessions: each partition's log start passes them
        with kafka_log(config, archive=False) as plain:  # Kafka alone, no archive
            deadline = time.monotonic() + 90
            while True:
                expired = []
                for sid in [*ids, "child-before"]:
                    try:
                        plain.read(sid, 0, 1)
                    except EventsExpired as exc:
                        expired.append(exc)
                if len(expired) == len(ids) + 1:
                    break
                assert time.monotonic() < deadline, "the broker did not delete the sessions' segments"
                time.sleep(0.5)
        bounds = _bounds(kafka_bootstrap, topic)
        for sid in ids:
            low, high = bounds[partition_for(sid, PARTITIONS)]
            assert low > 0
            assert low == high
        assert "now starts at offset" in str(expired[0])
        time.sleep(1.0)  # the archiver keeps running past the deletion

        # after it: the same results, read from the archive (and the tail Kafka still has)
        assert _invoke(runner, "verify", *ids, "--json") == verified
        assert _replayed(runner, ids) == replayed
        assert _invoke(runner, "cost", *ids, "--json") == costs
        for sid in ids:
            _invoke(runner, "export", sid, "-o", str(tmp_path / f"{sid}.after.jsonl"))
            assert (tmp_path / f"{sid}.after.jsonl").read_bytes() == exports[sid]
        forked_after = json.loads(_invoke(runner, "fork", ids[0], "--at", str(at), "--as", "child-after", "--json"))
        assert {**forked_after, "child": "child-before"} == forked
        _invoke(runner, "projector", "--rebuild", *ids)
        store = fold_store(config)
        try:
            assert {sid: store.get(sid) for sid in ids} == folds
        finally:
            store.close()
        resumed = json.loads(_invoke(runner, "resume", ids[1], "--steps", "2", "--json"))
        assert resumed == resumed_copy
        report = audit_archive(archive.store, verify=True)
        assert report.clean
        assert report.orphans == []
        archive.close()
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


def _events(path: Path) -> list[dict[str, object]]:
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[1:]]


def test_an_archive_that_does_not_answer_does_not_stop_reads_kafka_can_serve(make_log: MakeLog) -> None:
    """The archive store is down (nothing listens at its endpoint): a session Kafka still holds reads whole."""
    from foldline.adapters.archive import SessionArchive
    from foldline.adapters.s3_archive import S3ArchiveStore
    from foldline.adapters.s3_attachments import s3_client
    from foldline.errors import StoreUnavailable
    from tests.factories import simple_log

    dead = s3_client(
        endpoint_url="http://127.0.0.1:9", region="us-east-1", max_attempts=1, connect_timeout_s=0.5,
        read_timeout_s=0.5, max_connections=2,
    )  # fmt: skip
    archive = SessionArchive(S3ArchiveStore("unreachable", client=dead))
    with pytest.raises(StoreUnavailable):
        archive.watermark("s-down")
    log = make_log(archive=archive)
    events = simple_log()
    log.append("s-down", 0, events)
    assert log.read("s-down") == events
    assert log.read("s-down", 3, 7) == events[3:7]
