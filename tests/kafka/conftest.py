"""Fixtures for the Kafka tests: the REAL local broker (deploy/local/up.sh), unique topics per run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from foldline.adapters.kafka import KafkaEventLog

MakeLog = Callable[..., KafkaEventLog]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get("FOLDLINE_KAFKA_BOOTSTRAP")
    if not bootstrap:
        pytest.fail(
            "FOLDLINE_KAFKA_BOOTSTRAP is not set: start the local broker with `deploy/local/up.sh kafka` and "
            "`source .local/env.sh` (make test does both)"
        )
    return bootstrap


@pytest.fixture(scope="session")
def kafka_topic(kafka_bootstrap: str) -> Iterator[str]:
    """One topic (plus .index and .dlq) for the whole run, created by the adapter, deleted afterwards."""
    topic = f"test.session-events.{uuid.uuid4().hex[:10]}"
    yield topic
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    existing = admin.list_topics(timeout=10).topics
    doomed = [t for t in (topic, topic + ".index", topic + ".dlq", topic + ".inbox") if t in existing]
    if doomed:
        for fut in admin.delete_topics(doomed, operation_timeout=10).values():
            fut.result(timeout=20)


@pytest.fixture
def make_log(kafka_bootstrap: str, kafka_topic: str) -> Iterator[MakeLog]:
    opened: list[KafkaEventLog] = []

    def factory(**kwargs: Any) -> KafkaEventLog:
        kwargs.setdefault("topic", kafka_topic)
        kwargs.setdefault("partitions", 4)
        log = KafkaEventLog(kafka_bootstrap, **kwargs)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()
