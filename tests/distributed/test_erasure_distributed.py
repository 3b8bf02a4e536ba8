"""Erasure on the distributed backend, against the real local Kafka, Redis and S3 (deploy/local).

A session full of a canary is imported (its events sealed into Kafka), given two inbox messages holding it (one
claimed by a step, one still pending in ``<topic>.inbox``), folded by a real projector process into Redis,
archived into S3 segments, its image and archived request bodies put in S3, and exported; then it is erased.
Afterwards the canary is in none of: the raw records of every topic, the inbox's included (Kafka keeps them
until retention or compaction — they hold only ciphertext under a destroyed key), any S3 object of the
attachment, archive or key buckets, any Redis key or value, an export made after the erasure; the pending inbox
entry has its tombstone. Every other session still verifies.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis
from confluent_kafka import Consumer, KafkaError, TopicPartition
from typer.testing import CliRunner

from foldline.archiver.factory import open_archive, open_archiver
from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.config.factories import fold_store, kafka_log
from foldline.core.events import InboxClaim
from foldline.ports.fold_store import ERASED

from ..erasure_helpers import canary_session, inflated, put_request_bodies
from .projector_harness import WorkerProcess, wait_until, worker_env

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3, pytest.mark.slow]

CANARY = "canary-d15c0e51"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [*args, "--backend", "distributed"], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def kafka_holds(bootstrap: str, topics: list[str], needle: bytes) -> tuple[int, list[str]]:
    """(records read, where the needle is) over every record of ``topics`` from their start: keys, values and
    headers as the broker keeps them (aborted transactions' records included)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"canary-scan-{uuid.uuid4().hex}",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    found: list[str] = []
    count = 0
    try:
        meta = consumer.list_topics(timeout=10)
        parts = [TopicPartition(t, p, 0) for t in topics if t in meta.topics for p in meta.topics[t].partitions]
        ends = {}
        for tp in parts:
            ends[(tp.topic, tp.partition)] = consumer.get_watermark_offsets(tp, timeout=10)[1]
        consumer.assign(parts)
        remaining = {k for k, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=1.0):
                error = msg.error()
                if error is not None:  # the end of a partition (past its transaction markers too)
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    remaining.discard((msg.topic() or "", msg.partition() or 0))
                    continue
                count += 1
                headers = [h[1] for h in msg.headers() or [] if isinstance(h[1], bytes)]
                raw = (msg.key() or b"") + (msg.value() or b"") + b"".join(headers)
                if needle in raw:
                    found.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}")
        assert not remaining, f"the scan did not reach the end of {sorted(remaining)}"
    finally:
        consumer.close()
    return count, found


def inbox_keys(bootstrap: str, topic: str) -> dict[bytes, bytes | None]:
    """The last value of each key of ``topic`` (``None``: a tombstone), read from its start."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"inbox-scan-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    last: dict[bytes, bytes | None] = {}
    try:
        meta = consumer.list_topics(timeout=10)
        parts = [TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions]
        remaining = {tp.partition for tp in parts if consumer.get_watermark_offsets(tp, timeout=10)[1] > 0}
        consumer.assign(parts)
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=1.0):
                error = msg.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    remaining.discard(msg.partition() or 0)
                    continue
                last[msg.key() or b""] = msg.value()
        assert not remaining, f"the scan did not reach the end of {topic} partitions {sorted(remaining)}"
    finally:
        consumer.close()
    return last


def s3_holds(endpoint: str, buckets: list[str], needle: bytes) -> tuple[int, list[str]]:
    """(objects read, where the needle is) over every object of ``buckets``: key, metadata and bytes (an archive
    segment's blocks inflated)."""
    s3 = boto3.session.Session().client("s3", endpoint_url=endpoint)
    found: list[str] = []
    count = 0
    try:
        for bucket in buckets:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for obj in page.get("Contents", []):
                    count += 1
                    got = s3.get_object(Bucket=bucket, Key=obj["Key"])
                    meta = json.dumps(got.get("Metadata", {})).encode()
                    if needle in inflated(got["Body"].read()) + obj["Key"].encode() + meta:
                        found.append(f"s3://{bucket}/{obj['Key']}")
    finally:
        s3.close()
    return count, found


def redis_holds(url: str, needle: bytes) -> tuple[int, list[str]]:
    """Every key of the Redis database and every value of it, whatever its type."""
    client: Any = redis.Redis.from_url(url)  # replies are bytes (no decoding): typed loosely by redis-py
    found: list[str] = []
    count = 0
    try:
        for key in client.scan_iter(count=1000):
            count += 1
            kind = client.type(key).decode()
            if kind == "string":
                values = [client.get(key) or b""]
            elif kind == "list":
                values = list(client.lrange(key, 0, -1))
            elif kind == "hash":
                values = [k + v for k, v in client.hgetall(key).items()]
            elif kind == "set":
                values = list(client.smembers(key))
            elif kind == "zset":
                values = [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
            elif kind == "stream":
                values = [b"".join(k + v for k, v in fields.items()) for _, fields in client.xrange(key)]
            else:
                values = [client.dump(key) or b""]
            if needle in key or any(needle in v for v in values):
                found.append(key.decode(errors="replace"))
    finally:
        client.close()
    return count, found


@pytest.fixture
def erasure_env(distributed_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The distributed environment with an S3 archive and a key bucket of this test, and a short key cache."""
    run = uuid.uuid4().hex[:8]
    extra = {
        "FOLDLINE_BACKEND": "distributed",
        "FOLDLINE_ARCHIVE": "s3",
        "FOLDLINE_ARCHIVE_BUCKET": f"foldline-arch-{run}",
        "FOLDLINE_ARCHIVE_IDLE": "0.5",
        "FOLDLINE_ARCHIVE_MAX_DELAY": "2",
        "FOLDLINE_KEYS_BUCKET": f"foldline-keys-{run}",
        "FOLDLINE_KEY_CACHE_TTL": "1",
    }
    for k, v in extra.items():
        monkeypatch.setenv(k, v)
    yield {**distributed_env, **extra}
    s3 = boto3.session.Session().client("s3", endpoint_url=distributed_env["s3"])
    names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    for bucket in (extra["FOLDLINE_ARCHIVE_BUCKET"], extra["FOLDLINE_KEYS_BUCKET"]):
        if bucket in names:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for obj in page.get("Contents", []):
                    s3.delete_object(Bucket=bucket, Key=obj["Key"])
            s3.delete_bucket(Bucket=bucket)
    s3.close()


def test_the_canary_is_nowhere_after_an_erasure_on_kafka_redis_and_s3(
    erasure_env: dict[str, str], tmp_path: Path
) -> None:
    env = erasure_env
    config = Config.from_env()
    images = canary_session(tmp_path / "scratch", "secret-1", CANARY, tmp_path / "secret-1.jsonl")
    canary_session(tmp_path / "scratch-other", "other-1", "nothing-secret-here", tmp_path / "other-1.jsonl")
    stores = open_stores(config)  # creates and checks the topics
    try:
        stores.attachments.ensure_bucket()  # type: ignore[attr-defined]
    finally:
        stores.close()
    projector = WorkerProcess([], worker_env({"FOLDLINE_PROJECTOR_GROUP": f"erasure-{uuid.uuid4().hex[:8]}"}))
    projector.start()
    ready = threading.Event()
    archiver = open_archiver(config, on_ready=lambda _w: ready.set())
    thread = threading.Thread(target=archiver.run, name="archiver")
    thread.start()
    try:
        assert ready.wait(30), "the archiver did not start"
        for sid in ("secret-1", "other-1"):
            bundle = images if sid == "secret-1" else tmp_path / "other-1.jsonl.attachments"
            code, _, err = cli("import", str(tmp_path / f"{sid}.jsonl"), "--attachments", str(bundle))
            assert code == 0, err
        # the inbox (<topic>.inbox): one message injected and claimed by a step, one still pending at the erasure
        code, out, err = cli("inject", "secret-1", f"Remember {CANARY} too.", "--json")
        assert code == 0, err
        claimed = json.loads(out)["entry"]
        code, _, err = cli("resume", "secret-1", "--steps", "1")
        assert code == 0, err
        code, out, err = cli("inject", "secret-1", f"Still waiting: {CANARY}.", "--json")
        assert code == 0, err
        pending = json.loads(out)["entry"]
        stores = open_stores(config)
        try:
            claims = [e.data for e in stores.log.read("secret-1") if isinstance(e.data, InboxClaim)]
            assert [c.entries for c in claims] == [(claimed,)]
            assert [e.id for e in stores.log.inbox().entries("secret-1")] == [pending]
        finally:
            stores.close()
        stores = open_stores(config)
        try:
            bodies = put_request_bodies(stores, "secret-1")  # as a dispatcher that archives requests does
            head = stores.log.head("secret-1")
        finally:
            stores.close()
        assert bodies
        code, _, err = cli("export", "secret-1", "--out", str(tmp_path / "before.jsonl"))
        assert code == 0, err
        folds = fold_store(config)
        archive = open_archive(config)
        try:
            wait_until(lambda: folds.applied_seq("secret-1") == head - 1, 60, "the projector to fold the session")
            wait_until(lambda: archive.watermark("secret-1", refresh=True) >= head, 60, "the archiver to archive it")
        finally:
            folds.close()
        # before: the content is in the fold (Redis is a cache of plaintext folds) and in S3 (image, bodies),
        # never in a Kafka record or an archive segment (sealed)
        needle = CANARY.encode()
        inbox_topic = config.kafka.topic + ".inbox"
        topics = [config.kafka.topic, config.kafka.topic + ".index", config.kafka.topic + ".dlq", inbox_topic]
        records, in_kafka = kafka_holds(env["bootstrap"], topics, needle)
        assert records > 0
        assert in_kafka == []  # the inbox's records are sealed too
        assert redis_holds(env["redis"], needle)[1] != []
        buckets = [env["FOLDLINE_S3_BUCKET"], env["FOLDLINE_ARCHIVE_BUCKET"], env["FOLDLINE_KEYS_BUCKET"]]
        before = s3_holds(env["s3"], buckets, needle)[1]
        assert any("foldline-arch" not in b for b in before)
        assert not any("foldline-arch" in b for b in before)  # the archive holds the sealed records

        code, out, err = cli("erase", "secret-1", "--reason", "distributed canary", "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["foldsErased"] == 1
        assert report["inboxRemoved"] == [f"secret-1/{pending}"]
        assert set(bodies) <= set(report["objectsRemoved"])
        time.sleep(2.5)  # past the key cache time: the projector can no longer open the session

        # after: nowhere
        records, in_kafka = kafka_holds(env["bootstrap"], topics, needle)
        assert records > 0
        assert in_kafka == []
        assert redis_holds(env["redis"], needle)[1] == []
        count, in_s3 = s3_holds(env["s3"], buckets, needle)
        assert count > 0
        assert in_s3 == []
        assert not (tmp_path / "before.jsonl").exists()
        code, _, err = cli("export", "secret-1", "--out", str(tmp_path / "after.jsonl"))
        assert code == 0, err
        assert needle not in (tmp_path / "after.jsonl").read_bytes()
        # the inbox: a tombstone for the pending entry (compaction drops the record later), nothing left to take
        keys = inbox_keys(env["bootstrap"], inbox_topic)
        assert keys[b"secret-1\xff" + pending.encode()] is None
        stores = open_stores(config)
        try:
            assert stores.log.inbox().stored("secret-1") == []
        finally:
            stores.close()
        # the fold is the erased tombstone, and stays one
        folds = fold_store(config)
        try:
            tomb = folds.get("secret-1")
            assert tomb is not None
            assert (tomb.applied_seq, tomb.messages, tomb.header) == (ERASED, (), None)
        finally:
            folds.close()
        # every other session verifies as before; the erased one is reported erased
        code, out, _ = cli("verify", "--json")
        assert code == 5
        statuses = {s["id"]: s["status"] for s in json.loads(out)["sessions"]}
        assert statuses == {"secret-1": "erased", "other-1": "verified"}
        assert cli("verify", "other-1")[0] == 0
        with kafka_log(config) as log:  # the structure is still there, through archive and tail
            assert log.read_stored("secret-1")[-1].type == "session/erased"
    finally:
        archiver.stop()
        thread.join(30)
        projector.kill()
