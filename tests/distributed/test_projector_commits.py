"""When the confluent projector commits its offsets: after the apply, at most once per
``projector.commit_interval_s``, before its partitions are revoked, and when it stops.

Real Kafka and Redis, workers in-process. The interval is long (60 s) so that only revocation and the
stop can explain a commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from foldline.adapters.kafka import KafkaClients
from foldline.adapters.kafka.archive_feed import archive_progress
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.projector import WorkerSettings, start_worker
from tests.distributed.projector_harness import (
    Topic,
    all_applied,
    env_or_fail,
    kafka_topic,
    session_log,
    wait_until,
    worker_settings,
    write_sessions,
)

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PARTITIONS = 4


@pytest.fixture
def topic() -> Iterator[Topic]:
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), PARTITIONS, "projector-commits") as t:
        yield t


def _settings(topic: Topic, prefix: str, group: str) -> WorkerSettings:
    return worker_settings(topic, prefix=prefix, group=group, projector__commit_interval_s=60.0)


def _committed(topic: Topic, group: str) -> dict[int, int | None]:
    progress = archive_progress(KafkaClients(topic.bootstrap), group, topic.name, topic.partitions)
    return {p.partition: p.committed for p in progress}


def _ends(topic: Topic, group: str) -> dict[int, int]:
    return {p.partition: p.high for p in archive_progress(KafkaClients(topic.bootstrap), group, topic.name, PARTITIONS)}


def test_offsets_wait_for_the_interval_and_are_committed_when_the_worker_stops(topic: Topic, prefix: str) -> None:
    logs = {f"c{i}": session_log(i, 20) for i in range(8)}
    heads = {sid: len(events) for sid, events in logs.items()}
    write_sessions(topic.bootstrap, topic.name, logs, batch=5, partitions=PARTITIONS, threads=2)
    group = f"test-commits-{uuid.uuid4().hex[:8]}"
    store = fold_store(Config(redis=RedisConfig(env_or_fail("FOLDLINE_REDIS_URL")), folds=FoldsConfig(prefix)))
    worker = start_worker(_settings(topic, prefix, group))
    try:
        wait_until(lambda: all_applied(store, heads), 60, "every session folded")
        # everything is applied, and the interval has not passed: nothing is acknowledged yet
        assert set(_committed(topic, group).values()) == {None}
    finally:
        worker.stop()
        store.close()
    # stopping acknowledged everything applied: each partition up to its end (past the last marker); a
    # partition no session maps to was never consumed from
    assert _committed(topic, group) == {p: end or None for p, end in _ends(topic, group).items()}


def test_partitions_about_to_be_revoked_are_committed_first(topic: Topic, prefix: str) -> None:
    logs = {f"r{i}": session_log(i, 20) for i in range(12)}
    heads = {sid: len(events) for sid, events in logs.items()}
    write_sessions(topic.bootstrap, topic.name, logs, batch=5, partitions=PARTITIONS, threads=2)
    group = f"test-commits-{uuid.uuid4().hex[:8]}"
    settings = _settings(topic, prefix, group)
    store = fold_store(Config(redis=RedisConfig(env_or_fail("FOLDLINE_REDIS_URL")), folds=FoldsConfig(prefix)))
    first = start_worker(settings)
    second = None
    try:
        wait_until(lambda: all_applied(store, heads), 60, "every session folded by the first worker")
        assert set(_committed(topic, group).values()) == {None}
        second = start_worker(settings)  # joining revokes partitions of the first: it commits them first
        wait_until(lambda: bool(second.worker.assigned_partitions()), 60, "the second worker assigned")
        wait_until(lambda: None not in _committed(topic, group).values(), 30, "the revoked partitions committed")
    finally:
        if second is not None:
            second_totals = second.stop()
        first_totals = first.stop()
        store.close()
    # the second worker started where the first had applied: it was handed nothing to fold again
    assert second_totals.events == 0
    assert first_totals.applied == sum(heads.values())
