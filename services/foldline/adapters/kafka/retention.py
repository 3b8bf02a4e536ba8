"""Topic settings that cannot lose the log: what the log's topics are created with, and the start-up check.

The session-event topic *is* the log. Kafka deletes records by age (``retention.ms``), by partition size
(``retention.bytes``) and, on a compacted topic, keeps only the latest record per key — which for the
event topic (key = session id) would keep one event per session. So a topic is checked before anything is
written to it (``describe_configs``, the effective values including broker defaults):

=====================================  ======================================================================
setting                                must be
=====================================  ======================================================================
event topic ``cleanup.policy``         ``delete`` (never ``compact``)
event topic ``retention.bytes``        ``-1``: size-based deletion takes events whatever their age
event topic ``retention.ms``           ``-1`` without an archive; with an archiver covering every session, at
                                       least twice its maximum delay (:attr:`TopicPolicy.min_retention_ms`)
index topic ``cleanup.policy``         ``compact``, and with ``delete`` also both retentions ``-1``
``min.insync.replicas``                at least the configured one, at most the topic's replication factor
replication factor                     at least the configured one
``unclean.leader.election.enable``     ``false``: an unclean election drops acknowledged events
=====================================  ======================================================================

:func:`check_topics` answers every check as a :class:`TopicCheck` (``foldline doctor`` prints them);
:func:`enforce` raises the first failure as :class:`~foldline.errors.UnsafeRetention`, which names the
setting and the ``kafka-configs`` command that fixes it. docs/RETENTION.md has the argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from ...errors import ConfigError, UnsafeRetention
from .clients import KafkaClients
from .records import MAX_MESSAGE_BYTES, dlq_topic, index_topic

__all__ = [
    "INDEX_DIRTY_RATIO",
    "INDEX_SEGMENT_MS",
    "MIN_RETENTION_FACTOR",
    "TopicCheck",
    "TopicPolicy",
    "check_topics",
    "enforce",
]

MIN_RETENTION_FACTOR = 2  # a finite retention must be at least this many times the archiver's maximum delay


#: The index topic rolls its segments after this long, so the log cleaner compacts all but the last one.
INDEX_SEGMENT_MS = 60_000
#: The share of superseded entries in the index at which the cleaner compacts it.
INDEX_DIRTY_RATIO = "0.1"


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """What the log's topics are created with and checked against.

    ``archive_max_delay_s`` is set when an archiver is configured: the longest an event may wait before
    it is archived. ``archive_all_sessions`` says whether it archives every session (a finite retention
    is refused otherwise: the others would expire). ``retention_ms`` is the retention the event topic is
    created with when an archive is configured (infinite otherwise).
    """

    replication_factor: int = 1
    min_insync_replicas: int = 1
    archive_max_delay_s: float | None = None
    archive_all_sessions: bool = True
    retention_ms: int = -1

    def __post_init__(self) -> None:
        if self.replication_factor < 1 or self.min_insync_replicas < 1:
            raise ConfigError("the replication factor and min.insync.replicas of the log's topics must be at least 1")
        if self.min_insync_replicas > self.replication_factor:
            raise ConfigError(
                f"min.insync.replicas {self.min_insync_replicas} exceeds the replication factor "
                f"{self.replication_factor}: every append would be refused (FOLDLINE_KAFKA_MIN_INSYNC_REPLICAS)"
            )
        if self.retention_ms != -1 and self.retention_ms < 1:
            raise ConfigError(f"the log's retention must be -1 (infinite) or positive, not {self.retention_ms}")

    @property
    def archived(self) -> bool:
        return self.archive_max_delay_s is not None

    @property
    def min_retention_ms(self) -> int | None:
        """The shortest finite ``retention.ms`` the event topic may have (``None``: only ``-1`` is safe)."""
        if self.archive_max_delay_s is None or not self.archive_all_sessions:
            return None
        return int(MIN_RETENTION_FACTOR * self.archive_max_delay_s * 1000)

    def created_retention_ms(self) -> int:
        """``retention.ms`` of a newly created event topic."""
        return self.retention_ms if self.archived else -1

    def topic_configs(self, topic: str) -> dict[str, dict[str, str]]:
        """The configuration each of the log's topics is created with."""
        common = {"max.message.bytes": str(MAX_MESSAGE_BYTES), "min.insync.replicas": str(self.min_insync_replicas)}
        forever = {"retention.ms": "-1", "retention.bytes": "-1"}
        return {
            topic: {
                **common,
                "cleanup.policy": "delete",
                "retention.ms": str(self.created_retention_ms()),
                "retention.bytes": "-1",
                "unclean.leader.election.enable": "false",
            },
            index_topic(topic): {
                **common,
                "cleanup.policy": "compact",
                "unclean.leader.election.enable": "false",
                # a segment closes after a minute, so the cleaner compacts it: a process's first read of a
                # partition then reads about one entry per session, not every entry written since the last roll
                "segment.ms": str(INDEX_SEGMENT_MS),
                "min.cleanable.dirty.ratio": INDEX_DIRTY_RATIO,
            },
            dlq_topic(topic): {**common, **forever},
        }


@dataclass(frozen=True, slots=True)
class TopicCheck:
    """One setting of one topic, checked: ``ok``, what it means, and how to fix it when not."""

    topic: str
    setting: str
    value: str
    ok: bool
    detail: str
    fix: str = ""

    def error(self) -> UnsafeRetention:
        return UnsafeRetention(self.topic, self.setting, self.value, self.detail, self.fix)


def _alter(topic: str, setting: str, value: str) -> str:
    return f"fix: kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config {setting}={value}"


def _human_ms(ms: int) -> str:
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:g} {unit}"
    return f"{ms} ms"


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1


def _event_topic(topic: str, cfg: Mapping[str, str], policy: TopicPolicy) -> list[TopicCheck]:
    out: list[TopicCheck] = []
    cleanup = cfg.get("cleanup.policy", "delete")
    compacted = "compact" in cleanup.split(",")
    out.append(
        TopicCheck(
            topic,
            "cleanup.policy",
            cleanup,
            not compacted,
            "compaction would keep one event per session (the key is the session id)"
            if compacted
            else "records are never compacted",
            _alter(topic, "cleanup.policy", "delete") if compacted else "",
        )
    )
    size = cfg.get("retention.bytes", "-1")
    out.append(
        TopicCheck(
            topic,
            "retention.bytes",
            size,
            _int(size) < 0,
            "deletes the oldest events of a partition once it holds that many bytes, archived or not"
            if _int(size) >= 0
            else "no size-based deletion",
            _alter(topic, "retention.bytes", "-1") if _int(size) >= 0 else "",
        )
    )
    raw_ms = cfg.get("retention.ms", "-1")
    ms = _int(raw_ms)
    floor = policy.min_retention_ms
    if ms < 0:
        out.append(TopicCheck(topic, "retention.ms", raw_ms, True, "events are kept forever"))
    elif not policy.archived:
        out.append(
            TopicCheck(
                topic,
                "retention.ms",
                raw_ms,
                False,
                f"deletes events after {_human_ms(ms)} and no archive is configured to keep them",
                _alter(topic, "retention.ms", "-1") + " (or configure an archive: FOLDLINE_ARCHIVE)",
            )
        )
    elif floor is None:
        out.append(
            TopicCheck(
                topic,
                "retention.ms",
                raw_ms,
                False,
                f"deletes events after {_human_ms(ms)} but the archiver keeps only some sessions "
                "(FOLDLINE_ARCHIVE_SESSIONS): the others would expire",
                _alter(topic, "retention.ms", "-1") + " (or archive every session: FOLDLINE_ARCHIVE_SESSIONS=*)",
            )
        )
    elif ms < floor:
        out.append(
            TopicCheck(
                topic,
                "retention.ms",
                raw_ms,
                False,
                f"deletes events after {_human_ms(ms)}, less than {MIN_RETENTION_FACTOR} x the archiver's maximum "
                f"delay ({_human_ms(int(policy.archive_max_delay_s or 0) * 1000)}): an event could expire unarchived",
                _alter(topic, "retention.ms", str(floor)) + " (or lower FOLDLINE_ARCHIVE_MAX_DELAY)",
            )
        )
    else:
        out.append(
            TopicCheck(
                topic,
                "retention.ms",
                raw_ms,
                True,
                f"events expire after {_human_ms(ms)}, at least {MIN_RETENTION_FACTOR} x the archiver's maximum "
                "delay: archived first",
            )
        )
    return out


def _message_size(topic: str, cfg: Mapping[str, str]) -> TopicCheck:
    """The topic takes a record of the largest size the log writes (the broker's default, ~1 MiB, does not)."""
    raw = cfg.get("max.message.bytes", "")
    ok = _int(raw) >= MAX_MESSAGE_BYTES
    return TopicCheck(
        topic,
        "max.message.bytes",
        raw,
        ok,
        f"takes records up to {_int(raw):,} bytes: every event the log accepts fits"
        if ok
        else f"refuses records over {_int(raw):,} bytes: events the log accepts (up to {MAX_MESSAGE_BYTES:,} bytes "
        "as records) would be refused",
        "" if ok else _alter(topic, "max.message.bytes", str(MAX_MESSAGE_BYTES)),
    )


def _index_topic(topic: str, cfg: Mapping[str, str]) -> list[TopicCheck]:
    cleanup = cfg.get("cleanup.policy", "delete")
    policies = cleanup.split(",")
    deleting = "delete" in policies and (_int(cfg.get("retention.ms")) >= 0 or _int(cfg.get("retention.bytes")) >= 0)
    ok = "compact" in policies and not deleting
    detail = (
        "compacted: the latest entry of every session is kept"
        if ok
        else "the index would lose sessions' entries (it must be compacted and never deleted)"
    )
    return [
        TopicCheck(
            topic, "cleanup.policy", cleanup, ok, detail, "" if ok else _alter(topic, "cleanup.policy", "compact")
        )
    ]


def _replication(topic: str, cfg: Mapping[str, str], replicas: int, policy: TopicPolicy) -> list[TopicCheck]:
    out: list[TopicCheck] = []
    out.append(
        TopicCheck(
            topic,
            "replication factor",
            str(replicas),
            replicas >= policy.replication_factor,
            f"{replicas} copies of every event"
            if replicas >= policy.replication_factor
            else f"fewer copies than the configured {policy.replication_factor} (FOLDLINE_KAFKA_REPLICATION_FACTOR)",
            ""
            if replicas >= policy.replication_factor
            else "fix: kafka-reassign-partitions.sh adds replicas (a replication factor is not altered in place)",
        )
    )
    raw = cfg.get("min.insync.replicas", "1")
    isr = _int(raw)
    if isr < policy.min_insync_replicas:
        out.append(
            TopicCheck(
                topic,
                "min.insync.replicas",
                raw,
                False,
                f"an acknowledged append may live on fewer than the configured {policy.min_insync_replicas} replicas",
                _alter(topic, "min.insync.replicas", str(policy.min_insync_replicas)),
            )
        )
    elif isr > replicas:
        out.append(
            TopicCheck(
                topic,
                "min.insync.replicas",
                raw,
                False,
                f"exceeds the topic's {replicas} replicas: every append would be refused",
                _alter(topic, "min.insync.replicas", str(replicas)),
            )
        )
    else:
        out.append(TopicCheck(topic, "min.insync.replicas", raw, True, f"every append is on {isr} replica(s) at least"))
    unclean = cfg.get("unclean.leader.election.enable", "false")
    out.append(
        TopicCheck(
            topic,
            "unclean.leader.election.enable",
            unclean,
            unclean != "true",
            "an out-of-sync replica may become leader and drop acknowledged events"
            if unclean == "true"
            else "only in-sync replicas become leader",
            _alter(topic, "unclean.leader.election.enable", "false") if unclean == "true" else "",
        )
    )
    return out


def describe(clients: KafkaClients, topics: Sequence[str]) -> dict[str, dict[str, str]]:
    """The effective configuration of ``topics`` (broker defaults included), one request."""
    admin = clients.admin()
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    try:
        futures = admin.describe_configs(resources, request_timeout=clients.timeout_s)
        out: dict[str, dict[str, str]] = {}
        for resource, future in futures.items():
            entries = future.result(timeout=clients.timeout_s)
            out[resource.name] = {name: e.value for name, e in entries.items() if e.value is not None}
        return out
    except (KafkaException, TimeoutError) as exc:
        raise clients.not_answering(exc) from exc


def check_topics(
    clients: KafkaClients, topic: str, policy: TopicPolicy, replicas: Mapping[str, int]
) -> list[TopicCheck]:
    """Every check of the log's topics (see the module docstring); ``replicas`` is each topic's replication factor."""
    names = [topic, index_topic(topic), dlq_topic(topic)]
    configs = describe(clients, names)
    out = _event_topic(topic, configs[topic], policy)
    out.append(_message_size(topic, configs[topic]))
    out += _index_topic(index_topic(topic), configs[index_topic(topic)])
    for name in names[:2]:
        out += _replication(name, configs[name], replicas.get(name, 0), policy)
    return out


def enforce(checks: Sequence[TopicCheck]) -> None:
    """Raise the first failed check as :class:`~foldline.errors.UnsafeRetention`."""
    for check in checks:
        if not check.ok:
            raise check.error()
