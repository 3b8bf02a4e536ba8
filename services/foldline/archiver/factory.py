"""The archiver process's factory, and what ``foldline restore`` reads and writes, from a Config.

``foldline archiver`` is built here: on the Kafka backends a member of the archivers' consumer group
(``config.archive.group_for(topic)``), on the embedded backend a poller of the SQLite log (a backup).
The archive store and the Kafka clients come from :mod:`foldline.config.factories`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..adapters.archive import ArchiveAppender, SessionArchive
from ..config import Config
from ..config.factories import archive_store, check_kafka, kafka_log, sqlite_log, topic_policy
from ..errors import ConfigError
from ..metrics import ArchiverMetrics
from ..ports.event_log import EventLog
from .engine import ArchivePolicy, Archiver
from .log_feed import LogFeed
from .worker import ArchiverWorker, KafkaArchiverWorker, LogArchiverWorker

__all__ = ["archive_policy", "open_archive", "open_archiver", "restore_target"]


def archive_policy(config: Config) -> ArchivePolicy:
    a = config.archive
    return ArchivePolicy(
        sessions=a.patterns,
        idle_s=a.idle_s,
        max_delay_s=a.max_delay_s,
        segment_events=a.segment_events,
        max_segment_events=max(a.segment_events, 100_000),
        max_segments=a.max_segments,
        grace_s=a.grace_s,
    )


def open_archive(config: Config) -> SessionArchive:
    """The session archive the configuration names (its bucket created if missing); ConfigError when off."""
    store = archive_store(config)
    if store is None:
        raise ConfigError(
            "no session archive is configured: set FOLDLINE_ARCHIVE=s3 (FOLDLINE_ARCHIVE_BUCKET) or "
            "FOLDLINE_ARCHIVE=dir (FOLDLINE_ARCHIVE_DIR)"
        )
    if config.archive.store == "s3":
        from ..adapters.s3_archive import S3ArchiveStore  # archive_store checked the s3 extra

        assert isinstance(store, S3ArchiveStore)
        store.ensure_bucket()
    return SessionArchive(store)


def open_archiver(
    config: Config,
    *,
    metrics: ArchiverMetrics | None = None,
    on_ready: Callable[[ArchiverWorker], None] | None = None,
) -> ArchiverWorker:
    """The archiver of the configured backend (see the module docstring); run it with ``.run()``."""
    archive = open_archive(config)
    policy = archive_policy(config)
    appender = ArchiveAppender(archive)
    port, host = config.metrics.port, config.metrics.host
    concurrency = config.archive.concurrency
    if config.backend == "embedded":
        log_feed = LogFeed(sqlite_log(config), archive, policy)
        engine = Archiver(appender, log_feed, policy, concurrency=concurrency, metrics=metrics)
        return LogArchiverWorker(engine, log_feed, metrics_port=port, metrics_host=host, on_ready=on_ready)
    from ..adapters.kafka import ArchiveFeed

    k = config.kafka
    check_kafka(k)
    worker: KafkaArchiverWorker | None = None

    def assigned(partitions: set[int]) -> None:
        if worker is not None:
            worker.on_assigned(partitions)

    def revoked(partitions: set[int]) -> None:
        if worker is not None:
            worker.on_revoked(partitions)

    feed = ArchiveFeed(
        k.bootstrap,
        config.archive.group_for(k.topic),
        topic=k.topic,
        partitions=k.partitions,
        timeout_s=k.timeout_s,
        registry_url=k.registry_url,
        client_config=k.librdkafka(),
        on_assigned=assigned,
        on_revoked=revoked,
    )
    engine = Archiver(appender, feed, policy, concurrency=concurrency, metrics=metrics)
    worker = KafkaArchiverWorker(
        engine,
        feed,
        topic_policy(config),
        max_batch=config.projector.max_batch,
        metrics_port=port,
        metrics_host=host,
        on_ready=on_ready,
    )
    return worker


def restore_target(config: Config) -> EventLog:
    """The log ``foldline restore`` writes to: the configured backend's, read without the archive."""
    if config.backend == "embedded":
        return sqlite_log(config)
    log = kafka_log(config, archive=False)
    try:
        log.check_topics()
    except BaseException:
        log.close()
        raise
    return log
