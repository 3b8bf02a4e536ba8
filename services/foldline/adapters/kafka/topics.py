"""Creating and checking the log's topics (events, index, dead letters), and waiting for one to exist.

Topics are created with the settings of the log's :class:`~.retention.TopicPolicy` and every existing
topic is checked against it before anything is written (:mod:`.retention`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ...errors import ConfigError
from .clients import KafkaClients, client_settings, kafka_error
from .records import index_topic
from .retention import TopicCheck, TopicPolicy, check_topics, enforce

__all__ = ["ensure_topics", "inspect_topics", "wait_for_topic"]

_LOG = logging.getLogger("foldline.kafka")


def ensure_topics(
    clients: KafkaClients, topic: str, *, partitions: int, policy: TopicPolicy, create: bool
) -> list[TopicCheck]:
    """Create the missing topics of the log ``topic`` (with ``create``) and check them; the checks made.

    Raises :class:`~foldline.errors.ConfigError` for topics that are missing (``create`` off) or have
    another partition count (sessions would map to the wrong partitions),
    :class:`~foldline.errors.UnsafeRetention` for a setting that could lose events (:mod:`.retention`), and
    :class:`~foldline.errors.StoreUnavailable` when the broker does not answer within the clients' timeout.
    """
    admin = clients.admin()
    timeout_s = clients.timeout_s
    wanted = policy.topic_configs(topic)
    try:
        md = admin.list_topics(timeout=timeout_s)
        missing = [t for t in wanted if t not in md.topics]
        if missing and not create:
            raise ConfigError(f"Kafka topics {missing} do not exist and create_topics is off")
        if missing:
            futures = admin.create_topics(
                [NewTopic(t, partitions, policy.replication_factor, config=wanted[t]) for t in missing],
                request_timeout=timeout_s,
            )
            for fut in futures.values():
                try:
                    fut.result(timeout=timeout_s)
                except KafkaException as exc:
                    err = kafka_error(exc)
                    if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise
            deadline = time.monotonic() + timeout_s
            while True:  # new topics take a moment to appear in metadata
                md = admin.list_topics(timeout=timeout_s)
                if all(len(getattr(md.topics.get(t), "partitions", {})) for t in wanted):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        for t in (topic, index_topic(topic)):
            meta = md.topics.get(t)
            count = len(meta.partitions) if meta is not None else 0
            if count != partitions:
                raise ConfigError(
                    f"topic {t} has {count} partitions but this log is configured for {partitions}; "
                    "sessions would map to the wrong partitions"
                )
        replicas = {
            t: min((len(p.replicas) for p in meta.partitions.values()), default=0)
            for t in wanted
            if (meta := md.topics.get(t)) is not None
        }
    except (KafkaException, TimeoutError) as exc:  # TimeoutError: a topic creation did not answer in time
        raise clients.not_answering(exc) from exc
    checks = check_topics(clients, topic, policy, replicas)
    enforce(checks)
    return checks


def inspect_topics(clients: KafkaClients, topic: str, *, partitions: int, policy: TopicPolicy) -> list[TopicCheck]:
    """Every check of the log's topics as an operator reads them (``foldline doctor``); nothing is created.

    A missing topic or a partition count other than ``partitions`` is a failed check like the others;
    only a broker that does not answer raises (:class:`~foldline.errors.StoreUnavailable`).
    """
    admin = clients.admin()
    try:
        md = admin.list_topics(timeout=clients.timeout_s)
    except KafkaException as exc:
        raise clients.not_answering(exc) from exc
    names = list(policy.topic_configs(topic))
    checks: list[TopicCheck] = []
    replicas: dict[str, int] = {}
    for name in names:
        meta = md.topics.get(name)
        count = len(meta.partitions) if meta is not None else 0
        if meta is None:
            checks.append(
                TopicCheck(name, "exists", "no", False, "the topic does not exist", "fix: the first writer creates it")
            )
            continue
        replicas[name] = min((len(p.replicas) for p in meta.partitions.values()), default=0)
        if name != names[2]:
            ok = count == partitions
            checks.append(
                TopicCheck(
                    name,
                    "partitions",
                    str(count),
                    ok,
                    f"{count} partitions, as configured"
                    if ok
                    else f"the log is configured for {partitions}: sessions would map to the wrong partitions",
                    "" if ok else f"fix: set FOLDLINE_KAFKA_PARTITIONS={count}",
                )
            )
    if all(name in replicas for name in names):
        checks += check_topics(clients, topic, policy, replicas)
    return checks


def wait_for_topic(
    bootstrap: str,
    topic: str,
    *,
    client_config: Mapping[str, Any] | None = None,
    stopped: Callable[[], bool],
    pause: Callable[[float], object],
) -> None:
    """Block until ``topic`` exists (or ``stopped()``), asking the broker every half second.

    Writers create the log's topics on their first append; a group member subscribed to a missing topic
    would only see it at its next metadata refresh, so consumers wait for it first. A broker that does
    not answer is logged and asked again.
    """
    try:
        admin = AdminClient(client_settings(bootstrap, client_config))
    except KafkaException as exc:
        raise ConfigError(f"invalid Kafka admin client configuration: {exc}") from exc
    warned = False
    while not stopped():
        try:
            if topic in admin.list_topics(timeout=5.0).topics:
                return
        except KafkaException as exc:
            _LOG.warning("listing Kafka topics failed: %s", exc)
        if not warned:
            _LOG.warning("waiting for topic %s to exist (writers create it on their first append)", topic)
            warned = True
        pause(0.5)
