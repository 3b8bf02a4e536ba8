"""Fixtures shared by the distributed tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import boto3
import pytest
import redis
from confluent_kafka.admin import AdminClient

from .projector_harness import drop_prefix, env_or_fail


@pytest.fixture
def distributed_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A Kafka topic, fold key prefix and S3 bucket of this test only, set in the environment the way
    `foldline` reads it; the local servers' addresses under ``bootstrap``, ``redis`` and ``s3``. The topics,
    folds and bucket are deleted afterwards."""
    run = uuid.uuid4().hex[:10]
    env = {
        "FOLDLINE_KAFKA_TOPIC": f"test.distributed.{run}",
        "FOLDLINE_FOLD_PREFIX": f"test:fold:{run}:",
        "FOLDLINE_S3_BUCKET": f"foldline-dist-{run}",
        "FOLDLINE_KEYS_PREFIX": f"keys-{run}/",  # the sessions' content keys, in the (shared) key bucket
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bootstrap, redis_url = env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), env_or_fail("FOLDLINE_REDIS_URL")
    s3_endpoint = env_or_fail("FOLDLINE_S3_ENDPOINT")
    yield {**env, "bootstrap": bootstrap, "redis": redis_url, "s3": s3_endpoint}

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
    s3 = boto3.session.Session().client("s3", endpoint_url=s3_endpoint)
    bucket = env["FOLDLINE_S3_BUCKET"]
    buckets = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if bucket in buckets:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)
    keys = os.environ.get("FOLDLINE_KEYS_BUCKET", "foldline-keys")
    if keys in buckets:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=keys, Prefix=env["FOLDLINE_KEYS_PREFIX"]):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=keys, Key=obj["Key"])
    s3.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    """A Redis key prefix of this test only; its keys are deleted afterwards."""
    value = f"test:projector:{uuid.uuid4().hex[:10]}:"
    yield value
    drop_prefix(env_or_fail("FOLDLINE_REDIS_URL"), value)
