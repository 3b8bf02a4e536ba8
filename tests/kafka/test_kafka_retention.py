"""Topic settings that cannot lose the log, against the real broker: how topics are created, what is refused.

Every writer, projector and dispatcher checks the topic before it writes anything; a setting that could
delete events not yet archived is :class:`~foldline.errors.UnsafeRetention`, naming the setting and its fix.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic
from typer.testing import CliRunner

from foldline.adapters.kafka import KafkaEventLog, TopicPolicy
from foldline.adapters.kafka.records import MAX_MESSAGE_BYTES
from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.errors import UnsafeRetention
from foldline.projector import ProjectorWorker
from foldline.projector.runtime import WorkerSettings
from tests.factories import simple_log

pytestmark = pytest.mark.kafka

SAFE = {"retention.ms": "-1", "retention.bytes": "-1"}
MakeTopic = Callable[..., str]


@pytest.fixture
def admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def make_topic(admin: AdminClient) -> Iterator[MakeTopic]:
    """Creates a log's three topics with the given settings (event topic, index); deletes them afterwards."""
    made: list[str] = []

    def create(events: Mapping[str, str], index: Mapping[str, str] | None = None, partitions: int = 2) -> str:
        topic = f"test.retention.{uuid.uuid4().hex[:10]}"
        wanted = {
            topic: {"max.message.bytes": str(MAX_MESSAGE_BYTES), **events},  # what the log creates; the broker: ~1 MiB
            f"{topic}.index": dict(index or {"cleanup.policy": "compact"}),
            f"{topic}.dlq": dict(SAFE),
        }
        for fut in admin.create_topics([NewTopic(t, partitions, 1, config=c) for t, c in wanted.items()]).values():
            fut.result(timeout=30)
        made.extend(wanted)
        return topic

    yield create
    if made:
        for fut in admin.delete_topics(made, operation_timeout=10).values():
            fut.result(timeout=30)


def _configs(admin: AdminClient, topic: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    return {k: v.value for k, v in entries.items()}


def _high(admin: AdminClient, kafka_bootstrap: str, topic: str) -> int:
    """Records in the topic's partitions (asked again while a new partition has no leader yet)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        deadline = time.monotonic() + 20
        while True:
            try:
                return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


def test_created_topics_carry_an_explicit_policy(kafka_bootstrap: str, admin: AdminClient) -> None:
    topic = f"test.retention.{uuid.uuid4().hex[:10]}"
    log = KafkaEventLog(kafka_bootstrap, topic=topic, partitions=2)
    archived = KafkaEventLog(
        kafka_bootstrap,
        topic=topic + "-a",
        partitions=2,
        policy=TopicPolicy(archive_max_delay_s=60.0, retention_ms=3_600_000),
    )
    try:
        checks = log.check_topics()
        assert checks
        assert all(c.ok for c in checks)
        events = _configs(admin, topic)
        assert {k: events[k] for k in ("retention.ms", "retention.bytes", "cleanup.policy", "min.insync.replicas")} == {
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "cleanup.policy": "delete",
            "min.insync.replicas": "1",
        }
        assert events["unclean.leader.election.enable"] == "false"
        index = _configs(admin, topic + ".index")
        assert (index["cleanup.policy"], index["segment.ms"], index["min.cleanable.dirty.ratio"]) == (
            "compact",
            "60000",  # segments close after a minute and are compacted: a cold read of the index stays small
            "0.1",
        )
        assert _configs(admin, topic + ".dlq")["retention.ms"] == "-1"
        assert events["max.message.bytes"] == str(MAX_MESSAGE_BYTES)
        archived.check_topics()  # an archive is configured: the created topic expires after an hour
        assert _configs(admin, topic + "-a")["retention.ms"] == "3600000"
    finally:
        log.close()
        archived.close()
        doomed = [t + s for t in (topic, topic + "-a") for s in ("", ".index", ".dlq")]
        for fut in admin.delete_topics(doomed, operation_timeout=10).values():
            fut.result(timeout=30)


@pytest.mark.parametrize(
    ("events", "index", "policy", "setting", "fix"),
    [
        ({"retention.ms": "60000"}, None, TopicPolicy(), "retention.ms", "--add-config retention.ms=-1"),
        (
            {"retention.ms": "60000"},
            None,
            TopicPolicy(archive_max_delay_s=60.0),
            "retention.ms",
            "--add-config retention.ms=120000",
        ),
        (
            {"retention.ms": "60000"},
            None,
            TopicPolicy(archive_max_delay_s=10.0, archive_all_sessions=False),
            "retention.ms",
            "FOLDLINE_ARCHIVE_SESSIONS=*",
        ),
        ({**SAFE, "retention.bytes": "1000000"}, None, TopicPolicy(), "retention.bytes", "retention.bytes=-1"),
        ({**SAFE, "cleanup.policy": "compact"}, None, TopicPolicy(), "cleanup.policy", "cleanup.policy=delete"),
        (
            SAFE,
            {"cleanup.policy": "compact,delete", "retention.ms": "60000"},
            TopicPolicy(),
            "cleanup.policy",
            "cleanup.policy=compact",
        ),
        ({**SAFE, "min.insync.replicas": "2"}, None, TopicPolicy(), "min.insync.replicas", "min.insync.replicas=1"),
        # the broker's default (Kafka 3.9: 1,048,588) would refuse events every other backend holds
        (
            {**SAFE, "max.message.bytes": "1048588"},
            None,
            TopicPolicy(),
            "max.message.bytes",
            f"--add-config max.message.bytes={MAX_MESSAGE_BYTES}",
        ),
    ],
)
def test_a_setting_that_could_lose_events_is_refused_before_anything_is_written(
    kafka_bootstrap: str,
    admin: AdminClient,
    make_topic: MakeTopic,
    events: dict[str, str],
    index: dict[str, str] | None,
    policy: TopicPolicy,
    setting: str,
    fix: str,
) -> None:
    topic = make_topic(events, index)
    log = KafkaEventLog(kafka_bootstrap, topic=topic, partitions=2, policy=policy)
    try:
        with pytest.raises(UnsafeRetention) as info:
            log.append("s", 0, simple_log())
        assert info.value.setting == setting
        assert fix in str(info.value)
        assert info.value.fix in str(info.value)
        assert "kafka-configs.sh --alter" in info.value.fix or "FOLDLINE_" in info.value.fix
    finally:
        log.close()
    assert _high(admin, kafka_bootstrap, topic) == 0  # nothing was written


def test_an_archive_whose_delay_fits_the_retention_is_accepted(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = make_topic({"retention.ms": "60000"})
    log = KafkaEventLog(kafka_bootstrap, topic=topic, partitions=2, policy=TopicPolicy(archive_max_delay_s=30.0))
    try:
        assert log.append("s", 0, simple_log()) == len(simple_log())
        retention = [c for c in log.topic_checks if c.setting == "retention.ms"]
        assert retention[0].ok
        assert "archived first" in retention[0].detail
    finally:
        log.close()


def test_writers_and_projectors_refuse_it_at_start_up(
    kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic({"retention.ms": "60000"})
    monkeypatch.delenv("FOLDLINE_ARCHIVE", raising=False)
    config = Config.from_env().overridden(data_dir=tmp_path, backend="kafka", kafka__topic=topic, kafka__partitions=2)
    with pytest.raises(UnsafeRetention, match=re.escape("retention.ms=60000 deletes events after 1 min")):
        open_stores(config)  # a loop or a CLI command on the log
    # (a dispatcher never opens the log: it serves steps from the folds alone)
    worker = ProjectorWorker(WorkerSettings(config))
    with pytest.raises(UnsafeRetention):
        worker.run()
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["sessions", "--backend", "kafka", "--data-dir", str(tmp_path)],
        env={"FOLDLINE_KAFKA_TOPIC": topic, "FOLDLINE_KAFKA_PARTITIONS": "2"},
    )
    assert res.exit_code == 2
    assert "UnsafeRetention" in res.output
    assert "retention.ms" in res.output


def test_doctor_prints_every_check_and_fails_on_an_unsafe_one(
    kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    runner = CliRunner()
    good = make_topic(SAFE)
    bad = make_topic({"retention.ms": "60000"})
    base = {"FOLDLINE_KAFKA_PARTITIONS": "2", "FOLDLINE_ARCHIVE": "off"}
    args = ["doctor", "--backend", "kafka", "--data-dir", str(tmp_path), "--json"]
    res = runner.invoke(app, args, env={**base, "FOLDLINE_KAFKA_TOPIC": good})
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    names = {c["name"] for c in report["checks"]}
    assert {f"{good} retention.ms", f"{good} retention.bytes", f"{good}.index cleanup.policy"} <= names
    assert report["ok"]
    assert all(c["status"] == "ok" for c in report["checks"])
    res = runner.invoke(app, args, env={**base, "FOLDLINE_KAFKA_TOPIC": bad})
    assert res.exit_code == 1
    failed = [c for c in json.loads(res.stdout)["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == [f"{bad} retention.ms"]
    assert "retention.ms=-1" in failed[0]["fix"]
    res = runner.invoke(
        app, args, env={**base, "FOLDLINE_KAFKA_TOPIC": f"test.retention.missing-{uuid.uuid4().hex[:6]}"}
    )
    assert res.exit_code == 1
    assert {c["name"].split(" ")[-1] for c in json.loads(res.stdout)["checks"]} == {"exists"}
